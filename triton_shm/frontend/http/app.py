"""The aiohttp application (routes, error mapping, limits) and :func:`start_http`, which
serves it alone or behind the lean infer path."""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ...errors import TritonShmError
from ..listeners import LISTEN_BACKLOG, retrieve_failures, stop_listening
from ..restricted import Restrictions
from ..transports import FALLBACK_TRANSPORTS
from .api_groups import restriction_middleware
from .handlers import HttpHandlers, build_routes
from .timeouts import HEADER_TIMEOUT, KEEPALIVE_TIMEOUT, STOP_GRACE

if TYPE_CHECKING:
    import ssl

    from ...core.service import InferenceService
    from ..header_forward import HeaderForward

log = logging.getLogger(__name__)

DEFAULT_MAX_INPUT_SIZE = 64 * 2**20  # Triton's --http-max-input-size default


class _ClientErrorsOnOneLine(logging.Filter):
    """aiohttp logs a request it cannot parse at ERROR with a traceback; that is the
    client's mistake, so it becomes one WARNING line (no log flood from bad clients)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


logging.getLogger("aiohttp.server").addFilter(_ClientErrorsOnOneLine())
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"error": message}),
                        content_type="application/json", headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Every failure becomes ``{"error": message}``, as Triton answers; no tracebacks."""
    try:
        return await handler(request)
    except TritonShmError as e:
        return _error(e.http_status, e.message)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # aiohttp's default text is "<status>: <reason>"; keep only custom texts (413's).
        text = e.text or ""
        message = e.reason if not text or text.startswith(f"{e.status}:") else text
        allow = e.headers.get("Allow")
        return _error(e.status, message, {"Allow": allow} if allow else None)
    except asyncio.CancelledError:
        raise  # client went away: nothing to answer
    except Exception as e:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, f"internal server error ({type(e).__name__})")


def create_app(
    service: "InferenceService",
    *,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    extra_routes: Iterable[web.RouteDef] = (),
    middlewares: Iterable[Any] = (),
    restrictions: Restrictions | None = None,
    header_forward: "HeaderForward | None" = None,
) -> web.Application:
    """The Triton HTTP API over ``service``.

    ``max_input_size`` bounds the request body on the wire and after decompression.
    ``extra_routes`` are matched before the built-in ones (later features plug in here);
    ``middlewares`` run outside the restricted-API check, which runs outside the error
    middleware, so it sees every request aiohttp routes, matched or not.
    Run it with ``auto_decompress=False`` on the runner (as :func:`start_http` does) so
    compressed bodies are inflated under that cap with a 400 error; otherwise aiohttp
    inflates them itself and answers 413 past ``client_max_size``.
    """
    checks = [restriction_middleware(restrictions)] if restrictions else []
    app = web.Application(client_max_size=max_input_size, middlewares=[*middlewares, *checks, error_middleware])
    handlers = HttpHandlers(service, max_input_size, header_forward)
    app.router.add_routes([*extra_routes, *build_routes(handlers)])
    return app


def default_http_transport() -> str:
    """``aiohttp`` under the fallback switch (``..transports``), or where no request parser
    can serve (the C extension not built and httptools not installed); else ``lean``."""
    if FALLBACK_TRANSPORTS:
        return "aiohttp"
    from .request_parser import AVAILABLE
    return "lean" if AVAILABLE else "aiohttp"


async def start_http(
    service: "InferenceService",
    host: str,
    port: int,
    *,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    shutdown_timeout: float = 30.0,
    header_timeout: float | None = None,
    idle_timeout: float | None = None,
    transport: str | None = None,
    restrictions: Restrictions | None = None,
    header_forward: "HeaderForward | None" = None,
    ssl: "ssl.SSLContext | None" = None,
    sock: socket.socket | None = None,
) -> Any:
    """Serve on ``host:port``, or on the listening socket ``sock`` where one is given (made
    by :func:`..listeners.bind_listener`, maybe in another process: ``host:port`` then only
    name it); the caller stops it with ``await server.cleanup()``, which
    lets in-flight requests finish for up to ``shutdown_timeout`` seconds.

    With ``transport`` ``lean`` (default: when a request parser can serve; see
    :func:`default_http_transport`) the infer route runs on the lean path (:mod:`.lean_server`) and
    aiohttp serves the rest on the same port; with ``aiohttp`` all of it is aiohttp's.
    ``header_timeout`` bounds the wait for a request's headers (lean path only);
    ``idle_timeout`` an idle connection (both). ``restrictions``: the restricted APIs (on both
    paths); ``header_forward``: --http-header-forward-pattern (both); ``ssl``: serve HTTPS.
    """
    if (transport or default_http_transport()) == "aiohttp":
        app = create_app(service, max_input_size=max_input_size, restrictions=restrictions,
                         header_forward=header_forward)
        return await serve_app(app, host, port, ssl=ssl, sock=sock, auto_decompress=False,
                               shutdown_timeout=shutdown_timeout,
                               keepalive_timeout=KEEPALIVE_TIMEOUT if idle_timeout is None else idle_timeout)
    from .bridge import completion_middleware
    from .lean_server import start_lean_http
    app = create_app(service, max_input_size=max_input_size, middlewares=[completion_middleware],
                     restrictions=restrictions, header_forward=header_forward)
    return await start_lean_http(service, app, host, port, max_input_size=max_input_size,
                                 shutdown_timeout=shutdown_timeout,
                                 header_timeout=HEADER_TIMEOUT if header_timeout is None else header_timeout,
                                 keepalive_timeout=KEEPALIVE_TIMEOUT if idle_timeout is None else idle_timeout,
                                 restrictions=restrictions, header_forward=header_forward, ssl=ssl, sock=sock)


class AiohttpServer:
    """An aiohttp app served on one port by its own site; :meth:`cleanup` stops it."""

    def __init__(self, runner: web.AppRunner, site: web.BaseSite, ssl: "ssl.SSLContext | None"):
        self.runner, self.site, self.ssl = runner, site, ssl

    async def cleanup(self) -> None:
        """Stop accepting without resetting a connection the kernel has accepted (the accept
        queue is taken and served), give a connection that has had no request yet STOP_GRACE
        to send one, then aiohttp's own shutdown: requests in flight finish, the rest close."""
        loop = asyncio.get_running_loop()
        server, handler = getattr(self.site, "_server", None), self.runner.server  # the site's listener
        if server is not None and handler is not None:
            taken: list[asyncio.Task] = []
            await stop_listening(server, lambda sock: taken.append(loop.create_task(
                loop.connect_accepted_socket(handler, sock, ssl=self.ssl))))
            grace_until = loop.time() + STOP_GRACE
            if taken:
                await asyncio.wait(taken, timeout=STOP_GRACE)
                retrieve_failures(taken)
            while loop.time() < grace_until and any(_awaiting_first_request(c) for c in handler.connections):
                await asyncio.sleep(0.01)
        await self.runner.cleanup()


def _awaiting_first_request(handler: Any) -> bool:
    """An aiohttp connection that has not had a request yet (its client has just connected)."""
    return getattr(handler, "_request_count", 1) == 0 and getattr(handler, "transport", None) is not None


async def serve_app(app: web.Application, host: str, port: int, *, ssl: "ssl.SSLContext | None" = None,
                    sock: socket.socket | None = None, **runner_options: Any) -> AiohttpServer:
    """Run an aiohttp app on ``host:port``, or on the listening socket ``sock`` (HTTPS with
    ``ssl``); stop it with ``await server.cleanup()``."""
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    site: web.BaseSite
    if sock is None:
        site = web.TCPSite(runner, host, port, ssl_context=ssl)
    else:
        site = web.SockSite(runner, sock, ssl_context=ssl, backlog=LISTEN_BACKLOG)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return AiohttpServer(runner, site, ssl)
