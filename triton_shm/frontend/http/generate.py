"""Triton's generate extension: ``POST /v2/models/{m}/generate`` and ``generate_stream``.

The request body is one JSON object whose members name the model's inputs directly
(``{"text_input": "...", "max_tokens": 8, "parameters": {...}}``); the response is one
object whose members are the outputs. ``generate_stream`` sends every response of a
(decoupled) model as a server-sent event.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ...core.data.types import InferRequest, InferResponse, InputTensor
from ...errors import InvalidArgument
from .codec import json_to_wire, wire_to_json

_RESERVED = frozenset({"id", "parameters"})


def decode_generate_request(model_name: str, model_version: str, body: bytes,
                            metadata: dict[str, Any]) -> InferRequest:
    """``metadata`` is the model's metadata: input datatypes and shapes (batch dim -1 first
    when the model batches) tell how each member becomes a tensor."""
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the generate request must be a JSON object")
    request_id = doc.get("id", "")
    parameters = doc.get("parameters", {})
    if not isinstance(request_id, str) or not isinstance(parameters, dict):
        raise InvalidArgument("'id' must be a string and 'parameters' an object")
    specs = {t["name"]: t for t in metadata["inputs"]}
    inputs = []
    for name, value in doc.items():
        if name in _RESERVED:
            continue
        spec = specs.get(name)
        if spec is None:
            raise InvalidArgument(f"unexpected input '{name}' for model '{model_name}'")
        data = value if isinstance(value, list) else [value]
        shape = list(np.shape(np.array(data, dtype=object)))
        if len(spec["shape"]) == len(shape) + 1:  # the model batches: one row
            shape = [1, *shape]
        inputs.append(InputTensor(name, spec["datatype"], shape,
                                  json_to_wire(name, spec["datatype"], shape, data, model_name, request_id)))
    return InferRequest(model_name=model_name, model_version=model_version, id=request_id,
                        parameters=dict(parameters), inputs=inputs)


def encode_generate_response(response: InferResponse) -> dict[str, Any]:
    """Outputs as members; a one-element output becomes a scalar."""
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    for out in response.outputs:
        if out.datatype in ("FP16", "BF16"):  # JSON has no such numbers; generate has no binary form
            raise InvalidArgument(f"sending {out.datatype} data via JSON is not supported. Please use the binary "
                                  "data format for output")
        values = wire_to_json(out)
        values = values.tolist() if isinstance(values, np.ndarray) else values
        doc[out.name] = values[0] if len(values) == 1 else values
    return doc
