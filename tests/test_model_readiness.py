"""A Python model's own readiness (``is_ready()``), against a real server with the real
tritonclient, as Triton's python backend (PR 8661, qa/L0_backend_python/model_readiness)
defines it: False, an exception or a non-boolean is not ready; a check slower than 5 s is
not ready for the caller that waited, and the next caller gets that check's answer; an
``async def`` works; inference is unaffected; every instance must be ready; and with strict
readiness the server is ready only while every such model is."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .harness import ServerProcess
from .models import write_model

pytestmark = pytest.mark.timeout(180)

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters: {{ key: "ANSWER" value: {{ string_value: "{answer}" }} }}
{extra}
"""
# ANSWER: what is_ready() does. "flag:<path>": ready while the file exists; "instance1:false":
# the instance named *_1 says False, the others True.
MODEL_PY = """
import asyncio, json, os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.answer = json.loads(args["model_config"])["parameters"]["ANSWER"]["string_value"]
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]

    def is_ready(self):
        a = self.answer
        if a.startswith("wait:"):  # counts its calls, then holds until the flag file is there
            flag, calls = a[5:].split("|")
            with open(calls, "a") as f:
                f.write("call ")
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            return True
        if a == "exception":
            raise RuntimeError("Internal check failed - model is not ready")
        if a == "non_boolean":
            return "ready"
        if a.startswith("flag:"):
            return os.path.exists(a[5:])
        if a == "instance1:false":
            return not self.instance.endswith("_1")
        return a == "true"
"""
ASYNC_PY = MODEL_PY.replace("    def is_ready(self):", (
    "    async def is_ready(self):\n        await asyncio.sleep(0.05)\n        return True\n\n    def _unused(self):"))
PLAIN_PY = MODEL_PY.split("    def is_ready(self):")[0]
DECOUPLED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            sender = r.get_response_sender()
            for _ in range(4):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_ready(self):
        return True
"""


def _model(repo: Path, name: str, answer: str, py: str = MODEL_PY, count: int = 1, extra: str = "") -> None:
    mbs = 4 if "dynamic_batching" in extra else 0
    write_model(repo, name, config=CONFIG.format(name=name, count=count, answer=answer, extra=extra, mbs=mbs),
                model_py=py)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("readiness_models")
    for answer in ("true", "false", "exception", "non_boolean"):
        _model(repo, f"is_ready_{answer}", answer)
    _model(repo, "is_ready_slow", f"wait:{repo / 'slow_flag'}|{repo / 'slow_calls'}")
    _model(repo, "is_ready_async", "true", ASYNC_PY)
    _model(repo, "no_is_ready", "true", PLAIN_PY)
    _model(repo, "two_instances", "instance1:false", count=2)
    _model(repo, "two_instances_ready", "true", count=2)
    _model(repo, "decoupled", "true", DECOUPLED_PY, extra="model_transaction_policy { decoupled: true }")
    srv = ServerProcess(repo, tmp_path_factory.mktemp("readiness") / "server.log",
                        extra_args=["--strict-readiness", "false"]).start()
    yield srv
    srv.stop_cleanly()


def _infer(client, model: str) -> None:
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    x = mod.InferInput("INPUT0", [4], "FP32")
    data = np.arange(4, dtype=np.float32)
    x.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, [x]).as_numpy("OUTPUT0"), data)


@pytest.fixture()
def clients(server):
    h, g = httpclient.InferenceServerClient(server.http_url), grpcclient.InferenceServerClient(server.grpc_url)
    yield h, g
    h.close()
    g.close()


@pytest.mark.parametrize("model, ready", [
    ("is_ready_true", True), ("is_ready_false", False), ("is_ready_exception", False),
    ("is_ready_non_boolean", False), ("is_ready_async", True), ("no_is_ready", True),
    ("two_instances", False), ("two_instances_ready", True)])
def test_the_model_says_whether_it_is_ready(clients, model, ready):
    h, g = clients
    for _ in range(3):
        assert h.is_model_ready(model) is ready
        assert g.is_model_ready(model) is ready
        _infer(h, model)  # inference is unaffected either way
        _infer(g, model)
    assert h.is_model_ready(model, "1") is ready


def test_a_slow_check_is_not_ready_and_is_not_asked_again_while_it_runs(server, clients):
    """Triton's test_is_ready_takes_long_time: a caller gives up after 5 s (not ready); the
    next, while the check still runs, waits for that one instead of calling is_ready() again;
    once it has answered, its True is the answer. Neither the server nor the model waits
    meanwhile."""
    h, g = clients
    repo = server.repositories[0]
    assert h.is_model_ready("is_ready_slow") is False
    _infer(h, "is_ready_slow")
    assert h.is_model_ready("is_ready_true") is True
    assert g.is_model_ready("is_ready_slow") is False  # the same check, still held
    assert (repo / "slow_calls").read_text().count("call") == 1
    (repo / "slow_flag").touch()
    assert g.is_model_ready("is_ready_slow") is True and h.is_model_ready("is_ready_slow") is True


def test_checks_and_decoupled_inference_together(server):
    """Triton's test_multiple_concurrent_ready_and_infer_requests_decoupled, smaller."""
    errors: list[str] = []

    def ready() -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            if not c.is_model_ready("decoupled"):
                errors.append("not ready")

    def stream() -> None:
        got: list = []
        done = threading.Event()

        def callback(result, error):
            got.append(error or result)
            if len(got) == 4 or error:
                done.set()
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            x = grpcclient.InferInput("INPUT0", [4], "FP32")
            x.set_data_from_numpy(np.ones(4, dtype=np.float32))
            c.start_stream(callback)
            c.async_stream_infer("decoupled", [x])
            if not done.wait(30) or not all(isinstance(r, grpcclient.InferResult) for r in got):
                errors.append(f"stream: {got}")
            c.stop_stream()

    threads = [threading.Thread(target=f) for _ in range(6) for f in (ready, stream)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


def test_strict_server_readiness_asks_the_models(tmp_path):
    """With strict readiness (the default) the server is ready only while every model that
    defines is_ready() says it is, as in Triton's current core."""
    repo = tmp_path / "models"
    flag = tmp_path / "flag"
    flag.touch()
    _model(repo, "flagged", f"flag:{flag}")
    _model(repo, "plain", "true", PLAIN_PY)
    srv = ServerProcess(repo, tmp_path / "server.log").start()
    try:
        h = httpclient.InferenceServerClient(srv.http_url)
        g = grpcclient.InferenceServerClient(srv.grpc_url)
        assert h.is_server_ready() and g.is_server_ready()
        flag.unlink()
        assert not h.is_server_ready() and not g.is_server_ready()
        assert not h.is_model_ready("flagged") and h.is_model_ready("plain")
        _infer(h, "flagged")
        flag.touch()
        assert h.is_server_ready() and g.is_server_ready() and g.is_model_ready("flagged")
        h.close()
        g.close()
    finally:
        srv.stop_cleanly()


def test_several_frontend_processes_ask_where_the_instances_are(tmp_path):
    """``--frontend-processes 2``: an owned model (dynamic batching: one process runs it) is
    asked in its owner; a partitioned one (two instances: one per process) in both; every
    connection, whichever process it reaches, gets the same answer."""
    repo = tmp_path / "models"
    flag = tmp_path / "flag"
    _model(repo, "owned", f"flag:{flag}", extra="dynamic_batching { }")
    _model(repo, "partitioned", f"flag:{flag}", count=2)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--frontend-processes", "2", "--strict-readiness", "false"]).start()
    try:
        def answers() -> set[bool]:
            seen = set()
            for _ in range(6):  # new connections: the kernel spreads them over both processes
                with httpclient.InferenceServerClient(srv.http_url) as h, \
                        grpcclient.InferenceServerClient(srv.grpc_url) as g:
                    for model in ("owned", "partitioned"):
                        seen |= {h.is_model_ready(model), g.is_model_ready(model)}
            return seen
        assert answers() == {False}
        flag.touch()
        assert answers() == {True}
    finally:
        srv.stop_cleanly()
