"""GPU end to end: CUDA shared memory through CUDA IPC (client buffers made with CuPy,
and with tritonclient's cuda_shared_memory utilities where they import), GPU tensors in
Python models, one worker per GPU, NVML metrics. Every test needs a CUDA device and CuPy
and is skipped, with the reason, on a machine without them (the CPU side is
tests/test_cuda_shm.py). bench/gpu/run.sh runs this file on a GPU machine."""
from __future__ import annotations

import base64
import importlib.util
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triton_shm.devices import visible_device, visible_gpu_count

from .harness import ServerProcess, children, free_port
from .helpers import connect, expect_error
from .models import python_identity, write_model


def _missing() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'triton-shm[gpu]')"
    if visible_gpu_count() == 0:
        return "no CUDA device is visible"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

# A Python model on the GPU: OUTPUT0 = 2 * INPUT0, computed with CuPy, handed back as a
# GPU tensor through DLPack (so an output bound for CUDA shared memory goes device to device).
CUPY_DOUBLE_PY = """
import cupy as cp
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            y = cp.asarray(x.as_numpy()) * 2
            t = pb_utils.Tensor.from_dlpack("OUTPUT0", y)
            assert not t.is_cpu()
            out.append(pb_utils.InferenceResponse([t]))
        return out
"""


def cupy_double_model(repo: Path) -> None:
    """"cupy_double" on GPU 0 (CUPY_DOUBLE_PY)."""
    write_model(repo, "cupy_double", config="""
        name: "cupy_double"
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
        """, model_py=CUPY_DOUBLE_PY)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("gpu")
    repo = root / "models"
    python_identity(repo, "identity_fp32", "FP32")
    cupy_double_model(repo)
    srv = ServerProcess(repo, root / "server.log",
                        extra_args=["--allow-client-shm=true", "--gpus", "0"]).start()
    yield srv
    srv.stop_cleanly()


class DeviceBuffer:
    """A client's CUDA buffer with its IPC handle (base64, as tritonclient passes it).

    The buffer is its own cudaMalloc (``cupy.cuda.Memory``), not a block of CuPy's memory
    pool: an IPC handle names a whole allocation, and the server maps it from its start,
    so a pool block that begins inside a larger allocation would be read at the wrong place."""

    def __init__(self, nbytes: int):
        import cupy as cp
        self.cp = cp
        self.memory = cp.cuda.Memory(max(nbytes, 1))
        self.array = cp.ndarray(nbytes, dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(self.memory, 0))
        self.array.fill(0)
        self.raw_handle = base64.b64encode(cp.cuda.runtime.ipcGetMemHandle(self.memory.ptr))

    def put(self, values: np.ndarray) -> None:
        self.array[:values.nbytes] = self.cp.asarray(values.reshape(-1).view(np.uint8))

    def get(self, dtype, count: int) -> np.ndarray:
        return self.cp.asnumpy(self.array[:count * np.dtype(dtype).itemsize]).view(dtype)


def _assert_output_in_shared_memory(proto: str, result, name: str, shape: list[int]) -> None:
    """The response lists output ``name`` with its shape and carries none of its data (it went
    to the device buffer). tritonclient's ``as_numpy`` cannot say so: for an output without
    data its HTTP result raises KeyError ('data') and its gRPC result fails to reshape."""
    out = result.get_output(name)
    assert out is not None, name
    if proto == "http":
        assert out["shape"] == shape, out
        assert "data" not in out and "binary_data_size" not in out.get("parameters", {}), out
    else:
        assert list(out.shape) == shape, out
        assert not any(result.get_response().raw_output_contents)


def _infer_in_cuda_shm(proto, cl, model: str, values: np.ndarray, prefix: str) -> np.ndarray:
    mod = __import__(f"tritonclient.{proto}", fromlist=["InferInput"])
    src, dst = DeviceBuffer(values.nbytes), DeviceBuffer(values.nbytes)
    src.put(values)
    cl.register_cuda_shared_memory(f"{prefix}_in", src.raw_handle, 0, values.nbytes)
    cl.register_cuda_shared_memory(f"{prefix}_out", dst.raw_handle, 0, values.nbytes)
    try:
        inp = mod.InferInput("INPUT0", list(values.shape), "FP32")
        inp.set_shared_memory(f"{prefix}_in", values.nbytes)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"{prefix}_out", values.nbytes)
        result = cl.infer(model, [inp], outputs=[out])
        _assert_output_in_shared_memory(proto, result, "OUTPUT0", list(values.shape))
        return dst.get(np.float32, values.size)
    finally:
        cl.unregister_cuda_shared_memory(f"{prefix}_in")
        cl.unregister_cuda_shared_memory(f"{prefix}_out")


def test_cuda_shared_memory_round_trip(proto, server):
    cl = connect(server, proto)
    try:
        values = np.arange(1024, dtype=np.float32)
        got = _infer_in_cuda_shm(proto, cl, "identity_fp32", values, f"rt_{proto}")
        np.testing.assert_array_equal(got, values)
        status = cl.get_cuda_shared_memory_status()
        assert (status if proto == "http" else list(status.regions)) == []
    finally:
        cl.close()


def test_cuda_shared_memory_across_frontend_processes(proto, tmp_path):
    """``--frontend-processes 2``: CUDA regions registered through one process's connection
    serve requests through the other's (every process opens the handle in its own GPU
    worker), for a CPU model and a GPU model, whichever process owns each, and are
    unregistered everywhere through either."""
    from .test_frontend_processes import by_process, whoami
    repo = tmp_path / "models"
    whoami(repo)
    python_identity(repo, "identity_fp32", "FP32")
    cupy_double_model(repo)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--frontend-processes", "2", "--allow-client-shm=true", "--gpus", "0"]).start()
    try:
        (_, a), (_, b) = by_process(srv, proto).items()
        mod = __import__(f"tritonclient.{proto}", fromlist=["InferInput"])
        values = np.arange(256, dtype=np.float32)
        src, dst = DeviceBuffer(values.nbytes), DeviceBuffer(values.nbytes)
        src.put(values)
        a.register_cuda_shared_memory("fe_in", src.raw_handle, 0, values.nbytes)
        a.register_cuda_shared_memory("fe_out", dst.raw_handle, 0, values.nbytes)
        for model, factor in (("identity_fp32", 1), ("cupy_double", 2)):
            inp = mod.InferInput("INPUT0", list(values.shape), "FP32")
            inp.set_shared_memory("fe_in", values.nbytes)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("fe_out", values.nbytes)
            result = b.infer(model, [inp], outputs=[out])
            _assert_output_in_shared_memory(proto, result, "OUTPUT0", list(values.shape))
            np.testing.assert_array_equal(dst.get(np.float32, values.size), values * factor)
        b.unregister_cuda_shared_memory()
        status = a.get_cuda_shared_memory_status()
        assert (status if proto == "http" else list(status.regions)) == []
    finally:
        srv.stop_cleanly()


def test_gpu_python_model_writes_device_to_device(proto, server):
    cl = connect(server, proto)
    try:
        values = np.arange(4096, dtype=np.float32)
        np.testing.assert_array_equal(_infer_in_cuda_shm(proto, cl, "cupy_double", values, f"d2d_{proto}"),
                                      values * 2)
        mod = __import__(f"tritonclient.{proto}", fromlist=["InferInput"])
        inp = mod.InferInput("INPUT0", [3], "FP32")
        inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        np.testing.assert_array_equal(cl.infer("cupy_double", [inp]).as_numpy("OUTPUT0"), [2, 4, 6])
    finally:
        cl.close()


def test_cuda_registration_status_and_errors(proto, server):
    cl = connect(server, proto)
    buf = DeviceBuffer(256)
    try:
        cl.register_cuda_shared_memory("st", buf.raw_handle, 0, 256)
        status = cl.get_cuda_shared_memory_status("st")
        if proto == "http":
            assert status == [{"name": "st", "device_id": 0, "byte_size": 256}]
        else:
            assert (status.regions["st"].device_id, status.regions["st"].byte_size) == (0, 256)
        expect_error(proto, lambda: cl.register_cuda_shared_memory("st", buf.raw_handle, 0, 256),
                     "ALREADY_EXISTS", "shared memory region 'st' already in manager")
        expect_error(proto, lambda: cl.register_cuda_shared_memory("bad", base64.b64encode(bytes(64)), 0, 64),
                     "INVALID_ARGUMENT", "failed to open CUDA IPC memory handle")
        expect_error(proto, lambda: cl.register_cuda_shared_memory("far", buf.raw_handle, 7, 256),
                     "INVALID_ARGUMENT", "device_id 7 is not a GPU this server runs")
        md = cl.get_server_metadata()
        assert "cuda_shared_memory" in (md["extensions"] if proto == "http" else list(md.extensions))
    finally:
        cl.unregister_cuda_shared_memory()
        cl.close()


def test_tritonclient_cuda_shared_memory_utilities(server):
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as e:  # noqa: BLE001 - it needs cuda-python
        pytest.skip(f"tritonclient.utils.cuda_shared_memory does not import here: {e}")
    import tritonclient.http as httpclient
    cl = httpclient.InferenceServerClient(server.http_url)
    values = np.arange(64, dtype=np.float32)
    src = cudashm.create_shared_memory_region("tc_in", values.nbytes, 0)
    dst = cudashm.create_shared_memory_region("tc_out", values.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(src, [values])
        cl.register_cuda_shared_memory("tc_in", cudashm.get_raw_handle(src), 0, values.nbytes)
        cl.register_cuda_shared_memory("tc_out", cudashm.get_raw_handle(dst), 0, values.nbytes)
        inp = httpclient.InferInput("INPUT0", [64], "FP32")
        inp.set_shared_memory("tc_in", values.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out.set_shared_memory("tc_out", values.nbytes)
        result = cl.infer("identity_fp32", [inp], outputs=[out])
        _assert_output_in_shared_memory("http", result, "OUTPUT0", [64])
        # get_contents_as_numpy takes a numpy dtype, not a Triton datatype name
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(dst, np.float32, [64]), values)
    finally:
        cl.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(src)
        cudashm.destroy_shared_memory_region(dst)
        cl.close()


def test_one_worker_per_gpu_and_placement(server):
    import tritonclient.http as httpclient
    cl = httpclient.InferenceServerClient(server.http_url)
    try:
        (group,) = cl.get_model_config("cupy_double")["instance_group"]
        assert (group["kind"], group["gpus"]) == ("KIND_GPU", [0])
    finally:
        cl.close()
    # the shared workers (the CPU's, GPU 0's), and a process per Python instance: cupy_double's
    # sees the server's GPUs, as Triton's stub does (model_instance_device_id names one there),
    # where GPU 0's worker sees only its own
    names = {}
    for pid in children(server.proc.pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        names[args[args.index(b"--name") + 1].decode()] = pid
    assert {"cpu", "gpu0"} <= set(names), names
    (gpu_instance,) = [n for n in names if n.startswith("cupy_double_0_0")]

    def visible(pid: int) -> list[bytes]:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return [e for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
    server_sees = os.environ.get("CUDA_VISIBLE_DEVICES")
    as_server = [] if server_sees is None else [f"CUDA_VISIBLE_DEVICES={server_sees}".encode()]
    assert visible(names[gpu_instance]) == as_server
    assert visible(names["gpu0"]) == [f"CUDA_VISIBLE_DEVICES={visible_device(0, server_sees)}".encode()]


def test_nvml_metrics_carry_the_gpu_uuid(tmp_path):
    repo = tmp_path / "models"
    python_identity(repo, "identity_fp32", "FP32")
    port = free_port()
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--allow-metrics", "true", "--metrics-port", str(port), "--gpus", "0"]).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        srv.stop_cleanly()
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                 "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
        lines = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
        assert len(lines) == 1 and 'gpu_uuid="GPU-' in lines[0], (name, lines)
