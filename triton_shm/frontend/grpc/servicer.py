"""inference.GRPCInferenceService on grpc.aio, translating to InferenceService calls.

Each RPC is a thin translation; errors are mapped once in ``_rpc``.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from ..._proto import grpc_service_pb2 as pb
from ..._proto import grpc_service_pb2_grpc as pb_grpc
from ...errors import GRPC_STATUS, TritonShmError
from .codec import decode_infer_request, encode_infer_response, encode_model_statistics

if TYPE_CHECKING:
    from ...core.service import InferenceService

log = logging.getLogger(__name__)

_R = TypeVar("_R")
_Ctx = grpc.aio.ServicerContext
_Handler = Callable[[Any, Any, _Ctx], Awaitable[_R]]


def _rpc(fn: _Handler[_R]) -> _Handler[_R]:
    """Map TritonShmError to its gRPC status, anything unexpected to INTERNAL."""
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: _Ctx) -> _R:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:  # context.abort() already set the status
            raise
        except TritonShmError as e:
            await context.abort(grpc.StatusCode[GRPC_STATUS[e.code]], e.message)
        except Exception as e:  # noqa: BLE001 - the client must get an answer
            log.exception("gRPC %s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable: context.abort raises")
    return wrapper


def _tensor_metadata(tensors: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [pb.ModelMetadataResponse.TensorMetadata(
        name=t["name"], datatype=t["datatype"], shape=[int(d) for d in t["shape"]])
        for t in tensors]


class GRPCInferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: "InferenceService"):
        self.service = service

    # -- health and metadata -------------------------------------------------------------
    @_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: _Ctx) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    @_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: _Ctx) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: _Ctx) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: _Ctx) -> pb.ServerMetadataResponse:
        md = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=md["name"], version=md["version"],
                                         extensions=md["extensions"])

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: _Ctx) -> pb.ModelMetadataResponse:
        md = self.service.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=md["name"], versions=md["versions"], platform=md["platform"],
            inputs=_tensor_metadata(md["inputs"]), outputs=_tensor_metadata(md["outputs"]))

    @_rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: _Ctx) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self.service.model_config(request.name, request.version))

    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: _Ctx) -> pb.RepositoryIndexResponse:
        if request.repository_name:  # Triton answers the same (one repository namespace)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "'repository_name' specification is not supported")
        resp = pb.RepositoryIndexResponse()
        for m in self.service.repository_index(ready_only=request.ready):
            resp.models.add(name=m["name"], version=m.get("version", ""),
                            state=m.get("state", ""), reason=m.get("reason", ""))
        return resp

    # -- inference -----------------------------------------------------------------------
    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: _Ctx) -> pb.ModelInferResponse:
        response = await self.service.infer(decode_infer_request(request))
        try:
            return encode_infer_response(response)
        finally:
            response.release()  # outputs may be views into shared memory

    @_rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: _Ctx) -> pb.ModelStatisticsResponse:
        stats = self.service.model_statistics(request.name, request.version)
        return encode_model_statistics(stats)

    @_rpc
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: _Ctx) -> pb.RepositoryModelLoadResponse:
        params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items()
                  if v.WhichOneof("parameter_choice")}
        await self.service.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: _Ctx) -> pb.RepositoryModelUnloadResponse:
        dependents = request.parameters.get("unload_dependents")
        await self.service.unload_model(request.model_name, bool(dependents and dependents.bool_param))
        return pb.RepositoryModelUnloadResponse()

    # -- shared-memory extensions ---------------------------------------------------------
    def _shm_status(self, response_type: Any, kind: str, name: str) -> Any:
        resp = response_type()
        for r in self.service.shm_status(kind, name):
            resp.regions[r["name"]].CopyFrom(response_type.RegionStatus(**r))
        return resp

    @_rpc
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: _Ctx) -> pb.SystemSharedMemoryStatusResponse:
        return self._shm_status(pb.SystemSharedMemoryStatusResponse, "system", request.name)

    @_rpc
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: _Ctx) -> pb.SystemSharedMemoryRegisterResponse:
        self.service.register_system_shm(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: _Ctx) -> pb.SystemSharedMemoryUnregisterResponse:
        self.service.unregister_shm("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: _Ctx) -> pb.CudaSharedMemoryStatusResponse:
        return self._shm_status(pb.CudaSharedMemoryStatusResponse, "cuda", request.name)

    @_rpc
    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: _Ctx) -> pb.CudaSharedMemoryRegisterResponse:
        self.service.register_cuda_shm(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: _Ctx) -> pb.CudaSharedMemoryUnregisterResponse:
        self.service.unregister_shm("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- streaming -------------------------------------------------------------------------
    async def ModelStreamInfer(self, request_iterator: Any, context: _Ctx) -> AsyncIterator[Any]:
        """Bidirectional stream: each request is served concurrently and may get any
        number of responses (decoupled models). Errors travel in ``error_message`` and
        the stream stays open, as in Triton."""
        out: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    task = asyncio.ensure_future(self._serve_stream_request(msg, out))
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

    async def _serve_stream_request(self, msg: pb.ModelInferRequest, out: asyncio.Queue) -> None:
        try:
            request = decode_infer_request(msg)
            # A non-decoupled model's one response is always flagged final; a decoupled
            # model's responses are flagged only when the client asked for the flag.
            flag_final = (request.parameters.get("triton_enable_empty_final_response") is True
                          or not self.service.decoupled(request))
            async for response, final in self.service.infer_stream(request):
                if isinstance(response, TritonShmError):  # an error is a response of its own (final or not)
                    out.put_nowait(pb.ModelStreamInferResponse(error_message=response.message))
                    continue
                if response is None:
                    if final and flag_final:
                        reply = pb.ModelInferResponse(model_name=request.model_name,
                                                      model_version=request.model_version, id=request.id)
                        reply.parameters["triton_final_response"].bool_param = True
                        out.put_nowait(pb.ModelStreamInferResponse(infer_response=reply))
                    continue
                try:
                    reply = encode_infer_response(response)
                finally:
                    response.release()
                if flag_final:
                    reply.parameters["triton_final_response"].bool_param = final
                out.put_nowait(pb.ModelStreamInferResponse(infer_response=reply))
        except TritonShmError as e:
            out.put_nowait(pb.ModelStreamInferResponse(error_message=e.message))
        except Exception as e:  # noqa: BLE001 - the stream must get an answer
            log.exception("stream request failed")
            out.put_nowait(pb.ModelStreamInferResponse(error_message=f"{type(e).__name__}: {e}"))

    # -- trace and logging extensions -------------------------------------------------------
    @_rpc
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: _Ctx) -> pb.TraceSettingResponse:
        log.debug("gRPC request: TraceSetting model '%s'", request.model_name)
        if request.settings:
            changes: dict[str, Any] = {}
            for key, setting in request.settings.items():
                values = list(setting.value)  # no value: clear the setting (tritonclient's None)
                changes[key] = (None if not values else values if key == "trace_level"
                                else values[0] if len(values) == 1 else values)
            current = self.service.update_trace_settings(request.model_name, changes)
        else:
            current = self.service.trace_settings(request.model_name)
        resp = pb.TraceSettingResponse()
        for key, value in current.items():
            resp.settings[key].value.extend(value if isinstance(value, list) else [value])
        return resp

    @_rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: _Ctx) -> pb.LogSettingsResponse:
        log.debug("gRPC request: LogSettings")
        if request.settings:
            changes = {key: (getattr(setting, which) if (which := setting.WhichOneof("parameter_choice")) else None)
                       for key, setting in request.settings.items()}
            current = self.service.update_log_settings(changes)
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


def health_handler(service: "InferenceService") -> grpc.GenericRpcHandler:
    async def check(request: bytes, context: _Ctx) -> bytes:
        try:
            return _SERVING if service.ready() else _NOT_SERVING
        except Exception:  # noqa: BLE001 - health must answer, not crash
            log.exception("health check failed")
            return _NOT_SERVING

    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=None, response_serializer=None),
    })
