"""The lean HTTP/1.1 connection: llhttp parsing, the infer route served directly.

One :class:`LeanConnection` per TCP connection. Requests are parsed in C (:mod:`.request_parser`);
a complete
``POST /v2/models/{m}[/versions/{v}]/infer`` goes straight to :func:`.infer.serve_infer`
and its response is written as one buffer. Every other request is handed, whole, to
aiohttp on the same connection (:mod:`.bridge`), so all other routes behave as before.

Responses leave in request order (pipelining): one request is served at a time, later
ones wait parsed in a short queue. Memory per connection is bounded: reading pauses
while the queue is full, and no new request starts while the transport's write buffer
is over its high-water mark (a client that stops reading). Idle, slow-header
(slowloris), stalled-body and never-read connections are closed by the server's sweeper
(:meth:`LeanConnection.check_timeouts`).
"""
from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Coroutine, cast

from ...core.observability.otel import RequestSpan
from ...errors import TritonShmError
from ..headers import first_header
from .api_groups import api_group, refusal_body
from .infer import JSON_TYPE, InferReply, reply_of, serve_infer
from .lean_request import (CONNECTION_LINES, HttpLimit, Message, connection_line, error_body, held_bytes,
                           infer_route, response_head, timeout_message, url_path)
from .request_parser import BODY, HEADERS, IDLE, RequestParser, RequestUpgrade

if TYPE_CHECKING:
    from ...core.data.types import InferRequest, InferResponse
    from .bridge import AiohttpBridge
    from ..restricted import Restrictions
    from .lean_server import LeanContext

log = logging.getLogger(__name__)

MAX_QUEUED = 16              # parsed requests waiting behind the one being served
MAX_QUEUED_BYTES = 1 << 20   # ... and their bodies, with the body being read behind them
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JOIN_BELOW = 64 * 1024  # join head and body into one write below this size
LINGER_TIME = 10.0  # seconds a closing connection reads and drops what the client still sends


class Life(enum.IntEnum):
    """A connection's life. It only moves forward (:meth:`LeanConnection._to`):

    READING -> LAST       a request that is the connection's last (not keep-alive, refused
                          unparsed, too large, an upgrade, a header timeout), the client's EOF,
                          or aiohttp closing its side: what is queued is answered, input dropped
    READING/LAST -> LINGERING   the last answer is written (:meth:`LeanConnection._close`):
                          half-closed, input dropped until the client closes (or LINGER_TIME)
    any -> CLOSED         closed without lingering (the client had half-closed, or TLS), or
                          the transport is lost
    """
    READING = 0
    LAST = 1
    LINGERING = 2
    CLOSED = 3


class Serving(enum.IntEnum):
    """What the connection is serving, one request at a time: NOTHING -> INFER (the lean
    path, the ``_infer_*`` fields below) or BRIDGED (handed to aiohttp) -> NOTHING once its
    response is written (:meth:`LeanConnection.request_done`)."""
    NOTHING = 0
    INFER = 1
    BRIDGED = 2


READING, LAST, LINGERING, CLOSED = Life
NOTHING, INFER, BRIDGED = Serving


class LeanConnection(asyncio.Protocol):
    """Two explicit states, :class:`Life` and :class:`Serving`; besides them, flow control
    (``_read_paused``, ``_write_paused``: what was asked of the transport) and two facts that
    decide transitions (``_eof``: the client half-closed, so closing need not linger;
    ``_stopping``: the server stops, so the next response is the last)."""

    def __init__(self, ctx: "LeanContext"):
        self.ctx = ctx
        self.loop = ctx.loop
        self.transport: asyncio.Transport | None = None
        # Calls back headers_complete, body_too_large and message_complete (the ParserSink).
        self._parser = RequestParser(self, ctx.max_input_size, ctx.restrictions is not None)
        self._queue: deque[Message] = deque()
        self._queued_bytes = 0
        self._life = READING
        self._serving = NOTHING
        # While INFER: the lean response being made (None until it starts), its request, that
        # request decoded by the route's codec (if it was), its span (OpenTelemetry tracing).
        self._infer_run: Coroutine[Any, Any, Any] | None = None
        self._infer_msg: Message | None = None
        self._infer_request: InferRequest | None = None
        self._infer_span: RequestSpan | None = None
        self._bridge: AiohttpBridge | None = None
        self._read_paused = False
        self._write_paused = False
        self._eof = False
        self._stopping = False
        self.since = self.loop.time()       # start of the current state (for the timeouts)

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.ctx.connections.add(self)
        if self.ctx.stopping_since is not None:  # taken from the accept queue as the server stops
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ctx.connections.discard(self)
        self._life = CLOSED
        self._queue.clear()
        self.transport = None
        if self._bridge is not None:
            bridge, self._bridge = self._bridge, None
            bridge.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        self.since = self.loop.time()
        if self._bridge is not None:
            self._bridge.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._bridge is not None:
            self._bridge.resume_writing()
        self._serve()

    def data_received(self, data: bytes) -> None:
        if self._life is not READING:
            return
        parser = self._parser
        if parser.state == BODY:
            self.since = self.loop.time()  # a stalled body times out, a slow one does not
        try:
            parser.feed_data(data)
        except RequestUpgrade:
            self._last_request()  # no protocol upgrades: answer what was parsed, then close
        except HttpLimit as limit:  # over a limit, or malformed
            self._reject(limit.status, limit.message)
        except Exception:  # a bug of ours: answer and close rather than leave the connection hanging
            log.exception("HTTP parser callback failed")
            self._reject(400, "malformed HTTP request")
        if parser.began:  # the header timeout counts from a request's first byte
            self.since = self.loop.time()
        self._serve()
        # Nothing queued and no request being read: nothing is held, so nothing to weigh.
        if not self._read_paused and (self._queue or parser.msg is not None) and self._over_budget():
            self._pause_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        if self._life is LINGERING:
            return None  # close
        self._to(LAST)  # the client sent all it will: finish queued requests, then close
        self._serve()
        return True

    # -- the parser's callbacks (ParserSink) -------------------------------------------------
    def headers_complete(self, msg: Message) -> None:
        """Only for a message refused already, asking 100-continue, or under restrictions."""
        msg.route = infer_route(msg.method, msg.url)
        if self.ctx.restrictions is not None and msg.error is None:
            msg.refusal = self._refusal(self.ctx.restrictions, msg)
        if msg.error is not None:  # refused in turn without waiting for the body, then closed
            self._queue_message(msg)
            self._last_request()
        elif msg.expect_continue:
            if self._serving is NOTHING and not self._queue:
                self.write(_CONTINUE)
                msg.expect_continue = False
            # else: sent by _serve once the requests before this one are answered

    def body_too_large(self, msg: Message) -> None:
        self._queue_message(msg)
        self._last_request()

    def message_complete(self, msg: Message) -> None:
        if self._life is not READING:
            return  # refused already, or input after the last request
        if self._stopping:
            msg.keep_alive = False  # answered with Connection: close, the connection's last
        # _queue_message, inline: once per request (measured with bench/instructions.py; the
        # helper stays the code for the other callers)
        self._queue.append(msg)
        if msg.error is None and msg.refusal is None:
            self._queued_bytes += msg.size
        if not msg.keep_alive or msg.error is not None:
            self._last_request()  # nothing after this request is read

    # -- serving ---------------------------------------------------------------------------
    def _serve(self) -> None:
        """Start the next queued request if none is being served and the client reads."""
        while self._serving is NOTHING and self._queue and not self._write_paused and self.transport is not None:
            msg = self._queue.popleft()
            if msg.error is not None:
                self._respond(msg, msg.error[0], JSON_TYPE, error_body(msg.error[1]))
                self._close()
                return
            if msg.refusal is not None:
                self._refuse(msg, msg.refusal)
                continue
            self._queued_bytes -= msg.size  # held_bytes(msg): neither an error nor a refusal here
            if msg.route is not None:
                self._serving = INFER
                self._infer(msg)
            else:
                self._serving = BRIDGED
                self._forward(msg)
        if self.transport is None:
            return
        if self._read_paused and not self._write_paused and not self._over_budget():
            self._read_paused = False
            self.transport.resume_reading()
        if self._serving is not NOTHING:
            return
        if self._life is not READING and not self._queue:
            self._close()  # the last request this connection serves is answered
            return
        parsing = self._parser.msg
        if parsing is not None and parsing.expect_continue and not self._queue and self._life is READING:
            parsing.expect_continue = False
            self.write(_CONTINUE)

    def _refusal(self, restrictions: "Restrictions", msg: Message) -> str | None:
        """The restricted-API check, as soon as the headers are in, so a refused body is never
        held. Authoritative for the infer route; for the others aiohttp's middleware checks
        again on the path its router matches (a percent-escaped path may only match there)."""
        group = "inference" if msg.route is not None else api_group(url_path(msg.url))
        return restrictions.refusal(group, lambda name: first_header(msg.headers, name))

    def _refuse(self, msg: Message, refusal: str) -> None:
        """Answer 403 in turn; the connection stays open for the next request."""
        self._respond(msg, 403, JSON_TYPE, refusal_body(refusal))
        self.since = self.loop.time()
        if not msg.keep_alive:
            self._close()

    def _infer(self, msg: Message) -> None:
        """Serve an infer request. The common shape (binary tensors, no Content-Encoding or
        Accept-Encoding) is decoded and answered by the route's codec, around the service's
        own coroutine; anything else runs ``serve_infer``, the general path, whose answers
        and errors the codec's equal where it answers (it returns None where it does not)."""
        route = msg.route
        assert route is not None
        request = None
        span = None
        if self.ctx.service.tracer.spans:  # only its body is seen here: received now
            span = self._infer_span = RequestSpan(first_header(msg.headers, "traceparent"))
            span.stamp("HTTP_RECV_START")
            span.stamp("HTTP_RECV_END")
        forward = self.ctx.header_forward
        if forward is not None:  # the general path adds the headers to the parameters
            forward_headers = forward, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.headers]
        elif msg.content_encoding is None and msg.accept_encoding is None:
            try:
                request = route.decode(msg.body, msg.header_length)
            except Exception as e:
                log.exception("unhandled error in POST %s", msg.url.decode("latin-1"))
                self._failed(msg, e)
                return
        if request is not None:
            run: Coroutine[Any, Any, Any] = self.ctx.service.infer(request, span)
        else:
            run = serve_infer(self.ctx.service, route.model, route.version, msg.body,
                              header_length=msg.header_length, content_encoding=msg.content_encoding,
                              accept_encoding=msg.accept_encoding, max_input_size=self.ctx.max_input_size,
                              span=span, forward=forward_headers if forward is not None else None)
        self._infer_run, self._infer_msg, self._infer_request = run, msg, request
        self._advance()

    def _advance(self, _done: object = None) -> None:
        """Run the request being served (``_infer_run``) to its next wait (the first call
        starts it), on when the future it waits for is done, and answer with its result or
        refusal: an InferResponse to ``_infer_request`` (the common shape), else serve_infer's
        InferReply. One request is served at a time, so its state is the connection's. This is
        what an asyncio Task would do, without one per request: the coroutine waits only on
        futures and nothing cancels it, so a Task's own scheduling, registry and cancellation
        would add nothing (measured: a Task each costs ~1.4 µs more per request, 1.5x this
        driving). It needs only the Future protocol's public side (``tests/test_http_lean.py:
        test_a_request_runs_without_a_task_on_asyncio_futures`` fails if asyncio changes it).
        A cancelled future it waits for ends it unanswered, as it would end a Task."""
        run, msg, request = self._infer_run, self._infer_msg, self._infer_request
        assert run is not None and msg is not None
        try:
            try:
                waited = run.send(None)
            except StopIteration as done:
                if self._infer_span is not None:
                    self._infer_span.stamp("INFER_RESPONSE_COMPLETE")
                    self._infer_span.stamp("HTTP_SEND_START")
                if request is not None:
                    self._answer(msg, request, done.value)
                else:
                    reply = done.value
                    self._respond(msg, 200, reply.content_type, reply.body, reply.headers)
            else:
                if waited is None:  # a bare yield (sleep(0)): go on at the next loop iteration
                    self.loop.call_soon(self._advance)
                else:  # the future it awaits (Future.__await__ yields itself): on once it is done
                    waited.add_done_callback(self._advance)
                return
        except TritonShmError as e:
            self._respond(msg, e.http_status, JSON_TYPE, error_body(e.message))
        except asyncio.CancelledError:
            return
        except Exception as e:
            log.exception("unhandled error in POST %s", msg.url.decode("latin-1"))
            self._failed(msg, e)
            return
        self.request_done(msg.keep_alive)

    def _answer(self, msg: Message, request: "InferRequest", response: "InferResponse") -> None:
        """The response to a common-shape request: the whole HTTP response from the route's
        codec in one write, or the general encoder's reply (an output sent as JSON data...)."""
        assert msg.route is not None
        connection = b"" if msg.keep_alive and msg.version == "1.1" else CONNECTION_LINES[connection_line(msg)]
        reply: InferReply | None = None
        try:
            data = msg.route.respond(response, request, self.ctx.date_bytes, connection)
            if data is None:
                reply = reply_of(response, request)
        finally:
            response.release()  # outputs may be views into shared memory
        if data is None:
            assert reply is not None
            self._respond(msg, 200, reply.content_type, reply.body, reply.headers)
            return
        transport = self.transport  # self.write, inline: once per request
        if transport is not None and self._life is not LINGERING and not transport.is_closing():
            transport.write(data)

    def _failed(self, msg: Message, e: Exception) -> None:
        """A bug of ours while serving (logged by the caller): answer 500 and go on."""
        self._respond(msg, 500, JSON_TYPE, error_body(f"internal server error ({type(e).__name__})"))
        self.request_done(msg.keep_alive)

    def _forward(self, msg: Message) -> None:
        if self._bridge is None:
            from .bridge import AiohttpBridge
            self._bridge = AiohttpBridge(self)
            if self._write_paused:
                self._bridge.pause_writing()
        self._bridge.forward(msg)

    def bridge_closed(self) -> None:
        """aiohttp closes its side: after its response, or at shutdown."""
        self._to(LAST)
        if self._serving is not INFER:  # not in the middle of a lean response
            self._close()

    def request_done(self, keep_alive: bool) -> None:
        """The response to the request being served is written (lean or aiohttp)."""
        self._serving = NOTHING
        self._infer_run = self._infer_msg = self._infer_request = None
        if self._infer_span is not None:  # written (answered or refused): the span ends
            span, self._infer_span = self._infer_span, None
            span.stamp("HTTP_SEND_END")
            self.ctx.service.tracer.end_request(span)
        self.since = self.loop.time()
        if not keep_alive or (self._stopping and not self._queue and self._parser.state == IDLE):
            self._close()
        elif self._queue or self._read_paused or self._life is not READING or self._parser.msg is not None:
            self._serve()  # else it would find nothing to do

    # -- writing -----------------------------------------------------------------------------
    def _respond(self, msg: Message, status: int, content_type: str, body: bytes,
                 headers: dict[str, str] | None = None) -> None:
        head = response_head(msg, status, content_type, len(body), headers, self.ctx.date)
        if len(body) < _JOIN_BELOW:
            self.write(head + body)
        else:
            self.write(head)
            self.write(body)

    def write(self, data: bytes) -> None:
        """Every write of the connection, the bridge's included: none once closing."""
        transport = self.transport
        if transport is not None and self._life is not LINGERING and not transport.is_closing():
            transport.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        transport = self.transport
        if transport is not None and self._life is not LINGERING and not transport.is_closing():
            transport.writelines(chunks)

    def _reject(self, status: int, message: str) -> None:
        """A request that cannot be parsed: answer in turn, then close."""
        if self._life is not READING:
            return  # input after the last request this connection serves
        msg = self._parser.msg or Message()
        self._parser.msg = None
        msg.error = (status, message)
        self._queue_message(msg)
        self._last_request()

    def _queue_message(self, msg: Message) -> None:
        self._queue.append(msg)
        self._queued_bytes += held_bytes(msg)

    # -- flow control and closing -----------------------------------------------------------------
    def _over_budget(self) -> bool:
        """Too much read ahead of the request being served: queued requests, and the next one's
        body so far (the request at the head may take its whole --http-max-input-size)."""
        held = self._queued_bytes
        parsing = self._parser.msg
        if self._serving is not NOTHING and parsing is not None:
            held += parsing.size
        return len(self._queue) >= MAX_QUEUED or held >= MAX_QUEUED_BYTES

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def _to(self, life: Life) -> None:
        """The one way :class:`Life` moves: forward only."""
        if life > self._life:
            self._life = life

    def _last_request(self) -> None:
        """Answer what is queued, then close; later input is read and dropped."""
        self._to(LAST)

    def _close(self) -> None:
        """Close after what is buffered has been written. Unless the client has finished
        sending, half-close first and drop its input until it closes (lingering): a reset
        could destroy the answer before the client reads it."""
        self._to(LAST)
        self._queue.clear()
        transport = self.transport
        if transport is None or transport.is_closing() or self._life is not LAST:
            return  # closed, or closing once the client closes or the sweeper gives up
        if self._eof or not transport.can_write_eof():
            self._life = CLOSED
            transport.close()
            return
        self._life = LINGERING
        self.since = self.loop.time()
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def busy(self) -> bool:
        return self._serving is not NOTHING

    def check_timeouts(self, now: float) -> None:
        """Called about once a second by the server's sweeper."""
        ctx = self.ctx
        elapsed = now - self.since
        if self._life is LINGERING:
            if elapsed > LINGER_TIME:
                self.abort()
        elif self._write_paused:
            if elapsed > ctx.keepalive_timeout:  # the client stopped reading
                self.abort()
        elif self._serving is not NOTHING or self._queue:
            return
        elif self._parser.state == HEADERS and elapsed > ctx.header_timeout:
            self._queue_message(timeout_message())
            self._last_request()
            self._serve()
        elif elapsed > ctx.keepalive_timeout:  # idle, or a body that stopped arriving
            self._close()

    def shutdown(self) -> None:
        """The server stops. The request being served, or the next one to arrive, is this
        connection's last: its response says ``Connection: close`` where it is not under way
        yet, and the connection closes after it. One with no request begun waits for one
        until the server's grace ends (:meth:`check_shutdown`): a client that has just
        connected is about to send it, and closing under it would lose it."""
        self._stopping = True
        if self._parser.state != IDLE:
            return  # the request being read: message_complete marks it the last
        if self._queue:
            self._queue[-1].keep_alive = False
        elif self._infer_msg is not None:
            self._infer_msg.keep_alive = False  # its response is not written yet

    def check_shutdown(self, now: float, grace_until: float) -> None:
        """While the server stops: close a connection that has had no request to serve by
        ``grace_until``."""
        if (now >= grace_until and self._serving is NOTHING and not self._queue and self._parser.state == IDLE
                and self._life is not LINGERING):
            self._close()

    @property
    def settled(self) -> bool:
        """Nothing more to do before the server may drop it: closed, or lingering with every
        byte of its answers handed to the kernel."""
        transport = self.transport
        if transport is None:
            return True
        return (self._life is LINGERING or transport.is_closing()) and transport.get_write_buffer_size() == 0
