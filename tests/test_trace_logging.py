"""Trace and logging extensions against real server processes, through tritonclient
http and grpc: settings over both protocols, refused file paths (CVE-2024-0087/0100),
runtime log levels/format, and the trace file written at shutdown."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import onnx_add_sub, python_bls_traced, python_identity

pytestmark = pytest.mark.timeout(180)

ADD_SUB_CONFIG = (
    'name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
    ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
    ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
          "COMPUTE_END", "REQUEST_END"]
DEFAULT_TRACE = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                 "trace_file": "", "trace_mode": "triton"}
DEFAULT_LOG = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
               "log_verbose_level": 0, "log_format": "default"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("trace_models")
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
    python_identity(repo, "identity_fp32", "FP32")
    python_bls_traced(repo, "bls_traced", "identity_fp32")
    return repo


def _start(repo: Path, tmp: Path, name: str, args: list[str]) -> ServerProcess:
    return ServerProcess(repo, tmp / f"{name}.out", extra_args=args).start()


def _stop(srv: ServerProcess) -> None:
    srv.stop_cleanly()


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    """Tracing off (no trace file); log written to a file."""
    tmp = tmp_path_factory.mktemp("trace_logging")
    srv = _start(repo, tmp, "server", ["--log-file", str(tmp / "server.log")])
    srv.log_file = tmp / "server.log"
    yield srv
    _stop(srv)


@pytest.fixture()
def default_log(server) -> dict:
    return {**DEFAULT_LOG, "log_file": str(server.log_file)}


@pytest.fixture()
def http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture()
def grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def _grpc_trace(c, model_name=None) -> dict:
    settings = c.get_trace_settings(model_name=model_name, as_json=True)["settings"]
    return {k: v.get("value", []) for k, v in settings.items()}


def _grpc_log(c) -> dict:
    settings = c.get_log_settings(as_json=True)["settings"]
    return {k: next(iter(v.values()), None) for k, v in settings.items()}


def _infer_http(c, model="add_sub", request_id=""):
    if model == "add_sub":
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), np.float32))
    else:
        inputs = [httpclient.InferInput("INPUT0", [3], "FP32")]
        inputs[0].set_data_from_numpy(np.arange(3, dtype=np.float32))
    return c.infer(model, inputs, request_id=request_id)


def _infer_grpc(c, request_id=""):
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), np.float32))
    return c.infer("add_sub", inputs, request_id=request_id)


def _error(fn) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn()
    return info.value


# -- trace settings ------------------------------------------------------------------------
def test_extensions_advertised(http):
    extensions = http.get_server_metadata()["extensions"]
    assert "trace" in extensions and "logging" in extensions


def test_trace_settings_defaults(http, grpc):
    assert http.get_trace_settings() == DEFAULT_TRACE
    assert http.get_trace_settings(model_name="add_sub") == DEFAULT_TRACE
    as_grpc = {k: (v if isinstance(v, list) else [v]) for k, v in DEFAULT_TRACE.items()}
    assert _grpc_trace(grpc) == {**as_grpc, "trace_file": [""]}
    assert _grpc_trace(grpc, "add_sub") == {**as_grpc, "trace_file": [""]}


def test_model_override_and_clear_http(http):
    try:
        got = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": "5", "trace_count": "3"})
        assert got == {**DEFAULT_TRACE, "trace_rate": "5", "trace_count": "3"}
        assert http.get_trace_settings(model_name="add_sub") == got
        assert http.get_trace_settings() == DEFAULT_TRACE  # global untouched
        assert http.get_trace_settings(model_name="identity_fp32") == DEFAULT_TRACE
        # keys the model does not override follow the global settings
        http.update_trace_settings(settings={"trace_rate": "7", "log_frequency": "4"})
        assert http.get_trace_settings(model_name="add_sub") == {
            **DEFAULT_TRACE, "trace_rate": "5", "trace_count": "3", "log_frequency": "4"}
        assert http.get_trace_settings(model_name="identity_fp32")["trace_rate"] == "7"
        # clearing a model key falls back to the global value
        got = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": None})
        assert got["trace_rate"] == "7" and got["trace_count"] == "3"
        # clearing a global key goes back to the start-up value
        got = http.update_trace_settings(settings={"trace_rate": None, "log_frequency": None})
        assert got == DEFAULT_TRACE
    finally:
        http.update_trace_settings(model_name="add_sub", settings={"trace_count": None})
        http.update_trace_settings(settings={"trace_rate": None, "log_frequency": None})
    assert http.get_trace_settings(model_name="add_sub") == DEFAULT_TRACE


def test_model_override_and_clear_grpc(grpc, http):
    try:
        resp = grpc.update_trace_settings(model_name="add_sub",
                                          settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "3"}, as_json=True)
        assert resp["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
        assert resp["settings"]["trace_rate"]["value"] == ["3"]
        assert _grpc_trace(grpc, "add_sub")["trace_level"] == ["TIMESTAMPS"]
        assert _grpc_trace(grpc)["trace_level"] == ["OFF"]
        assert http.get_trace_settings(model_name="add_sub")["trace_rate"] == "3"  # one state, both protocols
        grpc.update_trace_settings(model_name="add_sub", settings={"trace_level": None, "trace_rate": None})
        got = _grpc_trace(grpc, "add_sub")
        assert got["trace_level"] == ["OFF"] and got["trace_rate"] == ["1000"]
        # levels: several at once, reported in canonical order
        resp = grpc.update_trace_settings(settings={"trace_level": ["TENSORS", "TIMESTAMPS"]}, as_json=True)
        assert resp["settings"]["trace_level"]["value"] == ["TIMESTAMPS", "TENSORS"]
    finally:
        grpc.update_trace_settings(settings={"trace_level": ["OFF"]})
    assert http.get_trace_settings() == DEFAULT_TRACE


def test_trace_file_not_settable(http, grpc):
    for model in (None, "add_sub"):
        e = _error(
            lambda model=model: http.update_trace_settings(model_name=model, settings={"trace_file": "/tmp/evil"})
        )
        assert e.status() == "501"
        assert "trace file location can not be updated through network protocol" in e.message()
        e = _error(
            lambda model=model: grpc.update_trace_settings(model_name=model, settings={"trace_file": "/tmp/evil"})
        )
        assert e.status() == "StatusCode.UNIMPLEMENTED"
        assert "trace file location can not be updated through network protocol" in e.message()
    # nothing else in the refused request was applied
    e = _error(lambda: http.update_trace_settings(settings={"trace_rate": "9", "trace_file": "/tmp/evil"}))
    assert http.get_trace_settings() == DEFAULT_TRACE
    assert not Path("/tmp/evil").exists()


# What tritonserver 2.51 answers (checked against it over HTTP and gRPC): the value is read
# by std::stoi, then the rate and log frequency are kept as uint32.
@pytest.mark.parametrize("key, value, stored", [
    ("trace_rate", "-1", "4294967295"),
    ("trace_rate", "-2", "4294967294"),
    ("trace_rate", "-2147483648", "2147483648"),
    ("trace_rate", "2147483647", "2147483647"),
    ("trace_rate", "12abc", "12"),
    ("trace_rate", " +7", "7"),
    ("trace_rate", "1.5", "1"),
    ("trace_rate", "0", "0"),  # every level OFF: kept
    ("log_frequency", "-1", "4294967295"),
    ("trace_count", "5x", "5"),
])
def test_trace_values_read_as_tritonserver_reads_them(http, grpc, key, value, stored):
    try:
        assert http.update_trace_settings(settings={key: value})[key] == stored
        assert http.get_trace_settings()[key] == stored
        http.update_trace_settings(settings={key: None})
        resp = grpc.update_trace_settings(model_name="add_sub", settings={key: value}, as_json=True)
        assert resp["settings"][key]["value"] == [stored]
        assert _grpc_trace(grpc, "add_sub")[key] == [stored]
        assert http.get_trace_settings(model_name="add_sub")[key] == stored
    finally:
        http.update_trace_settings(settings={key: None})
        http.update_trace_settings(model_name="add_sub", settings={key: None})
    assert http.get_trace_settings(model_name="add_sub") == DEFAULT_TRACE


def test_rate_zero_refused_while_tracing(http, grpc):
    """Rate 0 with a level on is refused, in the same change or against the level in force."""
    text = "Attempting to set invalid trace setting :sample rate must be non-zero"
    e = _error(lambda: http.update_trace_settings(settings={"trace_rate": "0", "trace_level": ["TIMESTAMPS"]}))
    assert e.status() == "400" and text in e.message()
    try:
        grpc.update_trace_settings(model_name="add_sub", settings={"trace_level": ["TIMESTAMPS"]})
        e = _error(lambda: grpc.update_trace_settings(model_name="add_sub", settings={"trace_rate": "0"}))
        assert e.status() == "StatusCode.INVALID_ARGUMENT" and text in e.message()
        http.update_trace_settings(settings={"trace_rate": "0"})  # the global level is OFF
        e = _error(lambda: http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}))
        assert e.status() == "400" and text in e.message()
        assert http.get_trace_settings()["trace_level"] == ["OFF"]
    finally:
        http.update_trace_settings(model_name="add_sub", settings={"trace_level": None})
        http.update_trace_settings(settings={"trace_rate": None})
    assert http.get_trace_settings() == DEFAULT_TRACE


@pytest.mark.parametrize("settings, text", [
    ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": ""}, "Unable to parse 'trace_rate', got: "),
    ({"trace_rate": "4294967296"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 4294967296"),
    ({"trace_rate": "4294967295"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 4294967295"),
    ({"trace_rate": "-2147483649"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: -2147483649"),
    ({"trace_count": "-5"}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"),
    ({"trace_count": "2147483648"},
     "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 2147483648"),
    ({"log_frequency": "x"}, "Unable to parse 'log_frequency', got: x"),
    ({"log_frequency": "4294967296"},
     "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 4294967296"),
    ({"trace_level": ["FOO"]}, "Unknown trace level 'FOO'"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
])
def test_bad_trace_values(http, grpc, settings, text):
    e = _error(lambda: http.update_trace_settings(settings=settings))
    assert e.status() == "400" and text in e.message()
    e = _error(lambda: grpc.update_trace_settings(model_name="add_sub", settings=settings))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and text in e.message()
    assert http.get_trace_settings() == DEFAULT_TRACE
    assert http.get_trace_settings(model_name="add_sub") == DEFAULT_TRACE


def test_bad_trace_json_types(server):
    import urllib.error
    import urllib.request

    def post(body: bytes) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://{server.http_url}/v2/trace/setting", data=body, method="POST")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post(b'{"trace_rate": 5}')[0] == 400
    assert post(b'{"trace_level": "TIMESTAMPS"}')[0] == 400
    assert post(b"not json")[0] == 400
    status, doc = post(b'{"unknown_key": "1", "trace_mode": "opentelemetry"}')  # ignored, as Triton does
    assert status == 200 and doc == DEFAULT_TRACE


def test_unknown_model_trace_settings(http, grpc):
    e = _error(lambda: http.get_trace_settings(model_name="no_such_model"))
    assert e.status() == "400" and "Request for unknown model : no_such_model" in e.message()
    e = _error(lambda: grpc.update_trace_settings(model_name="no_such_model", settings={"trace_rate": "2"}))
    assert e.status() == "StatusCode.INVALID_ARGUMENT"


# -- log settings ---------------------------------------------------------------------------
def test_log_settings_get(http, grpc, default_log):
    assert http.get_log_settings() == default_log
    assert _grpc_log(grpc) == default_log


def test_log_file_not_settable(http, grpc, default_log):
    for value in ("/tmp/evil.log", ""):
        e = _error(lambda value=value: http.update_log_settings({"log_file": value}))
        assert e.status() == "501" and "log file location can not be updated through network protocol" in e.message()
        e = _error(lambda value=value: grpc.update_log_settings({"log_file": value}))
        assert e.status() == "StatusCode.UNIMPLEMENTED"
        assert "log file location can not be updated through network protocol" in e.message()
    assert http.update_log_settings({"log_file": None}) == default_log  # null: nothing to change
    assert not Path("/tmp/evil.log").exists()


def test_bad_log_values(http, grpc, default_log):
    e = _error(lambda: http.update_log_settings({"log_format": "xml"}))
    assert e.status() == "400" and "invalid argument for log_format, got: xml" in e.message()
    e = _error(lambda: grpc.update_log_settings({"log_format": "xml"}))
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    for bad in ({"log_info": "yes"}, {"log_verbose_level": -1}, {"log_verbose_level": "1"},
                {"log_verbose_level": True}):
        assert _error(lambda bad=bad: http.update_log_settings(bad)).status() == "400"
    assert http.get_log_settings() == default_log


def _wait_for(path: Path, pattern: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in:\n{path.read_text()[-3000:]}")


def test_log_settings_take_effect(server, http, grpc, default_log):
    log_file = server.log_file
    try:
        http.get_log_settings()
        assert "HTTP request: GET /v2/logging" not in log_file.read_text()  # verbose is off
        got = http.update_log_settings({"log_verbose_level": 1})
        assert got == {**default_log, "log_verbose_level": 1}
        http.get_log_settings()
        _wait_for(log_file, r"^D\d{4} [\d:.]+ \d+ \S+\] HTTP request: GET /v2/logging$")
        # ISO8601 lines, set over gRPC
        grpc.update_log_settings({"log_format": "ISO8601"})
        got = _grpc_log(grpc)
        assert got == {**default_log, "log_verbose_level": 1, "log_format": "ISO8601"}
        http.get_trace_settings()
        _wait_for(log_file, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ D \d+ \S+\] HTTP request: GET /v2/trace/setting$")
        # log_info off: INFO lines stop (a trace settings update logs one)
        # log_info off and verbose off: no INFO line (a trace settings update logs one), no DEBUG line
        http.update_log_settings({"log_info": False, "log_verbose_level": 0})
        before = log_file.read_text()
        http.update_trace_settings(model_name="identity_fp32", settings={"trace_rate": "11"})
        http.update_trace_settings(model_name="identity_fp32", settings={"trace_rate": None})
        http.get_log_settings()
        http.update_log_settings({"log_info": True})
        text = _wait_for(log_file, r"log settings updated: \{'log_info': True\}")
        new = text[len(before):]
        assert "trace settings updated" not in new and "HTTP request" not in new, new
    finally:
        http.update_log_settings({"log_verbose_level": 0, "log_format": "default", "log_info": True})
    assert http.get_log_settings() == default_log


# -- the trace file ---------------------------------------------------------------------------
def _check_trace(trace: dict, model: str = "add_sub") -> None:
    assert trace["model_name"] == model and trace["model_version"] == 1
    names = [t["name"] for t in trace["timestamps"]]
    assert names == STAMPS
    ns = [t["ns"] for t in trace["timestamps"]]
    assert ns == sorted(ns) and ns[0] > 0


def test_trace_file_written(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    srv = _start(repo, tmp_path, "traced", ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                                            "--trace-config", f"file={trace_file}"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        settings = http.get_trace_settings()
        assert settings == {**DEFAULT_TRACE, "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                            "trace_file": str(trace_file)}
        # identity_fp32 is not traced: its own level overrides the global one
        http.update_trace_settings(model_name="identity_fp32", settings={"trace_level": ["OFF"]})
        for i in range(3):
            _infer_http(http, request_id=f"h{i}")
            _infer_grpc(grpc, request_id=f"g{i}" if i else "")
            _infer_http(http, model="identity_fp32")
        http.close()
        grpc.close()
    finally:
        _stop(srv)
    traces = json.loads(trace_file.read_text())
    assert len(traces) == 6
    assert [t["id"] for t in traces] == sorted(t["id"] for t in traces) and len({t["id"] for t in traces}) == 6
    for t in traces:
        _check_trace(t)
    assert sorted(t.get("request_id", "") for t in traces) == ["", "g1", "g2", "h0", "h1", "h2"]
    assert "request_id" not in [t for t in traces if t.get("request_id", "") == ""][0]


def test_bls_call_with_the_request_trace_is_a_child_trace(repo, tmp_path):
    """A BLS call made with trace=request.trace() is traced as a child (parent_id) of the
    calling request's trace; one made without is not traced, as in Triton."""
    trace_file = tmp_path / "trace.json"
    srv = _start(repo, tmp_path, "bls", ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                                         "--trace-config", f"file={trace_file}"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        x = httpclient.InferInput("INPUT0", [3], "FP32")
        x.set_data_from_numpy(np.arange(3, dtype=np.float32))
        result = http.infer("bls_traced", [x], request_id="b1")
        http.close()
    finally:
        _stop(srv)
    assert result.as_numpy("CONTEXT")[0] == b"none"  # no OpenTelemetry context in this mode
    traces = json.loads(trace_file.read_text())
    assert sorted(t["model_name"] for t in traces) == ["bls_traced", "identity_fp32"]
    parent = next(t for t in traces if t["model_name"] == "bls_traced")
    child = next(t for t in traces if t["model_name"] == "identity_fp32")
    assert "parent_id" not in parent and child["parent_id"] == parent["id"] != child["id"]
    for t in traces:
        _check_trace(t, t["model_name"])
    # the child ran while its parent was computing
    stamps = {t["model_name"]: {s["name"]: s["ns"] for s in t["timestamps"]} for t in traces}
    assert stamps["bls_traced"]["COMPUTE_START"] <= stamps["identity_fp32"]["REQUEST_START"]
    assert stamps["identity_fp32"]["REQUEST_END"] <= stamps["bls_traced"]["COMPUTE_END"]


def test_trace_rate_count_and_log_frequency(repo, tmp_path):
    """Every 2nd request, 3 traces at most, written 2 per file to trace.json.<index>."""
    trace_file = tmp_path / "trace.json"
    srv = _start(repo, tmp_path, "counted", [
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=2", "--trace-config", "count=3",
        "--trace-config", "triton,log-frequency=2", "--trace-config", f"triton,file={trace_file}"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        for _ in range(4):
            _infer_http(http)
        assert http.get_trace_settings()["trace_count"] == "1"  # it counts down, as in Triton
        deadline = time.monotonic() + 5
        while not Path(f"{trace_file}.0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(json.loads(Path(f"{trace_file}.0").read_text())) == 2  # written before shutdown
        for _ in range(6):
            _infer_http(http)
        assert http.get_trace_settings()["trace_count"] == "0"
        http.close()
    finally:
        _stop(srv)
    first = json.loads(Path(f"{trace_file}.0").read_text())
    rest = json.loads(Path(f"{trace_file}.1").read_text())  # the leftover trace, at shutdown
    assert [len(first), len(rest)] == [2, 1]
    assert [t["id"] for t in first + rest] == [1, 2, 3]
    for t in first + rest:
        _check_trace(t)
    assert not trace_file.exists() and not Path(f"{trace_file}.2").exists()


def test_tracing_off_writes_nothing(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    srv = _start(repo, tmp_path, "off", ["--trace-config", f"triton,file={trace_file}"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        assert http.get_trace_settings()["trace_level"] == ["OFF"]
        for _ in range(3):
            _infer_http(http)
        http.close()
    finally:
        _stop(srv)
    assert list(tmp_path.glob("trace.json*")) == []


def test_tracing_without_file_logs_it(repo, tmp_path):
    srv = _start(repo, tmp_path, "nofile", ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        _infer_http(http)
        assert http.get_trace_settings()["trace_file"] == ""
        http.close()
    finally:
        _stop(srv)
    assert "no trace file was given" in srv.log()


@pytest.mark.parametrize("flag", ["level=LOUD", "rate=abc", "mode=foo", "bogus=1", "count=-7"])
def test_bad_trace_config_flag(repo, tmp_path, flag):
    with pytest.raises(RuntimeError, match="exited with 1"):
        _start(repo, tmp_path, "bad", ["--trace-config", flag])


def test_api_changes_replay_into_a_fresh_tracer():
    """What a restarted front-end process replays: the API's changes since start-up, global
    and per model (a model's override only; the rest follows the global settings)."""
    from triton_shm.core.observability.tracing import Tracer
    startup = {"trace_rate": 50}
    tracer = Tracer(startup)
    assert tracer.api_changes() == []
    tracer.update("", {"trace_rate": "7", "trace_level": ["TIMESTAMPS"]})
    tracer.update("m", {"trace_count": "3"})
    tracer.update("cleared", {"trace_rate": "9"})
    tracer.update("cleared", {"trace_rate": None})
    fresh = Tracer(startup)
    for model, changes in tracer.api_changes():
        fresh.update(model, changes)
    for model in ("", "m", "cleared"):
        assert fresh.settings(model) == tracer.settings(model)
    tracer.update("wide", {"trace_rate": "-1", "log_frequency": "-2"})  # 4294967295 and 4294967294
    fresh = Tracer(startup)
    for model, changes in tracer.api_changes():
        fresh.update(model, changes)
    for model in ("", "m", "cleared", "wide"):
        assert fresh.settings(model) == tracer.settings(model)
    assert fresh.settings("wide")["trace_rate"] == "4294967295"
    fresh.update("", {"trace_rate": "11"})  # the model's override did not pin the global rate
    assert fresh.settings("m")["trace_rate"] == "11" and fresh.settings("m")["trace_count"] == "3"
