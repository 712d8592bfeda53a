"""The two protocols behind one small async interface.

The control plane (health, metadata, config, statistics, system and CUDA shared-memory
registration) goes through ``tritonclient.grpc.aio`` / ``tritonclient.http.aio``. The hot
path sends a request built once (a serialized ``ModelInferRequest`` sent by
:mod:`.grpc_h2`, or the bytes of an HTTP request with the binary tensor extension sent by
:mod:`.http1`) so that the client spends as little CPU per request as it can, as
perf_analyzer does. The gRPC stream (``--streaming``) uses grpcio.
"""
from __future__ import annotations

import asyncio
import itertools
import json
from collections import OrderedDict
from typing import Any, NamedTuple

from . import PerfError
from .grpc_h2 import GRPC_UNAVAILABLE, GrpcCallError, GrpcH2Client, H2Error
from .http1 import Http1Client, HttpConnectionError
from .inputs import InputTensor

DEFAULT_TIMEOUT_S = 10.0
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_GRPC_CODES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
               6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
               10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
               15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


class InferError(Exception):
    """One request failed; counted, and reported at the end."""


class ConnectionLost(PerfError):
    """The server stopped answering (went down, or is unreachable) mid-run."""


class StreamingUnsupported(PerfError):
    pass


class PreparedGrpc(NamedTuple):
    """A request built once: the protobuf (for the stream, which tags each copy with an id)
    and its serialized bytes (for unary calls)."""
    message: Any
    wire: bytes


class _Base:
    protocol = ""

    def __init__(self, url: str):
        self.url = url

    def _fail(self, what: str, e: BaseException) -> PerfError:
        msg = str(e).strip() or type(e).__name__
        return PerfError(f"{what}: {msg}")


# ------------------------------------------------------------------------------- gRPC

class GrpcClient(_Base):
    protocol = "grpc"

    def __init__(self, url: str):
        super().__init__(url)
        import grpc  # noqa: F401
        import tritonclient.grpc.aio as grpcaio
        from tritonclient.grpc import service_pb2, service_pb2_grpc
        self._pb = service_pb2
        self._pb_grpc = service_pb2_grpc
        self._opts = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]
        self.ctl = grpcaio.InferenceServerClient(url, channel_args=self._opts)
        self._channel = None  # grpcio's, opened for --streaming only
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise PerfError(f"-u for gRPC is host:port, not {url!r}")
        self._hot = GrpcH2Client(host.strip("[]"), int(port))

    async def _ctl(self, what: str, coro):
        try:
            return await coro
        except Exception as e:  # noqa: BLE001 - InferenceServerException and transport errors alike
            raise self._fail(what, e) from None

    async def server_live(self) -> bool:
        return await self._ctl(f"cannot reach the server at {self.url} (gRPC)",
                               self.ctl.is_server_live(client_timeout=DEFAULT_TIMEOUT_S))

    async def server_metadata(self) -> dict:
        return await self._ctl("server metadata", self.ctl.get_server_metadata(
            as_json=True, client_timeout=DEFAULT_TIMEOUT_S))

    async def model_metadata(self, name: str, version: str) -> dict:
        return await self._ctl(f"model '{name}' is not available on {self.url}", self.ctl.get_model_metadata(
            name, version, as_json=True, client_timeout=DEFAULT_TIMEOUT_S))

    async def model_config(self, name: str, version: str) -> dict:
        r = await self._ctl(f"model '{name}' config", self.ctl.get_model_config(
            name, version, as_json=True, client_timeout=DEFAULT_TIMEOUT_S))
        return r.get("config", r)

    async def statistics(self, name: str, version: str) -> dict:
        try:
            return await self.ctl.get_inference_statistics(name, version, as_json=True,
                                                           client_timeout=DEFAULT_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            raise ConnectionLost(f"statistics request to {self.url} failed: {str(e).strip()}") from None

    async def register_system_shm(self, name: str, key: str, size: int) -> None:
        await self._ctl(f"registering system shared memory '{name}'",
                        self.ctl.register_system_shared_memory(name, key, size, client_timeout=DEFAULT_TIMEOUT_S))

    async def unregister_system_shm(self, name: str) -> None:
        await self._ctl(f"unregistering system shared memory '{name}'",
                        self.ctl.unregister_system_shared_memory(name, client_timeout=DEFAULT_TIMEOUT_S))

    async def register_cuda_shm(self, name: str, raw_handle: str, device_id: int, size: int) -> None:
        """``raw_handle``: the cudaIpcMemHandle_t in base64."""
        await self._ctl(f"registering CUDA shared memory '{name}'", self.ctl.register_cuda_shared_memory(
            name, raw_handle, device_id, size, client_timeout=DEFAULT_TIMEOUT_S))

    async def unregister_cuda_shm(self, name: str) -> None:
        await self._ctl(f"unregistering CUDA shared memory '{name}'",
                        self.ctl.unregister_cuda_shared_memory(name, client_timeout=DEFAULT_TIMEOUT_S))

    def prepare(self, model: str, version: str, tensors: list[InputTensor],
                input_regions: list[tuple[str, int]] | None,
                output_regions: list[tuple[str, str, int]] | None) -> Any:
        req = self._pb.ModelInferRequest(model_name=model, model_version=version)
        for i, t in enumerate(tensors):
            inp = req.inputs.add()
            inp.name, inp.datatype = t.name, t.datatype
            inp.shape.extend(t.shape)
            if input_regions is not None:
                region, size = input_regions[i]
                inp.parameters["shared_memory_region"].string_param = region
                inp.parameters["shared_memory_byte_size"].int64_param = size
            else:
                req.raw_input_contents.append(t.data)
        for out_name, region, size in output_regions or []:
            o = req.outputs.add()
            o.name = out_name
            o.parameters["shared_memory_region"].string_param = region
            o.parameters["shared_memory_byte_size"].int64_param = size
        return PreparedGrpc(req, req.SerializeToString())

    async def infer(self, req: "PreparedGrpc") -> None:
        try:
            await self._hot.unary(MODEL_INFER, req.wire)
        except H2Error as e:
            raise ConnectionLost(f"lost the connection to the server at {self.url} (gRPC: {e})") from None
        except GrpcCallError as e:
            if e.code == GRPC_UNAVAILABLE:
                raise ConnectionLost(f"lost the connection to the server at {self.url} "
                                     f"(gRPC UNAVAILABLE: {e.message})") from None
            raise InferError(f"{_GRPC_CODES.get(e.code, str(e.code))}: {e.message}") from None

    def open_stream(self) -> "GrpcStream":
        import grpc.aio
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=self._opts)
        return GrpcStream(self._pb_grpc.GRPCInferenceServiceStub(self._channel), self._pb, self.url)

    async def close(self) -> None:
        self._hot.close()
        for c in (self.ctl.close(), self._channel.close() if self._channel is not None else None):
            if c is None:
                continue
            try:
                await asyncio.wait_for(c, 5)
            except Exception:  # noqa: BLE001
                pass


def _grpc_error(e: Any, url: str) -> Exception:
    import grpc
    code, details = e.code(), (e.details() or "").strip()
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectionLost(f"lost the connection to the server at {url} (gRPC UNAVAILABLE: {details})")
    return InferError(f"{code.name}: {details}")


class GrpcStream:
    """One bidirectional ModelStreamInfer call shared by all outstanding requests; responses
    are matched to requests by id."""

    def __init__(self, stub: Any, pb: Any, url: str):
        self._pb, self.url = pb, url
        self._call = stub.ModelStreamInfer()
        self._pending: OrderedDict[str, asyncio.Future] = OrderedDict()
        self._ids = itertools.count()
        self._failure: Exception | None = None
        self._write_lock = asyncio.Lock()  # grpc.aio allows one write in flight per call
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def _translate(self, e: Any) -> Exception:
        import grpc
        if isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return StreamingUnsupported(
                f"the server at {self.url} does not support gRPC streaming: ModelStreamInfer answered "
                f"UNIMPLEMENTED ({(e.details() or '').strip()}); run without --streaming")
        if isinstance(e, grpc.aio.AioRpcError):
            return _grpc_error(e, self.url)
        return ConnectionLost(f"the gRPC stream to {self.url} failed: {e}")

    def _fail_all(self, exc: Exception) -> None:
        self._failure = exc
        while self._pending:
            _, fut = self._pending.popitem(last=False)
            if not fut.done():
                fut.set_exception(exc)

    async def _read(self) -> None:
        try:
            async for resp in self._call:
                rid = resp.infer_response.id
                final = resp.infer_response.parameters.get("triton_final_response")
                if final is not None and not final.bool_param and not resp.error_message:
                    continue  # decoupled model: more responses follow; time until the final one
                if rid:
                    fut = self._pending.pop(rid, None)
                elif self._pending:  # an error without an id: the oldest request
                    _, fut = self._pending.popitem(last=False)
                else:
                    fut = None
                if fut is None or fut.done():
                    continue
                if resp.error_message:
                    fut.set_exception(InferError(resp.error_message))
                else:
                    fut.set_result(None)
            self._fail_all(ConnectionLost(f"the server at {self.url} closed the gRPC stream"))
        except asyncio.CancelledError:
            self._fail_all(ConnectionLost("stream closed"))
            raise
        except Exception as e:  # noqa: BLE001
            self._fail_all(self._translate(e))

    async def infer(self, req: "PreparedGrpc") -> None:
        if self._failure is not None:
            raise self._failure
        r = self._pb.ModelInferRequest()
        r.CopyFrom(req.message)
        r.id = str(next(self._ids))
        fut = asyncio.get_running_loop().create_future()
        self._pending[r.id] = fut
        try:
            async with self._write_lock:
                await self._call.write(r)
        except Exception as e:  # noqa: BLE001
            self._pending.pop(r.id, None)
            await asyncio.sleep(0)  # let the reader record the real status
            raise (self._failure or self._translate(e)) from None
        await fut

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._call.done_writing(), 2)
        except Exception:  # noqa: BLE001
            pass
        self._call.cancel()
        self._reader.cancel()
        try:
            await self._reader
        except BaseException:  # noqa: BLE001
            pass


# ------------------------------------------------------------------------------- HTTP

class HttpClient(_Base):
    protocol = "http"

    def __init__(self, url: str):
        super().__init__(url)
        import tritonclient.http.aio as httpaio
        try:
            self._hot = Http1Client(url)
        except ValueError as e:
            raise PerfError(str(e)) from None
        # tritonclient takes host:port only (it fails on a scheme)
        self.ctl = httpaio.InferenceServerClient(self._hot.authority + self._hot.base_path,
                                                 conn_timeout=DEFAULT_TIMEOUT_S)

    async def _ctl(self, what: str, coro):
        try:
            return await coro
        except Exception as e:  # noqa: BLE001
            raise self._fail(what, e) from None

    async def server_live(self) -> bool:
        return await self._ctl(f"cannot reach the server at {self.url} (HTTP)", self.ctl.is_server_live())

    async def server_metadata(self) -> dict:
        return await self._ctl("server metadata", self.ctl.get_server_metadata())

    async def model_metadata(self, name: str, version: str) -> dict:
        return await self._ctl(f"model '{name}' is not available on {self.url}",
                               self.ctl.get_model_metadata(name, version))

    async def model_config(self, name: str, version: str) -> dict:
        return await self._ctl(f"model '{name}' config", self.ctl.get_model_config(name, version))

    async def statistics(self, name: str, version: str) -> dict:
        try:
            return await self.ctl.get_inference_statistics(name, version)
        except Exception as e:  # noqa: BLE001
            raise ConnectionLost(f"statistics request to {self.url} failed: {str(e).strip()}") from None

    async def register_system_shm(self, name: str, key: str, size: int) -> None:
        await self._ctl(f"registering system shared memory '{name}'",
                        self.ctl.register_system_shared_memory(name, key, size))

    async def unregister_system_shm(self, name: str) -> None:
        await self._ctl(f"unregistering system shared memory '{name}'",
                        self.ctl.unregister_system_shared_memory(name))

    async def register_cuda_shm(self, name: str, raw_handle: str, device_id: int, size: int) -> None:
        """``raw_handle``: the cudaIpcMemHandle_t in base64 (sent as ``{"b64": ...}``)."""
        await self._ctl(f"registering CUDA shared memory '{name}'",
                        self.ctl.register_cuda_shared_memory(name, raw_handle, device_id, size))

    async def unregister_cuda_shm(self, name: str) -> None:
        await self._ctl(f"unregistering CUDA shared memory '{name}'",
                        self.ctl.unregister_cuda_shared_memory(name))

    def prepare(self, model: str, version: str, tensors: list[InputTensor],
                input_regions: list[tuple[str, int]] | None,
                output_regions: list[tuple[str, str, int]] | None) -> Any:
        inputs, blobs = [], []
        for i, t in enumerate(tensors):
            d: dict[str, Any] = {"name": t.name, "shape": t.shape, "datatype": t.datatype}
            if input_regions is not None:
                region, size = input_regions[i]
                d["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": size}
            else:
                d["parameters"] = {"binary_data_size": len(t.data)}
                blobs.append(t.data)
            inputs.append(d)
        header: dict[str, Any] = {"inputs": inputs}
        if output_regions:
            header["outputs"] = [{"name": n, "parameters": {"shared_memory_region": r, "shared_memory_byte_size": s}}
                                 for n, r, s in output_regions]
        else:
            header["parameters"] = {"binary_data_output": True}
        head = json.dumps(header, separators=(",", ":")).encode()
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        return self._hot.request_bytes(path, head + b"".join(blobs), headers)

    async def infer(self, req: Any) -> None:
        try:
            status, data = await self._hot.send(req)
        except HttpConnectionError as e:
            raise ConnectionLost(f"lost the connection to the server at {self.url} (HTTP: {e})") from None
        if status != 200:
            try:
                msg = json.loads(data.decode()).get("error") or data.decode()
            except Exception:  # noqa: BLE001
                msg = data[:200].decode(errors="replace")
            raise InferError(f"HTTP {status}: {msg}")

    def open_stream(self):
        raise PerfError("--streaming needs -i grpc")

    async def close(self) -> None:
        self._hot.close()
        try:
            await asyncio.wait_for(self.ctl.close(), 5)
        except Exception:  # noqa: BLE001
            pass


def make_client(protocol: str, url: str) -> GrpcClient | HttpClient:
    return GrpcClient(url) if protocol == "grpc" else HttpClient(url)
