"""One candidate measured with the ``perf`` engine: a concurrency sweep, each step run until
three windows agree (perf_analyzer's stability check), with the server's CPU per inference
and resident memory over the same step where tune can see the server's processes."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from ..perf import PerfError
from ..perf.load import Options, progress_to, run
from ..perf.measure import Result
from .control import ProcessTree, cpu_delta


@dataclass
class Point:
    """One concurrency step of one candidate."""

    concurrency: int
    throughput: float         # inferences per second
    p50_ms: float
    p99_ms: float
    avg_ms: float
    stable: bool
    errors: int
    cpu_ms_per_inf: float | None = None
    rss_mib: float | None = None


@dataclass
class Settings:
    model: str
    url: str                  # what the engine sends to (gRPC or HTTP address)
    protocol: str
    concurrency: list[int]
    interval_ms: float
    stability_pct: float
    max_trials: int


def _point(r: Result, cpu_s: float | None, wall_s: float, rss: int | None) -> Point:
    cpu_per_inf = None
    if cpu_s is not None and r.throughput > 0 and wall_s > 0:
        cpu_per_inf = 1000.0 * (cpu_s / wall_s) / r.throughput
    return Point(concurrency=int(r.value), throughput=r.throughput, p50_ms=r.p50_us / 1000,
                 p99_ms=r.p99_us / 1000, avg_ms=r.avg_us / 1000, stable=r.stable, errors=r.errors,
                 cpu_ms_per_inf=cpu_per_inf, rss_mib=rss / 2**20 if rss is not None else None)


def measure(s: Settings, tree: ProcessTree | None, on_line: Callable[[str], None],
            on_point: Callable[[Point], None]) -> list[Point]:
    """The sweep; raises PerfError (ConnectionLost when the server went away)."""
    opts = Options(model=s.model, url=s.url, protocol=s.protocol, mode="concurrency",
                   values=[float(c) for c in s.concurrency], interval_ms=s.interval_ms,
                   stability_pct=s.stability_pct, max_trials=s.max_trials)
    points: list[Point] = []
    cpu_mark = tree.cpu() if tree else None
    time_mark = time.monotonic()

    def on_result(r: Result, _has_stats: bool) -> None:
        nonlocal cpu_mark, time_mark
        now = time.monotonic()
        cpu = tree.cpu() if tree else None
        used = cpu_delta(cpu_mark, cpu) if cpu is not None and cpu_mark is not None else None
        p = _point(r, used, now - time_mark, tree.rss_bytes() if tree else None)
        cpu_mark, time_mark = cpu, now
        points.append(p)
        on_point(p)

    with progress_to(on_line):
        asyncio.run(run(opts, on_result))
    return points


__all__ = ["Point", "Settings", "measure", "PerfError"]
