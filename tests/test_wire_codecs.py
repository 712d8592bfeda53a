"""The protocol codecs, every datatype, both ways: a request as a client sends it decodes to
the tensor's wire bytes (little-endian, row-major, BYTES length-prefixed), and a response
the codec builds decodes in tritonclient to the same values. HTTP JSON, HTTP binary, gRPC
raw and typed contents."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_shm._proto import grpc_service_pb2 as pb
from triton_shm.core.data.types import InferRequest, InferResponse, OutputTensor, RequestedOutput
from triton_shm.errors import InvalidArgument
from triton_shm.frontend.grpc import codec as grpc_codec
from triton_shm.frontend.http import codec as http_codec

# datatype -> values, edge values included (JSON-representable: finite floats, UTF-8 strings)
VALUES: dict[str, list] = {
    "BOOL": [True, False, True],
    "UINT8": [0, 1, 255],
    "UINT16": [0, 1, 65535],
    "UINT32": [0, 1, 2**32 - 1],
    "UINT64": [0, 1, 2**64 - 1],
    "INT8": [-128, 0, 127],
    "INT16": [-(2**15), 0, 2**15 - 1],
    "INT32": [-(2**31), 0, 2**31 - 1],
    "INT64": [-(2**63), 0, 2**63 - 1],
    "FP16": [0.5, -65504.0, 2.0**-14],
    "FP32": [1.5, -3.4028234663852886e38, 1e-45],
    "FP64": [0.1, -1.7976931348623157e308, 5e-324],
    "BF16": [1.0, -2.0, 0.15625],
    "BYTES": ["", "héllo wörld", "日本"],
}
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64}
DATATYPES = list(VALUES)
NO_JSON = {"FP16", "BF16"}  # JSON has no half-precision numbers (Triton refuses them too)
SHAPE = [1, 3]


def wire(datatype: str) -> bytes:
    """The tensor's bytes as the protocols carry them, written out independently of the codecs."""
    values = VALUES[datatype]
    if datatype == "BYTES":
        items = [v.encode() for v in values]
        return b"".join(struct.pack("<I", len(b)) + b for b in items)
    if datatype == "BF16":  # the upper half of each float32
        return (np.array(values, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.array(values, dtype=np.dtype(NUMPY[datatype]).newbyteorder("<")).tobytes()


def expected_array(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([v.encode() for v in VALUES[datatype]], dtype=np.object_).reshape(SHAPE)
    return np.array(VALUES[datatype], dtype=NUMPY[datatype]).reshape(SHAPE)


def response_of(datatype: str) -> InferResponse:
    return InferResponse(model_name="m", model_version="1", id="r1",
                         outputs=[OutputTensor("OUT", datatype, list(SHAPE), wire(datatype))])


# --------------------------------------------------------------------------- HTTP requests
@pytest.mark.parametrize("datatype", DATATYPES)
def test_http_binary_request_decodes_to_the_wire_bytes(datatype):
    data = wire(datatype)
    header = json.dumps({"id": "r1", "inputs": [{"name": "IN", "datatype": datatype, "shape": SHAPE,
                                                "parameters": {"binary_data_size": len(data)}}]}).encode()
    request = http_codec.decode_infer_request("m", "", header + data, len(header))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", datatype, SHAPE)
    assert bytes(tensor.data) == data
    assert tensor.parameters == {}  # binary_data_size is framing, not a parameter


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in NO_JSON])
def test_http_json_request_decodes_to_the_wire_bytes(datatype):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": datatype, "shape": SHAPE,
                                   "data": [VALUES[datatype]]}]}).encode()  # nested, row-major
    (tensor,) = http_codec.decode_infer_request("m", "", body, None).inputs
    assert bytes(tensor.data) == wire(datatype)


@pytest.mark.parametrize("datatype", sorted(NO_JSON))
def test_http_json_request_refuses_half_precision(datatype):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": datatype, "shape": [1], "data": [1.0]}]}).encode()
    with pytest.raises(InvalidArgument) as e:
        http_codec.decode_infer_request("m", "", body, None)
    assert e.value.message == (f"receiving {datatype} data via JSON is not supported. Please use the binary "
                               "data format for input IN")


# --------------------------------------------------------------------------- HTTP responses
@pytest.mark.parametrize("datatype", DATATYPES)
def test_http_binary_response_decodes_in_tritonclient(datatype):
    request = InferRequest("m", outputs=[RequestedOutput("OUT", {"binary_data": True})])
    body, header_length = http_codec.encode_infer_response(response_of(datatype), request)
    assert body[header_length:] == wire(datatype)
    result = httpclient.InferResult.from_response_body(body, False, header_length)
    out = result.get_output("OUT")
    assert (out["datatype"], out["shape"]) == (datatype, SHAPE)
    if datatype != "BF16":  # tritonclient has no numpy type for BF16
        got = result.as_numpy("OUT")
        assert got.dtype == expected_array(datatype).dtype
        np.testing.assert_array_equal(got, expected_array(datatype))


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in NO_JSON])
def test_http_json_response_decodes_in_tritonclient(datatype):
    request = InferRequest("m", outputs=[RequestedOutput("OUT", {"binary_data": False})])
    body, header_length = http_codec.encode_infer_response(response_of(datatype), request)
    assert header_length is None
    doc = json.loads(body)
    data = doc["outputs"][0]["data"]  # flat, row-major, exact (FP32: the shortest text of each float32)
    if datatype == "FP32":
        np.testing.assert_array_equal(np.array(data, np.float32), np.array(VALUES[datatype], np.float32))
    else:
        assert data == VALUES[datatype]
    result = httpclient.InferResult.from_response_body(body, False, None)
    got = result.as_numpy("OUT")
    if datatype == "BYTES":
        assert got.reshape(-1).tolist() == VALUES[datatype]
    else:
        np.testing.assert_array_equal(got, expected_array(datatype))


@pytest.mark.parametrize("datatype", sorted(NO_JSON))
def test_http_json_response_refuses_half_precision(datatype):
    request = InferRequest("m", outputs=[RequestedOutput("OUT", {"binary_data": False})])
    with pytest.raises(InvalidArgument, match=f"sending {datatype} data via JSON is not supported"):
        http_codec.encode_infer_response(response_of(datatype), request)


# --------------------------------------------------------------------------- gRPC
def grpc_request(datatype: str, *, typed: bool) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", id="r1")
    tensor = msg.inputs.add(name="IN", datatype=datatype, shape=SHAPE)
    if not typed:
        msg.raw_input_contents.append(wire(datatype))
        return msg
    values = VALUES[datatype]
    field = {"BOOL": "bool_contents", "UINT64": "uint64_contents", "INT64": "int64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}.get(datatype)
    if field is None:  # the narrower integers travel in the 32-bit fields
        field = "uint_contents" if datatype.startswith("UINT") else "int_contents"
    getattr(tensor.contents, field).extend([v.encode() for v in values] if datatype == "BYTES" else values)
    return msg


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_raw_request_decodes_to_the_wire_bytes(datatype):
    msg = grpc_request(datatype, typed=False)
    (tensor,) = grpc_codec.decode_infer_request(msg).inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", datatype, SHAPE)
    assert bytes(tensor.data) == wire(datatype)
    # the hot path: raw contents split off the received bytes as views
    (split,) = grpc_codec.parse_infer_request(msg.SerializeToString()).inputs
    assert bytes(split.data) == wire(datatype)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in NO_JSON])
def test_grpc_typed_contents_decode_to_the_wire_bytes(datatype):
    (tensor,) = grpc_codec.decode_infer_request(grpc_request(datatype, typed=True)).inputs
    assert bytes(tensor.data) == wire(datatype)


def test_grpc_large_raw_request_is_split_into_views_of_the_message():
    data = np.arange(grpc_codec.SPLIT_THRESHOLD, dtype="<f4").tobytes()  # past the split threshold
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="IN", datatype="FP32", shape=[len(data) // 4])
    msg.raw_input_contents.append(data)
    (tensor,) = grpc_codec.parse_infer_request(msg.SerializeToString()).inputs
    assert isinstance(tensor.data, memoryview) and bytes(tensor.data) == data


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_response_decodes_in_tritonclient(datatype):
    body = grpc_codec.infer_response_bytes(response_of(datatype))
    msg = pb.ModelInferResponse.FromString(body)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r1")
    (out,) = msg.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("OUT", datatype, SHAPE)
    assert list(msg.raw_output_contents) == [wire(datatype)]
    if datatype != "BF16":
        got = grpcclient.InferResult(msg).as_numpy("OUT")
        np.testing.assert_array_equal(got, expected_array(datatype))


def test_grpc_framed_response_has_the_message_prefix():
    body = grpc_codec.infer_response_bytes(response_of("INT32"), framed=True)
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    assert pb.ModelInferResponse.FromString(body[5:]).raw_output_contents[0] == wire("INT32")
