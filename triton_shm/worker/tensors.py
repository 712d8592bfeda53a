"""Worker-side conversion between shared-memory tensor descriptors and numpy arrays."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.data import codec
from ..core.data.datatypes import DATATYPES, check_datatype, element_size, from_numpy, numpy_dtype
from ..errors import Internal, InvalidArgument
from ..ipc.arena import Arena, Block
from . import assembler
from .assembler_py import RegionSpan
from .cuda import DeviceSpan, as_cupy, is_device_array, to_host_array


def _fill(template: list[int], variable: list[int]) -> list[int]:
    """``template`` with its -1 dims replaced, in order, by ``variable``."""
    values = iter(variable)
    return [next(values) if d == -1 else d for d in template]


@dataclass(frozen=True, slots=True)
class Reshapes:
    """The config's ``reshape`` fields: requests and responses carry ``dims``, the model
    sees ``reshape.shape`` (after the batch dimension, when the model batches)."""
    batched: bool = False
    inputs: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)   # name -> (dims, shape)
    outputs: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Reshapes:
        def table(key: str) -> dict[str, tuple[list[int], list[int]]]:
            return {t["name"]: (list(t.get("dims") or []), list(t["reshape"].get("shape") or []))
                    for t in config.get(key) or [] if t.get("reshape") is not None}
        return cls(int(config.get("max_batch_size", 0) or 0) > 0, table("input"), table("output"))

    def _split(self, shape: list[int]) -> tuple[list[int], list[int]]:
        return (shape[:1], shape[1:]) if self.batched and shape else ([], shape)

    def input_shape(self, name: str, shape: list[int]) -> list[int]:
        """A request input's shape as the model takes it."""
        if name not in self.inputs:
            return shape
        dims, reshape = self.inputs[name]
        lead, body = self._split(shape)
        return lead + _fill(reshape, [g for g, d in zip(body, dims) if d == -1])

    def output_shape(self, name: str, shape: list[int]) -> list[int]:
        """A model output's shape as the response carries it."""
        if name not in self.outputs:
            return shape
        dims, reshape = self.outputs[name]
        lead, body = self._split(shape)
        if len(body) != len(reshape) or any(d != -1 and d != g for g, d in zip(body, reshape)):
            raise InvalidArgument(f"output '{name}' has shape {shape}, which does not match its reshape "
                                  f"{reshape} in the model config")
        return lead + _fill(dims, [g for g, d in zip(body, reshape) if d == -1])


# fixed-size V2 datatype -> (little-endian numpy dtype, bytes per element)
_FIXED: dict[str, tuple[np.dtype, int]] = {dt: (numpy_dtype(dt), element_size(dt))
                                           for dt in DATATYPES if dt != "BYTES"}


def decode_input(datatype: str, shape: list[int], view: memoryview) -> np.ndarray:
    """A numpy array over ``view`` (zero-copy for fixed-size types)."""
    count = math.prod(shape)  # shapes come from the front-end, already validated
    fixed = _FIXED.get(datatype)
    if fixed is None:
        if datatype == "BYTES":
            return codec.deserialize_bytes(view, count).reshape(shape)
        check_datatype(datatype)  # raises: an unknown datatype
        raise Internal(f"datatype {datatype} has no fixed element size")
    dtype, size = fixed
    if count * size != view.nbytes:
        raise Internal("input descriptor size does not match its shape")
    return np.ndarray(shape, dtype, view)  # positional: numpy parses keywords slowly


def decode_device_input(datatype: str, shape: list[int], span: DeviceSpan, in_place: bool) -> Any:
    """A CuPy array on the GPU over a CUDA shared-memory input: a view of the client's
    region for a model that only reads its inputs, else a copy of its own (one device copy)."""
    dtype, size = _FIXED[datatype]  # BYTES never comes here: it is decoded on the host
    if math.prod(shape) * size != span.nbytes:
        raise Internal("input descriptor size does not match its shape")
    return span.as_array(dtype, shape) if in_place else span.copy_array(dtype, shape)


def _coerce(name: str, array, datatype: str) -> np.ndarray:
    """The model's array in the dtype the config declares for this output."""
    array = np.asarray(array)
    if datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise InvalidArgument(f"output '{name}' should be BYTES but the model returned {array.dtype}")
        return array
    if datatype == "BF16":
        if array.dtype == np.uint16:
            return array
        if array.dtype == np.float32:  # round-toward-zero to the upper 16 bits
            return (np.ascontiguousarray(array).view(np.uint32) >> 16).astype(np.uint16)
        raise InvalidArgument(f"output '{name}' should be BF16 (uint16 words or float32), got {array.dtype}")
    got = from_numpy(array.dtype) if array.dtype.kind not in "OSU" else "BYTES"
    if got != datatype:
        raise InvalidArgument(f"output '{name}' of type {got} does not match the config's {datatype}")
    return array


def wire_bytes(name: str, datatype: str, array) -> tuple[list[int], memoryview]:
    """An output's shape and its wire-encoded bytes (no copy for fixed-size types; a
    CUDA tensor is copied to the host once)."""
    if is_device_array(array):
        array = to_host_array(array)
    array = _coerce(name, array, datatype)
    if datatype == "BYTES":
        return list(array.shape), memoryview(codec.serialize_bytes(array))
    shape = list(array.shape)  # ascontiguousarray makes a 0-d array 1-d
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return shape, memoryview(array.reshape(-1).view(np.uint8))


def encode_output(arena: Arena, name: str, datatype: str, array) -> tuple[list[int], Block]:
    """Write one output into the arena; returns its shape and block."""
    fixed = _FIXED.get(datatype)
    if type(array) is np.ndarray and fixed is not None and array.dtype == fixed[0] and array.flags.c_contiguous:
        # the common case: already the declared little-endian dtype, in order, on the host;
        # wire_bytes would coerce nothing and copy nothing. ``put``: the block and the copy in one call
        return list(array.shape), arena.put(array)
    shape, data = wire_bytes(name, datatype, array)
    block = arena.alloc(data.nbytes)
    if data.nbytes:
        block.view[:] = data
    return shape, block


def encode_output_into(target: memoryview | RegionSpan, name: str, datatype: str, array) -> tuple[list[int], int]:
    """Write one output into a client's shared-memory slice; returns its shape and size."""
    shape, data = wire_bytes(name, datatype, array)
    if data.nbytes > target.nbytes:
        raise InvalidArgument(f"shared memory size specified with the request for output '{name}' "
                              f"({target.nbytes} bytes) should be at least {data.nbytes} bytes to hold the results")
    assembler.copy(target, data)  # guarded: the client may shrink its region meanwhile
    return shape, data.nbytes


def write_device_output(target: DeviceSpan, name: str, datatype: str, array) -> tuple[list[int], int]:
    """Write one output into a client's CUDA shared-memory slice: a CUDA tensor device to
    device, a host one with one host-to-device copy; returns its shape and size."""
    if is_device_array(array) and datatype != "BYTES":
        device_array = as_cupy(array)
        got = from_numpy(device_array.dtype)
        if got != datatype:
            raise InvalidArgument(f"output '{name}' of type {got} does not match the config's {datatype}")
        _check_fits(name, target.nbytes, int(device_array.nbytes))
        return list(device_array.shape), target.write_device(device_array)
    shape, data = wire_bytes(name, datatype, array)
    _check_fits(name, target.nbytes, data.nbytes)
    target.write_host(data)
    return shape, data.nbytes


def _check_fits(name: str, room: int, size: int) -> None:
    if size > room:
        raise InvalidArgument(f"shared memory size specified with the request for output '{name}' "
                              f"({room} bytes) should be at least {size} bytes to hold the results")
