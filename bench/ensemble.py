"""A 3-step ensemble (Python preprocess → add → Python postprocess) against the same
three calls made by the client one after another, on triton-shm and on the real Triton.

    python bench/ensemble.py [--interval-ms 3000]

The add step is an ONNX model on triton-shm and a Python model on Triton (its only
backend here), so the Triton column measures the python-steps-only variant of the same
pipeline. perf_analyzer drives the ensemble at concurrency 1 and 8 over gRPC; the
client-side chain is timed with tritonclient (gRPC, sequential calls, concurrency 1).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from compare_triton import ADD_SUB, Case, Server, run_case
from reference import ensure_reference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.models import onnx_add_sub  # noqa: E402

PRE = ("""
    name: "pre"
    backend: "python"
    max_batch_size: 0
    input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("A", x * 2), pb_utils.Tensor("B", x)]))
            return out
    """)
POST = ("""
    name: "post"
    backend: "python"
    max_batch_size: 0
    input [ { name: "S" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """, """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "TOTAL", pb_utils.get_input_tensor_by_name(r, "S").as_numpy().sum(keepdims=True))]) for r in requests]
    """)
ENSEMBLE = """
    name: "pipeline"
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
    ensemble_scheduling { step [
      { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "IN" }
        output_map [ { key: "A" value: "a" }, { key: "B" value: "b" } ] },
      { model_name: "add" model_version: -1 input_map [ { key: "INPUT0" value: "a" }, { key: "INPUT1" value: "b" } ]
        output_map [ { key: "OUTPUT0" value: "s" }, { key: "OUTPUT1" value: "unused" } ] },
      { model_name: "post" model_version: -1 input_map [ { key: "S" value: "s" }, { key: "X" value: "unused" } ]
        output_map { key: "TOTAL" value: "OUT" } }
    ] }
    """


def write_repo(repo: Path, onnx_add: bool) -> None:
    def write(name: str, config: str, code: str | None) -> None:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        if code is not None:
            (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    write("pre", *PRE)
    # post takes the unused difference too, so every ensemble tensor is connected
    post_config = POST[0].replace('input [ { name: "S" data_type: TYPE_FP32 dims: [ 16 ] } ]',
                                  'input [ { name: "S" data_type: TYPE_FP32 dims: [ 16 ] }, '
                                  '{ name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]')
    write("post", post_config, POST[1])
    if onnx_add:
        onnx_add_sub(repo / "add" / "1" / "model.onnx", dims=(16,))
        (repo / "add" / "config.pbtxt").write_text('name: "add"\nbackend: "onnxruntime"\n')
    else:
        write("add", ADD_SUB[0].replace('"add_sub"', '"add"'), ADD_SUB[1])
    write("pipeline", ENSEMBLE, None)


def client_chain(port: int, n: int = 300) -> float:
    """Median latency of the same pipeline as three sequential client calls (µs)."""
    import tritonclient.grpc as g
    c = g.InferenceServerClient(f"127.0.0.1:{port + 1}")
    x = np.arange(16, dtype=np.float32)

    def call(model, named):
        inputs = []
        for name, arr in named.items():
            i = g.InferInput(name, list(arr.shape), "FP32")
            i.set_data_from_numpy(arr)
            inputs.append(i)
        return c.infer(model, inputs)

    samples = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        r = call("pre", {"RAW": x})
        a, b = r.as_numpy("A"), r.as_numpy("B")
        r = call("add", {"INPUT0": a, "INPUT1": b})
        call("post", {"S": r.as_numpy("OUTPUT0"), "X": r.as_numpy("OUTPUT1")})
        if i >= 20:
            samples.append((time.perf_counter() - t0) * 1e6)
    c.close()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "servers.log", "wb")
        for kind in ("triton-shm", "triton"):
            repo = Path(tmp) / kind
            write_repo(repo, onnx_add=(kind == "triton-shm"))
            server = Server(kind, repo, ref, log)
            try:
                chain = client_chain(server.port)
                for conc in (1, 8):
                    r = run_case(ref, server, Case(f"c{conc}", "pipeline", ["--concurrency-range", str(conc)]),
                                 args.interval_ms)
                    rows.append((kind, conc, r["throughput"], r["p50_us"], chain))
            finally:
                server.stop()
    print(
        "| server | ensemble, concurrency | infer/s | p50 µs | the same 3 calls from the client, sequential, p50 µs |"
    )
    print("|---|---|---|---|---|")
    for kind, conc, thr, p50, chain in rows:
        print(f"| {kind} | {conc} | {thr:.0f} | {p50:.0f} | {chain:.0f} |")


if __name__ == "__main__":
    main()
