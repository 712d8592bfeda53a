"""BYTES tensor codec: the C extension when built, else its pure-Python twin (``_twins``)."""
from __future__ import annotations

from ..._twins import pick
from .codec_py import count_bytes, deserialize_bytes, serialize_bytes, split_bytes, validate_bytes

__all__ = ["count_bytes", "deserialize_bytes", "serialize_bytes", "split_bytes", "validate_bytes", "USING_EXTENSION"]

USING_EXTENSION = pick(globals(), "._codec", "count_bytes", "deserialize_bytes", "serialize_bytes", "split_bytes",
                       "validate_bytes")
