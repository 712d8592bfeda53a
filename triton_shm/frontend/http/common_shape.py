"""The common-shape infer request decoder and response encoder: the C extension when
built, else its pure-Python twin.

Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the pure-Python code (the tests run both).
"""
from __future__ import annotations

from ...core.codec import NO_EXTENSIONS
from .common_shape_py import RouteCodec, decode_common, encode_common

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from ._common_shape import RouteCodec, decode_common, encode_common  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twin serves
        pass

__all__ = ["USING_EXTENSION", "RouteCodec", "decode_common", "encode_common"]
