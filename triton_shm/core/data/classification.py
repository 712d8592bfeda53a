"""The classification extension: an output requested with ``classification: N`` (HTTP
``parameters``, gRPC ``parameters`` / tritonclient's ``class_count``) is answered as its
top N entries, BYTES ``"value:index[:label]"``, per batch row, in Triton's format.

The labels are the lines of the output's ``label_filename`` in the model directory, read
when the model loads. This module runs in the front-end after the model answered; a
request without classification never reaches it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ...errors import InvalidArgument, TritonShmError, Unsupported
from . import codec
from .types import OutputTensor, ParamValue

if TYPE_CHECKING:
    from ..models import config as mcfg
    from .types import InferResponse

# At most this many elements per batch row may be ranked (Triton's bound since 2.64:
# no unbounded sort of a huge output).
MAX_CLASSIFICATION_ELEMENTS = 1_000_000

# The datatypes Triton ranks (little-endian, as on the wire); any other is refused.
_RANKED = {"UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
           "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
           "FP32": "<f4", "FP64": "<f8"}


def requested_count(params: Mapping[str, ParamValue], output: str) -> int:
    """The class count an output asks for (0: none, as Triton reads ``0`` over HTTP)."""
    value = params["classification"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:  # Triton's words (its status is 500)
        raise InvalidArgument("Unable to set 'classification': attempt to access JSON non-unsigned-integer "
                              f"as unsigned-integer (output '{output}')")
    if value >= 1 << 32:  # Triton keeps the count in 32 bits
        raise InvalidArgument(f"invalid value for 'classification' parameter of output '{output}', "
                              "expected < 4294967296")
    return value


def load_labels(config: "mcfg.ModelConfig", model_dir: Path, model: str) -> dict[str, list[bytes]]:
    """Each output's labels (the lines of its ``label_filename``, relative to the model
    directory, which it may not leave); raises what fails the load."""
    labels: dict[str, list[bytes]] = {}
    root = os.path.realpath(model_dir)
    for out in config.output:
        if not out.label_filename:
            continue
        path = os.path.join(model_dir, out.label_filename)
        real = os.path.realpath(path)
        if real != root and not real.startswith(root + os.sep):
            raise Unsupported(f"label file path '{path}' for output '{out.name}' in model '{model}' is "
                              "outside model directory")
        try:
            with open(real, "rb") as f:
                text = f.read()
        except OSError as e:
            raise InvalidArgument(f"failed to open text file for read {path}: {e.strerror}") from None
        lines = text.split(b"\n")
        if lines[-1] == b"":  # a final newline ends the last line; it starts none
            lines.pop()
        labels[out.name] = lines
    return labels


def ensemble_labels(labels: dict[str, list[bytes]], config: "mcfg.ModelConfig", repository: Any) -> None:
    """An ensemble's output without labels of its own takes those of the composing model's
    output that produces it (``repository``: the ModelRepository, its models loaded)."""
    for out in config.output:
        if labels.get(out.name):
            continue
        for step in config.ensemble_scheduling.step:
            source = next((k for k, v in step.output_map.items() if v == out.name), None)
            if source is None:
                continue
            try:
                version = str(step.model_version) if step.model_version > 0 else ""
                found = repository.get(step.model_name, version).labels.get(source)
            except TritonShmError:
                continue
            if found:
                labels[out.name] = found


def classify_response(response: "InferResponse", counts: Mapping[str, int], batched: bool,
                      labels: Mapping[str, list[bytes]]) -> None:
    """Replace each output ``counts`` names by its classification, in place; on an error
    the response is released and the error raised."""
    outputs = response.outputs
    try:
        for i, out in enumerate(outputs):
            count = counts.get(out.name)
            if count:
                outputs[i] = classify(out, count, batched, labels.get(out.name))
    except BaseException:
        response.release()
        raise


def classify(out: OutputTensor, count: int, batched: bool, labels: list[bytes] | None) -> OutputTensor:
    """One output's top ``count`` per batch row (``batched``: the model's first dimension is
    the batch), as a BYTES tensor of shape ``[batch, k]`` or ``[k]``."""
    dtype = _RANKED.get(out.datatype)
    if dtype is None:
        raise InvalidArgument(f"class result not available for output due to unsupported type '{out.datatype}'")
    shape = out.shape
    rows = shape[0] if batched and shape else 0
    row_count = 1
    for d in shape[1:] if rows else shape:
        row_count *= d
    values = np.frombuffer(out.data, dtype=dtype)
    parts: list[bytes] = []
    for row in range(max(1, rows)):
        start = row * row_count
        ranked = values[start:start + row_count] if start + row_count <= values.size else values[:0]
        if ranked.size > MAX_CLASSIFICATION_ELEMENTS:
            raise InvalidArgument("classification output tensor too large")
        parts.extend(_top(ranked, count, labels))
    k = min(count, row_count)
    return OutputTensor(out.name, "BYTES", [rows, k] if rows else [k], codec.serialize_bytes(parts))


def _top(values: np.ndarray, count: int, labels: list[bytes] | None) -> list[bytes]:
    """``"value:index[:label]"`` of the ``count`` largest values, largest first, equal
    values in index order; values as C++ ``std::to_string`` prints them (``%f``, ``%d``)."""
    n = values.size
    # descending and stable: sort the reversed row ascending (stable), read it backwards
    order = (n - 1) - np.argsort(values[::-1], kind="stable")[::-1][:count]
    floating = values.dtype.kind == "f"
    found = []
    for index in order.tolist():
        v = values[index]
        text = (b"%f" % float(v)) if floating else b"%d" % int(v)
        text += b":%d" % index
        if labels is not None and index < len(labels) and labels[index]:
            text += b":" + labels[index]
        found.append(text)
    return found
