"""The links between the front-end processes of one server.

Process ``i`` listens on ``directory/frontend-{i}.sock`` (a Unix stream socket) and opens
one connection to each peer it talks to, lazily, reused by every request; a connection
that breaks fails what is pending on it and the next use reconnects (a restarted process
listens on the same path). Two kinds of traffic, as ``wire`` frames:

- control calls (``call``, ``broadcast``): an op and a JSON body, answered by the peer's
  handler for that op; a TritonShmError it raises comes back as the same class;
- forwarded inference (``forward``): a request for a model another process owns, served
  there by its ``InferenceService.infer_stream``; every response comes back in order, and a
  caller that goes away sends a ``cancel`` that cancels the serving task (the model sees
  ``is_cancelled()``).

The frames, their fields and kinds are ``wire``'s (the link's schema): to the owner
``call`` / ``infer`` / ``cancel``; back ``reply``, ``item`` (one of a request's responses)
and ``refused`` (the request failed before it ran). The requests in flight on a link are
an ``ipc.calls.Calls``, as on a worker's link: a waiter per request until its answer, and
a forwarded decoupled request's stream until its final response.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, cast

from ..core.data.types import Buffer, InferRequest, InferResponse, ResponseStream
from ..errors import Internal, InvalidArgument, TritonShmError, Unavailable, Unsupported
from ..ipc.calls import Calls
from .wire import (Field, FrameDecoder, FrameError, Item, Kind, call_frame, cancel_frame, encode_frame, error_frame,
                   frame_id, infer_frame, item_frame, read_call, read_infer, read_item, read_refused, read_reply,
                   reply_frame)

if TYPE_CHECKING:
    from ..core.observability.tracing import Handover
    from ..core.service import InferenceService

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
CONNECT_RETRY_S = 0.05  # between tries to reach a peer that is not listening yet


class Peers:
    """This process's end of the links to the ``count`` front-end processes (it is ``index``)."""

    def __init__(self, index: int, count: int, directory: str | os.PathLike, connect_timeout: float = 60.0):
        if not 0 <= index < count:
            raise ValueError(f"front-end process {index} of {count}")
        self.index, self.count = index, count
        self.directory = Path(directory)
        self.connect_timeout = connect_timeout
        self.handlers: dict[str, Handler] = {}
        self.service: InferenceService | None = None
        self._server: asyncio.AbstractServer | None = None
        self._listening: tuple[int, int] | None = None  # (device, inode) of our socket file
        self._links: dict[int, _Link] = {}  # connected, to the peers we call
        self._connecting: dict[int, asyncio.Future[_Link]] = {}
        self._served: set[_Served] = set()  # connections from the peers that call us
        self.on_lost: Callable[[int], None] | None = None  # told the peer whose link broke
        self._closed = False

    def path_of(self, i: int) -> Path:
        return self.directory / f"frontend-{i}.sock"

    async def start(self, handlers: dict[str, Handler], service: InferenceService | None = None) -> None:
        """Listen for the peers: control ops go to ``handlers[op]``, forwarded requests to
        ``service`` (refused UNAVAILABLE until it is set: a process serves them once it has
        loaded its models)."""
        self.handlers, self.service = handlers, service
        path = self.path_of(self.index)
        path.unlink(missing_ok=True)  # a previous run's (this process restarted)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(partial(_Served, self), str(path))
        st = path.stat()
        self._listening = (st.st_dev, st.st_ino)

    async def call(self, peer: int, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """``op`` run by ``peer``'s handler: its reply body, or its error raised here."""
        link = self._links.get(peer) or await self._connect(peer)
        return await link.call(op, body)

    async def broadcast(self, op: str, body: dict[str, Any], *, skip_unavailable: bool = False
                        ) -> list[dict[str, Any]]:
        """``op`` on every other process at once; once all have answered, the first error
        (in process order) is raised, else the replies in process order. ``skip_unavailable``:
        a process that can not be reached (or exits meanwhile) is logged and left out
        instead (it takes the server's state when it is back)."""
        others = [i for i in range(self.count) if i != self.index]
        results = await asyncio.gather(*(self.call(i, op, body) for i in others), return_exceptions=True)
        replies = []
        for peer, result in zip(others, results):
            if skip_unavailable and isinstance(result, Unavailable):
                log.warning("front-end process %d missed '%s': %s", peer, op, result.message)
            elif isinstance(result, BaseException):
                raise result
            else:
                replies.append(result)
        return replies

    def forward(self, peer: int, request: InferRequest, stream: ResponseStream | None = None,
                on_done: Callable[[], None] | None = None, handover: Handover | None = None
                ) -> Awaitable[InferResponse | None]:
        """Have ``peer`` serve ``request``: resolves to its response, or with ``stream`` (a
        decoupled model) to None once its first response is on ``stream.queue``; raises
        what refused it. ``on_done`` is called once the request is over, however it ends
        (the last response, an error, a cancel, a lost peer). ``handover``: the request was
        sampled for tracing here; ``peer`` records its trace."""
        link = self._links.get(peer)
        if link is not None:
            return link.forward(request, stream, on_done, handover)
        return self._forward_once_connected(peer, request, stream, on_done, handover)

    async def _forward_once_connected(self, peer: int, request: InferRequest, stream: ResponseStream | None,
                                      on_done: Callable[[], None] | None, handover: Handover | None
                                      ) -> InferResponse | None:
        try:
            link = await self._connect(peer)
        except BaseException:
            if on_done is not None:
                on_done()
            raise
        return await link.forward(request, stream, on_done, handover)

    async def _connect(self, peer: int) -> _Link:
        if self._closed:
            raise Unavailable("the front-end process is shutting down")
        if not 0 <= peer < self.count or peer == self.index:
            raise ValueError(f"front-end process {peer} is not a peer of process {self.index} (of {self.count})")
        connecting = self._connecting.get(peer)
        if connecting is None:  # one attempt per peer, whoever waits for it
            connecting = asyncio.ensure_future(self._open(peer))
            self._connecting[peer] = connecting
            connecting.add_done_callback(partial(self._connected, peer))
        return await asyncio.shield(connecting)

    async def _open(self, peer: int) -> _Link:
        loop = asyncio.get_running_loop()
        path = str(self.path_of(peer))
        deadline = time.monotonic() + self.connect_timeout
        while True:  # peers start in parallel: its socket may not be there yet
            try:
                _, link = await loop.create_unix_connection(partial(_Link, self, peer), path)
                break
            except OSError as e:
                if self._closed or time.monotonic() >= deadline:
                    raise Unavailable(f"front-end process {peer} is not reachable") from e
                await asyncio.sleep(CONNECT_RETRY_S)
        if self._closed:
            link.transport.close()
            raise Unavailable("the front-end process is shutting down")
        self._links[peer] = link
        return link

    def _connected(self, peer: int, attempt: asyncio.Future) -> None:
        self._connecting.pop(peer, None)
        if not attempt.cancelled():
            attempt.exception()  # its waiters have it; none may be left to read it

    def _lost(self, link: _Link) -> None:
        if self._links.get(link.peer) is link:
            del self._links[link.peer]
        if self.on_lost is not None:
            self.on_lost(link.peer)

    async def close(self) -> None:
        """Stop listening, close every link; what is pending on them fails UNAVAILABLE."""
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._unlink_own_socket()
        for link in list(self._links.values()):
            link.fail(f"front-end process {link.peer} is unreachable: this process is shutting down")
            link.transport.close()
        self._links.clear()
        tasks: list[asyncio.Task] = []
        for served in list(self._served):
            tasks.extend(served.tasks.values())
            served.transport.close()
            served.stop()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _unlink_own_socket(self) -> None:
        """Remove our socket file, unless a restarted process already listens on that path."""
        path = self.path_of(self.index)
        with contextlib.suppress(OSError):
            st = path.stat()
            if (st.st_dev, st.st_ino) == self._listening:
                path.unlink()


class _Waiter(asyncio.Future):
    """The answer to a request sent on a link, while it is pending there. A caller that
    cancels it (its task was cancelled) withdraws the request: the owner is told to cancel
    it. A future of its own rather than a done-callback per request: no extra callback
    scheduled when the answer comes."""

    def __init__(self, link: _Link, rid: int, stream: ResponseStream | None, on_done: Callable[[], None] | None):
        super().__init__(loop=link.loop)
        self.link, self.rid, self.stream, self.on_done = link, rid, stream, on_done

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        cancelled = super().cancel(msg)
        self.link.withdraw(self.rid)
        return cancelled

    def fail(self, error: TritonShmError) -> None:
        if not self.done():
            self.set_exception(error)
        elif self.stream is not None:  # responses came already: the stream ends with the error
            self.stream.queue.put_nowait((error, True))
        self.finish()

    def finish(self) -> None:
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()


class _Link(asyncio.Protocol):
    """Our connection to a peer: we send calls and requests, it answers."""

    def __init__(self, peers: Peers, peer: int):
        self.peers, self.peer = peers, peer
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connection_made
        self.decoder = FrameDecoder()
        # a waiter per request until its answer; a decoupled one's also until its final item
        self.calls: Calls[_Waiter, _Waiter] = Calls()
        self.lost = False
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _request(self, rid: int, header: dict[str, Any], buffers: list[Buffer] | tuple = (),
                 stream: ResponseStream | None = None, on_done: Callable[[], None] | None = None) -> _Waiter:
        """Send request ``rid``'s frame; the waiter of its answer."""
        if self.lost:  # seen lost between the lookup and here: no frame would be answered
            if on_done is not None:
                on_done()
            raise Unavailable(f"front-end process {self.peer} exited")
        try:
            frame = encode_frame(header, buffers)
        except (TypeError, FrameError) as e:  # a value JSON can not carry, a frame beyond the limits
            if on_done is not None:
                on_done()
            if isinstance(e, FrameError) and header[Field.KIND] == Kind.INFER:  # a client's request too big
                raise InvalidArgument(f"the request is too large to pass to front-end process {self.peer}, "
                                      f"which serves its model: {e}") from None
            raise Internal(f"a request to front-end process {self.peer} can not be encoded: {e}") from None
        waiter = _Waiter(self, rid, stream, on_done)
        self.calls.open(rid, waiter, waiter if stream is not None else None)
        self.transport.writelines(frame)
        return waiter

    async def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        rid = self.calls.next_id()
        return await self._request(rid, call_frame(rid, op, body))

    def forward(self, request: InferRequest, stream: ResponseStream | None,
                on_done: Callable[[], None] | None, handover: Handover | None = None) -> _Waiter:
        rid = self.calls.next_id()
        header, buffers = infer_frame(rid, request, handover)
        waiter = self._request(rid, header, buffers, stream, on_done)
        if stream is not None:
            stream.cancel = partial(self.withdraw, rid)
        return waiter

    def withdraw(self, rid: int) -> None:
        """The caller went away: the owner cancels the request; what it still sends is dropped."""
        waiter, streaming = self.calls.withdraw(rid)
        waiter = waiter or streaming
        if waiter is None:
            return
        if not self.lost:
            self.transport.writelines(encode_frame(cancel_frame(rid)))
        if not waiter.done():
            asyncio.Future.cancel(waiter)  # not its own cancel(): that withdraws
        waiter.finish()

    def data_received(self, data: bytes) -> None:
        try:
            for header, buffers in self.decoder.feed(data):
                self._answer(header, buffers)
        except FrameError as e:
            log.error("front-end process %d sent a bad frame, closing its link: %s", self.peer, e)
            self.fail(f"front-end process {self.peer} broke the peer protocol: {e}")
            self.transport.close()

    def _answer(self, header: dict[str, Any], buffers: list[Buffer]) -> None:
        kind, rid = header.get(Field.KIND), frame_id(header)
        calls = self.calls
        if not calls.is_open(rid):
            return  # withdrawn: its answers are dropped
        if kind == Kind.ITEM:
            item, final = read_item(header, buffers)
            streaming = calls.streams.get(rid)
            if streaming is None:  # one response: the answer
                waiter = calls.take(rid)
                assert waiter is not None
                if isinstance(item, TritonShmError):
                    waiter.set_exception(item)
                else:
                    waiter.set_result(item)
                waiter.finish()
                return
            assert streaming.stream is not None
            streaming.stream.queue.put_nowait((item, final))
            first = calls.take(rid)  # the first item answers the request; the rest follow on its stream
            if first is not None and not first.done():
                first.set_result(None)
            if final:
                calls.end_stream(rid)
                streaming.finish()
        elif kind == Kind.REPLY:  # checked before it leaves ``calls``: a bad frame fails it with the rest
            body = read_reply(header)
            waiter = calls.take(rid)
            if waiter is None:
                raise FrameError(f"a reply to request {rid}, which is not a call")
            if isinstance(body, TritonShmError):
                waiter.set_exception(body)
            else:
                waiter.set_result(body)
        elif kind == Kind.REFUSED:
            error = read_refused(header)
            waiter, streaming = calls.withdraw(rid)
            (waiter or streaming).fail(error)  # type: ignore[union-attr]  # one is: the request is open
        else:
            raise FrameError(f"unknown frame kind {kind!r} from the owner")

    def fail(self, reason: str) -> None:
        self.lost = True
        self.peers._lost(self)
        replies, streams = self.calls.drop()
        for rid in sorted(replies.keys() | streams.keys()):  # in the order they were sent
            (replies.get(rid) or streams[rid]).fail(Unavailable(reason))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost:
            cause = f": {exc}" if exc is not None else ""
            self.fail(f"front-end process {self.peer} exited or closed its link{cause}")


class _Served(asyncio.Protocol):
    """A peer's connection to us: it sends calls and requests, we answer."""

    def __init__(self, peers: Peers):
        self.peers = peers
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connection_made
        self.decoder = FrameDecoder()
        self.tasks: dict[int, asyncio.Task] = {}  # by request id: what serves it
        self.calls: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peers._served.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop()

    def stop(self) -> None:
        """The caller is gone: what it asked for is cancelled."""
        self.peers._served.discard(self)
        for task in (*self.tasks.values(), *self.calls):
            task.cancel()

    def _send(self, header: dict[str, Any], buffers: list[Buffer] | tuple = ()) -> None:
        if not self.transport.is_closing():
            self.transport.writelines(encode_frame(header, buffers))

    def data_received(self, data: bytes) -> None:
        try:
            for header, buffers in self.decoder.feed(data):
                self._take(header, buffers)
        except FrameError as e:
            log.error("a front-end process sent a bad frame, closing its link: %s", e)
            self.transport.close()

    def _take(self, header: dict[str, Any], buffers: list[Buffer]) -> None:
        kind, rid = header.get(Field.KIND), frame_id(header)
        if kind == Kind.INFER:
            if rid in self.tasks:
                raise FrameError(f"request id {rid} is in use")
            request, handover = read_infer(header, buffers)
            self.tasks[rid] = asyncio.ensure_future(self._serve(rid, request, handover))
        elif kind == Kind.CANCEL:
            task = self.tasks.pop(rid, None)  # here: a task cancelled before it starts runs no finally
            if task is not None:
                task.cancel()
        elif kind == Kind.CALL:
            op, body = read_call(header)
            task = asyncio.ensure_future(self._call(rid, op, body))
            self.calls.add(task)
            task.add_done_callback(self.calls.discard)
        else:
            raise FrameError(f"unknown frame kind {kind!r} from a peer")

    async def _call(self, rid: int, op: str, body: dict[str, Any]) -> None:
        handler = self.peers.handlers.get(op)
        try:
            if handler is None:
                raise Unsupported(f"unknown peer operation '{op}'")
            reply = await handler(body)
            if not isinstance(reply, dict):
                raise TypeError(f"the handler answered a {type(reply).__name__}, not a dict")
            self._send(reply_frame(rid, reply))
        except asyncio.CancelledError:
            return  # the caller is gone
        except Exception as e:  # noqa: BLE001 - the caller gets it (as INTERNAL unless it is ours)
            if not isinstance(e, TritonShmError):
                log.exception("peer operation '%s' failed", op)
            self._send(error_frame(Kind.REPLY, rid, e))

    async def _serve(self, rid: int, request: InferRequest, handover: Handover | None) -> None:
        """Run a forwarded request (traced here if the sender sampled it: ``handover``); send
        each response, or what refused it."""
        service = self.peers.service
        started = False
        try:
            if service is None:
                raise Unavailable("the front-end process is not serving yet")
            # closed here whatever happens (its finally tells the model when we stop early)
            items = cast("AsyncGenerator[tuple[InferResponse | None, bool], None]",
                         service.infer_stream(request, parent=handover, sample=False))
            async with contextlib.aclosing(items):
                async for item, final in items:
                    started = True
                    self._send_item(rid, item, final)
        except asyncio.CancelledError:
            return  # the caller cancelled it, or went away
        except Exception as e:  # noqa: BLE001 - every failure is the caller's answer
            if not isinstance(e, TritonShmError):
                log.exception("forwarded request for model '%s' failed", request.model_name)
            self._send(error_frame(Kind.ITEM if started else Kind.REFUSED, rid, e))
        finally:
            self.tasks.pop(rid, None)

    def _send_item(self, rid: int, item: Item, final: bool) -> None:
        self._send(*item_frame(rid, item, final))
