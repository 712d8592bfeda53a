"""Runs every benchmark in bench/ and prints the markdown recorded in docs/benchmarks.md.

    python bench/run_all.py           (make bench)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
STEPS = [
    ("IPC round trip", ["ipc_rtt.py", "--n", "20000"]),
    ("One memcpy", ["memcpy.py", "--mib", "16"]),
    ("Batch assembler", ["assembler.py"]),
    (
        "triton-shm vs Triton 2.51 (perf_analyzer and triton-shm perf)",
        ["compare_triton.py", "--rounds", "2", "--interval-ms", "2000"],
    ),
    ("The gRPC floor: grpc.aio vs the native transport", ["grpc_floor.py"]),
    ("The HTTP floor: aiohttp's web layer vs the lean connection", ["http_floor.py"]),
    ("Scheduler cost per request", ["scheduler_cost.py"]),
    ("Ensemble vs three client calls", ["ensemble.py"]),
    ("Model load and reload", ["model_load.py"]),
    ("triton-shm perf vs perf_analyzer", ["perf_accuracy.py"]),
    ("ONNX models vs FastAPI baseline", ["compare_onnx.py"]),
]


def main() -> None:
    for title, args in STEPS:
        print(f"\n### {title}\n\n`python bench/{' '.join(args)}`\n", flush=True)
        subprocess.run([sys.executable, str(HERE / args[0]), *args[1:]], check=True, cwd=HERE)


if __name__ == "__main__":
    main()
