"""Per-model-version inference statistics, as Triton's statistics extension reports them.

One :class:`ModelStats` per loaded model version is the single source of truth: the
statistics endpoints read it, and so do the Prometheus metrics (which are derived from
it at scrape time, so the two always agree).

With several front-end processes each counts what it served; the server's figures are
their sums: :meth:`ModelStats.snapshot` is what a process sends, :meth:`ModelStats.add_snapshot`
adds one in, and :func:`merge_statistics` sums the statistics extension's lists. Latency
summaries are not carried: quantiles over windows cannot be summed, so they stay per process;
latency histograms are (see ``histogram.py``).
"""
from __future__ import annotations

import collections
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .histogram import FIRST_RESPONSE, Histogram

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
           "cache_miss")


def failed(result: Any) -> bool:
    """Whether a request's result counts as a failure. As Triton's python backend counts
    them, an error response the model returned (``answered``: it cancelled the request, or
    refused it) is the request's answer, a success; an execution that failed, a failure."""
    return isinstance(result, Exception) and not getattr(result, "answered", False)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# Latency summaries (``--metrics-config summary_latencies=true``): the phases they follow,
# and the sliding window their quantiles cover.
SUMMARY_PHASES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
_SUMMARY_BUCKET_S = SUMMARY_MAX_AGE_S / SUMMARY_AGE_BUCKETS


class LatencySummary:
    """One latency's summary, in microseconds: count and sum since start, and quantiles
    over the observations of the last ``SUMMARY_MAX_AGE_S`` seconds. Observations go to
    the newest of ``SUMMARY_AGE_BUCKETS`` buckets that rotate as time passes (as
    prometheus-cpp's summaries age out), and quantiles are computed exactly when asked."""

    __slots__ = ("count", "sum", "_buckets")
    MAX_PER_BUCKET = 1 << 16  # beyond this a bucket keeps a rolling subset (bounded memory)

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0
        self._buckets: collections.deque[tuple[float, array]] = collections.deque()

    def observe(self, value_us: int, now: float) -> None:
        self.count += 1
        self.sum += value_us
        if not self._buckets or now - self._buckets[-1][0] >= _SUMMARY_BUCKET_S:
            self._buckets.append((now, array("d")))
            while len(self._buckets) > SUMMARY_AGE_BUCKETS:
                self._buckets.popleft()
        bucket = self._buckets[-1][1]
        if len(bucket) < self.MAX_PER_BUCKET:
            bucket.append(value_us)
        else:
            bucket[self.count % self.MAX_PER_BUCKET] = value_us

    def quantiles(self, qs: tuple[float, ...], now: float) -> list[float]:
        """The values at quantiles ``qs`` of the window (NaN when it holds nothing)."""
        recent = [b for start, b in self._buckets if now - start < SUMMARY_MAX_AGE_S]
        values = np.concatenate([np.frombuffer(b, dtype=np.float64) for b in recent]) if recent else np.empty(0)
        if not values.size:
            return [float("nan")] * len(qs)
        return [float(v) for v in np.quantile(values, qs, method="inverted_cdf")]


@dataclass(eq=False)
class ModelStats:
    name: str
    version: str
    inference_count: int = 0      # batch elements (samples) that succeeded
    execution_count: int = 0      # model executions
    last_inference_ms: int = 0
    pending: int = 0              # requests queued or executing
    phases: dict[str, Duration] = field(default_factory=lambda: {p: Duration() for p in _PHASES})
    batches: dict[int, BatchStats] = field(default_factory=dict)
    # failures by reason, for nv_inference_request_failure{reason=...}
    failures: dict[str, int] = field(default_factory=dict)
    # per SUMMARY_PHASES, when latency summaries are on (else None: nothing is kept)
    summaries: dict[str, LatencySummary] | None = None
    # nv_inference_first_response_histogram_ms, when latency histograms are on
    first_response: Histogram | None = None

    def __post_init__(self) -> None:
        # The phases every answered request adds to, held directly: the adds are plain
        # attribute updates, with no dict lookups or calls per request.
        phases = self.phases
        self._success, self._queue = phases["success"], phases["queue"]
        self._input, self._infer, self._output = (phases["compute_input"], phases["compute_infer"],
                                                   phases["compute_output"])
        # first_response, for a model whose requests get one response each: timed as they are answered
        self._answered: Histogram | None = None
        # what each answered request's latencies go to when summaries or histograms are on;
        # None while both are off (one check per request)
        self.observe: Callable[[int, int, int, int, int], None] | None = None

    def enable_summaries(self) -> None:
        self.summaries = {phase: LatencySummary() for phase in SUMMARY_PHASES}
        self.observe = self._observe

    def enable_histograms(self, buckets: dict[str, tuple[float, ...]], decoupled: bool) -> None:
        """Latency histograms with these buckets per family. A decoupled model's first
        responses are timed on their streams (``histogram.FirstResponse``), not here."""
        self.first_response = Histogram(buckets[FIRST_RESPONSE])
        if not decoupled:
            self._answered = self.first_response
            self.observe = self._observe

    def _observe(self, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        if self.summaries is not None:
            now = time.monotonic()
            for phase, ns in zip(SUMMARY_PHASES, (total_ns, queue_ns, input_ns, infer_ns, output_ns)):
                self.summaries[phase].observe(ns // 1000, now)
        if self._answered is not None:
            self._answered.observe_ns(total_ns)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution of ``batch_size`` samples (all requests of one batch).
        (Here and in record_success the Durations are added to inline: no call per phase.)"""
        self.execution_count += 1
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStats()
        d = b.compute_input
        d.count += 1
        d.ns += input_ns
        d = b.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = b.compute_output
        d.count += 1
        d.ns += output_ns

    def record_success(self, samples: int, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                       output_ns: int) -> None:
        """One request answered: its end-to-end time and its share of each phase."""
        self.inference_count += samples
        self.last_inference_ms = int(time.time() * 1000)
        d = self._success
        d.count += 1
        d.ns += total_ns
        d = self._queue
        d.count += 1
        d.ns += queue_ns
        d = self._input
        d.count += 1
        d.ns += input_ns
        d = self._infer
        d.count += 1
        d.ns += infer_ns
        d = self._output
        d.count += 1
        d.ns += output_ns
        if self.observe is not None:
            self.observe(total_ns, queue_ns, input_ns, infer_ns, output_ns)

    def record_single(self, samples: int, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                      output_ns: int) -> None:
        """A batch of one request that succeeded (most are): its execution and its success."""
        self.record_execution(samples, input_ns, infer_ns, output_ns)
        self.record_success(samples, total_ns, queue_ns, input_ns, infer_ns, output_ns)

    def record_cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """One request answered from the response cache: a success that never ran the model."""
        self.last_inference_ms = int(time.time() * 1000)
        p = self.phases
        p["success"].add(total_ns)
        p["queue"].add(queue_ns)
        p["cache_hit"].add(hit_ns)
        if self.summaries is not None:
            now = time.monotonic()
            self.summaries["request"].observe(total_ns // 1000, now)
            self.summaries["queue"].observe(queue_ns // 1000, now)
        if self._answered is not None:
            self._answered.observe_ns(total_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A response-cache lookup that found nothing (its lookup and insertion time)."""
        self.phases["cache_miss"].add(miss_ns)

    def record_failure(self, total_ns: int, reason: str, responded: bool = True) -> None:
        """``responded``: False for a request refused before it was queued (queue full), to
        which Triton sends no response: it has no time to first response."""
        self.phases["fail"].add(total_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        if responded and self._answered is not None:
            self._answered.observe_ns(total_ns)

    def snapshot(self) -> dict[str, Any]:
        """Everything additive, JSON-able (string keys, plain ints): what one process sends
        for the server's sums. No latency summaries (see the module's note); the
        histograms, when kept."""
        snap: dict[str, Any] = {
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "last_inference": self.last_inference_ms,  # merged as the latest, not summed
            "pending": self.pending,
            "phases": {p: [d.count, d.ns] for p, d in self.phases.items()},
            "batches": {str(size): [[b.compute_input.count, b.compute_input.ns],
                                    [b.compute_infer.count, b.compute_infer.ns],
                                    [b.compute_output.count, b.compute_output.ns]]
                        for size, b in self.batches.items()},
            "failures": dict(self.failures),
        }
        if self.first_response is not None:
            snap["first_response"] = self.first_response.snapshot()
        return snap

    def add_snapshot(self, snap: dict[str, Any]) -> None:
        """Add another process's :meth:`snapshot` into these statistics."""
        self.inference_count += snap["inference_count"]
        self.execution_count += snap["execution_count"]
        self.last_inference_ms = max(self.last_inference_ms, snap["last_inference"])
        self.pending += snap["pending"]
        for phase, (count, ns) in snap["phases"].items():
            self.phases[phase].add(ns, count)
        for size, parts in snap["batches"].items():
            b = self.batches.get(int(size))
            if b is None:
                b = self.batches[int(size)] = BatchStats()
            for d, (count, ns) in zip((b.compute_input, b.compute_infer, b.compute_output), parts):
                d.add(ns, count)
        for reason, count in snap["failures"].items():
            self.failures[reason] = self.failures.get(reason, 0) + count
        if self.first_response is not None and "first_response" in snap:
            self.first_response.add_snapshot(snap["first_response"])

    def merged_with(self, snapshots: Iterable[dict[str, Any]]) -> "ModelStats":
        """A copy of these statistics with ``snapshots`` added; it shares this process's
        latency summaries (read only), which cannot be summed."""
        merged = ModelStats(self.name, self.version)
        if self.first_response is not None:
            merged.first_response = Histogram(self.first_response.bounds)
        merged.add_snapshot(self.snapshot())
        for snap in snapshots:
            merged.add_snapshot(snap)
        merged.summaries = self.summaries
        return merged

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {p: d.as_dict() for p, d in self.phases.items()},
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.as_dict(),
                 "compute_infer": b.compute_infer.as_dict(), "compute_output": b.compute_output.as_dict()}
                for size, b in sorted(self.batches.items())],
            "memory_usage": [],
        }


def merge_statistics(local: list[dict[str, Any]], peers: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The statistics extension's ``model_stats`` of the whole server: this process's list
    (:meth:`ModelStats.as_dict` entries) and each peer process's, the same model version's
    entries summed field by field (``last_inference`` the latest, ``batch_stats`` per
    batch size). A version only some processes list appears; the order is by name, then
    version, as one process lists them. The inputs are not changed."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for entries in (local, *peers):
        for entry in entries:
            into = merged.get((entry["name"], entry["version"]))
            if into is None:
                into = merged[(entry["name"], entry["version"])] = _empty_like(entry)
            _add_entry(into, entry)
    return sorted(merged.values(), key=lambda e: (e["name"], _version_order(e["version"])))


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def _empty_like(entry: dict[str, Any]) -> dict[str, Any]:
    return {"name": entry["name"], "version": entry["version"], "last_inference": 0, "inference_count": 0,
            "execution_count": 0, "inference_stats": {}, "response_stats": {}, "batch_stats": [],
            "memory_usage": list(entry.get("memory_usage", []))}  # the loaded model's, not a count


def _add_entry(into: dict[str, Any], entry: dict[str, Any]) -> None:
    into["last_inference"] = max(into["last_inference"], entry["last_inference"])
    into["inference_count"] += entry["inference_count"]
    into["execution_count"] += entry["execution_count"]
    _add_durations(into["inference_stats"], entry["inference_stats"])
    for key, phases in entry.get("response_stats", {}).items():
        _add_durations(into["response_stats"].setdefault(key, {}), phases)
    by_size = {b["batch_size"]: b for b in into["batch_stats"]}
    for batch in entry["batch_stats"]:
        target = by_size.get(batch["batch_size"])
        if target is None:
            target = by_size[batch["batch_size"]] = {"batch_size": batch["batch_size"]}
        _add_durations(target, {k: v for k, v in batch.items() if k != "batch_size"})
    into["batch_stats"] = [by_size[size] for size in sorted(by_size)]


def _add_durations(into: dict[str, dict[str, int]], durations: dict[str, dict[str, int]]) -> None:
    """Add ``{phase: {"count", "ns"}}`` into another such dict."""
    for phase, d in durations.items():
        target = into.setdefault(phase, {"count": 0, "ns": 0})
        target["count"] += d["count"]
        target["ns"] += d["ns"]
