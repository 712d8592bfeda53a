"""ModelInferRequest/ModelInferResponse <-> the protocol-neutral core types.

Tensor data stays in wire encoding: raw contents pass through uncopied, typed
``contents`` are packed once into the same little-endian layout. Decoding mirrors
Triton's ``InferGRPCToInput`` (server:src/grpc/infer_handler.cc), including its
error messages, so clients see the same failures from both servers.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..._proto import grpc_service_pb2 as pb
from ...core.data.codec import serialize_bytes
from ...core.data.types import (
    SHM_PARAMETERS,
    Buffer,
    InferRequest,
    InferResponse,
    InputTensor,
    ParamValue,
    RequestedOutput,
)
from ...errors import InvalidArgument
from .infer_wire_py import SPLIT_THRESHOLD  # below it, upb parsing everything beats splitting the raw off
from .infer_wire import FRAMED, PLAIN, STREAM, decode_request, encode_response

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

# InferTensorContents field -> the datatypes it may carry, and the numpy dtype of the
# proto's repeated field (narrower INT/UINT types are truncated from it, as Triton does).
_CONTENT_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "bool_contents": (("BOOL",), "?"),
    "int_contents": (("INT8", "INT16", "INT32"), "<i4"),
    "int64_contents": (("INT64",), "<i8"),
    "uint_contents": (("UINT8", "UINT16", "UINT32"), "<u4"),
    "uint64_contents": (("UINT64",), "<u8"),
    "fp32_contents": (("FP32",), "<f4"),
    "fp64_contents": (("FP64",), "<f8"),
    "bytes_contents": (("BYTES",), "O"),
}
_WIRE_DTYPE = {"BOOL": "?", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
               "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
               "FP32": "<f4", "FP64": "<f8"}


# -- parameters ----------------------------------------------------------------------------
def decode_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    if not len(params):  # the common case; iterating a protobuf map costs more than asking its size
        return {}
    out: dict[str, ParamValue] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidArgument(f"parameter '{key}' has no value set")
        out[key] = getattr(param, which)
    return out


def decode_output_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    """A requested output's parameters: ``decode_parameters``, and a class count as Triton's
    gRPC front-end takes it (an int64_param above 0)."""
    if not len(params):
        return {}
    out = decode_parameters(params)
    if "classification" in out:
        if params["classification"].WhichOneof("parameter_choice") != "int64_param":
            raise InvalidArgument("invalid value type for 'classification' parameter, expected int64_param")
        if out["classification"] <= 0:  # type: ignore[operator]  # an int64_param: an int
            raise InvalidArgument("invalid value for 'classification' parameter, expected >= 0")
    return out


# Request parameters the front-end reads itself, with the value types they may take and
# Triton's words for any other: a sequence_id of 2**63 and above comes as a negative
# int64_param (C++ clients cast the unsigned ID), read back as the same 64 bits unsigned.
_CONTROL_TYPES: dict[str, tuple[tuple[str, ...], str]] = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
}


# The only "triton_" request parameter a gRPC client may send (Triton's list).
_TRITON_ALLOWED = "triton_enable_empty_final_response"


def decode_request_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    """A request's own parameters: ``decode_parameters``, the sequence controls' types, and
    the "triton_" keys Triton keeps for itself refused."""
    if not len(params):
        return {}
    out: dict[str, ParamValue] = {}
    for key, param in params.items():
        if key.startswith("triton_") and key != _TRITON_ALLOWED:
            raise InvalidArgument("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                                  f"following keys starting with 'triton_' are allowed: {_TRITON_ALLOWED}")
        which = param.WhichOneof("parameter_choice")
        control = _CONTROL_TYPES.get(key)
        if control is not None:
            if which not in control[0]:
                raise InvalidArgument(f"invalid value type for '{key}' parameter, expected {control[1]}.")
            value = getattr(param, which)
            if which == "int64_param" and value < 0:
                value += 1 << 64
            out[key] = value
            continue
        if which is None:
            raise InvalidArgument(f"parameter '{key}' has no value set")
        out[key] = getattr(param, which)
    return out


def encode_parameters(params: Mapping[str, Any], target: Any) -> None:
    """Fill a protobuf ``map<string, InferParameter>`` from Python values."""
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):  # before int: bool is an int subclass
            p.bool_param = value
        elif isinstance(value, (int, np.integer)):
            value = int(value)
            if _INT64_MIN <= value <= _INT64_MAX:
                p.int64_param = value
            elif 0 <= value <= _UINT64_MAX:
                p.uint64_param = value
            else:
                p.string_param = str(value)
        elif isinstance(value, (float, np.floating)):
            p.double_param = float(value)
        else:
            p.string_param = value if isinstance(value, str) else str(value)


# -- request -------------------------------------------------------------------------------
def _contents_to_wire(tensor: pb.ModelInferRequest.InferInputTensor, model: str) -> bytes:
    """Pack typed ``contents`` into wire bytes, checking they fit the datatype."""
    datatype = tensor.datatype
    contents = tensor.contents
    data: bytes | None = None
    for field, (datatypes, field_dtype) in _CONTENT_FIELDS.items():
        values = getattr(contents, field)
        if not len(values):
            continue
        if data is not None:
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
                f"'{model}', binary data was already supplied.")
        if datatype not in datatypes:
            # Name the type the field carries the way Triton does (int_contents on an
            # INT8 input is INT8; otherwise INT32). FP16/BF16 match no field: raw only.
            got = datatypes[-1] if len(datatypes) > 1 else datatypes[0]
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
                f"'{model}' of type '{got}', expected datatype '{datatype}'")
        if datatype == "BYTES":
            data = serialize_bytes(np.array(list(values), dtype=np.object_))
        else:
            arr = np.array(values, dtype=field_dtype)
            wire = _WIRE_DTYPE[datatype]
            if wire != field_dtype:  # INT8/16, UINT8/16: keep the low bytes, like Triton
                arr = arr.astype(wire)
            data = arr.tobytes()
    return b"" if data is None else data  # contents present but empty: zero bytes


def decode_infer_request(msg: pb.ModelInferRequest, raw: list[memoryview] | None = None) -> InferRequest:
    """Translate a ModelInferRequest; raises InvalidArgument on malformed tensors.
    ``raw`` replaces the message's raw_input_contents (views split off by
    ``parse_infer_request``)."""
    model = msg.model_name
    if raw is None:
        raw = msg.raw_input_contents
    # Raw entries belong, in order, to the inputs that carry data in the message: an
    # input in shared memory takes none (tritonclient sends none for it, and Triton
    # consumes them the same way). One pass decodes; the count is checked before any
    # content error is raised, as the messages were checked in that order before.
    inputs: list[InputTensor] = []
    takes_raw: list[InputTensor] = []
    error: str | None = None
    for tensor in msg.inputs:  # duplicate names are refused by core validation
        params = decode_parameters(tensor.parameters)
        has_contents = tensor.HasField("contents")
        data: Buffer | None = None
        in_shm = bool(params) and any(k in params for k in SHM_PARAMETERS)
        if in_shm:
            if has_contents and error is None:
                error = (f"unexpected 'content' provided when using shared memory for input "
                         f"tensor '{tensor.name}' for model '{model}'")
                if not raw:  # no count to check first
                    raise InvalidArgument(error)
            # data stays None: the core resolves the region from the parameters.
        elif raw:
            if has_contents and error is None:
                error = (f"contents field must not be specified when using raw_input_contents "
                         f"for '{tensor.name}' for model '{model}'")
        elif has_contents:
            data = _contents_to_wire(tensor, model)
        t = InputTensor(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape),
                        data=data, parameters=params)
        inputs.append(t)
        if raw and not in_shm:
            takes_raw.append(t)
    if raw:
        if len(raw) != len(takes_raw):
            raise InvalidArgument(
                f"expected {len(takes_raw)} raw_input_contents entries (one per input not in "
                f"shared memory) but got {len(raw)} for model '{model}'")
        for t, data in zip(takes_raw, raw):
            t.data = data  # bytes held by the message, or a view of the body: no copy
    if error is not None:
        raise InvalidArgument(error)

    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        parameters=decode_request_parameters(msg.parameters),
        inputs=inputs,
        outputs=[RequestedOutput(name=o.name, parameters=decode_output_parameters(o.parameters))
                 for o in msg.outputs],
    )


# -- wire bytes ----------------------------------------------------------------------------
_RAW_INPUT_TAG = (7 << 3) | 2  # ModelInferRequest.raw_input_contents, length-delimited
_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents (field 6, length-delimited)
_STREAM_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response (field 2)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]  # IndexError past the end: caller falls back to the full parser
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]] | None:
    """The message without its raw_input_contents, and those entries as views of
    ``data``; None if the top level is not the expected all-length-delimited shape."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    pos = start = 0
    n = len(data)
    try:
        while pos < n:
            field_start = pos
            tag, pos = _read_varint(data, pos)
            if tag & 7 != 2:
                return None
            length, pos = _read_varint(data, pos)
            end = pos + length
            if end > n:
                return None
            if tag == _RAW_INPUT_TAG:
                rest.append(view[start:field_start])
                raw.append(view[pos:end])
                start = end
            pos = end
    except (IndexError, ValueError):
        return None
    rest.append(view[start:])
    return b"".join(rest), raw


def parse_infer_request(data: bytes) -> InferRequest:
    """ModelInferRequest bytes -> InferRequest. Large tensors stay views of ``data``
    (upb would copy each raw entry into a bytes object of its own). The common shape
    is decoded straight from the bytes (``infer_wire``); the rest by protobuf."""
    request = decode_request(data)
    if request is not None:
        return request
    if len(data) >= SPLIT_THRESHOLD and (split := _split_raw_inputs(data)) is not None:
        head, raw = split
        return decode_infer_request(pb.ModelInferRequest.FromString(head), raw)
    return decode_infer_request(pb.ModelInferRequest.FromString(data))


def _byte_view(data: Buffer) -> Buffer:
    if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1):
        return data.cast("B") if data.c_contiguous else memoryview(data.tobytes())
    return data


def _response_head(resp: InferResponse, final: bool | None) -> bytes:
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    encode_parameters(resp.parameters, msg.parameters)
    if final is not None:
        msg.parameters["triton_final_response"].bool_param = final
    for out in resp.outputs:
        t = msg.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        encode_parameters(out.parameters, t.parameters)
    return msg.SerializeToString()


def _response_parts(resp: InferResponse, final: bool | None) -> tuple[list[Buffer], int]:
    parts: list[Buffer] = [_response_head(resp, final)]
    for out in resp.outputs:  # one entry per output, even empty ones: tritonclient indexes by position
        data = _byte_view(out.data)
        parts += (_RAW_OUTPUT_TAG, varint(len(data)), data)
    return parts, sum(len(p) for p in parts)


def infer_response_bytes(resp: InferResponse, framed: bool = False) -> bytes:
    """The ModelInferResponse as bytes, built by one join (tensor data copied once),
    with the 5-byte gRPC message prefix in front when ``framed``; releases ``resp``."""
    try:
        message = encode_response(resp, None, FRAMED if framed else PLAIN)
        if message is not None:
            return message
        parts, size = _response_parts(resp, None)
        if framed:
            parts.insert(0, b"\x00" + size.to_bytes(4, "big"))
        return b"".join(parts)
    finally:
        resp.release()


def stream_response_bytes(resp: InferResponse, final: bool | None) -> bytes:
    """A ModelStreamInferResponse carrying ``resp`` (releases it)."""
    try:
        message = encode_response(resp, final, STREAM)
        if message is not None:
            return message
        parts, size = _response_parts(resp, final)
        return b"".join((_STREAM_RESPONSE_TAG, varint(size), *parts))
    finally:
        resp.release()


# -- statistics ----------------------------------------------------------------------------
_BATCH_PHASES = ("compute_input", "compute_infer", "compute_output")


def encode_model_statistics(stats: Mapping[str, Any]) -> pb.ModelStatisticsResponse:
    """The statistics extension's dict as protobuf, field by field: json_format.ParseDict
    is pure Python and takes milliseconds for a model with many batch sizes, and
    perf_analyzer asks for statistics around every measurement window."""
    resp = pb.ModelStatisticsResponse()
    for m in stats["model_stats"]:
        ms = resp.model_stats.add(name=m["name"], version=m["version"], last_inference=m["last_inference"],
                                  inference_count=m["inference_count"], execution_count=m["execution_count"])
        for phase, d in m["inference_stats"].items():
            duration = getattr(ms.inference_stats, phase)
            duration.count, duration.ns = d["count"], d["ns"]
        for b in m["batch_stats"]:
            bs = ms.batch_stats.add(batch_size=b["batch_size"])
            for phase in _BATCH_PHASES:
                duration = getattr(bs, phase)
                duration.count, duration.ns = b[phase]["count"], b[phase]["ns"]
    return resp
