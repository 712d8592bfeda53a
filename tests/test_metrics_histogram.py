"""``--metrics-config histogram_latencies=true``: Triton's first-response histogram
(``nv_inference_first_response_histogram_ms``) per model, decoupled or not, with Triton's
default buckets or a model's ``model_metrics`` buckets, beside the counters and summaries;
off, nothing of it is kept."""
from __future__ import annotations

import logging
import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_shm.core.models.config import ModelConfig, parse_pbtxt
from triton_shm.core.observability.histogram import (DEFAULT_BUCKETS, FIRST_RESPONSE, FirstResponse, Histogram,
                                                     check_model_metrics, histogram_buckets)
from triton_shm.core.observability.statistics import ModelStats
from triton_shm.errors import InvalidArgument
from triton_shm.frontend.metrics import MetricsCollector, MetricsConfig
from triton_shm.frontend.metrics.collect import local_snapshots

from .harness import ServerProcess, free_port
from .models import write_model
from .test_metrics import fake_repository, model_value, parse, scrape_text, stats_of

pytestmark = pytest.mark.timeout(180)

HELP = "# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds"
TYPE = "# TYPE nv_inference_first_response_histogram_ms histogram"
OVERRIDE = """
model_metrics {
  metric_control: [
    {
      metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] }
    }
  ]
}
"""


# --------------------------------------------------------------------------- no server
def test_histogram_buckets_are_cumulative_in_whole_milliseconds():
    h = Histogram((-1.0, 0.0, 1.0, 2.5))
    for ns in (0, 999_999, 1_000_000, 2_999_999, 3_000_000, 7_654_321_000):
        h.observe_ns(ns)
    # 0 and 0.999 ms are 0 ms (truncated, as Triton divides), 1 ms, 2 ms, 3 ms, 7654 ms
    assert h.counts == [0, 2, 1, 1, 2]
    assert h.cumulative() == [0, 2, 3, 4, 6] and h.count == 6
    assert h.sum == 0 + 0 + 1 + 2 + 3 + 7654


def test_model_metrics_checks():
    def config(text: str) -> ModelConfig:
        return parse_pbtxt(f'name: "m"\n{text}')

    check_model_metrics(config(OVERRIDE))
    assert histogram_buckets(config(OVERRIDE)) == {FIRST_RESPONSE: (-1.0, 0.0, 1.0, 2.5)}
    assert histogram_buckets(config("")) == DEFAULT_BUCKETS == {FIRST_RESPONSE: (100.0, 500.0, 2000.0, 5000.0)}
    for text, message in [
        ("model_metrics { metric_control [ { histogram_options { buckets: [ 1 ] } } ] }",
         "metric control must specify 'metric_identifier'"),
        ('model_metrics { metric_control [ { metric_identifier { family: "" } histogram_options { buckets: [1] } } ] }',
         "metric identifier must specify non-empty 'family'"),
        ('model_metrics { metric_control [ { metric_identifier { family: "f" } } ] }',
         "metric control must specify 'histogram_options'"),
        ('model_metrics { metric_control [ { metric_identifier { family: "f" } histogram_options { } } ] }',
         "histogram options must specify non-empty 'buckets'"),
        (OVERRIDE.replace("-1, 0.0, 1, 2.5", "1, 5, 2"), "must be in increasing order, got [1.0, 5.0, 2.0]"),
        (OVERRIDE.replace("-1, 0.0, 1, 2.5", "1, 1"), "must be in increasing order"),
        (OVERRIDE.replace("-1, 0.0, 1, 2.5", "1, inf"), "must be finite numbers"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            check_model_metrics(config(text))
        assert message in info.value.message, text


def test_an_unknown_family_is_warned_about_and_ignored(caplog):
    other = OVERRIDE.replace("nv_inference_first_response_histogram_ms", "my_backend_metric")
    with caplog.at_level(logging.WARNING, logger="triton_shm.metrics"):
        assert histogram_buckets(parse_pbtxt(f'name: "m"\n{other}')) == DEFAULT_BUCKETS
    assert "Metric family 'my_backend_metric' in 'metric_identifier' is not a customizable metric" in caplog.text


def test_off_nothing_is_kept_per_request():
    """Without summaries or histograms a request's latencies go nowhere: one None check."""
    stats = ModelStats("m", "1")
    assert stats.observe is None and stats.first_response is None
    stats.record_single(1, 5_000_000, 0, 0, 5_000_000, 0)
    stats.record_failure(1_000_000, "BACKEND")
    assert "first_response" not in stats.snapshot()
    text = MetricsCollector(fake_repository({"m": stats}), cpu=False, gpu=False).render()
    assert "histogram" not in text


def test_decoupled_models_are_timed_on_their_streams_only():
    stats = ModelStats("d", "1")
    stats.enable_histograms(DEFAULT_BUCKETS, decoupled=True)
    assert stats.observe is None  # the answer at the end of an execution is not its first response
    stats.record_success(1, 900_000_000, 0, 0, 900_000_000, 0)
    assert stats.first_response is not None and stats.first_response.count == 0
    q: queue.SimpleQueue = queue.SimpleQueue()
    stream = FirstResponse(q, stats.first_response, time.monotonic_ns() - 150_000_000)
    stream.put_nowait((None, False))  # a bare flag is no response
    assert stats.first_response.count == 0
    for item in (("r1", False), ("r2", False), (None, True)):
        stream.put_nowait(item)
    assert [q.get_nowait() for _ in range(4)] == [(None, False), ("r1", False), ("r2", False), (None, True)]
    assert stats.first_response.count == 1 and stats.first_response.sum >= 150


def test_answered_requests_are_timed_and_refusals_are_not():
    stats = ModelStats("m", "1")
    stats.enable_histograms(DEFAULT_BUCKETS, decoupled=False)
    stats.record_single(1, 150_000_000, 0, 0, 150_000_000, 0)           # 150 ms
    stats.record_success(1, 2_500_000_000, 0, 0, 2_500_000_000, 0)      # 2500 ms
    stats.record_cache_hit(1_000_000, 0, 1_000_000)                      # 1 ms
    stats.record_failure(600_000_000, "BACKEND")                         # an error response: 600 ms
    stats.record_failure(0, "REJECTED", responded=False)                 # queue full: no response
    h = stats.first_response
    assert h is not None and h.cumulative() == [1, 2, 3, 4, 4] and h.sum == 150 + 2500 + 1 + 600


def test_histograms_render_as_triton_prints_them_and_sum_the_peers():
    import asyncio

    def stats(*ms: int) -> ModelStats:
        s = ModelStats("a", "1")
        s.enable_histograms({FIRST_RESPONSE: (-1.0, 0.0, 1.0, 2.5)}, decoupled=False)
        for v in ms:
            s.record_single(1, v * 1_000_000, 0, 0, v * 1_000_000, 0)
        return s

    local = stats(0, 3)
    config = MetricsConfig.parse(["histogram_latencies=true"])
    text = MetricsCollector(fake_repository({"a": local}), cpu=False, gpu=False, config=config).render()
    block = text[text.index(HELP):].splitlines()[:9]
    assert block == [HELP, TYPE,
                     'nv_inference_first_response_histogram_ms_count{model="a",version="1"} 2',
                     'nv_inference_first_response_histogram_ms_sum{model="a",version="1"} 3',
                     'nv_inference_first_response_histogram_ms_bucket{model="a",version="1",le="-1"} 0',
                     'nv_inference_first_response_histogram_ms_bucket{model="a",version="1",le="0"} 1',
                     'nv_inference_first_response_histogram_ms_bucket{model="a",version="1",le="1"} 1',
                     'nv_inference_first_response_histogram_ms_bucket{model="a",version="1",le="2.5"} 1',
                     'nv_inference_first_response_histogram_ms_bucket{model="a",version="1",le="+Inf"} 2']
    assert text.index(HELP) > text.index("nv_inference_pending_request_count")  # after the counters and gauge
    peers = [local_snapshots(fake_repository({"a": stats(1, 1, 1000)}))]

    async def peer_snapshots():
        return peers

    summed = MetricsCollector(fake_repository({"a": local}), cpu=False, gpu=False, config=config,
                              peer_snapshots=peer_snapshots)
    samples = parse(asyncio.run(summed.render_async()))
    assert model_value(samples, f"{FIRST_RESPONSE}_count", "a") == 5
    assert model_value(samples, f"{FIRST_RESPONSE}_sum", "a") == 3 + 1002
    assert model_value(samples, f"{FIRST_RESPONSE}_bucket", "a", le="1") == 3
    assert local.first_response is not None and local.first_response.count == 2  # this process's own unchanged


# --------------------------------------------------------------------------- a real server
# Sleeps INPUT0 seconds, or fails when it is negative.
WAITER_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.reshape(-1)[0] < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            time.sleep(float(x.reshape(-1)[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""
WAITER_CONFIG = """
name: "waiter"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
# Decoupled: its first response after INPUT0 seconds, then two more once the gate file exists.
STREAMER_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

GATE = {gate!r}

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            time.sleep(float(x.reshape(-1)[0]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            deadline = time.monotonic() + 60
            while not os.path.exists(GATE) and time.monotonic() < deadline:
                time.sleep(0.01)
            for _ in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
STREAMER_CONFIG = """
name: "streamer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""" + OVERRIDE
ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "waiter" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


def build_repo(root: Path) -> tuple[Path, Path]:
    repo, gate = root / "models", root / "gate"
    write_model(repo, "waiter", config=WAITER_CONFIG, model_py=WAITER_PY)
    write_model(repo, "streamer", config=STREAMER_CONFIG, model_py=STREAMER_PY.format(gate=str(gate)))
    write_model(repo, "ens", config=ENSEMBLE_CONFIG)
    return repo, gate


def fp32(mod, name: str, value: float):
    inp = mod.InferInput(name, [1], "FP32")
    inp.set_data_from_numpy(np.array([value], dtype=np.float32))
    return inp


def histogram_of(samples, model: str) -> tuple[float, float, dict[str, float]]:
    """(count, sum, {le: cumulative count})."""
    buckets = {dict(labels)["le"]: v for (name, labels), v in samples.items()
               if name == f"{FIRST_RESPONSE}_bucket" and dict(labels)["model"] == model}
    return (model_value(samples, f"{FIRST_RESPONSE}_count", model),
            model_value(samples, f"{FIRST_RESPONSE}_sum", model), buckets)


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def histogram_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("histograms")
    repo, gate = build_repo(root)
    port = free_port()
    srv = ServerProcess(repo, root / "server.log", extra_args=[
        "--allow-metrics=true", "--metrics-port", str(port), "--allow-cpu-metrics=false", "--allow-gpu-metrics=false",
        "--metrics-config", "histogram_latencies=true", "--metrics-config", "summary_latencies=true"]).start()
    srv.metrics_port, srv.gate = port, gate
    yield srv
    srv.stop_cleanly()


def test_every_model_has_its_histogram_from_the_start(histogram_server):
    text = scrape_text(histogram_server.metrics_port)
    assert f"{HELP}\n{TYPE}\n" in text and text.count(HELP) == 1
    samples = parse(text)
    assert histogram_of(samples, "waiter") == (0, 0, {"100": 0, "500": 0, "2000": 0, "5000": 0, "+Inf": 0})
    assert histogram_of(samples, "ens")[2].keys() == {"100", "500", "2000", "5000", "+Inf"}
    # model_metrics' buckets, printed as Triton prints them (the order: count, sum, buckets by bound)
    lines = [line for line in text.splitlines() if line.startswith(FIRST_RESPONSE) and '"streamer"' in line]
    labels = 'model="streamer",version="1"'
    assert lines == [f"{FIRST_RESPONSE}_count{{{labels}}} 0", f"{FIRST_RESPONSE}_sum{{{labels}}} 0"] + [
        f'{FIRST_RESPONSE}_bucket{{{labels},le="{le}"}} 0' for le in ("-1", "0", "1", "2.5", "+Inf")]


def test_requests_with_one_response_are_timed_beside_counters_and_summaries(histogram_server):
    srv = histogram_server
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    before = histogram_of(parse(scrape_text(srv.metrics_port)), "waiter")
    http.infer("waiter", [fp32(httpclient, "INPUT0", 0.2)])
    grpc.infer("waiter", [fp32(grpcclient, "INPUT0", 0.2)])
    http.infer("waiter", [fp32(httpclient, "INPUT0", 0.0)])
    with pytest.raises(InferenceServerException, match="asked to fail"):
        grpc.infer("waiter", [fp32(grpcclient, "INPUT0", -1.0)])
    samples = parse(scrape_text(srv.metrics_port))
    count, total, buckets = histogram_of(samples, "waiter")
    stats = stats_of(srv, "waiter")["inference_stats"]
    # every response is timed, the error one too (Triton times each request's first response)
    assert count - before[0] == 4 == stats["success"]["count"] + stats["fail"]["count"] - before[0]
    assert total - before[1] >= 400  # the two that slept 200 ms
    assert buckets["100"] - before[2]["100"] <= 2 and buckets["+Inf"] == count
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    # the counters and the summaries go on beside it
    assert model_value(samples, "nv_inference_request_success", "waiter") == stats["success"]["count"]
    assert model_value(samples, "nv_inference_request_summary_us_count", "waiter") == stats["success"]["count"]
    assert "nv_inference_request_duration_us" in scrape_text(srv.metrics_port)


def test_an_ensemble_is_timed_as_one_request_and_its_steps_as_theirs(histogram_server):
    srv = histogram_server
    http = httpclient.InferenceServerClient(srv.http_url)
    before = parse(scrape_text(srv.metrics_port))
    for _ in range(2):
        http.infer("ens", [fp32(httpclient, "IN", 0.1)])
    after = parse(scrape_text(srv.metrics_port))
    ens, ens_before = histogram_of(after, "ens"), histogram_of(before, "ens")
    assert ens[0] - ens_before[0] == 2 and ens[1] - ens_before[1] >= 200
    assert histogram_of(after, "waiter")[0] - histogram_of(before, "waiter")[0] == 2


def test_a_decoupled_request_is_timed_at_its_first_response(histogram_server):
    """The histogram counts the request once its first response is out, while the others are
    still held back by the model (so it is not the time to the last one)."""
    srv = histogram_server
    got: queue.SimpleQueue = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    try:
        client.async_stream_infer("streamer", [fp32(grpcclient, "INPUT0", 0.05)])
        first = got.get(timeout=60)
        assert not isinstance(first, Exception), first
        count, total, buckets = wait_for(
            lambda: (h := histogram_of(parse(scrape_text(srv.metrics_port)), "streamer"))[0] == 1 and h,
            "the streamer's first response in the histogram")
        assert got.empty()  # the other responses wait for the gate
        assert total >= 50 and buckets == {"-1": 0, "0": 0, "1": 0, "2.5": 0, "+Inf": 1}
        srv.gate.touch()
        for _ in range(2):
            assert not isinstance(got.get(timeout=60), Exception)
    finally:
        client.stop_stream()
    assert histogram_of(parse(scrape_text(srv.metrics_port)), "streamer")[:2] == (count, total)


def test_off_there_is_no_histogram_and_model_metrics_still_load(tmp_path):
    repo, _ = build_repo(tmp_path)
    port = free_port()
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--allow-metrics=true", "--metrics-port", str(port), "--allow-cpu-metrics=false",
        "--allow-gpu-metrics=false", "--metrics-config", "histogram_latencies=false"]).start()
    try:
        httpclient.InferenceServerClient(srv.http_url).infer("waiter", [fp32(httpclient, "INPUT0", 0.0)])
        text = scrape_text(port)
        assert "histogram" not in text and "nv_inference_request_success" in text
    finally:
        srv.stop_cleanly()


def test_bad_model_metrics_fail_the_load_clearly(tmp_path):
    repo, _ = build_repo(tmp_path)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--model-control-mode=explicit", "--load-model=waiter", "--allow-metrics=false"]).start()
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        bad = ('{"name": "waiter", "backend": "python", "model_metrics": {"metric_control": [{"metric_identifier": '
               '{"family": "nv_inference_first_response_histogram_ms"}, "histogram_options": {"buckets": [5, 1]}}]}}')
        with pytest.raises(InferenceServerException) as info:
            client.load_model("waiter", config=bad)
        assert info.value.status() == "400"
        assert "histogram buckets of 'nv_inference_first_response_histogram_ms' must be in increasing order" in \
            info.value.message()
    finally:
        srv.stop_cleanly()
