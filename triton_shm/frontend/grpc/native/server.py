"""The native gRPC server: listens, owns the connections, stops them with GOAWAY."""
from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module

import ngh2

from ..rpc import Method
from .connection import GrpcConnection

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS = 1000
STREAM_WINDOW = 4 << 20  # per-stream receive window
CONNECTION_WINDOW = 32 << 20
MAX_HEADER_LIST = 64 * 1024
MAX_FRAME = 1 << 20  # larger DATA frames from the peer: fewer engine events per big message


class NativeServer:
    """Protocol limits are attributes so tests and embedders can tighten them."""

    def __init__(self, methods: list[Method], *, max_message_bytes: int,
                 max_concurrent_streams: int = MAX_CONCURRENT_STREAMS):
        self.methods = {m.path.encode(): m for m in methods}
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
        self.h2_config = ngh2.Configuration(auto_window_update=False, max_outbound_ack=10_000,
                                            max_inbound_header_list_size=MAX_HEADER_LIST)
        self.control_frame_limit = (500.0, 100.0)  # PING/SETTINGS burst, then per second
        self.handshake_timeout = 10.0  # seconds for a new connection to send anything
        self.keepalive_time = 7200.0  # a quiet connection is pinged after this ...
        self.keepalive_timeout = 20.0  # ... and dropped if the ping is not answered
        self.connections: set[GrpcConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._idle = asyncio.Event()

    async def start(self, host: str, port: int, ssl: "ssl_module.SSLContext | None" = None) -> None:
        """Listen on ``host:port``; with ``ssl``, TLS whose ALPN must select ``h2``."""
        if ssl is not None:
            ssl.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(lambda: GrpcConnection(self), host, port, ssl=ssl,
                                                    reuse_address=True, backlog=1024)
        except OSError as e:
            raise OSError(f"gRPC server could not bind {host}:{port} ({e.strerror})") from e

    @property
    def port(self) -> int:
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


async def start_native(methods: list[Method], host: str, port: int, *, max_message_bytes: int) -> NativeServer:
    server = NativeServer(methods, max_message_bytes=max_message_bytes)
    await server.start(host, port)
    return server
