"""One HTTP/2 connection serving gRPC calls: an asyncio Protocol around the protocol engine.

Bytes read from the socket go into the engine; its events become calls (one asyncio
task each); the engine's output goes back to the transport, in bounded chunks and only
while the transport is not paused, so a slow reader holds its responses in the engine
(bounded by its flow-control window and the calls it has open) instead of growing
the transport's buffer. Receive windows are given back as messages are consumed.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Callable, cast

import ngh2

from ....core.observability.otel import RequestSpan
from ....errors import TritonShmError
from ...header_forward import call_metadata
from ...headers import first_header
from ..rpc import Mailbox, Method
from .calls import STREAM_QUEUE_DEPTH, STREAM_SEND_HIGH, Call, CallRunner
from .framing import (
    DATA_FRAME,
    FRAME_HEADER,
    INTERNAL,
    PREFACE,
    UNAVAILABLE,
    INVALID_ARGUMENT,
    UNIMPLEMENTED,
    UNKNOWN,
    GrpcError,
    MessageReader,
    frame_length,
    parse_timeout,
    supported_encoding,
    whole_frames_end,
)

if TYPE_CHECKING:
    from .server import NativeServer

log = logging.getLogger(__name__)

WRITE_CHUNK = 256 * 1024  # engine output gathered per transport write
# Engine output is taken one DATA frame at a time (16 KiB payload, the engine's default, plus
# its 9-byte header): the engine appends each frame to a fresh buffer of its own, and one
# grown over several frames is reallocated (and copied) at almost every frame, costing about
# three extra copies of a large response. The pieces go out in one writev.
OUTPUT_PIECE = 16 * 1024 + 9
LINGER_SECONDS = 1.0  # reading on after our final GOAWAY
CALL_TASK = "gRPC call"  # each call's task name (a fixed one: the default is formatted per task)

# A DATA frame at least this long that a read cuts is kept back until its end arrives (below).
KEEP_FRAME_MIN = 16 * 1024
NEVER = 1 << 62  # a frame_rest no input reaches


class ReceiveBuffers:
    """Buffers for input kept back between reads: each holds the start of a cut frame and
    the next read after it. A connection has one only while it is inside such a frame; at
    most ``limit`` are out at once (past that a connection lets the engine assemble its
    frames), and a few are kept for reuse (a new one is zero-filled)."""

    SPARE = 4

    def __init__(self, size: int, limit: int = 128):
        self.size = size
        self.limit = limit
        self.out = 0
        self.spare: list[memoryview] = []

    def take(self) -> memoryview | None:
        if self.out >= self.limit:
            return None
        self.out += 1
        return self.spare.pop() if self.spare else memoryview(bytearray(self.size))

    def give(self, buffer: memoryview) -> None:
        self.out -= 1
        if len(self.spare) < self.SPARE:
            self.spare.append(buffer)


class TokenBucket:
    """Rate limit for control frames a peer can make us answer (PING, SETTINGS)."""

    __slots__ = ("tokens", "burst", "rate", "stamp")

    def __init__(self, burst: float, rate: float):
        self.tokens = self.burst = burst
        self.rate = rate
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= 1
        return self.tokens >= 0


class Life(enum.IntEnum):
    """A connection's life. It only moves forward (:meth:`GrpcConnection._to`):

    OPEN -> DRAINING      our GOAWAY (server shutdown, --grpc-max-connection-age/-idle): new
                          calls are refused, the open ones finish, then it closes
    OPEN/DRAINING -> TERMINATED   the final GOAWAY (the engine's, or ours for a flood): the
                          calls are dropped, the rest of the input read and dropped
    any -> CLOSED         the GOAWAY is written and the socket half-closed, the transport
                          aborted (a protocol error, a keepalive ping unanswered), or lost
    """
    OPEN = 0
    DRAINING = 1
    TERMINATED = 2
    CLOSED = 3


OPEN, DRAINING, TERMINATED, CLOSED = Life


class GrpcConnection(CallRunner, asyncio.BufferedProtocol):
    """Its state is one :class:`Life`; besides it, ``paused`` (the transport's flow control:
    output waits in the engine) and ``flush_scheduled`` (the output of this loop iteration's
    answers is written once, at its end)."""

    def __init__(self, server: "NativeServer"):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.h2 = ngh2.Connection(ngh2.Role.SERVER, server.h2_config)
        self.transport: asyncio.Transport  # from connection_made on
        self.receive_view = server.receive_view  # shared: each read is consumed before the next
        self.read_size = len(self.receive_view)
        self.kept_input: memoryview | None = None  # this connection's own buffer, while it keeps input back
        self.kept = 0  # bytes kept back at its start: a frame the engine has not seen yet
        self.frame_size = 1  # the last kept DATA frame's size (header included)
        self.next_read = 0  # how much to read into it: to the end of a frame, if they keep their size
        # Input before the next frame header (the rest of one the engine has begun); NEVER
        # once a frame was cut with no buffer to keep it in: from then on none is kept.
        self.frame_rest = PREFACE
        self.calls: dict[int, Call] = {}
        self.life = OPEN
        self.paused = False
        self.flush_scheduled = False
        self.waiting_writers: set[Call] = set()
        self.pending_resets: list[int] = []
        self.control_frames = TokenBucket(*server.control_frame_limit)
        self.last_ping = float("-inf")  # the client's last PING, for the ping policy ...
        self.ping_strikes = 0  # ... both reset whenever we send response data
        self.last_read: float | None = None
        self.ping_timeout: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.age_timer: asyncio.TimerHandle | None = None
        self.unused_timer: asyncio.TimerHandle | None = None  # --grpc-max-connection-idle
        self.unused_since = 0.0  # when the connection last had no call
        self._dispatch: dict[type, Callable[[Any], None]] = {
            ngh2.RequestReceived: self._on_request,
            ngh2.DataReceived: self._on_data,
            ngh2.StreamReset: self._on_reset,
            ngh2.StreamClosed: self._on_stream_closed,
            ngh2.PingReceived: self._on_ping,
            ngh2.SettingsReceived: self._on_control_frame,
            ngh2.PingAcknowledged: self._on_ping_ack,
            ngh2.TrailersReceived: self._on_trailers,
            ngh2.ConnectionClosed: self._on_connection_closed,
        }

    # -- transport callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() != "h2":  # RFC 9113 §3.2: h2 over TLS needs ALPN
            log.warning("gRPC connection from %s refused: TLS without ALPN 'h2'", self._peer())
            self.life = CLOSED
            transport.close()
            return
        self.server.connections.add(self)
        self.h2.initiate_connection(self.server.settings)
        self.h2.set_local_window_size(self.server.connection_window)
        # A peer that never sends its preface (or anything) is dropped; keepalive
        # pings take over once it is talking.
        self.idle_timer = self.loop.call_later(self.server.handshake_timeout, self._handshake_check)
        if self.server.max_connection_idle is not None:
            self.unused_since = self.loop.time()
            self.unused_timer = self.loop.call_later(self.server.max_connection_idle, self._unused_check)
        if self.server.max_connection_age is not None:  # +-10% so connections do not all age at once
            age = self.server.max_connection_age * random.uniform(0.9, 1.1)
            self.age_timer = self.loop.call_later(age, self._aged)
        self.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        # The socket is read straight into the server's buffer (no bytes object per read);
        # the engine copies what it keeps before buffer_updated returns. Input kept back is
        # in the connection's own buffer, and the read goes right after it.
        kept_input = self.kept_input
        if kept_input is None:
            return self.receive_view
        return kept_input[self.kept:self.kept + self.next_read]

    def buffer_updated(self, nbytes: int) -> None:
        if self.life >= TERMINATED:  # lingering after GOAWAY: input is read and dropped
            return
        self.last_read = self.loop.time()
        kept_input = self.kept_input
        if kept_input is None:
            data, end = self.receive_view, nbytes
        else:
            data, end = kept_input, self.kept + nbytes
        # The engine gets all of it, except the start of a large DATA frame the read cut.
        cut = end
        pos = self.frame_rest  # where the first frame header is, if there is one
        if pos < end:
            cut = whole_frames_end(data, pos, end)
            self.frame_rest = 0
            if cut < end:
                cut = self._cut_frame(data, cut, end)
        else:
            self.frame_rest = pos - end
        # A read is at most the buffer (server.RECEIVE_BUFFER), small enough that a flood
        # of PINGs or SETTINGS in it meets our rate limit before the engine's own cap (what
        # is kept back is one frame's start).
        try:
            self.h2.receive_data(data[:cut])
        except ngh2.NGH2Error as e:  # fatal for the connection (a flood, a protocol violation)
            log.log(logging.WARNING if isinstance(e, ngh2.DenialOfServiceError) else logging.DEBUG,
                    "gRPC connection from %s dropped: %s", self._peer(), e)
            self._abort()
            return
        if kept_input is not None or cut < end:
            self._keep_input(data, cut, end, nbytes)
        self._process_events()
        # A read that brought only requests and their data leaves the engine nothing to
        # send (their answers schedule their own flush): flush only when it has output
        # (acknowledgements, window updates, resets) or bookkeeping to do.
        if self.h2.want_write or self.pending_resets or self.waiting_writers or self.life is not OPEN:
            self.flush()

    def _keep_input(self, data: memoryview, cut: int, end: int, nbytes: int) -> None:
        """After the engine got ``data[:cut]``: the rest goes to the start of the connection's
        own buffer; with nothing to keep, the buffer is given back once a read comes short."""
        if cut < end:
            kept_input = cast(memoryview, self.kept_input)  # _cut_frame took one
            kept_input[:end - cut] = data[cut:end]
            self.kept = end - cut
        elif nbytes < self.next_read:  # the socket had no more: the transfer has paused
            self._release_input()
        else:  # reads that end where frames end keep nothing back
            self.kept = 0
            self.next_read = max(self.read_size // self.frame_size, 1) * self.frame_size

    def _cut_frame(self, data: memoryview, cut: int, end: int) -> int:
        """Where the input for the engine ends, given a read ending inside the frame at
        ``cut``: there, keeping the frame back until the rest arrives, if it is a large
        DATA frame (or its header is cut short); else at ``end``. The engine hands a frame
        on as one bytes object when it gets it whole; a cut one it assembles with two or
        three more copies (bytes, bytearray, bytes again)."""
        if end - cut >= FRAME_HEADER:
            length = frame_length(data, cut)
            if data[cut + 3] != DATA_FRAME or not KEEP_FRAME_MIN <= length <= self.server.max_frame:
                self.frame_rest = cut + FRAME_HEADER + length - end  # the engine takes it in pieces
                return end
            # The next read ends where a frame does if the peer's frames keep this size.
            self.frame_size = size = FRAME_HEADER + length
            missing = cut + size - end
            self.next_read = missing + (self.read_size - missing) // size * size
        else:  # a frame header cut short
            self.next_read = self.read_size
        if self.kept_input is None:
            self.kept_input = self.server.receive_buffers.take()
            if self.kept_input is None:  # too many connections keep input back: stop keeping
                self.frame_rest = NEVER
                return end
        return cut

    def _release_input(self) -> None:
        if self.kept_input is not None:
            self.server.receive_buffers.give(self.kept_input)
            self.kept_input = None
        self.kept = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.life = CLOSED
        self._release_input()
        if self not in self.server.connections:  # refused in connection_made
            return
        self.server.connections.discard(self)
        for timer in (self.idle_timer, self.ping_timeout, self.age_timer, self.unused_timer):
            if timer is not None:
                timer.cancel()
        for call in list(self.calls.values()):
            self._drop(call)
        self.calls.clear()
        self.server.connection_done()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    # -- output ---------------------------------------------------------------------------
    def schedule_flush(self) -> None:
        """Coalesce the output of every call answered in this loop iteration."""
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.life is CLOSED:
            return
        h2, transport = self.h2, self.transport
        try:
            while True:
                while not self.paused:
                    out = h2.data_to_send(OUTPUT_PIECE)
                    if len(out) < OUTPUT_PIECE:  # the engine fills the piece while it has output
                        if out:
                            transport.write(out)  # all there is (a small answer): no list
                        break
                    pieces, size = [out], len(out)
                    while size < WRITE_CHUNK and len(out) == OUTPUT_PIECE:
                        out = h2.data_to_send(OUTPUT_PIECE)
                        if out:
                            pieces.append(out)
                            size += len(out)
                    transport.writelines(pieces)
                    if len(out) < OUTPUT_PIECE:
                        break
                if self.paused or not self.pending_resets or not self._send_resets():
                    break
        except ngh2.NGH2Error:
            self._abort()
            return
        self._process_events()
        if self.waiting_writers:
            for call in list(self.waiting_writers):
                if self.h2.queued_body_size(call.stream_id) < STREAM_SEND_HIGH // 2:
                    self._wake_writer(call)
        if self.life is not OPEN and not self.calls and not self.h2.want_write:
            # Not a bare close: the client's WINDOW_UPDATE or PING for the last answer may
            # be unread here, and closing over unread input resets the connection, which can
            # take that answer with it on the client's side.
            self._close_after_flush()

    def _send_resets(self) -> bool:
        """RST_STREAM the calls we have answered while the client still sends, once their
        answer is out: the engine sends a reset ahead of queued HEADERS and DATA."""
        h2, sent, waiting = self.h2, False, []
        for sid in self.pending_resets:
            try:
                if h2.queued_body_size(sid):
                    waiting.append(sid)
                    continue
                h2.reset_stream(sid, ngh2.ErrorCode.NO_ERROR)
                sent = True
            except ngh2.NGH2Error:
                pass
        self.pending_resets = waiting
        return sent

    def _to(self, life: Life) -> None:
        """The one way :class:`Life` moves: forward only."""
        if life > self.life:
            self.life = life

    def _abort(self) -> None:
        if self.life is not CLOSED:
            self.life = CLOSED
            self.transport.abort()

    def _process_events(self) -> None:
        dispatch = self._dispatch
        try:
            for event in self.h2.events():
                if self.life >= TERMINATED:
                    break
                handler = dispatch.get(type(event))
                if handler is not None:
                    handler(event)
        except Exception:  # a bug of ours must cost this connection, not the loop's callback
            log.exception("gRPC connection failed")
            self._abort()

    # -- streams ----------------------------------------------------------------------------
    def _on_request(self, event: ngh2.RequestReceived) -> None:
        sid = event.stream_id
        headers = dict(event.headers)  # one C loop; a repeated header's last value, as a scan gives
        get = headers.get  # each header is read where it is needed: most calls need few
        if get(b":method") != b"POST":
            self._http_error(sid, b"405")
            return
        # A request without content-type is served, as gRPC's C core serves it; another type is 415.
        if not get(b"content-type", b"application/grpc").startswith(b"application/grpc"):
            self._http_error(sid, b"415")
            return
        if (te := get(b"te")) != b"trailers":  # every gRPC client sends it; gRPC's C core refuses a call without
            self._bad_te(event, te is None)
            return
        if self.life is not OPEN:  # after our GOAWAY: not processed, safe for the client to retry
            try:
                self.h2.reset_stream(sid, ngh2.ErrorCode.REFUSED_STREAM)
            except ngh2.NGH2Error:
                pass
            return
        path = get(b":path", b"")
        target = self.server.methods.get(path)
        encoding = get(b"grpc-encoding")
        send_encoding = None
        if encoding == b"identity":
            encoding = None
        elif encoding is not None:
            accept = get(b"grpc-accept-encoding")
            if accept is not None and encoding in accept.replace(b" ", b"").split(b","):
                send_encoding = encoding  # answer in the encoding the client chose, if it takes it back
        # an unknown path still gets a call, to be answered UNIMPLEMENTED below
        rpc_method = target or Method(path.decode("utf-8", "replace"), _unimplemented)
        call = Call(sid, rpc_method, encoding or b"identity", send_encoding)
        self.calls[sid] = call
        if rpc_method.spans is not None and rpc_method.streaming:  # each request decides whether it is traced
            call.span = RequestSpan(get(b"traceparent"))
        elif rpc_method.spans is not None and rpc_method.spans.tracer.spans:
            call.span = RequestSpan(get(b"traceparent"))
            call.span.stamp("GRPC_WAITREAD_START")
        if event.end_stream:
            call.remote_closed = True
        if target is None:
            self._finish(call, UNIMPLEMENTED, f"unknown method {path.decode('utf-8', 'replace')}")
            return
        restrictions = self.server.restrictions
        if restrictions is not None:
            refusal = restrictions.refusal(target.group, lambda name: first_header(event.headers, name))
            if refusal is not None:
                self._finish(call, UNAVAILABLE, refusal)
                return
        if target.forwards_headers and self.server.header_forward is not None:
            try:
                call.forwarded = self.server.header_forward.parameters(call_metadata(event.headers), {})
            except TritonShmError as e:
                if target.streaming:  # each of its requests is answered the error, as in Triton
                    call.forwarded = e
                else:
                    self._finish(call, INVALID_ARGUMENT, e.message)
                    return
        if encoding is not None and not supported_encoding(encoding):
            self._finish(call, UNIMPLEMENTED, f"grpc-encoding {encoding.decode('latin-1')} is not supported")
            return
        if (timeout := get(b"grpc-timeout")) is not None:
            try:
                seconds = parse_timeout(timeout)
            except ValueError as e:
                self._finish(call, INTERNAL, str(e))
                return
            call.timer = self.loop.call_later(seconds, self._deadline, call)
        if target.streaming:
            call.reader = MessageReader(self.server.max_message_bytes, call.encoding)
            call.queue = Mailbox()
            if call.remote_closed:
                call.queue.put_nowait(None)
            call.task = asyncio.Task(self._run_stream(call), loop=self.loop, name=CALL_TASK)
        elif call.remote_closed:
            self._end_of_request(call)

    def _bad_te(self, event: ngh2.RequestReceived, missing: bool) -> None:
        """A call without ``te: trailers``, answered as gRPC's C core (and so Triton) answers:
        none at all is UNKNOWN "Missing :te header" (trailers-only); another value (which
        the engine let through: it compares case-insensitively) resets the stream."""
        sid = event.stream_id
        if not missing:
            try:
                self.h2.reset_stream(sid, ngh2.ErrorCode.PROTOCOL_ERROR)
            except ngh2.NGH2Error:
                pass
            self.schedule_flush()
            return
        call = Call(sid, Method("", _unimplemented), b"identity", None)
        call.remote_closed = event.end_stream
        self.calls[sid] = call
        self._finish(call, UNKNOWN, "Missing :te header")

    def _on_data(self, event: ngh2.DataReceived) -> None:
        sid, data = event.stream_id, event.data
        call = self.calls.get(sid)
        size = len(data)
        if call is None or call.finished:
            self._ack(sid, size)  # already answered: give the window back, drop the bytes
            return
        reader = call.reader
        if call.queue is None:
            self._ack(sid, size)  # unary: the reader holds it, bounded by the message limit
            messages = call.messages
            if (reader is None and size > 5 and data[0] == 0
                    and int.from_bytes(data[1:5], "big") == size - 5 <= self.server.max_message_bytes):
                # The common case, a payload that is exactly one uncompressed message, at a
                # message boundary (no reader yet: every payload so far was one): what
                # MessageReader.feed returns for it, without making the reader.
                messages.append(memoryview(data)[5:])
            else:
                if reader is None:
                    reader = call.reader = MessageReader(self.server.max_message_bytes, call.encoding)
                try:
                    messages += reader.feed(data)
                except GrpcError as e:
                    self._finish(call, e.code, e.message)
                    return
            if len(messages) > 1:
                self._finish(call, INTERNAL, "more than one request message on a unary call")
                return
        else:
            assert reader is not None  # a stream's reader is made with the call
            try:
                messages = reader.feed(data)
            except GrpcError as e:
                self._ack(sid, size)
                self._finish(call, e.code, e.message)
                return
            for m in messages:
                call.queue.put_nowait(m)
            if call.queue.qsize() < STREAM_QUEUE_DEPTH:
                self._ack(sid, size + call.deferred_ack)
                call.deferred_ack = 0
            else:  # the handler is behind: stop opening the window until it catches up
                call.deferred_ack += size
        if event.end_stream:
            call.remote_closed = True
            self._end_of_request(call)

    def _on_trailers(self, event: ngh2.TrailersReceived) -> None:
        call = self.calls.get(event.stream_id)
        if call is not None and not call.finished:
            call.remote_closed = True
            self._end_of_request(call)

    def _end_of_request(self, call: Call) -> None:
        if call.finished:
            return
        if call.reader is not None and call.reader.pending:
            self._finish(call, INTERNAL, "request ended inside a message (truncated gRPC message)")
        elif call.queue is not None:
            call.queue.put_nowait(None)
        elif len(call.messages) != 1:
            self._finish(call, INTERNAL, "unary call ended without a request message")
        else:
            call.task = asyncio.Task(self._run_unary(call) if call.span is None else self._run_traced(call, call.span),
                                     loop=self.loop, name=CALL_TASK)

    def _ack(self, sid: int, size: int) -> None:
        if size:
            try:
                self.h2.acknowledge_received_data(size, sid)
            except ngh2.NGH2Error:
                pass  # the stream is gone; the engine accounts the connection window itself

    def _on_reset(self, event: ngh2.StreamReset) -> None:
        call = self.calls.pop(event.stream_id, None)
        if call is not None:
            self._drop(call)
        if not self.calls:
            self.unused_since = self.loop.time()

    def _on_stream_closed(self, event: ngh2.StreamClosed) -> None:
        call = self.calls.pop(event.stream_id, None)
        if call is not None:
            self._drop(call)
        if not self.calls:
            self.unused_since = self.loop.time()
        if self.life is not OPEN and not self.calls:
            self.schedule_flush()

    def _drop(self, call: Call) -> None:
        """The stream is gone (reset, closed, disconnect): stop its work."""
        call.finished = True
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()  # cancels the request in the scheduler and the worker
        if call.writable is not None:  # only then is it among the waiting writers
            self._wake_writer(call)

    def _http_error(self, sid: int, status: bytes) -> None:
        """Not a gRPC request at all: a plain HTTP answer, as gRPC servers give."""
        try:
            self.h2.send_response(sid, ((b":status", status),), end_stream=True)
        except ngh2.NGH2Error:
            pass

    # -- connection-level -----------------------------------------------------------------------
    def _on_control_frame(self, event: Any) -> None:
        if not self.control_frames.take():
            self._goaway(ngh2.ErrorCode.ENHANCE_YOUR_CALM, b"too_many_control_frames")

    def _on_ping(self, event: ngh2.PingReceived) -> None:
        """gRPC's ping policy: a ping sooner than the allowed interval after the previous one,
        with no response data sent in between, is a strike; past max_ping_strikes, GOAWAY."""
        server, now = self.server, self.loop.time()
        idle = not self.calls
        interval = 7200.0 if idle and not server.pings_without_calls else server.min_ping_interval
        too_soon = self.last_ping + interval > now
        self.last_ping = now
        if too_soon:
            self.ping_strikes += 1
            if server.max_ping_strikes and self.ping_strikes > server.max_ping_strikes:
                self._goaway(ngh2.ErrorCode.ENHANCE_YOUR_CALM, b"too_many_pings")
                return
        self._on_control_frame(event)

    def _on_ping_ack(self, event: ngh2.PingAcknowledged) -> None:
        if self.ping_timeout is not None:
            self.ping_timeout.cancel()
            self.ping_timeout = None

    def _on_connection_closed(self, event: ngh2.ConnectionClosed | None) -> None:
        # The engine has queued its final GOAWAY: write it, then close.
        if event is not None and event.error_code:  # e.g. a rapid-reset peer past the reset rate
            log.warning("gRPC connection from %s closed by the HTTP/2 engine: %s %s", self._peer(),
                        ngh2.ErrorCode(event.error_code).name if event.error_code <= 0xD else event.error_code,
                        event.debug_data.decode("utf-8", "replace"))
        self._to(TERMINATED)
        for call in list(self.calls.values()):
            self._drop(call)
        self.calls.clear()
        self.loop.call_soon(self._close_after_flush)

    def _close_after_flush(self) -> None:
        """Write what is left (the GOAWAY), half-close, and read on for a moment before
        closing: closing with unread input makes the kernel send RST, and the peer may
        then never read the GOAWAY that says why."""
        if self.life is CLOSED:
            return
        self.life = CLOSED
        try:
            out = self.h2.data_to_send()
        except ngh2.NGH2Error:
            out = b""
        transport = self.transport
        if out:
            transport.write(out)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, transport.close)

    def _goaway(self, code: int, debug: bytes) -> None:
        """Stop the connection now: GOAWAY, then close once it is written."""
        if self.life >= TERMINATED:
            return
        try:
            self.h2.send_goaway(code, debug_data=debug)  # the debug text tells the client why
        except ngh2.NGH2Error:
            pass
        log.warning("gRPC connection from %s closed: %s", self._peer(), debug.decode())
        self._on_connection_closed(None)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def _handshake_check(self) -> None:
        if self.last_read is None:  # not even a preface: an idle or stuck client
            self._abort()
        elif self.life is not CLOSED:
            self.idle_timer = self.loop.call_later(self.server.keepalive_time, self._keepalive)

    def _keepalive(self) -> None:
        """Ping a connection that went quiet; drop it if the ping is not answered."""
        if self.life is CLOSED:
            return
        quiet = self.last_read is not None and self.loop.time() - self.last_read >= self.server.keepalive_time
        if quiet and self.ping_timeout is None:
            try:
                self.h2.ping()
            except ngh2.NGH2Error:
                self._abort()
                return
            self.ping_timeout = self.loop.call_later(self.server.keepalive_timeout, self._abort)
            self.flush()
        self.idle_timer = self.loop.call_later(self.server.keepalive_time, self._keepalive)

    def _unused_check(self) -> None:
        """--grpc-max-connection-idle: GOAWAY to a connection that had no call for that long."""
        self.unused_timer = None
        if self.life is not OPEN:
            return
        limit = self.server.max_connection_idle
        if limit is None:  # the timer runs only with --grpc-max-connection-idle
            return
        left = limit - (self.loop.time() - self.unused_since)
        if self.calls or left > 0:
            self.unused_timer = self.loop.call_later(left if not self.calls and left > 0 else limit,
                                                     self._unused_check)
            return
        log.info("gRPC connection from %s closed: no call for %g s", self._peer(), limit)
        self.begin_shutdown()

    def _aged(self) -> None:
        """--grpc-max-connection-age: GOAWAY; the open calls get the grace period, if any."""
        self.age_timer = None
        if self.life is not OPEN:
            return
        self.begin_shutdown()
        grace = self.server.max_connection_age_grace
        if grace is not None:
            self.age_timer = self.loop.call_later(grace, self.cancel_calls)

    def begin_shutdown(self) -> None:
        """GOAWAY: no new calls; the open ones finish, then the connection closes."""
        self._to(DRAINING)
        try:
            self.h2.send_goaway(ngh2.ErrorCode.NO_ERROR)
        except ngh2.NGH2Error:
            pass
        self.flush()

    def cancel_calls(self) -> None:
        for call in list(self.calls.values()):
            if not call.finished:
                if call.task is not None:
                    call.task.cancel()
                self._finish(call, UNAVAILABLE, "server is shutting down")
        self.flush()
        if self.life is not CLOSED:
            self.transport.close()


async def _unimplemented(_request: Any) -> None:
    raise GrpcError(UNIMPLEMENTED, "unknown method")
