"""Ensembles with a decoupled step, and their back-pressure (``ensemble_scheduling {
max_inflight_requests: N }``), as Triton 2.71 runs them: each response of a decoupled step
runs the steps after it once and makes one ensemble response, streamed, then the final
flag; at most N requests of each step are in flight (dispatched to its model, not yet
answered), a limit shared by all the ensemble's requests; 0 means none.

A decoupled producer sends its responses at once into a consumer whose first batch waits
until the test releases it, and which records the size of every batch it executes. While
the consumer is held, its first request executes, the next may be held by its instance
(``HELD_BATCHES``) and the rest wait in its queue (``nv_inference_pending_request_count``):
the test waits, once the producer is done, until the queue holds what the limit lets
through, never seeing more, then releases the consumer; no batch is ever above the limit (a
batch's requests are all in flight at once). Without a limit all of them wait there and the
next batch is the largest.
"""
from __future__ import annotations

import queue
import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_shm.core.scheduling.dynamic import HELD_BATCHES

from .harness import ServerProcess, free_port
from .helpers import expect_error
from .models import write_model

pytestmark = pytest.mark.timeout(180)

PRODUCER_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

DONE = {done!r}

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            for k in range(count):
                out = pb_utils.Tensor("VALUE", np.array([[k]], dtype=np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            open(DONE, "a").close()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Appends the size of each batch to BATCHES; the first waits (up to 60 s) until the file
# RELEASE exists. Answers 2 * x.
CONSUMER_PY = """
import os
import time
import triton_python_backend_utils as pb_utils

RELEASE, BATCHES = {release!r}, {batches!r}

class TritonPythonModel:
    def initialize(self, args):
        self.first = True

    def execute(self, requests):
        if self.first:
            self.first = False
            deadline = time.monotonic() + 60
            while not os.path.exists(RELEASE) and time.monotonic() < deadline:
                time.sleep(0.01)
        with open(BATCHES, "a") as f:
            f.write(f"{{len(requests)}}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "DOUBLED", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
"""


def _ensemble(name: str, limit: str) -> str:
    return f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        ensemble_scheduling {{
          {limit}
          step [
            {{ model_name: "producer" model_version: -1
               input_map {{ key: "COUNT" value: "N" }} output_map {{ key: "VALUE" value: "value" }} }},
            {{ model_name: "consumer" model_version: -1
               input_map {{ key: "X" value: "value" }} output_map {{ key: "DOUBLED" value: "OUT" }} }}
          ]
        }}
        """


def _models(repo: Path, state: Path) -> None:
    done, batches, release = str(state / "done"), str(state / "batches"), str(state / "release")
    write_model(repo, "producer", model_py=PRODUCER_PY.format(done=done), config="""
        name: "producer"
        backend: "python"
        max_batch_size: 8
        model_transaction_policy { decoupled: true }
        input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "VALUE" data_type: TYPE_FP32 dims: [ 1 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """)
    write_model(repo, "consumer", model_py=CONSUMER_PY.format(release=release, batches=batches), config="""
        name: "consumer"
        backend: "python"
        max_batch_size: 8
        dynamic_batching { }
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "DOUBLED" data_type: TYPE_FP32 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """)
    write_model(repo, "ens_limit_4", config=_ensemble("ens_limit_4", "max_inflight_requests: 4"))
    write_model(repo, "ens_limit_0", config=_ensemble("ens_limit_0", "max_inflight_requests: 0"))
    write_model(repo, "ens_unlimited", config=_ensemble("ens_unlimited", ""))


@pytest.fixture
def server(tmp_path):
    """A server of its own per test: the consumer's batches start from a clean slate."""
    repo, state = tmp_path / "models", tmp_path / "state"
    state.mkdir()
    _models(repo, state)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--allow-metrics", "true", "--metrics-port", str(free_port())]).start()
    srv.state = state
    yield srv
    (state / "release").touch()
    srv.stop()


def consumer_queued(srv: ServerProcess) -> int:
    port = srv.extra_args[srv.extra_args.index("--metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        text = r.read().decode()
    found = re.search(r'^nv_inference_pending_request_count\{model="consumer",version="1"\} (\d+)', text, re.M)
    assert found, text
    return int(found.group(1))


def held_at(srv: ServerProcess, in_flight: int, timeout: float = 60.0) -> None:
    """Once the producer is done, wait until ``in_flight`` consumer requests are in flight
    (one executing, up to HELD_BATCHES held by its instance, the rest queued), never seeing
    more; then release the consumer."""
    most, least = in_flight - 1, in_flight - 1 - HELD_BATCHES
    deadline = time.monotonic() + timeout
    while True:
        seen = consumer_queued(srv)
        assert seen <= most, f"{seen} consumer requests queued, expected at most {most}"
        if seen >= least and (srv.state / "done").exists():
            break
        assert time.monotonic() < deadline, f"{seen} consumer requests queued, waiting for {least}"
        time.sleep(0.01)
    (srv.state / "release").touch()


def stream(srv: ServerProcess, model: str, counts: list[int], in_flight: int | None = None) -> list[list[float]]:
    """Each request's OUT values (as sent), one stream per request, all at once; with
    ``in_flight``, the consumer is released at that many (``held_at``)."""
    results: list[list[float]] = [[] for _ in counts]
    clients = []
    done: queue.Queue = queue.Queue()
    for i, count in enumerate(counts):
        def callback(result, error, i=i):
            if error is not None:
                done.put(error)
            elif result.get_response().parameters["triton_final_response"].bool_param:
                done.put(i)
            else:
                results[i].append(float(result.as_numpy("OUT")[0][0]))
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        clients.append(client)
        client.start_stream(callback=callback)
        inp = grpcclient.InferInput("N", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[count]], dtype=np.int32))
        client.async_stream_infer(model, [inp], enable_empty_final_response=True)
    try:
        if in_flight is not None:
            held_at(srv, in_flight)
        for _ in counts:
            got = done.get(timeout=120)
            assert isinstance(got, int), got
    finally:
        for client in clients:
            client.stop_stream()
            client.close()
    return results


def batches(srv: ServerProcess) -> list[int]:
    return [int(line) for line in (srv.state / "batches").read_text().split()]


def test_limit_bounds_each_step_in_flight(server):
    counts = stream(server, "ens_limit_4", [24], in_flight=4)
    assert counts == [[2.0 * k for k in range(24)]]  # every response, in order, each through the consumer
    sizes = batches(server)
    assert sum(sizes) == 24
    assert max(sizes) <= 4, f"more consumer requests in flight than max_inflight_requests: {sizes}"
    assert "Ensemble model 'ens_limit_4' configured with max_inflight_requests: 4" in server.log()


def test_limit_is_shared_by_the_ensembles_requests(server):
    """Two requests at once, each streaming 12: still at most 4 of the consumer's requests in
    flight (a limit per request would let 8 through)."""
    results = stream(server, "ens_limit_4", [12, 12], in_flight=4)
    assert all(sorted(r) == [2.0 * k for k in range(12)] for r in results), results
    sizes = batches(server)
    assert sum(sizes) == 24 and max(sizes) <= 4, sizes


@pytest.mark.parametrize("model", ["ens_unlimited", "ens_limit_0"])
def test_without_limit_the_consumer_queue_fills(server, model):
    """0 (or no field) is no limit: every response of the producer is in flight at the
    consumer at once, so its batches are its largest once released."""
    assert stream(server, model, [24], in_flight=24) == [[2.0 * k for k in range(24)]]
    sizes = batches(server)
    assert sum(sizes) == 24
    assert max(sizes) == 8, sizes


def test_decoupled_ensemble_is_decoupled(server):
    """Its config says so (as Triton sets it); a plain infer is refused as for any decoupled
    model, over both protocols; a request that asks for nothing gets just the final flag."""
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        assert http.get_model_config("ens_limit_4")["model_transaction_policy"]["decoupled"] is True
        inp = httpclient.InferInput("N", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        expect_error("http", lambda: http.infer("ens_limit_4", [inp]), "UNIMPLEMENTED", "decoupled")
    finally:
        http.close()
    (server.state / "release").touch()
    assert stream(server, "ens_limit_4", [0]) == [[]]
    assert stream(server, "ens_limit_4", [3, 0, 5]) == [[0.0, 2.0, 4.0], [], [0.0, 2.0, 4.0, 6.0, 8.0]]


def test_cancelled_stream_under_back_pressure_frees_the_limit(server):
    """A client that goes away mid-stream: the ensemble stops, gives its slots back, and the
    next request streams through in full."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    inp = grpcclient.InferInput("N", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[64]], dtype=np.int32))
    client.async_stream_infer("ens_limit_4", [inp])
    (server.state / "release").touch()
    first = got.get(timeout=60)
    assert not isinstance(first, Exception), first
    client.stop_stream(cancel_requests=True)
    client.close()
    assert stream(server, "ens_limit_4", [6]) == [[2.0 * k for k in range(6)]]


@pytest.mark.parametrize("value", ["-5", "12345678901", '"invalid_value"'])
def test_invalid_limit_fails_the_load(tmp_path, value):
    """max_inflight_requests is a uint32: a negative, too large or non-integer value is a
    config that does not parse (Triton: the load fails with the parser's error)."""
    repo, state = tmp_path / "models", tmp_path / "state"
    state.mkdir()
    _models(repo, state)
    write_model(repo, "ens_bad", config=_ensemble("ens_bad", f"max_inflight_requests: {value}"))
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--model-control-mode", "explicit", "--load-model", "producer", "--load-model", "consumer"]).start()
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        err = expect_error("http", lambda: http.load_model("ens_bad"), "INTERNAL", "failed to poll")
        assert err is not None
        assert "failed to parse config.pbtxt of model 'ens_bad': invalid value at line 8" in srv.log()
        assert not http.is_model_ready("ens_bad")
        http.close()
    finally:
        srv.stop()
