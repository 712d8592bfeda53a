"""Server overhead for a small request: triton-shm vs the real Triton 2.51, one run.

    python bench/compare_triton.py [--rounds 2] [--interval-ms 3000]

Both servers serve the same repository (a python `add_sub` model: two FP32[16] inputs,
their sum and difference) and are driven by the real perf_analyzer (2.50) over gRPC
and HTTP at concurrency 1 and 8, alternating A B A B so drift hits both alike. Prints a
markdown table of medians and ratios (triton-shm / Triton).
"""
from __future__ import annotations

import argparse
import csv
import io
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from reference import ensure_reference

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
ADD_SUB_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                   pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""
SCENARIOS = [("grpc", 1), ("grpc", 8), ("http", 1), ("http", 8)]


def free_port_block() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 60000:
            return port


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server did not become ready")


def start(kind: str, repo: Path, ref, log) -> tuple[subprocess.Popen, int]:
    port = free_port_block()
    if kind == "triton":
        cmd, env = ref.triton_cmd(repo, port)
    else:
        cmd = [sys.executable, "-m", "triton_shm", "--model-repository", str(repo), "--http-port", str(port),
               "--grpc-port", str(port + 1), "--allow-metrics", "false", "--http-address", "127.0.0.1",
               "--grpc-address", "127.0.0.1"]
        env = None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(port, proc)
    return proc, port


def perf(ref, protocol: str, port: int, concurrency: int, interval_ms: int) -> dict[str, float]:
    url = f"127.0.0.1:{port + 1}" if protocol == "grpc" else f"127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        cmd = [str(ref.perf_analyzer), "-m", "add_sub", "-u", url, "-i", protocol,
               "--concurrency-range", str(concurrency), "--measurement-interval", str(interval_ms),
               "--stability-percentage", "50", "--max-trials", "5", "-f", f.name]
        out = subprocess.run(cmd, env=ref.pa_env(), capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        row = next(csv.DictReader(io.StringIO(Path(f.name).read_text())))
    return {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        (repo / "add_sub" / "1").mkdir(parents=True)
        (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
        (repo / "add_sub" / "1" / "model.py").write_text(ADD_SUB_PY)
        log = open(Path(tmp) / "servers.log", "wb")
        for _ in range(args.rounds):
            for kind in ("triton-shm", "triton"):
                proc, port = start(kind, repo, ref, log)
                try:
                    for protocol, conc in SCENARIOS:
                        r = perf(ref, protocol, port, conc, args.interval_ms)
                        results.setdefault((kind, protocol, conc), []).append(r)
                        print(f"  {kind:10s} {protocol} c{conc}: {r['throughput']:.0f}/s p50 {r['p50_us']:.0f} µs",
                              file=sys.stderr)
                finally:
                    proc.terminate()
                    proc.wait(60)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print("| scenario | triton-shm infer/s | Triton infer/s | ratio | triton-shm p50 µs | Triton p50 µs | ratio "
          "| triton-shm p99 µs | Triton p99 µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for protocol, conc in SCENARIOS:
        a, b = med[("triton-shm", protocol, conc)], med[("triton", protocol, conc)]
        print(f"| python add_sub, FP32[16], {protocol}, concurrency {conc} | {a['throughput']:.0f} | "
              f"{b['throughput']:.0f} | {a['throughput'] / b['throughput']:.2f} | {a['p50_us']:.0f} | "
              f"{b['p50_us']:.0f} | {a['p50_us'] / b['p50_us']:.2f} | {a['p99_us']:.0f} | {b['p99_us']:.0f} |")


if __name__ == "__main__":
    main()
