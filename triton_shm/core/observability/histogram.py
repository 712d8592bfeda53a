"""Latency histograms (``--metrics-config histogram_latencies=true``), as Triton keeps them:
one family, ``nv_inference_first_response_histogram_ms``, the time from a request's arrival
to its first response (success or error) in whole milliseconds, per model version, decoupled
or not. Its buckets are Triton's defaults unless the model config's ``model_metrics``
names the family with ``histogram_options { buckets: [...] }``.

A request answered by one response is timed where its statistics are recorded
(:class:`~.statistics.ModelStats`); a decoupled model's request is timed when its first
response reaches its stream (:class:`FirstResponse`, wrapped around the stream's queue by
the worker pool only while histograms are on). Histograms add up, so with several
front-end processes the metrics page sums every process's counts.
"""
from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Iterable

from ...errors import InvalidArgument

if TYPE_CHECKING:
    from ..._proto import model_config_pb2

log = logging.getLogger("triton_shm.metrics")

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
# Triton's default buckets (milliseconds); model_metrics overrides them per model.
DEFAULT_BUCKETS: dict[str, tuple[float, ...]] = {FIRST_RESPONSE: (100.0, 500.0, 2000.0, 5000.0)}
_NS_PER_MS = 1_000_000


class Histogram:
    """Counts per bucket (``le`` each bound, then +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0

    def observe_ns(self, ns: int) -> None:
        """One duration, in whole milliseconds as Triton takes it (truncated)."""
        ms = ns // _NS_PER_MS
        self.counts[bisect_left(self.bounds, ms)] += 1
        self.sum += ms

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """What each ``le`` bucket shows: the observations at or below its bound (+Inf last)."""
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out

    def snapshot(self) -> list[Any]:
        return [self.sum, list(self.counts)]

    def add_snapshot(self, snap: list[Any]) -> None:
        """Another process's :meth:`snapshot` of the same model (same buckets: same config)."""
        total, counts = snap
        if len(counts) != len(self.counts):
            log.warning("a histogram of %d buckets can not be added to one of %d", len(counts), len(self.counts))
            return
        self.sum += total
        self.counts = [a + b for a, b in zip(self.counts, counts)]


class FirstResponse:
    """A decoupled request's stream queue that times the first response put on it (a
    response or an error; a bare final flag is no response) into ``histogram``, from
    ``opened_ns`` (when the request's stream was opened)."""

    __slots__ = ("queue", "histogram", "opened_ns")

    def __init__(self, queue: Any, histogram: Histogram, opened_ns: int):
        self.queue, self.opened_ns = queue, opened_ns
        self.histogram: Histogram | None = histogram  # None once the first response is timed

    def put_nowait(self, item: tuple[Any, bool]) -> None:
        histogram = self.histogram
        if histogram is not None and item[0] is not None:
            histogram.observe_ns(time.monotonic_ns() - self.opened_ns)
            self.histogram = None
        self.queue.put_nowait(item)


def check_model_metrics(config: "model_config_pb2.ModelConfig") -> None:
    """Triton's checks of ``model_metrics`` (a load fails with them), and buckets a
    Prometheus histogram can have: finite and increasing."""
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise InvalidArgument("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise InvalidArgument("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise InvalidArgument("metric control must specify 'histogram_options'")
        buckets = list(control.histogram_options.buckets)
        if not buckets:
            raise InvalidArgument("histogram options must specify non-empty 'buckets'")
        family = control.metric_identifier.family
        if not all(math.isfinite(b) for b in buckets):
            raise InvalidArgument(f"histogram buckets of '{family}' must be finite numbers, got {buckets}")
        if any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise InvalidArgument(f"histogram buckets of '{family}' must be in increasing order, got {buckets}")


def histogram_buckets(config: "model_config_pb2.ModelConfig") -> dict[str, tuple[float, ...]]:
    """Each family's buckets for this model: Triton's defaults, overridden by ``model_metrics``
    (a family that is not a histogram here is warned about and ignored, as Triton does)."""
    buckets = dict(DEFAULT_BUCKETS)
    for control in config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family in buckets:
            buckets[family] = tuple(control.histogram_options.buckets)
        else:
            log.warning("Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.",
                        family)
    return buckets
