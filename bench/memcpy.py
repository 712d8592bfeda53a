"""One memcpy of a tensor on this machine: the floor the shared-memory path is held to.

    python bench/memcpy.py [--mib 16]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    src = np.ones(args.mib << 18, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(50):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    print(f"| one memcpy of {args.mib} MiB (best of 50) | {best * 1e6:.0f} µs | {src.nbytes / best / 1e9:.1f} GB/s |")


if __name__ == "__main__":
    main()
