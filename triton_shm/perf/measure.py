"""Measurement windows, stability, percentiles and the server-side split.

As perf_analyzer: the load runs continuously; every ``--measurement-interval`` a window
closes with the requests that completed inside it. A step is stable when the last three
windows' throughput and latency (average, or the ``--percentile`` one) all lie within
``--stability-percentage`` of their mean; the step's result merges those three windows.
The server-side numbers are deltas of the statistics extension over the same windows,
divided by the requests the server completed (queue, compute input / infer / output per
request, in microseconds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

STABILITY_WINDOWS = 3
_PHASES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


class Recorder:
    """Completion records of the running load: appended by the request tasks, taken per window."""

    __slots__ = ("latencies", "errors", "first_error", "sent")

    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.errors = 0
        self.first_error: str | None = None
        self.sent = 0

    def ok(self, ns: int) -> None:
        self.latencies.append(ns)

    def error(self, msg: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = msg

    def take(self) -> tuple[list[int], int]:
        lat, errs = self.latencies, self.errors
        self.latencies, self.errors = [], 0
        return lat, errs


@dataclass
class ServerSnapshot:
    success_count: int = 0
    inference_count: int = 0
    execution_count: int = 0
    ns: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_stats(cls, stats: dict[str, Any], model: str) -> "ServerSnapshot":
        snap = cls(ns={p: 0 for p in _PHASES})
        for m in stats.get("model_stats", []) or []:
            if m.get("name", model) != model:
                continue
            snap.inference_count += int(m.get("inference_count", 0) or 0)
            snap.execution_count += int(m.get("execution_count", 0) or 0)
            istats = m.get("inference_stats", {}) or {}
            for p in _PHASES:
                d = istats.get(p, {}) or {}
                snap.ns[p] += int(d.get("ns", 0) or 0)
                if p == "success":
                    snap.success_count += int(d.get("count", 0) or 0)
        return snap

    def __sub__(self, other: "ServerSnapshot") -> "ServerSnapshot":
        return ServerSnapshot(self.success_count - other.success_count,
                              self.inference_count - other.inference_count,
                              self.execution_count - other.execution_count,
                              {p: self.ns.get(p, 0) - other.ns.get(p, 0) for p in _PHASES})

    def __add__(self, other: "ServerSnapshot") -> "ServerSnapshot":
        return ServerSnapshot(self.success_count + other.success_count,
                              self.inference_count + other.inference_count,
                              self.execution_count + other.execution_count,
                              {p: self.ns.get(p, 0) + other.ns.get(p, 0) for p in _PHASES})

    def per_request_us(self, phase: str) -> float:
        return self.ns.get(phase, 0) / self.success_count / 1000.0 if self.success_count else 0.0


@dataclass
class Window:
    duration_s: float
    latencies_ns: list[int]
    errors: int
    cpu_s: float
    server: ServerSnapshot | None
    sent: int = 0                 # requests sent during the window

    @property
    def requests(self) -> int:
        return len(self.latencies_ns)


def percentile(sorted_values: list[int], p: float) -> float:
    """Nearest-rank percentile (as perf_analyzer) of an ascending list."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100.0 * len(sorted_values)) - 1))
    return float(sorted_values[k])


@dataclass
class Result:
    """One step (a concurrency or a request rate), merged over its stable windows."""

    mode: str                     # "concurrency" | "request_rate"
    value: float
    batch_size: int
    requests: int
    errors: int
    duration_s: float
    throughput: float             # inferences per second (requests x batch size)
    avg_us: float
    std_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    pct_us: float | None          # the --percentile latency, when asked
    client_cpu_pct: float
    stable: bool
    server: ServerSnapshot | None
    send_rate: float = 0.0        # requests actually sent per second
    first_error: str | None = None

    @property
    def latency_us(self) -> float:
        """The latency reported and used for stability: --percentile's, else the average."""
        return self.pct_us if self.pct_us is not None else self.avg_us

    @property
    def server_us(self) -> dict[str, float]:
        if self.server is None:
            return {}
        return {p: self.server.per_request_us(p) for p in _PHASES}


def summarize(windows: list[Window], *, mode: str, value: float, batch_size: int, pct: float | None,
              stable: bool) -> Result:
    lat = sorted(ns for w in windows for ns in w.latencies_ns)
    dur = sum(w.duration_s for w in windows)
    n = len(lat)
    avg = sum(lat) / n if n else 0.0
    std = math.sqrt(sum((x - avg) ** 2 for x in lat) / n) if n else 0.0
    server = windows[0].server if windows else None  # the sum, if every window has one
    for w in windows[1:]:
        server = server + w.server if server is not None and w.server is not None else None
    cpu = sum(w.cpu_s for w in windows)
    return Result(mode=mode, value=value, batch_size=batch_size, requests=n,
                  errors=sum(w.errors for w in windows), duration_s=dur,
                  throughput=n * batch_size / dur if dur > 0 else 0.0,
                  avg_us=avg / 1000, std_us=std / 1000,
                  p50_us=percentile(lat, 50) / 1000, p90_us=percentile(lat, 90) / 1000,
                  p95_us=percentile(lat, 95) / 1000, p99_us=percentile(lat, 99) / 1000,
                  pct_us=percentile(lat, pct) / 1000 if pct is not None else None,
                  client_cpu_pct=100.0 * cpu / dur if dur > 0 else 0.0, stable=stable, server=server)


def window_metric(w: Window, pct: float | None) -> tuple[float, float]:
    """(requests per second, latency ns) of one window, latency as chosen by --percentile."""
    if not w.latencies_ns or w.duration_s <= 0:
        return 0.0, 0.0
    lat = sorted(w.latencies_ns)
    latency = percentile(lat, pct) if pct is not None else sum(lat) / len(lat)
    return len(lat) / w.duration_s, latency


def is_stable(windows: list[Window], stability_pct: float, pct: float | None) -> bool:
    if len(windows) < STABILITY_WINDOWS:
        return False
    last = [window_metric(w, pct) for w in windows[-STABILITY_WINDOWS:]]
    tol = stability_pct / 100.0
    for idx in (0, 1):
        vals = [m[idx] for m in last]
        mean = sum(vals) / len(vals)
        if mean <= 0:
            return False
        if any(abs(v / mean - 1.0) > tol for v in vals):
            return False
    return True

