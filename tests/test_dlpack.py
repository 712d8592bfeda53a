"""DLPack in Python models, without a GPU: a capsule's device is read from the tensor it
holds (so a CUDA capsule goes the GPU way, never "unsupported device"), a consumed capsule
is a clear error, and Triton's documented torch idiom (``torch.utils.dlpack.to_dlpack`` /
``from_dlpack`` through ``Tensor.to_dlpack`` / ``Tensor.from_dlpack``) serves end to end.
The same idioms on the GPU: tests/test_gpu_inputs.py."""
from __future__ import annotations

import ctypes
import importlib.util

import numpy as np
import pytest

from triton_shm.backends.python import triton_python_backend_utils as pb_utils
from triton_shm.worker.cuda import capsule_device

from .harness import ServerProcess
from .helpers import client_module, connect, expect_error
from .models import write_model

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_CUPY = importlib.util.find_spec("cupy") is not None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_NAME = b"dltensor"  # the capsule keeps a pointer to its name: it must outlive it
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _capsule_on(device_type: int, device_id: int) -> tuple[object, _DLManagedTensor]:
    """A DLPack capsule (DLPack < 1.0 layout) whose tensor claims to lie on the given device,
    as torch's or CuPy's ``to_dlpack`` of a CUDA tensor makes one; the struct must be kept."""
    managed = _DLManagedTensor()
    managed.dl_tensor.device = _DLDevice(device_type, device_id)
    return _capsule_new(ctypes.addressof(managed), _NAME, None), managed


def test_capsule_device_of_host_capsules_both_layouts():
    a = np.arange(6, dtype=np.float32)
    assert capsule_device(a.__dlpack__()) == (1, 0)
    assert capsule_device(a.__dlpack__(max_version=(1, 0))) == (1, 0)  # "dltensor_versioned"


def test_capsule_device_reads_a_cuda_tensors_device():
    capsule, _keep = _capsule_on(2, 3)
    assert capsule_device(capsule) == (2, 3)


def test_consumed_capsule_is_a_clear_error():
    capsule = np.arange(3, dtype=np.float32).__dlpack__()
    assert pb_utils.Tensor.from_dlpack("A", capsule).as_numpy().tolist() == [0, 1, 2]
    assert capsule_device(capsule) is None  # renamed "used_dltensor" by its consumer
    with pytest.raises(pb_utils.TritonModelException, match="consumed only once"):
        pb_utils.Tensor.from_dlpack("B", capsule)


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: a CUDA capsule would be imported, not refused")
def test_cuda_capsule_goes_the_gpu_way():
    """A CUDA capsule is taken as a GPU tensor (here, without CuPy, the GPU path's clear
    message), not handed to numpy as if it lay on the host."""
    capsule, _keep = _capsule_on(2, 0)
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.Tensor.from_dlpack("OUTPUT0", capsule)
    assert "is on the GPU" in str(info.value) and "CuPy" in str(info.value), str(info.value)
    assert "Unsupported device" not in str(info.value)


def test_host_tensor_round_trips_through_its_own_capsule():
    t = pb_utils.Tensor("X", np.arange(4, dtype=np.int64).reshape(2, 2))
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())
    assert back.is_cpu() and back.triton_dtype() == pb_utils.TYPE_INT64
    np.testing.assert_array_equal(back.as_numpy(), [[0, 1], [2, 3]])


# Triton's documented idiom: torch in, torch out, through capsules.
TORCH_DOUBLE_PY = """
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            t = torch.utils.dlpack.from_dlpack(x.to_dlpack())
            capsule = torch.utils.dlpack.to_dlpack(t * 2)
            y = pb_utils.Tensor.from_dlpack("OUTPUT0", capsule)
            if request.parameters() != "{}":  # asked to reuse the consumed capsule
                pb_utils.Tensor.from_dlpack("OUTPUT0", capsule)
            out.append(pb_utils.InferenceResponse([y]))
        return out
"""


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("dlpack")
    write_model(root / "models", "torch_double", config="""
        name: "torch_double"
        backend: "python"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_CPU } ]
        """, model_py=TORCH_DOUBLE_PY)
    srv = ServerProcess(root / "models", root / "server.log").start()
    yield srv
    srv.stop_cleanly()


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (pip install torch)")
def test_torch_dlpack_idiom_serves(proto, torch_server):
    cl = connect(torch_server, proto)
    mod = client_module(proto)
    try:
        x = np.arange(12, dtype=np.float32).reshape(2, 6)
        inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(cl.infer("torch_double", [inp]).as_numpy("OUTPUT0"), x * 2)
        expect_error(proto, lambda: cl.infer("torch_double", [inp], parameters={"reuse": 1}),
                     "INTERNAL", "consumed only once")
        np.testing.assert_array_equal(cl.infer("torch_double", [inp]).as_numpy("OUTPUT0"), x * 2)
    finally:
        cl.close()
