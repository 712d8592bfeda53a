"""The infer request and response in their common shape, decided without the general
parser's per-member checks. Twin of ``_common_shape`` (the C build); same API and results.

The common request shape is what clients send: a JSON header whose members are the ones
the parser knows, ``id`` a string, parameters scalar, every input binary
(``binary_data_size``, no ``data``, no shared memory), outputs named with scalar
parameters. :func:`decode_common` returns the :class:`InferRequest` the general parser
(``codec.decode_infer_request``) would build for it, or None for anything else, so the
general parser decides it and words any error. It never changes ``doc``.

The common response shape: no output goes out as JSON data (each is binary or was written
to shared memory). :func:`encode_common` returns what ``codec.encode_infer_response``
returns for it, or None.

:class:`RouteCodec` is one infer route's (model, version) use of both for the lean HTTP
path: ``decode`` takes the raw body and its Inference-Header-Content-Length value,
``respond`` returns the whole HTTP/1.1 200 response (head and body, one buffer). Either
returns None where the general path must decide (it then words any error). The C build
also keeps, per route, the requests it has decoded by their JSON header's bytes (a client
sends the same header again and again) and the outputs' JSON by name.
"""
from __future__ import annotations

from typing import Any

import orjson

from ...core.data.datatypes import DATATYPES
from ...core.data.types import Buffer, InferRequest, InferResponse, InputTensor, RequestedOutput

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
# Request parameters the front-end reads itself; the general parser refuses a value of a
# type they do not take, in Triton's words (codec._parse_request_parameters).
CONTROL_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
INPUT_KEYS = frozenset({"name", "datatype", "shape", "parameters"})  # no "data": binary only
OUTPUT_KEYS = frozenset({"name", "parameters"})
JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
_SCALARS = (bool, int, float, str)


def _scalar_params(value: Any) -> dict | None:
    """``value`` as parameters (None -> {}), or None when it is not an object of scalars."""
    if value is None:
        return {}
    if type(value) is not dict:
        return None
    for v in value.values():
        if type(v) not in _SCALARS:
            return None
    return value


def control_parameter_ok(key: str, value: Any) -> bool:
    """Whether a value has a type its control parameter takes: ``sequence_id`` an unsigned
    64-bit integer or a string, ``sequence_start`` and ``sequence_end`` booleans."""
    if key == "sequence_id":
        return type(value) is str or (type(value) is int and 0 <= value <= UINT64_MAX)
    return type(value) is bool


def _controls_ok(params: dict) -> bool:
    """Whether the sequence controls among the parameters have types they take, and no key
    starts with "triton_" (the general parser refuses the others in Triton's words)."""
    for key in CONTROL_PARAMETERS:
        if key in params and not control_parameter_ok(key, params[key]):
            return False
    for key in params:
        if key.startswith("triton_"):
            return False
    return True


def _shape(value: Any) -> list | None:
    if type(value) is not list:
        return None
    for d in value:
        if type(d) is not int or d < 0 or d > INT64_MAX:
            return None
    return value


def decode_common(doc: Any, model_name: str, model_version: str, view: memoryview,
                  header_length: int) -> InferRequest | None:
    """``doc`` is the parsed JSON header, ``view`` the whole body, the binary part from
    ``header_length`` on."""
    if type(doc) is not dict or not REQUEST_KEYS.issuperset(doc):
        return None
    request_id = doc.get("id", "")
    params = _scalar_params(doc.get("parameters"))
    if type(request_id) is not str or params is None:
        return None
    if "binary_data_output" in params and type(params["binary_data_output"]) is not bool:
        return None
    if params and not _controls_ok(params):
        return None
    inputs = doc.get("inputs")
    if type(inputs) is not list:
        return None
    size = len(view)
    offset = header_length
    tensors = []
    for item in inputs:
        if type(item) is not dict or not INPUT_KEYS.issuperset(item):
            return None
        name = item.get("name")
        datatype = item.get("datatype")
        shape = _shape(item.get("shape"))
        tensor_params = _scalar_params(item.get("parameters"))
        if (type(name) is not str or type(datatype) is not str or datatype not in DATATYPES or shape is None
                or tensor_params is None or "shared_memory_region" in tensor_params):
            return None
        nbytes = tensor_params.get("binary_data_size")
        if type(nbytes) is not int or nbytes < 0 or nbytes > size - offset:
            return None
        # binary_data_size is framing only: the tensor keeps the other parameters.
        rest = {k: v for k, v in tensor_params.items() if k != "binary_data_size"} if len(tensor_params) > 1 else {}
        tensors.append(InputTensor(name, datatype, shape, view[offset:offset + nbytes], rest))
        offset += nbytes
    if offset != size:
        return None
    outputs = doc.get("outputs")
    requested = []
    if outputs is not None:
        if type(outputs) is not list:
            return None
        for item in outputs:
            if type(item) is not dict or not OUTPUT_KEYS.issuperset(item):
                return None
            name = item.get("name")
            output_params = _scalar_params(item.get("parameters"))
            if type(name) is not str or output_params is None:
                return None
            if "binary_data" in output_params and type(output_params["binary_data"]) is not bool:
                return None
            requested.append(RequestedOutput(name, output_params))
    return InferRequest(model_name, model_version, request_id, params, tensors, requested)


def encode_common(response: InferResponse, request: InferRequest) -> tuple[bytes, int] | None:
    """``(body, json_header_length)``, the outputs' data after the JSON header; None when an
    output would carry JSON data (or nothing goes out as binary: a pure-JSON body)."""
    listed = request.outputs
    requested = {o.name: o.parameters for o in listed} if listed else None
    default_binary = request.parameters.get("binary_data_output", False) is True
    outputs = []
    parts: list[Buffer] = [b""]
    for out in response.outputs:
        shape = out.shape
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype,
                                 "shape": shape if type(shape) is list else list(shape)}
        if out.in_shared_memory:  # the data went to the client's region: no data, as Triton
            if out.parameters:
                entry["parameters"] = out.parameters
        else:
            req = requested.get(out.name) if requested is not None else None
            if not (req.get("binary_data", False) if req is not None else default_binary):
                return None
            data = out.data
            nbytes = len(data) if type(data) is bytes else memoryview(data).nbytes
            if out.parameters:
                params = dict(out.parameters)
                params["binary_data_size"] = nbytes
            else:
                params = {"binary_data_size": nbytes}
            entry["parameters"] = params
            parts.append(data)
        outputs.append(entry)
    if len(parts) == 1:
        return None
    header = response_header(response, outputs)
    parts[0] = header
    return b"".join(parts), len(header)


def response_header(response: InferResponse, outputs: list[dict[str, Any]]) -> bytes:
    """The JSON document of an infer response whose output entries are ``outputs`` (the
    general encoder's too; the C twin builds the same one)."""
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    return orjson.dumps(doc, option=JSON_OPTS)


_HEAD = (b"HTTP/1.1 200 OK\r\nDate: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n"
         b"Inference-Header-Content-Length: %d\r\n%s\r\n")


class RouteCodec:
    """The common shape for one infer route of the lean path."""

    __slots__ = ("model", "version")

    def __init__(self, model: str, version: str):
        self.model = model
        self.version = version

    def decode(self, body: bytes, header_length: str | None) -> InferRequest | None:
        """The request of a body whose JSON header is ``header_length`` bytes, binary inputs after it."""
        if header_length is None:
            return None
        try:
            length = int(header_length)
        except ValueError:
            return None
        if not 0 < length < len(body):
            return None
        view = memoryview(body)
        try:
            doc = orjson.loads(view[:length])
        except orjson.JSONDecodeError:
            return None
        return decode_common(doc, self.model, self.version, view, length)

    def respond(self, response: InferResponse, request: InferRequest, date: bytes, connection: bytes) -> bytes | None:
        """The 200 response: ``date`` the Date header's value, ``connection`` its Connection
        header line (b"" for none)."""
        common = encode_common(response, request)
        if common is None:
            return None
        body, json_length = common
        return _HEAD % (date, len(body), json_length, connection) + body
