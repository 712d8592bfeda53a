"""The worker process: hosts model instances and runs them on tensors in shared memory.

Started by the front-end as ``python -m triton_shm.worker --fd N --link A,B,C --name
NAME``; the inherited fds are its end of the socket, its two rings and the eventfd that
wakes the front-end (``ipc.link``). The main thread reads frames (``ipc.protocol``) from the ring; each model
instance has its own thread and queue, so a slow model never blocks another, and loads
run on a loader thread so inference continues meanwhile.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..backends import get_backend
from ..backends.base import Backend, InstanceSpec, ModelContext
from ..errors import Internal, InvalidArgument, NotFound, TritonShmError
from ..ipc import channel, protocol
from ..ipc.protocol import Op
from ..ipc.arena import Arena, Block, Segment, SegmentMap
from ..ipc.link import Link
from ..ipc.ring import RingCorrupt
from ..core.datatypes import config_to_wire
from ..backends.python import triton_python_backend_utils as pb_utils
from . import assembler
from .bls import BlsClient
from .execution import InstanceRunner
from .relief import Relief
from .assembler_py import RegionSpan
from .cuda import DeviceSpan
from .regions import RegionMap
from .tensors import Reshapes

log = logging.getLogger("triton_shm.worker")

OUTPUT_CHUNK = 64 << 20


class LoadedModel:
    def __init__(self, context: ModelContext, backend: Backend):
        self.context, self.backend = context, backend
        self.runners: list[InstanceRunner] = []
        self.output_types = {o["name"]: config_to_wire(o["data_type"]) for o in context.config.get("output", [])}
        # sequence batching's implicit state: outputs the front-end asks for beside the
        # client's, which a model may leave out (its state then stays as it was)
        states = (context.config.get("sequence_batching") or {}).get("state") or []
        self.state_outputs = {s["output_name"]: config_to_wire(s.get("data_type", "TYPE_INVALID")) for s in states
                              if s.get("output_name")}
        self.output_types.update(self.state_outputs)
        self.reshapes = Reshapes.from_config(context.config)
        # one model execution over the concatenated rows of a whole batch
        self.concat_batching = backend.concat_batching and int(context.config.get("max_batch_size", 0)) > 0
        self.decoupled = bool((context.config.get("model_transaction_policy") or {}).get("decoupled", False))
        if self.decoupled:
            self.concat_batching = False
        # inputs in a client's system shared memory are lent in place, not copied (a
        # decoupled model may read them after execute returns: it gets copies)
        self.inputs_in_place = backend.reads_inputs_in_place and not self.decoupled


def _context(msg: dict[str, Any]) -> ModelContext:
    return ModelContext(name=msg["model"], version=int(msg["version"]), model_dir=Path(msg["model_dir"]),
                        config=msg["config"])


# After its last frame, the control thread waits this long for the next one before it
# sleeps on its ring's futex (without the GIL): the front-end's next request is usually that
# close behind, and then it costs neither a wake-up nor a system call (``Link.wait`` spins
# only while that keeps being so: one request at a time, the spin is never won).
SPIN_NS = int(os.environ.get("TRITON_SHM_WORKER_SPIN_US", "50")) * 1000
RING_FULL_WAIT = 30.0  # s a sender waits for room in its ring before giving the front-end up


class Worker:
    def __init__(self, link: Link, name: str):
        self.link, self.name = link, name
        self._send_lock = threading.Lock()
        self.inputs = SegmentMap()
        self.regions = RegionMap()
        self.arena = Arena(OUTPUT_CHUNK, on_new_segment=self._share_segment, on_drop_segment=self._drop_segment)
        self.models: dict[str, LoadedModel] = {}
        self.bls = BlsClient(self)
        self.cancelled: set[tuple[int, int]] = set()  # (batch message id, request index) of gone clients
        self._released: deque[list | Block] = deque()  # memory of kept inputs collected since (keep_held)
        pb_utils._set_bls_client(self.bls)
        self.loader = ThreadPoolExecutor(max_workers=4, thread_name_prefix="loader")
        # reading the ring: see ``_run_inline``
        self._reader = threading.Lock()
        self._ending = threading.Lock()
        self._relief = Relief(self)
        self._watch = self._relief.watch  # .current: the inline execution running now (its number), or 0
        self.relief_reading = False

    # -- sending -------------------------------------------------------------------------
    def send_frame(self, frame: bytes | bytearray, fds: list[int] | None = None) -> None:
        """Waits while the ring is full: the front-end drains it unless it is gone."""
        with self._send_lock:
            deadline = None
            while True:
                try:
                    return self.link.send(frame, fds)
                except BlockingIOError:
                    now = time.monotonic()
                    deadline = deadline or now + RING_FULL_WAIT
                    if now > deadline:
                        raise BrokenPipeError("the front-end stopped reading") from None
                    time.sleep(50e-6)

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        """A control op of our own (segment, drop, bls, ...)."""
        self.send_frame(protocol.encode_control(0, message), fds)

    # -- inputs a model keeps ------------------------------------------------------------
    def keep_held(self, held: list[tuple[Any, list | Block]], scratch: list[Block] | None) -> None:
        """After a batch: the input arrays a model still holds (stored, or handed to a
        thread of a decoupled model) keep their memory until they die. A block of the
        front-end's arena stays out of its reuse (``keep_inputs``, sent before the reply,
        which would free it); a block of our own is taken out of ``scratch``. Each comes
        back once its array is collected (``_flush_released``)."""
        keep: list[list] = []
        for entry in held:
            if sys.getrefcount(entry[0]) <= 2:  # the tuple and the argument: nobody else holds it
                continue
            array, memory = entry
            if isinstance(memory, list):
                keep.append(memory)
            elif scratch is not None:
                scratch.remove(memory)
            weakref.finalize(array, self._released.append, memory)  # deque.append: safe from any thread
        if keep:
            self.send({"op": "keep_inputs", "blocks": keep})

    def _flush_released(self) -> None:
        """Give back the memory of kept inputs that have been collected since."""
        released = []
        while self._released:
            released.append(self._released.popleft())
        ours = [m for m in released if not isinstance(m, list)]
        if ours:
            self.arena.free_blocks(ours)
        if len(ours) < len(released):
            self.send({"op": "release_inputs", "blocks": [m for m in released if isinstance(m, list)]})

    def reply(self, msg_id: int, body: dict[str, Any]) -> None:
        """Answer message ``msg_id``: a batch's results, an error, or a control op's reply."""
        if self._released:
            self._flush_released()
        if "responses" in body:
            frame = protocol.encode_reply(msg_id, body["responses"], body["timing"])
        elif "error" in body:
            frame = protocol.encode_fail(msg_id, body["error"])
        else:
            frame = protocol.encode_control(msg_id, {"op": "reply", **body})
        self.send_frame(frame)

    def stream(self, body: dict[str, Any]) -> None:
        """One response of a decoupled request (``execution``'s ``stream`` body)."""
        response = body if ("outputs" in body or "error" in body) else None
        self.send_frame(protocol.encode_stream(body["id"], body["index"], body["final"], response))

    def view(self, desc: list) -> "memoryview | RegionSpan":
        """An input's bytes: ``[segment, offset, size]`` in the front-end's arena, or
        ``["r", region, offset, size]`` in a client region."""
        if desc and desc[0] == "r":
            _, rid, offset, size = desc
            view = self.regions.view(int(rid), int(offset), int(size))
            return view.to_host() if isinstance(view, DeviceSpan) else view  # CUDA: one device-to-host copy
        return self.inputs.view(desc)

    def input_bytes(self, desc: list, scratch: list[Block] | None, lent: list | None = None) -> memoryview:
        """What a model may read: arena bytes in place; a client region's bytes copied
        once, with a guarded copy, since the client may shrink its region at any time and
        a later read would fault. The copy goes into an output-arena block appended to
        ``scratch`` (pages already mapped; the caller frees it once the batch is answered),
        or, without ``scratch``, into memory of its own that lives as long as the model
        holds it (decoupled models answer after execute returns).

        With ``lent`` (a model that only reads its inputs), a system region's bytes are
        lent in place instead, read-only, and their mapping appended to ``lent``: the
        caller fails the request if a truncation poisoned it (``regions``)."""
        if not desc or desc[0] != "r":
            return self.inputs.view(desc)
        if lent is not None:
            loan = self.regions.lend(int(desc[1]), int(desc[2]), int(desc[3]))
            if loan is not None:
                lent.append(loan[1])
                return loan[0]
        view = self.regions.view(int(desc[1]), int(desc[2]), int(desc[3]))
        if isinstance(view, DeviceSpan):
            return view.to_host()  # already private memory
        if scratch is None:
            private = memoryview(bytearray(view.nbytes))
        else:
            block = self.arena.alloc(view.nbytes)
            scratch.append(block)
            private = block.view
        assembler.copy(private, view)
        return private

    def _share_segment(self, seg: Segment) -> None:
        self.send({"op": "segment", "seg": seg.id, "size": seg.size}, [seg.fd])

    def _drop_segment(self, seg_id: int) -> None:
        self.send({"op": "drop", "seg": seg_id})

    # -- control loop --------------------------------------------------------------------
    def run(self) -> int:
        """Serve frames until the front-end goes (0) or the link breaks (1, logged: a
        worker that leaves on its own must say why, not look like a clean stop)."""
        self._reader.acquire()
        self._relief.start()
        code = self._serve()
        assert code is not None  # only the relief reader's calls return None
        self._finish()
        return code

    def _serve(self, relieving: int = 0) -> int | None:
        """Read and dispatch frames until the link ends (the exit code). The relief reader
        passes the inline execution it stands in for and returns None once that ends."""
        link = self.link
        while not relieving or self._watch.current == relieving:
            try:
                got = link.recv()
                if got is None:
                    if not link.wait(SPIN_NS):
                        log.debug("the front-end has gone (end-of-file); stopping")
                        return 0
                    continue
            except ConnectionError as e:  # end-of-file where a frame's socket part was due
                log.debug("the front-end has gone (%s); stopping", e)
                return 0
            except (OSError, RingCorrupt) as e:
                log.error("worker '%s' stops: its link to the front-end broke: %s", self.name, e)
                return 1
            data, fds = got
            msg_id = 0
            try:
                msg = protocol.decode(data)
                msg_id = msg.id
                self._dispatch(msg, fds, not relieving)
            except TritonShmError as e:
                if isinstance(e, protocol.ProtocolError):
                    log.error("%s", e.message)
                    channel.close_fds(fds)
                    msg_id = e.msg_id or 0
                if msg_id:
                    self.reply(msg_id, {"error": e.to_wire()})
            except Exception as e:
                log.exception("message %d failed", msg_id)
                if msg_id:
                    self.reply(msg_id, {"error": Internal(f"worker error: {e}").to_wire()})
        return None

    def _dispatch(self, msg: "protocol.Message", fds: list[int], inline: bool = False) -> None:
        if msg.frees:  # freed output blocks ride along
            self.arena.free_records(msg.frees)
        op = msg.op
        if op == Op.INFER:
            body = msg.body
            model = self.models.get(body["model"])
            if model is None:
                raise NotFound(f"model '{body['model']}' is not loaded in worker '{self.name}'")
            idx = body["instance"]
            if not 0 <= idx < len(model.runners):
                raise InvalidArgument(f"no instance {idx} of model '{body['model']}'")
            body["id"] = msg.id
            runner = model.runners[idx]
            if inline and runner.solo and runner.dispatched == runner.finished:
                self._run_inline(runner, body)
            else:
                runner.submit(body)
        elif op == Op.PING:
            self.send_frame(protocol.encode_pong(msg.id))
        elif op == Op.CONTROL:
            body = msg.body
            body["id"] = msg.id
            self._control(body, fds)
        elif op != Op.FREE:
            raise InvalidArgument(f"op {op} is not one the front-end sends")

    # -- inline execution ------------------------------------------------------------------
    # The rule: the control thread runs a batch itself when its instance is the model's only
    # one (not decoupled, not on a GPU) and free (no batch of it queued or running). That
    # saves the hand-off to the instance thread (a wake-up and a context switch per batch).
    # Why it is safe: executions of one instance never overlap (``InstanceRunner.lock``) and
    # keep their order (an instance with a batch outstanding gets the next one queued behind
    # it); only the holder of ``_reader`` reads the ring, and the control thread lends it out
    # for the execution: to ``Relief`` when the execution runs long (other models, loads,
    # pings go on) or waits for a frame (BLS, ``need_reader``), and takes it back after.
    # Frames read by the relief are never run inline, so nothing nests or waits on itself.
    # The reader is taken back before the reply leaves: the reply is what lets the client send
    # its next request, and a relief still reading would take that one (and queue it).
    def _run_inline(self, runner: InstanceRunner, body: dict[str, Any]) -> None:
        watch = self._watch
        watch.begin()
        runner.dispatched += 1
        self._reader.release()
        try:
            try:
                result = runner.run(body)
            finally:
                watch.end()
                if self.relief_reading:  # it may sleep on the ring: wake it to hand back
                    self.link.kick()
                self._reader.acquire()
            self.reply(body["id"], result)
        except OSError as e:
            self.reply_failed(e)

    def reply_failed(self, e: OSError) -> None:
        """A reply could not be sent. With the front-end gone, the control loop finds the
        link's end and stops. Otherwise the ring to the front-end stayed full for
        RING_FULL_WAIT: the reply is lost and its requests would wait forever, so the worker
        leaves, and the front-end fails what it had in flight here (UNAVAILABLE) and starts
        a new one."""
        if self.link.peer_gone():
            return
        log.error("worker '%s' stops: a reply could not be sent to the front-end: %s", self.name, e)
        os._exit(1)

    def need_reader(self) -> None:
        """A model is about to wait for a frame (a BLS reply): make sure someone reads them."""
        seq = self._watch.current
        if seq and not self.relief_reading:
            self._relief.call(seq)

    def relieve(self, seq: int) -> None:
        """On the relief thread: read frames while inline execution ``seq`` runs."""
        if not self._reader.acquire(blocking=False):
            return
        try:
            # set before ``_serve`` reads ``current`` again; the control thread ends the execution
            # before it reads this: one of the two sees the other
            self.relief_reading = True
            code = self._serve(seq)
        except OSError:  # a send failed: the front-end has gone or the link broke
            code = 0 if self.link.peer_gone() else 1
        finally:
            self.relief_reading = False
            self._reader.release()
        if code is not None:  # the link ended while a model runs inline: leave as the control loop would
            self._finish()
            os._exit(code)

    def _finish(self) -> None:
        """Shut down once; whoever comes second waits (the first one ends the process)."""
        self._ending.acquire()
        self.shutdown()

    def _control(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg["op"]
        if op == "segment":
            if len(fds) != 1:
                raise Internal("segment message without exactly one fd")
            self.inputs.add(int(msg["seg"]), int(msg["size"]), fds[0])
        elif op == "drop":
            self.inputs.drop(int(msg["seg"]))
        elif op == "region":
            if len(fds) != 1:
                raise Internal("region message without exactly one fd")
            self.regions.add(int(msg["rid"]), int(msg["offset"]), int(msg["size"]), fds[0])
        elif op == "cuda_region":
            self.regions.add_cuda(int(msg["rid"]), bytes.fromhex(msg["handle"]), int(msg["device"]),
                                  int(msg["size"]))
            if msg["id"]:  # registration waits for the handle to open
                self.reply(msg["id"], {})
        elif op == "region_drop":
            self.regions.drop(int(msg["rid"]))
        elif op == "cancel":
            self.cancelled.add((int(msg["batch"]), int(msg["index"])))
        elif op == "bls_reply":
            self.bls.deliver(msg)
        elif op == "auto_complete":
            self.loader.submit(self._guarded, msg, self._auto_complete)
        elif op == "load":
            self.loader.submit(self._guarded, msg, self._load)
        elif op == "unload":
            self.loader.submit(self._guarded, msg, self._unload)
        else:
            raise InvalidArgument(f"unknown control message '{op}'")

    def _guarded(self, msg: dict[str, Any], fn) -> None:
        try:
            body = fn(msg)
        except TritonShmError as e:
            body = {"error": e.to_wire()}
        except Exception as e:  # noqa: BLE001 - user code in initialize/auto_complete
            log.error("%s of model '%s' failed:\n%s", msg["op"], msg.get("model"), traceback.format_exc())
            body = {"error": Internal(f"{type(e).__name__}: {e}").to_wire()}
        self.reply(msg["id"], body)

    def _auto_complete(self, msg: dict[str, Any]) -> dict[str, Any]:
        context = _context(msg)
        backend_cls = get_backend(context.config.get("backend", ""))
        return {"config": backend_cls.auto_complete(context)}

    def _load(self, msg: dict[str, Any]) -> dict[str, Any]:
        context = _context(msg)
        key = msg["key"]
        backend = get_backend(context.config.get("backend", ""))(context)
        model = LoadedModel(context, backend)
        try:
            for spec in msg["instances"]:
                inst = backend.create_instance(InstanceSpec(spec["name"], spec["kind"], int(spec["device_id"])))
                on_gpu = spec["kind"] == "KIND_GPU"
                model.runners.append(InstanceRunner(self, model, inst, spec["name"],
                                                    device_inputs=on_gpu and backend.takes_device_inputs))
            # the control thread may run it (see ``_run_inline``): a CUDA device is current per
            # thread, and a decoupled model's cancellations arrive while it runs
            only = model.runners[0] if len(model.runners) == 1 else None
            if only is not None and not model.decoupled and msg["instances"][0]["kind"] != "KIND_GPU":
                only.solo = True
        except BaseException:
            for runner in model.runners:
                runner.stop()
            raise
        old = self.models.pop(key, None)
        self.models[key] = model
        if old is not None:
            for runner in old.runners:
                runner.stop()
        return {}

    def _unload(self, msg: dict[str, Any]) -> dict[str, Any]:
        model = self.models.pop(msg["key"], None)
        if model is not None:
            for runner in model.runners:
                runner.stop()
        return {}

    def shutdown(self) -> None:
        self.bls.fail_all("the server is shutting down")
        for model in list(self.models.values()):
            for runner in model.runners:
                runner.stop()
        self.models.clear()
        self.loader.shutdown(wait=False, cancel_futures=True)
        self.inputs.close()
        self.regions.close()
        self.arena.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="triton_shm.worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--link", required=True, help="fds of the rings and the eventfd (ipc.link.Link.create)")
    parser.add_argument("--log-verbose", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.log_verbose else logging.INFO,
                        format=f"%(asctime)s {args.name} %(levelname).1s %(name)s] %(message)s", stream=sys.stderr)
    from ..backends.python import install_module_alias
    install_module_alias()
    link = Link.attach(socket.socket(fileno=args.fd), [int(fd) for fd in args.link.split(",")])
    worker = Worker(link, args.name)
    code = 1
    try:
        worker.send({"op": "hello", "pid": os.getpid(), "time": time.time()})
        code = worker.run()
    except (BrokenPipeError, ConnectionError) as e:
        if link.peer_gone():
            code = 0  # the front-end went away
        else:
            log.error("worker '%s' stops: %s", args.name, e)
    except BaseException:
        log.exception("worker '%s' stops on an unexpected error", args.name)
    os._exit(code)  # model threads may linger; nothing is left for them to answer
