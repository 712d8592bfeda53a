"""The common-shape HTTP infer codec (``frontend/http/common_shape``), both twins: what it
decodes equals what the general JSON parser decodes, what it encodes is byte for byte what
the general encoder writes, and whatever is not the common shape is left to the general
path (None, with the parsed document unchanged), so that path's answer or error stays the
only one. The same for a lean infer route's codec (RouteCodec), which also keeps what it
decoded and wrote before: its answers stay the same however often it is asked."""
from __future__ import annotations

import copy

import numpy as np
import orjson
import pytest

from triton_shm.core.data import types
from triton_shm.core.data.types import InferRequest, InferResponse, OutputTensor, RequestedOutput
from triton_shm.frontend.http import codec, common_shape_py
from triton_shm.frontend.http.infer import BINARY_TYPE, HEADER_LENGTH
from triton_shm.frontend.http.lean_request import Message, response_head

from .helpers import twin_params

try:  # the C build reads the C request/response types: only beside them
    from triton_shm.frontend.http import _common_shape
    if not types.USING_EXTENSION:
        _common_shape = None
except ImportError:  # not built
    _common_shape = None

IMPLEMENTATIONS = twin_params(common_shape_py, _common_shape, "extension not built or not in use")

F32 = np.arange(16, dtype="<f4").tobytes()


def binary_input(name: str, nbytes: int = 64, **params) -> dict:
    return {"name": name, "shape": [16], "datatype": "FP32", "parameters": {"binary_data_size": nbytes, **params}}


def body_of(doc: dict, binary: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(doc)
    return header + binary, len(header)


COMMON = [  # (header document, binary part)
    ({"inputs": [binary_input("INPUT0"), binary_input("INPUT1")], "parameters": {"binary_data_output": True}},
     F32 * 2),
    ({"id": "req-1", "inputs": [binary_input("IN", 64, tag="x", n=3, f=1.5, b=False)],
      "outputs": [{"name": "OUT0", "parameters": {"binary_data": True}}, {"name": "OUT1"}],
      "parameters": {"priority": 1, "custom": "v"}}, F32),
    ({"inputs": [{"name": "E", "shape": [0, 2**63 - 1], "datatype": "BYTES", "parameters": {"binary_data_size": 0}}]},
     b""),
    ({"inputs": []}, b""),
    ({"inputs": [binary_input("A"), binary_input("A")], "outputs": []}, F32 * 2),  # duplicates: core refuses
    ({"inputs": [binary_input("SMALL"), {**binary_input("BIG", 8192), "shape": [2048]}]},  # copied, and viewed
     F32 + bytes(range(256)) * 32),
    ({"inputs": [binary_input("IN")], "parameters": {"note": "n" * 5000}}, F32),  # a header too long to keep
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": 2**64 - 1, "sequence_start": True,
                                                     "sequence_end": False}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": "user-7", "sequence_end": True}}, F32),
]

NOT_COMMON = [  # each left to the general parser, which serves or refuses it
    ({"inputs": [{"name": "IN", "shape": [16], "datatype": "FP32", "data": list(range(16))}]}, b""),
    ({"inputs": [binary_input("IN", shared_memory_region="r")]}, F32),
    ({"inputs": [binary_input("IN")], "extra": {"deep": [1]}}, F32),
    ({"inputs": [{**binary_input("IN"), "extra": 1}]}, F32),
    ({"inputs": [binary_input("IN")], "outputs": [{"name": "O", "extra": 1}]}, F32),
    ({"inputs": [binary_input("IN")], "id": 5}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"binary_data_output": 1}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"nested": {"a": 1}}}, F32),
    # the sequence controls' types: the general parser refuses them in Triton's words
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": -1}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": True}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": 5.0}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": 5, "sequence_start": 1}}, F32),
    ({"inputs": [binary_input("IN")], "parameters": {"sequence_id": 5, "sequence_end": "x"}}, F32),
    ({"inputs": [binary_input("IN", 65)]}, F32),        # more than the body holds
    ({"inputs": [binary_input("IN", 32)]}, F32),        # bytes left over
    ({"inputs": [binary_input("IN", -1)]}, F32),
    ({"inputs": [binary_input("IN", True)]}, F32),
    ({"inputs": [{**binary_input("IN"), "shape": [True]}]}, F32),
    ({"inputs": [{**binary_input("IN"), "shape": [-1]}]}, F32),
    ({"inputs": [{**binary_input("IN"), "shape": [2**63]}]}, F32),
    ({"inputs": [{**binary_input("IN"), "datatype": "FP31"}]}, F32),
    ({"inputs": [{**binary_input("IN"), "name": 3}]}, F32),
    ({"inputs": [{"name": "IN", "shape": [16], "datatype": "FP32"}]}, F32),
    ({"inputs": [binary_input("IN")], "outputs": [{"name": "O", "parameters": {"binary_data": "yes"}}]}, F32),
    ({"inputs": [binary_input("IN")], "outputs": {"name": "O"}}, F32),
    ({"inputs": "IN"}, F32),
    ({}, b""),
]


def as_tuple(request: InferRequest) -> tuple:
    return (request.model_name, request.model_version, request.id, request.parameters,
            [(t.name, t.datatype, t.shape, bytes(t.data), t.parameters) for t in request.inputs],
            [(o.name, o.parameters) for o in request.outputs])


def general(doc: dict, body: bytes, header_length: int):
    """The general parser's answer: the request, or the refusal's type and words."""
    try:
        return as_tuple(codec.decode_document(copy.deepcopy(doc), "m", "2", memoryview(body), header_length))
    except Exception as e:  # noqa: BLE001 - any refusal, compared with the fast path's
        return type(e).__name__, str(e)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(COMMON)))
def test_common_requests_decode_as_the_general_parser_does(impl, index):
    doc, binary = COMMON[index]
    body, length = body_of(doc, binary)
    request = impl.decode_common(orjson.loads(body[:length]), "m", "2", memoryview(body), length)
    assert request is not None
    assert as_tuple(request) == general(doc, body, length)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(NOT_COMMON)))
def test_other_requests_are_left_unchanged_to_the_general_parser(impl, index):
    doc, binary = NOT_COMMON[index]
    body, length = body_of(doc, binary)
    parsed = orjson.loads(body[:length])
    assert impl.decode_common(parsed, "m", "2", memoryview(body), length) is None
    assert parsed == doc


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_non_object_document_is_left_to_the_general_parser(impl):
    assert impl.decode_common([1], "m", "", memoryview(b"[1]"), 3) is None


def outputs(*, shm: bool = False, params: dict | None = None) -> list[OutputTensor]:
    return [OutputTensor("OUT0", "FP32", [16], F32, dict(params or {})),
            OutputTensor("OUT1", "INT8", (2, 2), memoryview(b"\x01\x02\x03\x04"), dict(params or {})),
            OutputTensor("SHM", "FP32", [1], b"", {"shared_memory_region": "r"} if shm else {}, in_shared_memory=shm,
                         shm_byte_size=4 if shm else 0)]


BINARY_RESPONSES = [  # (response, request): every output binary or in shared memory
    (InferResponse("m", "1", outputs=outputs()[:2]), InferRequest("m", parameters={"binary_data_output": True})),
    (InferResponse("m", "1", id="r", parameters={"p": 1}, outputs=outputs(shm=True, params={"q": "v"})),
     InferRequest("m", outputs=[RequestedOutput("OUT0", {"binary_data": True}),
                                RequestedOutput("OUT1", {"binary_data": True})])),
    (InferResponse("m", "1", outputs=outputs(shm=True)[:2]),
     InferRequest("m", parameters={"binary_data_output": True},
                  outputs=[RequestedOutput("OUT0", {"binary_data": True})])),
]

JSON_RESPONSES = [  # some output goes out as JSON data, or nothing is binary
    (InferResponse("m", "1", outputs=outputs()[:2]), InferRequest("m")),
    (InferResponse("m", "1", outputs=outputs()[:2]),
     InferRequest("m", parameters={"binary_data_output": True}, outputs=[RequestedOutput("OUT1")])),
    (InferResponse("m", "1", outputs=outputs(shm=True)[2:]),
     InferRequest("m", parameters={"binary_data_output": True})),
    (InferResponse("m", "1"), InferRequest("m", parameters={"binary_data_output": True})),
]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(BINARY_RESPONSES)))
def test_binary_responses_encode_as_the_general_encoder_does(impl, index):
    response, request = BINARY_RESPONSES[index]
    assert impl.encode_common(response, request) == codec.encode_document(response, request)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(JSON_RESPONSES)))
def test_json_responses_are_left_to_the_general_encoder(impl, index):
    response, request = JSON_RESPONSES[index]
    assert impl.encode_common(response, request) is None


# -- RouteCodec: one infer route of the lean HTTP path -------------------------------------
DATE = b"Tue, 01 Dec 2026 18:00:00 GMT"


def http_response(response: InferResponse, request: InferRequest, connection: str) -> bytes:
    """The 200 response the lean path writes with the general encoder."""
    msg = Message()
    msg.keep_alive = connection != "Connection: close\r\n"
    msg.version = "1.0" if connection == "Connection: keep-alive\r\n" else "1.1"
    body, length = codec.encode_document(response, request)
    return response_head(msg, 200, BINARY_TYPE, len(body), {HEADER_LENGTH: str(length)}, DATE.decode()) + body


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(COMMON)))
def test_the_route_decodes_a_common_body_alike_every_time(impl, index):
    doc, binary = COMMON[index]
    body, length = body_of(doc, binary)
    route = impl.RouteCodec("m", "2")
    if not binary:  # no binary part: nothing a JSON request would gain here, the general parser decodes it
        assert route.decode(body, str(length)) is None
        return
    first, again = route.decode(body, str(length)), route.decode(body, str(length))
    assert as_tuple(first) == as_tuple(again) == general(doc, body, length)
    for a, b in zip(first.inputs, again.inputs):  # each request its own objects, as parsing gives it
        assert a.shape is not b.shape and a.parameters is not b.parameters
    assert first.parameters is not again.parameters
    assert all(a.parameters is not b.parameters for a, b in zip(first.outputs, again.outputs))
    # The same header framing a body of another size is no longer the common shape.
    assert route.decode(body + b"x", str(length)) is None
    assert route.decode(body[:-1], str(length)) is None


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(NOT_COMMON)))
def test_the_route_leaves_other_bodies_to_the_general_parser(impl, index):
    doc, binary = NOT_COMMON[index]
    body, length = body_of(doc, binary)
    route = impl.RouteCodec("m", "2")
    assert route.decode(body, str(length)) is None
    assert route.decode(body, str(length)) is None


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_route_leaves_odd_header_lengths_to_the_general_parser(impl):
    doc, binary = COMMON[0]
    body, length = body_of(doc, binary)
    route = impl.RouteCodec("m", "")
    for header_length in (None, "x", "", "0", "-3", str(len(body)), str(len(body) + 1), str(length - 1)):
        assert route.decode(body, header_length) is None
    assert route.decode(body, f" {length} ") is not None  # int() reads it, as the general path does
    assert route.decode(b"{" + body[1:length - 1] + b"]" + binary, str(length)) is None  # not JSON


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("connection", ["", "Connection: close\r\n", "Connection: keep-alive\r\n"])
@pytest.mark.parametrize("index", range(len(BINARY_RESPONSES)))
def test_the_route_writes_binary_responses_as_the_general_path_does(impl, index, connection):
    response, request = BINARY_RESPONSES[index]
    route = impl.RouteCodec("m", "")
    expected = http_response(response, request, connection)
    assert route.respond(response, request, DATE, connection.encode()) == expected
    assert route.respond(response, request, DATE, connection.encode()) == expected  # from what it keeps


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(JSON_RESPONSES)))
def test_the_route_leaves_json_responses_to_the_general_encoder(impl, index):
    response, request = JSON_RESPONSES[index]
    assert impl.RouteCodec("m", "").respond(response, request, DATE, b"") is None


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_route_follows_a_model_and_an_output_that_change(impl):
    route = impl.RouteCodec("m", "")
    request = InferRequest("m", parameters={"binary_data_output": True})
    for model, version, datatype, shape in [("m", "1", "FP32", [1]), ("m", "2", "INT32", (1,)),
                                            ("n\u00e9\"", "1", "UINT8", [4]), ("m", "1", "FP32", [2, 2])]:
        data = b"\x00" * 4 * (4 if shape == [2, 2] else 1)
        response = InferResponse(model, version, outputs=[OutputTensor("O\\", datatype, shape, data)])
        assert route.respond(response, request, DATE, b"") == http_response(response, request, "")
