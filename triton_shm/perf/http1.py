"""A lean HTTP/1.1 client for the inference hot path of ``triton-shm perf``.

One keep-alive connection carries one request at a time, as perf_analyzer's own HTTP
client does. The request is sent as bytes built once; the response is parsed only as far
as the load generator needs it: the status, and the body (by ``Content-Length`` or
chunked). A general-purpose client (aiohttp) spends a few hundred microseconds of CPU per
request, which at low concurrency would show up in the latency it measures.
"""
from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit


class HttpConnectionError(Exception):
    """The connection failed or the server closed it mid-response."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport  # from connection_made on
        self.closed = False
        self._buf = bytearray()
        self._waiter: asyncio.Future | None = None
        self._head: tuple[int, dict[bytes, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(HttpConnectionError(str(exc) if exc else "the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is None or self._waiter.done():
            return
        try:
            response = self._parse()
        except (ValueError, IndexError) as e:
            self._waiter.set_exception(HttpConnectionError(f"malformed HTTP response: {e}"))
            self.transport.close()
            return
        if response is not None:
            self._waiter.set_result(response)

    def _parse(self) -> tuple[int, bytes, bool] | None:
        """(status, body, keep-alive) once the whole response is in, else None."""
        if self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            lines = bytes(self._buf[:end]).split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            del self._buf[:end + 4]
            self._head = (status, headers)
        status, headers = self._head
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = self._dechunk()
            if body is None:
                return None
        else:
            length = int(headers.get(b"content-length", b"0"))
            if len(self._buf) < length:
                return None
            body = bytes(self._buf[:length])
            del self._buf[:length]
        self._head = None
        keep_alive = headers.get(b"connection", b"").lower() != b"close"
        return status, body, keep_alive

    def _dechunk(self) -> bytes | None:
        """The body if every chunk and the terminating one are in (the buffer is left as is otherwise)."""
        pos = 0
        parts: list[bytes] = []
        while True:
            eol = self._buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(self._buf[pos:eol]).split(b";")[0], 16)
            start = eol + 2
            if size == 0:
                end = self._buf.find(b"\r\n\r\n", eol)  # optional trailers, then a blank line
                if end < 0:
                    return None
                del self._buf[:end + 4]
                return b"".join(parts)
            if len(self._buf) < start + size + 2:
                return None
            parts.append(bytes(self._buf[start:start + size]))
            pos = start + size + 2

    async def round_trip(self, request: bytes) -> tuple[int, bytes, bool]:
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter


class Http1Client:
    """Sends prepared requests to one ``host:port`` over a pool of keep-alive connections."""

    def __init__(self, url: str):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http":
            raise ValueError(f"only http:// URLs are supported for inference, not {parts.scheme}://")
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.authority = f"{self.host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self._idle: list[_Connection] = []

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self.authority}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as e:
            raise HttpConnectionError(f"cannot connect to {self.authority}: {e}") from None
        return conn

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """(status, body) of one request."""
        conn = await self._connection()
        try:
            status, body, keep_alive = await conn.round_trip(request)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()  # a half-read response must not be reused
            raise
        if keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return status, body

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
