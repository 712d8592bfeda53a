"""A lean gRPC client for the unary inference hot path of ``triton-shm perf``.

grpcio's Python client spends 300-500 µs of CPU per call (its completion-queue threads,
the asyncio bridge, per-call objects); at concurrency 1 that lands in the latency being
measured. This speaks just enough HTTP/2 (RFC 9113) for unary gRPC calls on one
multiplexed connection: the request is a HEADERS frame built once (HPACK literals, no
dynamic table) and the gRPC message in DATA frames under the peer's flow-control windows;
the response's header blocks are decoded with ``hpack`` (the server's encoder uses its
dynamic table and Huffman strings), and the call ends at the trailers' ``grpc-status``.
The connection keeps the protocol's obligations: SETTINGS and PING acknowledgements,
WINDOW_UPDATE for what it receives, GOAWAY and RST_STREAM ending calls with an error.
"""
from __future__ import annotations

import asyncio
from typing import cast
import struct
from urllib.parse import unquote

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 5, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 1, 2, 4, 5
MAX_WINDOW = 2**31 - 1
RECEIVE_FRAME_SIZE = 1 << 20     # what we let the server send per DATA frame
GRPC_UNAVAILABLE = 14


class H2Error(Exception):
    """The connection failed or broke the protocol; every call on it fails."""


class GrpcCallError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(f"gRPC status {code}: {message}")
        self.code, self.message = code, message


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + _hpack_string(name) + _hpack_string(value)


def _hpack_string(s: bytes) -> bytes:
    n = len(s)
    if n < 127:
        return bytes((n,)) + s
    out, n = bytearray((127,)), n - 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + s


class _Call:
    __slots__ = ("future", "body", "headers_seen", "send_window", "window_open")

    def __init__(self, future: asyncio.Future, send_window: int):
        self.future = future
        self.body = bytearray()
        self.headers_seen = False
        self.send_window = send_window
        self.window_open: asyncio.Event | None = None


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport  # from connection_made on
        self.error: Exception | None = None
        self.calls: dict[int, _Call] = {}
        self.next_stream = 1
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 16 << 20
        self._decoded: dict[bytes, dict[bytes, bytes]] = {}
        self.peer_max_frame = 16384
        self.peer_initial_window = 65535
        self.send_window = 65535
        self.window_open = asyncio.Event()
        self.received_unacked = 0
        self._buf = bytearray()
        self._block: tuple[int, int, bytearray] | None = None  # header block being continued
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        settings = struct.pack(">HIHIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW,
                               SETTINGS_MAX_FRAME_SIZE, RECEIVE_FRAME_SIZE)
        self.transport.write(PREFACE + _frame(SETTINGS, 0, 0, settings)
                             + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(H2Error(f"connection lost: {exc}" if exc else "the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._frames()
        except (H2Error, hpack.HPACKError, ValueError, IndexError, struct.error) as e:
            self._fail(e if isinstance(e, H2Error) else H2Error(f"protocol error: {e}"))
            self.transport.close()

    # -- frames in -----------------------------------------------------------------------------
    def _frames(self) -> None:
        buf, pos = self._buf, 0
        try:
            while len(buf) - pos >= 9:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if len(buf) - pos < 9 + length:
                    return
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                if self._block is not None and kind != CONTINUATION:
                    raise H2Error("header block interrupted by another frame")
                handler = _HANDLERS.get(kind)
                if handler is not None:
                    handler(self, flags, stream, payload)
                # other frame types (PRIORITY, unknown extensions) are ignored, as the protocol asks
        finally:
            del buf[:pos]

    def _on_data(self, flags: int, stream: int, payload: bytes) -> None:
        self.received_unacked += len(payload)
        if self.received_unacked >= MAX_WINDOW // 2:  # keep the connection window open
            self.transport.write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received_unacked)))
            self.received_unacked = 0
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        call = self.calls.get(stream)
        if call is not None:
            call.body += payload
            if flags & END_STREAM:
                self._finish(stream, GrpcCallError(13, "the server ended the call without a gRPC status"))

    def _on_headers(self, flags: int, stream: int, payload: bytes) -> None:
        start, end = 0, len(payload)
        if flags & PADDED:
            start, end = 1, end - payload[0]
        if flags & PRIORITY:
            start += 5
        block = bytearray(payload[start:end])
        if flags & END_HEADERS:
            self._headers_done(stream, flags, block)
        else:
            self._block = (stream, flags, block)

    def _on_continuation(self, flags: int, stream: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream:
            raise H2Error("unexpected CONTINUATION frame")
        self._block[2].extend(payload)
        if flags & END_HEADERS:
            s, first_flags, block = self._block
            self._block = None
            self._headers_done(s, first_flags, block)

    def _decode(self, block: bytes) -> dict[bytes, bytes]:
        """Decode a header block. Every block goes through the decoder, in order, for its
        dynamic table, except a block seen before while the table has not changed since:
        then the bytes mean the same headers (a server repeats fully indexed blocks)."""
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        table = self.decoder.header_table.dynamic_entries
        before = (len(table), table[0] if table else None)
        headers = dict(self.decoder.decode(block, raw=True))
        if (len(table), table[0] if table else None) == before:
            if len(self._decoded) < 64:
                self._decoded[block] = headers
        else:
            self._decoded.clear()
        return headers

    def _headers_done(self, stream: int, flags: int, block: bytearray) -> None:
        headers = self._decode(bytes(block))
        call = self.calls.get(stream)
        if call is None:
            return
        if not call.headers_seen and b":status" in headers:
            call.headers_seen = True
            status = headers[b":status"]
            if status != b"200":
                self._finish(stream, GrpcCallError(14 if status in (b"502", b"503", b"504") else 2,
                                                   f"HTTP status {status.decode(errors='replace')}"))
                return
        if b"grpc-status" in headers:
            code = int(headers[b"grpc-status"])
            message = unquote(headers.get(b"grpc-message", b"").decode(errors="replace"))
            self._finish(stream, None if code == 0 else GrpcCallError(code, message))
        elif flags & END_STREAM:
            self._finish(stream, GrpcCallError(13, "the server ended the call without a gRPC status"))

    def _on_rst_stream(self, flags: int, stream: int, payload: bytes) -> None:
        code = int.from_bytes(payload[:4], "big")
        self._finish(stream, GrpcCallError(GRPC_UNAVAILABLE if code == 7 else 13,  # 7: REFUSED_STREAM
                                           f"the server reset the stream (HTTP/2 error {code})"))

    def _on_settings(self, flags: int, stream: int, payload: bytes) -> None:
        if flags & ACK:
            return
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for call in self.calls.values():
                    call.send_window += delta
                self._open_windows()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = value
        self.transport.write(_frame(SETTINGS, ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)

    def _on_ping(self, flags: int, stream: int, payload: bytes) -> None:
        if not flags & ACK:
            self.transport.write(_frame(PING, ACK, 0, payload))

    def _on_goaway(self, flags: int, stream: int, payload: bytes) -> None:
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        detail = payload[8:].decode(errors="replace")
        error = H2Error(f"the server is closing the connection (GOAWAY{': ' + detail if detail else ''})")
        for s in [s for s in self.calls if s > last]:
            self._finish(s, error)
        self.error = error  # no new calls on this connection

    def _on_window_update(self, flags: int, stream: int, payload: bytes) -> None:
        increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        if stream == 0:
            self.send_window += increment
        elif stream in self.calls:
            self.calls[stream].send_window += increment
        self._open_windows()

    # -- calls ---------------------------------------------------------------------------------
    def _open_windows(self) -> None:
        self.window_open.set()
        for call in self.calls.values():
            if call.window_open is not None:
                call.window_open.set()

    def _finish(self, stream: int, error: Exception | None) -> None:
        call = self.calls.pop(stream, None)
        if call is not None and not call.future.done():
            if error is None:
                call.future.set_result(bytes(call.body))
            else:
                call.future.set_exception(error)

    def _fail(self, error: Exception) -> None:
        self.error = self.error or error
        for stream in list(self.calls):
            self._finish(stream, error)
        if not self.ready.done():
            self.ready.set_exception(error)
        self._open_windows()  # senders waiting for a window see the error

    async def call(self, headers_block: bytes, message: bytes) -> bytes:
        if self.error is not None:
            raise self.error
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        call = _Call(asyncio.get_running_loop().create_future(), self.peer_initial_window)
        self.calls[stream] = call
        headers = _frame(HEADERS, END_HEADERS, stream, headers_block)
        if len(message) <= min(self.peer_max_frame, self.send_window, call.send_window):  # one write
            self.transport.write(headers + _frame(DATA, END_STREAM, stream, message))
            self.send_window -= len(message)
            call.send_window -= len(message)
            return await call.future
        self.transport.write(headers)
        view, sent = memoryview(message), 0
        while True:
            n = min(len(view) - sent, self.peer_max_frame, self.send_window, call.send_window)
            if n > 0 or len(view) == sent:
                last = sent + n == len(view)
                self.transport.write(_frame(DATA, END_STREAM if last else 0, stream, bytes(view[sent:sent + n])))
                self.send_window -= n
                call.send_window -= n
                sent += n
                if last:
                    break
                continue
            # out of window: wait for a WINDOW_UPDATE (or the call's end)
            if call.window_open is None:
                call.window_open = asyncio.Event()
            call.window_open.clear()
            if self.error is not None or call.future.done():
                break
            await call.window_open.wait()
        return await call.future


_HANDLERS = {DATA: _Connection._on_data, HEADERS: _Connection._on_headers, CONTINUATION: _Connection._on_continuation,
             RST_STREAM: _Connection._on_rst_stream, SETTINGS: _Connection._on_settings, PING: _Connection._on_ping,
             GOAWAY: _Connection._on_goaway, WINDOW_UPDATE: _Connection._on_window_update}


class GrpcH2Client:
    """Unary calls to one ``host:port`` over a single multiplexed HTTP/2 connection
    (opened on first use and again after it fails)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._conn: _Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._headers: dict[str, bytes] = {}

    def headers_block(self, method: str) -> bytes:
        """The request's HPACK header block, built once per method path."""
        block = self._headers.get(method)
        if block is None:
            block = b"".join(_literal(k, v) for k, v in (
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
                (b":authority", f"{self.host}:{self.port}".encode()), (b"content-type", b"application/grpc"),
                (b"te", b"trailers"), (b"user-agent", b"triton-shm-perf")))
            self._headers[method] = block
        return block

    async def _connection(self) -> _Connection:
        if self._conn is not None:
            if self._conn.error is None:
                return self._conn
            if self._conn.transport is not None and not self._conn.calls:  # after GOAWAY, earlier calls finish
                self._conn.transport.close()
            self._conn = None
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            transport, conn = await loop.create_connection(_Connection, self.host, self.port)
            await asyncio.wait_for(asyncio.shield(conn.ready), 10)  # the server's SETTINGS
        except (OSError, asyncio.TimeoutError) as e:
            raise H2Error(f"cannot open an HTTP/2 connection to {self.host}:{self.port}: {e or 'timed out'}") from None
        self._conn = conn
        return conn

    async def unary(self, method: str, message: bytes) -> bytes:
        """Send one serialized protobuf; returns the response message bytes."""
        conn = await self._connection()
        framed = b"\x00" + struct.pack(">I", len(message)) + message
        body = await conn.call(self.headers_block(method), framed)
        if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            raise GrpcCallError(13, "malformed gRPC response message (compressed or truncated)")
        return body[5:]

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None
