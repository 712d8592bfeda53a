"""Requests the lean path does not serve, handed to aiohttp on the same connection.

The lean connection has parsed the request whole; the bridge re-frames it (one
Content-Length body, no Expect: the lean side already answered 100-continue) and feeds
it to an aiohttp ``RequestHandler`` whose transport is a :class:`_SharedTransport`:
writes go to the real socket, a close closes it. The outermost middleware
(:func:`completion_middleware`) finishes the response and tells the lean connection,
which then serves the next request itself. So aiohttp's routing, handlers and error
mapping stay exactly as they were, for every route but infer.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .lean import LeanConnection, Message

_REFRAMED = frozenset({b"content-length", b"transfer-encoding", b"expect"})


def reframe(msg: "Message") -> bytes:
    """The request as HTTP/1.x bytes with its (de-chunked) body under one Content-Length."""
    body = msg.body
    lines = [b"%s %s HTTP/%s\r\n" % (msg.method, msg.url, msg.version.encode())]
    lines += [b"%s: %s\r\n" % (n, v) for n, v in msg.headers if n.lower() not in _REFRAMED]
    lines.append(b"Content-Length: %d\r\n\r\n" % len(body))
    lines.append(body)
    return b"".join(lines)


class _SharedTransport(asyncio.Transport):
    """What aiohttp sees as its transport: the lean connection's, minus reading control
    (aiohttp gets each request whole, so it never needs to push back)."""

    def __init__(self, conn: "LeanConnection"):
        super().__init__()
        self.conn = conn
        if conn.transport is None:  # bridged only while the connection is open
            raise RuntimeError("a closed connection cannot be bridged")
        self._real: asyncio.Transport = conn.transport

    def write(self, data: Any) -> None:
        self.conn.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.conn.writelines(list_of_data)

    def is_closing(self) -> bool:
        return self._real.is_closing()

    def close(self) -> None:
        self.conn.bridge_closed()

    def abort(self) -> None:
        self.conn.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._real.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._real.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class AiohttpBridge:
    """One aiohttp RequestHandler for one lean connection, made on its first hand-off."""

    def __init__(self, conn: "LeanConnection"):
        self.handler = conn.ctx.aiohttp_server()
        self.handler.connection_made(_SharedTransport(conn))

    def forward(self, msg: "Message") -> None:
        self.handler.data_received(reframe(msg))

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.handler.connection_lost(exc)


@web.middleware
async def completion_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost: on a bridged connection, send the response off and hand the connection
    back to the lean side (aiohttp's own prepare/write_eof after this are no-ops)."""
    try:
        response = await handler(request)
    except web.HTTPException as e:  # the few the error middleware lets through (redirects)
        response = e
    transport = request.transport
    if isinstance(transport, _SharedTransport):
        await response.prepare(request)
        await response.write_eof()
        transport.conn.request_done(response.keep_alive)
    return response
