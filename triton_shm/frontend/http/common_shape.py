"""The common-shape infer request decoder and response encoder: the C extension when
built (with the C request/response types), else its pure-Python twin (``_twins``)."""
from __future__ import annotations

from ..._twins import pick
from ...core.data import types
from .common_shape_py import RouteCodec, decode_common, encode_common

__all__ = ["USING_EXTENSION", "RouteCodec", "decode_common", "encode_common"]

# The C build reads and builds the C classes of core/data/_types: it serves only where
# core.data.types picked those (never beside the twins, whose objects it would not read).
USING_EXTENSION = types.USING_EXTENSION and pick(globals(), "._common_shape", "RouteCodec", "decode_common",
                                                 "encode_common")
