"""The front-end's handle on one worker process: start it, talk to it over its control
link (rings and socket), share memory with it, and notice at once when it dies.

Each handle owns the input arena the front-end writes request tensors into and maps the
worker's output arena; what the two lend each other past one message is ``lending``'s.
Frames are ``ipc.protocol``'s, checked by its decoder. Requests in flight are an
``ipc.calls.Calls``: a reply goes to the callback registered for its message id, called at
once from the ring's reader (no event-loop hop: the scheduler hands the freed instance its
next batch there); a reply that breaks the protocol fails that message with INTERNAL.
STREAM frames go to the handler registered for their batch (decoupled models); ``bls``
control ops go to the pool's BLS handler.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import Internal, InvalidArgument, TritonShmError, Unavailable
from ..ipc import channel, protocol
from ..ipc.protocol import ControlOp, Op
from ..ipc.arena import Arena, Segment, SegmentMap
from ..ipc.calls import Calls
from ..ipc.link import Link
from ..ipc.ring import RingCorrupt
from ..devices import worker_environment
from .lending import BatchedFrees, InputLending

if TYPE_CHECKING:
    from ..core.data.shm_registry import Region

log = logging.getLogger("triton_shm.workers")

INPUT_CHUNK = 64 << 20
DRAIN_BATCH = 256  # frames read from a worker's ring before the event loop gets a turn
ORPHAN_RECHECK_S = 0.001  # a socket message waiting for its ring record is looked at again after this
ORPHAN_LIMIT_S = 5.0  # ... and past this, the worker is taken to misuse the socket
_REPLY = Op.REPLY  # the decoder's ops are these members: compared by identity


class WorkerHandle:
    def __init__(self, name: str, gpu: int | None, log_verbose: int = 0, what: str | None = None,
                 sees_all_gpus: bool = False):
        self.name, self.gpu, self.log_verbose = name, gpu, log_verbose
        # A shared GPU worker sees only its device (CUDA ordinal 0: its backends open one
        # context, on it). A Python model's instance process sees the server's devices, as
        # Triton's stub does, so ``model_instance_device_id`` names a real device there.
        self.masked = gpu is not None and not sees_all_gpus
        self.what = what or f"worker '{name}'"  # how errors name it: a worker, or the model instance it runs
        self.proc: subprocess.Popen | None = None
        self.link: Link | None = None
        self._orphan_since: float | None = None  # since when a socket message waits for its ring record
        self._broke_protocol = False
        self.arena: Arena | None = None
        self.outputs = SegmentMap()
        # message id -> what gets its reply: the reply's body, or an exception (error reply,
        # worker death); decoupled batches: message id -> handler of their STREAM frames
        # (None = worker died)
        self.calls: Calls[Callable[[Any], None], Callable[[dict[str, Any] | None], None]] = Calls()
        self.next_id = self.calls.next_id  # a message id, for a batch the pool sends with ``request``
        self.frees = BatchedFrees(self._send_frame)  # output blocks given back
        self.lending = InputLending(name)  # input blocks lent past their batch
        self.alive = False
        self.regions: set[int] = set()  # client regions whose fd this worker holds
        self.generation = 0
        self.on_death: Callable[[WorkerHandle], None] | None = None  # set by the pool
        # a model's BLS call: (handle, message), set by the pool
        self.on_bls: Callable[[WorkerHandle, dict[str, Any]], None] | None = None
        self._control_handlers = self._control_table()
        self._loop: asyncio.AbstractEventLoop  # the front-end's, from start() on

    # -- process lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        link, theirs, link_fds = Link.create()
        env = worker_environment(os.environ, self.gpu if self.masked else None)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "triton_shm.worker", "--fd", str(theirs.fileno()), "--name", self.name,
                 "--link", ",".join(map(str, link_fds)), "--log-verbose", str(self.log_verbose)],
                pass_fds=[theirs.fileno(), *link_fds], env=env,
                start_new_session=True)  # terminal signals go to the front-end, which stops workers itself
        finally:
            theirs.close()
            channel.close_fds(link_fds)
        self.link = link
        self._orphan_since = None
        self._broke_protocol = False
        self.outputs = SegmentMap()
        self.arena = Arena(INPUT_CHUNK, on_new_segment=self._share_segment, on_drop_segment=self._drop_segment)
        self.regions = set()  # client regions whose fd this worker holds
        self.generation += 1
        self.alive = True
        self.frees.start(self._loop)
        self._loop.add_reader(link.rx_wake, self._on_readable)
        self._loop.add_reader(link.sock.fileno(), self._on_socket)
        log.info("started worker '%s' (pid %d)", self.name, self.proc.pid)

    def _share_segment(self, seg: Segment) -> None:
        self.send({"op": "segment", "seg": seg.id, "size": seg.size}, [seg.fd])

    def _drop_segment(self, seg_id: int) -> None:
        self.send({"op": "drop", "seg": seg_id})

    def share_region(self, region: "Region") -> None:
        """Pass a client region's fd (a CUDA region's IPC handle) to the worker the first
        time a request uses it."""
        if region.id not in self.regions:
            if region.kind == "cuda":
                self.send(self.cuda_region_message(region))
            else:
                self.send({"op": "region", "rid": region.id, "offset": region.offset, "size": region.byte_size},
                          [region.fd])
            self.regions.add(region.id)

    def cuda_ordinal(self, device_id: int) -> int:
        """The CUDA ordinal of GPU ``device_id`` inside this worker: a shared GPU worker sees
        only its own device (ordinal 0); the CPU worker and instance processes see the
        server's devices."""
        if not self.masked:
            return device_id
        if device_id != self.gpu:
            raise InvalidArgument(f"CUDA shared memory on GPU {device_id} cannot be used by a model instance "
                                  f"on GPU {self.gpu}")
        return 0

    def cuda_region_message(self, region: "Region") -> dict[str, Any]:
        return {"op": "cuda_region", "rid": region.id, "handle": region.raw_handle.hex(),
                "device": self.cuda_ordinal(region.device_id), "size": region.byte_size}

    async def open_cuda_region(self, region: "Region") -> None:
        """Open a CUDA region's IPC handle in this worker now (registration), so that a bad
        handle is the client's error at once."""
        await self.call(self.cuda_region_message(region))
        self.regions.add(region.id)

    def drop_region(self, region: "Region") -> None:
        if region.id in self.regions:
            self.regions.discard(region.id)
            try:
                self.send({"op": "region_drop", "rid": region.id})
            except Unavailable:
                pass

    async def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        self.alive = False
        self.frees.close()
        self._detach()
        proc = self.proc
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        self._cleanup_memory()

    def _detach(self) -> None:
        if self.link is not None:
            for fd in (self.link.rx_wake, self.link.sock.fileno()):
                try:
                    self._loop.remove_reader(fd)
                except (ValueError, OSError):
                    pass
            self.link.close()  # the worker sees end-of-file and exits
            self.link = None

    def _cleanup_memory(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        self.outputs.close()

    def _died(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._detach()
        code = self.proc.poll() if self.proc else None
        if code is None and self.proc is not None:
            try:
                code = self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        if self._broke_protocol:
            how = "broke the worker protocol and was stopped"
        log.error("worker '%s' %s; restarting it", self.name, how)
        error = Unavailable(f"{self.what} {how} while running the request; it is being restarted")
        # the pool hears of it first: the instances here leave their schedulers before the
        # failed batches give them back, so no queued request is sent to a dead worker
        if self.on_death is not None:
            self.on_death(self)
        self.frees.close()
        replies, streams = self.calls.drop()
        for on_reply in replies.values():
            _deliver(on_reply, error)
        for handler in streams.values():
            handler(None)
        self.lending.clear()
        self._cleanup_memory()

    # -- messaging -----------------------------------------------------------------------
    def _send_frame(self, frame: bytes | bytearray, fds: list[int] | None = None) -> None:
        if self.link is None:
            raise Unavailable(f"worker '{self.name}' is not running")
        try:
            self.link.send(frame, fds)
        except (BlockingIOError, BrokenPipeError, ConnectionError) as e:
            raise self._send_error(e) from None

    def _send_error(self, e: OSError) -> Unavailable:
        """What a send that failed with ``e`` raises."""
        if isinstance(e, BlockingIOError):
            # The worker is not draining its ring; treat as overload rather than block the loop.
            return Unavailable(f"worker '{self.name}' is not keeping up (its ring is full)")
        return Unavailable(f"worker '{self.name}' is not running")

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        """A control op that gets no reply (freed output blocks ride on it)."""
        if self.link is None:
            raise Unavailable(f"worker '{self.name}' is not running")
        self._send_frame(protocol.encode_control(0, message, self.frees.take()), fds)


    def request(self, encode: Callable[..., bytes | bytearray], args: tuple,
                on_reply: Callable[[Any], None], fds: list[int] | None = None,
                on_stream: Callable[[dict[str, Any] | None], None] | None = None,
                msg_id: int | None = None) -> int:
        """Send ``encode(msg_id, *args, frees)`` (a ``protocol`` encoder; the frees that
        wait ride along) and return its id. ``on_reply`` gets the reply's body, or an
        exception: the worker's FAIL, a reply that breaks the protocol (INTERNAL), or
        UNAVAILABLE if the worker dies first. It is called synchronously from the ring
        reader. ``on_stream`` receives the STREAM frames that carry this id (decoupled
        responses), until ``end_stream``."""
        link = self.link
        if link is None:
            raise Unavailable(f"worker '{self.name}' is not running")
        calls = self.calls
        if msg_id is None:
            msg_id = calls.next_id()
        # frees.take, calls.open and _send_frame, written out: every request passes here
        frees = self.frees
        releases = frees.waiting
        if releases:  # else the empty list serves again (the encoders only read it)
            frees.waiting, frees.bytes = [], 0
        calls.replies[msg_id] = on_reply
        if on_stream is not None:
            calls.streams[msg_id] = on_stream
        try:
            link.send(encode(msg_id, *args, releases), fds)
        except BaseException as e:
            calls.withdraw(msg_id)
            if isinstance(e, (BlockingIOError, BrokenPipeError, ConnectionError)):
                raise self._send_error(e) from None
            raise
        return msg_id

    def end_stream(self, msg_id: int) -> None:
        self.calls.end_stream(msg_id)

    async def call(self, message: dict[str, Any] | None, fds: list[int] | None = None) -> Any:
        """Send a control op (or a PING for None) and wait for the reply; a FAIL is raised."""
        fut = self._loop.create_future()

        def on_reply(reply: Any) -> None:
            if fut.done():
                return
            if isinstance(reply, Exception):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

        if message is None:
            msg_id = self.request(protocol.encode_ping, (), on_reply, fds)
        else:
            msg_id = self.request(protocol.encode_control, (message,), on_reply, fds)
        try:
            return await fut
        finally:
            self.calls.withdraw(msg_id)  # cancelled: nobody waits for the reply any more

    def _on_readable(self) -> None:
        """The worker's ring has frames: drain it, then tell the worker we sleep (it
        writes our eventfd only after that)."""
        link = self.link
        if link is None:
            return
        link.clear_wake()
        replies = self.calls.replies
        for _ in range(DRAIN_BATCH):
            if self.link is not link:
                return
            try:
                got = link.recv()
            except RingCorrupt as e:  # nothing in it can be trusted or attributed any more
                self._bad_frame(protocol.ProtocolError(e.message))
                self._died()
                return
            except (ConnectionError, OSError, ValueError):
                self._died()
                return
            if got is None:
                if link.rx.prepare_sleep():
                    return
                continue
            data, fds = got
            try:
                msg = protocol.decode(data)
            except protocol.ProtocolError as e:
                channel.close_fds(fds)
                self._bad_frame(e)
                continue
            if msg.op is _REPLY and not fds:
                # _dispatch and _deliver for a reply (the decoder's body is a tuple), written
                # out: one per request
                on_reply = replies.pop(msg.id, None)
                if on_reply is not None:
                    try:
                        on_reply(msg.body)
                    except Exception:
                        log.exception("handling a worker reply failed")
                continue
            if fds and msg.op != Op.CONTROL:
                channel.close_fds(fds)
                fds = []
            self._dispatch(msg, fds)
        # Still awake (no wake-up will come): let the loop serve others, then drain on.
        self._loop.call_soon(self._on_readable)

    def _on_socket(self) -> None:
        """The socket is readable: a frame whose record is in the ring (drain it), or the
        worker's end-of-file."""
        self._on_readable()
        link = self.link
        if link is None:
            return
        state = link.socket_state()
        if state == "eof" or (self.proc is not None and self.proc.poll() is not None):
            # A worker that died between its socket send and its ring record leaves the
            # socket readable before its end-of-file: its exit is the end too.
            self._died()
            return
        if state == "empty":
            self._orphan_since = None
            return
        # A socket message whose ring record has not come yet (the worker sends the socket
        # part first). It is usually on its way: look again shortly instead of spinning on
        # the readable socket, which would starve the worker of the CPU it needs to send it.
        now = time.monotonic()
        if self._orphan_since is None:
            self._orphan_since = now
        elif now - self._orphan_since > ORPHAN_LIMIT_S:
            self._orphan_since = None
            self._bad_frame(protocol.ProtocolError("socket message without its ring record"))
            return
        self._loop.remove_reader(link.sock.fileno())
        self._loop.call_later(ORPHAN_RECHECK_S, self._watch_socket, link)

    def _watch_socket(self, link: Link) -> None:
        if self.link is link and self.alive:
            self._loop.add_reader(link.sock.fileno(), self._on_socket)

    def _dispatch(self, msg: "protocol.Message", fds: list[int]) -> None:
        op = msg.op
        if op == Op.REPLY or op == Op.PONG or (op == Op.CONTROL and msg.id):
            on_reply = self.calls.take(msg.id)
            if on_reply is not None:
                _deliver(on_reply, msg.body if msg.body is not None else {})
            if fds:
                channel.close_fds(fds)
        elif op == Op.FAIL:
            on_reply = self.calls.take(msg.id)
            if on_reply is not None:
                _deliver(on_reply, TritonShmError.from_wire(msg.body["error"]))
        elif op == Op.STREAM:
            handler = self.calls.streams.get(msg.id)
            if handler is not None:
                handler(msg.body)
        elif op == Op.CONTROL:
            self._control(msg.body, fds)
        else:
            self._bad_frame(protocol.ProtocolError(f"op {op} is not one a worker sends", msg.id))

    def _control(self, body: dict[str, Any], fds: list[int]) -> None:
        """A worker's CONTROL op (``ControlOp``: what each says), by its handler."""
        op = body["op"]
        try:
            handler = self._control_handlers.get(op)
            if handler is None:
                log.warning("unexpected message from worker '%s': %s", self.name, op)
            else:
                handler(body, fds)
        except (KeyError, TypeError, ValueError, TritonShmError) as e:
            log.warning("malformed '%s' message from worker '%s': %s", op, self.name, e)
        finally:
            channel.close_fds(fds)

    def _control_table(self) -> dict[str, Callable[[dict[str, Any], list[int]], None]]:
        """The ops a worker sends the front-end on its own, each with its handler."""
        def segment(body: dict[str, Any], fds: list[int]) -> None:
            if len(fds) != 1:
                raise ValueError("a segment comes with one fd")
            self.outputs.add(int(body["seg"]), int(body["size"]), fds.pop())

        def bls(body: dict[str, Any], fds: list[int]) -> None:
            if self.on_bls is not None:
                self.on_bls(self, body)

        return {
            ControlOp.HELLO: lambda body, fds: None,
            ControlOp.SEGMENT: segment,
            ControlOp.DROP: lambda body, fds: self.outputs.drop(int(body["seg"])),
            ControlOp.BLS: bls,
            ControlOp.BLS_CANCEL: bls,
            ControlOp.RELEASE_INPUTS: lambda body, fds: self.lending.released(self.arena, body.get("blocks") or []),
            ControlOp.KEEP_INPUTS: lambda body, fds: self.lending.keep(body.get("blocks") or []),
        }

    def _bad_frame(self, e: "protocol.ProtocolError") -> None:
        """A frame that breaks the protocol fails the message it answers. One whose
        header is illegible answers nothing we can name: the worker is not to be
        trusted any more, so it is killed, and its death fails every request it holds."""
        log.error("worker '%s': %s", self.name, e.message)
        if e.msg_id is not None:
            on_reply = self.calls.take(e.msg_id)
            if on_reply is not None:
                _deliver(on_reply, Internal(f"worker '{self.name}' sent a malformed reply: {e.message}"))
        elif self.proc is not None and self.proc.poll() is None:
            self._broke_protocol = True
            self.proc.kill()

    def cancel(self, msg_id: int, index: int) -> None:
        """The client of request ``index`` of batch ``msg_id`` is gone: the worker is told
        while the batch is still there (not answered, or a decoupled one still streaming)."""
        if not self.calls.is_open(msg_id):
            return
        try:
            self.send({"op": "cancel", "batch": msg_id, "index": index})
        except TritonShmError:
            pass  # the worker is gone too

    def stage(self, data) -> list[int]:
        """Copy bytes into this worker's input arena for it to read (a BLS reply); the
        worker hands the block back with ``release_inputs``."""
        if self.arena is None:
            raise Unavailable(f"worker '{self.name}' is not running")
        return self.lending.stage(self.arena, data)


def _deliver(on_reply: Callable[[dict[str, Any] | Exception], None], reply: dict[str, Any] | Exception) -> None:
    """A reply callback's failure is a bug to log, never a reason to stop reading the ring."""
    try:
        on_reply(reply)
    except Exception:
        log.exception("handling a worker reply failed")
