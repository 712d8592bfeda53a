"""The common-shape infer request decoder and response encoder: the C extension when
built (with the C request/response types), else its pure-Python twin.

Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the pure-Python code (the tests run both).
"""
from __future__ import annotations

from ...core.data import types
from .common_shape_py import RouteCodec, decode_common, encode_common

# The C build reads and builds the C classes of core/data/_types: it serves only where
# core.data.types picked those (never beside the twins, whose objects it would not read).
USING_EXTENSION = False
if types.USING_EXTENSION:
    try:
        from ._common_shape import RouteCodec, decode_common, encode_common  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    # not built, or built against another layout of the C types (Cython's import check
    # raises ValueError): the pure-Python twin serves
    except (ImportError, ValueError):
        pass

__all__ = ["USING_EXTENSION", "RouteCodec", "decode_common", "encode_common"]
