"""A client that goes away while its request is in a batch a worker is executing, against a
real server process: as in Triton the request stays in execution, the Python model sees
``request.is_cancelled()`` and answers CANCELLED, the other request of the batch gets its
answer, the statistics count two successes (the model's CANCELLED answer is an answer, as
Triton 2.51 counts it: execution_count 1, inference_count 2, success 2, fail 0), and nothing
is left pending."""
from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .harness import ServerProcess, free_port
from .models import write_model

pytestmark = pytest.mark.timeout(120)

WAIT_S = 20.0  # how long the model waits for a cancellation before answering anyway

CONFIG = """
name: "cancellable"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CANCELLED" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000000 }
"""
# Holds a batch of inputs >= 0 until a request of it is cancelled (or WAIT_S pass), then
# answers the cancelled ones CANCELLED and the others their input, the batch's size and how
# many of it were cancelled.
MODEL_PY = f"""
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        hold = all(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0, 0] >= 0 for r in requests)
        deadline = time.monotonic() + ({WAIT_S} if hold else 0)
        while time.monotonic() < deadline and not any(r.is_cancelled() for r in requests):
            time.sleep(0.01)
        cancelled = sum(r.is_cancelled() for r in requests)
        responses = []
        for r in requests:
            if r.is_cancelled():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("the client has gone", pb_utils.TritonError.CANCELLED)))
                continue
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("CANCELLED", np.array([[cancelled]], dtype=np.int32))]))
        return responses
"""

# The same model under the sequence batcher: two slots, so a second sequence's request
# batches beside the held one or runs after it.
SEQUENCE_CONFIG = CONFIG.replace('name: "cancellable"', 'name: "seq_cancellable"').replace(
    "dynamic_batching { max_queue_delay_microseconds: 2000000 }",
    "sequence_batching { max_sequence_idle_microseconds: 60000000 }")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cancel_models")
    write_model(repo, "cancellable", config=CONFIG, model_py=MODEL_PY)
    write_model(repo, "seq_cancellable", config=SEQUENCE_CONFIG, model_py=MODEL_PY)
    metrics_port = free_port()
    srv = ServerProcess(repo, tmp_path_factory.mktemp("cancel") / "server.out",
                        extra_args=["--allow-metrics=true", "--metrics-port", str(metrics_port)]).start()
    srv.metrics_port = metrics_port
    yield srv
    srv.stop_cleanly()


def _inputs(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    return [x]


def _stats(srv: ServerProcess, model: str = "cancellable") -> dict:
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


def _pending(srv: ServerProcess) -> float:
    with urllib.request.urlopen(f"http://{srv.http_url.rsplit(':', 1)[0]}:{srv.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    line = next(x for x in text.splitlines()
                if x.startswith("nv_inference_pending_request_count") and 'model="cancellable"' in x)
    return float(line.rsplit(" ", 1)[1])


def _keep(results: dict, key: object):
    """A tritonclient callback that keeps the call's result (or error) under ``key``."""
    return lambda result, error: results.__setitem__(key, error or result)


def _wait(results: dict, key: object, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while key not in results and time.monotonic() < deadline:
        time.sleep(0.01)
    return results.get(key)


def _counts(srv: ServerProcess, model: str = "cancellable") -> tuple[int, int, int]:
    stats = _stats(srv, model)
    return (stats["execution_count"], stats["inference_stats"]["success"]["count"],
            stats["inference_stats"]["fail"]["count"], stats["inference_count"])


@pytest.mark.parametrize("how", ["call", "stream"])
def test_a_client_gone_mid_execute_is_seen_by_the_model_and_spares_the_batch(server, how):
    """``call``: a unary call cancelled (RST_STREAM); ``stream``: a ModelStreamInfer call
    stopped with its requests cancelled."""
    results: dict = {}
    before = _counts(server)
    c = grpcclient.InferenceServerClient(server.grpc_url)
    leaving = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        c.async_infer("cancellable", _inputs(1.0), _keep(results, "stay"))
        if how == "call":
            gone = leaving.async_infer("cancellable", _inputs(2.0), _keep(results, "gone"))
        else:
            leaving.start_stream(_keep(results, "gone"))
            leaving.async_stream_infer("cancellable", _inputs(2.0))
        time.sleep(1.0)  # both batched (max_batch_size 2) and executing: the model waits
        assert not results
        t0 = time.monotonic()
        if how == "call":
            gone.cancel()
        else:
            leaving.stop_stream(cancel_requests=True)
        result = _wait(results, "stay", WAIT_S / 2)
        assert isinstance(result, grpcclient.InferResult), result
        assert time.monotonic() - t0 < WAIT_S / 2  # the model saw the cancellation, not its own deadline
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 1.0, dtype=np.float32))
        assert result.as_numpy("BATCH")[0][0] == 2 and result.as_numpy("CANCELLED")[0][0] == 1
        assert not isinstance(results.get("gone"), grpcclient.InferResult)  # never an answer
        # one execution; the one answered and the model's CANCELLED both count successes (Triton 2.51)
        assert _counts(server) == (before[0] + 1, before[1] + 2, before[2], before[3] + 2)
        assert _pending(server) == 0
        # the instance goes on: a batch of two more runs, neither seen cancelled
        for i in range(2):
            c.async_infer("cancellable", _inputs(-1.0), _keep(results, i))
        for i in range(2):
            answer = _wait(results, i, 10)
            assert isinstance(answer, grpcclient.InferResult), answer
            assert answer.as_numpy("BATCH")[0][0] == 2 and answer.as_numpy("CANCELLED")[0][0] == 0
    finally:
        c.close()
        leaving.close()
    assert _counts(server)[0] == before[0] + 2


def test_a_sequence_request_gone_mid_execute_is_seen_by_the_model(server):
    """The sequence batcher's requests reach the model with their caller's cancellation too:
    the held batch ends at the cancel, and another sequence's request runs after it."""
    results: dict = {}
    before = _counts(server, "seq_cancellable")
    c = grpcclient.InferenceServerClient(server.grpc_url)
    leaving = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        gone = leaving.async_infer("seq_cancellable", _inputs(2.0), _keep(results, "gone"), sequence_id=7001,
                                   sequence_start=True)
        time.sleep(1.0)  # executing alone: the model holds it
        assert not results
        t0 = time.monotonic()
        gone.cancel()
        c.async_infer("seq_cancellable", _inputs(-1.0), _keep(results, "next"), sequence_id=7002,
                      sequence_start=True, sequence_end=True)
        result = _wait(results, "next", WAIT_S / 2)
        assert isinstance(result, grpcclient.InferResult), result
        assert time.monotonic() - t0 < WAIT_S / 2  # the held batch ended at the cancel, not its deadline
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), -1.0, dtype=np.float32))
        assert not isinstance(results.get("gone"), grpcclient.InferResult)
        deadline = time.monotonic() + 5
        while _counts(server, "seq_cancellable")[1] < before[1] + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the cancelled one (the model answered CANCELLED) and the next both successes, as Triton counts them
        assert _counts(server, "seq_cancellable")[1:3] == (before[1] + 2, before[2])
    finally:
        c.close()
        leaving.close()
