"""Prometheus metrics on the metrics port, under Triton's names, labels and HELP texts,
so dashboards and ``perf_analyzer --collect-metrics`` written for tritonserver work.

Per-model series are derived from each loaded version's :class:`ModelStats` at scrape
time (nothing is counted twice), so ``/metrics`` and the statistics endpoint always
agree. CPU and GPU readings are sampled every ``--metrics-interval-ms`` by a background
task and the latest readings are served.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from aiohttp import web

from ..core.statistics import SUMMARY_PHASES
from ..core.system_metrics import CpuReading, CpuSampler, GpuReading, NvmlSampler
from .cache_metrics import render_cache_metrics, render_model_cache_metrics
from .http.app import serve_app

if TYPE_CHECKING:
    from ..core.repository import ModelRepository, ModelVersion
    from ..core.response_cache import ResponseCache
    from ..core.statistics import ModelStats

log = logging.getLogger("triton_shm.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Triton always exports these failure reasons (at 0 until they happen).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def _us(phase: str) -> Callable[["ModelStats"], int]:
    return lambda s: s.phases[phase].ns // 1000


# name, type, HELP (Triton 2.51's texts), value from ModelStats
_MODEL_SERIES: tuple[tuple[str, str, str, Callable[["ModelStats"], int] | None], ...] = (
    ("nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes", lambda s: s.phases["success"].count),
    ("nv_inference_request_failure", "counter",
     "Number of failed inference requests, all batch sizes", None),  # by reason, below
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


# -- --metrics-config ----------------------------------------------------------------------
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True)
class MetricsConfig:
    """Triton's ``--metrics-config <setting>=<value>`` flags that this server honours."""
    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[float, ...] = DEFAULT_QUANTILES

    @classmethod
    def parse(cls, items: Iterable[str]) -> "MetricsConfig":
        """Raises ValueError with the flag's text on anything it does not understand."""
        values: dict[str, object] = {}
        for item in items:
            key, sep, value = (x.strip() for x in item.partition("="))
            if not sep or not key:
                raise ValueError(f"--metrics-config: expected <setting>=<value>, got '{item}'")
            if key in ("counter_latencies", "summary_latencies"):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"--metrics-config {item}: expected true or false")
                values[key] = value.lower() in ("true", "1")
            elif key == "summary_quantiles":
                values[key] = _parse_quantiles(item, value)
            else:
                raise ValueError(f"--metrics-config: unknown setting '{key}' (known: counter_latencies, "
                                 "summary_latencies, summary_quantiles)")
        return cls(**values)  # type: ignore[arg-type]


def _parse_quantiles(item: str, value: str) -> tuple[float, ...]:
    """``<quantile>:<error>,...`` (the error is the allowed rank error of a streaming
    estimate; quantiles here are exact over the window, so it is checked and not needed)."""
    quantiles = []
    for part in value.strip("\"'").split(","):
        q, _, err = part.partition(":")
        try:
            qv, ev = float(q), float(err or 0)
        except ValueError:
            raise ValueError(f"--metrics-config {item}: expected <quantile>:<error>,...") from None
        if not 0 <= qv <= 1 or not 0 <= ev <= 1:
            raise ValueError(f"--metrics-config {item}: quantiles and errors must be within [0, 1]")
        quantiles.append(qv)
    return tuple(quantiles)


# -- text exposition format --------------------------------------------------------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(**labels: str) -> str:
    # sorted like prometheus-cpp (Triton) prints them: model, reason, version
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def _family(out: list[str], name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float | int]]) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")
    out.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)


def _queued(mv: "ModelVersion") -> int:
    """Requests waiting in the scheduler's queues (Triton: enqueued, not yet handed to
    the backend). Falls back to queued+executing if there is no scheduler to ask."""
    scheduler = mv.scheduler
    queues = getattr(scheduler, "queues", None)
    if queues is None:
        return mv.stats.pending if mv.stats else 0
    return sum(len(q) for q in queues.values())


def loaded_versions(repository: "ModelRepository") -> list["ModelVersion"]:
    """The versions Triton has metrics for: the loaded (ready) ones, as the statistics
    endpoint lists them."""
    versions = [mv for e in repository.models.values() for mv in e.versions.values() if mv.stats and mv.ready]
    return sorted(versions, key=lambda m: (m.name, m.version))


def render_model_metrics(out: list[str], versions: list["ModelVersion"],
                         config: MetricsConfig = MetricsConfig(), cache: "ResponseCache | None" = None) -> None:
    if not versions:
        return
    for name, kind, help_text, value in _MODEL_SERIES:
        if name in _LATENCY_COUNTERS and not config.counter_latencies:
            continue
        if value is not None:
            samples = [(_labels(model=mv.name, version=str(mv.version)), value(mv.stats)) for mv in versions]
        else:  # failures, by reason
            samples = []
            for mv in versions:
                failures = mv.stats.failures
                for reason in sorted(set(FAILURE_REASONS) | set(failures)):
                    samples.append((_labels(model=mv.name, reason=reason, version=str(mv.version)),
                                    failures.get(reason, 0)))
        _family(out, name, kind, help_text, samples)
    if cache is not None:
        render_model_cache_metrics(out, versions, _family, _labels)
    _family(out, *_PENDING, [(_labels(model=mv.name, version=str(mv.version)), _queued(mv)) for mv in versions])
    summarized = [mv for mv in versions if mv.stats.summaries is not None]
    if config.summary_latencies and summarized:
        render_summaries(out, summarized, config.summary_quantiles)


def render_summaries(out: list[str], versions: list["ModelVersion"], quantiles: tuple[float, ...]) -> None:
    now = time.monotonic()
    for phase, (name, help_text) in _SUMMARIES.items():
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} summary")
        for mv in versions:
            summary = mv.stats.summaries[phase]
            labels = _labels(model=mv.name, version=str(mv.version))
            out.append(f"{name}_count{labels} {summary.count}")
            out.append(f"{name}_sum{labels} {summary.sum}")
            for q, v in zip(quantiles, summary.quantiles(quantiles, now)):  # quantile last, as Triton prints it
                out.append(f'{name}{labels[:-1]},quantile="{q:g}"}} {_number(v)}')


def render_cpu_metrics(out: list[str], reading: CpuReading | None) -> None:
    if reading is None:
        return
    for name, kind, help_text, attr in _CPU_SERIES:
        _family(out, name, kind, help_text, [("", getattr(reading, attr))])


def render_gpu_metrics(out: list[str], readings: list[GpuReading]) -> None:
    if not readings:
        return
    for name, kind, help_text, attr in _GPU_SERIES:
        samples = [(_labels(gpu_uuid=r.uuid), getattr(r, attr)) for r in readings if getattr(r, attr) is not None]
        if samples:
            _family(out, name, kind, help_text, samples)


# -- the metrics service -----------------------------------------------------------------
class MetricsCollector:
    """Holds the latest CPU/GPU readings and renders the whole page."""

    def __init__(self, repository: "ModelRepository", *, cpu: bool = True, gpu: bool = True,
                 gpus: list[int] | None = None, config: MetricsConfig = MetricsConfig(),
                 cache: "ResponseCache | None" = None):
        self.repository, self.config, self.cache = repository, config, cache
        self.cpu = CpuSampler() if cpu else None
        if self.cpu is not None and not self.cpu.available:
            log.info("CPU metrics are not available: no /proc/stat or /proc/meminfo")
            self.cpu = None
        self.gpu = NvmlSampler(gpus) if gpu else None
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

    def render(self) -> str:
        out: list[str] = []
        render_model_metrics(out, loaded_versions(self.repository), self.config, self.cache)
        render_cpu_metrics(out, self.cpu_reading)
        render_gpu_metrics(out, self.gpu_readings)
        if self.cache is not None:
            render_cache_metrics(out, self.cache, _family)
        return "\n".join(out) + "\n" if out else ""

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None


async def _sample_forever(collector: MetricsCollector, interval_s: float) -> None:
    while True:
        try:
            await asyncio.to_thread(collector.sample)
        except Exception:  # noqa: BLE001 - a bad reading must not stop the sampler
            log.exception("metrics sampling failed")
        await asyncio.sleep(interval_s)


def create_metrics_app(collector: MetricsCollector, interval_ms: float = 2000) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=collector.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def sampler(_app: web.Application):
        task = None
        if collector.samples_system:
            collector.sample()  # first readings before the port answers
            task = asyncio.get_running_loop().create_task(
                _sample_forever(collector, max(interval_ms, 1.0) / 1000.0))
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        collector.close()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(sampler)
    return app


async def start_metrics(repository: "ModelRepository", host: str, port: int, *, cpu: bool = True,
                        gpu: bool = True, interval_ms: float = 2000, gpus: list[int] | None = None,
                        config: MetricsConfig = MetricsConfig(),
                        cache: "ResponseCache | None" = None) -> web.AppRunner:
    """Serve ``GET /metrics`` on ``host:port``; stop it with ``await runner.cleanup()``
    (which also stops the sampler)."""
    collector = MetricsCollector(repository, cpu=cpu, gpu=gpu, gpus=gpus, config=config, cache=cache)
    return await serve_app(create_metrics_app(collector, interval_ms), host, port, shutdown_timeout=1.0)
