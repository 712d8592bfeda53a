"""Batch assembler: gather 32 request tensors into one batch buffer (and scatter back),
C extension vs pure-Python twin vs numpy.concatenate, in bytes/s.

    python bench/assembler.py [--rows-per-request 4] [--row-bytes 65536]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from triton_shm.worker import assembler_py

try:
    from triton_shm.worker import _assembler
except ImportError:
    _assembler = None


def best_of(fn, repeat: int = 50) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rows-per-request", type=int, default=4)
    parser.add_argument("--row-bytes", type=int, default=65536)
    args = parser.parse_args()
    cols = args.row_bytes // 4
    parts = [np.random.default_rng(i).standard_normal((args.rows_per_request, cols)).astype(np.float32)
             for i in range(args.requests)]
    total = sum(p.nbytes for p in parts)
    out = np.empty((args.requests * args.rows_per_request, cols), np.float32)
    dsts = [np.empty_like(p) for p in parts]
    rows = [("numpy.concatenate(out=...)", lambda: np.concatenate(parts, out=out))]
    if _assembler is not None:
        rows += [("assembler gather (C, GIL released)", lambda: _assembler.gather(out, parts)),
                 ("assembler scatter (C, GIL released)", lambda: _assembler.scatter(out, dsts))]
    rows += [("assembler gather (pure Python twin)", lambda: assembler_py.gather(out, parts)),
             ("assembler scatter (pure Python twin)", lambda: assembler_py.scatter(out, dsts))]
    base = None
    print(f"| {args.requests} requests x {args.rows_per_request} rows x {args.row_bytes} B "
          f"({total / 2**20:.1f} MiB) | GB/s | vs numpy.concatenate |\n|---|---|---|")
    for label, fn in rows:
        rate = total / best_of(fn) / 1e9
        base = base or rate
        print(f"| {label} | {rate:.2f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
