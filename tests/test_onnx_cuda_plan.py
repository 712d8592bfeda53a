"""ONNX Runtime on CUDA, the part that runs without a GPU: which execution providers an
instance gets and which IOBinding calls a request makes (``plan_binding``). The bound run
itself needs onnxruntime-gpu and a GPU (not on the project's GPU machine yet); there, a GPU
server with an onnxruntime that has no CUDA provider fails the ONNX model with the reason
and serves the rest."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_shm.backends.base import InstanceSpec
from triton_shm.backends.onnxruntime import BindStep, execution_providers, plan_binding
from triton_shm.errors import Unavailable

from .harness import ServerProcess
from .helpers import assert_serving
from .models import add_sub_onnx_model, python_identity
from .test_gpu import _missing

GPU = InstanceSpec("m_0_0", "KIND_GPU", 0)
CPU = InstanceSpec("m_0", "KIND_CPU", 0)


def test_providers():
    assert execution_providers(CPU, "m", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        "CPUExecutionProvider"]
    assert execution_providers(GPU, "m", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        ("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    with pytest.raises(Unavailable) as info:
        execution_providers(GPU, "m", ["CPUExecutionProvider"])
    assert info.value.message == ("instance 'm_0_0' of model 'm' is KIND_GPU, but this onnxruntime has no CUDA "
                                  "execution provider (pip install onnxruntime-gpu)")


class DeviceBuffer:
    """A CUDA buffer as CuPy and torch describe theirs (``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr, "version": 3}


def test_host_inputs_are_bound_as_cpu_inputs_and_outputs_on_the_device():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]  # not contiguous: bound as a contiguous copy
    steps = plan_binding({"x": x}, ["y", "z"], set())
    assert [(s.kind, s.name) for s in steps] == [("cpu_input", "x"), ("device_output", "y"), ("device_output", "z")]
    assert steps[0].array.flags.c_contiguous
    np.testing.assert_array_equal(steps[0].array, x)


def test_device_inputs_are_bound_by_address():
    (step, out) = plan_binding({"x": DeviceBuffer(0x7F0000001000, (4, 8), "<f2")}, ["y"], set())
    assert step == BindStep("device_input", "x", step.array, 0x7F0000001000, np.dtype(np.float16), (4, 8))
    assert out == BindStep("device_output", "y")


def test_strings_run_without_binding():
    assert plan_binding({"s": np.array([b"a"], dtype=object)}, ["y"], set()) is None
    assert plan_binding({"x": np.zeros(2, np.float32)}, ["label"], {"label"}) is None
    assert plan_binding({"x": np.zeros(2, np.float32)}, ["y"], {"label"}) is not None  # label not asked


def _no_cuda_provider_reason() -> str | None:
    if importlib.util.find_spec("onnxruntime") is None:
        return "onnxruntime is not installed"
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return "this onnxruntime has the CUDA execution provider (the model would load)"
    missing = _missing()
    return None if missing is None else f"needs a GPU server: {missing}"


@pytest.mark.skipif(_no_cuda_provider_reason() is not None, reason=_no_cuda_provider_reason() or "")
def test_gpu_server_without_the_cuda_provider_fails_the_onnx_model(tmp_path):
    """add_sub's KIND_AUTO instance becomes KIND_GPU on a GPU server; an onnxruntime without
    the CUDA provider cannot run it: UNAVAILABLE with the reason, the Python model serves."""
    repo = tmp_path / "models"
    add_sub_onnx_model(repo)
    python_identity(repo, "identity_fp32", "FP32")
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--exit-on-error=false", "--gpus", "0"])
    srv.start(wait_ready=False)
    try:
        srv.wait_repository_loaded()
        cl = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in cl.get_model_repository_index()}
        assert index["add_sub"]["state"] == "UNAVAILABLE"
        assert ("instance 'add_sub_0_0' of model 'add_sub' is KIND_GPU, but this onnxruntime has no CUDA "
                "execution provider (pip install onnxruntime-gpu)") in index["add_sub"]["reason"], index["add_sub"]
        assert index["identity_fp32"]["state"] == "READY"
        cl.close()
        assert_serving(srv)
    finally:
        srv.stop_cleanly()
