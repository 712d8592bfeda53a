"""CUDA shared memory and GPU tensors on the CPU side: what a server that runs no GPU
(``--gpus none``, also where one is visible) answers (end to end, real server, real
tritonclient), and the logic that does not need a device (region registry, device naming,
the lazy CuPy boundary, GPU tensors in pb_utils). The device half of the story is
tests/test_gpu.py."""
from __future__ import annotations

import base64
import ctypes.util
import gc
import importlib.util
import json
import threading
import types
import urllib.error
import urllib.request

import numpy as np
import pytest

from triton_shm.backends.python import triton_python_backend_utils as pb_utils
from triton_shm.cluster.share import keeps_shared_state
from triton_shm.core.data.shm_registry import NO_GPU_MESSAGE, SharedMemoryRegistry
from triton_shm.core.models.config import mc
from triton_shm.devices import visible_device, worker_environment
from triton_shm.errors import AlreadyExists, Internal, InvalidArgument, NotFound, Unsupported
from triton_shm.supervisor.handle import WorkerHandle
from triton_shm.supervisor.pool import runs_in_own_process
from triton_shm.worker import cuda

from .conftest import build_core_repository
from .harness import ServerProcess
from .helpers import assert_serving, connect, expect_error

HANDLE = bytes(range(64))  # the size of a cudaIpcMemHandle_t; never opened on a CPU-only server
B64_HANDLE = base64.b64encode(HANDLE)  # as tritonclient.utils.cuda_shared_memory.get_raw_handle gives it
HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("cuda_shm_cpu")
    repo = build_core_repository(root / "models")
    # --gpus none: a server that runs no GPU, on a machine with one too (it would serve every
    # visible GPU, open the handles below and place add_sub on a GPU otherwise)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true", "--gpus", "none"]).start()
    yield srv
    srv.stop_cleanly()


# =========================================================================== a CPU-only server

def test_cpu_server_refuses_cuda_registration(proto, server):
    cl = connect(server, proto)
    try:
        expect_error(proto, lambda: cl.register_cuda_shared_memory("gpu_region", B64_HANDLE, 0, 64),
                     "INVALID_ARGUMENT",
                     f"failed to register CUDA shared memory region 'gpu_region': {NO_GPU_MESSAGE}")
        status = cl.get_cuda_shared_memory_status()
        assert (status if proto == "http" else list(status.regions)) == []
        expect_error(proto, lambda: cl.get_cuda_shared_memory_status("gpu_region"), "NOT_FOUND",
                     "Unable to find cuda shared memory region: 'gpu_region'")
        cl.unregister_cuda_shared_memory("gpu_region")  # unknown names are not an error, as Triton
        cl.unregister_cuda_shared_memory()
        # listed all the same, as Triton lists it without a GPU: registering is what fails
        assert "cuda_shared_memory" in (cl.get_server_metadata()["extensions"] if proto == "http"
                                        else list(cl.get_server_metadata().extensions))
    finally:
        cl.close()
    assert_serving(server)  # CPU models are served as before


@pytest.mark.parametrize("body, message", [
    ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64},
     "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ({"raw_handle": {"b64": base64.b64encode(b"short").decode()}, "device_id": 0, "byte_size": 64},
     "'raw_handle' must be a 64-byte cudaIpcMemHandle_t, got 5 bytes"),
    ({"raw_handle": "bare string", "device_id": 0, "byte_size": 64},
     "'raw_handle' must be an object with a base64 'b64' string"),
])
def test_malformed_cuda_registration_is_a_clear_400(server, body, message):
    req = urllib.request.Request(f"http://{server.http_url}/v2/cudasharedmemory/region/bad/register",
                                 data=json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 400
    assert json.loads(info.value.read()) == {"error": message}


# =========================================================================== the registry

def _registry(gpus=(0,)) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(True, list(gpus))


def test_registry_lists_cuda_regions_by_kind_and_shares_names():
    reg = _registry([0, 1])
    closed = []
    reg.on_close = closed.append
    region = reg.prepare_cuda("c", base64.b64encode(HANDLE).decode(), 1, 4096)
    assert reg.status("cuda") == []  # listed only once the worker opened the handle
    reg.add_cuda(region)
    assert (region.kind, region.raw_handle, region.fd) == ("cuda", HANDLE, -1)
    assert reg.status("cuda") == [{"name": "c", "device_id": 1, "byte_size": 4096}]
    assert reg.status("cuda", "c") == [{"name": "c", "device_id": 1, "byte_size": 4096}]
    assert reg.status("system") == []
    # what another front-end process (or a restarted one) registers: the same region again
    again = _registry([0, 1]).prepare_cuda(**reg.cuda_registrations()[0])
    assert (again.name, again.raw_handle, again.device_id, again.byte_size) == ("c", HANDLE, 1, 4096)
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'c'"):
        reg.status("system", "c")
    with pytest.raises(AlreadyExists, match="shared memory region 'c' already in manager"):
        reg.prepare_cuda("c", HANDLE, 0, 64)
    reg.unregister("system")  # the other kind's unregister-all leaves it
    assert [r["name"] for r in reg.status("cuda")] == ["c"]
    held = reg.acquire("c")
    reg.unregister("cuda", "c")
    assert [r["name"] for r in reg.status("cuda")] == ["c"] and closed == []  # a request still uses it
    reg.release(held)
    assert reg.status("cuda") == [] and closed == [region]


def test_registry_add_cuda_loses_to_a_registration_meanwhile():
    reg = _registry()
    first, second = reg.prepare_cuda("same", HANDLE, 0, 64), reg.prepare_cuda("same", HANDLE, 0, 64)
    reg.add_cuda(first)
    with pytest.raises(AlreadyExists):
        reg.add_cuda(second)


@pytest.mark.parametrize("device_id", [2, -1, True, "0"])
def test_registry_refuses_a_gpu_it_does_not_run(device_id):
    with pytest.raises(InvalidArgument, match=r"is not a GPU this server runs \(it runs \[0, 1\]\)"):
        _registry([0, 1]).prepare_cuda("c", HANDLE, device_id, 64)


def test_registry_without_gpu_and_disabled():
    with pytest.raises(InvalidArgument, match="this server runs no GPU"):
        _registry([]).prepare_cuda("c", HANDLE, 0, 64)
    with pytest.raises(Unsupported, match="--allow-client-shm=true"):
        SharedMemoryRegistry(False, [0]).prepare_cuda("c", HANDLE, 0, 64)
    with pytest.raises(InvalidArgument, match="'byte_size' must be a non-negative 64-bit integer"):
        _registry().prepare_cuda("c", HANDLE, 0, -5)


# =========================================================================== devices

@pytest.mark.parametrize("gpu, parent, expected", [
    (0, None, "0"), (1, "", "1"), (1, "4,6", "6"), (0, "GPU-abc, GPU-def", "GPU-abc"), (3, "4,6", "3"),
])
def test_gpu_worker_sees_the_device_the_server_names(gpu, parent, expected):
    assert visible_device(gpu, parent) == expected


def test_cuda_ordinal_inside_each_worker():
    assert WorkerHandle("cpu", None).cuda_ordinal(3) == 3  # the CPU worker sees every device
    assert WorkerHandle("gpu1", 1).cuda_ordinal(1) == 0  # a GPU worker sees only its own
    with pytest.raises(InvalidArgument, match="CUDA shared memory on GPU 0 cannot be used by a model "
                                              "instance on GPU 1"):
        WorkerHandle("gpu1", 1).cuda_ordinal(0)


def test_a_python_instance_process_sees_the_servers_gpus():
    """Triton's idiom ``torch.device(f"cuda:{args['model_instance_device_id']}")`` needs the id
    to name a device in the instance's process: an instance process on server GPU 3 of four
    keeps the server's CUDA_VISIBLE_DEVICES (id 3 is cuda:3 there), and its CUDA regions are
    opened by the server's ordinal; a shared GPU worker still sees its one device."""
    instance = WorkerHandle("python_0_3@m/1#1", 3, sees_all_gpus=True)
    assert instance.cuda_ordinal(3) == 3 and instance.cuda_ordinal(1) == 1
    parent = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "HOME": "/h"}
    assert worker_environment(parent, None) == parent  # the instance process: as the server
    assert worker_environment(parent, 3) == {"CUDA_VISIBLE_DEVICES": "7", "HOME": "/h"}  # GPU 3's worker
    assert worker_environment({}, 2) == {"CUDA_VISIBLE_DEVICES": "2"}


@pytest.mark.parametrize("kind, per_instance, own", [
    ("KIND_GPU", "no", True),   # whatever PROCESS_PER_INSTANCE says: the shared GPU worker sees cuda:0 only
    ("KIND_GPU", None, True),
    ("KIND_CPU", "no", False),
    ("KIND_CPU", None, True),
])
def test_kind_gpu_python_instances_run_in_a_process_of_their_own(kind, per_instance, own):
    config = mc.ModelConfig(name="m", backend="python")
    config.instance_group.add(kind=mc.ModelInstanceGroup.Kind.Value(kind), count=2,
                              gpus=[1] if kind == "KIND_GPU" else [])
    if per_instance is not None:
        config.parameters["PROCESS_PER_INSTANCE"].string_value = per_instance
    assert runs_in_own_process(config, kind) is own
    # a GPU model in a shared GPU worker keeps one owner among front-end processes; its own
    # processes are split like any instance process
    assert keeps_shared_state(config) is (kind == "KIND_GPU" and not own)
    onnx = mc.ModelConfig(name="o", backend="onnxruntime")
    assert not runs_in_own_process(onnx, kind)


def test_use_device_without_a_driver_is_a_clear_error():
    if ctypes.util.find_library("cuda"):
        pytest.skip("a CUDA driver is installed here")
    with pytest.raises(Unsupported, match=r"a KIND_GPU instance needs the CUDA driver \(libcuda.so.1\)"):
        cuda.use_device(1)


# =========================================================================== IPC mapping lifetime

def test_cuda_mapping_outlives_its_region_while_a_lent_view_lives():
    """An input lent in place from a CUDA region holds the region's IPC mapping: unregistering
    the region closes the mapping only once the model has let go of it (closing it under a
    kept array would make its next read an illegal address, breaking the CUDA context)."""
    closed: list[tuple[int, int]] = []
    region = cuda.CudaRegion(cuda.IpcMapping(0x7000, 1, close=lambda ptr, dev: closed.append((ptr, dev))), 256)
    span = region.view(64, 32)
    assert (span.ptr, span.nbytes, span.device) == (0x7000 + 64, 32, 1)
    kept = span.owner  # what a CuPy view over the span holds (UnownedMemory's owner)
    del span
    region.close()
    gc.collect()
    assert closed == []  # the kept input still reads valid memory
    with pytest.raises(Internal, match="used after it was dropped"):
        region.view(0, 8)
    del kept
    gc.collect()
    assert closed == [(0x7000, 1)]  # closed once, by the last holder


def test_cuda_mapping_closes_at_once_when_nothing_holds_it():
    closed: list[int] = []
    region = cuda.CudaRegion(cuda.IpcMapping(0x9000, 0, close=lambda ptr, dev: closed.append(ptr)), 64)
    with pytest.raises(InvalidArgument, match="outside its registered region"):
        region.view(60, 8)
    region.close()
    gc.collect()
    assert closed == [0x9000]


# =========================================================================== copy ordering

class _Stream:
    def __init__(self, log: list, name: str):
        self.log, self.name, self.ptr = log, name, id(self)

    def synchronize(self):
        self.log.append(("synchronize", self.name))

    def wait_event(self, event):
        self.log.append(("wait", self.name, event))

    def record(self):
        self.log.append(("record", self.name))
        return f"event@{self.name}"

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", self.name))


class _RecordingCupy:
    """What of CuPy the copies use, recording each call: the test checks their order (every
    copy on the thread's own stream, that stream waited for, never the device)."""

    def __init__(self):
        self.log: list = []
        log = self.log
        streams = {}
        null = _Stream(log, "legacy")

        class _Array:
            def __init__(self, nbytes: int, device: int = 0):
                self.nbytes, self.data = nbytes, types.SimpleNamespace(ptr=0x100000 + nbytes)
                self.flags = types.SimpleNamespace(c_contiguous=True)
                self.device = types.SimpleNamespace(id=device)

        def make_stream(non_blocking=False):
            assert non_blocking, "the copy stream must not wait for the legacy default stream"
            stream = _Stream(log, f"copy{len(streams)}")
            streams[stream.name] = stream
            return stream

        class _Device:
            def __init__(self, device=0):
                self.device = device

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def synchronize(self):
                log.append(("device synchronize",))

        runtime = types.SimpleNamespace(
            memcpyAsync=lambda dst, src, n, kind, stream: log.append(("copy", kind, n, stream)),
            memcpy=lambda *a: log.append(("blocking copy",)))
        make_stream.null = null  # type: ignore[attr-defined]
        self.cuda = types.SimpleNamespace(Device=_Device, runtime=runtime, Stream=make_stream,
                                          get_current_stream=lambda: null)
        self.ndarray, self.uint8 = _Array, "uint8"
        self.empty = lambda n, dtype=None: _Array(n if isinstance(n, int) else 0)
        self.from_dlpack = lambda obj: (log.append(("from_dlpack",)), _Array(obj.nbytes))[1]
        self.streams, self.null = streams, null


@pytest.fixture
def recording_cupy(monkeypatch):
    fake = _RecordingCupy()
    monkeypatch.setattr(cuda, "cupy", lambda: fake)
    monkeypatch.setattr(cuda, "_streams", threading.local())  # a fresh copy stream per test
    return fake


def _copies_then_sync(fake: _RecordingCupy) -> None:
    """Every copy on the thread's one copy stream, that stream waited for last, and neither
    a copy on the legacy stream nor a wait for the whole device."""
    log = fake.log
    (stream,) = fake.streams.values()
    assert {e[3] for e in log if e[0] == "copy"} == {stream.ptr}, log
    assert log[-1] == ("synchronize", stream.name), log
    assert not any(e[0] in ("blocking copy", "device synchronize") for e in log), log


def test_a_batch_joined_on_the_gpu_is_complete_when_the_backend_gets_it(recording_cupy):
    spans = [cuda.DeviceSpan(0x1000, 64, 0), memoryview(bytearray(32)), cuda.DeviceSpan(0x2000, 0, 0)]
    out = cuda.gather_device(spans, 0)
    assert out.nbytes == 96
    log = recording_cupy.log
    assert [e[:3] for e in log if e[0] == "copy"] == [("copy", 3, 64), ("copy", 1, 32)]  # D2D, H2D; none empty
    _copies_then_sync(recording_cupy)


def test_a_host_output_is_in_the_clients_cuda_region_before_the_reply(recording_cupy):
    cuda.DeviceSpan(0x1000, 64, 0).write_host(b"x" * 48)
    log = recording_cupy.log
    assert [e[:3] for e in log if e[0] == "copy"] == [("copy", 1, 48)]
    _copies_then_sync(recording_cupy)


def test_a_device_output_waits_for_its_producer_not_the_device(recording_cupy):
    class _Torch:  # a DLPack producer that is not CuPy
        nbytes = 40

        def __dlpack_device__(self):
            return (2, 0)

    assert cuda.DeviceSpan(0x1000, 64, 0).write_device(_Torch()) == 40
    log = recording_cupy.log
    (copy_name,) = recording_cupy.streams
    imported = log.index(("from_dlpack",))
    waited = log.index(("wait", copy_name, "event@legacy"))  # ordered after the producer's stream
    copied = next(i for i, e in enumerate(log) if e[0] == "copy")
    assert imported < waited < copied, log
    _copies_then_sync(recording_cupy)
    with pytest.raises(InvalidArgument, match="do not fit"):
        cuda.DeviceSpan(0x1000, 8, 0).write_device(_Torch())


def test_each_thread_copies_on_its_own_stream(recording_cupy):
    first = cuda.copy_stream(0)
    assert cuda.copy_stream(0) is first
    other: list = []
    t = threading.Thread(target=lambda: other.append(cuda.copy_stream(0)))
    t.start()
    t.join()
    assert other[0] is not first


# =========================================================================== without CuPy

class _CudaTensor:
    """An object that says, by the DLPack protocol, that it lives on CUDA device 0."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, *args, **kwargs):
        raise BufferError("not exportable here")


def test_device_arrays_are_recognised_without_cupy():
    assert cuda.is_device_array(_CudaTensor())
    assert not cuda.is_device_array(np.zeros(3))
    assert not cuda.is_device_array(b"bytes")


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the missing-CuPy message cannot show")
def test_missing_cupy_is_a_clear_error():
    with pytest.raises(Unsupported, match=r"CUDA shared memory needs a GPU and CuPy \(pip install "
                                          r"'triton-shm\[gpu\]'\)"):
        cuda.CudaRegion.open(HANDLE, 0, 64)
    with pytest.raises(pb_utils.TritonModelException,
                       match=r"Tensor 'x' is on the GPU: CUDA shared memory needs a GPU and CuPy"):
        pb_utils.Tensor.from_dlpack("x", _CudaTensor())


def test_cpu_tensors_stay_as_they_were():
    t = pb_utils.Tensor.from_dlpack("x", np.arange(4, dtype=np.float32))
    assert t.is_cpu() and t.device_array() is None and t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4, dtype=np.float32))
