"""Per-model-version inference statistics, as Triton's statistics extension reports them.

One :class:`ModelStats` per loaded model version is the single source of truth: the
statistics endpoints read it, and so do the Prometheus metrics (which are derived from
it at scrape time, so the two always agree).
"""
from __future__ import annotations

import collections
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
           "cache_miss")


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

    def __post_init__(self) -> None:
        # The phases every answered request adds to, held directly: the adds are plain
        # attribute updates, with no dict lookups or calls per request.
        phases = self.phases
        self._success, self._queue = phases["success"], phases["queue"]
        self._input, self._infer, self._output = (phases["compute_input"], phases["compute_infer"],
                                                   phases["compute_output"])

    def enable_summaries(self) -> None:
        self.summaries = {phase: LatencySummary() for phase in SUMMARY_PHASES}

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
        if self.summaries is not None:
            now = time.monotonic()
            for phase, ns in zip(SUMMARY_PHASES, (total_ns, queue_ns, input_ns, infer_ns, output_ns)):
                self.summaries[phase].observe(ns // 1000, now)

    def record_single(self, samples: int, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                      output_ns: int) -> None:
        """``record_execution(samples, ...)`` then ``record_success(samples, ...)``: a batch of
        one request that succeeded (most are), in one call. Their bodies are repeated here on
        purpose (timeit, CPython 3.11: 0.61 µs a call; calling the two, 0.65). It stays Python:
        the same body compiled by Cython measured 0.91 µs, its generic attribute access on these
        Python objects slower than the interpreter's specialised bytecode."""
        self.execution_count += 1
        b = self.batches.get(samples)
        if b is None:
            b = self.batches[samples] = BatchStats()
        d = b.compute_input
        d.count += 1
        d.ns += input_ns
        d = b.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = b.compute_output
        d.count += 1
        d.ns += output_ns
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
        if self.summaries is not None:
            now = time.monotonic()
            for phase, ns in zip(SUMMARY_PHASES, (total_ns, queue_ns, input_ns, infer_ns, output_ns)):
                self.summaries[phase].observe(ns // 1000, now)

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

    def record_cache_miss(self, miss_ns: int) -> None:
        """A response-cache lookup that found nothing (its lookup and insertion time)."""
        self.phases["cache_miss"].add(miss_ns)

    def record_failure(self, total_ns: int, reason: str) -> None:
        self.phases["fail"].add(total_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1

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
