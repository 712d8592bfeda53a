"""A gRPC call on one stream: its state, and running it (the method body as an asyncio
task, its messages out, its status at the end). ``CallRunner`` is mixed into the
connection, whose engine, flush and writer bookkeeping it uses."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Sequence

import ngh2

from ....core.observability.otel import RequestSpan
from ....errors import TritonShmError
from ..rpc import Mailbox, Method, identity, rpc_status
from .framing import ACCEPT_ENCODING, DEADLINE_EXCEEDED, OK, MessageReader, compress, encode_message_text, prefix

STREAM_SEND_HIGH = 1 << 20  # a stream's queued response bytes before its producer waits
STREAM_QUEUE_DEPTH = 4  # stream messages read ahead of the handler before windows stop opening

_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"),
                     (b"grpc-accept-encoding", ACCEPT_ENCODING))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
_NEVER = float("-inf")


class Call:
    """One stream's gRPC call."""

    __slots__ = ("stream_id", "method", "encoding", "reader", "task", "timer", "send_encoding",
                 "headers_sent", "finished", "remote_closed", "messages", "queue", "deferred_ack",
                 "writable", "span", "forwarded")

    def __init__(self, stream_id: int, method: Method, encoding: bytes, send_encoding: bytes | None):
        self.stream_id = stream_id
        self.method = method
        self.encoding = encoding  # the request messages' grpc-encoding
        # A stream's reader is made with the call; a unary call's only when its request
        # does not come as one whole message in one payload (connection._on_data).
        self.reader: MessageReader | None = None
        self.send_encoding = send_encoding
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.headers_sent = False
        self.finished = False  # our side ended (status sent or stream gone)
        self.remote_closed = False
        self.messages: list[bytes | memoryview] = []  # unary: the request
        self.queue: Mailbox | None = None  # streams: messages for the handler
        self.deferred_ack = 0  # stream bytes received but not yet released to the peer
        self.writable: asyncio.Future | None = None  # set while the handler waits on backpressure
        # ModelInfer's InferRequest span (OpenTelemetry tracing); ModelStreamInfer's trace
        # context (its requests' spans are made from it)
        self.span: RequestSpan | None = None
        # ModelInfer / ModelStreamInfer under --grpc-header-forward-pattern: its headers, as
        # request parameters (a stream's: or the error each of its requests is answered)
        self.forwarded: dict[str, str] | TritonShmError | None = None


class CallRunner:
    """The per-call half of ``GrpcConnection``."""

    h2: ngh2.Connection
    loop: asyncio.AbstractEventLoop
    calls: dict[int, Call]
    flush_scheduled: bool
    waiting_writers: set[Call]
    pending_resets: list[int]
    ping_strikes: int
    last_ping: float

    def schedule_flush(self) -> None:  # the connection's
        raise NotImplementedError

    def flush(self) -> None:  # the connection's
        raise NotImplementedError

    def _ack(self, sid: int, size: int) -> None:  # the connection's
        raise NotImplementedError

    def _deadline(self, call: Call) -> None:
        call.timer = None
        if not call.finished:
            if call.task is not None:
                call.task.cancel()
            self._finish(call, DEADLINE_EXCEEDED, "Deadline Exceeded")

    async def _run_unary(self, call: Call) -> None:
        method = call.method
        try:
            # The request message is not kept here: once the handler is done with it, a large
            # one is freed before its response is encoded (the allocator then reuses its
            # pages for the response instead of faulting in fresh ones).
            request = method.deserialize(call.messages.pop())
            if call.forwarded is not None and isinstance(call.forwarded, dict):  # a unary call's: never an error
                request.parameters = {**request.parameters, **call.forwarded}
            response = await method.handler(request)
            if call.finished:  # reset or timed out meanwhile; a response may own shared memory
                release = getattr(response, "release", None)
                if release is not None:
                    release()
                return
            encoding = call.send_encoding
            message = method.serialize(response, True) if encoding is None else \
                self._frame(method, response, encoding)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the client must get an answer
            self._finish(call, *rpc_status(e, method.path))
            return
        self._answer(call, message)

    async def _run_traced(self, call: Call, span: RequestSpan) -> None:
        """``_run_unary`` with the call's InferRequest span (the handler is service.infer)."""
        method = call.method
        span.stamp("GRPC_WAITREAD_END")
        try:
            request = method.deserialize(call.messages.pop())
            if call.forwarded is not None and isinstance(call.forwarded, dict):  # a unary call's: never an error
                request.parameters = {**request.parameters, **call.forwarded}
            response = await method.handler(request, span)
            span.stamp("INFER_RESPONSE_COMPLETE")
            if call.finished:
                response.release()
                return
            span.stamp("GRPC_SEND_START")
            encoding = call.send_encoding
            message = method.serialize(response, True) if encoding is None else \
                self._frame(method, response, encoding)
            self._answer(call, message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the client must get an answer
            self._finish(call, *rpc_status(e, method.path))
        finally:
            span.stamp("GRPC_SEND_END")
            method.spans.tracer.end_request(span)

    def _answer(self, call: Call, message: bytes) -> None:
        """A unary call's whole answer: what ``_send_message`` then ``_finish(call, OK, "")``
        do, in one step (the headers are not sent yet and the call is not finished: the
        caller checked), and one flush for all of it: at once when the connection has no
        other call, else with the other calls' output of this loop pass."""
        call.finished = call.headers_sent = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        h2, sid = self.h2, call.stream_id
        self.ping_strikes, self.last_ping = 0, _NEVER  # gRPC's ping policy: data sent
        try:
            h2.send_response(sid, _RESPONSE_HEADERS if call.send_encoding is None else
                             (*_RESPONSE_HEADERS, (b"grpc-encoding", call.send_encoding)))
            h2.send_data(sid, message)
            h2.send_trailers(sid, _OK_TRAILERS)
            if not call.remote_closed:  # we are done; the client need not send the rest
                self.pending_resets.append(sid)
        except ngh2.NGH2Error:
            pass  # the stream went away under us
        if self.flush_scheduled or len(self.calls) > 1:
            self.schedule_flush()  # coalesced with the other calls' output of this iteration
        else:  # nothing else to wait for on this connection: write now, not a loop pass later
            call.task = None  # answered: nothing left to cancel when its stream closes in flush
            self.flush()

    async def _run_stream(self, call: Call) -> None:
        method = call.method
        serialize, encoding = method.serialize, call.send_encoding
        replies = method.handler(self._requests(call)) if method.spans is None else \
            method.handler(self._requests(call), call.span) if call.forwarded is None else \
            method.handler(self._requests(call), call.span, call.forwarded)
        try:
            async for reply in replies:
                if call.finished:
                    return
                self._send_message(call, serialize(reply, True) if encoding is None else
                                   self._frame(method, reply, encoding))
                if self.h2.queued_body_size(call.stream_id) >= STREAM_SEND_HIGH:
                    call.writable = self.loop.create_future()
                    self.waiting_writers.add(call)
                    await call.writable
            status: tuple[int, str] = (OK, "")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            status = rpc_status(e, method.path)
        finally:
            await replies.aclose()  # the body's own cleanup (its requests' tasks) runs now
        self._finish(call, *status)

    async def _requests(self, call: Call) -> AsyncIterator[Any]:
        queue, deserialize = call.queue, call.method.deserialize
        if queue is None:  # only a stream call has its messages queued
            return
        raw = deserialize is identity  # the body takes the message as it came: no call per message
        while True:
            item = await queue.get()
            if item is None:
                return
            if call.deferred_ack and queue.qsize() < STREAM_QUEUE_DEPTH:
                self._ack(call.stream_id, call.deferred_ack)
                call.deferred_ack = 0
                self.schedule_flush()
            yield item if raw else deserialize(item)

    def _wake_writer(self, call: Call) -> None:
        self.waiting_writers.discard(call)
        if call.writable is not None and not call.writable.done():
            call.writable.set_result(None)
        call.writable = None

    @staticmethod
    def _frame(method: Method, response: Any, encoding: bytes | None) -> bytes:
        if encoding is None:
            return method.serialize(response, True)
        body = compress(method.serialize(response, False), encoding)
        return prefix(len(body), True) + body

    def _send_message(self, call: Call, message: bytes) -> None:
        h2, sid = self.h2, call.stream_id
        self.ping_strikes, self.last_ping = 0, _NEVER  # gRPC's ping policy: data sent
        try:
            if not call.headers_sent:
                call.headers_sent = True
                headers = _RESPONSE_HEADERS if call.send_encoding is None else \
                    (*_RESPONSE_HEADERS, (b"grpc-encoding", call.send_encoding))
                h2.send_response(sid, headers)
            h2.send_data(sid, message)
        except ngh2.NGH2Error:
            call.finished = True  # the stream went away under us
        self.schedule_flush()

    def _finish(self, call: Call, code: int, message: str) -> None:
        """End the call with a status: trailers, or trailers-only when nothing was sent."""
        if call.finished:
            return
        call.finished = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        status: Sequence[tuple[bytes, bytes]] = _OK_TRAILERS
        if code or message:
            status = [(b"grpc-status", str(code).encode())]
            if message:
                status.append((b"grpc-message", encode_message_text(message)))
        h2, sid = self.h2, call.stream_id
        try:
            if call.headers_sent:
                h2.send_trailers(sid, status)
            else:
                h2.send_response(sid, (*_RESPONSE_HEADERS, *status), end_stream=True)
            if not call.remote_closed:  # we are done; the client need not send the rest
                self.pending_resets.append(sid)
        except ngh2.NGH2Error:
            pass
        self.schedule_flush()
