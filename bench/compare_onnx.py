"""ONNX models: triton-shm vs a FastAPI + uvicorn + onnxruntime server (bench/fastapi_baseline.py),
both driven by the real perf_analyzer over HTTP, alternately A B A B.

    python bench/compare_onnx.py [--rounds 2] [--interval-ms 3000]

Cases (batch 1 per request, max_batch_size 8 on both sides):
  mlp       FP32 [b,256] -> 256x512 -> Relu -> 512x512 -> Relu -> 512x10, concurrency 8;
            on triton-shm also with dynamic batching (the baseline has no batching, it
            serves the same file under that name)
  identity  one 1 MiB FP32 tensor in-band ([1, 262144]), concurrency 1
triton-shm is also measured over gRPC for the same cases (extra rows; the baseline has
no gRPC). Measurement, CPU-seconds per 1,000 inferences and peak RSS come from
bench/compare_triton.py (run_case); the baseline has no statistics extension, so its
server-side time is not reported.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from compare_triton import Case, Server, run_case
from reference import ensure_reference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.models import onnx_identity, save_onnx  # noqa: E402

BASELINE = Path(__file__).resolve().parent / "fastapi_baseline.py"
MAX_BATCH = 8


def onnx_mlp(path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes = [256, 512, 512, 10]
    weights = [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"W{i}")
               for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    nodes, x = [], "INPUT0"
    for i in range(3):
        y = "OUTPUT0" if i == 2 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [y if i == 2 else f"m{i}"]))
        if i < 2:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [y]))
        x = y
    save_onnx(helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])], initializer=weights), path)


def onnx_config(name: str, in_dims: str, out_dims: str, batching: bool = False) -> str:
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH}\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {in_dims} }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {out_dims} }} ]\n'
            + ("dynamic_batching { max_queue_delay_microseconds: 500 }\n" if batching else ""))


def build_repository(repo: Path) -> None:
    onnx_mlp(repo / "mlp" / "1" / "model.onnx")
    (repo / "mlp" / "config.pbtxt").write_text(onnx_config("mlp", "[ 256 ]", "[ 10 ]"))
    (repo / "mlp_batch" / "1").mkdir(parents=True)
    (repo / "mlp_batch" / "1" / "model.onnx").write_bytes((repo / "mlp" / "1" / "model.onnx").read_bytes())
    (repo / "mlp_batch" / "config.pbtxt").write_text(onnx_config("mlp_batch", "[ 256 ]", "[ 10 ]", batching=True))
    onnx_identity(repo / "identity" / "1" / "model.onnx", "FP32")
    (repo / "identity" / "config.pbtxt").write_text(onnx_config("identity", "[ -1 ]", "[ -1 ]"))


def cases(protocol: str) -> list[Case]:
    p = "HTTP" if protocol == "http" else "gRPC"
    return [
        Case(f"ONNX MLP, {p}, concurrency 8", "mlp", ["--concurrency-range", "8", "-b", "1"], protocol),
        Case(f"ONNX MLP, {p}, concurrency 8, dynamic batching (ours)", "mlp_batch",
             ["--concurrency-range", "8", "-b", "1"], protocol),
        Case(f"ONNX identity 1 MiB in-band, {p}, concurrency 1", "identity",
             ["--shape", "INPUT0:262144", "--concurrency-range", "1", "-b", "1"], protocol),
    ]


def ensure_fastapi(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import fastapi, uvicorn, onnxruntime, numpy"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "fastapi", "uvicorn", "onnxruntime", "numpy"],
                       check=True, stdout=subprocess.DEVNULL)


class BaselineServer(Server):
    """The FastAPI baseline for one model, started and polled by compare_triton.Server
    (through its `triton_cmd` hook); `kind` is "fastapi"."""

    def __init__(self, python: Path, repo: Path, model: str, log):
        model_path = repo / model / "1" / "model.onnx"
        launcher = SimpleNamespace(triton_cmd=lambda _repo, port: (
            [str(python), str(BASELINE), "--model", str(model_path), "--name", model, "--port", str(port),
             "--max-batch-size", str(MAX_BATCH)], None))
        super().__init__("triton", repo, launcher, log)
        self.kind = "fastapi"




def table(rows: list[Case], med: dict) -> str:
    lines = ["| case | triton-shm infer/s | FastAPI infer/s | ratio | triton-shm p50 µs | FastAPI p50 µs | "
             "triton-shm p99 µs | FastAPI p99 µs | triton-shm server-side µs/request | "
             "CPU-s/1k inf (ours / FastAPI) | peak RSS MiB (ours / FastAPI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in rows:
        a, b = med[("triton-shm", case.label)], med.get(("fastapi", case.label))
        if b is None:
            lines.append(f"| {case.label} | {a['throughput']:.0f} | — | — | {a['p50_us']:.0f} | — | {a['p99_us']:.0f} "
                         f"| — | {a['server_us']:.0f} | {a['cpu_s_per_1k']:.2f} / — | {a['rss_mib']:.0f} / — |")
            continue
        lines.append(
            f"| {case.label} | {a['throughput']:.0f} | {b['throughput']:.0f} | {a['throughput'] / b['throughput']:.2f} "
            f"| {a['p50_us']:.0f} | {b['p50_us']:.0f} | {a['p99_us']:.0f} | {b['p99_us']:.0f} | {a['server_us']:.0f} "
            f"| {a['cpu_s_per_1k']:.2f} / {b['cpu_s_per_1k']:.2f} | {a['rss_mib']:.0f} / {b['rss_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    http, grpc = cases("http"), cases("grpc")
    ref = ensure_reference()
    ensure_fastapi(ref.python)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}

    def measure(server: Server, case: Case) -> None:
        for attempt in range(3):  # the VM is shared: perf_analyzer may not stabilise in 5 windows
            try:
                r = run_case(ref, server, case, args.interval_ms)
                break
            except RuntimeError as e:
                if "stable measurement" not in str(e) or attempt == 2:
                    raise
                print(f"  {server.kind:10s} {case.label}: not stable, measuring again", file=sys.stderr, flush=True)
        results.setdefault((server.kind, case.label), []).append(r)
        print(f"  {server.kind:10s} {case.label}: {r['throughput']:.0f}/s p50 {r['p50_us']:.0f} µs",
              file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo)
        log = open(Path(tmp) / "servers.log", "wb")
        try:
            for _ in range(args.rounds):
                server = Server("triton-shm", repo, ref, log)
                try:
                    for case in http + grpc:
                        measure(server, case)
                finally:
                    server.stop()
                for case in http:  # one baseline process per model, as it would be deployed
                    server = BaselineServer(ref.python, repo, case.model, log)
                    try:
                        measure(server, case)
                    finally:
                        server.stop()
        except Exception:
            log.close()
            sys.stderr.write((Path(tmp) / "servers.log").read_text(errors="replace")[-3000:])
            raise
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print(table(http + grpc, med))


if __name__ == "__main__":
    main()
