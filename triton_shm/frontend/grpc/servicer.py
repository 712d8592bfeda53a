"""inference.GRPCInferenceService and grpc.health.v1.Health, transport-neutral.

Each RPC is a thin translation to InferenceService calls, written once: a body takes
the request and returns the response, and fails by raising (TritonShmError, GrpcError).
``methods()`` lists them with their codecs for both transports (``aio.py``, ``native/``).
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator

from google.protobuf.message import DecodeError

from ..._proto import grpc_service_pb2 as pb
from ...errors import TritonShmError, Unsupported
from .codec import encode_model_statistics, infer_response_bytes, parse_infer_request, stream_response_bytes
from .rpc import Mailbox, Method, raw_bytes, rpc_status

if TYPE_CHECKING:
    from ...core.observability.otel import RequestSpan
    from ...core.service import InferenceService
    from ...core.data.types import InferRequest

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
STREAM_REQUEST_TASK = "gRPC stream request"  # each stream request's task name


def _tensor_metadata(tensors: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [pb.ModelMetadataResponse.TensorMetadata(
        name=t["name"], datatype=t["datatype"], shape=[int(d) for d in t["shape"]])
        for t in tensors]


def _stream_error(message: str, request_id: str, model: str = "", final: bool | None = None) -> bytes:
    """A stream's error reply (the stream goes on), with the id of the request it answers in
    ``infer_response`` (present even when empty, as Triton sends it); an error the model
    sent also names the model and, where the stream's responses are flagged, the flag."""
    reply = pb.ModelStreamInferResponse(error_message=message)
    infer = reply.infer_response
    infer.SetInParent()
    infer.id = request_id
    infer.model_name = model
    if final is not None:
        infer.parameters["triton_final_response"].bool_param = final
    return reply.SerializeToString()


def _request_id(msg: bytes) -> str:
    """The id of a stream request that failed before it was decoded, if it has one."""
    try:
        return pb.ModelInferRequest.FromString(msg).id
    except DecodeError:
        return ""


class InferenceRpcs:
    def __init__(self, service: "InferenceService"):
        self.service = service

    # -- health and metadata -------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.service.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self.service.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        md = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=md["name"], version=md["version"],
                                         extensions=md["extensions"])

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        md = self.service.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=md["name"], versions=md["versions"], platform=md["platform"],
            inputs=_tensor_metadata(md["inputs"]), outputs=_tensor_metadata(md["outputs"]))

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self.service.model_config(request.name, request.version))

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        if request.repository_name:  # Triton answers the same (one repository namespace)
            raise Unsupported("'repository_name' specification is not supported")
        resp = pb.RepositoryIndexResponse()
        for m in self.service.repository_index(ready_only=request.ready):
            resp.models.add(name=m["name"], version=m.get("version", ""),
                            state=m.get("state", ""), reason=m.get("reason", ""))
        return resp

    # -- inference -----------------------------------------------------------------------
    # ModelInfer has no body here: it is the service's infer, between its codecs (see methods()).

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        stats = await self.service.model_statistics(request.name, request.version)
        return encode_model_statistics(stats)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items()
                  if v.WhichOneof("parameter_choice")}
        await self.service.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest
                                    ) -> pb.RepositoryModelUnloadResponse:
        dependents = request.parameters.get("unload_dependents")
        await self.service.unload_model(request.model_name, bool(dependents and dependents.bool_param))
        return pb.RepositoryModelUnloadResponse()

    # -- shared-memory extensions ---------------------------------------------------------
    def _shm_status(self, response_type: Any, kind: str, name: str) -> Any:
        resp = response_type()
        for r in self.service.shm_status(kind, name):
            resp.regions[r["name"]].CopyFrom(response_type.RegionStatus(**r))
        return resp

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        return self._shm_status(pb.SystemSharedMemoryStatusResponse, "system", request.name)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.service.register_system_shm(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.service.unregister_shm("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        return self._shm_status(pb.CudaSharedMemoryStatusResponse, "cuda", request.name)

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self.service.register_cuda_shm(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self.service.unregister_shm("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- streaming -------------------------------------------------------------------------
    async def ModelStreamInfer(self, request_iterator: Any, context: RequestSpan | None = None,
                               forwarded: "dict[str, str] | TritonShmError | None" = None) -> AsyncIterator[Any]:
        """Bidirectional stream: each request is served concurrently and may get any
        number of responses (decoupled models). Errors travel in ``error_message`` and
        the stream stays open, as in Triton. ``context``: the call's trace context (its
        metadata's traceparent), the parent of each request's InferRequest span while
        OpenTelemetry spans are traced, as in Triton. ``forwarded``: the call's headers that
        --grpc-header-forward-pattern makes every request's parameters (or why they can not be:
        each request is answered that error, as in Triton)."""
        out = Mailbox()
        tasks: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    # A fixed name: the default one is formatted for each task.
                    task = asyncio.Task(self._serve_stream_request(msg, out, context, forwarded), loop=loop,
                                        name=STREAM_REQUEST_TASK)
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await out.get()) is not None:
                yield item
        finally:  # the client went away or the stream ended: stop what is still running
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _serve_stream_request(self, msg: bytes, out: Mailbox, context: RequestSpan | None = None,
                                    forwarded: "dict[str, str] | TritonShmError | None" = None) -> None:
        """Puts each reply, already encoded (responses are released as they are encoded)."""
        request: InferRequest | None = None
        span = None
        if context is not None and self.service.tracer.spans:  # its message has been read: received now
            span = context.fresh()
            span.stamp("GRPC_WAITREAD_START")
            span.stamp("GRPC_WAITREAD_END")
        try:
            request = parse_infer_request(msg)
            if forwarded is not None:
                if isinstance(forwarded, TritonShmError):
                    raise forwarded
                request.parameters = {**request.parameters, **forwarded}
            # A non-decoupled model's one response is always flagged final; a decoupled
            # model's responses are flagged only when the client asked for the flag.
            model = self.service.model_for(request)  # looked up once, for the flag and the run
            flag_final = (request.parameters.get("triton_enable_empty_final_response") is True
                          or not model.decoupled)
            async for response, final in self.service.infer_stream(request, model, span):
                if final and span is not None:  # the last reply goes to the stream's writer now
                    span.stamp("INFER_RESPONSE_COMPLETE")
                    span.stamp("GRPC_SEND_START")
                if isinstance(response, TritonShmError):  # an error is a response of its own (final or not)
                    out.put_nowait(_stream_error(response.message, request.id, request.model_name,
                                                 final if flag_final else None))
                elif response is not None:
                    out.put_nowait(stream_response_bytes(response, final if flag_final else None))
                elif final and flag_final:
                    reply = pb.ModelInferResponse(model_name=request.model_name,
                                                  model_version=request.model_version, id=request.id)
                    reply.parameters["triton_final_response"].bool_param = True
                    out.put_nowait(pb.ModelStreamInferResponse(infer_response=reply).SerializeToString())
        except TritonShmError as e:
            out.put_nowait(_stream_error(e.message, _request_id(msg) if request is None else request.id))
        except DecodeError as e:  # answered; the stream goes on
            out.put_nowait(_stream_error(rpc_status(e, "/inference.GRPCInferenceService/ModelStreamInfer")[1], ""))
        except Exception as e:  # noqa: BLE001 - the stream must get an answer
            log.exception("stream request failed")
            out.put_nowait(_stream_error(f"{type(e).__name__}: {e}", "" if request is None else request.id))
        finally:
            if span is not None:
                span.stamp("GRPC_SEND_END")
                self.service.tracer.end_request(span)

    # -- trace and logging extensions -------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        log.debug("gRPC request: TraceSetting model '%s'", request.model_name)
        if request.settings:
            changes: dict[str, Any] = {}
            for key, setting in request.settings.items():
                values = list(setting.value)  # no value: clear the setting (tritonclient's None)
                changes[key] = (None if not values else values if key == "trace_level"
                                else values[0] if len(values) == 1 else values)
            current = await self.service.update_trace_settings(request.model_name, changes)
        else:
            current = self.service.trace_settings(request.model_name)
        resp = pb.TraceSettingResponse()
        for key, value in current.items():
            resp.settings[key].value.extend(value if isinstance(value, list) else [value])
        return resp

    async def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        log.debug("gRPC request: LogSettings")
        if request.settings:
            changes = {key: (getattr(setting, which) if (which := setting.WhichOneof("parameter_choice")) else None)
                       for key, setting in request.settings.items()}
            current = await self.service.update_log_settings(changes)
        else:
            current = self.service.get_log_settings()
        resp = pb.LogSettingsResponse()
        for key, value in current.items():
            if isinstance(value, bool):
                resp.settings[key].bool_param = value
            elif isinstance(value, int):
                resp.settings[key].uint32_param = value
            else:
                resp.settings[key].string_param = value
        return resp


# -- grpc.health.v1.Health/Check ----------------------------------------------------------
# Triton answers SERVING when the server is ready, NOT_SERVING otherwise, whatever service
# name is asked. The messages are one enum field, so they are encoded by hand rather than
# depending on grpcio-health-checking.
_SERVING, _NOT_SERVING = b"\x08\x01", b"\x08\x02"  # HealthCheckResponse{status: 1 | 2}


async def _health_check(service: "InferenceService", request: bytes) -> bytes:
    try:
        return _SERVING if await service.ready() else _NOT_SERVING
    except Exception:  # noqa: BLE001 - health must answer, not crash
        log.exception("health check failed")
        return _NOT_SERVING


# Each RPC's restricted-API group (--grpc-restricted-protocol), as tritonserver groups them.
GROUPS: dict[str, str] = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}

# Bodies that take or give bytes instead of protobuf messages (their own codecs).
# ModelInfer is the service's infer between its codecs: the request parsed by
# parse_infer_request (tensors stay views of the message), the response encoded by
# infer_response_bytes. ModelStreamInfer's body takes the raw messages.
_DESERIALIZERS: dict[str, Any] = {"ModelInfer": parse_infer_request}
_RAW_REQUEST = {"ModelStreamInfer"}
_SERIALIZERS = {"ModelInfer": infer_response_bytes, "ModelStreamInfer": raw_bytes}


def methods(service: "InferenceService") -> list[Method]:
    """Every RPC served, from the service descriptor: nothing to keep in step by hand."""
    rpcs = InferenceRpcs(service)
    out = []
    for m in pb.DESCRIPTOR.services_by_name[SERVICE.split(".")[1]].methods:
        kwargs: dict[str, Any] = {}
        if m.name not in _RAW_REQUEST:
            kwargs["deserialize"] = _DESERIALIZERS.get(m.name) or getattr(pb, m.input_type.name).FromString
        if m.name in _SERIALIZERS:
            kwargs["serialize"] = _SERIALIZERS[m.name]
        handler = service.infer if m.name == "ModelInfer" else getattr(rpcs, m.name)
        if m.name in ("ModelInfer", "ModelStreamInfer"):
            kwargs["spans"] = service
            kwargs["forwards_headers"] = True
        out.append(Method(f"/{SERVICE}/{m.name}", handler,
                          streaming=m.client_streaming or m.server_streaming, group=GROUPS[m.name], **kwargs))
    out.append(Method("/grpc.health.v1.Health/Check", functools.partial(_health_check, service),
                      serialize=raw_bytes, group=GROUPS["Check"]))
    return out
