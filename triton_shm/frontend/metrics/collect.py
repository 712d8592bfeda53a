"""What the metrics page holds: Triton's families, derived from each loaded version's
statistics at scrape time, and the latest CPU/GPU readings.

With several front-end processes the page is served by one and counts the whole server:
its ``peer_snapshots`` hook gathers the others' :func:`local_snapshots`, added to a copy of
each loaded version's statistics, and their response caches' counters, summed with this
process's cache. Latency summaries stay this process's own (quantiles can not be summed);
latency histograms are summed like the counters."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ...core.observability.histogram import FIRST_RESPONSE
from ...core.observability.statistics import SUMMARY_PHASES
from .system_metrics import CpuReading, CpuSampler, GpuReading, NvmlSampler
from .cache import CacheTotals, cache_families, model_cache_families
from .config import MetricsConfig
from .exposition import Family, Sample, render

if TYPE_CHECKING:
    from ...core.models.repository import ModelRepository
    from ...core.models.version import ModelVersion
    from ...core.data.response_cache import ResponseCache
    from ...core.observability.statistics import ModelStats

log = logging.getLogger("triton_shm.metrics")

# Triton always exports these failure reasons (at 0 until they happen).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def _us(phase: str) -> Callable[["ModelStats"], int]:
    return lambda s: s.phases[phase].ns // 1000


# name, type, HELP (Triton 2.51's texts), value from ModelStats
_MODEL_SERIES: tuple[tuple[str, str, str, Callable[["ModelStats"], int]], ...] = (
    ("nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes", lambda s: s.phases["success"].count),
    ("nv_inference_count", "counter",
     "Number of inferences performed (does not include cached requests)", lambda s: s.inference_count),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)", lambda s: s.execution_count),
    # Triton adds only successful requests' durations (failed ones are not included).
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)", _us("success")),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", _us("queue")),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     _us("compute_input")),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     _us("compute_infer")),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     _us("compute_output")),
)
_FAILURE = ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")

# the latency counters above (--metrics-config counter_latencies=false drops them)
_LATENCY_COUNTERS = {"nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                     "nv_inference_compute_output_duration_us"}

# name, HELP (Triton 2.51's texts, "Cumulative" in three of them included), per statistics.SUMMARY_PHASES
_SUMMARIES = dict(zip(SUMMARY_PHASES, (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
)))

_FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"

_PENDING = ("nv_inference_pending_request_count", "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.")

_CPU_SERIES = (
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]", "utilization"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes", "memory_total_bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes", "memory_used_bytes"),
)

_GPU_SERIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", "memory_total_bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", "memory_used_bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", "power_usage_w"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", "power_limit_w"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started",
     "energy_j"),
)


# Each peer process's {"<model>/<version>": snapshot} (see local_snapshots), and its
# response cache's counters under CACHE (no model key lacks a "/").
PeerSnapshots = Callable[[], Awaitable[list[dict[str, dict[str, Any]]]]]
CACHE = "cache"


@dataclass(frozen=True)
class Loaded:
    """A loaded version and its statistics (with ``peers_queued``, the requests the other
    front-end processes hold queued for it, whose counts ``stats`` then includes)."""
    version: "ModelVersion"
    stats: "ModelStats"
    peers_queued: int = 0

    @property
    def labels(self) -> dict[str, str]:
        return {"model": self.version.name, "version": str(self.version.version)}

    def queued(self) -> int:
        """Requests waiting in the scheduler's queues (Triton: enqueued, not yet handed to
        the backend). A scheduler without queues of its own (an ensemble's) counts its
        requests in flight."""
        return self.local_queued() + self.peers_queued

    def local_queued(self) -> int:
        scheduler = self.version.scheduler
        if scheduler is None:
            return self.version.stats.pending if self.version.stats else 0
        queues = getattr(scheduler, "queues", None)
        if queues is None:
            return scheduler.inflight_count()
        return sum(len(q) for q in queues.values())

    @property
    def key(self) -> str:
        return f"{self.version.name}/{self.version.version}"


def loaded_versions(repository: "ModelRepository") -> list[Loaded]:
    """The versions Triton has metrics for: the loaded (ready) ones, as the statistics
    endpoint lists them."""
    loaded = [Loaded(mv, mv.stats) for e in repository.models.values() for mv in e.versions.values()
              if mv.stats and mv.ready]
    return sorted(loaded, key=lambda m: (m.version.name, m.version.version))


def local_snapshots(repository: "ModelRepository", cache: "ResponseCache | None" = None
                    ) -> dict[str, dict[str, Any]]:
    """What a front-end process sends for the metrics page: each loaded version's
    :meth:`ModelStats.snapshot` under ``"<model>/<version>"``, with ``queued`` (what its
    pending-request gauge shows here), and ``cache``'s counters under ``CACHE``."""
    snapshots = {m.key: {**m.stats.snapshot(), "queued": m.local_queued()} for m in loaded_versions(repository)}
    if cache is not None:
        snapshots[CACHE] = cache.counters()
    return snapshots


def with_peers(versions: list[Loaded], peers: list[dict[str, dict[str, Any]]]) -> list[Loaded]:
    """``versions`` with the peer processes' snapshots of each added to a copy of its stats
    (a version this process has not loaded is left out: the page lists what it serves)."""
    merged = []
    for m in versions:
        snaps = [p[m.key] for p in peers if m.key in p]
        merged.append(Loaded(m.version, m.stats.merged_with(snaps), sum(s.get("queued", 0) for s in snaps)))
    return merged


def model_families(versions: list[Loaded], config: MetricsConfig = MetricsConfig()) -> list[Family]:
    if not versions:
        return []
    families = []
    for name, kind, help_text, value in _MODEL_SERIES:
        if name in _LATENCY_COUNTERS and not config.counter_latencies:
            continue
        families.append(Family(name, kind, help_text, [Sample(m.labels, value(m.stats)) for m in versions]))
        if name == "nv_inference_request_success":  # Triton's order: failures next
            families.append(_failures(versions))
    families += model_cache_families(versions)  # models with response_cache on, with or without a cache
    families.append(Family(*_PENDING, [Sample(m.labels, m.queued()) for m in versions]))
    if config.histogram_latencies:
        families += histogram_families(versions)
    if config.summary_latencies:
        families += summary_families(versions, config.summary_quantiles)
    return families


def _failures(versions: list[Loaded]) -> Family:
    samples = []
    for m in versions:
        failures = m.stats.failures
        for reason in sorted(set(FAILURE_REASONS) | set(failures)):
            samples.append(Sample({**m.labels, "reason": reason}, failures.get(reason, 0)))
    return Family(*_FAILURE, samples)


def histogram_families(versions: list[Loaded]) -> list[Family]:
    """Triton's histogram family (of every version that keeps it, from its load on)."""
    family = Family(FIRST_RESPONSE, "histogram", _FIRST_RESPONSE_HELP)
    for m in versions:
        histogram = m.stats.first_response
        if histogram is None:
            continue
        family.samples.append(Sample(m.labels, histogram.count, "_count"))
        family.samples.append(Sample(m.labels, histogram.sum, "_sum"))
        bounds = [f"{_bound(b)}" for b in histogram.bounds] + ["+Inf"]
        family.samples += [Sample({**m.labels, "le": le}, count, "_bucket")
                           for le, count in zip(bounds, histogram.cumulative())]
    return [family]


def _bound(value: float) -> str:
    """A bucket's bound as prometheus-cpp prints it: 100, 2.5, -1."""
    return str(int(value)) if value.is_integer() else repr(value)


def summary_families(versions: list[Loaded], quantiles: tuple[float, ...]) -> list[Family]:
    """For the versions that keep latency summaries (none: no families)."""
    now = time.monotonic()
    kept = [(m.labels, m.stats.summaries) for m in versions if m.stats.summaries is not None]
    if not kept:
        return []
    families = []
    for phase, (name, help_text) in _SUMMARIES.items():
        family = Family(name, "summary", help_text)
        for labels, summaries in kept:
            summary = summaries[phase]
            family.samples.append(Sample(labels, summary.count, "_count"))
            family.samples.append(Sample(labels, summary.sum, "_sum"))
            family.samples += [Sample({**labels, "quantile": f"{q:g}"}, v)
                               for q, v in zip(quantiles, summary.quantiles(quantiles, now))]
        families.append(family)
    return families


def cpu_families(reading: CpuReading | None) -> list[Family]:
    if reading is None:
        return []
    return [Family(name, kind, help_text, [Sample({}, getattr(reading, attr))])
            for name, kind, help_text, attr in _CPU_SERIES]


def gpu_families(readings: list[GpuReading]) -> list[Family]:
    return [Family(name, kind, help_text, [Sample({"gpu_uuid": r.uuid}, getattr(r, attr))
                                           for r in readings if getattr(r, attr) is not None])
            for name, kind, help_text, attr in _GPU_SERIES]


class MetricsCollector:
    """Holds the latest CPU/GPU readings and renders the whole page."""

    def __init__(self, repository: "ModelRepository", *, cpu: bool = True, gpu: bool = True,
                 gpus: list[int] | None = None, config: MetricsConfig = MetricsConfig(),
                 cache: "ResponseCache | None" = None, peer_snapshots: PeerSnapshots | None = None):
        self.repository, self.config, self.cache = repository, config, cache
        self.peer_snapshots = peer_snapshots  # the other front-end processes' statistics
        self.cpu: CpuSampler | None = CpuSampler() if cpu else None
        if self.cpu is not None and not self.cpu.available:
            log.info("CPU metrics are not available: no /proc/stat or /proc/meminfo")
            self.cpu = None
        self.gpu: NvmlSampler | None = NvmlSampler(gpus) if gpu else None
        if self.gpu is not None and not self.gpu.available:
            self.gpu.close()
            self.gpu = None
        self.cpu_reading: CpuReading | None = None
        self.gpu_readings: list[GpuReading] = []

    @property
    def samples_system(self) -> bool:
        return self.cpu is not None or self.gpu is not None

    def sample(self) -> None:
        """Blocking reads of /proc and NVML (run it off the event loop)."""
        if self.cpu is not None:
            self.cpu_reading = self.cpu.sample()
        if self.gpu is not None:
            self.gpu_readings = self.gpu.sample()

    def families(self, peers: list[dict[str, dict[str, Any]]] | None = None) -> list[Family]:
        versions = loaded_versions(self.repository)
        if peers:
            versions = with_peers(versions, peers)
        caches = [] if self.cache is None else [self.cache.counters(), *(p[CACHE] for p in peers or () if CACHE in p)]
        return (model_families(versions, self.config)
                + cpu_families(self.cpu_reading) + gpu_families(self.gpu_readings)
                + (cache_families(CacheTotals.summed(caches)) if caches else []))

    def render(self) -> str:
        """This process's page (the peers' statistics are only gathered by :meth:`render_async`)."""
        return render(self.families())

    async def render_async(self) -> str:
        """The page for the whole server: the peers' statistics added, when there is a hook."""
        if self.peer_snapshots is None:
            return self.render()
        return render(self.families(await self.peer_snapshots()))

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
