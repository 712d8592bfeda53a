"""Request inputs from the model's metadata and configuration: zero, random or a JSON file.

The JSON file follows perf_analyzer's ``--input-data`` format, at least its common form::

    {"data": [ {"INPUT0": [1, 2, 3, 4]},
               {"INPUT0": {"content": [1, 2, 3, 4], "shape": [2, 2]}},
               {"INPUT0": {"b64": "AAAAAA=="}} ]}

Each entry of ``data`` is one request's tensors for ONE batch element (the data is
repeated along the batch dimension for ``-b`` > 1; a flat list that already holds the
whole batch is also accepted). Several entries are sent in turn, round-robin.
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.data.codec import serialize_bytes
from . import PerfError, UsageError

_NP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
_ELEMENT_SIZE = {**{k: np.dtype(v).itemsize for k, v in _NP.items()}, "BF16": 2}
RANDOM_STRING_LENGTH = 16


@dataclass
class TensorSpec:
    name: str
    datatype: str
    dims: list[int]          # without the batch dimension; -1 = dynamic


@dataclass
class ModelSpec:
    name: str
    version: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: list[int]         # full shape sent, batch dimension included when batching
    data: bytes              # raw little-endian bytes (BYTES: 4-byte length prefixes)


def _ints(values: Any) -> list[int]:
    return [int(v) for v in (values or [])]


def model_spec(metadata: dict, config: dict | None, version: str) -> ModelSpec:
    """From V2 model metadata and (optionally) the model configuration, both as JSON dicts."""
    config = config or {}
    mbs = int(config.get("max_batch_size", 0) or 0)
    cfg_dims = {t.get("name"): _ints(t.get("dims")) for t in config.get("input", []) + config.get("output", [])}

    def spec(t: dict) -> TensorSpec:
        dims = cfg_dims.get(t["name"])
        if dims is None:
            dims = _ints(t.get("shape"))
            if mbs > 0 and dims:
                dims = dims[1:]
        return TensorSpec(t["name"], t["datatype"], dims)

    return ModelSpec(metadata.get("name", ""), version, mbs,
                     [spec(t) for t in metadata.get("inputs", [])],
                     [spec(t) for t in metadata.get("outputs", [])])


def output_region_size(t: TensorSpec, batch_size: int, default: int) -> int:
    """Bytes of an output's shared-memory region, by perf_analyzer's rule: the output's size
    for one batch element where its datatype and dims fix it, else ``default``
    (``--output-shared-memory-size``); times the batch size."""
    element = _ELEMENT_SIZE.get(t.datatype)  # BYTES has no fixed size
    known = element is not None and all(d >= 0 for d in t.dims)
    return max((element * math.prod(t.dims) if known and element is not None else default) * batch_size, 1)


def parse_shape_flags(values: list[str]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for v in values:
        name, sep, dims = v.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            parsed = [int(d) for d in dims.split(",")] if dims.strip() else []
            if any(d < 0 for d in parsed):
                raise ValueError
        except ValueError:
            raise UsageError(f"--shape '{v}': expected NAME:d1,d2,... with non-negative integers "
                             "(e.g. --shape INPUT0:1,16)") from None
        shapes[name] = parsed
    return shapes


def _to_bytes_items(values: Any) -> list[bytes]:
    flat = np.asarray(values, dtype=object).reshape(-1).tolist()
    return [v if isinstance(v, bytes) else str(v).encode() for v in flat]


def _encode(datatype: str, values: Any, count: int, input_name: str) -> bytes:
    """``values`` (list/ndarray, one sample or the whole batch) as raw bytes of ``count`` elements."""
    if datatype == "BYTES":
        items = _to_bytes_items(values)
        if len(items) != count:
            raise PerfError(f"input '{input_name}': {len(items)} values given, the shape needs {count}")
        return serialize_bytes(items)
    if datatype == "BF16":
        f32 = np.asarray(values, dtype=np.float32).reshape(-1)
        if f32.size != count:
            raise PerfError(f"input '{input_name}': {f32.size} values given, the shape needs {count}")
        return (f32.view(np.uint32) >> 16).astype("<u2").tobytes()
    if datatype not in _NP:
        raise PerfError(f"input '{input_name}': datatype {datatype} is not supported")
    arr: np.ndarray = np.asarray(values, dtype=_NP[datatype]).reshape(-1)
    if arr.size != count:
        raise PerfError(f"input '{input_name}': {arr.size} values given, the shape needs {count}")
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _generated(datatype: str, count: int, mode: str, rng: np.random.Generator) -> bytes:
    if datatype == "BYTES":
        if mode == "zero":
            return serialize_bytes([b"0"] * count)
        letters = rng.integers(ord("a"), ord("z") + 1, size=(count, RANDOM_STRING_LENGTH), dtype=np.uint8)
        return serialize_bytes([row.tobytes() for row in letters])
    size = _ELEMENT_SIZE.get(datatype)
    if size is None:
        raise PerfError(f"datatype {datatype} is not supported")
    if mode == "zero":
        return bytes(count * size)
    if datatype in ("FP16", "FP32", "FP64"):
        return rng.random(count).astype(np.dtype(_NP[datatype]).newbyteorder("<")).tobytes()
    if datatype == "BF16":
        return (rng.random(count).astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    if datatype == "BOOL":
        return rng.integers(0, 2, size=count, dtype=np.uint8).tobytes()
    info = np.iinfo(_NP[datatype])
    return rng.integers(0, min(info.max, 127) + 1, size=count).astype(
        np.dtype(_NP[datatype]).newbyteorder("<")).tobytes()


def load_json_data(path: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--input-data: no such file '{path}' (expected zero, random or a JSON file)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--input-data: cannot read '{path}' as JSON: {e}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"--input-data '{path}': expected {{\"data\": [{{\"INPUT_NAME\": [...]}}, ...]}} "
                         "with at least one entry")
    # perf_analyzer also accepts one list per stream ({"data": [[{...}, ...]]}); we take the flat form.
    return entries


def _resolve_dims(t: TensorSpec, shapes: dict[str, list[int]], json_shape: list[int] | None,
                  values: Any) -> list[int]:
    if json_shape is not None:
        return [int(d) for d in json_shape]
    if t.name in shapes:
        return shapes[t.name]
    if all(d >= 0 for d in t.dims):
        return list(t.dims)
    if values is not None and not isinstance(values, (str, bytes)):
        arr_shape = list(np.asarray(values, dtype=object).shape)
        if len(arr_shape) == len(t.dims) and all(d < 0 or d == a for d, a in zip(t.dims, arr_shape)):
            return arr_shape
    raise UsageError(f"input '{t.name}' has a dynamic shape {t.dims}: give its shape with "
                     f"--shape {t.name}:{','.join(str(d if d >= 0 else 1) for d in t.dims) or '1'} "
                     "(dimensions without the batch dimension)")


def build_input_sets(spec: ModelSpec, shapes: dict[str, list[int]], input_data: str,
                     batch_size: int, seed: int = 0) -> list[list[InputTensor]]:
    """One list of tensors per distinct request (one for zero/random, one per JSON entry)."""
    names = {t.name for t in spec.inputs}
    for n in shapes:
        if n not in names:
            raise UsageError(f"--shape names input '{n}', which model '{spec.name}' does not have "
                             f"(inputs: {', '.join(sorted(names)) or 'none'})")
    batched = spec.max_batch_size > 0
    rng = np.random.default_rng(seed)
    entries: list[dict[str, Any]] | None = None
    if input_data not in ("zero", "random"):
        entries = load_json_data(input_data)
    sets: list[list[InputTensor]] = []
    choices: list[dict[str, Any] | None] = [*entries] if entries else [None]  # None: zero or random data
    for entry in choices:
        tensors = []
        for t in spec.inputs:
            values = json_shape = None
            if entry is not None:
                if t.name not in entry:
                    raise PerfError(f"--input-data '{input_data}': an entry has no data for input "
                                    f"'{t.name}'")
                v = entry[t.name]
                if isinstance(v, dict):
                    json_shape = v.get("shape")
                    if "b64" in v:
                        raw = base64.b64decode(v["b64"])
                        values = ("b64", raw)
                    else:
                        values = v.get("content")
                else:
                    values = v
            dims = _resolve_dims(t, shapes, json_shape, None if isinstance(values, tuple) else values)
            count = math.prod(dims)
            if values is None:
                one = _generated(t.datatype, count, input_data, rng)
                data = one * (batch_size if batched else 1)
            elif isinstance(values, tuple):       # b64: the raw bytes of one sample (or the batch)
                raw = values[1]
                data = raw * (batch_size if batched else 1)
            else:
                flat_n = np.asarray(values, dtype=object).size
                if batched and batch_size > 1 and flat_n == count * batch_size:
                    data = _encode(t.datatype, values, count * batch_size, t.name)
                else:
                    data = _encode(t.datatype, values, count, t.name) * (batch_size if batched else 1)
            shape = [batch_size, *dims] if batched else list(dims)
            tensors.append(InputTensor(t.name, t.datatype, shape, data))
        sets.append(tensors)
    return sets
