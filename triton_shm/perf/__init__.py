"""``triton-shm perf``: a perf_analyzer-style load generator for any KServe V2 server.

It reads the model's metadata and configuration, builds the request once, drives it in
concurrency mode (N requests always outstanding) or request-rate mode (constant or
Poisson arrivals) over gRPC or HTTP, measures in windows until three in a row agree
(``--stability-percentage``), and reports client latency percentiles alongside the
server-side split (queue / compute input / infer / output) taken from the statistics
extension, as perf_analyzer does.

Run ``python -m triton_shm.perf --help`` or ``triton-shm perf --help``.
"""
from __future__ import annotations


class PerfError(Exception):
    """A failure to report as one clear line (no traceback) with a non-zero exit."""

    exit_code = 1


class UsageError(PerfError):
    """Bad flag values or flags that do not fit the model."""

    exit_code = 2


__all__ = ["PerfError", "UsageError"]
