"""The common-shape ModelInfer codec (``frontend/grpc/infer_wire``), both twins: what it
decodes equals what the protobuf path decodes, what it encodes is byte for byte what the
protobuf path encodes, and whatever is not the common shape is left to the protobuf path
(None), so that path's answer or error stays the only one."""
from __future__ import annotations

import numpy as np
import pytest

from triton_shm._proto import grpc_service_pb2 as pb
from triton_shm.core.data.types import InferResponse, OutputTensor
from triton_shm.frontend.grpc import codec, infer_wire_py
from triton_shm.frontend.grpc.infer_wire_py import FRAMED, PLAIN, STREAM

from .helpers import twin_params

try:
    from triton_shm.frontend.grpc import _infer_wire
except ImportError:  # not built
    _infer_wire = None

IMPLEMENTATIONS = twin_params(infer_wire_py, _infer_wire)


def protobuf_request(msg_bytes: bytes):
    """The protobuf path of ``codec.parse_infer_request``."""
    return codec.decode_infer_request(pb.ModelInferRequest.FromString(msg_bytes))


def as_tuple(request):
    return (request.model_name, request.model_version, request.id, request.parameters,
            [(t.name, t.datatype, t.shape, None if t.data is None else bytes(t.data), t.parameters)
             for t in request.inputs],
            [(o.name, o.parameters) for o in request.outputs])


def common_requests() -> list[bytes]:
    plain = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        plain.inputs.add(name=name, datatype="FP32", shape=[16])
        plain.raw_input_contents.append(np.arange(16, dtype="<f4").tobytes())
    full = pb.ModelInferRequest(model_name="módel", model_version="3", id="req-1")
    full.inputs.add(name="IN", datatype="INT64", shape=[-1, 0, 2**62, -(2**63)])
    full.inputs.add(name="EMPTY", datatype="BYTES", shape=[])
    full.raw_input_contents.extend([b"\x01" * 8, b""])
    full.outputs.add(name="OUT0")
    full.outputs.add(name="")
    no_data = pb.ModelInferRequest(model_name="m")
    no_data.inputs.add(name="IN", datatype="FP32", shape=[1])
    unpacked_shape = (b"\x0a\x01m" + b"\x2a" + bytes([len(t := b"\x0a\x02IN\x18\x02\x18\x03\x1a\x01\x04")]) + t
                      + b"\x3a\x00")  # shape [2, 3, 4]: unpacked elements and a packed run
    repeated_name = b"\x0a\x01a\x0a\x01b"  # a field given twice: the last wins
    return [plain.SerializeToString(), full.SerializeToString(), no_data.SerializeToString(),
            unpacked_shape, repeated_name, b""]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(common_requests())))
def test_common_requests_decode_as_protobuf_does(impl, index):
    data = common_requests()[index]
    got = impl.decode_request(data)
    assert got is not None
    assert as_tuple(got) == as_tuple(protobuf_request(data))
    for t in got.inputs:  # small raw contents are bytes of their own, as protobuf gives them
        assert t.data is None or type(t.data) is bytes
    assert as_tuple(impl.decode_request(memoryview(data))) == as_tuple(got)  # a view of a DATA payload


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_large_raw_contents_are_views_of_the_message(impl):
    data = np.arange(infer_wire_py.SPLIT_THRESHOLD, dtype="<f4").tobytes()
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="IN", datatype="FP32", shape=[len(data) // 4])
    msg.raw_input_contents.append(data)
    (tensor,) = impl.decode_request(msg.SerializeToString()).inputs
    assert isinstance(tensor.data, memoryview) and tensor.data == data


def unusual_requests() -> dict[str, bytes]:
    with_params = pb.ModelInferRequest(model_name="m")
    with_params.parameters["sequence_id"].int64_param = 5
    input_params = pb.ModelInferRequest(model_name="m")
    input_params.inputs.add(name="IN", datatype="FP32", shape=[1]).parameters["shared_memory_region"].string_param = "r"
    contents = pb.ModelInferRequest(model_name="m")
    contents.inputs.add(name="IN", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    output_params = pb.ModelInferRequest(model_name="m")
    output_params.outputs.add(name="OUT").parameters["binary_data"].bool_param = True
    count = pb.ModelInferRequest(model_name="m")
    count.inputs.add(name="IN", datatype="FP32", shape=[1])
    count.raw_input_contents.extend([b"1234", b"5678"])
    return {
        "request parameters": with_params.SerializeToString(),
        "input parameters": input_params.SerializeToString(),
        "typed contents": contents.SerializeToString(),
        "output parameters": output_params.SerializeToString(),
        "raw count differs from inputs": count.SerializeToString(),
        "unknown field": b"\x0a\x01m\x42\x00",
        "varint field at top level": b"\x08\x01",
        "invalid utf-8": b"\x0a\x02\xff\xfe",
        "truncated length": b"\x0a\x05ab",
        "truncated varint": b"\x0a\x80",
        "varint past 64 bits": b"\x2a\x0c\x18" + b"\xff" * 9 + b"\x02\x00",
        "truncated packed shape": b"\x2a\x03\x1a\x01\x80",
    }


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", sorted(unusual_requests()))
def test_unusual_requests_are_left_to_protobuf(impl, case):
    assert impl.decode_request(unusual_requests()[case]) is None


def responses() -> list[InferResponse]:
    f32 = np.arange(6, dtype="<f4")
    return [
        InferResponse("add_sub", "1", outputs=[OutputTensor("OUTPUT0", "FP32", [16], memoryview(bytes(64))),
                                                OutputTensor("OUTPUT1", "FP32", [16], bytes(64))]),
        InferResponse("módel", "12", id="r-1", outputs=[
            OutputTensor("A", "FP32", [2, 3], memoryview(f32).cast("B").cast("f", [2, 3])),  # not a byte view
            OutputTensor("B", "INT64", [-1, 0, 2**63 - 1], bytearray(b"x" * 3)),
            OutputTensor("SHM", "FP32", [4], b"", in_shared_memory=True, shm_byte_size=16),
            OutputTensor("SCALAR", "BOOL", [], b"\x01")]),
        InferResponse("m", "", outputs=[]),
    ]


def protobuf_response(resp: InferResponse, final) -> bytes:
    parts, _ = codec._response_parts(resp, final)
    return b"".join(parts)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("index", range(len(responses())))
@pytest.mark.parametrize("final", [None, True, False])
def test_responses_encode_as_protobuf_does(impl, index, final):
    expected = protobuf_response(responses()[index], final)
    if final is None:
        assert impl.encode_response(responses()[index], None, PLAIN) == expected
        assert impl.encode_response(responses()[index], None, FRAMED) == \
            b"\x00" + len(expected).to_bytes(4, "big") + expected
    stream = impl.encode_response(responses()[index], final, STREAM)
    assert stream == pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse.FromString(expected)).SerializeToString()
    assert pb.ModelStreamInferResponse.FromString(stream).infer_response.SerializeToString() == expected


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_unusual_responses_are_left_to_protobuf(impl):
    data = np.zeros((4, 4), "<f4")[:, ::2]  # not contiguous
    cases = [
        InferResponse("m", "1", parameters={"sequence_id": 3}),
        InferResponse("m", "1", outputs=[OutputTensor("O", "FP32", [1], b"1234", parameters={"x": 1})]),
        InferResponse("m", "1", outputs=[OutputTensor("O", "FP32", [4, 2], memoryview(data))]),
        InferResponse("m", "1", outputs=[OutputTensor("O", "FP32", [1.5], b"1234")]),
        InferResponse("m", "1", outputs=[OutputTensor("O", "FP32", [2**63], b"1234")]),
        InferResponse("m\udc80", "1"),
    ]
    for resp in cases:
        assert impl.encode_response(resp, None, PLAIN) is None


def test_the_codec_answers_unusual_responses_through_protobuf():
    resp = InferResponse("m", "1", parameters={"sequence_id": 3},
                         outputs=[OutputTensor("O", "FP32", [1], b"1234")])
    msg = pb.ModelInferResponse.FromString(codec.infer_response_bytes(resp))
    assert msg.parameters["sequence_id"].int64_param == 3 and list(msg.raw_output_contents) == [b"1234"]
