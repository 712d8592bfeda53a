"""The common-shape ModelInfer codec: the C extension when built, else its pure-Python twin.

Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the pure-Python code (the tests run both).
"""
from __future__ import annotations

from ...core.data.codec import NO_EXTENSIONS
from .infer_wire_py import FRAMED, PLAIN, STREAM, decode_request, encode_response

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from ._infer_wire import decode_request, encode_response  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twin serves
        pass

__all__ = ["FRAMED", "PLAIN", "STREAM", "USING_EXTENSION", "decode_request", "encode_response"]
