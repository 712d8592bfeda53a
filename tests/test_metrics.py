"""Prometheus metrics on the metrics port: Triton's names, labels, HELP/TYPE texts, and
values that agree exactly with the statistics endpoint."""
from __future__ import annotations

import ctypes
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_shm.cli import parse_args
from triton_shm.core.models.config import ModelConfig
from triton_shm.frontend.metrics.system_metrics import CpuSampler, NvmlSampler
from triton_shm.core.observability.statistics import ModelStats
from triton_shm.frontend.metrics import MetricsCollector, MetricsConfig

from .harness import ServerProcess, free_port
from .models import onnx_add_sub, python_identity, write_model

ADD_SUB_CONFIG = """
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

# Raises when the first element is negative; sleeps that many seconds when positive.
FLAKY_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.reshape(-1)[0] < 0:
                raise ValueError("asked to fail")
            time.sleep(float(x.reshape(-1)[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

FLAKY_CONFIG = """
name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

HELP_TYPE = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (does not include cached requests)"),
    "nv_inference_request_duration_us": (
        "counter", "Cumulative inference request duration in microseconds (includes cached requests)"),
    "nv_inference_queue_duration_us": (
        "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    "nv_inference_compute_input_duration_us": (
        "counter", "Cumulative compute input duration in microseconds (does not include cached requests)"),
    "nv_inference_compute_infer_duration_us": (
        "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    "nv_inference_compute_output_duration_us": (
        "counter", "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    "nv_inference_pending_request_count": (
        "gauge", "Instantaneous number of pending requests awaiting execution per-model."),
    "nv_cpu_utilization": ("gauge", "CPU utilization rate [0.0 - 1.0]"),
    "nv_cpu_memory_total_bytes": ("gauge", "CPU total memory (RAM), in bytes"),
    "nv_cpu_memory_used_bytes": ("gauge", "CPU used memory (RAM), in bytes"),
}

PHASE_OF = {
    "nv_inference_request_duration_us": "success",
    "nv_inference_queue_duration_us": "queue",
    "nv_inference_compute_input_duration_us": "compute_input",
    "nv_inference_compute_infer_duration_us": "compute_infer",
    "nv_inference_compute_output_duration_us": "compute_output",
}

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


# --------------------------------------------------------------------------- helpers
def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    return parse(scrape_text(port))


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def model_value(samples, name: str, model: str, **extra: str) -> float:
    return samples[key(name, model=model, version="1", **extra)]


def add_sub_inputs(mod, rows: int):
    a = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    inputs = [mod.InferInput("INPUT0", [rows, 16], "FP32"), mod.InferInput("INPUT1", [rows, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs


def flaky_input(mod, value: float):
    inp = mod.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.array([value], dtype=np.float32))
    return [inp]


def stats_of(server: ServerProcess, model: str) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    return client.get_inference_statistics(model_name=model)["model_stats"][0]


def build_repo(repo: Path) -> Path:
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
    write_model(repo, "flaky", config=FLAKY_CONFIG, model_py=FLAKY_PY)
    return repo


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def port_refuses(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    repo = build_repo(root / "models")
    port = free_port()
    srv = ServerProcess(repo, root / "server.log",
                        extra_args=["--allow-metrics=true", "--metrics-port", str(port),
                                    "--metrics-interval-ms", "200"]).start()
    srv.metrics_port = port
    yield srv
    srv.stop_cleanly()


# --------------------------------------------------------------------------- command line
def test_metrics_flags_parse_in_tritonserver_forms():
    o = parse_args(["--model-repository", "/m", "--allow-metrics", "false", "--allow-metrics=true",
                    "--metrics-port=9102", "--allow-cpu-metrics", "false", "--allow-gpu-metrics=False",
                    "--metrics-interval-ms", "250.5", "--metrics-address=127.0.0.1"])
    assert o.allow_metrics is True   # the last one wins, as the harness relies on
    assert o.metrics_port == 9102
    assert o.allow_cpu_metrics is False and o.allow_gpu_metrics is False
    assert o.metrics_interval_ms == 250.5 and o.metrics_address == "127.0.0.1"
    d = parse_args(["--model-repository", "/m"])
    assert d.allow_metrics and d.allow_cpu_metrics and d.allow_gpu_metrics
    assert d.metrics_port == 8002 and d.metrics_interval_ms == 2000 and d.metrics_address is None


# --------------------------------------------------------------------------- rendering (no server)
def test_render_is_derived_from_model_stats():
    stats = ModelStats("m\"x", "3")
    stats.record_execution(2, 1000, 5_000_000, 3000)
    stats.record_success(2, 7_654_321, 1_999, 1000, 5_000_000, 3000)
    stats.record_failure(10_000, "BACKEND")
    stats.record_failure(10_000, "BACKEND")
    mv = SimpleNamespace(name='m"x', version=3, stats=stats, ready=True, config=ModelConfig(),
                         scheduler=SimpleNamespace(queues={0: [object(), object()], 1: [object()]}))
    repo = SimpleNamespace(models={"m": SimpleNamespace(versions={3: mv})})
    collector = MetricsCollector(repo, cpu=False, gpu=False)
    text = collector.render()
    lines = text.splitlines()
    assert '# TYPE nv_inference_request_success counter' in lines
    assert 'nv_inference_request_success{model="m\\"x",version="3"} 1' in lines
    assert 'nv_inference_request_failure{model="m\\"x",reason="BACKEND",version="3"} 2' in lines
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert f'nv_inference_request_failure{{model="m\\"x",reason="{reason}",version="3"}} 0' in lines
    assert 'nv_inference_count{model="m\\"x",version="3"} 2' in lines
    assert 'nv_inference_exec_count{model="m\\"x",version="3"} 1' in lines
    assert 'nv_inference_request_duration_us{model="m\\"x",version="3"} 7654' in lines
    assert 'nv_inference_queue_duration_us{model="m\\"x",version="3"} 1' in lines
    assert 'nv_inference_compute_infer_duration_us{model="m\\"x",version="3"} 5000' in lines
    assert 'nv_inference_compute_output_duration_us{model="m\\"x",version="3"} 3' in lines
    assert 'nv_inference_pending_request_count{model="m\\"x",version="3"} 3' in lines
    assert not any(line.startswith(("nv_cpu", "nv_gpu")) for line in lines)
    parse(text)  # every sample line is well-formed

    mv.ready = False  # unloaded/unavailable versions have no series, as in Triton
    assert collector.render() == ""


def fake_repository(versions: dict[str, ModelStats], queued: int = 0) -> SimpleNamespace:
    """A repository holding ``versions`` (model name -> its version 1's stats), each with
    ``queued`` requests in its scheduler's queue."""
    def version(name: str, stats: ModelStats) -> SimpleNamespace:
        return SimpleNamespace(name=name, version=1, stats=stats, ready=True, config=ModelConfig(),
                               scheduler=SimpleNamespace(queues={0: [object()] * queued}))
    return SimpleNamespace(models={n: SimpleNamespace(versions={1: version(n, s)}) for n, s in versions.items()})


def test_metrics_sum_the_peer_processes_statistics():
    """A front-end process's page adds the peers' snapshots to each loaded version's
    counters and pending gauge; summaries stay its own; no hook: today's page."""
    import asyncio
    from triton_shm.frontend.metrics.collect import local_snapshots

    def stats(name: str, singles: int, failures: int) -> ModelStats:
        s = ModelStats(name, "1")
        for _ in range(singles):
            s.record_single(1, 10_000_000, 1_000_000, 0, 8_000_000, 0)
        for _ in range(failures):
            s.record_failure(1_000, "BACKEND")
        return s

    local = stats("a", 2, 0)
    local.enable_summaries()
    local.record_single(1, 2_000_000, 0, 0, 2_000_000, 0)
    repo = fake_repository({"a": local, "b": stats("b", 1, 0)}, queued=1)
    peers = [local_snapshots(fake_repository({"a": stats("a", 5, 1), "c": stats("c", 9, 0)}, queued=2)),
             local_snapshots(fake_repository({"a": stats("a", 1, 2)}, queued=3))]
    calls = []

    async def peer_snapshots():
        calls.append(1)
        return peers

    alone = MetricsCollector(repo, cpu=False, gpu=False, config=MetricsConfig.parse(["summary_latencies=true"]))
    assert asyncio.run(alone.render_async()) == alone.render()
    served = MetricsCollector(repo, cpu=False, gpu=False, config=MetricsConfig.parse(["summary_latencies=true"]),
                              peer_snapshots=peer_snapshots)
    samples = parse(asyncio.run(served.render_async()))
    assert calls == [1]
    assert model_value(samples, "nv_inference_count", "a") == 3 + 5 + 1
    assert model_value(samples, "nv_inference_request_success", "a") == 9
    assert model_value(samples, "nv_inference_compute_infer_duration_us", "a") == 2_000 + 8 * 8_000
    assert model_value(samples, "nv_inference_request_failure", "a", reason="BACKEND") == 3
    assert model_value(samples, "nv_inference_pending_request_count", "a") == 1 + 2 + 3
    assert model_value(samples, "nv_inference_count", "b") == 1  # no peer has it: its own
    assert model_value(samples, "nv_inference_pending_request_count", "b") == 1
    assert key("nv_inference_count", model="c", version="1") not in samples  # not loaded here
    assert model_value(samples, "nv_inference_request_summary_us_count", "a") == 1  # this process's only
    assert local.inference_count == 3 and local.failures == {}  # the local stats are not changed


def test_metrics_port_serves_the_summed_page():
    """start_metrics takes the hook and its GET /metrics awaits it."""
    import asyncio
    from triton_shm.frontend.metrics import start_metrics

    own = ModelStats("a", "1")
    own.record_single(1, 1_000, 0, 0, 1_000, 0)
    peer = ModelStats("a", "1")
    for _ in range(4):
        peer.record_single(2, 1_000, 0, 0, 1_000, 0)

    async def peer_snapshots():
        await asyncio.sleep(0)
        return [{"a/1": peer.snapshot()}]

    async def serve_and_scrape() -> dict:
        port = free_port()
        server = await start_metrics(fake_repository({"a": own}), "127.0.0.1", port, cpu=False, gpu=False,
                                     peer_snapshots=peer_snapshots)
        try:
            return await asyncio.to_thread(scrape, port)
        finally:
            await server.cleanup()

    samples = asyncio.run(serve_and_scrape())
    assert model_value(samples, "nv_inference_count", "a") == 1 + 8
    assert model_value(samples, "nv_inference_exec_count", "a") == 5


def test_cpu_sampler_reads_proc(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n"
    (proc / "meminfo").write_text(meminfo)
    (proc / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    sampler = CpuSampler(str(proc))
    first = sampler.sample()
    assert first.utilization == 0.0    # no interval yet
    assert first.memory_total_bytes == 1000 * 1024 and first.memory_used_bytes == 600 * 1024
    # +300 busy (user/system), +100 idle, +100 iowait: busy share 300/500
    (proc / "stat").write_text("cpu  300 0 200 800 200 0 0 0 0 0\n")
    assert sampler.sample().utilization == pytest.approx(0.6)
    (proc / "stat").write_text("garbage\n")
    assert sampler.sample() is None       # unreadable: no reading, no exception


def test_nvml_missing_is_quiet(caplog):
    caplog.set_level("INFO", logger="triton_shm.metrics")
    sampler = NvmlSampler(library="libnvidia-ml-does-not-exist.so.1")
    assert not sampler.available and sampler.sample() == []
    sampler.close()
    assert "GPU metrics are not available" in caplog.text


# --------------------------------------------------------------------------- live server
def test_families_have_triton_help_and_type(metrics_server):
    text = scrape_text(metrics_server.metrics_port)
    lines = text.splitlines()
    for name, (kind, help_text) in HELP_TYPE.items():
        assert f"# HELP {name} {help_text}" in lines, name
        assert f"# TYPE {name} {kind}" in lines, name
    samples = parse(text)
    for model in ("add_sub", "flaky"):
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            assert key("nv_inference_request_failure", model=model, reason=reason, version="1") in samples


def test_other_paths_are_not_found(metrics_server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_server.metrics_port}/v2/health/ready", timeout=5)
    assert e.value.code == 404


def test_counters_match_requests_and_statistics(metrics_server):
    http = httpclient.InferenceServerClient(metrics_server.http_url)
    grpc = grpcclient.InferenceServerClient(metrics_server.grpc_url)
    rows, n_http, n_grpc = 3, 5, 4
    for _ in range(n_http):
        http.infer("add_sub", add_sub_inputs(httpclient, rows))
    for _ in range(n_grpc):
        grpc.infer("add_sub", add_sub_inputs(grpcclient, rows))
    n = n_http + n_grpc

    samples = scrape(metrics_server.metrics_port)
    stats = stats_of(metrics_server, "add_sub")
    infer = stats["inference_stats"]
    assert model_value(samples, "nv_inference_request_success", "add_sub") == n == infer["success"]["count"]
    assert model_value(samples, "nv_inference_count", "add_sub") == n * rows == stats["inference_count"]
    assert model_value(samples, "nv_inference_exec_count", "add_sub") == stats["execution_count"] > 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert model_value(samples, "nv_inference_request_failure", "add_sub", reason=reason) == 0
    for name, phase in PHASE_OF.items():
        value = model_value(samples, name, "add_sub")
        assert value == int(infer[phase]["ns"]) // 1000, name
        if phase in ("success", "queue", "compute_infer"):
            assert value > 0, name
    assert model_value(samples, "nv_inference_pending_request_count", "add_sub") == 0


def test_failure_counter_counts_model_errors(metrics_server):
    client = httpclient.InferenceServerClient(metrics_server.http_url)
    before = scrape(metrics_server.metrics_port)
    client.infer("flaky", flaky_input(httpclient, 0.0))
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="asked to fail"):
            client.infer("flaky", flaky_input(httpclient, -1.0))
    after = scrape(metrics_server.metrics_port)
    delta = lambda name, **kw: model_value(after, name, "flaky", **kw) - model_value(before, name, "flaky", **kw)  # noqa: E731
    assert delta("nv_inference_request_failure", reason="BACKEND") == 2
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert delta("nv_inference_request_failure", reason=reason) == 0
    assert delta("nv_inference_request_success") == 1
    stats = stats_of(metrics_server, "flaky")
    failures = sum(v for (name, labels), v in after.items()
                   if name == "nv_inference_request_failure" and ("model", "flaky") in labels)
    assert failures == stats["inference_stats"]["fail"]["count"]
    assert model_value(after, "nv_inference_request_success", "flaky") == stats["inference_stats"]["success"]["count"]
    assert model_value(after, "nv_inference_exec_count", "flaky") == stats["execution_count"]


def test_pending_gauge_counts_queued_requests(metrics_server):
    # one instance, four requests of 0.4 s each: while one runs, the others wait in the queue
    def call():
        httpclient.InferenceServerClient(metrics_server.http_url).infer("flaky", flaky_input(httpclient, 0.4))
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    seen = 0.0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(t.is_alive() for t in threads):
        seen = model_value(scrape(metrics_server.metrics_port), "nv_inference_pending_request_count", "flaky")
        if seen:
            break
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert 1 <= seen <= 3   # queued only: the executing request is no longer pending
    assert model_value(scrape(metrics_server.metrics_port), "nv_inference_pending_request_count", "flaky") == 0


def test_cpu_metrics_are_sane(metrics_server):
    time.sleep(0.5)  # at least one sampling interval after the first reading
    samples = scrape(metrics_server.metrics_port)
    util = samples[key("nv_cpu_utilization")]
    total = samples[key("nv_cpu_memory_total_bytes")]
    used = samples[key("nv_cpu_memory_used_bytes")]
    assert 0.0 <= util <= 1.0
    assert total > 64 * 2**20
    assert 0 < used <= total


def test_cpu_utilization_sees_load(metrics_server):
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        time.sleep(0.6)  # > 2 sampling intervals
        util = scrape(metrics_server.metrics_port)[key("nv_cpu_utilization")]
    finally:
        stop.set()
        t.join()
    assert util > 0.0


@pytest.mark.skipif(nvml_loadable(), reason="this machine has NVML: GPU series are expected")
def test_no_gpu_series_without_nvml(metrics_server):
    text = scrape_text(metrics_server.metrics_port)
    assert "nv_gpu_" not in text and "nv_energy_consumption" not in text
    log = metrics_server.log()
    assert "ImportError" not in log and "metrics.py" not in log   # no traceback from the metrics code
    assert "GPU metrics are not available" in log


def test_metrics_disabled_means_no_port(tmp_path):
    repo = build_repo(tmp_path / "models")
    port = free_port()
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--allow-metrics=false", "--metrics-port", str(port)]).start()
    try:
        assert port_refuses(port)
        assert "Metrics Service" not in srv.log()
    finally:
        assert srv.stop() == 0


def test_cpu_and_gpu_metrics_can_be_turned_off(tmp_path):
    repo = build_repo(tmp_path / "models")
    port = free_port()
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--allow-metrics", "true", "--metrics-port", str(port),
                                    "--allow-cpu-metrics", "false", "--allow-gpu-metrics=false"]).start()
    try:
        text = scrape_text(port)
        assert "nv_inference_request_success" in text
        assert "nv_cpu_" not in text and "nv_gpu_" not in text
    finally:
        assert srv.stop() == 0
    assert port_refuses(port)  # closed on shutdown


# --------------------------------------------------------------------------- latency summaries
SUMMARY_HELP = {
    "nv_inference_request_summary_us":
        "Summary of inference request duration in microseconds (includes cached requests)",
    "nv_inference_queue_summary_us":
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    "nv_inference_compute_input_summary_us":
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    "nv_inference_compute_infer_summary_us":
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    "nv_inference_compute_output_summary_us":
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
}


def test_metrics_config_parses_tritonserver_settings():
    from triton_shm.frontend.metrics import DEFAULT_QUANTILES, MetricsConfig
    c = MetricsConfig.parse([])
    assert c.counter_latencies and not c.summary_latencies and c.summary_quantiles == DEFAULT_QUANTILES
    c = MetricsConfig.parse(["summary_latencies=true", "counter_latencies=false",
                             'summary_quantiles="0.5:0.05,0.99:0.001"'])
    assert c.summary_latencies and not c.counter_latencies and c.summary_quantiles == (0.5, 0.99)
    for bad, needle in [("summary_latencies", "expected <setting>=<value>"), ("histogram=true", "unknown setting"),
                        ("summary_latencies=maybe", "true or false"), ("summary_quantiles=1.5:0.1", "within [0, 1]"),
                        ("summary_quantiles=half:0.1", "<quantile>:<error>")]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            MetricsConfig.parse([bad])


def test_latency_summary_quantiles_over_a_sliding_window():
    from triton_shm.core.observability.statistics import SUMMARY_MAX_AGE_S, LatencySummary
    s = LatencySummary()
    assert all(v != v for v in s.quantiles((0.5,), 0.0))  # NaN while empty
    for i, v in enumerate(range(1, 101)):  # 1..100 µs over the first 10 s
        s.observe(v, i * 0.1)
    assert s.count == 100 and s.sum == 5050
    assert s.quantiles((0.5, 0.9, 0.99), 10.0) == [50.0, 90.0, 99.0]
    for i in range(10):  # much later: only these are in the window, count and sum stay cumulative
        s.observe(1000 + i, SUMMARY_MAX_AGE_S + 30 + i)
    assert s.quantiles((0.5,), SUMMARY_MAX_AGE_S + 40) == [1004.0]
    assert s.count == 110 and s.sum == 5050 + sum(1000 + i for i in range(10))


def test_summaries_on_the_metrics_port(tmp_path):
    """summary_latencies=true: Triton's five summary families, with _count/_sum agreeing
    with the statistics endpoint and quantiles that see the slow requests;
    counter_latencies=false drops the latency counters."""
    repo = build_repo(tmp_path / "models")
    port = free_port()
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--allow-metrics", "true", "--metrics-port", str(port), "--metrics-config", "summary_latencies=true",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.95:0.01", "--metrics-config=counter_latencies=false"]).start()
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        for i in range(20):  # 18 fast requests, 2 that take 300 ms
            client.infer("flaky", flaky_input(httpclient, 0.3 if i in (5, 15) else 0.0))
        text = scrape_text(port)
        for name, help_text in SUMMARY_HELP.items():
            assert f"# HELP {name} {help_text}\n# TYPE {name} summary\n" in text
        assert "nv_inference_request_duration_us" not in text and "nv_inference_queue_duration_us" not in text
        assert "nv_inference_request_success" in text  # the counts stay
        samples = parse(text)
        success = stats_of(srv, "flaky")["inference_stats"]["success"]
        name = "nv_inference_request_summary_us"
        assert model_value(samples, f"{name}_count", "flaky") == success["count"] == 20
        assert abs(model_value(samples, f"{name}_sum", "flaky") - success["ns"] / 1000) <= 20  # µs rounding
        p50, p95 = (model_value(samples, name, "flaky", quantile=q) for q in ("0.5", "0.95"))
        assert p50 < 100_000 and p95 >= 300_000  # 2 of 20 are slow: the median is fast, p95 is slow
        assert key(name, model="flaky", version="1", quantile="0.99") not in samples  # only the asked quantiles
        infer = "nv_inference_compute_infer_summary_us"
        assert model_value(samples, f"{infer}_count", "flaky") == 20
        assert model_value(samples, f"{infer}_sum", "flaky") >= 600_000  # the two 300 ms executions
        assert f'{name}{{model="flaky",version="1",quantile="0.5"}}' in text  # quantile last, as Triton prints
        # add_sub never ran: NaN quantiles, zero count, as a summary without observations reads
        assert model_value(samples, f"{name}_count", "add_sub") == 0
    finally:
        assert srv.stop() == 0


def test_bad_metrics_config_stops_the_server_clearly(tmp_path):
    repo = build_repo(tmp_path / "models")
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--allow-metrics", "true", "--metrics-port", str(free_port()),
                                    "--metrics-config", "summary_latencies=perhaps"])
    with pytest.raises(RuntimeError, match="exited with 1"):
        srv.start()
    assert "summary_latencies=perhaps: expected true or false" in srv.log()
    assert "Traceback" not in srv.log()


# --------------------------------------------------------------------------- golden: Triton 2.51's page
GOLDEN = Path(__file__).resolve().parent / "golden" / "triton-2.51-metrics.txt"
# Families Triton prints that have no counterpart here (no pinned host memory pool).
NOT_EXPORTED = {"nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes"}


def families_of(text: str) -> dict[str, dict]:
    """name -> {help, type, series: the set of (sample name, labels)}, values dropped."""
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            current = families.setdefault(name, {"series": set()})
            current["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            families[name]["type"] = kind
        elif line:
            m = _SAMPLE.match(line)
            assert m and current is not None, f"not a Prometheus sample line: {line!r}"
            current["series"].add((m.group(1), frozenset(_LABEL.findall(m.group(2) or ""))))
    return families


def test_exposition_matches_triton_2_51(tmp_path):
    """tests/golden/triton-2.51-metrics.txt is what Triton 2.51 (CPU) printed for this model
    after one successful request, started with `--metrics-config summary_latencies=true
    --allow-gpu-metrics=false`. The same model and request here must give the same
    families, HELP and TYPE lines and series (names and labels; values differ)."""
    python_identity(tmp_path / "models", "identity_fp32", "FP32")
    port = free_port()
    srv = ServerProcess(tmp_path / "models", tmp_path / "server.log", extra_args=[
        "--allow-metrics=true", "--metrics-port", str(port), "--allow-gpu-metrics=false",
        "--metrics-config", "summary_latencies=true"]).start()
    try:
        inp = httpclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
        httpclient.InferenceServerClient(srv.http_url).infer("identity_fp32", [inp])
        ours = families_of(scrape_text(port))
    finally:
        srv.stop_cleanly()
    triton = families_of(GOLDEN.read_text())
    assert set(ours) == set(triton) - NOT_EXPORTED
    for name, family in ours.items():
        assert family == triton[name], name


def test_cache_gauges_sum_the_peer_processes_caches():
    """Each front-end process caches the responses of the models it owns: the page shows
    every process's cache as one (utilization: the bytes used of all their capacity)."""
    import asyncio
    from triton_shm.core.data.response_cache import ResponseCache
    from triton_shm.frontend.metrics.collect import CACHE, local_snapshots

    own, peer = ResponseCache(1000), ResponseCache(3000)
    for cache, misses in ((own, 2), (peer, 3)):
        for i in range(misses):
            assert cache.lookup(b"k%d" % i) is None
    peer.used = 600  # as if it held 600 bytes of responses
    peers = [local_snapshots(fake_repository({}), peer)]
    assert peers[0][CACHE]["capacity"] == 3000

    async def peer_snapshots():
        return peers

    collector = MetricsCollector(fake_repository({}), cpu=False, gpu=False, cache=own, peer_snapshots=peer_snapshots)
    samples = parse(asyncio.run(collector.render_async()))
    assert samples[key("nv_cache_num_lookups")] == samples[key("nv_cache_num_misses")] == 5
    assert samples[key("nv_cache_util")] == 600 / 4000
    alone = parse(MetricsCollector(fake_repository({}), cpu=False, gpu=False, cache=own).render())
    assert alone[key("nv_cache_num_lookups")] == 2 and alone[key("nv_cache_util")] == 0
