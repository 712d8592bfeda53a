"""ModelInferRequest/ModelInferResponse in their common shape, straight from and to wire bytes.

Twin of ``_infer_wire.pyx`` (same API and results). The common shape is what
tritonclient sends for a plain inference: names, datatypes, shapes and
raw_input_contents, no parameters, no typed ``contents``, and a response with no
parameters (a stream response may carry the final flag). Anything else, including
any encoding the protobuf parser might judge differently (an unknown field, a
malformed varint, invalid UTF-8), makes ``decode_request``/``encode_response`` return
None, and ``codec.py`` takes its protobuf path, which gives the answer or the error
for it. Building no protobuf objects saves their construction, the field-by-field
copy into the core types and, for a response, the serialization.
"""
from __future__ import annotations

import operator
from typing import Any

from ...core.data.types import InferRequest, InferResponse, InputTensor, RequestedOutput

# Below this, raw_input_contents become bytes of their own (as the protobuf parser
# gives them); from it on, views of the message (copying them would cost more).
SPLIT_THRESHOLD = 64 * 1024

# encode_response's ``mode``: the message as it is, with the 5-byte gRPC prefix in
# front, or wrapped as ModelStreamInferResponse.infer_response (field 2).
PLAIN, FRAMED, STREAM = 0, 1, 2

_FINAL_KEY = b"triton_final_response"


class _Unusual(Exception):
    """Not the common shape: the protobuf path decides."""


def _varint(data: Any, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        b = data[pos]
        pos += 1
        if shift == 63 and b > 1:  # past 64 bits: the protobuf parser's call
            raise _Unusual
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise _Unusual  # truncated


def _length(data: Any, pos: int, end: int) -> tuple[int, int]:
    """A length-delimited field's (start, end)."""
    size, pos = _varint(data, pos, end)
    if size > end - pos:
        raise _Unusual
    return pos, pos + size


def _text(data: Any, start: int, end: int) -> str:
    try:
        return bytes(data[start:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusual from None


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _input(data: Any, pos: int, end: int) -> InputTensor:
    name = datatype = ""
    shape: list[int] = []
    while pos < end:
        tag, pos = _varint(data, pos, end)
        if tag == 0x18:  # shape, one unpacked element
            value, pos = _varint(data, pos, end)
            shape.append(_int64(value))
            continue
        if tag & 7 != 2:
            raise _Unusual
        start, pos = _length(data, pos, end)
        if tag == 0x0A:
            name = _text(data, start, pos)
        elif tag == 0x12:
            datatype = _text(data, start, pos)
        elif tag == 0x1A:  # shape, packed
            while start < pos:
                value, start = _varint(data, start, pos)
                shape.append(_int64(value))
        else:  # parameters, contents, unknown fields
            raise _Unusual
    return InputTensor(name, datatype, shape, None, {})


def _output(data: Any, pos: int, end: int) -> RequestedOutput:
    name = ""
    while pos < end:
        tag, pos = _varint(data, pos, end)
        if tag != 0x0A:  # parameters, unknown fields
            raise _Unusual
        start, pos = _length(data, pos, end)
        name = _text(data, start, pos)
    return RequestedOutput(name, {})


def decode_request(message: bytes | memoryview) -> InferRequest | None:
    """The InferRequest of a ModelInferRequest in the common shape, else None."""
    data = message if isinstance(message, bytes) else memoryview(message).cast("B")
    pos, end = 0, len(data)
    model = version = request_id = ""
    inputs: list[InputTensor] = []
    outputs: list[RequestedOutput] = []
    raw: list[tuple[int, int]] = []
    try:
        while pos < end:
            tag, pos = _varint(data, pos, end)
            if tag & 7 != 2:
                return None
            start, pos = _length(data, pos, end)
            if tag == 0x3A:
                raw.append((start, pos))
            elif tag == 0x2A:
                inputs.append(_input(data, start, pos))
            elif tag == 0x0A:
                model = _text(data, start, pos)
            elif tag == 0x12:
                version = _text(data, start, pos)
            elif tag == 0x1A:
                request_id = _text(data, start, pos)
            elif tag == 0x32:
                outputs.append(_output(data, start, pos))
            else:  # parameters, unknown fields
                return None
    except _Unusual:
        return None
    if raw:
        if len(raw) != len(inputs):  # the protobuf path words the error
            return None
        if end >= SPLIT_THRESHOLD:
            view = memoryview(data)
            for t, (start, stop) in zip(inputs, raw):
                t.data = view[start:stop]
        else:
            for t, (start, stop) in zip(inputs, raw):
                t.data = bytes(data[start:stop])
    return InferRequest(model, version, request_id, {}, inputs, outputs)


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # a negative int64 is ten bytes of two's complement
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _dim(value: Any) -> int:
    d = operator.index(value)  # TypeError for what is not an integer, as protobuf refuses it
    if not -(1 << 63) <= d < 1 << 63:
        raise _Unusual
    return d


def _field(tag: bytes, value: bytes) -> bytes:
    return tag + _varint_bytes(len(value)) + value if value else b""


def _utf8(text: Any) -> bytes:
    if type(text) is not str:
        raise _Unusual
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Unusual from None


def _raw_view(data: Any) -> Any:
    """``data`` as a flat byte buffer, or _Unusual when it is not a contiguous one."""
    try:
        view = memoryview(data)
    except TypeError:
        raise _Unusual from None
    if not view.c_contiguous:
        raise _Unusual
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def encode_response(resp: InferResponse, final: bool | None, mode: int) -> bytes | None:
    """The ModelInferResponse of ``resp`` (``mode``: PLAIN, FRAMED or STREAM) with the
    final flag when ``final`` is not None, or None when ``resp`` carries parameters
    or data that is not a flat buffer. Does not release ``resp``."""
    if resp.parameters:
        return None
    try:
        parts = [_field(b"\x0a", _utf8(resp.model_name)), _field(b"\x12", _utf8(resp.model_version)),
                 _field(b"\x1a", _utf8(resp.id))]
        if final is not None:  # parameters{"triton_final_response": bool_param}
            entry = _field(b"\x0a", _FINAL_KEY) + b"\x12\x02\x08" + (b"\x01" if final else b"\x00")
            parts.append(b"\x22" + _varint_bytes(len(entry)) + entry)
        views = []
        for out in resp.outputs:
            if out.parameters:
                return None
            shape = b"".join(_varint_bytes(_dim(d)) for d in out.shape)
            tensor = (_field(b"\x0a", _utf8(out.name)) + _field(b"\x12", _utf8(out.datatype))
                      + _field(b"\x1a", shape))
            parts += (b"\x2a", _varint_bytes(len(tensor)), tensor)
            views.append(_raw_view(out.data))
    except (_Unusual, TypeError, ValueError, OverflowError):
        return None
    for view in views:  # one entry per output, even empty ones: tritonclient indexes by position
        parts += (b"\x32", _varint_bytes(view.nbytes), view)
    size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    if mode == FRAMED:
        parts.insert(0, b"\x00" + size.to_bytes(4, "big"))
    elif mode == STREAM:
        parts.insert(0, b"\x12" + _varint_bytes(size))
    return b"".join(parts)
