"""--http-header-forward-pattern / --grpc-header-forward-pattern, and the request parameters
Triton keeps for itself, end to end.

A matching header reaches the model as a string parameter (as Triton 2.51 does); one named
like a reserved key (sequence_id, priority, timeout, ...) or starting with ``triton_`` is
refused, and so is a request parameter starting with ``triton_`` (Triton 2.71's words and
statuses). The reserved keys keep their meaning as parameters. Both HTTP paths (the lean
infer route, and aiohttp through a percent-escaped URL) and both gRPC transports.
"""
from __future__ import annotations

import http.client
import json
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_shm.errors import InvalidArgument
from triton_shm.frontend.header_forward import HeaderForward, call_metadata

from .harness import ServerProcess
from .models import ECHO_CONFIG, ECHO_PY, write_model

pytestmark = pytest.mark.timeout(180)

HTTP_PATTERN, GRPC_PATTERN = "forward|^priority$|triton_|^sequence_id$", "^grpc-fwd|^timeout$|triton_"
INFER_PATHS = ["/v2/models/echo/infer", "/v2/models/ech%6F/infer"]  # the lean route, aiohttp
RESERVED_PREFIX = "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"forward_{request.param}")
    write_model(root / "models", "echo", config=ECHO_CONFIG, model_py=ECHO_PY)
    srv = ServerProcess(root / "models", root / "server.log", extra_args=[
        "--http-header-forward-pattern", HTTP_PATTERN, "--grpc-header-forward-pattern", GRPC_PATTERN,
        "--grpc-transport", request.param]).start()
    yield srv
    srv.stop_cleanly()


def _http(server, path: str, headers: dict[str, str], parameters: dict | None = None) -> tuple[int, dict]:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}],
            "outputs": [{"name": "PARAMS"}]}
    if parameters is not None:
        body["parameters"] = parameters
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, doc
    return 200, json.loads(doc["outputs"][0]["data"][0])


@pytest.mark.parametrize("path", INFER_PATHS)
def test_http_headers_reach_the_model(server, path):
    status, params = _http(server, path, {"my-forward": "x", "other": "y", "grpc-fwd-a": "z"}, {"p": 1})
    assert (status, params) == (200, {"p": 1, "my-forward": "x"})
    # as sent, and matched as sent
    assert _http(server, path, {"Forward-Upper": "V"}) == (200, {})
    assert _http(server, path, {"x-forward-Upper": "V"}) == (200, {"x-forward-Upper": "V"})


@pytest.mark.parametrize("path", INFER_PATHS)
@pytest.mark.parametrize("header", ["priority", "sequence_id", "triton_x", "my_triton_forward"])
def test_http_reserved_headers_are_refused(server, path, header):
    status, doc = _http(server, path, {header: "1"})
    if header == "my_triton_forward":  # only a name that starts with triton_ is reserved
        assert (status, doc) == (200, {header: "1"})
    else:
        assert (status, doc) == (400, {"error": f"Header '{header}' is reserved for Triton usage and cannot be "
                                                "forwarded."})


@pytest.mark.parametrize("path", INFER_PATHS)
def test_http_triton_parameters_are_refused(server, path):
    for params in ({"triton_x": 1}, {"triton_enable_empty_final_response": True}, {"ok": 1, "triton_": "a"}):
        assert _http(server, path, {}, params) == (400, {"error": RESERVED_PREFIX}), params
    # the reserved keys keep their meaning; the model does not see them
    assert _http(server, path, {}, {"priority": 1, "timeout": 10_000_000, "k": "v"}) == (200, {"k": "v"})
    # binary tensors: the request the lean route decodes in one pass
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1],
                                     "parameters": {"binary_data_size": 4}}],
                         "parameters": {"triton_x": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, header + b"\x01\x00\x00\x00", {"Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        assert (resp.status, json.loads(resp.read())) == (400, {"error": RESERVED_PREFIX})
    finally:
        conn.close()


def _grpc_infer(server, metadata: list[tuple[str, str]], parameters: dict | None = None):
    request = service_pb2.ModelInferRequest(model_name="echo")
    inp = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    inp.contents.int_contents.append(1)
    request.outputs.add(name="PARAMS")
    for key, value in (parameters or {}).items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=60)
    return json.loads(reply.raw_output_contents[0][4:])


def test_grpc_headers_reach_the_model(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        result = client.infer("echo", [inp], headers={"grpc-fwd-a": "x", "my-forward": "y"}, parameters={"p": 1})
        assert json.loads(result.as_numpy("PARAMS")[0]) == {"p": 1, "grpc-fwd-a": "x"}
    finally:
        client.close()
    assert _grpc_infer(server, [("grpc-fwd-b", "z")]) == {"grpc-fwd-b": "z"}


@pytest.mark.parametrize("header", ["timeout", "triton_x"])
def test_grpc_reserved_headers_are_refused(server, header):
    with pytest.raises(grpc.RpcError) as e:
        _grpc_infer(server, [(header, "1")])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"Header '{header}' is reserved for Triton usage and cannot be forwarded."


def test_grpc_triton_parameters_are_refused(server):
    with pytest.raises(grpc.RpcError) as e:
        _grpc_infer(server, [], {"triton_x": 1})
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                                 "following keys starting with 'triton_' are allowed: "
                                 "triton_enable_empty_final_response")
    # the one Triton allows, and the reserved keys with their meaning (the model sees neither)
    assert _grpc_infer(server, [], {"triton_enable_empty_final_response": True, "priority": 1, "k": "v"}) == \
        {"k": "v"}


def _stream(server, headers: dict[str, str], count: int = 2) -> list:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        for i in range(count):
            client.async_stream_infer("echo", [inp], request_id=str(i), parameters={"i": i})
        got = [results.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()
        client.close()
    return [error.message() if error is not None else json.loads(result.as_numpy("PARAMS")[0])
            for result, error in sorted(got, key=lambda r: r[0].get_response().id if r[0] is not None else "")]


def test_grpc_stream_headers_reach_every_request(server):
    assert _stream(server, {"grpc-fwd-s": "v", "other": "w"}) == [{"i": 0, "grpc-fwd-s": "v"},
                                                                   {"i": 1, "grpc-fwd-s": "v"}]


def test_grpc_stream_reserved_header_answers_each_request(server):
    """As Triton: each request of the stream is answered the error; the stream stays open."""
    assert _stream(server, {"triton_s": "1"}) == [
        "Header 'triton_s' is reserved for Triton usage and cannot be forwarded."] * 2


def test_tritonclient_refuses_them_itself(server):
    """What a tritonclient user sees for a triton_ parameter (the client's own check)."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="reserved"):
            client.infer("echo", [inp], parameters={"triton_x": 1})
    finally:
        client.close()


# --------------------------------------------------------------------------- units
def test_header_forward_unit():
    forward = HeaderForward("^a")
    params = {"p": 1}
    assert forward.parameters([("b", "1")], params) is params  # nothing matched: the same dict
    assert forward.parameters([("ab", "1"), ("b", "2")], params) == {"p": 1, "ab": "1"}
    assert params == {"p": 1}
    with pytest.raises(InvalidArgument, match="Header 'triton_a' is reserved"):
        HeaderForward("^").parameters([("triton_a", "1")], {})
    assert list(call_metadata([(b":path", b"/x"), (b"te", b"trailers"), (b"content-type", b"application/grpc"),
                               (b"user-agent", b"u"), (b"k", b"v")])) == [("user-agent", "u"), ("k", "v")]
    with pytest.raises(ValueError, match="invalid header forward pattern"):
        HeaderForward("(")
