"""CUDA shared memory and GPU tensors on the CPU side: what a server that runs no GPU
(``--gpus none``, also where one is visible) answers (end to end, real server, real
tritonclient), and the logic that does not need a device (region registry, device naming,
the lazy CuPy boundary, GPU tensors in pb_utils). The device half of the story is
tests/test_gpu.py."""
from __future__ import annotations

import base64
import importlib.util
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from triton_shm.backends.python import triton_python_backend_utils as pb_utils
from triton_shm.core.data.shm_registry import NO_GPU_MESSAGE, SharedMemoryRegistry
from triton_shm.devices import visible_device
from triton_shm.errors import AlreadyExists, InvalidArgument, NotFound, Unsupported
from triton_shm.supervisor.handle import WorkerHandle
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
        cuda.CudaRegion(HANDLE, 0, 64)
    with pytest.raises(pb_utils.TritonModelException,
                       match=r"Tensor 'x' is on the GPU: CUDA shared memory needs a GPU and CuPy"):
        pb_utils.Tensor.from_dlpack("x", _CudaTensor())


def test_cpu_tensors_stay_as_they_were():
    t = pb_utils.Tensor.from_dlpack("x", np.arange(4, dtype=np.float32))
    assert t.is_cpu() and t.device_array() is None and t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4, dtype=np.float32))
