"""`triton-shm perf` against the real perf_analyzer, same server, same load, alternating.

    python bench/perf_accuracy.py [--rounds 2] [--interval-ms 3000]

The server is triton-shm serving an FP32[16] python identity model; both generators run
gRPC and HTTP at concurrency 1 and 4. Prints medians and the ratio ours / perf_analyzer.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
from pathlib import Path

from compare_triton import IDENTITY, Case, Server, run_case
from reference import ensure_reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    steps = [(protocol, c) for protocol in ("grpc", "http") for c in (1, 4)]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        (repo / "identity" / "1").mkdir(parents=True)
        (repo / "identity" / "config.pbtxt").write_text(textwrap.dedent(IDENTITY[0]))
        (repo / "identity" / "1" / "model.py").write_text(textwrap.dedent(IDENTITY[1]))
        server = Server("triton-shm", repo, ref, open(Path(tmp) / "server.log", "wb"))
        try:
            for _ in range(args.rounds):
                for protocol, c in steps:
                    case = Case(f"{protocol} c{c}", "identity", ["--shape", "INPUT0:16", "--concurrency-range", str(c)],
                                protocol)
                    results.setdefault(("perf_analyzer", protocol, c), []).append(
                        run_case(ref, server, case, args.interval_ms))
                    results.setdefault(("triton-shm perf", protocol, c), []).append(
                        run_case(ref, server, case, args.interval_ms, "triton-shm-perf"))
        finally:
            server.stop()
    print("| protocol | concurrency | perf_analyzer infer/s | triton-shm perf infer/s | ratio | perf_analyzer p50 µs "
          "| triton-shm perf p50 µs | ratio | triton-shm perf client CPU % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for protocol, c in steps:
        a = {m: statistics.median(r[m] for r in results[("perf_analyzer", protocol, c)])
             for m in ("throughput", "p50_us")}
        b = {m: statistics.median(r[m] for r in results[("triton-shm perf", protocol, c)])
             for m in ("throughput", "p50_us", "client_cpu_pct")}
        print(f"| {protocol} | {c} | {a['throughput']:.0f} | {b['throughput']:.0f} "
              f"| {b['throughput'] / a['throughput']:.2f} | {a['p50_us']:.0f} | {b['p50_us']:.0f} "
              f"| {b['p50_us'] / a['p50_us']:.2f} | {b['client_cpu_pct']:.0f} |")


if __name__ == "__main__":
    main()
