"""The HTTP port served by lean connections, with aiohttp behind them for all but infer.

:func:`start_lean_http` binds the port itself and gives each connection a
:class:`.lean.LeanConnection`; the aiohttp application runs without a site of its own,
reached only through :mod:`.bridge`. One sweeper task per server applies the timeouts
and refreshes the Date header once a second, so no request pays for a timer.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from email.utils import formatdate
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from ..listeners import LISTEN_BACKLOG, retrieve_failures, stop_listening
from ..restricted import Restrictions
from .lean import LeanConnection
from .timeouts import HEADER_TIMEOUT, KEEPALIVE_TIMEOUT, STOP_GRACE

if TYPE_CHECKING:
    import ssl

    from ...core.service import InferenceService
    from ..header_forward import HeaderForward

_BRIDGE_KEEPALIVE = 10.0**9  # aiohttp never closes a bridged connection on its own


class LeanContext:
    """What every connection of one server shares."""

    def __init__(self, service: "InferenceService", max_input_size: int,
                 aiohttp_server: Callable[[], web.RequestHandler], header_timeout: float, keepalive_timeout: float,
                 restrictions: Restrictions | None = None, header_forward: "HeaderForward | None" = None):
        self.service = service
        self.header_forward = header_forward  # --http-header-forward-pattern: its requests take serve_infer
        self.restrictions = restrictions or None  # checked before an infer request is served
        self.max_input_size = max_input_size
        self.aiohttp_server = aiohttp_server
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.loop = asyncio.get_running_loop()
        self.connections: set[LeanConnection] = set()
        self.stopping_since: float | None = None  # when cleanup began: connections made since stop at once
        self.date = formatdate(usegmt=True)
        self.date_bytes = self.date.encode("latin-1")  # the same, as the route codecs write it


class LeanHttpServer:
    def __init__(self, ctx: LeanContext, runner: web.AppRunner, shutdown_timeout: float):
        self.ctx = ctx
        self.runner = runner
        self.shutdown_timeout = shutdown_timeout
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._ssl: "ssl.SSLContext | None" = None

    async def start(self, host: str, port: int, ssl: "ssl.SSLContext | None" = None,
                    sock: socket.socket | None = None) -> None:
        """Listen on ``host:port``, or on the listening socket ``sock`` (then it is the server's)."""
        loop = self.ctx.loop
        self._ssl = ssl

        def connection() -> LeanConnection:
            return LeanConnection(self.ctx)
        if sock is None:
            self._server = await loop.create_server(connection, host, port, reuse_address=True, ssl=ssl)
        else:
            self._server = await loop.create_server(connection, sock=sock, ssl=ssl, backlog=LISTEN_BACKLOG)
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        ctx = self.ctx
        while True:
            await asyncio.sleep(1.0)
            ctx.date = formatdate(usegmt=True)
            ctx.date_bytes = ctx.date.encode("latin-1")
            now = ctx.loop.time()
            for conn in list(ctx.connections):
                conn.check_timeouts(now)

    async def cleanup(self) -> None:
        """Stop accepting without resetting a connection the kernel has accepted (the ones in
        the accept queue are taken and served), let every connection's request in flight, or
        about to arrive (for STOP_GRACE), finish with ``Connection: close`` (up to the shutdown
        timeout), then close."""
        ctx, loop = self.ctx, self.ctx.loop
        now = ctx.stopping_since = loop.time()
        deadline = now + self.shutdown_timeout
        grace_until = now + min(STOP_GRACE, self.shutdown_timeout)
        taken: list[asyncio.Task] = []
        if self._server is not None:
            def serve(sock: socket.socket) -> None:
                taken.append(loop.create_task(loop.connect_accepted_socket(
                    lambda: LeanConnection(ctx), sock, ssl=self._ssl)))
            await stop_listening(self._server, serve)
        for conn in list(ctx.connections):
            conn.shutdown()
        if taken:
            await asyncio.wait(taken, timeout=max(deadline - loop.time(), 0.0))
            retrieve_failures(taken)
        while loop.time() < deadline:
            now = loop.time()
            for conn in list(ctx.connections):
                conn.check_shutdown(now, grace_until)
            if all(c.settled for c in ctx.connections):
                break
            await asyncio.sleep(0.01)
        await self.runner.cleanup()  # aiohttp's side: its handlers in flight, then on_cleanup
        for conn in list(self.ctx.connections):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper


async def start_lean_http(
    service: "InferenceService", app: web.Application, host: str, port: int, *,
    max_input_size: int, shutdown_timeout: float, header_timeout: float = HEADER_TIMEOUT,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT, restrictions: Restrictions | None = None,
    header_forward: "HeaderForward | None" = None, ssl: "ssl.SSLContext | None" = None,
    sock: socket.socket | None = None,
) -> LeanHttpServer:
    """Serve ``app`` (built with :func:`.bridge.completion_middleware` outermost) on ``host:port``,
    or on the listening socket ``sock``."""
    runner = web.AppRunner(app, access_log=None, auto_decompress=False, shutdown_timeout=shutdown_timeout,
                           keepalive_timeout=_BRIDGE_KEEPALIVE)
    await runner.setup()
    if runner.server is None:  # setup() made it
        raise RuntimeError("aiohttp's runner has no server after setup")
    ctx = LeanContext(service, max_input_size, runner.server, header_timeout, keepalive_timeout, restrictions,
                      header_forward)
    server = LeanHttpServer(ctx, runner, shutdown_timeout)
    try:
        await server.start(host, port, ssl, sock)
    except BaseException:
        await runner.cleanup()
        raise
    return server
