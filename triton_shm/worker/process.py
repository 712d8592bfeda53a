"""The worker process: hosts model instances and runs them on tensors in shared memory.

Started by the front-end as ``python -m triton_shm.worker --fd N --link A,B,C --name
NAME``; the inherited fds are its end of the socket, its two rings and the eventfd that
wakes the front-end (``ipc.link``). The main thread reads frames (``ipc.protocol``) from the ring; each model
instance has its own thread and queue, so a slow model never blocks another, and loads
run on a loader thread so inference continues meanwhile.

This module is the top of the package: it owns the link, the control loop and dispatch,
and imports the rest (``memory``, ``execution``, ``bls``, ``relief``, ``host``), none of
which imports it.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from ..backends import get_backend
from ..backends.base import InstanceSpec, ModelContext
from ..errors import Internal, InvalidArgument, NotFound, TritonShmError
from ..ipc import channel, protocol
from ..ipc.protocol import ControlOp, Op
from ..ipc.link import Link
from ..ipc.ring import RingCorrupt
from ..backends.python import triton_python_backend_utils as pb_utils
from .bls import BlsClient
from .execution import InstanceRunner, LoadedModel
from .host import Host
from .memory import WorkerMemory
from .relief import Relief

log = logging.getLogger("triton_shm.worker")


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
    """The link to the front-end, the control loop that reads it and dispatches its frames,
    and the models. Memory is ``self.memory``'s; runners and the BLS client get that and
    ``self.host`` (what they may use of the worker), never the worker itself."""

    def __init__(self, link: Link, name: str):
        self.link, self.name = link, name
        self._send_lock = threading.Lock()
        self.cancelled: set[tuple[int, int]] = set()  # (batch message id, request index) of gone clients
        self.memory = WorkerMemory(self.send)
        # looked up once: every reply checks for kept inputs to give back, and frames carry frees
        self._released, self._flush_released = self.memory.released, self.memory.flush_released
        self._free_records = self.memory.arena.free_records
        self.host = Host(name=name, send=self.send, reply=self.reply, stream=self.stream,
                         reply_failed=self.reply_failed, need_reader=self.need_reader, cancelled=self.cancelled)
        self.models: dict[str, LoadedModel] = {}
        self.bls = BlsClient(self.memory, self.host)
        pb_utils._set_bls_client(self.bls)
        self.loader = ThreadPoolExecutor(max_workers=4, thread_name_prefix="loader")
        # reading the ring: see ``_run_inline``
        self._reader = threading.Lock()
        self._ending = threading.Lock()
        self._relief = Relief(self.relieve)
        self._watch = self._relief.watch  # .current: the inline execution running now (its number), or 0
        self.relief_reading = False
        # a thread per instance that defines is_ready(), made at its first check: a slow check
        # holds neither the ring nor executions nor another instance's checks
        self._readiness: dict[tuple[str, int], ThreadPoolExecutor] = {}
        self._controls = self._control_table()

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

    def reply(self, msg_id: int, body: dict[str, Any]) -> None:
        """Answer message ``msg_id``: a batch's results, an error, or a control op's reply."""
        if self._released:  # kept inputs collected since: their memory goes back first
            self._flush_released()
        if "responses" in body:
            frame = protocol.encode_reply(msg_id, body["responses"], body["timing"])
        elif "error" in body:
            frame = protocol.encode_fail(msg_id, body["error"])
        else:
            frame = protocol.encode_control(msg_id, {"op": ControlOp.REPLY, **body})
        self.send_frame(frame)

    def stream(self, body: dict[str, Any]) -> None:
        """One response of a decoupled request (``execution``'s ``stream`` body)."""
        response = body if ("outputs" in body or "error" in body) else None
        self.send_frame(protocol.encode_stream(body["id"], body["index"], body["final"], response))

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
            self._free_records(msg.frees)
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
                runner.enqueue(body)
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

    # -- control ops (``ControlOp``): one handler each, ``(msg, fds)``, from ``_controls`` --
    def _control(self, msg: dict[str, Any], fds: list[int]) -> None:
        handler = self._controls.get(msg["op"])
        if handler is None:
            raise InvalidArgument(f"unknown control message '{msg['op']}'")
        handler(msg, fds)

    def _control_table(self) -> dict[str, Callable[[dict[str, Any], list[int]], None]]:
        """The handler of each control op the front-end sends, by its wire name."""
        def loaded(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any], list[int]], None]:
            def handle(msg: dict[str, Any], fds: list[int]) -> None:
                self.loader.submit(self._guarded, msg, fn)  # slow: off the control thread
            return handle
        table: dict[ControlOp, Callable[[dict[str, Any], list[int]], None]] = {
            ControlOp.SEGMENT: self._segment,
            ControlOp.DROP: lambda msg, fds: self.memory.inputs.drop(int(msg["seg"])),
            ControlOp.REGION: self._region,
            ControlOp.CUDA_REGION: self._cuda_region,
            ControlOp.REGION_DROP: lambda msg, fds: self.memory.regions.drop(int(msg["rid"])),
            ControlOp.CANCEL: lambda msg, fds: self.cancelled.add((int(msg["batch"]), int(msg["index"]))),
            ControlOp.BLS_REPLY: lambda msg, fds: self.bls.deliver(msg),
            ControlOp.IS_READY: lambda msg, fds: self._is_ready(msg),
            ControlOp.AUTO_COMPLETE: loaded(self._auto_complete),
            ControlOp.LOAD: loaded(self._load),
            ControlOp.UNLOAD: loaded(self._unload),
        }
        return {op.value: handler for op, handler in table.items()}

    def _segment(self, msg: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != 1:
            raise Internal("segment message without exactly one fd")
        self.memory.inputs.add(int(msg["seg"]), int(msg["size"]), fds[0])

    def _region(self, msg: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != 1:
            raise Internal("region message without exactly one fd")
        self.memory.regions.add(int(msg["rid"]), int(msg["offset"]), int(msg["size"]), fds[0])

    def _cuda_region(self, msg: dict[str, Any], fds: list[int]) -> None:
        self.memory.regions.add_cuda(int(msg["rid"]), bytes.fromhex(msg["handle"]), int(msg["device"]),
                                     int(msg["size"]))
        if msg["id"]:  # registration waits for the handle to open
            self.reply(msg["id"], {})

    def _is_ready(self, msg: dict[str, Any]) -> None:
        """A model instance's own ``is_ready()``, answered from its readiness thread."""
        key, idx = msg["key"], int(msg["instance"])
        model = self.models.get(key)
        if model is None or not 0 <= idx < len(model.runners):
            raise NotFound(f"model '{key}' instance {idx} is not loaded in worker '{self.name}'")
        instance = model.runners[idx].instance
        if not getattr(instance, "has_is_ready", False):
            self.reply(msg["id"], {"ready": True, "message": ""})
            return
        pool = self._readiness.get((key, idx))
        if pool is None:
            pool = self._readiness[(key, idx)] = ThreadPoolExecutor(1, thread_name_prefix="readiness")

        def check() -> None:
            ready, why = instance.check_ready()  # type: ignore[attr-defined]
            try:
                self.reply(msg["id"], {"ready": ready, "message": why})
            except OSError as e:
                self.reply_failed(e)
        pool.submit(check)

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
                model.runners.append(InstanceRunner(model, inst, spec["name"], self.memory, self.host,
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
        # the instances whose readiness is the model's own (is_ready()): the front-end asks only them
        return {"readiness": [i for i, r in enumerate(model.runners) if getattr(r.instance, "has_is_ready", False)]}

    def _unload(self, msg: dict[str, Any]) -> dict[str, Any]:
        model = self.models.pop(msg["key"], None)
        if model is not None:
            for runner in model.runners:
                runner.stop()
            for i in range(len(model.runners)):
                pool = self._readiness.pop((msg["key"], i), None)
                if pool is not None:
                    pool.shutdown(wait=False)
        return {}

    def shutdown(self) -> None:
        self.bls.fail_all("the server is shutting down")
        for model in list(self.models.values()):
            for runner in model.runners:
                runner.stop()
        self.models.clear()
        self.loader.shutdown(wait=False, cancel_futures=True)
        self.memory.close()


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
        worker.send({"op": ControlOp.HELLO, "pid": os.getpid(), "time": time.time()})
        code = worker.run()
    except (BrokenPipeError, ConnectionError) as e:
        if link.peer_gone():
            code = 0  # the front-end went away
        else:
            log.error("worker '%s' stops: %s", args.name, e)
    except BaseException:
        log.exception("worker '%s' stops on an unexpected error", args.name)
    os._exit(code)  # model threads may linger; nothing is left for them to answer
