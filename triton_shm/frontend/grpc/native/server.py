"""The native gRPC server: listens, owns the connections, stops them with GOAWAY."""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl as ssl_module

import ngh2

from ...listeners import LISTEN_BACKLOG
from ...header_forward import HeaderForward
from ...restricted import Restrictions
from ..keepalive import HANDSHAKE_TIMEOUT_MS, Keepalive
from ..rpc import Method
from .connection import GrpcConnection, ReceiveBuffers

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS = 1000
STREAM_WINDOW = 4 << 20  # per-stream receive window
CONNECTION_WINDOW = 32 << 20
MAX_HEADER_LIST = 64 * 1024
# DATA frames from the peer: 64 KiB, a quarter of a read (the engine copies each payload
# once; the connection keeps back the start of one that a read cuts until its end arrives)
# while a 16 MiB message is still only 256 engine events.
MAX_FRAME = 64 * 1024
# The most read from a socket at once, and fed to the engine whole: even a read of nothing
# but 9-byte SETTINGS frames (29,127) stays under the engine's cap on unsent
# acknowledgements (MAX_OUTBOUND_ACK), so our own control-frame limit answers a flood
# (GOAWAY ENHANCE_YOUR_CALM) before the engine's cap could only drop the connection.
RECEIVE_BUFFER = 256 * 1024
MAX_OUTBOUND_ACK = 30_000


class NativeServer:
    """Protocol limits are attributes so tests and embedders can tighten them."""

    def __init__(self, methods: list[Method], *, max_message_bytes: int,
                 max_concurrent_streams: int = MAX_CONCURRENT_STREAMS, keepalive: Keepalive | None = None,
                 restrictions: Restrictions | None = None, header_forward: "HeaderForward | None" = None):
        self.methods = {m.path.encode(): m for m in methods}
        self.header_forward = header_forward  # --grpc-header-forward-pattern
        self.restrictions = restrictions or None  # checked when a call's headers arrive
        self.max_message_bytes = max_message_bytes
        self.settings = {
            ngh2.Setting.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
            ngh2.Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            ngh2.Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            ngh2.Setting.ENABLE_PUSH: 0,
            ngh2.Setting.MAX_FRAME_SIZE: MAX_FRAME,
        }
        self.connection_window = CONNECTION_WINDOW
        # The engine bounds header blocks, CONTINUATIONs, SETTINGS entries, unread
        # acknowledgements and stream resets (rapid reset: a GOAWAY past the rate).
        self.h2_config = ngh2.Configuration(auto_window_update=False, max_outbound_ack=MAX_OUTBOUND_ACK,
                                            max_inbound_header_list_size=MAX_HEADER_LIST)
        self.control_frame_limit = (500.0, 100.0)  # PING/SETTINGS burst, then per second
        self.handshake_timeout = HANDSHAKE_TIMEOUT_MS / 1000  # for a new connection to send anything
        self.apply_keepalive(keepalive or Keepalive())
        self.connections: set[GrpcConnection] = set()
        # Every connection reads into this one buffer: a read is fed to the engine (which
        # copies what it keeps) before the loop reads again, for any connection.
        self.receive_view = memoryview(bytearray(RECEIVE_BUFFER))
        # A connection whose read cut a large DATA frame keeps its start in one of these
        # and reads on after it, so the engine gets the frame whole.
        self.max_frame = MAX_FRAME
        self.receive_buffers = ReceiveBuffers(RECEIVE_BUFFER + MAX_FRAME + 9)
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()

    def apply_keepalive(self, k: Keepalive) -> None:
        """tritonserver's --grpc-keepalive-* / --grpc-http2-* / --grpc-max-connection-age* settings,
        with gRPC's meaning: a quiet connection is pinged every ``time`` and dropped if the ping
        is not answered within ``timeout``; a client's pings closer together than the minimum
        interval (two hours on a connection with no calls, unless permitted) are strikes, and
        past ``max_ping_strikes`` it gets GOAWAY ENHANCE_YOUR_CALM; a connection older than
        ``max_connection_age`` gets GOAWAY, and its calls ``grace`` more to finish."""
        self.keepalive_time = k.time_ms / 1000
        self.keepalive_timeout = k.timeout_ms / 1000
        self.pings_without_calls = k.permit_without_calls
        self.min_ping_interval = k.min_recv_ping_interval_without_data_ms / 1000
        self.max_ping_strikes = k.max_ping_strikes
        self.max_connection_age = None if k.max_connection_age_ms is None else k.max_connection_age_ms / 1000
        self.max_connection_idle = None if k.max_connection_idle_ms is None else k.max_connection_idle_ms / 1000
        self.max_connection_age_grace = (None if k.max_connection_age_grace_ms is None
                                         else k.max_connection_age_grace_ms / 1000)

    async def start(self, host: str, port: int, ssl: "ssl_module.SSLContext | None" = None,
                    sock: socket.socket | None = None) -> None:
        """Listen on ``host:port``, or on the listening socket ``sock`` (then it is the
        server's); with ``ssl``, TLS whose ALPN must select ``h2``."""
        if ssl is not None:
            ssl.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()

        def connection() -> GrpcConnection:
            return GrpcConnection(self)
        try:
            if sock is not None:
                self._server = await loop.create_server(connection, sock=sock, ssl=ssl, backlog=LISTEN_BACKLOG)
            else:
                self._server = await loop.create_server(connection, host, port, ssl=ssl, reuse_address=True,
                                                        backlog=LISTEN_BACKLOG)
        except OSError as e:
            raise OSError(f"gRPC server could not bind {host}:{port} ({e.strerror})") from e

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the gRPC server is not listening")
        return self._server.sockets[0].getsockname()[1]

    def connection_done(self) -> None:
        if not self.connections:
            self._idle.set()

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, GOAWAY every connection, let open calls finish for ``grace``
        seconds, then end what is left with UNAVAILABLE."""
        if self._server is not None:
            self._server.close()
        self._idle.clear()
        for conn in list(self.connections):
            conn.begin_shutdown()
        if self.connections:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=grace or 0.0)
            except asyncio.TimeoutError:
                for conn in list(self.connections):
                    conn.cancel_calls()
                await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()


async def start_native(methods: list[Method], host: str, port: int, *, max_message_bytes: int,
                       keepalive: Keepalive | None = None, restrictions: Restrictions | None = None,
                       ssl: "ssl_module.SSLContext | None" = None,
                       sock: socket.socket | None = None, header_forward: "HeaderForward | None" = None
                       ) -> NativeServer:
    server = NativeServer(methods, max_message_bytes=max_message_bytes, keepalive=keepalive,
                          restrictions=restrictions, header_forward=header_forward)
    await server.start(host, port, ssl=ssl, sock=sock)
    return server
