"""The front-end's pool of workers: placing model instances, running batches on them,
and supervision.

One :class:`~.handle.WorkerHandle` per worker process. The shared workers run for the
server's life: one for the CPU and one per GPU, hosting every instance of the models
whose backends release the GIL (ONNX Runtime, TensorRT, PyTorch) as threads. Each
instance of a Python model gets a process of its own instead (its own GIL: ``count: N``
uses N cores, as Triton's stubs do), started at load and stopped at unload; a model may
opt back into the shared worker with ``PROCESS_PER_INSTANCE: "no"``. A worker that dies
is seen at once (end-of-file on its socket): its in-flight requests fail with
UNAVAILABLE, the pool reports it down, restarts it with backoff and reports it back; the
model manager owns what that means for model states and reloads.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Sequence

from ..core.data import codec
from ..core.data.datatypes import element_size
from ..core.models.config import config_to_json, mc
from ..core.observability.histogram import FirstResponse
from ..core.scheduling.request_future import RequestFuture
from ..core.data.types import BatchRequest, InferResponse, OutputTensor
from ..errors import Internal, InvalidArgument, TritonShmError, Unavailable
from ..ipc import protocol
from ..ipc.arena import Arena, Block
from ..ipc.protocol import PLACE_ARENA, PLACE_REGION, RegionDesc
from .handle import WorkerHandle
from .readiness import Readiness

if TYPE_CHECKING:
    from ..core.models.version import ModelVersion
    from ..core.data.shm_registry import Region

log = logging.getLogger("triton_shm.workers")

RESTART_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0)

# A Python model's parameter: "no" runs its instances as threads of the shared worker
# (one process's memory for all of them, one GIL between them).
PROCESS_PER_INSTANCE = "PROCESS_PER_INSTANCE"


def instance_kind(group) -> str:
    return mc.ModelInstanceGroup.Kind.Name(group.kind)


def process_per_instance(config: "mc.ModelConfig") -> bool:
    """Whether each instance of the model runs in a process of its own: a Python model's
    do (the GIL), unless its config says otherwise; the other backends run their
    instances as threads of the shared workers, as they release the GIL in the model."""
    if config.backend != "python":
        return False
    param = config.parameters.get(PROCESS_PER_INSTANCE)
    return param is None or param.string_value.strip().lower() not in ("no", "false", "0", "off")


def runs_in_own_process(config: "mc.ModelConfig", kind: str) -> bool:
    """Whether an instance of ``kind`` runs in a process of its own. A Python model's
    ``KIND_GPU`` instance always does, whatever PROCESS_PER_INSTANCE says: its process sees
    the server's GPUs, so Triton's idiom ``torch.device(f"cuda:{args['model_instance_device_id']}")``
    names its device; in the shared worker of its GPU, which sees that GPU alone as
    ``cuda:0``, any id but 0 would fail."""
    if config.backend != "python":
        return False
    return kind == "KIND_GPU" or process_per_instance(config)


class WorkerPool:
    def __init__(self, gpus: list[int], log_verbose: int = 0):
        self.cpu = WorkerHandle("cpu", None, log_verbose)
        self.gpu_workers = {g: WorkerHandle(f"gpu{g}", g, log_verbose) for g in gpus}
        self.log_verbose = log_verbose
        # the shared workers, for the server's life
        self.shared: dict[str, WorkerHandle] = {w.name: w for w in [self.cpu, *self.gpu_workers.values()]}
        # every running worker: the shared ones and the instance processes of loaded models
        self.workers: dict[str, WorkerHandle] = dict(self.shared)
        self._placements: dict[str, list["ModelVersion"]] = {name: [] for name in self.workers}
        self._restarts: dict[str, int] = {name: 0 for name in self.workers}
        self._closing = False
        # serves a model's BLS call: async (worker, message) -> None, set by the service
        self.bls_handler: Callable[[WorkerHandle, dict[str, Any]], Coroutine[Any, Any, None]] | None = None
        self._bls_tasks: set[asyncio.Task] = set()
        # what the owner of model state hears: "worker down" (name), then "worker back" (name)
        # once its process runs again (it then loads the models placed there)
        self.on_worker_down: Callable[[str], None] | None = None
        self.on_worker_back: Callable[[str], Awaitable[None]] | None = None
        self.readiness = Readiness()  # the instances whose models define is_ready()

    async def start(self) -> None:
        for w in self.shared.values():
            self._supervise(w)
            w.start()

    def _supervise(self, w: WorkerHandle) -> None:
        w.on_death = self._on_death
        w.on_bls = self._on_bls

    def _on_bls(self, worker: WorkerHandle, msg: dict[str, Any]) -> None:
        if self.bls_handler is not None:
            task = asyncio.get_running_loop().create_task(self.bls_handler(worker, msg))
            self._bls_tasks.add(task)
            task.add_done_callback(self._bls_tasks.discard)

    def all_alive(self) -> bool:
        """The shared workers run (an instance process counts for its model's readiness)."""
        return all(w.alive for w in self.shared.values())

    def begin_shutdown(self) -> None:
        """From now on a worker that exits is not restarted."""
        self._closing = True

    async def stop(self, timeout: float = 10.0) -> None:
        """Close every link; a worker still running after ``timeout`` s is killed."""
        self._closing = True
        await asyncio.gather(*(w.stop(timeout) for w in list(self.workers.values())))

    # -- supervision ---------------------------------------------------------------------
    def _on_death(self, worker: WorkerHandle) -> None:
        if self._closing:
            return
        if self.on_worker_down is not None:
            self.on_worker_down(worker.name)
        asyncio.get_running_loop().create_task(self._restart(worker))

    async def _restart(self, worker: WorkerHandle) -> None:
        """Back-off grows with deaths in a row; it starts over once a restarted worker has
        loaded again everything placed on it (a worker that dies while loading keeps growing it)."""
        n = self._restarts[worker.name]
        self._restarts[worker.name] = n + 1
        delay = RESTART_BACKOFF[min(n, len(RESTART_BACKOFF) - 1)]
        log.info("restarting worker '%s' in %.1f s (restart %d in a row)", worker.name, delay, n + 1)
        await asyncio.sleep(delay)
        if self._closing or self.workers.get(worker.name) is not worker:  # its model was unloaded meanwhile
            return
        worker.start()
        if self.on_worker_back is not None:
            await self.on_worker_back(worker.name)
        if worker.alive:
            self._restarts[worker.name] = 0

    async def model_ready(self, mv: "ModelVersion") -> bool:
        """Whether the instances of ``mv`` here whose model defines ``is_ready()`` say they
        are ready (True at once when none does)."""
        return await self.readiness.ready(mv, self.workers)

    def placed_on(self, worker: str) -> list["ModelVersion"]:
        """The model versions with instances in ``worker``."""
        return list(self._placements.get(worker, ()))

    def instances_on(self, worker: str, mv: "ModelVersion") -> list[tuple[str, int]]:
        """The instances of ``mv`` that ``worker`` hosts."""
        return [i for i in mv.instances if i[0] == worker]

    def is_instance_process(self, worker: str) -> bool:
        return worker in self.workers and worker not in self.shared

    def hosts_alive(self, mv: "ModelVersion") -> bool:
        """Every worker that hosts an instance of ``mv`` is running."""
        return all(w in self.workers and self.workers[w].alive for w, _ in mv.instances)

    def any_host_alive(self, mv: "ModelVersion") -> bool:
        """Some worker that hosts an instance of ``mv`` is running."""
        return any(w in self.workers and self.workers[w].alive for w, _ in mv.instances)

    # -- model lifecycle -----------------------------------------------------------------
    @staticmethod
    def _model_message(op: str, mv: "ModelVersion", config: dict[str, Any]) -> dict[str, Any]:
        return {"op": op, "key": mv.key, "model": mv.name, "version": mv.version, "model_dir": str(mv.model_dir),
                "config": config}

    async def auto_complete(self, mv: "ModelVersion", config: dict[str, Any]) -> dict[str, Any]:
        worker = self.cpu
        if config.get("backend") == "tensorrt":  # reading a plan needs a GPU: the first GPU worker's
            if not self.gpu_workers:
                raise InvalidArgument(f"model '{mv.name}' is a TensorRT plan, which needs a GPU; this server "
                                      "runs none")
            worker = next(iter(self.gpu_workers.values()))
        reply = await worker.call(self._model_message("auto_complete", mv, config))
        return reply["config"]

    def placements(self, mv: "ModelVersion") -> list[tuple[tuple[str, int], Any, int | None]]:
        """Every instance of ``mv`` as it will be placed: its (worker name, index in that
        worker), its instance group and its GPU (None for a CPU instance)."""
        return [((worker, index), group, device) for worker, specs in self._instances_by_worker(mv, True).items()
                for index, (_, group, device) in enumerate(specs)]

    def _instances_by_worker(self, mv: "ModelVersion", with_groups: bool = False) -> dict[str, list[Any]]:
        """Each worker's instances of ``mv``: an instance process hosts one, named after
        it and the load (``<instance>@<model>/<version>#<generation>``: a reload's new
        processes start beside the old ones); a shared worker hosts them all."""
        by_worker: dict[str, list[Any]] = {}
        mine, processes = mv.instance_slice  # several front-end processes: this one's share
        ordinal = -1
        for group in mv.config.instance_group:
            kind = instance_kind(group)
            own = runs_in_own_process(mv.config, kind)
            devices = list(group.gpus) if kind == "KIND_GPU" else [None]
            for device in devices:
                for i in range(group.count):
                    ordinal += 1
                    if ordinal % processes != mine:
                        continue
                    suffix = f"_{device}" if device is not None else ""
                    spec = {"name": f"{group.name}_{i}{suffix}", "kind": kind,
                            "device_id": device if device is not None else 0}
                    if own:
                        worker = f"{spec['name']}@{mv.key}"
                    else:
                        worker = self.cpu.name if device is None else self.gpu_workers[device].name
                    by_worker.setdefault(worker, []).append((spec, group, device) if with_groups else spec)
        return by_worker

    async def load_on(self, worker: str, mv: "ModelVersion") -> None:
        """Load ``mv``'s instances that belong in ``worker``."""
        specs = self._instances_by_worker(mv)[worker]
        msg = self._model_message("load", mv, config_to_json(mv.config))
        msg["instances"] = specs
        self.readiness.loaded(mv.key, worker, await self.workers[worker].call(msg))

    async def load(self, mv: "ModelVersion") -> None:
        by_worker = self._instances_by_worker(mv, with_groups=True)
        started = [self._start_instance_process(name, specs[0][0], specs[0][2])
                   for name, specs in by_worker.items() if name not in self.shared]
        results = await asyncio.gather(*(self.load_on(w, mv) for w in by_worker), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:  # every instance loads, or none stays
            self.readiness.forget(mv.key)
            loaded = [w for w, r in zip(by_worker, results) if not isinstance(r, BaseException)]
            await asyncio.gather(*(self._unload_from(w, mv) for w in loaded),
                                 *(self._stop_instance_process(h) for h in started if h.name not in loaded),
                                 return_exceptions=True)
            raise failed
        mv.instances = [(w, i) for w, specs in by_worker.items() for i in range(len(specs))]
        for w in by_worker:
            self._placements.setdefault(w, []).append(mv)

    def _start_instance_process(self, name: str, spec: dict[str, Any], device: int | None) -> WorkerHandle:
        """A process of its own for one model instance (on GPU ``device``, seeing the
        server's GPUs). Started with fork and exec (``subprocess``), never a bare fork: the
        front-end has threads."""
        worker = WorkerHandle(name, device, self.log_verbose, what=f"model instance '{spec['name']}'",
                              sees_all_gpus=True)
        self._supervise(worker)
        self.workers[name] = worker
        self._restarts[name] = 0
        worker.start()
        return worker

    async def _stop_instance_process(self, worker: WorkerHandle) -> None:
        if self.workers.get(worker.name) is worker:
            del self.workers[worker.name]
            self._restarts.pop(worker.name, None)
            self._placements.pop(worker.name, None)
        await worker.stop()

    async def unload(self, mv: "ModelVersion") -> None:
        """``mv``'s instances are finalized in every worker at once; its instance
        processes then stop."""
        self.readiness.forget(mv.key)
        await asyncio.gather(*(self._unload_from(w, mv) for w in {w for w, _ in mv.instances}))

    async def _unload_from(self, w: str, mv: "ModelVersion") -> None:
        placed = self._placements.get(w)
        if placed and mv in placed:
            placed.remove(mv)
        worker = self.workers.get(w)
        if worker is None:
            return
        try:
            if worker.alive:
                await worker.call({"op": "unload", "key": mv.key})
        finally:
            if w not in self.shared:
                await self._stop_instance_process(worker)

    async def open_cuda_region(self, region: "Region") -> None:
        """A CUDA region being registered: the worker of its GPU opens the IPC handle."""
        worker = self.gpu_workers.get(region.device_id)
        if worker is None or not worker.alive:
            raise Unavailable(f"the worker of GPU {region.device_id} is not running")
        await worker.open_cuda_region(region)

    def drop_region(self, region: "Region") -> None:
        """A client region is gone for good: workers unmap it."""
        for worker in self.workers.values():
            worker.drop_region(region)

    async def ping(self, worker: str = "cpu") -> None:
        await self.workers[worker].call(None)

    # -- inference -----------------------------------------------------------------------
    def start_batch(self, mv: "ModelVersion", instance: tuple[str, int], batch: Sequence[BatchRequest],
                    done: Callable[[list[InferResponse | Exception | None], tuple[int, int, int] | None], None]
                    ) -> None:
        """Send a batch of validated requests to one instance: one control message there
        and back. When the reply arrives, ``done`` gets one response or error per request
        and the worker's (compute_input, compute_infer, compute_output) nanoseconds, or
        None for the timing if the batch never ran (worker error or death). ``done`` is
        called synchronously from the ring reader, so it must not block. Raises if the
        batch cannot be sent."""
        worker_name, index = instance
        worker = self.workers[worker_name]
        arena = worker.arena
        if not worker.alive or arena is None:
            raise Unavailable(f"model '{mv.name}' is not available: {worker.what} is restarting")
        msg_id = worker.next_id()
        on_stream = self._stream_handler(worker, mv, batch, msg_id) if mv.decoupled else None
        blocks: list[Block] = []
        # what reads the reply: a partial, fewer objects than a closure (no cells)
        on_reply = functools.partial(self._on_reply, worker, arena, blocks, mv, batch, done, on_stream)
        try:
            if len(batch) == 1:  # most batches: a list display, no appends
                requests = [self._request_record(worker, arena, batch[0], blocks)]
            else:
                requests = []
                for p in batch:  # a loop, not a comprehension: no frame of its own (before 3.12's PEP 709)
                    requests.append(self._request_record(worker, arena, p, blocks))
            if on_stream is None:
                i = 0
                for p in batch:  # a caller that goes away tells the worker (RequestFuture.cancel)
                    future = getattr(p, "future", None)  # a queued request's; a sequence's filler has none
                    if type(future) is RequestFuture:
                        future.held_by = (worker, msg_id, i)
                    i += 1
                worker.request(protocol.encode_infer, (mv.key, index, requests), on_reply, msg_id=msg_id)
                return
            for i, p in enumerate(batch):
                if p.stream is not None:
                    p.stream.cancel = functools.partial(worker.cancel, msg_id, i)
            worker.request(protocol.encode_infer, (mv.key, index, requests), on_reply, on_stream=on_stream,
                           msg_id=msg_id)
        except BaseException:
            if worker.arena is arena:
                arena.free_blocks(blocks)
            raise

    def _on_reply(self, worker: WorkerHandle, arena: Arena, blocks: list[Block], mv: "ModelVersion",
                  batch: Sequence[BatchRequest], done: Callable[[list[InferResponse | Exception | None],
                                                                 tuple[int, int, int] | None], None],
                  on_stream: Callable[[dict[str, Any] | None], None] | None,
                  reply: tuple[list[tuple[protocol.Status, Any]], tuple[int, int, int]] | Exception) -> None:
        """A batch's reply (or the exception that ends it): its input blocks are freed,
        then ``done`` gets each request's result."""
        if worker.arena is arena:  # a restarted worker has a new arena; the old one is gone
            lending = worker.lending
            arena.free_blocks(lending.kept_out(blocks) if lending.keeping else blocks)
        if isinstance(reply, Exception):
            done([reply] * len(batch), None)
            return
        try:
            # a REPLY's body, laid out and checked by the decoder: (responses, timing), a
            # (status, payload) per response and three ints
            responses, timing = reply
            if len(responses) != len(batch):
                raise Internal(f"worker '{worker.name}' answered a batch of {len(batch)} with a malformed reply")
            results: list[InferResponse | Exception | None] = []
            i = 0
            for status, payload in responses:  # a loop, not zip or enumerate: no objects of their own
                if status is _ERROR or status is _ANSWERED:
                    error = TritonShmError.from_wire(payload)
                    if status is _ANSWERED:  # the model's own answer: counted a success, as Triton does
                        error.answered = True  # type: ignore[attr-defined]
                    if on_stream is not None:  # the request ends here: its stream gets the error
                        on_stream({"index": i, "error": payload, "final": True})
                    results.append(error)
                elif on_stream is not None:
                    results.append(None)  # executed; its responses arrive on its stream
                elif status is not _OK and status is not _PARAMS:  # DECOUPLED from a model that is not
                    results.append(Internal(f"worker '{worker.name}' sent a malformed response: 'outputs'"))
                else:
                    try:
                        if status is _PARAMS:
                            outputs, parameters = payload
                            results.append(self._response(worker, mv, batch[i], outputs, True, parameters))
                        else:
                            results.append(self._response(worker, mv, batch[i], payload, True))
                    except Exception as e:  # noqa: BLE001 - the worker is not trusted: a malformed entry fails its request
                        results.append(e if isinstance(e, TritonShmError)
                                       else Internal(f"worker '{worker.name}' sent a malformed response: {e}"))
                i += 1
        except TritonShmError as e:
            results, timing = [e] * len(batch), None
        except Exception as e:  # a fault of ours reading the reply: the batch fails, nothing waits
            log.exception("reading worker '%s's reply failed", worker.name)
            error = Internal(f"reading worker '{worker.name}'s reply failed: {type(e).__name__}: {e}")
            results, timing = [error] * len(batch), None
        done(results, timing)

    def _stream_handler(self, worker: WorkerHandle, mv: "ModelVersion", batch: Sequence[BatchRequest],
                        msg_id: int) -> Callable[[dict[str, Any] | None], None]:
        """Routes a decoupled batch's responses to each request's stream queue, until
        every request has had its final response; then the batch's stream (``msg_id``) ends."""
        open_requests = set(range(len(batch)))
        queues: list[Any] = []
        first = mv.stats.first_response if mv.stats is not None else None  # latency histograms on
        for p in batch:
            if p.stream is None:
                raise Internal(f"model '{mv.name}' is decoupled but a request of its batch has no stream")
            if first is not None and p.stream.opened_ns:  # (a sequence's null request has no client)
                queues.append(FirstResponse(p.stream.queue, first, p.stream.opened_ns))
            else:
                queues.append(p.stream.queue)

        def handle(msg: dict[str, Any] | None) -> None:
            if msg is None:  # the worker died
                for i in sorted(open_requests):
                    queues[i].put_nowait(
                        (Unavailable(f"{worker.what} exited while model '{mv.name}' was responding"), True))
                open_requests.clear()
                return
            index = msg.get("index")
            if not isinstance(index, int) or index not in open_requests:
                return  # unknown index or already final: a worker is not trusted
            final = bool(msg.get("final"))
            if "error" in msg:
                item: InferResponse | Exception | None = TritonShmError.from_wire(msg["error"])
            elif "outputs" in msg:
                try:
                    item = self._response(worker, mv, batch[index], msg["outputs"], False, msg.get("parameters"))
                except TritonShmError as e:
                    item = e
            else:
                item = None
            queues[index].put_nowait((item, final))
            if final:  # an error response does not end the request: only the final flag does
                open_requests.discard(index)
            if not open_requests:
                worker.end_stream(msg_id)

        return handle

    def _request_record(self, worker: WorkerHandle, arena: Arena, p: BatchRequest, blocks: list[Block]) -> tuple:
        """One request of an INFER frame: in-band inputs copied once into the worker's
        arena, client shared-memory tensors named in place."""
        plan, request = p.plan, p.request
        shm_inputs, shm_outputs = plan.shm_inputs, plan.shm_outputs
        inputs = []
        for inp in request.inputs:
            ref = shm_inputs.get(inp.name) if shm_inputs else None
            if ref is not None:  # read in place by the worker: no copy here
                region = self._client_region(worker, p.regions[ref.region])
                inputs.append((inp.name, inp.datatype, inp.shape, PLACE_REGION, region.id, ref.offset, ref.byte_size))
                continue
            data = inp.data
            if data is None:  # validation found its data or its region
                raise Internal(f"input '{inp.name}' has neither data nor a shared-memory region")
            block = arena.put(data)  # the one copy of an in-band tensor
            blocks.append(block)
            inputs.append((inp.name, inp.datatype, inp.shape, PLACE_ARENA, block.segment.id, block.offset, block.size))
        names = plan.outputs if not plan.state_outputs else [*plan.outputs, *plan.state_outputs]
        if shm_outputs:
            outputs: list = []
            for name in names:
                ref = shm_outputs.get(name)
                if ref is None:
                    outputs.append(name)  # into the worker's arena
                else:
                    region = self._client_region(worker, p.regions[ref.region])
                    outputs.append((name, PLACE_REGION, region.id, ref.offset, ref.byte_size))
        else:  # every output into the worker's arena: the codec takes the bare names
            outputs = names
        # the parameters a model may see: none when the request has none at all
        parameters = request.model_parameters() if request.parameters else None
        trace = getattr(p, "trace", None)  # a queued request's (Pending); a sequence's filler has none
        if trace is not None:  # the model may trace its BLS calls as children of it
            return request.id, parameters, inputs, outputs, plan.sequence, (trace.id, trace.context())
        if plan.sequence is not None:
            return request.id, parameters, inputs, outputs, plan.sequence
        return request.id, parameters, inputs, outputs

    @staticmethod
    def _client_region(worker: WorkerHandle, region: "Region") -> "Region":
        worker.share_region(region)
        return region

    def _response(self, worker: WorkerHandle, mv: "ModelVersion", p: BatchRequest,
                  encoded: list[list[Any]], complete: bool = False,
                  parameters: dict[str, Any] | None = None) -> InferResponse:
        """``complete``: every requested output, once each (a decoupled response may
        carry some of them). ``encoded`` comes from the decoder, which has checked the
        types: names and datatypes are str, shapes lists of ints >= 0 (each its own, made
        for this frame), descriptors ints."""
        plan, request = p.plan, p.request
        descriptors: list[list[int]] = []
        outputs: list[OutputTensor] = []
        names = []
        for e in encoded:  # a loop, not a comprehension: no frame of its own (before 3.12's PEP 709)
            names.append(e[0])
        state_outputs, shm_outputs = plan.state_outputs, plan.shm_outputs
        # Exactly the outputs asked, in their order (the common answer), are unique too:
        # validation made them so. Anything else is checked in full.
        if not (complete and names == plan.outputs and not state_outputs):
            # a model may leave its state as it was; only a sequence model has any
            asked = [n for n in names if n not in state_outputs] if state_outputs else names
            if len(set(names)) != len(names) or (complete and asked != plan.outputs
                                                 and sorted(asked) != sorted(plan.outputs)):
                raise Internal(f"worker returned outputs {names} for model '{mv.name}' where {plan.outputs} "
                               "were asked")
        specs = mv.outputs
        try:
            for name, datatype, shape, desc in encoded:
                spec = specs.get(name)
                expected = spec.datatype if spec is not None else state_outputs.get(name)
                if expected != datatype:
                    raise Internal(f"worker returned an unexpected output '{name}' for model '{mv.name}'")
                ref = shm_outputs.get(name) if shm_outputs else None
                if ref is not None:
                    region = p.regions[ref.region]
                    if not (type(desc) is RegionDesc and desc[0] == region.id and desc[1] == ref.offset
                            and 0 <= desc[2] <= ref.byte_size):
                        raise Internal(f"worker misplaced output '{name}' bound for shared memory")
                    outputs.append(OutputTensor(name, datatype, shape, b"", in_shared_memory=True,
                                                shm_byte_size=desc[2]))
                    continue
                view = worker.outputs.view(desc)  # checks the descriptor against the worker's segments
                descriptors.append(desc)
                # the worker is not trusted: its descriptor must agree with the shape it claims
                count = 1
                for d in shape:
                    count *= d
                size = _ELEMENT_SIZE.get(datatype)
                if size is None:  # BYTES: the elements must fill the view exactly
                    codec.validate_bytes(view, count)
                elif count * size != view.nbytes:
                    raise Internal(f"worker returned {view.nbytes} bytes for output '{name}' of shape {shape}")
                outputs.append(OutputTensor(name, datatype, shape, view))  # the decoder's own list: no copy
        except Exception:
            worker.frees.add(descriptors)
            raise
        if parameters is not None:  # a worker is not trusted: only what the protocols carry
            parameters = _checked_parameters(mv, parameters)
        return InferResponse(mv.name, mv.version_name, request.id, parameters or {}, outputs,  # positional
                             functools.partial(worker.frees.add, descriptors))


# the decoder's statuses: compared by identity
_OK, _ERROR, _PARAMS, _ANSWERED = (protocol.Status.OK, protocol.Status.ERROR, protocol.Status.PARAMS,
                                   protocol.Status.ANSWERED)


def _checked_parameters(mv: "ModelVersion", parameters: dict[str, Any]) -> dict[str, Any]:
    for key, value in parameters.items():
        if not isinstance(value, (bool, int, str)) or (
                type(value) is int and not -(1 << 63) <= value < (1 << 63)):
            raise Internal(f"worker returned response parameter '{key}' of model '{mv.name}' of an unsupported type")
    return parameters

# bytes per element of every fixed-size datatype (BYTES is variable: not here)
_ELEMENT_SIZE = {dt: element_size(dt) for dt in protocol.DATATYPES if element_size(dt)}
