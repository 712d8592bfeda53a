"""Device-resident tensors in GPU Python models: with ``FORCE_CPU_ONLY_INPUT_TENSORS: "no"``
an input in a client's CUDA shared memory arrives on the GPU (a copy of its own, or the
region itself with ``SHM_INPUTS_IN_PLACE``), Triton's DLPack idioms with torch and CuPy
keep tensors on the GPU both ways, and an output bound for CUDA shared memory is written
device to device. Every test needs a CUDA device and CuPy (torch too, where it says so) and
is skipped with the reason without them; the host side of the same idioms is
tests/test_dlpack.py."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from .harness import ServerProcess
from .helpers import client_module
from .models import write_model
from .test_gpu import DeviceBuffer, _missing

pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")

# OUTPUT0 = 2 * INPUT0 where the input lies; WHERE says where that was ("gpu" or "cpu").
# With WRITE_INPUT the model also adds 1 to its input array (its own copy: the client's
# buffer must not change).
CUPY_WHERE_PY = """
import cupy as cp
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if x.is_cpu():
                y, where = cp.asarray(x.as_numpy()) * 2, b"cpu"
            else:
                dev = cp.from_dlpack(x)
                y, where = dev * 2, b"gpu"
                if "write" in request.parameters():
                    dev += 1
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", y),
                pb_utils.Tensor("WHERE", np.array([where], dtype=np.object_))]))
        return out
"""

# Triton's documented torch idiom, on the GPU: from_dlpack(to_dlpack()) in, a CUDA capsule out.
TORCH_WHERE_PY = """
import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            t = torch.utils.dlpack.from_dlpack(x.to_dlpack())
            where = b"gpu" if t.is_cuda else b"cpu"
            y = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(t.cuda() * 2))
            assert not y.is_cpu()
            out.append(pb_utils.InferenceResponse([y, pb_utils.Tensor("WHERE", np.array([where], dtype=np.object_))]))
        return out
"""

# Keeps its input (lent in place from the client's region) past the request when asked
# ("keep"), and answers from what it kept when asked ("replay"): after the client has
# unregistered the region, the kept array must still read the bytes it was lent.
KEEP_PY = """
import cupy as cp
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.kept = None

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            params = request.parameters()
            if "keep" in params:
                self.kept = cp.from_dlpack(x)
            y = self.kept * 2 if "replay" in params else cp.from_dlpack(x) * 2
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", y),
                pb_utils.Tensor("WHERE", np.array([b"gpu" if not x.is_cpu() else b"cpu"], dtype=np.object_))]))
        return out
"""

# The output comes out of a long chain of kernels on torch's current stream, handed back
# without a synchronisation: the server's copy into CUDA shared memory must wait for it.
TORCH_SLOW_PY = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}")

    def execute(self, requests):
        out = []
        for request in requests:
            x = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0")).to(self.device)
            y = x
            for _ in range(200):
                y = y * 1.0 + 0.0
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", y * 2),
                pb_utils.Tensor("WHERE", np.array([b"gpu"], dtype=np.object_))]))
        return out
"""

# Triton's device idiom in initialize, and what this instance's process says is current.
DEVICE_ID_PY = """
import os
import cupy as cp
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.id = int(args["model_instance_device_id"])
        self.device = torch.device(f"cuda:{self.id}")
        torch.zeros(1, device=self.device)
        cp.cuda.Device(self.id).use()
        self.seen = [torch.cuda.current_device(), cp.cuda.runtime.getDevice()]

    def execute(self, requests):
        now = [torch.cuda.current_device(), cp.cuda.runtime.getDevice()]
        text = f"{self.id} {self.seen} {now} {os.environ.get('CUDA_VISIBLE_DEVICES')}".encode()
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x),
                                            pb_utils.Tensor("WHERE", np.array([text], dtype=np.object_))])
                for _ in requests]
"""

_IO = """
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]
    instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
"""


def _parameters(**values: str) -> str:
    return "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("gpu_inputs")
    repo = root / "models"
    device = {"FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
    for name, params, source in [
            ("cupy_default", {}, CUPY_WHERE_PY),
            ("cupy_device", device, CUPY_WHERE_PY),
            ("cupy_in_place", {**device, "SHM_INPUTS_IN_PLACE": "yes"}, CUPY_WHERE_PY),
            ("torch_device", device, TORCH_WHERE_PY),
            ("torch_default", {}, TORCH_WHERE_PY),
            ("cupy_keep", {**device, "SHM_INPUTS_IN_PLACE": "yes"}, KEEP_PY),
            ("torch_slow", device, TORCH_SLOW_PY),
            ("device_id", {}, DEVICE_ID_PY)]:
        write_model(repo, name, config=f'name: "{name}"\nbackend: "python"\n{_IO}\n{_parameters(**params)}',
                    model_py=source)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true", "--gpus", "0"]).start()
    yield srv
    srv.stop_cleanly()


def _infer(proto: str, cl, model: str, values: np.ndarray, tag: str, *, shm_in: bool = True,
           shm_out: bool = True, parameters: dict | None = None) -> tuple[np.ndarray, str, DeviceBuffer]:
    """OUTPUT0 (read from the device buffer when it went there), WHERE, and the input buffer."""
    mod = client_module(proto)
    src, dst = DeviceBuffer(values.nbytes), DeviceBuffer(values.nbytes)
    src.put(values)
    names = []
    inp = mod.InferInput("INPUT0", list(values.shape), "FP32")
    if shm_in:
        cl.register_cuda_shared_memory(f"{tag}_in", src.raw_handle, 0, values.nbytes)
        names.append(f"{tag}_in")
        inp.set_shared_memory(f"{tag}_in", values.nbytes)
    else:
        inp.set_data_from_numpy(values)
    out = mod.InferRequestedOutput("OUTPUT0")
    if shm_out:
        cl.register_cuda_shared_memory(f"{tag}_out", dst.raw_handle, 0, values.nbytes)
        names.append(f"{tag}_out")
        out.set_shared_memory(f"{tag}_out", values.nbytes)
    try:
        result = cl.infer(model, [inp], outputs=[out, mod.InferRequestedOutput("WHERE")], parameters=parameters)
        where = result.as_numpy("WHERE")[0].decode()
        got = dst.get(np.float32, values.size) if shm_out else result.as_numpy("OUTPUT0")
        return got, where, src
    finally:
        for name in names:
            cl.unregister_cuda_shared_memory(name)


@pytest.mark.parametrize("model", ["cupy_device", "cupy_in_place"])
def test_cuda_shm_input_arrives_on_the_gpu(proto, client, model):
    values = np.arange(1 << 16, dtype=np.float32)
    for shm_out in (True, False):
        got, where, _ = _infer(proto, client, model, values, f"dev_{model}_{proto}_{shm_out}", shm_out=shm_out)
        assert where == "gpu"
        np.testing.assert_array_equal(got, values * 2)


@pytest.mark.parametrize("model, shm_in", [
    ("cupy_default", True),   # Triton's default, FORCE_CPU_ONLY_INPUT_TENSORS "yes": copied to the host
    ("cupy_device", False),   # an in-band input is on the host already
])
def test_other_inputs_arrive_on_the_host(proto, client, model, shm_in):
    values = np.arange(4096, dtype=np.float32)
    got, where, _ = _infer(proto, client, model, values, f"host_{model}_{proto}", shm_in=shm_in)
    assert where == "cpu"
    np.testing.assert_array_equal(got, values * 2)


def test_a_model_writing_its_device_input_leaves_the_client_buffer_alone(proto, client):
    values = np.arange(1024, dtype=np.float32)
    got, where, src = _infer(proto, client, "cupy_device", values, f"wr_{proto}", parameters={"write": 1})
    assert where == "gpu"
    np.testing.assert_array_equal(got, values * 2)
    np.testing.assert_array_equal(src.get(np.float32, values.size), values)


@needs_torch
def test_torch_dlpack_idiom_on_the_gpu(proto, client):
    """torch.utils.dlpack.from_dlpack(input.to_dlpack()) is a CUDA tensor for a device
    input, a host one otherwise; a CUDA capsule handed to Tensor.from_dlpack stays on the GPU
    (written device to device into CUDA shm, copied to the host once otherwise)."""
    values = np.arange(8192, dtype=np.float32)
    got, where, _ = _infer(proto, client, "torch_device", values, f"td_{proto}")
    assert where == "gpu"
    np.testing.assert_array_equal(got, values * 2)
    for shm_out in (False, True):
        got, where, _ = _infer(proto, client, "torch_default", values, f"tc_{proto}_{shm_out}", shm_in=False,
                               shm_out=shm_out)
        assert where == "cpu"
        np.testing.assert_array_equal(got, values * 2)


def test_a_kept_device_input_outlives_the_unregistration_of_its_region(proto, client):
    """The model keeps its input, a view of the client's CUDA region; the client unregisters
    the region (keeping its buffer); the kept array still reads the bytes, and the worker's
    CUDA context serves on (an IPC handle closed under the view would fault it for good)."""
    values = np.arange(4096, dtype=np.float32)
    got, where, src = _infer(proto, client, "cupy_keep", values, f"keep_{proto}", parameters={"keep": 1})
    assert where == "gpu"
    np.testing.assert_array_equal(got, values * 2)
    assert (client.get_cuda_shared_memory_status() if proto == "http"
            else list(client.get_cuda_shared_memory_status().regions)) == []
    other = np.full(8, 5, dtype=np.float32)
    got, _, _ = _infer(proto, client, "cupy_keep", other, f"replay_{proto}", shm_in=False, shm_out=False,
                       parameters={"replay": 1})
    np.testing.assert_array_equal(got, values * 2)
    got, _, _ = _infer(proto, client, "cupy_keep", other, f"after_{proto}")
    np.testing.assert_array_equal(got, other * 2)
    del src


@needs_torch
def test_an_output_still_being_computed_is_copied_after_it_is_done(proto, client):
    values = np.arange(1 << 20, dtype=np.float32)
    for i in range(3):
        got, where, _ = _infer(proto, client, "torch_slow", values, f"slow_{proto}_{i}")
        assert where == "gpu"
        np.testing.assert_array_equal(got, values * 2)


@needs_torch
def test_triton_device_idiom_names_the_instances_gpu(proto, client):
    """``torch.device(f"cuda:{args['model_instance_device_id']}")`` works in the instance's
    process, and that GPU is current there for torch and CuPy, in initialize and execute."""
    _, text, _ = _infer(proto, client, "device_id", np.ones(4, np.float32), f"devid_{proto}", shm_in=False,
                        shm_out=False)
    device_id, rest = text.split(" ", 1)
    assert device_id == "0"
    assert rest.startswith("[0, 0] [0, 0] "), text
    server_sees = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert rest.endswith(f" {server_sees}"), text  # the server's devices, not a mask of one
