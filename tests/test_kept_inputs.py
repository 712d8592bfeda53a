"""A model that holds an input array past its request, against a real server.

An in-band input reaches a model as a view of the front-end's input arena, and a copied
shared-memory input as a view of a worker block; both are reused once the batch is
answered. A model may still hold such an array: a Python model storing it (state kept
across requests), or a decoupled model whose thread reads it after ``execute`` returned,
Triton's usual decoupled pattern. The worker then keeps that memory out of reuse until
the array is collected. These tests fail where the memory is reused under the array: its
contents change to a later request's.
"""
from __future__ import annotations

import queue

import numpy as np
import pytest

import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from .harness import ServerProcess, rss_kib
from .helpers import Regions, client_module, connect
from .models import python_identity, write_model
from .test_shm import shm_input

pytestmark = pytest.mark.timeout(120)

N = 4096  # FP32 elements: 16 KiB per input

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
    """

# Parameters: "keep" (store the input array), "read" (answer the stored array),
# "drop" (forget every stored array).
KEEPER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            params = json.loads(params) if isinstance(params, str) and params else (params or {})
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if params.get("keep"):
                self.kept.append(x)
            if params.get("drop"):
                self.kept.clear()
            out = self.kept[-1] if params.get("read") else x
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array(out))]))
        return responses
"""

# Triton's decoupled pattern: execute hands the input to a thread and returns; the thread
# reads it later and sends the response.
LATER_PY = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            threading.Thread(target=self.answer, args=(request.get_response_sender(), x)).start()
        return None

    def answer(self, sender, x):
        time.sleep(0.3)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array(x))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("kept_inputs")
    repo = root / "models"
    write_model(repo, "keeper", config=CONFIG.format(name="keeper", extra=""), model_py=KEEPER_PY)
    write_model(repo, "later", config=CONFIG.format(
        name="later", extra="model_transaction_policy { decoupled: true }"), model_py=LATER_PY)
    python_identity(repo, "identity_fp32", "FP32")
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true"]).start()
    yield srv
    assert srv.stop() == 0, srv.log()[-4000:]


def _infer(proto, cl, model: str, data: np.ndarray, **params) -> np.ndarray:
    inp = client_module(proto).InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return cl.infer(model, [inp], parameters=params or None).as_numpy("OUTPUT0")


def _churn(proto, cl, model: str = "identity_fp32", count: int = 40) -> None:
    """Requests whose inputs take the memory a freed input had."""
    other = np.full(N, 9.0, dtype=np.float32)
    for _ in range(count):
        np.testing.assert_array_equal(_infer(proto, cl, model, other), other)


def test_a_stored_in_band_input_keeps_its_values(proto, server):
    kept = np.arange(N, dtype=np.float32) + (1 if proto == "http" else 2)
    with connect(server, proto) as cl:
        _infer(proto, cl, "keeper", kept, keep=True)
        _churn(proto, cl)
        _churn(proto, cl, "keeper")
        np.testing.assert_array_equal(_infer(proto, cl, "keeper", kept[:1], read=True), kept)
        _infer(proto, cl, "keeper", kept[:1], drop=True)
        _churn(proto, cl)  # the memory, given back, serves again


def test_a_stored_copy_of_a_shared_memory_input_keeps_its_values(proto, server):
    kept = np.arange(N, dtype=np.float32) * 3
    regions = Regions(server)
    try:
        with connect(server, proto) as cl:
            handle, _, key = regions.create(kept.nbytes, "kept")
            shm.set_shared_memory_region(handle, [kept])
            cl.register_system_shared_memory("kept", key, kept.nbytes)
            inp = shm_input(proto, "INPUT0", [N], "FP32", "kept", kept.nbytes)
            cl.infer("keeper", [inp], parameters={"keep": True})
            shm.set_shared_memory_region(handle, [np.zeros(N, dtype=np.float32)])  # the model holds a copy
            for _ in range(20):  # other shared-memory inputs take the worker's freed copies
                cl.infer("keeper", [inp])
            np.testing.assert_array_equal(_infer(proto, cl, "keeper", kept[:1], read=True), kept)
            _infer(proto, cl, "keeper", kept[:1], drop=True)
    finally:
        regions.cleanup()


def test_a_decoupled_model_reads_its_input_after_execute_returned(server):
    """The thread answers 300 ms after execute returned; meanwhile other requests reuse
    whatever memory the server freed."""
    results: queue.Queue = queue.Queue()
    values = [np.arange(N, dtype=np.float32) * (k + 1) for k in range(4)]
    with grpcclient.InferenceServerClient(server.grpc_url) as stream_client, connect(server, "grpc") as cl:
        stream_client.start_stream(callback=lambda result, error: results.put((result, error)))
        for k, x in enumerate(values):
            inp = grpcclient.InferInput("INPUT0", [N], "FP32")
            inp.set_data_from_numpy(x)
            stream_client.async_stream_infer("later", [inp], request_id=str(k))
        _churn("grpc", cl)
        got = {}
        for _ in values:
            result, error = results.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("OUTPUT0")
        stream_client.stop_stream()
    for k, x in enumerate(values):
        np.testing.assert_array_equal(got[str(k)], x)


def test_inputs_nobody_holds_are_reused(server):
    """A model that holds nothing keeps nothing: 1 MiB inputs in a loop reuse one block,
    and the front-end's memory stays flat."""
    big = np.ones(1 << 18, dtype=np.float32)
    with connect(server, "grpc") as cl:
        for _ in range(20):
            _infer("grpc", cl, "identity_fp32", big)
        before = rss_kib(server.proc.pid)
        for _ in range(300):  # 300 MiB if every block were kept
            _infer("grpc", cl, "identity_fp32", big)
        grown = rss_kib(server.proc.pid) - before
    assert grown < 64 << 10, f"the front-end grew by {grown} KiB over 300 MiB of inputs"
