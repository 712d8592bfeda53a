"""Pipelines against real server processes: ensembles (a 3-step pipeline, a diamond DAG
whose branches overlap, step errors, bad DAGs rejected at load, explicit-mode loading and
``unload_dependents``), decoupled Python models (gRPC ModelStreamInfer, HTTP generate and
generate_stream), BLS (sync, async, errors, decoupled, into a dynamic batcher), and a
Python model that kills its worker process.

Each server's repository is built here. Models record what they saw (times, counts) in
their outputs so the tests can prove overlap and batching from the client side."""
from __future__ import annotations

import http.client
import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import onnx_add_sub, write_model
from .helpers import client_module, connect

pytestmark = pytest.mark.timeout(120)

PROTOS = ["http", "grpc"]

# -- models ---------------------------------------------------------------------------------
ADD_SUB_CONFIG = """
    name: "add_sub"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """

PREPROCESS_CONFIG = """
    name: "preprocess"
    backend: "python"
    max_batch_size: 8
    input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "PRE0" data_type: TYPE_FP32 dims: [ 16 ] },
             { name: "PRE1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """

PREPROCESS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            if (x == -999).any():
                raise ValueError("preprocess refuses the flagged value -999")
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PRE0", (x * 2).astype(np.float32)),
                pb_utils.Tensor("PRE1", (x + 1).astype(np.float32))]))
        return responses
"""

POSTPROCESS_CONFIG = """
    name: "postprocess"
    backend: "python"
    max_batch_size: 8
    input [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] },
            { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 16 ] },
             { name: "DIFF_OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """

POSTPROCESS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            s = pb_utils.get_input_tensor_by_name(request, "SUM").as_numpy()
            d = pb_utils.get_input_tensor_by_name(request, "DIFF").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RESULT", (s * 10).astype(np.float32)),
                pb_utils.Tensor("DIFF_OUT", d.astype(np.float32))]))
        return responses
"""


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def ensemble_config(name: str, inputs: str, outputs: str, steps: list[str], max_batch_size: int = 8) -> str:
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f"input [ {inputs} ]\noutput [ {outputs} ]\n"
            f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n")


def _tensor(name: str, dt: str, dims: str) -> str:
    return f'{{ name: "{name}" data_type: TYPE_{dt} dims: {dims} }}'


F16 = "[ 16 ]"
PIPELINE_CONFIG = ensemble_config(
    "pipeline", _tensor("RAW", "FP32", F16),
    f'{_tensor("RESULT", "FP32", F16)}, {_tensor("DIFF", "FP32", F16)}',
    [_step("preprocess", {"RAW": "RAW"}, {"PRE0": "p0", "PRE1": "p1"}),
     _step("add_sub", {"INPUT0": "p0", "INPUT1": "p1"}, {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
     _step("postprocess", {"SUM": "sum", "DIFF": "diff"}, {"RESULT": "RESULT", "DIFF_OUT": "DIFF"})])


def pipeline_expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # p0 = 2x, p1 = x + 1 -> sum = 3x + 1, diff = x - 1 -> RESULT = 10 * sum
    return (10 * (3 * x + 1)).astype(np.float32), (x - 1).astype(np.float32)


SLOW_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }},
             {{ name: "TIMES" data_type: TYPE_FP64 dims: [ 2 ] }},
             {{ name: "WHO" data_type: TYPE_INT64 dims: [ 2 ] }} ]
    """

# Sleeps 0.5 s; Y = X + (1 for slow_a, 2 for slow_b); TIMES = [start, end] (time.time()),
# WHO = [pid, thread id].
SLOW_PY = """
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.add = 1.0 if args["model_name"].endswith("_a") else 2.0

    def execute(self, requests):
        responses = []
        for request in requests:
            start = time.time()
            time.sleep(0.5)
            end = time.time()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x + self.add).astype(np.float32)),
                pb_utils.Tensor("TIMES", np.array([start, end], dtype=np.float64)),
                pb_utils.Tensor("WHO", np.array([os.getpid(), threading.get_ident()], dtype=np.int64))]))
        return responses
"""

JOIN_CONFIG = """
    name: "join"
    backend: "python"
    max_batch_size: 0
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """

JOIN_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", (
            pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            + pb_utils.get_input_tensor_by_name(r, "B").as_numpy()) * 10)]) for r in requests]
"""

DIAMOND_CONFIG = ensemble_config(
    "diamond", _tensor("X", "FP32", "[ 1 ]"),
    ", ".join([_tensor("Y", "FP32", "[ 1 ]"), _tensor("A_TIMES", "FP64", "[ 2 ]"),
               _tensor("B_TIMES", "FP64", "[ 2 ]"), _tensor("A_WHO", "INT64", "[ 2 ]"),
               _tensor("B_WHO", "INT64", "[ 2 ]")]),
    [_step("slow_a", {"X": "X"}, {"Y": "a", "TIMES": "A_TIMES", "WHO": "A_WHO"}),
     _step("slow_b", {"X": "X"}, {"Y": "b", "TIMES": "B_TIMES", "WHO": "B_WHO"}),
     _step("join", {"A": "a", "B": "b"}, {"Y": "Y"})], max_batch_size=0)

# Decoupled: one response per element of IN (OUT = the element, IDX = its index), sent from
# a thread that starts only once execute() has returned; DELAY seconds between responses.
# -1 -> an error response (final); -2 -> execute raises; -3 -> the final flag comes with
# the last response instead of alone; -4 -> an error response without the final flag (the
# request goes on).
REPEAT_CONFIG = """
    name: "repeat"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
            { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
             { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """

REPEAT_PY = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        returned = threading.Event()
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1).tolist()
            delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)[0])
            if -2 in values:
                raise ValueError("repeat: execute refuses -2")
            threading.Thread(target=self._send, args=(request.get_response_sender(), values, delay, returned),
                             daemon=True).start()
        returned.set()
        return None

    def _send(self, sender, values, delay, returned):
        returned.wait()
        time.sleep(0.02)
        last_with_final = -3 in values
        for i, v in enumerate(values):
            if delay:
                time.sleep(delay)
            if v == -1:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"repeat: negative value at index {i}")), flags=FINAL)
                return
            if v == -4:  # an error response that does not end the request
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"repeat: soft error at index {i}")))
                continue
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], dtype=np.int32)),
                                                   pb_utils.Tensor("IDX", np.array([i], dtype=np.int32))])
            if last_with_final and i == len(values) - 1:
                sender.send(response, flags=FINAL)
                return
            sender.send(response)
        sender.send(flags=FINAL)
"""

# The second step takes a tensor of each response of the first (a decoupled step) and one
# of the request: two flows, which Triton refuses.
ENS_DECOUPLED_CONFIG = ensemble_config(
    "ens_decoupled", f'{_tensor("IN", "INT32", "[ -1 ]")}, {_tensor("DELAY", "FP32", "[ 1 ]")}',
    f'{_tensor("OUT", "INT32", "[ 1 ]")}, {_tensor("IDX", "INT32", "[ 1 ]")}',
    [_step("repeat", {"IN": "IN", "DELAY": "DELAY"}, {"OUT": "first", "IDX": "IDX"}),
     _step("repeat", {"IN": "first", "DELAY": "DELAY"}, {"OUT": "OUT"})],
    max_batch_size=0)

BLS_SYNC_CONFIG = """
    name: "bls_sync"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """

BLS_SYNC_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", x[None]), pb_utils.Tensor("INPUT1", np.ones_like(x)[None])],
                requested_output_names=["OUTPUT0", "OUTPUT1"])
            reply = call.exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()[0]),
                pb_utils.Tensor("DIFF", pb_utils.get_output_tensor_by_name(reply, "OUTPUT1").as_numpy()[0])]))
        return responses
"""

BLS_ASYNC_CONFIG = """
    name: "bls_async"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "SUM1" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "SUM2" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """

# Two BLS calls in flight at once (asyncio.gather), from an async execute.
BLS_ASYNC_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = [pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", x[None]),
                        pb_utils.Tensor("INPUT1", np.full_like(x, k)[None])],
                requested_output_names=["OUTPUT0"]) for k in (1.0, 2.0)]
            replies = await asyncio.gather(*(c.async_exec() for c in calls))
            for r in replies:
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM1", pb_utils.get_output_tensor_by_name(replies[0], "OUTPUT0").as_numpy()[0]),
                pb_utils.Tensor("SUM2", pb_utils.get_output_tensor_by_name(replies[1], "OUTPUT0").as_numpy()[0])]))
        return responses
"""

BLS_MISSING_CONFIG = """
    name: "bls_missing"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "HAS_ERROR" data_type: TYPE_BOOL dims: [ 1 ] },
             { name: "MESSAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
    """

BLS_MISSING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            reply = pb_utils.InferenceRequest(model_name="no_such_model", inputs=[pb_utils.Tensor("X", x)],
                                              requested_output_names=["Y"]).exec()
            message = reply.error().message() if reply.has_error() else ""
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("HAS_ERROR", np.array([reply.has_error()], dtype=bool)),
                pb_utils.Tensor("MESSAGE", np.array([message.encode()], dtype=object))]))
        return responses
"""

BLS_DECOUPLED_CONFIG = """
    name: "bls_decoupled"
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "IDX" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """

# Collects every response of the decoupled 'repeat' model (responses without tensors,
# such as an empty final one, are skipped).
BLS_DECOUPLED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="repeat",
                inputs=[pb_utils.Tensor("IN", values), pb_utils.Tensor("DELAY", np.array([0.01], dtype=np.float32))],
                requested_output_names=["OUT", "IDX"])
            outs, idxs = [], []
            for reply in call.exec(decoupled=True):
                if reply.has_error():
                    raise pb_utils.TritonModelException(reply.error().message())
                if not reply.output_tensors():
                    continue
                outs.append(int(pb_utils.get_output_tensor_by_name(reply, "OUT").as_numpy()[0]))
                idxs.append(int(pb_utils.get_output_tensor_by_name(reply, "IDX").as_numpy()[0]))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(outs, dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array(idxs, dtype=np.int32))]))
        return responses
"""

BATCHED_CONFIG = """
    name: "batched"
    backend: "python"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 300000 }
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """

# Y = 2 X; N = how many requests came in the same execute() call.
BATCHED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", (pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2).astype(np.float32)),
            pb_utils.Tensor("N", np.full((1, 1), n, dtype=np.int32))]) for r in requests]
"""

BLS_BATCH_CONFIG = """
    name: "bls_batch"
    backend: "python"
    max_batch_size: 0
    instance_group [ { count: 4 kind: KIND_CPU } ]
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """

BLS_BATCH_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            reply = pb_utils.InferenceRequest(model_name="batched", inputs=[pb_utils.Tensor("X", x[None])],
                                              requested_output_names=["Y", "N"]).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_output_tensor_by_name(reply, "Y").as_numpy()[0]),
                pb_utils.Tensor("N", pb_utils.get_output_tensor_by_name(reply, "N").as_numpy()[0])]))
        return responses
"""

CRASHER_CONFIG = """
    name: "crasher"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """

# X == 1: os._exit(1); X == 9: SIGKILL itself; otherwise Y = X.
CRASHER_PY = """
import os
import signal
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x == 1:
                os._exit(1)
            if x == 9:
                os.kill(os.getpid(), signal.SIGKILL)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def build_pipeline_models(repo: Path) -> None:
    """add_sub (ONNX), preprocess, postprocess and the 'pipeline' ensemble."""
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
    write_model(repo, "preprocess", config=PREPROCESS_CONFIG, model_py=PREPROCESS_PY)
    write_model(repo, "postprocess", config=POSTPROCESS_CONFIG, model_py=POSTPROCESS_PY)
    write_model(repo, "pipeline", config=PIPELINE_CONFIG)


HANG_CONFIG = """
    name: "hang"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """

# Hangs for X seconds (a stuck model), then echoes.
HANG_PY = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
"""


def build_repository(repo: Path) -> Path:
    build_pipeline_models(repo)
    for name in ("slow_a", "slow_b"):
        write_model(repo, name, config=SLOW_CONFIG.format(name=name), model_py=SLOW_PY)
    write_model(repo, "join", config=JOIN_CONFIG, model_py=JOIN_PY)
    write_model(repo, "diamond", config=DIAMOND_CONFIG)
    write_model(repo, "repeat", config=REPEAT_CONFIG, model_py=REPEAT_PY)
    write_model(repo, "hang", config=HANG_CONFIG, model_py=HANG_PY)
    for name, config, py in [("bls_sync", BLS_SYNC_CONFIG, BLS_SYNC_PY), ("bls_async", BLS_ASYNC_CONFIG, BLS_ASYNC_PY),
                             ("bls_missing", BLS_MISSING_CONFIG, BLS_MISSING_PY),
                             ("bls_decoupled", BLS_DECOUPLED_CONFIG, BLS_DECOUPLED_PY),
                             ("batched", BATCHED_CONFIG, BATCHED_PY), ("bls_batch", BLS_BATCH_CONFIG, BLS_BATCH_PY),
                             ("crasher", CRASHER_CONFIG, CRASHER_PY), ("half", HALF_CONFIG, HALF_PY)]:
        write_model(repo, name, config=config, model_py=py)
    return repo


# FP16 out: JSON has no half-precision numbers
HALF_CONFIG = """
    name: "half"
    backend: "python"
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP16 dims: [ 2 ] } ]
    """
HALF_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(np.float16))]) for r in requests]
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("pipelines")
    srv = ServerProcess(build_repository(root / "models"), root / "server.log").start()
    yield srv
    srv.stop_cleanly()


# -- helpers --------------------------------------------------------------------------------
def make_input(proto: str, name: str, array: np.ndarray, datatype: str):
    inp = client_module(proto).InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def http_post(srv: ServerProcess, path: str, body: dict | bytes | None = None,
              timeout: float = 30) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    conn = http.client.HTTPConnection(srv.http_url.split(":")[0], srv.http_port, timeout=timeout)
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def index_of(srv: ServerProcess) -> dict[str, dict]:
    status, body = http_post(srv, "/v2/repository/index")
    assert status == 200, body
    return {row["name"]: row for row in json.loads(body)}


def wait_ready(srv: ServerProcess, names: list[str], timeout: float = 30.0) -> None:
    c = httpclient.InferenceServerClient(srv.http_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(c.is_model_ready(n) for n in names):
                return
        except Exception:  # noqa: BLE001 - the server may be busy restarting a worker
            pass
        time.sleep(0.1)
    raise AssertionError(f"models {names} not ready in {timeout}s: {index_of(srv)}")


def infer_pipeline(srv: ServerProcess, proto: str, x: np.ndarray, outputs: list[str] | None = None,
                   model: str = "pipeline"):
    c = connect(srv, proto)
    requested = None if outputs is None else [client_module(proto).InferRequestedOutput(n) for n in outputs]
    return c.infer(model, [make_input(proto, "RAW", x, "FP32")], outputs=requested)


def stats_of(srv: ServerProcess, name: str) -> dict:
    c = httpclient.InferenceServerClient(srv.http_url)
    return c.get_inference_statistics(name)["model_stats"][0]


def repeat_inputs(values: list[int], delay: float = 0.0):
    return [make_input("grpc", "IN", np.array(values, dtype=np.int32), "INT32"),
            make_input("grpc", "DELAY", np.array([delay], dtype=np.float32), "FP32")]


class Stream:
    """A tritonclient gRPC stream whose callbacks land in a queue."""

    def __init__(self, srv: ServerProcess):
        self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, inputs, request_id: str = "", final_flag: bool = True) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id,
                                       enable_empty_final_response=final_flag)

    def get(self, timeout: float = 10.0):
        return self.results.get(timeout=timeout)

    def collect(self, timeout: float = 10.0) -> list:
        """Results of one request, up to its final flag or an error."""
        got = []
        while True:
            result, error = self.get(timeout)
            got.append((result, error))
            if error is not None or is_final(result):
                return got

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def is_final(result) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


def sse_events(body: bytes) -> list[dict]:
    events = []
    for chunk in body.decode().split("\n\n"):
        if not chunk.strip():
            continue
        assert chunk.startswith("data: "), chunk
        events.append(json.loads(chunk[len("data: "):]))
    return events


# -- ensembles ------------------------------------------------------------------------------
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("batch", [1, 3])
def test_pipeline_numbers(server, proto, batch):
    x = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16) - 5
    result = infer_pipeline(server, proto, x)
    want_result, want_diff = pipeline_expected(x)
    np.testing.assert_allclose(result.as_numpy("RESULT"), want_result)
    np.testing.assert_allclose(result.as_numpy("DIFF"), want_diff)
    assert result.as_numpy("RESULT").shape == (batch, 16)


@pytest.mark.parametrize("proto", PROTOS)
def test_pipeline_requested_output_subset(server, proto):
    x = (np.arange(16, dtype=np.float32) - 8)[None]
    result = infer_pipeline(server, proto, x, outputs=["DIFF"])
    np.testing.assert_allclose(result.as_numpy("DIFF"), pipeline_expected(x)[1])
    assert result.as_numpy("RESULT") is None
    names = [o["name"] for o in result.get_response()["outputs"]] if proto == "http" else \
        [o.name for o in result.get_response().outputs]
    assert names == ["DIFF"]


def test_ensemble_metadata_and_config(server):
    h, g = connect(server, "http"), connect(server, "grpc")
    md = h.get_model_metadata("pipeline")
    assert md["platform"] == "ensemble"
    assert md["inputs"] == [{"name": "RAW", "datatype": "FP32", "shape": [-1, 16]}]
    assert [o["name"] for o in md["outputs"]] == ["RESULT", "DIFF"]
    assert g.get_model_metadata("pipeline").platform == "ensemble"
    cfg = h.get_model_config("pipeline")
    assert cfg["platform"] == "ensemble"
    steps = cfg["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["preprocess", "add_sub", "postprocess"]
    assert steps[1]["input_map"] == {"INPUT0": "p0", "INPUT1": "p1"}
    gcfg = g.get_model_config("pipeline").config
    assert gcfg.platform == "ensemble" and len(gcfg.ensemble_scheduling.step) == 3
    assert h.is_model_ready("pipeline") and g.is_model_ready("pipeline")


def test_ensemble_statistics(server):
    names = ["pipeline", "preprocess", "add_sub", "postprocess"]
    before = {n: stats_of(server, n) for n in names}
    infer_pipeline(server, "http", np.ones((2, 16), dtype=np.float32))
    infer_pipeline(server, "grpc", np.ones((1, 16), dtype=np.float32))
    after = {n: stats_of(server, n) for n in names}
    for n in names:
        assert after[n]["inference_count"] - before[n]["inference_count"] == 3, n
        assert after[n]["inference_stats"]["success"]["count"] - \
            before[n]["inference_stats"]["success"]["count"] == 2, n
    assert after["pipeline"]["name"] == "pipeline"


def test_diamond_branches_overlap(server):
    c = connect(server, "grpc")
    x = np.array([1.5], dtype=np.float32)
    c.infer("diamond", [make_input("grpc", "X", x, "FP32")])  # warm up
    result = c.infer("diamond", [make_input("grpc", "X", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("Y"), ((x + 1) + (x + 2)) * 10)
    a, b = result.as_numpy("A_TIMES"), result.as_numpy("B_TIMES")  # (start, end) inside each branch
    assert max(a[0], b[0]) < min(a[1], b[1]), f"branches did not overlap: a={a} b={b}"
    who_a, who_b = result.as_numpy("A_WHO"), result.as_numpy("B_WHO")
    assert who_a[1] != who_b[1] or who_a[0] != who_b[0]  # different threads (or processes)


@pytest.mark.parametrize("proto", PROTOS)
def test_ensemble_step_error_names_step(server, proto):
    x = np.zeros((1, 16), dtype=np.float32)
    x[0, 3] = -999
    with pytest.raises(InferenceServerException) as e:
        infer_pipeline(server, proto, x)
    msg = str(e.value)
    assert "preprocess" in msg and "-999" in msg, msg
    assert "pipeline" in msg, msg
    # the server keeps serving, the ensemble too
    y = np.ones((1, 16), dtype=np.float32)
    np.testing.assert_allclose(infer_pipeline(server, proto, y).as_numpy("RESULT"), pipeline_expected(y)[0])


def test_ensemble_concurrent_requests(server):
    xs = [np.full((1, 16), i, dtype=np.float32) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda x: infer_pipeline(server, "grpc", x).as_numpy("RESULT"), xs))
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r, pipeline_expected(x)[0])


# -- decoupled models over the gRPC stream ---------------------------------------------------
@pytest.mark.parametrize("values", [[], [7], [3, 1, 4, 1, 5]], ids=["zero", "one", "many"])
def test_stream_decoupled_responses(server, values):
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs(values), request_id="r")
        got = s.collect()
    finally:
        s.close()
    assert all(err is None for _, err in got), got
    *data, final = [r for r, _ in got]
    assert [int(r.as_numpy("OUT")[0]) for r in data] == values
    assert [int(r.as_numpy("IDX")[0]) for r in data] == list(range(len(values)))
    assert not any(is_final(r) for r in data)
    assert is_final(final) and final.get_response().outputs == []
    assert final.get_response().id == "r" and final.get_response().model_name == "repeat"


def test_stream_final_flag_with_last_response(server):
    """A model that sends its last response with the FINAL flag: no extra empty response."""
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs([5, -3]))
        got = s.collect()
    finally:
        s.close()
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [5, -3]
    assert is_final(got[-1][0]) and not is_final(got[0][0])


def test_stream_without_final_flag(server):
    """Without enable_empty_final_response only the real responses arrive."""
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs([1, 2]), final_flag=False)
        got = [s.get() for _ in range(2)]
        with pytest.raises(queue.Empty):
            s.get(timeout=0.5)
    finally:
        s.close()
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [1, 2]


def test_stream_concurrent_requests_interleave(server):
    s = Stream(server)
    want = {f"req{i}": list(range(10 * i, 10 * i + 4)) for i in range(4)}
    try:
        for rid, values in want.items():
            s.send("repeat", repeat_inputs(values, delay=0.05), request_id=rid)
        seen: dict[str, list[int]] = {rid: [] for rid in want}
        finals: set[str] = set()
        order: list[str] = []
        while len(finals) < len(want):
            result, error = s.get()
            assert error is None, error
            rid = result.get_response().id
            assert rid not in finals, f"{rid} got a response after its final one"
            if is_final(result):
                finals.add(rid)
            else:
                seen[rid].append(int(result.as_numpy("OUT")[0]))
                order.append(rid)
    finally:
        s.close()
    assert seen == want
    # the four requests were answered side by side, not one after the other
    assert order[:4] != [order[0]] * 4 or len(set(order[:8])) > 1, order


@pytest.mark.parametrize("values,needle", [([4, -1], "negative value at index 1"),
                                           ([-2], "execute refuses -2")], ids=["error_response", "raises"])
def test_stream_errors_keep_stream_usable(server, values, needle):
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs(values))
        got = s.collect()
        errors = [e for _, e in got if e is not None]
        assert len(errors) == 1 and needle in str(errors[0]), got
        if values[0] == 4:
            assert int(got[0][0].as_numpy("OUT")[0]) == 4
        # same stream, next request is fine
        s.send("repeat", repeat_inputs([8, 9]))
        again = s.collect()
        assert [int(r.as_numpy("OUT")[0]) for r, e in again[:-1]] == [8, 9]
        assert is_final(again[-1][0])
    finally:
        s.close()


def test_stream_non_final_error_response_continues(server):
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs([1, -4, 2]))
        got = []
        while not got or got[-1][0] is None or not is_final(got[-1][0]):
            try:
                got.append(s.get(timeout=2))
            except queue.Empty:
                raise AssertionError(f"no final response; got {got}") from None
    finally:
        s.close()
    assert got[0][1] is None and int(got[0][0].as_numpy("OUT")[0]) == 1
    assert got[1][1] is not None and "soft error at index 1" in str(got[1][1])
    assert got[2][1] is None and int(got[2][0].as_numpy("OUT")[0]) == 2
    assert is_final(got[3][0]) and len(got) == 4


def test_stream_error_responses_name_request_and_model(server):
    """An error a decoupled model sends carries its request's id and the model's name, and the
    final flag where the stream's responses are flagged."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="repeat", id="soft-then-final")
    for name, datatype, values in (("IN", "INT32", np.array([1, -4, -1], np.int32)),
                                   ("DELAY", "FP32", np.array([0], np.float32))):
        request.inputs.add(name=name, datatype=datatype, shape=[len(values)])
        request.raw_input_contents.append(values.tobytes())
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel:
        replies = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]), timeout=30)
        got = [(r.error_message, r.infer_response.id, r.infer_response.model_name,
                {k: v.bool_param for k, v in r.infer_response.parameters.items()}) for r in replies]
    assert got == [("", "soft-then-final", "repeat", {"triton_final_response": False}),
                   ("repeat: soft error at index 1", "soft-then-final", "repeat", {"triton_final_response": False}),
                   ("repeat: negative value at index 2", "soft-then-final", "repeat", {"triton_final_response": True})]


def test_stream_non_decoupled_model(server):
    s = Stream(server)
    x = np.full((1, 16), 2, dtype=np.float32)
    try:
        s.send("add_sub", [make_input("grpc", "INPUT0", x, "FP32"), make_input("grpc", "INPUT1", x, "FP32")],
               request_id="nd")
        result, error = s.get()
        assert error is None, error
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), x * 2)
        assert is_final(result), "a non-decoupled model's one response carries the final flag"
        with pytest.raises(queue.Empty):
            s.get(timeout=0.3)
        # an ensemble over the stream too
        s.send("pipeline", [make_input("grpc", "RAW", x, "FP32")])
        result, error = s.get()
        assert error is None and is_final(result)
        np.testing.assert_allclose(result.as_numpy("RESULT"), pipeline_expected(x)[0])
    finally:
        s.close()


def test_stream_unknown_model_error(server):
    s = Stream(server)
    try:
        s.send("no_such_model", repeat_inputs([1]))
        _, error = s.get()
        assert error is not None and "no_such_model" in str(error)
        s.send("repeat", repeat_inputs([1]))
        assert [int(r.as_numpy("OUT")[0]) for r, _ in s.collect()[:-1]] == [1]
    finally:
        s.close()


def test_unary_infer_on_decoupled_model_fails_clearly(server):
    g = connect(server, "grpc")
    with pytest.raises(InferenceServerException) as e:
        g.infer("repeat", repeat_inputs([1]))
    assert "decoupled" in str(e.value) and "StatusCode.UNIMPLEMENTED" in str(e.value)
    status, body = http_post(server, "/v2/models/repeat/infer", {
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
                   {"name": "DELAY", "datatype": "FP32", "shape": [1], "data": [0]}]})
    assert status == 501, (status, body)  # Triton: 501, UNSUPPORTED
    assert "decoupled" in json.loads(body)["error"]
    # the model still streams afterwards
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs([2]))
        assert len(s.collect()) == 2
    finally:
        s.close()


# -- HTTP generate extension -------------------------------------------------------------------
def test_generate_stream_sse_events(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/repeat/generate_stream",
                     body=json.dumps({"IN": [11, 12, 13], "DELAY": 0.01}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        events = sse_events(resp.read())
    finally:
        conn.close()
    assert [e["OUT"] for e in events] == [11, 12, 13]
    assert [e["IDX"] for e in events] == [0, 1, 2]
    assert all(e["model_name"] == "repeat" for e in events)


def test_generate_stream_zero_responses_and_error(server):
    status, body = http_post(server, "/v2/models/repeat/generate_stream", {"IN": [], "DELAY": 0})
    assert status == 200 and sse_events(body) == []
    status, body = http_post(server, "/v2/models/repeat/generate_stream", {"IN": [6, -1], "DELAY": 0})
    events = sse_events(body)
    assert events[0]["OUT"] == 6 and "negative value at index 1" in events[-1]["error"], events


def test_generate_non_decoupled(server):
    x = list(range(16))
    status, body = http_post(server, "/v2/models/add_sub/generate", {"INPUT0": x, "INPUT1": [1] * 16})
    assert status == 200, body
    doc = json.loads(body)
    assert doc["OUTPUT0"] == [v + 1 for v in x] and doc["OUTPUT1"] == [v - 1 for v in x]
    assert doc["model_name"] == "add_sub"
    # generate_stream on a non-decoupled model: one event
    status, body = http_post(server, "/v2/models/add_sub/generate_stream", {"INPUT0": x, "INPUT1": x})
    assert status == 200
    events = sse_events(body)
    assert len(events) == 1 and events[0]["OUTPUT0"] == [2 * v for v in x]


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_generate_refuses_an_fp16_output_as_triton_does(server, path):
    status, body = http_post(server, f"/v2/models/half/{path}", {"X": [1.5, 2.5]})
    error = json.loads(body)["error"] if path == "generate" else sse_events(body)[-1]["error"]
    assert error == "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    assert status == (400 if path == "generate" else 200), (status, body)


def test_generate_unknown_input_is_400(server):
    # A list-valued member that is no input: 400 here and in Triton 2.51 (which reads unknown
    # members as request parameters and refuses a list). A scalar one Triton accepts as a
    # parameter; this server refuses it too (not tested here).
    status, body = http_post(server, "/v2/models/add_sub/generate", {"INPUT0": [0] * 16, "BOGUS": [1] * 16})
    assert status == 400, body
    assert "BOGUS" in json.loads(body)["error"]
    status, body = http_post(server, "/v2/models/no_such_model/generate", {"X": 1})
    assert status == 404, body  # as Triton 2.51
    assert json.loads(body) == {"error": "Request for unknown model: 'no_such_model' is not found"}


# -- BLS -------------------------------------------------------------------------------------
@pytest.mark.parametrize("proto", PROTOS)
def test_bls_sync_exec(server, proto):
    x = np.arange(16, dtype=np.float32)
    result = connect(server, proto).infer("bls_sync", [make_input(proto, "X", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("SUM"), x + 1)
    np.testing.assert_allclose(result.as_numpy("DIFF"), x - 1)


def test_bls_async_exec(server):
    x = np.arange(16, dtype=np.float32) * 3
    result = connect(server, "http").infer("bls_async", [make_input("http", "X", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("SUM1"), x + 1)
    np.testing.assert_allclose(result.as_numpy("SUM2"), x + 2)


def test_bls_missing_model_has_error(server):
    result = connect(server, "grpc").infer("bls_missing", [make_input("grpc", "X", np.ones(1, np.float32), "FP32")])
    assert bool(result.as_numpy("HAS_ERROR")[0]) is True
    message = result.as_numpy("MESSAGE")[0].decode()
    assert "no_such_model" in message, message


def test_bls_decoupled_iterator(server):
    values = np.array([9, 8, 7, 6, 5], dtype=np.int32)
    result = connect(server, "grpc").infer("bls_decoupled", [make_input("grpc", "IN", values, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), values)
    np.testing.assert_array_equal(result.as_numpy("IDX"), np.arange(5))
    empty = connect(server, "grpc").infer("bls_decoupled", [make_input("grpc", "IN", values[:0], "INT32")])
    assert empty.as_numpy("OUT").shape == (0,)


def test_bls_into_dynamic_batcher(server):
    before = stats_of(server, "batched")
    xs = [np.array([float(i)], dtype=np.float32) for i in range(4)]

    def one(x):
        return connect(server, "http").infer("bls_batch", [make_input("http", "X", x, "FP32")])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, xs))
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r.as_numpy("Y"), x * 2)
    assert max(int(r.as_numpy("N")[0]) for r in results) > 1, [int(r.as_numpy("N")[0]) for r in results]
    after = stats_of(server, "batched")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 4 and executions < 4, (inferences, executions)


# -- a dropped stream and a crashing worker (last: the crash restarts the CPU worker) ---------
def test_client_drops_stream_mid_way(server):
    s = Stream(server)
    s.send("repeat", repeat_inputs(list(range(15)), delay=0.1), request_id="slow")
    first, error = s.get()
    assert error is None and int(first.as_numpy("OUT")[0]) == 0
    s.client.stop_stream(cancel_requests=True)
    s.client.close()
    # the server keeps serving while the model is still sending into the void
    t0 = time.monotonic()
    s2 = Stream(server)
    try:
        s2.send("repeat", repeat_inputs([1, 2, 3]))
        assert [int(r.as_numpy("OUT")[0]) for r, _ in s2.collect()[:-1]] == [1, 2, 3]
        x = np.ones((1, 16), dtype=np.float32)
        np.testing.assert_allclose(infer_pipeline(server, "http", x).as_numpy("RESULT"), pipeline_expected(x)[0])
        assert time.monotonic() - t0 < 1.4, "later requests waited for the dropped stream's model"
        time.sleep(max(0.0, 1.7 - (time.monotonic() - t0)))  # the dropped request's sender finishes
        s2.send("repeat", repeat_inputs([4]))
        assert [int(r.as_numpy("OUT")[0]) for r, _ in s2.collect()[:-1]] == [4]
    finally:
        s2.close()
    assert httpclient.InferenceServerClient(server.http_url).is_server_live()


@pytest.mark.parametrize("flag,how", [(1, "exited with code 1"), (9, "killed by signal 9")], ids=["exit", "sigkill"])
def test_worker_crash_recovers(server, flag, how):
    g = connect(server, "grpc")
    with pytest.raises(InferenceServerException) as e:
        g.infer("crasher", [make_input("grpc", "X", np.array([flag], np.int32), "INT32")])
    msg = str(e.value)
    assert "model instance 'crasher_0_0'" in msg and how in msg, msg
    assert httpclient.InferenceServerClient(server.http_url).is_server_live()
    wait_ready(server, ["crasher", "add_sub", "preprocess", "repeat", "bls_sync"])
    assert int(g.infer("crasher", [make_input("grpc", "X", np.array([5], np.int32), "INT32")])
               .as_numpy("Y")[0]) == 5
    x = np.arange(16, dtype=np.float32)[None]
    np.testing.assert_allclose(infer_pipeline(server, "grpc", x).as_numpy("RESULT"), pipeline_expected(x)[0])
    np.testing.assert_allclose(g.infer("bls_sync", [make_input("grpc", "X", x[0], "FP32")]).as_numpy("SUM"), x[0] + 1)
    s = Stream(server)
    try:
        s.send("repeat", repeat_inputs([3]))
        assert [int(r.as_numpy("OUT")[0]) for r, _ in s.collect()[:-1]] == [3]
    finally:
        s.close()


# -- bad ensembles at load --------------------------------------------------------------------
BAD_ENSEMBLES = {
    "bad_missing_model": (ensemble_config(
        "bad_missing_model", _tensor("X", "FP32", F16), _tensor("Y", "FP32", F16),
        [_step("no_such_model", {"INPUT0": "X"}, {"OUTPUT0": "Y"})]),
        ["no_such_model"]),
    "bad_cycle": (ensemble_config(
        "bad_cycle", _tensor("X", "FP32", F16), _tensor("Y", "FP32", F16),
        [_step("add_sub", {"INPUT0": "X", "INPUT1": "t2"}, {"OUTPUT0": "t1", "OUTPUT1": "Y"}),
         _step("preprocess", {"RAW": "t1"}, {"PRE0": "t2"})]),
        ["cycle"]),
    "bad_unused_step_output": (ensemble_config(
        "bad_unused_step_output", f'{_tensor("X", "FP32", F16)}, {_tensor("X2", "FP32", F16)}',
        _tensor("Y", "FP32", F16),
        [_step("add_sub", {"INPUT0": "X", "INPUT1": "X2"}, {"OUTPUT0": "Y", "OUTPUT1": "dangling"})]),
        ["dangling"]),
    "bad_unused_input": (ensemble_config(
        "bad_unused_input", f'{_tensor("X", "FP32", F16)}, {_tensor("UNUSED", "FP32", F16)}',
        _tensor("Y", "FP32", F16),
        [_step("add_sub", {"INPUT0": "X", "INPUT1": "X"}, {"OUTPUT0": "Y"})]),
        ["UNUSED"]),
    "bad_unknown_model_input": (ensemble_config(
        "bad_unknown_model_input", _tensor("X", "FP32", F16), _tensor("Y", "FP32", F16),
        [_step("add_sub", {"INPUT0": "X", "NOPE": "X"}, {"OUTPUT0": "Y"})]),
        ["NOPE", "add_sub"]),
    "bad_unproduced_tensor": (ensemble_config(
        "bad_unproduced_tensor", _tensor("X", "FP32", F16), _tensor("Y", "FP32", F16),
        [_step("add_sub", {"INPUT0": "X", "INPUT1": "ghost"}, {"OUTPUT0": "Y"})]),
        ["ghost"]),
}


@pytest.fixture(scope="module")
def bad_server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("bad_ensembles")
    repo = root / "models"
    build_pipeline_models(repo)
    for name, (config, _) in BAD_ENSEMBLES.items():
        write_model(repo, name, config=config)
    write_model(repo, "repeat", config=REPEAT_CONFIG, model_py=REPEAT_PY)
    write_model(repo, "ens_decoupled", config=ENS_DECOUPLED_CONFIG)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error", "false"]).start(wait_ready=False)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # no load still in progress
        if all(r.get("state") in (None, "READY", "UNAVAILABLE") for r in index_of(srv).values()):
            break
        time.sleep(0.1)
    yield srv
    srv.stop()


def test_ensemble_step_fed_by_two_decoupled_flows_is_refused(bad_server):
    """A step that takes tensors of a decoupled step's responses and of the request (or of
    two decoupled steps) is refused, as in Triton; decoupled steps themselves are served
    (tests/test_ensemble_backpressure.py)."""
    row = index_of(bad_server)["ens_decoupled"]
    assert row.get("state") == "UNAVAILABLE", row
    assert "step of model 'repeat' receives inputs originated from different decoupled models" in \
        row.get("reason", ""), row
    assert index_of(bad_server)["repeat"].get("state") == "READY"


@pytest.mark.parametrize("name", list(BAD_ENSEMBLES))
def test_bad_ensemble_unavailable_with_reason(bad_server, name):
    row = index_of(bad_server)[name]
    assert row.get("state") == "UNAVAILABLE", row
    reason = row.get("reason", "")
    for needle in BAD_ENSEMBLES[name][1]:
        assert needle in reason, reason
    assert not httpclient.InferenceServerClient(bad_server.http_url).is_model_ready(name)


def test_bad_ensembles_leave_others_serving(bad_server):
    rows = index_of(bad_server)
    assert all(rows[n]["state"] == "READY" for n in ["pipeline", "add_sub", "preprocess", "postprocess"]), rows
    x = np.ones((1, 16), dtype=np.float32)
    np.testing.assert_allclose(infer_pipeline(bad_server, "grpc", x).as_numpy("RESULT"), pipeline_expected(x)[0])
    with pytest.raises(InferenceServerException):
        connect(bad_server, "http").infer("bad_cycle", [make_input("http", "X", x, "FP32")])


def test_missing_composing_model_fails_startup(tmp_path):
    """With --exit-on-error (the default) a broken ensemble stops the server, as in Triton."""
    repo = tmp_path / "models"
    build_pipeline_models(repo)
    write_model(repo, "bad_missing_model", config=BAD_ENSEMBLES["bad_missing_model"][0])
    srv = ServerProcess(repo, tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match="server exited"):
            srv.start(timeout=30)
        assert "bad_missing_model" in srv.log()
    finally:
        srv.stop()


# -- explicit mode -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("explicit")
    repo = root / "models"
    build_pipeline_models(repo)
    write_model(repo, "pipeline2", config=PIPELINE_CONFIG.replace('name: "pipeline"', 'name: "pipeline2"'))
    srv = ServerProcess(repo, root / "server.log", extra_args=["--model-control-mode", "explicit"]).start()
    yield srv
    assert srv.stop() == 0


def _ready(srv: ServerProcess) -> set[str]:
    return {n for n, r in index_of(srv).items() if r.get("state") == "READY"}


def test_explicit_ensemble_load_and_unload_dependents(explicit_server):
    srv = explicit_server
    assert _ready(srv) == set()
    status, body = http_post(srv, "/v2/repository/models/pipeline/load")
    assert status == 200, body
    assert _ready(srv) == {"pipeline", "preprocess", "add_sub", "postprocess"}
    x = np.full((1, 16), 3, dtype=np.float32)
    np.testing.assert_allclose(infer_pipeline(srv, "http", x).as_numpy("RESULT"), pipeline_expected(x)[0])

    # HTTP: unloading a composing model with unload_dependents unloads the ensemble too
    status, body = http_post(srv, "/v2/repository/models/add_sub/unload", {"parameters": {"unload_dependents": True}})
    assert status == 200, body
    assert _ready(srv) == {"preprocess", "postprocess"}
    assert index_of(srv)["pipeline"]["state"] == "UNAVAILABLE"

    # loading the ensemble again brings back the composing model it lacks
    g = connect(srv, "grpc")
    g.load_model("pipeline")
    assert _ready(srv) == {"pipeline", "preprocess", "add_sub", "postprocess"}
    np.testing.assert_allclose(infer_pipeline(srv, "grpc", x).as_numpy("RESULT"), pipeline_expected(x)[0])

    # gRPC: unload_model(..., unload_dependents=True)
    g.unload_model("postprocess", unload_dependents=True)
    assert _ready(srv) == {"preprocess", "add_sub"}
    assert not g.is_model_ready("pipeline")
    with pytest.raises(InferenceServerException):
        infer_pipeline(srv, "grpc", x)


def test_unload_ensemble_with_dependents_unloads_its_composing_models(explicit_server):
    """Composing models the ensemble's load brought in go with it, unless another ensemble
    still uses them; a model loaded on its own request stays."""
    srv, g = explicit_server, connect(explicit_server, "grpc")
    for name in ["pipeline", "pipeline2", "preprocess", "add_sub", "postprocess"]:
        g.unload_model(name)
    g.load_model("add_sub")
    g.load_model("pipeline")  # brings in preprocess and postprocess
    g.load_model("pipeline2")
    g.unload_model("pipeline", unload_dependents=True)
    assert _ready(srv) == {"pipeline2", "preprocess", "add_sub", "postprocess"}  # pipeline2 uses them
    g.unload_model("pipeline2", unload_dependents=True)
    assert _ready(srv) == {"add_sub"}
    rows = index_of(srv)
    assert rows["preprocess"]["state"] == rows["postprocess"]["state"] == "UNAVAILABLE", rows
    # without unload_dependents the composing models stay
    g.load_model("pipeline")
    g.unload_model("pipeline")
    assert _ready(srv) == {"preprocess", "add_sub", "postprocess"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_hung_model_is_bounded_by_the_request_timeout(server, protocol):
    """A model stuck in execute: the client's timeout parameter ends its wait with a clear
    error, and the server keeps serving other models meanwhile."""
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    x = np.array([3.0], dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:  # the model would answer after 3 s
        client.infer("hang", [make_input(protocol, "X", x, "FP32")], timeout=300_000)  # 0.3 s, in µs
    assert err.value.message() == "Request timeout expired"
    assert err.value.status() == ("503" if protocol == "http" else "StatusCode.UNAVAILABLE")
    y = np.full((1, 16), 1, dtype=np.float32)
    ok = client.infer("add_sub", [make_input(protocol, "INPUT0", y, "FP32"), make_input(protocol, "INPUT1", y, "FP32")])
    np.testing.assert_allclose(ok.as_numpy("OUTPUT0"), y * 2)
    client.close()


# -- an ensemble's own reshape ------------------------------------------------------------------
SHAPE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            rank = np.full((x.shape[0], 1) if x.ndim == 3 else (1,), x.ndim, dtype=np.int64)  # per batch row
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2),
                                                         pb_utils.Tensor("RANK", rank)]))
        return responses
"""


@pytest.mark.parametrize("batching", [False, True], ids=["no_batching", "batching"])
def test_ensemble_reshape(tmp_path, batching):
    """As Triton 2.51: an ensemble input with a reshape reaches its steps as reshape.shape,
    and an output with one reaches the client as its dims (the client sends and gets [4]
    where the step takes and makes [2, 2])."""
    max_batch_size = 8 if batching else 0
    repo = tmp_path / "models"
    write_model(repo, "square", model_py=SHAPE_PY, config=f"""
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2, 2 ] }},
                 {{ name: "RANK" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        """)
    reshaped = "reshape { shape: [ 2, 2 ] }"
    (repo / "flat" / "1").mkdir(parents=True)
    (repo / "flat" / "config.pbtxt").write_text(ensemble_config(
        "flat", _tensor("FLAT_IN", "FP32", "[ 4 ]").replace(" }", f" {reshaped} }}"),
        f'{_tensor("FLAT_OUT", "FP32", "[ 4 ]").replace(" }", f" {reshaped} }}")}, '
        f'{_tensor("STEP_RANK", "INT64", "[ 1 ]")}',
        [_step("square", {"IN": "FLAT_IN"}, {"OUT": "FLAT_OUT", "RANK": "STEP_RANK"})],
        max_batch_size=max_batch_size))
    srv = ServerProcess(repo, tmp_path / "server.log").start()
    try:
        shape = [3, 4] if batching else [4]
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        for proto in PROTOS:
            c = connect(srv, proto)
            try:
                result = c.infer("flat", [make_input(proto, "FLAT_IN", x, "FP32")])
            finally:
                c.close()
            np.testing.assert_array_equal(result.as_numpy("FLAT_OUT"), x * 2)  # shape [4] (or [3, 4]) again
            # the step saw [2, 2] (or [3, 2, 2]), not [4]
            assert set(result.as_numpy("STEP_RANK").reshape(-1).tolist()) == {3 if batching else 2}
    finally:
        srv.stop_cleanly()
