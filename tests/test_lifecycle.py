"""Process lifecycle: the command line, start-up output, worker crashes and restarts,
graceful SIGTERM, and model names that try to leave the repository.

The crash tests here kill the shared CPU worker, where ONNX Runtime instances run and
Python models that opt out of a process per instance: the models they use do so
(``in_shared_worker``). A dead instance process is test_instance_processes.py's."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess, children, free_port
from .models import in_shared_worker, python_identity, write_model

SLOW_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            secs = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy().reshape(-1)[0])
            print(f"SLOW-START pid={os.getpid()} id={request.request_id()}", flush=True)
            time.sleep(secs)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([secs], dtype=np.float32))]))
        return responses
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def build_repo(repo: Path) -> Path:
    in_shared_worker(write_model(repo, "slow", config=SLOW_CONFIG, model_py=SLOW_PY))
    python_identity(repo, "identity_fp32", "FP32")
    in_shared_worker(repo / "identity_fp32")
    return repo


# --------------------------------------------------------------------------- helpers

def process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def port_refuses(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def slow_http(srv: ServerProcess, seconds: float, request_id: str):
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120, connection_timeout=120)
    try:
        inp = httpclient.InferInput("SECONDS", [1], "FP32")
        inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
        return client.infer("slow", [inp], request_id=request_id)
    finally:
        client.close()


def slow_grpc(srv: ServerProcess, seconds: float, request_id: str):
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        inp = grpcclient.InferInput("SECONDS", [1], "FP32")
        inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
        return client.infer("slow", [inp], request_id=request_id, client_timeout=120)


class Background:
    """Run ``fn`` on a thread; ``result()`` returns its value or re-raises its error."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._thread.start()

    def _run(self, fn, *args):
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: BLE001
            self._error = e

    def result(self, timeout: float = 60.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background request did not finish"
        if self._error is not None:
            raise self._error
        return self._value


def marker_pid(srv: ServerProcess, request_id: str) -> int:
    m = re.search(rf"SLOW-START pid=(\d+) id={re.escape(request_id)}\b", srv.log())
    return int(m.group(1)) if m else 0


def identity_ok(srv: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        data = np.array([1.0, 2.5], dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


@pytest.fixture
def own_server(tmp_path):
    """A fresh server per test (the tests here kill its workers or stop it)."""
    srv = ServerProcess(build_repo(tmp_path / "models"), tmp_path / "server.log")
    yield srv
    if srv.proc is not None and srv.proc.poll() is None:
        srv.stop()


@pytest.fixture(scope="module")
def lifecycle_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle")
    srv = ServerProcess(build_repo(root / "models"), root / "server.log").start()
    yield srv
    srv.stop_cleanly()


# --------------------------------------------------------------------------- command line

def test_help_lists_tritonserver_flags():
    out = subprocess.run([sys.executable, "-m", "triton_shm", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port", "--http-address",
                 "--grpc-address", "--allow-http", "--allow-grpc", "--allow-metrics", "--log-verbose",
                 "--exit-timeout-secs", "--gpus"):
        assert flag in out.stdout, flag


@pytest.mark.parametrize("args,needle", [
    (["--allow-grpc=maybe"], "expected true or false"),
    (["--http-port=notanumber"], "--http-port"),
    ([], "--model-repository"),
])
def test_bad_command_lines_are_rejected(tmp_path, args, needle):
    repo_args = [] if not args else ["--model-repository", str(tmp_path)]
    out = subprocess.run([sys.executable, "-m", "triton_shm", *repo_args, *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert needle in out.stderr


def test_missing_repository_fails_cleanly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "triton_shm", "--model-repository", str(tmp_path / "nope"),
                          "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                          "--allow-metrics=false"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "nope" in out.stderr and "Traceback" not in out.stderr


def test_equals_form_and_allow_grpc_false(tmp_path):
    srv = ServerProcess(build_repo(tmp_path / "models"), tmp_path / "server.log",
                        extra_args=["--allow-grpc=false", "--log-verbose=1", "--exit-timeout-secs=5",
                                    "--http-address=127.0.0.1", "--gpus=none", "--allow-metrics=False"])
    srv.start()
    try:
        identity_ok(srv)
        assert port_refuses(srv.grpc_port)
        assert "GRPCInferenceService" not in srv.log()
    finally:
        assert srv.stop() == 0


def test_allow_http_false_serves_grpc_only(tmp_path):
    http_port, grpc_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "triton_shm", f"--model-repository={build_repo(tmp_path / 'models')}",
             "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", f"--http-port={http_port}",
             f"--grpc-port={grpc_port}", "--allow-http=false", "--allow-metrics=false"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        def grpc_live():
            assert proc.poll() is None, log_path.read_text()
            try:
                with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as c:
                    return c.is_server_live()
            except InferenceServerException:
                return False
        wait_for(grpc_live, 60, "gRPC to answer")
        assert port_refuses(http_port)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_start_prints_model_status_table(lifecycle_server):
    log = lifecycle_server.log()
    assert re.search(r"^\|\s*Model\s*\|\s*Version\s*\|\s*Status\s*\|$", log, re.M), log
    assert re.search(r"^\|\s*identity_fp32\s*\|\s*1\s*\|\s*READY\s*\|$", log, re.M), log
    assert re.search(r"^\|\s*slow\s*\|\s*1\s*\|\s*READY\s*\|$", log, re.M), log
    assert re.search(r"^\+-+\+-+\+-+\+$", log, re.M), log


# --------------------------------------------------------------------------- model names

TRAVERSALS = [
    "..%2F..%2Fetc", "..%2F..%2F..%2F..%2Fetc%2Fpasswd", "%2E%2E", "%2e%2e%2f%2e%2e%2fetc",
    "..", "...", "identity_fp32%2F..%2F..%2Fslow", "..%5C..%5Cetc", "foo%00bar", "%2Fetc%2Fpasswd",
]


@pytest.mark.parametrize("name", TRAVERSALS)
@pytest.mark.parametrize("tail", ["config", "", "ready", "versions/1/config"])
def test_model_names_cannot_escape_repository(lifecycle_server, name, tail):
    path = f"/v2/models/{name}" + (f"/{tail}" if tail else "")
    conn = http.client.HTTPConnection(lifecycle_server.http_url, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    # Triton 2.51's answers (the name in the message percent-decoded)
    if tail == "ready":
        assert (resp.status, json.loads(body)) == (400, {"error": "Model version not ready"}), path
    else:
        expected = {"error": f"Request for unknown model: '{urllib.parse.unquote(name)}' is not found"}
        assert (resp.status, json.loads(body)) == (404, expected), path


@pytest.mark.parametrize("name", ["..%2F..%2Fetc", "..", "%2Fetc%2Fpasswd"])
def test_infer_on_traversal_name_is_4xx(lifecycle_server, name):
    conn = http.client.HTTPConnection(lifecycle_server.http_url, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
        conn.request("POST", f"/v2/models/{name}/infer", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    # refused before any lookup (Triton 2.51: 404, unknown model)
    assert (resp.status, json.loads(body)) == (400, {"error": f"invalid model name '{urllib.parse.unquote(name)}'"})


@pytest.mark.parametrize("name", ["../../etc", "..", "/etc/passwd", "a/../identity_fp32"])
def test_grpc_traversal_names(lifecycle_server, name):
    with grpcclient.InferenceServerClient(lifecycle_server.grpc_url) as client:
        for call in (client.get_model_config, client.get_model_metadata):
            with pytest.raises(InferenceServerException) as e:
                call(name)
            assert e.value.status() == "StatusCode.NOT_FOUND", e.value  # as Triton 2.51 answers
            assert e.value.message() == f"Request for unknown model: '{name}' is not found"
        assert not client.is_model_ready(name)


# --------------------------------------------------------------------------- worker crash

def test_worker_crash_fails_in_flight_and_recovers(own_server):
    srv = own_server.start()
    server_pid = srv.proc.pid
    workers = children(server_pid)
    assert len(workers) == 1, workers  # one CPU worker (no GPU here; --gpus default)

    http_req = Background(slow_http, srv, 30.0, "crash-http")
    worker_pid = wait_for(lambda: marker_pid(srv, "crash-http"), 20, "the slow request to reach the model")
    assert worker_pid in children(server_pid), (worker_pid, children(server_pid))
    grpc_req = Background(slow_grpc, srv, 30.0, "crash-grpc")  # queued behind the first
    time.sleep(0.3)

    t0 = time.monotonic()
    os.kill(worker_pid, signal.SIGKILL)
    with pytest.raises(InferenceServerException) as e:
        http_req.result(timeout=15)
    assert time.monotonic() - t0 < 10, "the in-flight request was not failed promptly"
    assert e.value.status() == "503", (e.value.status(), e.value.message())
    assert "worker" in e.value.message() and "signal 9" in e.value.message(), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_req.result(timeout=15)
    assert e.value.status() == "StatusCode.UNAVAILABLE", e.value
    assert "worker" in e.value.message()

    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert client.is_server_live()
        wait_for(lambda: client.is_model_ready("slow") and client.is_model_ready("identity_fp32"), 20,
                 "the models to be ready again")
        wait_for(lambda: client.is_server_ready(), 20, "the server to be ready again")
    finally:
        client.close()
    new_workers = children(server_pid)
    assert len(new_workers) == 1 and new_workers[0] != worker_pid, (worker_pid, new_workers)
    assert process_gone(worker_pid)
    result = slow_http(srv, 0.0, "after-crash")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [0.0])
    assert marker_pid(srv, "after-crash") == new_workers[0]
    identity_ok(srv)
    assert srv.stop() == 0, srv.log()[-3000:]


SLOW_INIT_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(2.0)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([7], dtype=np.int32))])
                for _ in requests]
"""


@pytest.fixture
def slow_init_server(tmp_path):
    """A server with a model that takes 2 s to initialize, so a reload is observable."""
    repo = build_repo(tmp_path / "models")
    in_shared_worker(write_model(repo, "slow_init", model_py=SLOW_INIT_PY, config="""
        name: "slow_init"
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """))
    srv = ServerProcess(repo, tmp_path / "server.log").start()
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def _kill_worker_and_wait_for_new_one(srv) -> tuple[int, int]:
    (worker,) = children(srv.proc.pid)
    os.kill(worker, signal.SIGKILL)
    new = wait_for(lambda: [p for p in children(srv.proc.pid) if p != worker], 20, "a new worker")
    return worker, new[0]


def test_worker_crash_when_idle_recovers(slow_init_server):
    srv = slow_init_server
    old, new = _kill_worker_and_wait_for_new_one(srv)
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert client.is_server_live()
        wait_for(lambda: all(client.is_model_ready(m) for m in ("slow_init", "identity_fp32", "slow")), 30,
                 "the models to be reloaded")
        wait_for(lambda: client.is_server_ready(), 10, "the server to be ready again")
        inp = httpclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([0], dtype=np.int32))
        np.testing.assert_array_equal(client.infer("slow_init", [inp]).as_numpy("OUTPUT0"), [7])
    finally:
        client.close()
    identity_ok(srv)
    assert process_gone(old)
    assert "was killed by signal 9" in srv.log()
    assert srv.stop() == 0


def test_server_not_ready_while_models_reload_after_crash(slow_init_server):
    srv = slow_init_server
    _kill_worker_and_wait_for_new_one(srv)
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        # slow_init needs 2 s in initialize, so it is still reloading here.
        assert not client.is_model_ready("slow_init")
        assert not client.is_server_ready(), "server reports ready while a model is reloading"
    finally:
        client.close()


def test_requests_while_a_worker_restarts_are_unavailable(slow_init_server):
    """Retryable UNAVAILABLE, not NOT_FOUND, from the kill until its models are back."""
    srv = slow_init_server
    _kill_worker_and_wait_for_new_one(srv)  # slow_init needs 2 s to initialize again
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc_client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        hi = httpclient.InferInput("INPUT0", [1], "INT32")
        hi.set_data_from_numpy(np.array([0], dtype=np.int32))
        with pytest.raises(InferenceServerException) as e:
            http.infer("slow_init", [hi])
        assert (e.value.status(), e.value.message()) == (
            "503", "model 'slow_init' is not available: worker 'cpu' is restarting")
        gi = grpcclient.InferInput("INPUT0", [1], "INT32")
        gi.set_data_from_numpy(np.array([0], dtype=np.int32))
        with pytest.raises(InferenceServerException) as e:
            grpc_client.infer("slow_init", [gi], model_version="1")
        assert (e.value.status(), e.value.message()) == (
            "StatusCode.UNAVAILABLE", "model 'slow_init' version 1 is not available: worker 'cpu' is restarting")
        wait_for(lambda: http.is_model_ready("slow_init"), 30, "slow_init to be reloaded")
        np.testing.assert_array_equal(http.infer("slow_init", [hi]).as_numpy("OUTPUT0"), [7])
    finally:
        http.close()
        grpc_client.close()


def test_restart_backoff_starts_over_once_the_worker_is_back(slow_init_server):
    srv = slow_init_server
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        for _ in range(3):
            _kill_worker_and_wait_for_new_one(srv)
            wait_for(lambda: client.is_server_ready(), 30, "the server to be ready again")
    finally:
        client.close()
    restarts = re.findall(r"restarting worker 'cpu' in ([0-9.]+) s \(restart (\d+) in a row\)", srv.log())
    assert restarts == [("0.1", "1")] * 3, restarts


# --------------------------------------------------------------------------- graceful shutdown

def test_sigterm_lets_in_flight_request_finish(own_server):
    srv = own_server.start()
    workers = children(srv.proc.pid)
    assert workers
    req = Background(slow_http, srv, 2.0, "graceful")
    wait_for(lambda: marker_pid(srv, "graceful"), 20, "the slow request to reach the model")
    srv.proc.send_signal(signal.SIGTERM)
    result = req.result(timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2.0])
    assert srv.proc.wait(30) == 0, srv.log()[-3000:]
    wait_for(lambda: all(process_gone(p) for p in workers), 10, "the workers to exit")


def test_sigterm_grpc_in_flight_request_finishes(own_server):
    srv = own_server.start()
    req = Background(slow_grpc, srv, 2.0, "graceful-grpc")
    wait_for(lambda: marker_pid(srv, "graceful-grpc"), 20, "the slow request to reach the model")
    srv.proc.send_signal(signal.SIGTERM)
    result = req.result(timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2.0])
    assert srv.proc.wait(30) == 0, srv.log()[-3000:]


def test_sigterm_when_idle_exits_without_waiting_for_the_exit_timeout(tmp_path):
    srv = ServerProcess(build_repo(tmp_path / "models"), tmp_path / "server.log",
                        extra_args=["--exit-timeout-secs=600"]).start()
    workers = children(srv.proc.pid)
    srv.proc.send_signal(signal.SIGTERM)
    try:  # nothing in flight: it must not sit out the 600 s
        assert srv.proc.wait(120) == 0, srv.log()[-3000:]
    finally:
        srv.stop()
    wait_for(lambda: all(process_gone(p) for p in workers), 10, "the workers to exit")


def test_exit_timeout_bounds_shutdown(tmp_path):
    srv = ServerProcess(build_repo(tmp_path / "models"), tmp_path / "server.log",
                        extra_args=["--exit-timeout-secs=1"]).start()
    try:
        req = Background(slow_http, srv, 12.0, "too-slow")
        wait_for(lambda: marker_pid(srv, "too-slow"), 20, "the slow request to reach the model")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
        elapsed = time.monotonic() - t0
        with pytest.raises(Exception):  # noqa: B017 - cut off: an error answer or a closed connection
            req.result(timeout=30)
        # the request would have run 12 s: the server did not wait for it
        assert elapsed < 12, f"server took {elapsed:.1f}s to exit with --exit-timeout-secs=1"
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        srv.stop()
