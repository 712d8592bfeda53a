"""Restricted APIs (--http-restricted-api, --grpc-restricted-protocol): every group over both
protocols and both gRPC transports, with tritonserver 2.51's statuses, messages and mapping
of routes and RPCs to groups; values from the command line, a file or the environment;
the start-up errors."""
from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import time
import types

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from triton_shm.cli import parse_args
from triton_shm.frontend.grpc.servicer import methods
from triton_shm.frontend.http.api_groups import api_group
from triton_shm.frontend.http.handlers import HttpHandlers, build_routes
from triton_shm.frontend.http.lean_request import infer_route
from triton_shm.frontend.restricted import GROUPS, RestrictionError, parse_restrictions

from .harness import ServerProcess
from .models import python_identity

MODEL = "identity_fp32"
GRPC_PREFIX = "triton-grpc-protocol-"

# Every HTTP route and the group tritonserver 2.51 puts it in (checked against it: each
# answered 403 naming that group's header; the method does not matter).
HTTP_ROUTES = [
    ("GET", "/v2/health/live", "health"), ("GET", "/v2/health/ready", "health"),
    ("GET", f"/v2/models/{MODEL}/ready", "health"), ("GET", f"/v2/models/{MODEL}/versions/1/ready", "health"),
    ("GET", "/v2", "metadata"), ("GET", f"/v2/models/{MODEL}", "metadata"),
    ("GET", f"/v2/models/{MODEL}/versions/1", "metadata"),
    ("POST", f"/v2/models/{MODEL}/infer", "inference"), ("POST", f"/v2/models/{MODEL}/versions/1/infer", "inference"),
    ("POST", f"/v2/models/{MODEL}/generate", "inference"), ("POST", f"/v2/models/{MODEL}/generate_stream", "inference"),
    ("POST", f"/v2/models/{MODEL}/versions/1/generate", "inference"),
    ("POST", f"/v2/models/{MODEL}/versions/1/generate_stream", "inference"),
    ("GET", f"/v2/models/{MODEL}/infer", "inference"),  # the wrong method: still the group's
    ("GET", f"/v2/models/{MODEL}/config", "model-config"),
    ("GET", f"/v2/models/{MODEL}/versions/1/config", "model-config"),
    ("GET", "/v2/models/stats", "statistics"), ("GET", f"/v2/models/{MODEL}/stats", "statistics"),
    ("GET", f"/v2/models/{MODEL}/versions/1/stats", "statistics"),
    ("POST", "/v2/repository/index", "model-repository"), ("GET", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/models/absent/load", "model-repository"),  # not the served model: it stays
    ("POST", "/v2/repository/models/absent/unload", "model-repository"),
    ("GET", "/v2/trace/setting", "trace"), ("POST", "/v2/trace/setting", "trace"),
    ("GET", f"/v2/models/{MODEL}/trace/setting", "trace"), ("POST", f"/v2/models/{MODEL}/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"), ("POST", "/v2/logging", "logging"),
    *[(m, f"/v2/{kind}sharedmemory{tail}", "shared-memory") for kind in ("system", "cuda") for m, tail in (
        ("GET", "/status"), ("GET", "/region/r/status"), ("POST", "/region/r/register"), ("POST", "/register"),
        ("POST", "/unregister"), ("POST", "/region/r/unregister"))],
    ("DELETE", "/v2/health/live", "health"),
]
# Paths of no API: 404, restricted or not.
NOT_APIS = ["/nonexistent", "/v2/health", "/v2/models", "/v2/models/m/versions/abc", "/v2/logging/x",
            f"/v2/models/{MODEL}/versions/1/trace/setting", "/v2/repository/models/m/versions/1/load", "/metrics"]

# Each RPC's group, as tritonserver 2.51 answers it.
GRPC_RPCS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    **{f"{kind}SharedMemory{op}": "shared-memory" for kind in ("System", "Cuda")
       for op in ("Status", "Register", "Unregister")},
    "TraceSetting": "trace", "LogSettings": "logging",
}

# The server's keys: health and metadata share one flag whose value is in a file, inference's
# comes from the environment, every other group has its own literal key.
ADMIN_KEY, INFER_KEY = "Admin-Key", "infer-key"
KEYS = {g: ADMIN_KEY if g in ("health", "metadata") else INFER_KEY if g == "inference" else f"k-{g}"
        for g in GROUPS}
VALUES = {g: "file-secret" if g in ("health", "metadata") else "env-secret" if g == "inference" else f"v-{g}"
          for g in GROUPS}


def _flags(flag: str, secret_file) -> list[str]:
    out = [f"{flag}=health,metadata:{ADMIN_KEY}=@{secret_file}", f"{flag}=inference:{INFER_KEY}=env:TEST_INFER_KEY"]
    return out + [f"{flag}={g}:k-{g}=v-{g}" for g in GROUPS if g not in ("health", "metadata", "inference")]


_servers: dict[str, ServerProcess] = {}


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    def start(transport: str) -> ServerProcess:
        if transport not in _servers:
            root = tmp_path_factory.mktemp(f"restricted-{transport}")
            python_identity(root / "models", MODEL, "FP32")
            secret = root / "admin.secret"
            secret.write_text("file-secret\n")  # one line ending is not part of the value
            server = ServerProcess(
                root / "models", root / "server.log",
                extra_args=["--grpc-transport", transport, "--model-control-mode", "explicit", "--load-model", MODEL,
                            *_flags("--http-restricted-api", secret), *_flags("--grpc-restricted-protocol", secret)],
                env={"TEST_INFER_KEY": "env-secret"}, health_headers={ADMIN_KEY: "file-secret"})
            server.secret_file = secret
            _servers[transport] = server.start()
        return _servers[transport]
    yield start
    for server in _servers.values():
        server.stop_cleanly()
    _servers.clear()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def restricted(request, start) -> ServerProcess:
    return start(request.param)


@pytest.fixture(scope="module")
def http_restricted(start) -> ServerProcess:
    return start("native")


def _http(server: ServerProcess, method: str, path: str, headers: dict[str, str] | None = None,
          body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        if body is None and method == "POST":
            body = b"{}"
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _refusal(group: str) -> bytes:
    return orjson.dumps({"error": f"This API is restricted, expecting header '{KEYS[group]}'"})


# -- HTTP ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, path, group", HTTP_ROUTES, ids=[f"{m} {p}" for m, p, _ in HTTP_ROUTES])
def test_every_http_route_needs_its_groups_header(http_restricted, method, path, group):
    status, body = _http(http_restricted, method, path)
    assert (status, body) == (403, _refusal(group))
    status, body = _http(http_restricted, method, path, {KEYS[group]: VALUES[group] + "x"})
    assert (status, body) == (403, _refusal(group))
    other = "logging" if group != "logging" else "trace"  # another group's key does not open it
    assert _http(http_restricted, method, path, {KEYS[other]: VALUES[other]})[0] == 403
    status, body = _http(http_restricted, method, path, {KEYS[group].upper(): VALUES[group]})
    assert status != 403, body  # the route's own answer (200, 400, 404 for a missing region, ...)


@pytest.mark.parametrize("path, group", [
    ("/%76%32/health/live", "health"), ("/v2/health/l%69ve", "health"), ("http://x/v2/health/live", "health"),
    (f"/v2/models/{MODEL}%2Fready", "metadata"),  # the model named "identity_fp32/ready"
    ("/v2/models/identity%5Ffp32/versions/1/config", "model-config"), ("/v2/health/live?x=1", "health")])
def test_escaped_and_absolute_paths_are_checked_as_the_router_reads_them(http_restricted, path, group):
    assert _http(http_restricted, "GET", path) == (403, _refusal(group))


@pytest.mark.parametrize("path", NOT_APIS)
def test_paths_of_no_api_are_not_found(http_restricted, path):
    assert _http(http_restricted, "GET", path)[0] == 404


def test_http_values_are_exact_and_the_first_header_counts(http_restricted):
    path = "/v2/models/stats"
    assert _http(http_restricted, "GET", path, {"k-statistics": "V-STATISTICS"})[0] == 403
    raw = [("k-statistics", "wrong"), ("k-statistics", "v-statistics")]
    assert _raw_get(http_restricted, path, raw).startswith(b"HTTP/1.1 403")
    assert _raw_get(http_restricted, path, raw[::-1]).startswith(b"HTTP/1.1 200")


def _raw_get(server: ServerProcess, path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_http_infer_with_tritonclient(http_restricted):
    client = httpclient.InferenceServerClient(http_restricted.http_url)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, [inp])
    assert e.value.message() == f"This API is restricted, expecting header '{INFER_KEY}'"
    result = client.infer(MODEL, [inp], headers={INFER_KEY: "env-secret"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))
    client.close()


def test_http_infer_refused_on_the_lean_and_the_aiohttp_route(http_restricted):
    """The lean path serves plain infer URLs; a percent-escaped one goes to aiohttp. Both check."""
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    for path in (f"/v2/models/{MODEL}/infer", "/v2/models/identity%5Ffp32/infer"):
        assert _http(http_restricted, "POST", path, body=body) == (403, _refusal("inference"))
        status, answer = _http(http_restricted, "POST", path, {INFER_KEY: "env-secret"}, body=body)
        assert status == 200, answer


def test_refused_infer_keeps_the_connection_for_the_next_request(http_restricted):
    """Pipelined on one keep-alive connection: refused (its 4 MiB body read and dropped),
    then served, in order."""
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [2.0]}]})
    big = b" " * (4 << 20)
    head = "POST /v2/models/" + MODEL + "/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{}\r\n"
    with socket.create_connection(("127.0.0.1", http_restricted.http_port), timeout=30) as s:
        s.sendall(head.format(len(big), "").encode() + big
                  + head.format(len(body), f"{INFER_KEY}: env-secret\r\nConnection: close\r\n").encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    first, _, second = out.partition(b"HTTP/1.1 200")
    assert first.startswith(b"HTTP/1.1 403") and _refusal("inference") in first
    assert b'"data":[2.0]' in second


def test_generate_stream_is_restricted_as_inference(http_restricted):
    status, body = _http(http_restricted, "POST", f"/v2/models/{MODEL}/generate_stream",
                         body=orjson.dumps({"INPUT0": [1.0]}))
    assert (status, body) == (403, _refusal("inference"))
    status, body = _http(http_restricted, "POST", f"/v2/models/{MODEL}/generate_stream", {INFER_KEY: "env-secret"},
                         body=orjson.dumps({"INPUT0": [1.0]}))
    assert status == 200 and body.startswith(b"data: "), body


# -- gRPC ---------------------------------------------------------------------------------------
def _grpc_message(group: str) -> str:
    return f"This protocol is restricted, expecting header '{GRPC_PREFIX}{KEYS[group]}'"


def _request(name: str):
    if name == "ModelStreamInfer":
        return pb.ModelInferRequest(model_name=MODEL)
    request = getattr(pb, pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[name]
                      .input_type.name)()
    if hasattr(request, "name"):
        request.name = MODEL
    return request


def _call(server: ServerProcess, name: str, metadata: list[tuple[str, str]]):
    """(code, details) of one RPC."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        path = f"/inference.GRPCInferenceService/{name}"
        try:
            if name == "ModelStreamInfer":
                call = channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                             response_deserializer=pb.ModelStreamInferResponse.FromString)
                replies = list(call(iter([_request(name)]), metadata=metadata, timeout=30))
                return grpc.StatusCode.OK, replies
            call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=lambda b: b)
            call(_request(name), metadata=metadata, timeout=30)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()


@pytest.mark.parametrize("name", list(GRPC_RPCS))
def test_every_rpc_needs_its_groups_metadata(restricted, name):
    group = GRPC_RPCS[name]
    assert _call(restricted, name, []) == (grpc.StatusCode.UNAVAILABLE, _grpc_message(group))
    wrong = [(GRPC_PREFIX + KEYS[group].lower(), VALUES[group] + "x")]
    assert _call(restricted, name, wrong) == (grpc.StatusCode.UNAVAILABLE, _grpc_message(group))
    bare = [(KEYS[group].lower(), VALUES[group])]  # the key without the prefix is not it
    assert _call(restricted, name, bare) == (grpc.StatusCode.UNAVAILABLE, _grpc_message(group))
    code, details = _call(restricted, name, [(GRPC_PREFIX + KEYS[group].lower(), VALUES[group])])
    assert details != _grpc_message(group), (code, details)


def test_grpc_health_check_is_restricted_as_health(restricted):
    with grpc.insecure_channel(restricted.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as e:
            check(b"", timeout=30)
        assert (e.value.code(), e.value.details()) == (grpc.StatusCode.UNAVAILABLE, _grpc_message("health"))
        assert check(b"", metadata=[(GRPC_PREFIX + ADMIN_KEY.lower(), "file-secret")], timeout=30) == b"\x08\x01"


def test_grpc_first_metadata_value_counts(restricted):
    key = GRPC_PREFIX + "k-logging"
    assert _call(restricted, "LogSettings", [(key, "v-logging"), (key, "w")])[0] == grpc.StatusCode.OK
    assert _call(restricted, "LogSettings", [(key, "w"), (key, "v-logging")])[0] == grpc.StatusCode.UNAVAILABLE


def test_grpc_infer_and_stream_with_tritonclient(restricted):
    headers = {GRPC_PREFIX + INFER_KEY: "env-secret"}
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [3], "FP32")
    inp.set_data_from_numpy(np.arange(3, dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, [inp])
    assert (e.value.status(), e.value.message()) == ("StatusCode.UNAVAILABLE", _grpc_message("inference"))
    np.testing.assert_array_equal(client.infer(MODEL, [inp], headers=headers).as_numpy("OUTPUT0"),
                                  np.arange(3, dtype=np.float32))
    results: list = []
    client.start_stream(callback=lambda result, error: results.append((result, error)), headers=headers)
    client.async_stream_infer(MODEL, [inp])
    client.stop_stream()
    assert len(results) == 1 and results[0][1] is None
    np.testing.assert_array_equal(results[0][0].as_numpy("OUTPUT0"), np.arange(3, dtype=np.float32))
    client.close()


# -- beyond tritonserver: the metrics port ----------------------------------------------------------
def test_metrics_group_guards_the_metrics_port(tmp_path):
    """--http-restricted-api=metrics:... (Prometheus sends it with ``authorization: credentials``)."""
    import urllib.error
    import urllib.request
    from .harness import free_port
    python_identity(tmp_path / "models", MODEL, "FP32")
    port = free_port()
    server = ServerProcess(tmp_path / "models", tmp_path / "server.log", extra_args=[
        "--allow-metrics", "true", "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
        "--http-restricted-api=metrics:Authorization=Bearer scrape-token"]).start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=30)
        assert (e.value.code, e.value.read()) == (
            403, b'{"error":"This API is restricted, expecting header \'Authorization\'"}')
        request = urllib.request.Request(url, headers={"Authorization": "Bearer scrape-token"})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200 and b"nv_inference_count" in r.read()
        assert _http(server, "GET", "/v2/health/ready")[0] == 200  # the HTTP port's APIs stay open
    finally:
        server.stop_cleanly()


# -- values from a file, reloaded on SIGHUP -----------------------------------------------------------
def test_sighup_rereads_a_value_from_its_file(http_restricted):
    server = http_restricted
    assert _http(server, "GET", "/v2", {ADMIN_KEY: "file-secret"})[0] == 200
    server.secret_file.write_text("rotated-secret\n")
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "SIGHUP: reloading" not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)
    try:
        assert _http(server, "GET", "/v2", {ADMIN_KEY: "file-secret"})[0] == 403
        assert _http(server, "GET", "/v2", {ADMIN_KEY: "rotated-secret"})[0] == 200
        assert _call(server, "ServerMetadata", [(GRPC_PREFIX + ADMIN_KEY.lower(), "rotated-secret")])[0] == \
            grpc.StatusCode.OK
    finally:
        server.health_headers = {ADMIN_KEY: "rotated-secret"}


# -- the tables -------------------------------------------------------------------------------------------
def test_every_http_route_has_a_group():
    """No route of the aiohttp app outside the groups: a route added later cannot be left open."""
    samples = {"{model}": MODEL, r"{version:\d+}": "1", "{region}": "r"}
    for route in build_routes(HttpHandlers(None, 0)):  # type: ignore[arg-type]
        path = route.path
        for pattern, sample in samples.items():
            path = path.replace(pattern, sample)
        assert api_group(path) is not None, route.path
    expected = {(p, g) for _, p, g in HTTP_ROUTES}
    assert {(p, api_group(p)) for _, p, _ in HTTP_ROUTES} == expected
    assert all(api_group(p) is None for p in NOT_APIS)


def test_the_lean_infer_route_is_inference():
    for url in (b"/v2/models/m/infer", b"/v2/models/m/versions/3/infer?x=1"):
        assert infer_route(b"POST", url) is not None
        assert api_group(url.split(b"?")[0].decode()) == "inference"


def test_every_rpc_has_its_group():
    no_service = types.SimpleNamespace(infer=None)  # the table only: no method is called
    groups = {m.path.rsplit("/", 1)[1]: m.group for m in methods(no_service)}  # type: ignore[arg-type]
    assert groups == {**GRPC_RPCS, "Check": "health"}


# -- start-up errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--http-restricted-api=bogus:k=v"], "unknown restricted api 'bogus'"),
    (["--grpc-restricted-protocol=bogus:k=v"], "unknown restricted protocol 'bogus'"),
    (["--grpc-restricted-protocol=metrics:k=v"], "unknown restricted protocol 'metrics'"),  # HTTP's only
    (["--http-restricted-api=health,:k=v"], "unknown restricted api ''"),
    (["--http-restricted-api=Health:k=v"], "unknown restricted api 'Health'"),
    (["--http-restricted-api=health:k=v", "--http-restricted-api=metadata,health:k2=v2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["--http-restricted-api=health,health:k=v"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=trace:k=v", "--grpc-restricted-protocol=trace:k=v"],
     "restricted protocol 'trace' can not be specified in multiple config groups"),
    *[([f"--http-restricted-api={bad}"],
       f"--http-restricted-api option format is '<config name>:<setting>=<value>'. Got {bad}")
      for bad in ("health", "health:k", "health:=v", "health:k=", ":k=v")],
    (["--grpc-restricted-protocol=health:k"],
     "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health:k"),
    (["--http-restricted-api=health:k=@/nonexistent/secret"],
     "cannot read the value of header 'k' from '/nonexistent/secret': No such file or directory"),
    (["--grpc-restricted-protocol=health:k=env:TRITON_SHM_TEST_UNSET"],
     "the value of header 'k' names the environment variable 'TRITON_SHM_TEST_UNSET', which is not set"),
])
def test_startup_errors_exit_1(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--model-repository", "/tmp", *flags])
    assert e.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"triton-shm: error: {message}"


def test_startup_error_from_the_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "triton_shm", "--model-repository", str(tmp_path),
                          "--http-restricted-api=inference:k=v", "--http-restricted-api=inference:k=w"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == \
        "triton-shm: error: restricted api 'inference' can not be specified in multiple config groups"


def test_same_group_on_both_protocols_and_values_with_equals_signs():
    http = parse_restrictions(["health:k=v=w"], "--http-restricted-api")
    grpc_ = parse_restrictions(["health:k=v"], "--grpc-restricted-protocol", grpc=True)
    assert http.by_group["health"].value == b"v=w"
    assert grpc_.refusal("health", {"triton-grpc-protocol-k": b"v"}.get) is None
    assert http.refusal("health", {"k": b"v=w"}.get) is None
    assert http.refusal("metadata", {}.get) is None  # unrestricted groups pass


def test_file_values_must_be_one_non_empty_line(tmp_path):
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two").write_text("a\nb\n")
    for name, why in (("empty", "is empty"), ("two", "spans several lines")):
        with pytest.raises(RestrictionError) as e:
            parse_restrictions([f"health:k=@{tmp_path / name}"], "--http-restricted-api")
        assert str(e.value) == f"the value of header 'k' from file '{tmp_path / name}' {why}"
