"""Response parameters of Python models and the cancellation of a decoupled BLS call,
against a real server with the real tritonclient, as Triton's python backend has them
(PRs 7964, 7987, 8097): ``pb_utils.InferenceResponse(..., parameters={...})`` reaches the
client over HTTP (the response's JSON ``parameters``) and gRPC (``ModelInferResponse.
parameters``, unary and streamed); values are bool, int or str, anything else fails the
request with Triton's words; a BLS caller reads them as ``response.parameters()``, a JSON
string; and ``exec(decoupled=True)``'s iterator has ``cancel()``, which the called model
sees as ``request.is_cancelled()``."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import write_model

pytestmark = pytest.mark.timeout(120)

IDENTITY = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{extra}
"""
# The request's parameter "kind" picks the response's parameters.
PARAMS_PY = """
import json
import triton_python_backend_utils as pb_utils

KINDS = {"good": {"flag": True, "count": -5, "big": 2**62, "text": "s"}, "none": None, "empty": {},
         "float": {"f": 1.5}, "key": {1: "x"}, "list": {"l": [1]}, "json": '{"a": 1}'}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)],
                                                  parameters=KINDS[json.loads(r.parameters())["kind"]]))
        return out
"""
DECOUPLED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            sender = r.get_response_sender()
            for i in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)],
                                                       parameters={"index": i, "last": i == 1}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
# Sends a response every 20 ms until its request is cancelled (then CANCELLED and final),
# at most 500: OUTPUT0 carries how many it sent before it saw the cancellation.
UNTIL_CANCELLED_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(500):
                if r.is_cancelled():
                    error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                    sender.send(pb_utils.InferenceResponse(error=error),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.full(4, i, np.float32))]))
                time.sleep(0.02)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
# Reports, as JSON: the parameters() of a BLS call to "params" and of each response of one
# to "decoupled"; then cancels a call to "until_cancelled" after 3 responses and reports what
# came after.
BLS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            def call(model, decoupled=False, kind="good"):
                return pb_utils.InferenceRequest(model_name=model, inputs=[x], requested_output_names=["OUTPUT0"],
                                                 parameters={"kind": kind}).exec(decoupled=decoupled)
            report = {"unary": call("params").parameters(), "none": call("params", kind="none").parameters(),
                      "stream": [q.parameters() for q in call("decoupled", True)]}
            responses = call("until_cancelled", True)
            seen, errors = 0, []
            for q in responses:
                if q.has_error():
                    errors.append(q.error().code())
                    continue
                seen += 1
                if seen == 3:
                    responses.cancel()
            report.update(seen=seen, errors=errors, cancelled_code=pb_utils.TritonError.CANCELLED)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(report).encode()],
                                                                                     dtype=np.object_))]))
        return out
"""

# The cancellation part, from ``async def execute`` with ``await async_exec(decoupled=True)``.
BLS_ASYNC_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            responses = await pb_utils.InferenceRequest(
                model_name="until_cancelled", inputs=[x], requested_output_names=["OUTPUT0"]).async_exec(decoupled=True)
            seen, errors = 0, []
            for q in responses:
                if q.has_error():
                    errors.append(q.error().code())
                    continue
                seen += 1
                if seen == 3:
                    responses.cancel()
            report = {"seen": seen, "errors": errors, "cancelled_code": pb_utils.TritonError.CANCELLED}
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(report).encode()],
                                                                                     dtype=np.object_))]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("parameter_models")
    write_model(repo, "params", config=IDENTITY.format(name="params", extra=""), model_py=PARAMS_PY)
    decoupled = "model_transaction_policy { decoupled: true }"
    write_model(repo, "decoupled", config=IDENTITY.format(name="decoupled", extra=decoupled), model_py=DECOUPLED_PY)
    write_model(repo, "until_cancelled", config=IDENTITY.format(name="until_cancelled", extra=decoupled),
                model_py=UNTIL_CANCELLED_PY)
    write_model(repo, "bls", config=BLS_CONFIG, model_py=BLS_PY)
    write_model(repo, "bls_async", config=BLS_CONFIG.replace('"bls"', '"bls_async"'), model_py=BLS_ASYNC_PY)
    srv = ServerProcess(repo, tmp_path_factory.mktemp("parameters") / "server.log").start()
    yield srv
    srv.stop_cleanly()


def _input(mod):
    x = mod.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    return [x]


GOOD = {"flag": True, "count": -5, "big": 2**62, "text": "s"}


def test_http_response_carries_the_parameters(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert c.infer("params", _input(httpclient), parameters={"kind": "good"}).get_response()["parameters"] == GOOD
        for kind in ("none", "empty"):
            assert "parameters" not in c.infer("params", _input(httpclient), parameters={"kind": kind}).get_response()


def test_grpc_response_carries_the_parameters(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        params = c.infer("params", _input(grpcclient), parameters={"kind": "good"}).get_response().parameters
        assert params["flag"].bool_param is True and params["count"].int64_param == -5
        assert params["big"].int64_param == 2**62 and params["text"].string_param == "s"
        assert set(params) == set(GOOD)
        assert not c.infer("params", _input(grpcclient), parameters={"kind": "none"}).get_response().parameters


def test_streamed_responses_carry_their_parameters(server):
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(lambda result, error: got.put(error or result))
        c.async_stream_infer("decoupled", _input(grpcclient))
        for i in range(2):
            result = got.get(timeout=30)
            assert isinstance(result, grpcclient.InferResult), result
            params = result.get_response().parameters
            assert params["index"].int64_param == i and params["last"].bool_param is (i == 1)
        c.stop_stream()


@pytest.mark.parametrize("kind, words", [
    ("float", "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ("list", "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ("key", "Expect parameters keys to have type str, found type <class 'int'>"),
    ("json", "Expect parameters to be a dict, got <class 'str'>")])
def test_other_values_fail_the_request_with_tritons_words(server, kind, words):
    with httpclient.InferenceServerClient(server.http_url) as c:
        with pytest.raises(InferenceServerException, match="TritonModelException: " + words.replace("[", r"\[")):
            c.infer("params", _input(httpclient), parameters={"kind": kind})


def test_bls_reads_parameters_and_cancels_a_decoupled_call(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        report = json.loads(c.infer("bls", _input(httpclient)).as_numpy("OUT")[0])
    # parameters() is a JSON string: compact, as Triton writes a BLS response's
    assert report["unary"] == json.dumps(GOOD, separators=(",", ":"))
    assert report["none"] == "{}"
    assert [json.loads(p) for p in report["stream"]] == [{"index": 0, "last": False}, {"index": 1, "last": True}]
    # cancelled after 3: the called model saw it and ended with CANCELLED, far before its 500
    assert 3 <= report["seen"] < 100
    assert report["errors"] == [report["cancelled_code"]]


def test_an_async_bls_caller_cancels_its_decoupled_call(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        report = json.loads(c.infer("bls_async", _input(httpclient)).as_numpy("OUT")[0])
    assert 3 <= report["seen"] < 100 and report["errors"] == [report["cancelled_code"]]
