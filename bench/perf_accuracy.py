"""`triton-shm perf` against the real perf_analyzer, same server, same load, alternating.

    python bench/perf_accuracy.py [--rounds 2] [--interval-ms 3000]

The server is triton-shm serving an FP32[16] python identity model; both generators run
gRPC at concurrency 1 and 4. Prints medians and the ratio ours / perf_analyzer.
"""
from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from compare_triton import IDENTITY, Case, Server, run_case
from reference import ensure_reference


def ours(port: int, concurrency: int, interval_ms: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        out = subprocess.run([sys.executable, "-m", "triton_shm.perf", "-m", "identity", "-u", f"127.0.0.1:{port + 1}",
                              "-i", "grpc", "--shape", "INPUT0:16", "--concurrency-range", str(concurrency),
                              "--measurement-interval", str(interval_ms), "--stability-percentage", "50",
                              "--max-trials", "5", "-f", f.name], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"triton-shm perf failed: {out.stderr[-2000:]}")
        row = next(csv.DictReader(io.StringIO(Path(f.name).read_text())))
    return {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "client_cpu": float(row.get("Client CPU %", 0) or 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        (repo / "identity" / "1").mkdir(parents=True)
        (repo / "identity" / "config.pbtxt").write_text(textwrap.dedent(IDENTITY[0]))
        (repo / "identity" / "1" / "model.py").write_text(textwrap.dedent(IDENTITY[1]))
        server = Server("triton-shm", repo, ref, open(Path(tmp) / "server.log", "wb"))
        try:
            for _ in range(args.rounds):
                for c in (1, 4):
                    results.setdefault(("perf_analyzer", c), []).append(run_case(
                        ref, server, Case(f"c{c}", "identity", ["--shape", "INPUT0:16", "--concurrency-range", str(c)]),
                        args.interval_ms))
                    results.setdefault(("triton-shm perf", c), []).append(ours(server.port, c, args.interval_ms))
        finally:
            server.stop()
    print("| concurrency | perf_analyzer infer/s | triton-shm perf infer/s | ratio | perf_analyzer p50 µs "
          "| triton-shm perf p50 µs | ratio | triton-shm perf client CPU % |")
    print("|---|---|---|---|---|---|---|---|")
    for c in (1, 4):
        a = {m: statistics.median(r[m] for r in results[("perf_analyzer", c)]) for m in ("throughput", "p50_us")}
        b = {m: statistics.median(r[m] for r in results[("triton-shm perf", c)])
             for m in ("throughput", "p50_us", "client_cpu")}
        print(f"| {c} | {a['throughput']:.0f} | {b['throughput']:.0f} | {b['throughput'] / a['throughput']:.2f} "
              f"| {a['p50_us']:.0f} | {b['p50_us']:.0f} | {b['p50_us'] / a['p50_us']:.2f} | {b['client_cpu']:.0f} |")


if __name__ == "__main__":
    main()
