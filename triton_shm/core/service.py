"""InferenceService: the one entry point both protocol adapters call.

Every method raises :class:`triton_shm.errors.TritonShmError` subclasses on failure;
adapters map those to HTTP/gRPC status once.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from .. import TRITON_PROTOCOL_VERSION
from ..errors import Cancelled, Internal, InvalidArgument, NotFound, TritonShmError, Unavailable, Unsupported
from .observability import log_settings
from .data.cached_inference import infer_cached
from .data.classification import classify_response
from .models.config import check_load_name, config_to_json, validate_model_name
from .models.manager import ModelManager, decode_load_parameters
from .data.response_cache import ResponseCache
from .replication import LocalReplicas, Replicas
from .data.shm_registry import SharedMemoryRegistry
from .observability.otel import RequestSpan
from .observability.statistics import merge_statistics
from .observability.tracing import Handover, Trace, Tracer
from .data.types import InferRequest, InferResponse, InputTensor, RequestedOutput, ResponseStream
from .models.validation import RequestPlan, checked_plan, plain_plan, validate_request

if TYPE_CHECKING:
    from .._proto import model_config_pb2
    from ..supervisor.handle import WorkerHandle
    from .data.shm_registry import Region
    from .models.version import ModelVersion

SERVER_NAME = "triton"
# Only what really works is advertised (perf_analyzer reads this list).
EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
              "model_configuration", "binary_tensor_data", "parameters", "statistics", "trace", "logging"]


# The regions of a request that uses no client shared memory: one empty dict every such
# request shares (read, never written, below the service).
_NO_REGIONS: dict = {}
log = logging.getLogger(__name__)


class InferenceService:
    def __init__(self, models: ModelManager, shm: SharedMemoryRegistry, *, strict_readiness: bool = True,
                 server_id: str = SERVER_NAME, cache: ResponseCache | None = None):
        self.models = models
        self.cache = cache  # --cache-config: the response cache models with response_cache use
        self.server_id = server_id  # --id: the name server metadata reports
        self.repository = models.repository
        self.workers = models.pool
        self.shm = shm
        shm.on_close = self.workers.drop_region
        self.strict_readiness = strict_readiness
        self.workers.bls_handler = self._serve_bls
        self.draining = False  # shutting down: not ready, still serving what comes
        # BLS calls running: (worker, call id) -> (the task serving it, its response stream once it has one)
        self._bls_calls: dict[tuple[int, Any], tuple[asyncio.Task, list[ResponseStream]]] = {}
        self.accepting = True  # False once the front-ends have stopped
        self.tracer = Tracer()  # the server replaces it with one built from --trace-config
        self.log_settings = log_settings.current()
        # the other front-end processes (--frontend-processes), which every change of the
        # server's state reaches before it is answered: none by default (``replicate``)
        self.replicas: Replicas = LocalReplicas(models)
        # what applies each op of the server's state in this process (core/replication.py)
        self.appliers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "register_system_shm": self._register_system_shm, "register_cuda_shm": self._register_cuda_shm,
            "unregister_shm": self._unregister_shm, "drop_idle_shm": self._drop_idle_shm,
            "trace_update": self._trace_update, "log_update": self._log_update,
            "apply_load": self._apply_load, "apply_unload": self._apply_unload, "poll": self._poll,
            "owned_states": self._owned_states, "adopt_states": self._adopt_states,
            "statistics": self._statistics, "model_ready": self._model_ready,
            "trace_docs": self._trace_docs,
        }
        # Names validate_model_name accepted that name a model: checked once, not per
        # request (only repository names are kept, so clients cannot grow it).
        self._checked_names: set[str] = set()

    def replicate(self, replicas: Replicas) -> None:
        """Several front-end processes: every change of the state goes to ``replicas`` too,
        and a region whose last user here is done is settled with them (``_shm_idle``;
        alone, the registry drops it at once)."""
        self.replicas = replicas
        self.shm.on_idle = self._shm_idle

    async def apply(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply ``op`` here, then in every other front-end process; this process's answer.
        An error here stops it before the others see it."""
        reply = await self.appliers[op](body)
        await self.replicas.others(op, body)
        return reply

    async def apply_here(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """``op`` applied in this process only (another process asked, or it replays)."""
        return await self.appliers[op](body)

    # -- health and metadata -------------------------------------------------------------
    def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        """Live, not shutting down, workers up; with strict readiness every model that
        should be loaded is READY, and, as in Triton, every READY Python model that
        defines ``is_ready()`` says so."""
        if self.draining or not (self.accepting and self.workers.all_alive()):
            return False
        if not self.strict_readiness:
            return True
        if not self.repository.all_ready():
            return False
        for entry in list(self.repository.models.values()):
            for mv in list(entry.versions.values()):
                if mv.ready and not await self._own_readiness(mv):
                    return False
        return True

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if self.shm.enabled:
            # cuda_shared_memory too where no GPU serves, as Triton lists it: clients read the
            # list, and a registration there fails with the reason
            extensions += ["system_shared_memory", "cuda_shared_memory"]
        return {"name": self.server_id, "version": TRITON_PROTOCOL_VERSION, "extensions": extensions}

    # -- shared memory -------------------------------------------------------------------
    async def register_system_shm(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """The values as the wire carried them: the registry checks their types and ranges."""
        body = {"name": name, "key": key, "offset": offset, "byte_size": byte_size}
        await self._register_system_shm(body)
        await self._others_or_undo("register_system_shm", body, "system", name)

    async def register_cuda_shm(self, name: str, raw_handle: bytes | str, device_id: object, byte_size: object) -> None:
        """Checked here, opened by the worker of ``device_id`` (its error is the client's),
        listed once open."""
        region = await self.open_cuda_shm(name, raw_handle, device_id, byte_size)
        await self._others_or_undo("register_cuda_shm", region.cuda_registration(), "cuda", name)

    async def _others_or_undo(self, op: str, body: dict[str, Any], kind: str, name: str) -> None:
        """A registration made here, made in the other front-end processes too; undone
        everywhere when one of them refuses it."""
        try:
            await self.replicas.others(op, body)
        except BaseException:
            self.shm.unregister(kind, name)
            await self.replicas.others("unregister_shm", {"kind": kind, "name": name})
            raise

    async def _register_system_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        self.shm.register_system(body["name"], body["key"], body["offset"], body["byte_size"])
        return {}

    async def _register_cuda_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        """As ``Region.cuda_registration`` carries it (the handle in base64)."""
        await self.open_cuda_shm(body["name"], base64.b64decode(body["raw_handle"]), body["device_id"],
                                 body["byte_size"])
        return {}

    async def open_cuda_shm(self, name: str, raw_handle: bytes | str, device_id: object,
                            byte_size: object) -> "Region":
        """A CUDA region registered in this process (its GPU's worker opened the handle)."""
        region = self.shm.prepare_cuda(name, raw_handle, device_id, byte_size)
        await self.workers.open_cuda_region(region)
        try:
            self.shm.add_cuda(region)
        except BaseException:
            self.workers.drop_region(region)
            raise
        return region

    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """kind "system" → ``[{"name","key","offset","byte_size"}]``;
        "cuda" → ``[{"name","device_id","byte_size"}]``."""
        return self.shm.status(kind, name)

    async def unregister_shm(self, kind: str, name: str = "") -> None:
        """As in Triton, a region that requests use is unregistered once they are done: it
        stays listed (and its name taken) until then. With several front-end processes it
        stays in all of them until none uses it (``_settle_shm``)."""
        await self._settle_shm(kind, name)

    async def _settle_shm(self, kind: str, name: str) -> None:
        """Mark the regions awaiting in every process, then remove them everywhere but those
        one of them still uses; that one settles them again when its last user is done."""
        body = {"kind": kind, "name": name, "defer": True}
        in_use = set((await self._unregister_shm(body))["in_use"])
        for reply in await self.replicas.others("unregister_shm", body):
            in_use.update(reply.get("in_use") or [])
        self.shm.drop_idle(kind, name, in_use)
        await self.replicas.others("drop_idle_shm", {"kind": kind, "name": name, "keep": sorted(in_use)})

    async def _unregister_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        """``defer``: mark the regions awaiting and answer those in use here (the caller
        removes the rest with ``drop_idle_shm``); else remove them (an undone registration)."""
        return {"in_use": self.shm.unregister(body["kind"], body["name"], defer_all=bool(body.get("defer")))}

    async def _drop_idle_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        self.shm.drop_idle(body["kind"], body["name"], set(body["keep"]))
        return {}

    def _shm_idle(self, region: "Region") -> None:
        """An awaiting region's last user here is done: it is settled across the front-end
        processes (``replicate``)."""
        async def settle() -> None:
            if self.shm.still_awaiting(region):  # not settled by another process meanwhile
                try:
                    await self._settle_shm(region.kind, region.name)
                except TritonShmError as e:
                    log.error("unregistering shared memory region '%s': %s", region.name, e.message)
        asyncio.ensure_future(settle())

    async def model_ready(self, name: str, version: str = "") -> bool:
        try:
            mv = self.repository.get(name, version)
        except NotFound:
            return False
        return mv.ready and await self._own_readiness(mv)

    async def _own_readiness(self, mv: "ModelVersion") -> bool:
        """A READY version's own say (a Python model's ``is_ready()``), asked where its
        instances run: here, in the process that owns it, or with several processes
        sharing its instances in each of them. Free for a model that defines none."""
        if mv.owner is not None:
            return await self.replicas.model_ready(mv)
        if mv.instance_slice[1] > 1 and self.workers.readiness.defined(mv):
            return await self.local_model_ready(mv) and await self.replicas.model_ready(mv, everywhere=True)
        return await self.local_model_ready(mv)

    async def local_model_ready(self, mv: "ModelVersion") -> bool:
        """The instances of ``mv`` this process runs say they are ready."""
        return await self.workers.model_ready(mv)

    async def _model_ready(self, body: dict[str, Any]) -> dict[str, Any]:
        """Another process asks whether this one's instances of a version are ready, and
        whether it defines ``is_ready()`` at all."""
        try:
            mv = self.repository.get(body["name"], str(body["version"]))
        except TritonShmError:
            return {"ready": False, "defined": True}
        return {"ready": mv.ready and await self.local_model_ready(mv), "defined": self.workers.readiness.defined(mv)}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """``{"name", "versions", "platform", "inputs", "outputs"}`` as Triton reports it."""
        model = self.repository.get(name, version, require_ready=True)
        return model.metadata(self.repository.versions_of(name))

    def model_config(self, name: str, version: str = "") -> "model_config_pb2.ModelConfig":
        return self.repository.get(name, version, require_ready=True).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

    async def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}`` as Triton's statistics extension reports it (with
        several front-end processes: every process's counts, summed)."""
        if name:
            validate_model_name(name)
        stats = self.repository.statistics(name, version)
        replies = await self.replicas.others("statistics", {"name": name, "version": version})
        if replies:
            stats = merge_statistics(stats, [r["model_stats"] for r in replies])
        return {"model_stats": stats}

    async def _statistics(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"model_stats": self.repository.statistics(body["name"], body["version"])}
        except NotFound:
            return {"model_stats": []}

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Explicit mode only: (re)load ``name``; ``parameters`` may carry ``config`` (a JSON
        model config that overrides config.pbtxt) and ``file:<version>/<file>`` contents."""
        self.models.check_api_allowed()
        check_load_name(name)
        config, files = decode_load_parameters(parameters or {})
        await self.replicas.load(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Explicit mode only: waits for the model's in-flight requests, then frees it;
        with ``unload_dependents`` the ensembles that use it are unloaded first."""
        self.models.check_api_allowed()
        await self.replicas.unload(name, unload_dependents)

    async def _apply_load(self, body: dict[str, Any]) -> dict[str, Any]:
        """A load as ``Cluster.load`` sends it (the files in base64)."""
        files = {k: base64.b64decode(v) for k, v in (body.get("files") or {}).items()}
        await self.models.load(body["name"], body.get("config"), files)
        return {}

    async def _apply_unload(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.models.unload(body["name"], bool(body.get("dependents")))
        return {}

    async def _poll(self, _body: dict[str, Any]) -> dict[str, Any]:
        """The repository changes another process's poll found, applied here."""
        await self.models.poll_once()
        return {}

    async def _owned_states(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"states": self.models.owned_states()}

    async def _adopt_states(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.models.adopt_states(body["states"])
        return {}

    def current_state(self) -> dict[str, Any]:
        """What a restarted process needs to be the same server again: the models served
        now, the shared-memory regions, the log and trace settings the API changed."""
        shm = self.shm
        return {"ready": [name for name, entry in self.repository.models.items() if entry.ready_versions()],
                "system_shm": shm.status("system", awaiting=False) if shm.enabled else [],
                "cuda_shm": shm.cuda_registrations() if shm.enabled else [],
                "log": self.log_settings.to_dict(), "trace": self.tracer.api_changes()}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """``[{"name", "version", "state", "reason"?}]`` sorted by name and version."""
        self.repository.refresh()
        return self.repository.index(ready_only)

    # -- trace and logging extensions ----------------------------------------------------
    def _check_trace_model(self, model: str) -> None:
        if model and model not in self.repository.models:
            raise InvalidArgument(f"Request for unknown model : {model}")  # Triton's wording

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        """``{"trace_level": [..], "trace_rate": "N", "trace_count": "N", "log_frequency": "N",
        "trace_file", "trace_mode"}``; a model's settings fall back to the global ones."""
        self._check_trace_model(model)
        return self.tracer.settings(model)

    async def update_trace_settings(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Values are strings (``trace_level``: a list of strings); null clears a setting."""
        self._check_trace_model(model)
        return (await self.apply("trace_update", {"model": model, "changes": changes}))["settings"]

    async def _trace_update(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"settings": self.tracer.update(body["model"], body["changes"])}

    async def _trace_docs(self, body: dict[str, Any]) -> dict[str, Any]:
        """Another process's finished traces, for the one trace file this process writes."""
        self.tracer.write_from_peer(bool(body["indexed"]), [doc.encode() for doc in body["docs"]])
        return {}

    def get_log_settings(self) -> dict[str, Any]:
        """``{"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}``."""
        return self.log_settings.to_dict()

    async def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Null leaves a setting as it is; ``log_file`` can not be set (501)."""
        return (await self.apply("log_update", {"changes": changes}))["settings"]

    async def _log_update(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"settings": self.log_settings.update(body["changes"])}

    # -- inference -----------------------------------------------------------------------
    async def infer(self, request: InferRequest, span: RequestSpan | None = None) -> InferResponse:
        """Run one request. The caller must call ``response.release()`` when done with it.
        A coroutine: the lean HTTP path drives it with ``send`` itself. ``span``: the
        front-end's InferRequest span while ``tracer.spans`` (OpenTelemetry mode)."""
        model = self._model_for(request)
        if model.decoupled:
            raise Unsupported(f"model '{model.name}' is decoupled (it may send any number of responses): use "
                              "the gRPC stream (ModelStreamInfer) or the generate_stream endpoint")
        response = await self._infer(model, request, None, span)
        if response is None:  # only a decoupled model answers on a stream
            raise Internal(f"model '{model.name}' answered on a stream without being decoupled")
        return response

    def model_for(self, request: InferRequest) -> "ModelVersion":
        """The ready model version the request names (its ``decoupled`` says whether it may
        send any number of responses); raises why it can not be served."""
        return self._model_for(request)

    async def infer_stream(self, request: InferRequest, model: "ModelVersion | None" = None,
                           span: RequestSpan | None = None, parent: Trace | Handover | None = None, sample: bool = True,
                           streams: list[ResponseStream] | None = None
                           ) -> AsyncIterator[tuple[InferResponse | None, bool]]:
        """Every response of one request as ``(item, final)``: ``item`` is a response, a
        TritonShmError (a decoupled model may send errors and go on), or None; the last
        has ``final`` True (a decoupled model may end with no response). Errors before
        the model runs are raised. Works for every model; the caller releases each
        response. ``model``: what ``model_for`` returned for it, if the caller asked;
        ``span``: as for ``infer``; ``parent``: the trace of the request whose BLS call this
        is (``trace=request.trace()``), traced as its child, or the Handover of a request
        another front-end process sampled and forwarded; ``sample``: False for a BLS call
        (or a forwarded request), which is traced as a child or not at all, as in Triton;
        ``streams``: a decoupled request's stream is appended to it (a BLS caller cancels it)."""
        if model is None:
            model = self._model_for(request)
        if not model.decoupled:
            yield await self._infer(model, request, None, span, parent, sample), True
            return
        stream = ResponseStream(asyncio.Queue())
        if streams is not None:
            streams.append(stream)
        if model.stats is not None and model.stats.first_response is not None:  # histograms on
            stream.opened_ns = time.monotonic_ns()
        queue = stream.queue
        run = asyncio.ensure_future(self._infer(model, request, stream, span, parent, sample))
        final = False
        try:
            while True:
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, run}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    run.result()  # refused before it ran (e.g. queue full): raise that
                    get = asyncio.ensure_future(queue.get())  # executed: responses follow
                item, final = await get
                if stream.classify is not None and isinstance(item, InferResponse):
                    try:
                        classify_response(item, *stream.classify)
                    except TritonShmError as e:
                        item = e  # this response's error; the model's others go on
                yield item, final
                if final:
                    break
        finally:
            if not final and stream.cancel is not None:
                stream.cancel()  # the consumer went away: the model's sender sees is_cancelled()
            if not run.done():
                run.cancel()

    async def _serve_bls(self, worker: "WorkerHandle", msg: dict[str, Any]) -> None:
        """A model's BLS call: run it like any request and stage each response's
        outputs in the calling worker's input arena. ``bls_cancel``: the caller cancelled
        a call (``response_iterator.cancel()``): the called model sees ``is_cancelled()`` and
        its responses go on to the caller until the final one; a call not running yet ends
        with CANCELLED."""
        bid = msg.get("bid")
        if msg.get("op") == "bls_cancel":
            call = self._bls_calls.get((id(worker), bid))
            if call is not None:
                task, started = call
                if started and started[0].cancel is not None:
                    started[0].cancel()
                else:  # not running yet: it ends here (unregistered first: the task tells it from a shutdown)
                    del self._bls_calls[(id(worker), bid)]
                    task.cancel()
            return

        def reply(body: dict[str, Any]) -> None:
            body.update(op="bls_reply", bid=bid)
            try:
                worker.send(body)
            except Unavailable:
                pass  # the calling worker has gone

        try:
            inputs = [
                InputTensor(n, dt, list(shape), worker.outputs.view(desc)) for n, dt, shape, desc in msg["inputs"]
            ]
            request = InferRequest(model_name=str(msg.get("model", "")), model_version=str(msg.get("version", "")),
                                   id=str(msg.get("request_id", "")), parameters=dict(msg.get("parameters") or {}),
                                   inputs=inputs, outputs=[RequestedOutput(n) for n in msg.get("outputs") or []])
            parent = self.tracer.live(msg["trace"]) if "trace" in msg else None
            streams: list[ResponseStream] = []
            current = asyncio.current_task()
            if current is not None:
                self._bls_calls[(id(worker), bid)] = (current, streams)
            try:
                async for response, final in self.infer_stream(request, parent=parent, sample=False, streams=streams):
                    if response is None or isinstance(response, TritonShmError):
                        reply({"final": final, **({"error": response.to_wire()} if response is not None else {})})
                        continue
                    try:
                        outputs = [[o.name, o.datatype, o.shape, worker.stage(o.data)] for o in response.outputs]
                    finally:
                        response.release()
                    body: dict[str, Any] = {"outputs": outputs, "final": final}
                    if response.parameters:
                        body["parameters"] = response.parameters
                    reply(body)
            except asyncio.CancelledError:
                if (id(worker), bid) in self._bls_calls:
                    raise  # the server is stopping, not the caller
                reply({"error": Cancelled("the BLS request was cancelled").to_wire(), "final": True})
            finally:
                self._bls_calls.pop((id(worker), bid), None)
        except TritonShmError as e:
            reply({"error": e.to_wire(), "final": True})
        except (KeyError, TypeError, ValueError) as e:
            reply({"error": InvalidArgument(f"malformed BLS request: {e}").to_wire(), "final": True})

    def _model_for(self, request: InferRequest) -> "ModelVersion":
        if not self.accepting:
            raise Unavailable("Server is shutting down")
        name = request.model_name
        if name not in self._checked_names:
            validate_model_name(name)
            if name in self.repository.models:
                self._checked_names.add(name)
        return self.repository.get(name, request.model_version, require_ready=True)

    def _cache_for(self, model: "ModelVersion", request: InferRequest,
                   stream: ResponseStream | None) -> ResponseCache | None:
        """The response cache this request goes through, if any. A request of a sequence
        depends on the sequence's state: never answered from the cache."""
        if model.caches_responses and stream is None and "sequence_id" not in request.parameters:
            return self.cache
        return None

    def _infer(self, model: "ModelVersion", request: InferRequest, stream: ResponseStream | None = None,
               span: RequestSpan | None = None, parent: Trace | Handover | None = None,
               sample: bool = True) -> Awaitable[InferResponse | None]:
        """What runs the request: the response, or None for a decoupled model (its
        responses went to ``stream``). Not a coroutine itself: a request that is not
        traced and uses no client shared memory and no cache (the common one) goes
        straight to its scheduler, a coroutine fewer per request; it is validated here,
        so its validation error raises at the call, not at the await."""
        if (self.tracer.active and sample) or model.caches_responses or parent is not None:  # timed from arrival
            return self._infer_with_features(model, request, stream, None, span, parent, sample)
        plan = plain_plan(model, request) or checked_plan(model, request)  # validate_request's two steps
        if plan.shm_inputs or plan.shm_outputs or plan.classification:
            return self._infer_with_features(model, request, stream, plan)
        scheduler = model.scheduler
        if scheduler is None:
            scheduler = model.queue()  # raises why it has none
        return scheduler.submit(request, plan, _NO_REGIONS, None, stream)

    async def _infer_with_features(self, model: "ModelVersion", request: InferRequest,
                                   stream: ResponseStream | None, plan: RequestPlan | None = None,
                                   span: RequestSpan | None = None, parent: Trace | Handover | None = None,
                                   sample: bool = True) -> InferResponse | None:
        """``_infer`` for a request that is traced, or uses client shared memory or the
        cache (``plan``: its validation, done already when neither traced nor cached)."""
        arrived = time.monotonic_ns()
        if parent is not None:
            trace: Trace | None = self.tracer.child(parent, model.name, model.version, request.id)
        else:
            trace = self.tracer.sample(model.name, model.version, request.id, arrived, span) \
                if self.tracer.active and sample else None
        try:
            if plan is None:
                plan = validate_request(model, request)
            # the classes are made where the model runs: a forwarded request's owner makes them
            classes = plan.classification if model.owner is None else None
            if classes and stream is not None:  # a decoupled model's responses
                stream.classify = (classes, model.max_batch_size > 0, model.labels)
            cache = self._cache_for(model, request, stream)
            if not (plan.shm_inputs or plan.shm_outputs or cache is not None):
                response = await model.queue().submit(request, plan, {}, trace, stream)
            else:
                regions = self.shm.acquire_all(plan)
                if cache is not None and any(r.kind == "cuda" for r in regions.values()):
                    cache = None  # the cache reads and writes host regions only: CUDA ones bypass it
                try:
                    if cache is not None:
                        response = await infer_cached(cache, model, request, plan, regions, arrived,
                                                      lambda: model.queue().submit(request, plan, regions, trace))
                    else:
                        response = await model.queue().submit(request, plan, regions, trace, stream)
                finally:  # the worker has finished with the regions once it replied
                    for region in regions.values():
                        self.shm.release(region)
            if classes and response is not None:
                classify_response(response, classes, model.max_batch_size > 0, model.labels)
            return response
        finally:
            if trace is not None:
                self.tracer.finish(trace)
