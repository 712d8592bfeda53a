"""KServe V2 HTTP/JSON <-> core types, including Triton's binary tensor extension.

Pure functions, no aiohttp: ``decode_infer_request`` turns a request body into an
:class:`InferRequest` whose binary tensors are zero-copy views into the body;
``encode_infer_response`` builds the response body. Error messages copy Triton's where
it has one; malformed input is always an :class:`InvalidArgument` (400), never a 500.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import orjson

from ...core.data.codec import deserialize_bytes, serialize_bytes
from ...core.data.datatypes import DATATYPES, numpy_dtype
from ...core.data.types import (
    Buffer,
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    ParamValue,
    RequestedOutput,
    request_id_prefix,
)
from ...errors import Internal, InvalidArgument, TritonShmError, Unsupported
from .common_shape import decode_common, encode_common
from ..header_forward import RESERVED_PREFIX_ERROR
from .common_shape_py import CONTROL_PARAMETERS, control_parameter_ok, response_header

# Triton's HTTP_MAX_JSON_NESTING_DEPTH (server#8172). orjson stops at 1024 by itself,
# so shallower excess is checked on the parsed document (see _check_depth).
MAX_JSON_DEPTH = 100
INT64_MAX = 2**63 - 1

_INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_FLOAT_TYPES = frozenset({"FP32", "FP64"})
# Keys of an input's ``parameters`` that say where its data is; at most one may be set.
_DATA_SOURCES = ("binary_data_size", "shared_memory_region")
# Members the parser interprets (and so bounds) at each level of the request document.
_REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
_INPUT_KEYS = frozenset({"name", "datatype", "shape", "parameters", "data"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})


# --------------------------------------------------------------------------- decoding
def decode_infer_request(
    model_name: str, model_version: str, body: bytes, header_length: int | None
) -> InferRequest:
    """Parse an infer request body.

    ``header_length`` is the ``Inference-Header-Content-Length`` value (None when the
    header is absent: the whole body is JSON). Binary inputs reference slices of
    ``body``, so it must stay alive (and unmodified) while the request is in use.
    """
    size = len(body)
    if header_length is None:
        header_length = size
    elif header_length < 0 or header_length > size:
        raise InvalidArgument(f"inference header size should be in range (0, {size}), got: {header_length}")
    elif header_length == 0:
        # Raw binary requests need the model config to name the single input; the
        # adapter has none, and no client we target sends them.
        raise Unsupported(
            "raw binary inference requests (Inference-Header-Content-Length: 0) are not "
            "supported; send a JSON header and the tensor with 'binary_data_size'")
    view = memoryview(body)
    try:
        doc = orjson.loads(view[:header_length] if header_length < size else body)
    except orjson.JSONDecodeError as e:
        raise _json_error(e) from None
    request = decode_common(doc, model_name, model_version, view, header_length)
    if request is not None:  # what clients send, decided in one pass (common_shape_py says which)
        return request
    return decode_document(doc, model_name, model_version, view, header_length)


def decode_document(doc: Any, model_name: str, model_version: str, view: memoryview,
                    header_length: int) -> InferRequest:
    """The general parser: the request from its parsed JSON header ``doc``, the binary part
    of the body ``view`` from ``header_length`` on. Every refusal is worded here."""
    size = len(view)
    if not isinstance(doc, dict):
        raise InvalidArgument("the request JSON must be an object")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("request 'id' must be a string")
    request = InferRequest(model_name=model_name, model_version=model_version, id=request_id)
    request.parameters = _parse_request_parameters(doc.get("parameters"))
    if "binary_data_output" in request.parameters and not isinstance(request.parameters["binary_data_output"], bool):
        raise InvalidArgument("parameter 'binary_data_output' must be a boolean")

    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidArgument("request 'inputs' must be an array" if inputs is not None
                              else "request has no 'inputs' array")
    offset = header_length  # next unread byte of the binary part
    for item in inputs:  # duplicate names are refused by core validation
        tensor, nbytes = _parse_input(item, model_name, request_id)
        if nbytes is not None:
            if nbytes > size - offset:
                raise InvalidArgument(
                    f"unexpected size for input '{tensor.name}', expecting "
                    f"{nbytes - (size - offset)} additional bytes for model '{model_name}'")
            tensor.data = view[offset:offset + nbytes]
            offset += nbytes
        request.inputs.append(tensor)
    if offset != size:
        raise InvalidArgument(f"unexpected additional input data for model '{model_name}'")

    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise InvalidArgument("request 'outputs' must be an array")
        request.outputs.extend(_parse_output(item) for item in outputs)

    _check_unknown_members(doc, _REQUEST_KEYS, 2)
    return request


def _walk_numbers(data: list) -> bool:
    """Bound the nesting of tensor ``data`` (it sits at level 4 of the document) and say
    whether it holds a JSON boolean; iterative, so no depth reaches Python's recursion limit."""
    has_bool = False
    stack: list[tuple[Any, int]] = [(data, 4)]
    while stack:
        v, d = stack.pop()
        if d > MAX_JSON_DEPTH:
            raise InvalidArgument(f"JSON nesting depth exceeds the limit of {MAX_JSON_DEPTH}")
        for x in v:
            if isinstance(x, list):
                stack.append((x, d + 1))
            elif type(x) is bool:
                has_bool = True
    return has_bool


def _exact_uint64(name: str, data: Any) -> np.ndarray:
    flat = np.asarray(data, dtype=np.object_).reshape(-1)
    if not all(type(x) is int and 0 <= x < 2**64 for x in flat):
        raise InvalidArgument(f"input '{name}': 'data' elements do not match datatype UINT64")
    return np.array(flat.tolist(), dtype=np.uint64)


def _json_error(e: orjson.JSONDecodeError) -> InvalidArgument:
    if "depth" in str(e) or "recursion" in str(e):
        return InvalidArgument(f"JSON nesting depth exceeds the limit of {MAX_JSON_DEPTH}")
    return InvalidArgument(f"failed to parse the request JSON buffer: {e}")


def _check_unknown_members(obj: dict, known: frozenset[str], depth: int) -> None:
    """Bound the nesting of members this parser does not interpret.

    Known members are shallow by construction (scalars, int lists, scalar-valued
    parameters) and tensor 'data' is bounded where it is converted, so only unknown
    members need a walk -- and well-formed requests have none, keeping this free.
    """
    if len(obj) > len(known) or not known.issuperset(obj):
        for key in obj.keys() - known:
            _check_depth(obj[key], depth)


def _check_depth(value: Any, depth: int) -> None:
    """Reject containers nested deeper than MAX_JSON_DEPTH (``depth`` is value's level)."""
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        children: Iterable[Any]
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if d > MAX_JSON_DEPTH:
            raise InvalidArgument(f"JSON nesting depth exceeds the limit of {MAX_JSON_DEPTH}")
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))


def _parse_parameters(value: Any, where: str) -> dict[str, ParamValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} 'parameters' must be an object")
    for key, v in value.items():
        # Triton accepts int, bool and string; double is in the parameters extension.
        if not isinstance(v, (bool, int, float, str)):
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', 'double' or 'string'.")
    return value


def _parse_request_parameters(value: Any) -> dict[str, ParamValue]:
    """A request's own parameters, the sequence controls and the "triton_" keys (Triton's
    own) refused in Triton's words."""
    if isinstance(value, dict):
        for key, v in value.items():
            if key.startswith("triton_"):
                raise InvalidArgument(RESERVED_PREFIX_ERROR)
            if key in CONTROL_PARAMETERS and not control_parameter_ok(key, v):
                wanted = "string" if key == "sequence_id" else "boolean"
                raise InvalidArgument(f"Unable to parse '{key}': attempt to access JSON non-{wanted} as {wanted}")
    return _parse_parameters(value, "request")


def _parse_shape(value: Any, name: str) -> list[int]:
    if not isinstance(value, list):
        raise InvalidArgument(f"input '{name}': 'shape' must be an array of non-negative integers")
    for d in value:
        # bool is an int subclass; JSON true is not a dimension.
        if type(d) is not int or d < 0 or d > INT64_MAX:
            raise InvalidArgument(
                f"input '{name}': 'shape' must be an array of non-negative integers, "
                f"got {orjson.dumps(value).decode()}")
    return value


def _parse_input(item: Any, model_name: str, request_id: str) -> tuple[InputTensor, int | None]:
    """One input; returns it and its ``binary_data_size`` (None when not binary)."""
    if not isinstance(item, dict):
        raise InvalidArgument("each entry of 'inputs' must be an object")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("input 'name' must be a string")
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidArgument(f"invalid datatype for input {name}")
    shape = _parse_shape(item.get("shape"), name)
    params = _parse_parameters(item.get("parameters"), f"input '{name}'")
    _check_unknown_members(item, _INPUT_KEYS, 4)

    has_data = "data" in item
    sources = (["data"] if has_data else []) + [k for k in _DATA_SOURCES if k in params]
    if len(sources) != 1:
        got = " ".join(f"'{k}'" for k in sources) if sources else None
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But "
            + (f"set {got}" if got else "no field is set"))

    tensor = InputTensor(name=name, datatype=datatype, shape=shape, parameters=params)
    if has_data:
        tensor.data = json_to_wire(name, datatype, shape, item["data"], model_name, request_id)
        return tensor, None
    if "binary_data_size" in params:
        nbytes = params.pop("binary_data_size")  # framing only; the core sees the data
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidArgument(f"input '{name}': 'binary_data_size' must be a non-negative integer")
        return tensor, nbytes
    return tensor, None  # shared memory: resolved by another layer from the parameters


def json_to_wire(
    name: str, datatype: str, shape: list[int], data: Any, model_name: str, request_id: str
) -> bytes:
    """JSON ``data`` (flat or nested, row-major) to the tensor's wire bytes."""
    if not isinstance(data, list):
        raise InvalidArgument(f"input '{name}': 'data' must be an array")
    count = math.prod(shape)
    if datatype == "BYTES":
        items = data if all(type(x) is str for x in data) else _flatten_strings(name, data)
        if len(items) != count:
            raise InvalidArgument(
                request_id_prefix(request_id) +
                f"expected {count} string elements for inference input '{name}' for model "
                f"'{model_name}', got {len(items)}")
        return serialize_bytes(items)
    if datatype in ("FP16", "BF16"):
        raise InvalidArgument(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}")
    if _walk_numbers(data) and datatype != "BOOL":
        # numpy would turn [true, 5] into [1, 5]; Triton rejects it, and so do we.
        raise InvalidArgument(f"input '{name}': 'data' elements do not match datatype {datatype}")
    try:
        # Infer the JSON's own type first so "1.5" for an int tensor is caught
        # instead of being silently cast.
        arr = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise InvalidArgument(f"input '{name}': 'data' is not a regular array of numbers") from None
    if arr.size != count:
        raise InvalidArgument(
            f"input '{name}': 'data' has {arr.size} elements but shape {shape} needs {count}")
    if count == 0:
        return b""
    kind = arr.dtype.kind
    target = numpy_dtype(datatype)
    if datatype == "BOOL":
        ok = kind == "b"
    elif datatype in _INT_TYPES:
        if kind in "fO" and datatype == "UINT64":
            # numpy turns ints above INT64_MAX into float64 (or objects); rebuild exactly.
            arr = _exact_uint64(name, data)
            kind = arr.dtype.kind
        ok = kind in "iu"
        info = np.iinfo(target)
        if ok and not (info.min <= int(arr.min()) and int(arr.max()) <= info.max):
            raise InvalidArgument(f"input '{name}': 'data' has values out of range for {datatype}")
    else:  # FP32, FP64
        ok = kind in "iuf"
    if not ok:
        raise InvalidArgument(f"input '{name}': 'data' elements do not match datatype {datatype}")
    return np.ascontiguousarray(arr, dtype=target).tobytes()


def _flatten_strings(name: str, data: list) -> list[str]:
    out: list[str] = []
    # Iterative walk with an explicit bound: data sits at level 4 of the document.
    stack: list[tuple[Any, int]] = [(data, 4)]
    while stack:
        v, d = stack.pop()
        if type(v) is str:
            out.append(v)
        elif isinstance(v, list):
            if d > MAX_JSON_DEPTH:
                raise InvalidArgument(f"JSON nesting depth exceeds the limit of {MAX_JSON_DEPTH}")
            stack.extend((c, d + 1) for c in reversed(v))
        else:
            raise InvalidArgument(f"input '{name}': BYTES 'data' elements must be strings")
    return out


def _parse_output(item: Any) -> RequestedOutput:
    if not isinstance(item, dict):
        raise InvalidArgument("each entry of 'outputs' must be an object")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("output 'name' must be a string")
    params = _parse_parameters(item.get("parameters"), f"output '{name}'")
    _check_unknown_members(item, _OUTPUT_KEYS, 4)
    if "binary_data" in params and not isinstance(params["binary_data"], bool):
        raise InvalidArgument(f"output '{name}': parameter 'binary_data' must be a boolean")
    return RequestedOutput(name=name, parameters=params)


# --------------------------------------------------------------------------- encoding
def encode_infer_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """Build the response body; returns ``(body, json_header_length)``.

    The header length is None when the body is pure JSON. Binary output choice: an
    output's own ``binary_data`` wins; outputs not listed in the request (all of them
    when none is listed) follow the request's ``binary_data_output``; a listed output
    without ``binary_data`` is JSON — what Triton 2.51 does.
    """
    common = encode_common(response, request)
    if common is not None:  # no output as JSON data: built in one pass (common_shape_py)
        return common
    return encode_document(response, request)


def encode_document(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """The general encoder behind :func:`encode_infer_response` (JSON data included)."""
    requested = {o.name: o.parameters for o in request.outputs}
    default_binary = request.parameters.get("binary_data_output", False) is True
    outputs: list[dict[str, Any]] = []
    blobs: list[Buffer] = []
    for out in response.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        params = dict(out.parameters)
        if out.in_shared_memory:  # the data went to the client's region: no data, as Triton
            if params:
                entry["parameters"] = params
        else:
            req = requested.get(out.name)
            binary = req.get("binary_data", False) if req is not None else default_binary
            if binary:
                params["binary_data_size"] = memoryview(out.data).nbytes
                entry["parameters"] = params
                blobs.append(out.data)
            else:
                if params:
                    entry["parameters"] = params
                _check_json_output(out.datatype)
                entry["data"] = wire_to_json(out)
        outputs.append(entry)

    header = response_header(response, outputs)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def _check_json_output(datatype: str) -> None:
    """JSON has no half-precision numbers: FP16/BF16 outputs travel as binary only."""
    if datatype in ("FP16", "BF16"):
        raise InvalidArgument(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output")


def wire_to_json(out: OutputTensor) -> Any:
    """Output data as a flat JSON-serialisable value (a numpy array or a list)."""
    count = math.prod(out.shape)
    try:
        if out.datatype == "BYTES":
            # JSON strings must be text: utf-8 when valid, else latin-1 so every byte
            # maps to one code point (lossless; Triton sends raw, invalid JSON).
            return [_bytes_to_str(b) for b in deserialize_bytes(out.data, count)]
        dtype = numpy_dtype(out.datatype)
        arr = np.frombuffer(out.data, dtype=dtype)
    except TritonShmError as e:
        raise Internal(f"output '{out.name}' is malformed: {e.message}") from None
    except ValueError:
        raise Internal(f"output '{out.name}' size is not a multiple of its {out.datatype} element size") from None
    if arr.size != count:
        raise Internal(f"output '{out.name}' holds {arr.size} elements but its shape {list(out.shape)} needs {count}")
    if out.datatype == "BF16":  # the upper half of a float32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def _bytes_to_str(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")
