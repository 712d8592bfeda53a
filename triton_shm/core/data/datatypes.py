"""The V2 tensor datatypes and their numpy and model-config spellings."""
from __future__ import annotations

import numpy as np

from ...errors import InvalidArgument

# name -> (bytes per element, numpy dtype). BYTES has no fixed size; BF16 has no numpy
# type, so it travels as raw little-endian uint16 words.
_TABLE: dict[str, tuple[int, np.dtype]] = {
    "BOOL": (1, np.dtype(np.bool_)),
    "UINT8": (1, np.dtype("<u1")),
    "UINT16": (2, np.dtype("<u2")),
    "UINT32": (4, np.dtype("<u4")),
    "UINT64": (8, np.dtype("<u8")),
    "INT8": (1, np.dtype("<i1")),
    "INT16": (2, np.dtype("<i2")),
    "INT32": (4, np.dtype("<i4")),
    "INT64": (8, np.dtype("<i8")),
    "FP16": (2, np.dtype("<f2")),
    "FP32": (4, np.dtype("<f4")),
    "FP64": (8, np.dtype("<f8")),
    "BF16": (2, np.dtype("<u2")),
    "BYTES": (0, np.dtype(np.object_)),
}

DATATYPES: frozenset[str] = frozenset(_TABLE)


def check_datatype(datatype: str) -> str:
    if datatype not in _TABLE:
        raise InvalidArgument(f"invalid datatype '{datatype}'")
    return datatype


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES (variable length)."""
    return _TABLE[check_datatype(datatype)][0]


def numpy_dtype(datatype: str) -> np.dtype:
    return _TABLE[check_datatype(datatype)][1]


# little-endian numpy dtype -> V2 name (BF16 shares uint16's dtype and is never inferred)
_FROM_NUMPY: dict[np.dtype, str] = {npd: name for name, (_, npd) in _TABLE.items() if name not in ("BF16", "BYTES")}


def from_numpy(dtype: np.dtype) -> str:
    """The V2 datatype of a numpy dtype (object and string arrays are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    name = _FROM_NUMPY.get(dtype) or _FROM_NUMPY.get(dtype.newbyteorder("<"))
    if name is None:
        raise InvalidArgument(f"unsupported numpy dtype '{dtype}'")
    return name


# Model config spells datatypes "TYPE_FP32"; the protocol spells them "FP32", except
# TYPE_STRING, which is BYTES on the wire.
def config_to_wire(config_type: str) -> str:
    name = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if name == "STRING" else name
