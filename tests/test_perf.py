"""``triton-shm perf`` (python -m triton_shm.perf) against a real server process: both
protocols, concurrency and request-rate modes, system and CUDA shared memory (CUDA on a
machine with CuPy and a GPU), the CSV, and every bad-input path (clear one-line message,
non-zero exit, no traceback)."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .harness import ServerProcess, free_port
from .models import add_sub_onnx_model, python_identity, write_model
from .test_gpu import _missing

pytestmark = pytest.mark.timeout(120)

SHORT = ["--measurement-interval", "500", "--max-trials", "3"]
ROOT = Path(__file__).resolve().parent.parent

FAIL_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("perf test failure"))
                for _ in requests]
"""


def _repo(repo: Path) -> Path:
    add_sub_onnx_model(repo)
    python_identity(repo, "identity_fp32", "FP32", dims="[ 16 ]")       # static shape
    python_identity(repo, "identity_dyn", "FP32")                         # dims [ -1 ]
    write_model(repo, "failing", config="""
        name: "failing"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """, model_py=FAIL_PY)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("perf_server")
    # --gpus none: the CPU server these tests expect, also on a machine with a GPU (add_sub would
    # be placed on it otherwise, and fail there without onnxruntime's CUDA provider)
    srv = ServerProcess(_repo(root / "models"), root / "server.log",
                        extra_args=["--allow-client-shm=true", "--gpus", "none"]).start()
    yield srv
    srv.stop()


def perf(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triton_shm.perf", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=None if env is None else {**os.environ, **env})


def url(server: ServerProcess, proto: str) -> str:
    return server.grpc_url if proto == "grpc" else server.http_url


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_clean_failure(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, f"{n!r} not in stderr:\n{p.stderr}"


def shm_status(server: ServerProcess) -> list:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/systemsharedmemory/status", timeout=5) as r:
        return json.loads(r.read())


def our_shm_files() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("triton_shm_perf_")}


# ------------------------------------------------------------------------------- happy paths

@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_concurrency_range_csv(server, proto, tmp_path):
    out = tmp_path / "perf.csv"
    p = perf("-m", "identity_fp32", "-i", proto, "-u", url(server, proto), "--concurrency-range", "1:2",
             *SHORT, "-f", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = read_csv(out)
    assert [r["Concurrency"] for r in rows] == ["1", "2"]
    for r in rows:
        assert float(r["Inferences/Second"]) > 0
        for col in ("p50 latency", "p90 latency", "p95 latency", "p99 latency", "Avg latency",
                    "Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output"):
            assert col in r and r[col] != ""
        assert 0 < float(r["p50 latency"]) <= float(r["p99 latency"])
        assert float(r["Server Compute Infer"]) > 0                    # server split from statistics deltas
        assert float(r["Server Compute Infer"]) < float(r["Avg latency"])
        assert r["Errors"] == "0"
    assert "Request concurrency: 1" in p.stdout and "Avg request latency" in p.stdout
    assert "Inferences/Second vs. Client Average Batch Latency" in p.stdout
    assert "[concurrency 1] window 1/3" in p.stderr                     # progress on stderr


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_large_tensors_in_band(server, proto, tmp_path):
    """16 MiB requests and responses: beyond the HTTP/2 flow-control windows and frame sizes
    (the gRPC hot path must wait for WINDOW_UPDATEs), several in flight on one connection.
    The server checks every request's byte size against its shape, so a lost or duplicated
    byte is an error."""
    out = tmp_path / "large.csv"
    p = perf("-m", "identity_dyn", "-i", proto, "-u", url(server, proto), "--shape", "INPUT0:4194304",
             "--concurrency-range", "3", "--measurement-interval", "1500", "--max-trials", "3",
             "--stability-percentage", "100", "-f", str(out), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    row = read_csv(out)[0]
    assert row["Errors"] == "0" and float(row["Inferences/Second"]) > 0


def test_request_rate_poisson_batched_json_input(server, tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": list(range(16)), "INPUT1": [1.0] * 16},
                                         {"INPUT0": {"content": [2.0] * 16, "shape": [16]}, "INPUT1": [0.5] * 16}]}))
    out = tmp_path / "rate.csv"
    p = perf("-m", "add_sub", "-u", server.grpc_url, "-b", "2", "--request-rate-range", "40:80:40",
             "--request-distribution", "poisson", "--input-data", str(data), "--percentile", "95",
             *SHORT, "-f", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = read_csv(out)
    assert [r["Request Rate"] for r in rows] == ["40", "80"]
    assert all(float(r["Inferences/Second"]) > 0 for r in rows)
    # two inferences per request (-b 2), roughly at the asked rate
    assert 0.4 * 2 * 80 < float(rows[1]["Inferences/Second"]) < 2.0 * 2 * 80
    assert "p95 latency (selected by --percentile)" in p.stdout
    assert "Client p95 Batch Latency" in p.stdout


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_system_shared_memory(server, proto, tmp_path):
    before = our_shm_files()
    out = tmp_path / "shm.csv"
    p = perf("-m", "add_sub", "-i", proto, "-u", url(server, proto), "--shared-memory", "system",
             "--output-shared-memory-size", "4096", "--concurrency-range", "2", *SHORT, "-f", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert float(read_csv(out)[0]["Inferences/Second"]) > 0
    assert shm_status(server) == []                                     # unregistered at the end
    assert our_shm_files() - before == set()                            # and removed locally


def test_output_regions_are_sized_as_perf_analyzer_sizes_them(server):
    """A dynamic output's region is --output-shared-memory-size bytes: a 1 MiB output does not
    fit the 100 KiB default (the server refuses each request) and fits in 1 MiB."""
    mib = ["-m", "identity_dyn", "-u", server.grpc_url, "--shared-memory", "system", "--shape", "INPUT0:262144",
           "--concurrency-range", "1", "--measurement-interval", "300", "--max-trials", "3"]
    assert_clean_failure(perf(*mib), "request(s) failed", "should be at least 1048576 bytes")
    p = perf(*mib, "--output-shared-memory-size", str(1 << 20))
    assert p.returncode == 0, p.stdout + p.stderr
    assert shm_status(server) == []


def test_triton_shm_perf_subcommand(server):
    p = subprocess.run([sys.executable, "-m", "triton_shm", "perf", "-m", "identity_fp32", "-u", server.grpc_url,
                        "--measurement-interval", "300", "--max-trials", "3"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Concurrency: 1, throughput:" in p.stdout


# ------------------------------------------------------------------------------- errors

def test_unknown_model(server):
    p = perf("-m", "no_such_model", "-u", server.grpc_url, *SHORT)
    assert_clean_failure(p, "no_such_model", "not available")


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_server_unreachable(proto):
    p = perf("-m", "identity_fp32", "-i", proto, "-u", f"127.0.0.1:{free_port()}", *SHORT)
    assert_clean_failure(p, "cannot reach the server")


def test_http_url_with_scheme(server):
    p = perf("-m", "identity_fp32", "-i", "http", "-u", f"https://{server.http_url}", *SHORT)
    assert_clean_failure(p, "only http:// URLs")
    p = perf("-m", "identity_fp32", "-i", "http", "-u", f"http://{server.http_url}", *SHORT)
    assert p.returncode == 0, p.stderr


def test_dynamic_shape_needs_shape_flag(server, tmp_path):
    p = perf("-m", "identity_dyn", "-u", server.grpc_url, *SHORT)
    assert_clean_failure(p, "INPUT0", "--shape")
    p = perf("-m", "identity_dyn", "-u", server.grpc_url, "--shape", "INPUT0:8", "--input-data", "zero",
             "--measurement-interval", "300", "--max-trials", "3")
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("args,needle", [
    (["-b", "0"], "-b"),
    (["--concurrency-range", "4:2"], "below start"),
    (["--concurrency-range", "a:b"], "start[:end[:step]]"),
    (["--request-rate-range", "0"], "positive"),
    (["--concurrency-range", "1", "--request-rate-range", "10"], "cannot be used together"),
    (["--request-distribution", "uniform"], "invalid choice"),
    (["-i", "tcp"], "invalid choice"),
    (["--streaming", "-i", "http"], "--streaming needs -i grpc"),
    (["--percentile", "150"], "percentile"),
    (["--measurement-interval", "-5"], "positive"),
    (["--input-data", "/nonexistent/data.json"], "--input-data"),
    (["--shape", "INPUT0"], "--shape"),
    (["--shape", "NOPE:4"], "NOPE"),
    (["-b", "2"], "does not support batching"),
])
def test_bad_flags(server, args, needle):
    p = perf("-m", "identity_fp32", "-u", server.grpc_url, *args, *SHORT)
    assert_clean_failure(p, needle)


def test_plot_of_a_sweep(server, tmp_path):
    png = tmp_path / "sweep.png"
    p = perf("-m", "identity_fp32", "-u", server.grpc_url, "--concurrency-range", "1:3:2", "--plot", str(png), *SHORT)
    assert p.returncode == 0, p.stdout + p.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width >= 400 and height >= 300


def test_plot_without_matplotlib_is_clear(server, tmp_path):
    """Without matplotlib (hidden from the import system here) --plot fails before any load, clearly."""
    hide = "import sys; sys.modules['matplotlib'] = None; from triton_shm.perf.cli import main; sys.exit(main())"
    p = subprocess.run([sys.executable, "-c", hide, "-m", "identity_fp32", "-u", server.grpc_url,
                        "--plot", str(tmp_path / "x.png"), *SHORT],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert_clean_failure(p, "matplotlib", "triton-shm[plot]")
    assert not (tmp_path / "x.png").exists()


def test_streaming(server, tmp_path):
    """Over one ModelStreamInfer stream when the server has it; a clear error when it answers
    UNIMPLEMENTED."""
    out = tmp_path / "stream.csv"
    p = perf("-m", "identity_fp32", "-u", server.grpc_url, "--streaming", "--concurrency-range", "2", *SHORT,
             "-f", str(out))
    if "UNIMPLEMENTED" in p.stderr:
        assert_clean_failure(p, "does not support gRPC streaming", "run without --streaming")
    else:
        assert p.returncode == 0, p.stdout + p.stderr
        row = read_csv(out)[0]
        assert float(row["Inferences/Second"]) > 0 and row["Errors"] == "0"


def test_request_errors_are_counted(server, tmp_path):
    out = tmp_path / "fail.csv"
    p = perf("-m", "failing", "-u", server.grpc_url, "--measurement-interval", "300", "--max-trials", "3",
             "-f", str(out))
    assert_clean_failure(p, "perf test failure", "request(s) failed")
    assert int(read_csv(out)[0]["Errors"]) > 0


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_server_going_down_mid_run(proto, tmp_path):
    root = tmp_path
    srv = ServerProcess(_repo(root / "models"), root / "server.log",
                        extra_args=["--allow-client-shm=true", "--gpus", "none"]).start()
    before = our_shm_files()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "triton_shm.perf", "-m", "identity_fp32", "-i", proto,
                                 "-u", url(srv, proto), "--concurrency-range", "2", "--measurement-interval", "300",
                                 "--max-trials", "100", "-s", "0.001", "--shared-memory", "system"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        time.sleep(2.0)
        srv.stop()
        _, err = proc.communicate(timeout=30)
    finally:
        srv.stop()
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    assert "lost the connection" in err or "statistics request" in err, err
    assert our_shm_files() - before == set()


def test_interrupt_cleans_up_shared_memory(server):
    before = our_shm_files()
    proc = subprocess.Popen([sys.executable, "-m", "triton_shm.perf", "-m", "identity_fp32", "-u", server.grpc_url,
                             "--concurrency-range", "2", "--measurement-interval", "300", "--max-trials", "100",
                             "-s", "0.001", "--shared-memory", "system"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err, err
    assert shm_status(server) == []
    assert our_shm_files() - before == set()


# ------------------------------------------------------------------------------- CUDA shared memory

def test_cuda_shared_memory_without_cupy_or_gpu_is_a_usage_error():
    """--shared-memory cuda without CuPy (hidden from the import system here), or without a
    visible CUDA device (CUDA_VISIBLE_DEVICES=""), stops at once: one line, exit 2, before
    any call to the server (whose address here answers nothing)."""
    from triton_shm.perf.cuda import CUPY_MISSING, NO_DEVICE
    nowhere = f"127.0.0.1:{free_port()}"
    hide = "import sys; sys.modules['cupy'] = None; from triton_shm.perf.cli import main; sys.exit(main())"
    runs = {
        CUPY_MISSING: subprocess.run([sys.executable, "-c", hide, "-m", "identity_fp32", "-u", nowhere,
                                      "--shared-memory", "cuda", *SHORT],
                                     capture_output=True, text=True, timeout=60, cwd=ROOT),
        # no device: the same message everywhere CuPy is installed (on a GPU machine too)
        NO_DEVICE if importlib.util.find_spec("cupy") is not None else CUPY_MISSING:
            perf("-m", "identity_fp32", "-u", nowhere, "--shared-memory", "cuda", *SHORT,
                 env={"CUDA_VISIBLE_DEVICES": ""}),
    }
    for message, p in runs.items():
        assert p.returncode == 2, p.stdout + p.stderr
        assert_clean_failure(p, message)
        assert p.stderr.strip().splitlines() == [f"triton-shm perf: error: {message}"], p.stderr
        assert p.stdout == ""  # not even the settings: nothing was measured


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory) -> ServerProcess:
    """Python identity models served on GPU 0 (their instances KIND_AUTO, so KIND_GPU)."""
    root = tmp_path_factory.mktemp("perf_gpu_server")
    repo = root / "models"
    python_identity(repo, "identity_fp32", "FP32", dims="[ 16 ]")
    python_identity(repo, "identity_dyn", "FP32")
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true", "--gpus", "0"]).start()
    yield srv
    srv.stop_cleanly()


def cuda_shm_status(server: ServerProcess) -> list:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/cudasharedmemory/status", timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.skipif(_missing() is not None, reason=f"--shared-memory cuda needs CuPy and a GPU: {_missing()}")
@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_cuda_shared_memory(gpu_server, proto, tmp_path):
    """Inputs and outputs in CUDA buffers of the client, registered with the server's GPU 0:
    throughput without errors, the regions unregistered at the end. An output of fixed size
    gets a region of that size; a dynamic one --output-shared-memory-size bytes per batch
    element, so a 1 MiB output fails in the 100 KiB default and passes in 1 MiB."""
    out = tmp_path / "cuda.csv"
    p = perf("-m", "identity_fp32", "-i", proto, "-u", url(gpu_server, proto), "--shared-memory", "cuda",
             "--concurrency-range", "1:2", *SHORT, "-f", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Shared memory: cuda" in p.stdout
    rows = read_csv(out)
    assert [r["Concurrency"] for r in rows] == ["1", "2"]
    assert all(r["Errors"] == "0" and float(r["Inferences/Second"]) > 0 for r in rows), rows
    assert cuda_shm_status(gpu_server) == []

    mib = ["-m", "identity_dyn", "-i", proto, "-u", url(gpu_server, proto), "--shared-memory", "cuda",
           "--shape", "INPUT0:262144", "--concurrency-range", "2", *SHORT]
    p = perf(*mib, "--output-shared-memory-size", str(1 << 20), "-f", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    row = read_csv(out)[0]
    assert row["Errors"] == "0" and float(row["Inferences/Second"]) > 0, row
    p = perf(*mib)
    assert_clean_failure(p, "request(s) failed")
    assert cuda_shm_status(gpu_server) == []


# ------------------------------------------------------------------------------- units

def test_output_region_size_follows_perf_analyzer():
    from triton_shm.perf.inputs import TensorSpec, output_region_size
    assert output_region_size(TensorSpec("y", "FP32", [16]), 1, 102400) == 64         # known: its size
    assert output_region_size(TensorSpec("y", "FP16", [2, 3]), 4, 102400) == 48       # times the batch
    assert output_region_size(TensorSpec("y", "BF16", []), 1, 102400) == 2            # a scalar
    assert output_region_size(TensorSpec("y", "FP32", [-1, 4]), 2, 102400) == 204800  # dynamic: the flag's
    assert output_region_size(TensorSpec("y", "BYTES", [4]), 1, 1000) == 1000         # BYTES: the flag's
    assert output_region_size(TensorSpec("y", "INT8", [0]), 1, 1000) == 1             # never 0 bytes


def test_parse_range_and_stability():
    from triton_shm.perf.cli import parse_range
    from triton_shm.perf.measure import Window, is_stable, percentile
    assert parse_range("--c", "1:4:2", True) == [1, 3]
    assert parse_range("--c", "3", True) == [3]
    assert parse_range("--r", "10:20:5", False) == [10, 15, 20]
    assert percentile(list(range(1, 101)), 50) == 50 and percentile(list(range(1, 101)), 99) == 99
    w = lambda n, lat: Window(1.0, [lat] * n, 0, 0.1, None)  # noqa: E731
    assert is_stable([w(100, 1000), w(102, 1010), w(99, 990)], 10, None)
    assert not is_stable([w(100, 1000), w(150, 1010), w(99, 990)], 10, None)
    assert not is_stable([w(100, 1000), w(100, 1000)], 10, None)
