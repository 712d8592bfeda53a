"""OpenTelemetry trace mode against real server processes: spans posted as OTLP/HTTP JSON
to a receiver run by the test, parents from W3C traceparent over HTTP and gRPC, events and
attributes, resource attributes, sampling by rate and count, the settings API, an
ensemble's step spans, a collector that is down, and refused settings."""
from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .harness import ServerProcess, free_port
from .models import python_bls_traced, python_identity, write_model

pytestmark = pytest.mark.timeout(180)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity_fp32" model_version: -1 input_map { key: "INPUT0" value: "IN" }
    output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "identity_fp32" model_version: -1 input_map { key: "INPUT0" value: "mid" }
    output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
HTTP_EVENTS = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_EVENTS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
               "GRPC_SEND_END"]


class Collector:
    """An OTLP/HTTP JSON receiver on 127.0.0.1: keeps each posted document."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, dict]] = []  # (path, content type, document)
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                collector.posts.append((self.path, self.headers.get("Content-Type", ""), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}/v1/traces"

    def spans(self) -> list[dict]:
        return [s for _, _, doc in self.posts for rs in doc["resourceSpans"]
                for ss in rs["scopeSpans"] for s in ss["spans"]]

    def wait_spans(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.spans()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans()

    def clear(self) -> None:
        self.posts.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _otel_args(url: str, *extra: str) -> list[str]:
    args = ["--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=50", "--trace-config", "level=TIMESTAMPS"]
    for e in extra:
        args += ["--trace-config", e]
    return args


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("otel_models")
    python_identity(repo, "identity_fp32", "FP32")
    write_model(repo, "ens", config=ENSEMBLE)
    python_bls_traced(repo, "bls_traced", "identity_fp32")
    return repo


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(repo, collector, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("otel")
    srv = ServerProcess(repo, tmp / "server.out", extra_args=_otel_args(
        collector.url, "rate=1", "opentelemetry,resource=service.name=otel-test",
        "opentelemetry,resource=deployment.environment=ci")).start()
    yield srv
    srv.stop_cleanly()


@pytest.fixture()
def spans(collector):
    collector.clear()
    return collector


def _http_infer(srv: ServerProcess, model: str = "identity_fp32", name: str = "INPUT0",
                headers: dict | None = None, request_id: str = "") -> None:
    c = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput(name, [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    try:
        c.infer(model, [x], headers=headers, request_id=request_id)
    finally:
        c.close()


def _grpc_infer(srv: ServerProcess, headers: dict | None = None) -> None:
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    x = grpcclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    try:
        c.infer("identity_fp32", [x], headers=headers)
    finally:
        c.close()


def _settings(srv: ServerProcess, model: str = "", changes: dict | None = None) -> dict:
    path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
    data = None if changes is None else json.dumps(changes).encode()
    with urllib.request.urlopen(urllib.request.Request(f"http://{srv.http_url}{path}", data=data), timeout=10) as r:
        return json.loads(r.read())


def _names(span: dict) -> list[str]:
    return [e["name"] for e in span["events"]]


def _attrs(span: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def _by_name(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def _check_request(spans: list[dict], front: list[str]) -> tuple[dict, dict, dict]:
    """The three spans of one plain request, checked for shape and parents."""
    assert sorted(s["name"] for s in spans) == ["InferRequest", "compute", "identity_fp32"]
    root, = _by_name(spans, "InferRequest")
    model, = _by_name(spans, "identity_fp32")
    compute, = _by_name(spans, "compute")
    assert _names(root) == front
    assert _names(model) == MODEL_EVENTS
    assert _names(compute) == COMPUTE_EVENTS
    assert model["parentSpanId"] == root["spanId"] and compute["parentSpanId"] == model["spanId"]
    assert {s["traceId"] for s in spans} == {root["traceId"]}
    assert all(s["kind"] == 2 for s in spans)  # SERVER
    for s in spans:
        stamps = [int(e["timeUnixNano"]) for e in s["events"]]
        assert stamps == sorted(stamps) and int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
        assert abs(int(s["startTimeUnixNano"]) - time.time_ns()) < 60e9  # Unix time, not monotonic
    return root, model, compute


def test_http_spans_follow_traceparent(server, spans):
    _http_infer(server, headers={"traceparent": TRACEPARENT}, request_id="r1")
    got = spans.wait_spans(3)
    root, model, _ = _check_request(got, HTTP_EVENTS)
    assert root["traceId"] == TRACE_ID and root["parentSpanId"] == PARENT
    attrs = _attrs(model)
    assert attrs["triton.model_name"] == "identity_fp32" and attrs["triton.model_version"] == "1"
    assert attrs["triton.trace_parent_id"] == "0" and int(attrs["triton.trace_id"]) > 0
    assert attrs["triton.request_id"] == "r1"
    path, content_type, doc = spans.posts[0]
    assert path == "/v1/traces" and content_type == "application/json"
    scope = doc["resourceSpans"][0]["scopeSpans"][0]["scope"]
    assert scope["name"] == "triton-server"
    resource = _attrs(doc["resourceSpans"][0]["resource"])
    assert resource["service.name"] == "otel-test" and resource["deployment.environment"] == "ci"
    assert resource["telemetry.sdk.name"] == "opentelemetry"


def test_http_without_traceparent_starts_a_trace(server, spans):
    _http_infer(server)
    root, model, _ = _check_request(spans.wait_spans(3), HTTP_EVENTS)
    assert "parentSpanId" not in root and len(root["traceId"]) == 32 and root["traceId"] != TRACE_ID
    assert "triton.request_id" not in _attrs(model)


def test_http_malformed_traceparent_is_ignored(server, spans):
    _http_infer(server, headers={"traceparent": "00-zz-not-a-context"})
    root, _, _ = _check_request(spans.wait_spans(3), HTTP_EVENTS)
    assert "parentSpanId" not in root


def test_grpc_spans_follow_traceparent(server, spans):
    _grpc_infer(server, headers={"traceparent": TRACEPARENT})
    root, _, _ = _check_request(spans.wait_spans(3), GRPC_EVENTS)
    assert root["traceId"] == TRACE_ID and root["parentSpanId"] == PARENT


def test_grpc_stream_requests_follow_the_call_traceparent(server, spans):
    """Each request of a ModelStreamInfer call gets its own InferRequest span under the
    call metadata's traceparent, as Triton takes it."""
    _check_stream_spans(server, spans)


def test_grpc_stream_over_grpcio_follows_the_call_traceparent(repo, collector, tmp_path):
    srv = ServerProcess(repo, tmp_path / "server.out", extra_args=[
        "--grpc-transport", "grpcio", *_otel_args(collector.url, "rate=1")]).start()
    try:
        collector.clear()
        _check_stream_spans(srv, collector)
    finally:
        srv.stop_cleanly()


def _check_stream_spans(server: ServerProcess, spans: Collector) -> None:
    results: list = []
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        c.start_stream(callback=lambda result, error: results.append(error or result),
                       headers={"traceparent": TRACEPARENT})
        for i in range(2):
            x = grpcclient.InferInput("INPUT0", [4], "FP32")
            x.set_data_from_numpy(np.arange(4, dtype=np.float32))
            c.async_stream_infer("identity_fp32", [x], request_id=f"s{i}")
        deadline = time.monotonic() + 10
        while len(results) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        c.stop_stream()
    finally:
        c.close()
    assert len(results) == 2 and not any(isinstance(r, Exception) for r in results)
    got = spans.wait_spans(6)
    roots = _by_name(got, "InferRequest")
    assert len(roots) == 2 and len({r["spanId"] for r in roots}) == 2
    for root in roots:
        mine = [s for s in got if s is root or s["parentSpanId"] == root["spanId"]]
        model, = _by_name(mine, "identity_fp32")
        mine += [s for s in got if s.get("parentSpanId") == model["spanId"]]
        root, _, _ = _check_request(mine, GRPC_EVENTS)
        assert root["traceId"] == TRACE_ID and root["parentSpanId"] == PARENT
    assert sorted(_attrs(m)["triton.request_id"] for m in _by_name(got, "identity_fp32")) == ["s0", "s1"]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_follows_traceparent(server, spans, endpoint):
    body = json.dumps({"INPUT0": [1.0, 2.0, 3.0, 4.0]}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/{endpoint}", data=body,
                                 headers={"traceparent": TRACEPARENT, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    assert "OUTPUT0" in text and "error" not in text
    root, _, _ = _check_request(spans.wait_spans(3), HTTP_EVENTS)
    assert root["traceId"] == TRACE_ID and root["parentSpanId"] == PARENT


def test_ensemble_steps_are_child_spans(server, spans):
    _http_infer(server, "ens", "IN", headers={"traceparent": TRACEPARENT})
    got = spans.wait_spans(7)
    assert sorted(s["name"] for s in got) == ["InferRequest", "compute", "compute", "ens", "identity_fp32",
                                              "identity_fp32"]
    root, = _by_name(got, "InferRequest")
    ens, = _by_name(got, "ens")
    steps = _by_name(got, "identity_fp32")
    assert ens["parentSpanId"] == root["spanId"] and _names(ens) == MODEL_EVENTS
    ens_id = _attrs(ens)["triton.trace_id"]
    for step in steps:
        assert step["parentSpanId"] == ens["spanId"] and step["traceId"] == TRACE_ID
        assert _attrs(step)["triton.trace_parent_id"] == ens_id
    assert {c["parentSpanId"] for c in _by_name(got, "compute")} == {s["spanId"] for s in steps}


def test_bls_call_with_the_request_trace_is_a_child_span(server, spans):
    """As Triton draws a BLS model's trace: one InferRequest, the BLS model's span under it,
    the called model's span under the BLS model's (its compute span under it); the call made
    without ``trace=`` is not traced."""
    c = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    try:
        result = c.infer("bls_traced", [x], headers={"traceparent": TRACEPARENT})
    finally:
        c.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))
    got = spans.wait_spans(5)
    time.sleep(0.3)  # anything more (the untraced call) would have arrived by now
    got = spans.spans()
    assert sorted(s["name"] for s in got) == ["InferRequest", "bls_traced", "compute", "compute", "identity_fp32"]
    root, = _by_name(got, "InferRequest")
    bls, = _by_name(got, "bls_traced")
    child, = _by_name(got, "identity_fp32")
    assert root["parentSpanId"] == PARENT and {s["traceId"] for s in got} == {TRACE_ID}
    assert bls["parentSpanId"] == root["spanId"] and child["parentSpanId"] == bls["spanId"]
    assert _names(child) == MODEL_EVENTS
    assert _attrs(child)["triton.trace_parent_id"] == _attrs(bls)["triton.trace_id"] != "0"
    assert {c["parentSpanId"] for c in _by_name(got, "compute")} == {bls["spanId"], child["spanId"]}
    # request.trace().get_context(): the BLS model span's context, as a W3C traceparent
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context == {"traceparent": f"00-{TRACE_ID}-{bls['spanId']}-01"}


def test_settings_report_opentelemetry(server, collector):
    doc = _settings(server)
    assert doc == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                   "trace_mode": "opentelemetry", "url": collector.url,
                   "resource": ["service.name=otel-test", "deployment.environment=ci"],
                   "bsp_schedule_delay": "50", "bsp_max_export_batch_size": "512", "bsp_max_queue_size": "2048"}
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        settings = c.get_trace_settings(as_json=True)["settings"]
    finally:
        c.close()
    assert settings["trace_mode"]["value"] == ["opentelemetry"] and settings["url"]["value"] == [collector.url]


def test_rate_and_count_through_the_settings_api(server, spans):
    try:
        doc = _settings(server, changes={"trace_rate": "3", "trace_count": "2"})
        assert doc["trace_rate"] == "3" and doc["trace_count"] == "2"
        for _ in range(9):
            _http_infer(server)
        time.sleep(0.5)
        got = spans.wait_spans(6)
        assert len(_by_name(got, "InferRequest")) == 2  # every 3rd, until the count of 2 ran out
        assert _settings(server)["trace_count"] == "0"
    finally:
        _settings(server, changes={"trace_rate": None, "trace_count": None})
    assert _settings(server)["trace_rate"] == "1"


def test_a_caller_context_is_traced_whatever_rate_and_count_say(repo, tmp_path, collector):
    """tritonserver traces every request that carries a caller's OpenTelemetry context,
    whatever rate and count say, without counting it; `--trace-config rate=0` (refused by
    the settings API) then traces only those."""
    collector.clear()
    srv = ServerProcess(repo, tmp_path / "forced.out",
                        extra_args=_otel_args(collector.url, "rate=0", "count=1")).start()
    try:
        assert (_settings(srv)["trace_rate"], _settings(srv)["trace_count"]) == ("0", "1")
        for _ in range(2):
            _http_infer(srv)
        ids = [f"{TRACE_ID[:-1]}{k}" for k in range(3)]
        for trace_id in ids:
            _http_infer(srv, headers={"traceparent": f"00-{trace_id}-{PARENT}-01"})
        got = _by_name(collector.wait_spans(9), "InferRequest")
        time.sleep(0.3)  # nothing more comes: the plain requests were not traced
        assert sorted(s["traceId"] for s in _by_name(collector.spans(), "InferRequest")) == ids
        assert all(s["parentSpanId"] == PARENT for s in got)
        assert _settings(srv)["trace_count"] == "1"  # forced traces are not counted
        with pytest.raises(urllib.error.HTTPError) as refused:
            _settings(srv, changes={"trace_rate": "0"})
        assert refused.value.code == 400
        _settings(srv, changes={"trace_rate": "1"})
        collector.clear()
        for _ in range(2):
            _http_infer(srv)  # the first takes the count's last trace
        _http_infer(srv, headers={"traceparent": TRACEPARENT})  # count 0: traced all the same
        collector.wait_spans(6)
        time.sleep(0.3)
        assert len(_by_name(collector.spans(), "InferRequest")) == 2
        assert _settings(srv)["trace_count"] == "0"
    finally:
        srv.stop_cleanly()


def test_model_settings_turn_its_spans_off(server, spans):
    try:
        doc = _settings(server, "identity_fp32", {"trace_level": ["OFF"]})
        assert doc["trace_level"] == ["OFF"] and doc["trace_mode"] == "opentelemetry"
        _http_infer(server)
        _grpc_infer(server)
        time.sleep(0.5)
        assert spans.spans() == []
    finally:
        _settings(server, "identity_fp32", {"trace_level": None})
    _http_infer(server)
    _check_request(spans.wait_spans(3), HTTP_EVENTS)


def test_collector_down_costs_one_warning(repo, tmp_path):
    port = free_port()  # nothing listens there
    srv = ServerProcess(repo, tmp_path / "down.out", extra_args=_otel_args(f"127.0.0.1:{port}/v1/traces",
                                                                           "rate=1")).start()
    try:
        for _ in range(5):
            _http_infer(srv)
            _grpc_infer(srv)
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        srv.stop_cleanly()
    assert srv.log().count("failed to export OpenTelemetry spans") == 1


def test_default_service_name(repo, tmp_path, collector):
    collector.clear()
    srv = ServerProcess(repo, tmp_path / "default.out", extra_args=_otel_args(collector.url, "rate=1")).start()
    try:
        _http_infer(srv)
        collector.wait_spans(3)
    finally:
        srv.stop_cleanly()
    resource = _attrs(collector.posts[0][2]["resourceSpans"][0]["resource"])
    assert resource["service.name"] == "triton-inference-server"


def test_spans_queued_at_shutdown_are_exported(repo, tmp_path, collector):
    collector.clear()
    srv = ServerProcess(repo, tmp_path / "flush.out", extra_args=_otel_args(
        collector.url, "rate=1", "opentelemetry,bsp_schedule_delay=600000")).start()
    try:
        _http_infer(srv)
        time.sleep(0.3)
        assert collector.spans() == []  # a full batch or the delay sends them; neither came yet
    finally:
        srv.stop_cleanly()
    assert len(collector.spans()) == 3


@pytest.mark.parametrize("flag", ["mode=foo", "opentelemetry,url=http://", "opentelemetry,url=host:notaport/x",
                                  "opentelemetry,bsp_max_queue_size=abc", "opentelemetry,bsp_schedule_delay=0",
                                  "opentelemetry,resource=novalue", "opentelemetry,bogus=1"])
def test_bad_settings_are_refused(repo, tmp_path, flag):
    srv = ServerProcess(repo, tmp_path / "bad.out", extra_args=["--trace-config", "mode=opentelemetry",
                                                                "--trace-config", flag])
    with pytest.raises(RuntimeError, match="exited with 1"):
        srv.start()
    assert "--trace-config" in srv.log()


def test_traceparent_parsing():
    from triton_shm.core.observability.otel import parse_traceparent
    assert parse_traceparent(TRACEPARENT) == (TRACE_ID, PARENT)
    assert parse_traceparent(TRACEPARENT.upper().encode()) == (TRACE_ID, PARENT)
    for bad in (None, "", "00-abc-def-01", f"ff-{TRACE_ID}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01",
                f"00-{TRACE_ID}-{'0' * 16}-01", f"00-{'g' * 32}-{PARENT}-01"):
        assert parse_traceparent(bad) is None


def test_trace_config_parsing():
    from triton_shm.core.observability.tracing import parse_trace_config
    startup, file, mode, otel = parse_trace_config([
        "mode=opentelemetry", "opentelemetry,url=http://collector:4318/v1/traces", "rate=5",
        "opentelemetry,resource=service.name=a", "opentelemetry,bsp_max_queue_size=10",
        "opentelemetry,bsp_max_export_batch_size=4", "triton,file=/tmp/ignored.json", "level=TIMESTAMPS"])
    assert (startup["trace_rate"], startup["trace_level"], file, mode) == (5, ("TIMESTAMPS",), "", "opentelemetry")
    assert otel is not None and otel.url == "http://collector:4318/v1/traces" and otel.resources == ["service.name=a"]
    assert otel.bsp == {"bsp_max_queue_size": 10, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 4}
    assert parse_trace_config(["opentelemetry,url=x:1/v1/traces", "level=TIMESTAMPS"])[2:] == ("triton", None)
    with pytest.raises(ValueError, match="bsp_max_export_batch_size must not exceed"):
        parse_trace_config(["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=2"])
