"""Hostile input against a running server: each case gets a clear 4xx / gRPC status (or a
closed connection where the protocol says so), and the server then still serves an
ordinary client correctly with its memory bounded.

Both HTTP paths (the lean infer route, and aiohttp, reached by a percent-escaped infer URL)
and both gRPC transports (native and grpcio: the fixture runs every test on each).
"""
from __future__ import annotations

import base64
import glob
import gzip
import http.client
import json
import os
import socket
import threading
import zlib
from pathlib import Path

import grpc
import h2.connection
import h2.events
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from triton_shm.frontend.http.app import default_http_transport

from .harness import ServerProcess, children
from .helpers import assert_serving
from .models import python_identity, write_model

pytestmark = pytest.mark.timeout(180)

LEAN = default_http_transport() == "lean"  # else aiohttp alone serves HTTP
MAX_INPUT = 1 << 20          # --http-max-input-size for this server
HEADER_TIMEOUT, IDLE_TIMEOUT = 2, 3  # seconds: short, so the tests see them act
DEPTH_ERROR = "JSON nesting depth exceeds the limit of 100"
MODEL = "identity_fp32"
# the lean path serves the plain infer URL; a percent-escape sends the same request to aiohttp
INFER_PATHS = {"lean": f"/v2/models/{MODEL}/infer", "aiohttp": "/v2/models/identity%5Ffp32/infer"}
RSS_BUDGET = 128 << 20       # what the front-end may grow by over the whole module
SERVICE = "/inference.GRPCInferenceService"


@pytest.fixture(scope="module", params=["native", "grpcio"])
def srv(request, tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp(f"hostile_{request.param}")
    repo = root / "models"
    python_identity(repo, MODEL, "FP32")
    python_identity(repo, "identity_bytes", "BYTES")
    server = ServerProcess(repo, root / "server.log", extra_args=[
        "--model-control-mode", "explicit", "--load-model", "*", "--allow-client-shm=true",
        "--grpc-transport", request.param, "--http-max-input-size", str(MAX_INPUT),
        "--http-header-timeout-secs", str(HEADER_TIMEOUT), "--http-idle-timeout-secs", str(IDLE_TIMEOUT),
        "--grpc-max-connection-idle", str(IDLE_TIMEOUT * 1000)]).start()
    server.repo, server.transport = repo, request.param
    server.start_rss = rss(server.proc.pid)
    server.workers = children(server.proc.pid)
    yield server
    assert rss(server.proc.pid) - server.start_rss < RSS_BUDGET, "the front-end's memory grew unbounded"
    server.stop_cleanly()


# --------------------------------------------------------------------------- helpers

def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def infer_body(values=(1.0, 2.0, 3.0, 4.0), **extra) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": list(values)}],
            **extra}


def post(srv: ServerProcess, path: str, body: bytes | str, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def assert_serves(srv: ServerProcess) -> None:
    """An ordinary client still gets correct answers on every protocol and HTTP path, from
    the same worker processes."""
    assert_serving(srv, MODEL, workers=srv.workers)
    status, body = post(srv, INFER_PATHS["aiohttp"], json.dumps(infer_body()))
    assert (status, body["outputs"][0]["data"]) == (200, [1.0, 2.0, 3.0, 4.0])


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response off a raw socket: (status, body); (0, b"") when the server closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body[:length]


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Reads (and drops) until EOF or ``within`` seconds; True on EOF or a reset."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def raw_unary(srv: ServerProcess, method: str, payload: bytes):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        call = channel.unary_unary(f"{SERVICE}/{method}", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            call(payload, timeout=30)
        return info.value


GARBAGE = b"\xff\xff\xff\xff\x0f not a protobuf"


def good_grpc_request() -> bytes:
    req = service_pb2.ModelInferRequest(model_name=MODEL, id="good")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    req.raw_input_contents.append(np.array([5.0, 6.0], dtype=np.float32).tobytes())
    return req.SerializeToString()


# =========================================================================== HTTP bodies

@pytest.mark.parametrize("path", INFER_PATHS)
def test_body_in_100000_tiny_chunks(srv, path):
    body = json.dumps(infer_body(padding="c" * 100_000)).encode()
    chunks = b"".join(b"1\r\n" + body[i:i + 1] + b"\r\n" for i in range(len(body)))
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=60) as sock:
        sock.sendall(f"POST {INFER_PATHS[path]} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Type: application/json\r\n\r\n".encode() + chunks + b"0\r\n\r\n")
        status, raw = read_response(sock)
    assert len(body) >= 100_000
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    assert_serves(srv)


@pytest.mark.parametrize("path", INFER_PATHS)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_body_inflating_past_the_limit(srv, path, encoding):
    bomb = b"[" + b"0," * (8 << 20) + b"0]"  # 16 MiB of JSON, a few KiB compressed
    packed = gzip.compress(bomb, 9) if encoding == "gzip" else zlib.compress(bomb, 9)
    assert len(packed) < MAX_INPUT
    assert post(srv, INFER_PATHS[path], packed, {"Content-Encoding": encoding}) == (
        400, {"error": f"decompressed request body exceeds the limit of {MAX_INPUT} bytes"})
    assert_serves(srv)


@pytest.mark.parametrize("path", INFER_PATHS)
@pytest.mark.parametrize("where", ["document", "data", "bytes_data"])
def test_json_nested_10000_deep(srv, path, where):
    deep = "[" * 10_000 + "1" + "]" * 10_000
    if where == "document":
        text = '{"inputs": [], "x": %s}' % deep
    elif where == "data":
        text = '{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": %s}]}' % deep
    else:
        text = '{"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": %s}]}' % deep.replace(
            "1", '"a"')
    assert post(srv, INFER_PATHS[path], text) == (400, {"error": DEPTH_ERROR})
    assert_serves(srv)


@pytest.mark.parametrize("path", INFER_PATHS)
@pytest.mark.parametrize("depth", [150, 500, 900])
def test_tensor_data_nested_past_the_limit(srv, path, depth):
    """Below orjson's own limit (1024), above ours: 400, not a RecursionError (500)."""
    data = "[" * depth + "1.0" + "]" * depth
    text = '{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": %s}]}' % data
    assert post(srv, INFER_PATHS[path], text) == (400, {"error": DEPTH_ERROR})


def test_64_kib_header(srv):
    log_before = len(srv.log())
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as sock:
        sock.sendall(f"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 65536}\r\n\r\n".encode())
        status, body = read_response(sock)
    if not LEAN:  # aiohttp alone: its parser's answer to an over-long field
        assert status == 400, body
    else:
        assert (status, json.loads(body)) == (431, {"error": "a header field is longer than 8190 bytes"})
    assert "Traceback" not in srv.log()[log_before:]
    assert_serves(srv)


# =========================================================================== connections and time

def test_idle_connections_and_slowloris_while_a_client_is_served(srv):
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30)
            for port in (srv.http_port, srv.grpc_port) for _ in range(150)]
    slow = socket.create_connection(("127.0.0.1", srv.http_port), timeout=30)
    stop = threading.Event()

    def drip() -> None:  # one header byte every 0.3 s, for ever
        request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000
        try:
            for byte in request:
                if stop.wait(0.3):
                    return
                slow.sendall(bytes([byte]))
        except OSError:
            pass
    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        for _ in range(5):
            assert_serves(srv)
        # the header timeout ends the slow-drip client (408 where the protocol can still say so)
        slow.settimeout(HEADER_TIMEOUT + 10)
        status, body = read_response(slow)
        if LEAN:
            assert (status, json.loads(body)) == (408, {"error": "timed out waiting for the request headers"})
        assert closed_by_server(slow, HEADER_TIMEOUT + 10)
        # and the idle timeouts every idle connection (gRPC: no preface within 10 s)
        assert all(closed_by_server(s, 20) for s in idle)
    finally:
        stop.set()
        dripper.join()
        slow.close()
        for s in idle:
            s.close()
    assert_serves(srv)


def test_idle_http_connection_after_a_request_is_closed(srv):
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200
        assert closed_by_server(sock, IDLE_TIMEOUT + 10)


def test_idle_grpc_connection_gets_goaway(srv):
    """A connection that had a call and then none for --grpc-max-connection-idle: GOAWAY, closed."""
    conn = h2.connection.H2Connection()
    with socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=30) as sock:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", f"{SERVICE}/ServerLive"),
                                (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        conn.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)
        sock.sendall(conn.data_to_send())
        events: list = []
        sock.settimeout(IDLE_TIMEOUT + 10)
        while not any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
            data = sock.recv(65536)
            assert data, f"closed without GOAWAY after {events}"
            events += conn.receive_data(data)
            sock.sendall(conn.data_to_send())
        assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in events)
        goaway = next(e for e in events if isinstance(e, h2.events.ConnectionTerminated))
        if srv.transport == "native":
            assert (goaway.error_code, goaway.additional_data) == (0, None)
        else:  # what grpc core sends for its max_connection_idle
            assert (goaway.error_code, goaway.additional_data) == (2, b"connection idle")
        assert closed_by_server(sock, 10)
    assert_serves(srv)


# =========================================================================== model names and files

BAD_NAMES = ["..", "../x", "a/b", "a\x00b", "a\\b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_model_names(srv, name):
    quoted = "".join(c if c.isalnum() else f"%{ord(c):02X}" for c in name)
    loading = f"invalid model name '{name}', model name must not contain path traversal characters"
    status, body = post(srv, f"/v2/repository/models/{quoted}/load", b"{}")
    assert (status, body) == (400, {"error": loading})
    status, body = post(srv, f"/v2/models/{quoted}/infer", json.dumps(infer_body()))
    assert (status, body) == (400, {"error": f"invalid model name '{name}'"})
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            g.load_model(name)
        assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", loading)
    finally:
        g.close()
    assert_serves(srv)


CONFIG_JSON = json.dumps({"backend": "python", "max_batch_size": 0,
                          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})


def temp_dirs() -> set[str]:
    return set(glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"), "triton_shm_model_*")))


def load_over(proto: str, srv: ServerProcess, name: str, files: dict[str, bytes]) -> tuple[str, str]:
    """(status, message) of a load with a config and file overrides."""
    if proto == "http":
        params = {"config": CONFIG_JSON, **{k: base64.b64encode(v).decode() for k, v in files.items()}}
        status, body = post(srv, f"/v2/repository/models/{name}/load", json.dumps({"parameters": params}))
        return str(status), body.get("error", "")
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        g.load_model(name, config=CONFIG_JSON, files=files)
        return "OK", ""
    except InferenceServerException as e:
        return e.status(), e.message()
    finally:
        g.close()


BAD_STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def logged_poll_failure(srv: ServerProcess, name: str, detail: str) -> bool:
    return f"Poll failed for model directory '{name}': {detail}" in (srv.repo.parent / "server.log").read_text()


# File overrides that can not be laid out are the client's error: 400 with why (Triton 2.51
# answers 500 "failed to poll", its poll wrapping the layout's INVALID_ARG); the log keeps
# Triton's "Poll failed" line.
@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("order", ["file_first", "folder_first"])
def test_conflicting_file_overrides(srv, proto, order):
    files = {"file:1": b"x", "file:1/model.py": b"x"}
    if order == "folder_first":
        files = dict(reversed(files.items()))
    before = temp_dirs()
    why = "Invalid file parameter 'file:1/model.py', directory has been created as a file ('file:1')"
    assert load_over(proto, srv, f"conflict_{proto}", files) == (BAD_STATUS[proto],
                                                                   f"failed to load 'conflict_{proto}': {why}")
    assert logged_poll_failure(srv, f"conflict_{proto}", why)
    assert temp_dirs() == before
    assert_serves(srv)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_long_model_name_with_file_override(srv, proto):
    name = "n" * 7168
    before = temp_dirs()
    status, message = load_over(proto, srv, name, {"file:1/model.py": b"x"})
    assert (status, message) == (BAD_STATUS[proto], f"model name '{'n' * 32}...' is longer than 255 bytes")
    assert temp_dirs() == before, "a refused load left a temporary model directory"
    assert_serves(srv)


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("path", ["../escape.py", "1/../../escape.py", "1/" + "p" * 300])
def test_file_override_paths_escaping_or_too_long(srv, proto, path):
    before = temp_dirs()
    status, message = load_over(proto, srv, f"escape_{proto}", {f"file:{path}": b"x", "file:1/model.py": b"x"})
    why = (f"file override path '{path[:64]}...' is too long" if len(path) > 255
           else f"Invalid file parameter 'file:{path}' must stay within model directory")
    assert (status, message) == (BAD_STATUS[proto], f"failed to load 'escape_{proto}': {why}")
    assert logged_poll_failure(srv, f"escape_{proto}", why)
    assert temp_dirs() == before
    assert not Path("/tmp/escape.py").exists()


def linked_model(srv: ServerProcess, tmp_path: Path, name: str, what: str) -> None:
    """A model in the repository with one part a symbolic link to a file outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.py").write_text((srv.repo / MODEL / "1" / "model.py").read_text())
    (outside / "secret.txt").write_text("hunter2 is the password\n")
    model_dir = srv.repo / name
    (model_dir / "1").mkdir(parents=True)
    config = (srv.repo / MODEL / "config.pbtxt").read_text().replace(MODEL, name)
    if what == "model.py":
        (model_dir / "config.pbtxt").write_text(config)
        (model_dir / "1" / "model.py").symlink_to(outside / "model.py")
    elif what == "config.pbtxt":
        (model_dir / "config.pbtxt").symlink_to(outside / "secret.txt")
        (model_dir / "1" / "model.py").symlink_to(srv.repo / MODEL / "1" / "model.py")  # inside: fine
    else:  # the version folder
        (model_dir / "config.pbtxt").write_text(config)
        (model_dir / "1").rmdir()
        (model_dir / "1").symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("what", ["model.py", "config.pbtxt", "version folder"])
def test_symlink_leaving_the_repository_is_refused(srv, tmp_path, what):
    name = f"linked_{what.replace('.', '_').replace(' ', '_')}"
    linked_model(srv, tmp_path, name, what)
    status, body = post(srv, f"/v2/repository/models/{name}/load", b"{}")
    rel = {"model.py": "1/model.py", "config.pbtxt": "config.pbtxt", "version folder": "1"}[what]
    assert (status, body) == (400, {"error": (
        f"'{rel}' in model '{name}' is a symbolic link that leads outside the model repository "
        "(--allow-external-model-links=true allows it)")})
    assert "hunter2" not in (srv.repo.parent / "server.log").read_text()
    assert_serves(srv)


def test_config_parse_error_names_no_file_content(srv):
    name = "secret_config"
    write_model(srv.repo, name, config="hunter2 is the password\n", model_py="")
    status, body = post(srv, f"/v2/repository/models/{name}/load", b"{}")
    assert (status, body) == (500, {"error": f"failed to load '{name}', failed to poll from model repository"})
    assert logged_poll_failure(srv, name, f"failed to parse config.pbtxt of model '{name}': "
                                          "unknown field at line 1, column 1")
    assert "hunter2" not in (srv.repo.parent / "server.log").read_text()


# =========================================================================== shared memory

@pytest.fixture
def shm_key(srv):
    key = f"/hostile_{os.getpid()}_{srv.grpc_port}"
    handles = []
    yield key, handles
    client = httpclient.InferenceServerClient(srv.http_url)
    client.unregister_system_shared_memory()
    client.close()
    for h in handles:
        shm.destroy_shared_memory_region(h)


RESERVED = "uses a prefix reserved for the server"
NO_SLASH = "a POSIX shared memory name has no '/' after its leading slash"


@pytest.mark.parametrize("key, reason", [
    ("/triton_shm_internal_x", RESERVED), ("triton_shm_internal_x", RESERVED), ("/../../etc/passwd", NO_SLASH),
    ("/a/b", NO_SLASH), ("..", NO_SLASH), ("/dev/shm/x", NO_SLASH), ("/", "")])
def test_shm_keys_reserved_or_path_tricks(srv, key, reason):
    if reason == RESERVED:
        expected = f"shared memory key '{key}' {reason}"
    else:
        expected = f"invalid shared memory key '{key}'" + (f": {reason}" if reason else "")
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("trick", key, 64)
        assert (info.value.status(), info.value.message()) == ("400", expected)
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()
    assert_serves(srv)


def test_shm_region_truncated_before_first_use(srv, shm_key):
    """400 while it is short; once the client restores the size, the next request works."""
    key, handles = shm_key
    handle = shm.create_shared_memory_region("early", key, 128)
    handles.append(handle)
    x = np.arange(32, dtype=np.float32)
    shm.set_shared_memory_region(handle, [x])
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        client.register_system_shared_memory("early", key, 128)
        os.truncate(f"/dev/shm{key}", 16)
        inp = httpclient.InferInput("INPUT0", [32], "FP32")
        inp.set_shared_memory("early", 128)
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, [inp])
        assert (info.value.status(), info.value.message()) == (
            "400", "the client's shared-memory region has shrunk since it was registered")
        os.truncate(f"/dev/shm{key}", 128)
        shm.set_shared_memory_region(handle, [x])
        np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("OUTPUT0"), x)
    finally:
        client.close()


def test_output_requests_that_would_allocate_unbounded_memory(srv, shm_key):
    key, handles = shm_key
    handles.append(shm.create_shared_memory_region("small", key, 64))
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        client.register_system_shared_memory("small", key, 64)
    finally:
        client.close()
    cases = [  # (body, message)
        (infer_body(outputs=[{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": "small", "shared_memory_byte_size": 2**62}}]),
         "Invalid offset + byte size for shared memory region: 'small'"),
        (infer_body(outputs=[{"name": "OUTPUT0"}] * 30_000),
         "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"),
        ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2**31, 2**31], "data": [1.0]}]},
         "input 'INPUT0': 'data' has 1 elements but shape [2147483648, 2147483648] needs 4611686018427387904"),
    ]
    for body, message in cases:
        status, answer = post(srv, INFER_PATHS["lean"], json.dumps(body))
        assert (status, answer) == (400, {"error": message})
    # the binary extension: the declared shape is checked against the bytes sent, not allocated
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2**62],
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    status, answer = post(srv, INFER_PATHS["lean"], header + b"\x00" * 4,
                          {"Inference-Header-Content-Length": str(len(header))})
    assert (status, answer) == (400, {"error": "[request id: <id_unknown>] input byte size mismatch for input "
                                               "'INPUT0' for model 'identity_fp32'. Expected more than "
                                               f"{1 << 40}, got 4"})
    assert_serves(srv)


# Shapes whose element count or byte size overflows int64 (and wraps to 0 in 64-bit
# arithmetic: 2**32 * 2**32, 2**62 * 4 bytes) with no data: refused, never taken as empty.
WRAPPING_SHAPES = [[2**32, 2**32], [2**62], [2**31, 2**31, 4], [2**63 - 1, 2]]


@pytest.mark.parametrize("shape", WRAPPING_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes_that_overflow_int64_are_refused(srv, shape):
    for model, datatype in ((MODEL, "FP32"), ("identity_bytes", "BYTES")):
        header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                                         "parameters": {"binary_data_size": 0}}]}).encode()
        status, answer = post(srv, f"/v2/models/{model}/infer", header,
                              {"Inference-Header-Content-Length": str(len(header))})
        assert status == 400 and "INPUT0" in answer["error"], (model, answer)
        body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": []}]}
        status, answer = post(srv, f"/v2/models/{model}/infer", json.dumps(body))
        assert status == 400 and "INPUT0" in answer["error"], (model, answer)
        req = service_pb2.ModelInferRequest(model_name=model)
        req.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
        req.raw_input_contents.append(b"")
        err = raw_unary(srv, "ModelInfer", req.SerializeToString())
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "INPUT0" in err.details(), (model, err.details())
    assert_serves(srv)


def test_repository_bodies_nested_deep(srv):
    """Triton's check (a 250000-deep 'ready'): 400, never a crash or a recursion error; a
    'ready' that is not a boolean in Triton's words."""
    nested = "[" * 250_000 + "true" + "]" * 250_000
    for path, body in (("/v2/repository/index", '{"ready":%s}' % nested),
                       ("/v2/repository/index", '{"ready":%s}' % ("[" * 500 + "true" + "]" * 500)),
                       (f"/v2/repository/models/{MODEL}/load", '{"parameters":%s}' % nested),
                       (f"/v2/repository/models/{MODEL}/load", '{"parameters":{"config":%s}}' % nested),
                       (f"/v2/repository/models/{MODEL}/unload", '{"parameters":%s}' % nested)):
        status, answer = post(srv, path, body)
        assert status == 400 and answer["error"], (path, answer)
    assert post(srv, "/v2/repository/index", '{"ready":"yes"}') == (
        400, {"error": "Invalid value for 'ready': expected a boolean"})
    assert_serves(srv)


# =========================================================================== gRPC messages

@pytest.mark.parametrize("payload", [GARBAGE, b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05ab"],
                         ids=["garbage", "huge_length", "truncated"])
def test_malformed_unary_infer(srv, payload):
    log_before = srv.log().count("\n")
    err = raw_unary(srv, "ModelInfer", payload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("failed to parse the request message"), err.details()
    new_lines = srv.log().splitlines()[log_before:]
    assert len([line for line in new_lines if "unparseable request message" in line]) == 1, new_lines
    assert not any("Traceback" in line for line in new_lines), new_lines
    assert_serves(srv)


@pytest.mark.parametrize("method", ["RepositoryModelLoad", "ModelMetadata", "SystemSharedMemoryRegister"])
def test_malformed_control_messages(srv, method):
    log_before = len(srv.log())
    err = raw_unary(srv, method, GARBAGE)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("failed to parse the request message"), err.details()
    assert "Traceback" not in srv.log()[log_before:]
    assert_serves(srv)


def test_garbage_inside_model_stream_infer_keeps_the_stream(srv):
    log_before = len(srv.log())
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stream = channel.stream_stream(f"{SERVICE}/ModelStreamInfer", request_serializer=lambda b: b,
                                       response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        replies: list = []
        sent = threading.Event()

        def requests():
            yield GARBAGE
            yield good_grpc_request()
            sent.wait(30)  # keep the stream open until both answers are in

        call = stream(requests(), timeout=60)
        for reply in call:
            replies.append(reply)
            if len(replies) == 2:
                sent.set()
        assert call.code() == grpc.StatusCode.OK
    errors = [r.error_message for r in replies if r.error_message]
    answers = [r.infer_response for r in replies if not r.error_message]
    assert len(errors) == 1 and errors[0].startswith("failed to parse the request message"), errors
    assert len(answers) == 1 and answers[0].id == "good"
    assert np.frombuffer(answers[0].raw_output_contents[0], np.float32).tolist() == [5.0, 6.0]
    assert "Traceback" not in srv.log()[log_before:]


@pytest.mark.parametrize("allow", [False, True])
def test_external_links_flag_at_start(tmp_path, allow):
    """Off (the default): the linked model fails to load at start and says why; on: it serves."""
    repo = tmp_path / "models"
    python_identity(repo, MODEL, "FP32")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.py").write_text((repo / MODEL / "1" / "model.py").read_text())
    (repo / "linked" / "1").mkdir(parents=True)
    (repo / "linked" / "config.pbtxt").write_text((repo / MODEL / "config.pbtxt").read_text().replace(MODEL, "linked"))
    (repo / "linked" / "1" / "model.py").symlink_to(outside / "model.py")
    server = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--exit-on-error=false", "--strict-readiness=false",
        f"--allow-external-model-links={str(allow).lower()}"]).start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            index = {m["name"]: m for m in client.get_model_repository_index()}
            if allow:
                assert index["linked"]["state"] == "READY"
                inp = httpclient.InferInput("INPUT0", [2], "FP32")
                inp.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
                assert client.infer("linked", [inp]).as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
            else:
                assert (index["linked"]["state"], index["linked"]["reason"]) == ("UNAVAILABLE", (
                    "'1/model.py' in model 'linked' is a symbolic link that leads outside the model repository "
                    "(--allow-external-model-links=true allows it)"))
                assert index[MODEL]["state"] == "READY"
        finally:
            client.close()
    finally:
        server.stop_cleanly()
