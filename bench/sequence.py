"""Sequence batching, triton-shm vs the real Triton 2.51, in one run.

    python bench/sequence.py [--rounds 2] [--interval-ms 3000] [--protocols grpc,http] [--max-trials 5]

perf_analyzer drives sequences of 20 requests (``--sequence-length 20``) at concurrency 8
against a python sequence model (max_batch_size 8, one instance, START/END/READY/CORRID
control inputs and an INT32 implicit state it adds its input to), with the ``direct`` and
the ``oldest`` strategy. Both servers serve the same repository and are measured
alternately, A B A B (the servers, load generator and tables of bench/compare_triton.py):
throughput, p50/p99 latency, server CPU per 1,000 inferences and the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import compare_triton as ct
from reference import ensure_reference

SEQUENCE_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                state = pb_utils.get_input_tensor_by_name(r, "INPUT_STATE").as_numpy()
                total = (x + state).astype(np.int32)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total),
                                                       pb_utils.Tensor("OUTPUT_STATE", total)]))
            return out
    """


def sequence_config(name: str, strategy: str) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 8
    sequence_batching {{
      {strategy}
      max_sequence_idle_microseconds: 5000000
      control_input [
        {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
        {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
        {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
        {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
      ]
      state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]
                initial_state: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
    }}
    input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    instance_group [ {{ count: 1 kind: KIND_CPU }} ]
    """


MODELS = {"seq_direct": "direct { }",
          "seq_oldest": "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 100 }"}
LOAD = ["--sequence-length", "20", "--sequence-id-range", "1:1000000", "--concurrency-range", "8"]
CASES = [ct.Case(f"sequences of 20, {strategy}, {protocol}, concurrency 8", model, LOAD, protocol)
         for protocol in ("grpc", "http") for model, strategy in (("seq_direct", "direct"), ("seq_oldest", "oldest"))]


def build_repository(repo: Path) -> None:
    for name, strategy in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(sequence_config(name, strategy)))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(SEQUENCE_PY))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--max-trials", type=int, default=5)
    args = parser.parse_args()
    ct.MAX_TRIALS[0] = args.max_trials
    cases = [c for c in CASES if c.protocol in args.protocols.split(",")]
    ref = ensure_reference()
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo)
        log = open(Path(tmp) / "servers.log", "wb")
        for _ in range(args.rounds):
            for kind in ("triton-shm", "triton"):
                server = ct.Server(kind, repo, ref, log)
                try:
                    for case in cases:
                        r = ct.run_case(ref, server, case, args.interval_ms, "perf_analyzer")
                        results.setdefault((kind, "perf_analyzer", case.label), []).append(r)
                        print(f"  {kind:10s} {case.label}: {r['throughput']:.0f}/s p99 {r['p99_us']:.0f} µs",
                              file=sys.stderr, flush=True)
                finally:
                    server.stop()
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print(f"#### driven by {ct.GENERATORS['perf_analyzer']}\n\n{ct.table(cases, med, 'perf_analyzer', ['triton-shm'])}")


if __name__ == "__main__":
    main()
