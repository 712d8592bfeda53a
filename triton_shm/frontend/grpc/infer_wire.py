"""The common-shape ModelInfer codec: the C extension when built, else its pure-Python twin
(``_twins``)."""
from __future__ import annotations

from ..._twins import pick
from .infer_wire_py import FRAMED, PLAIN, STREAM, decode_request, encode_response

__all__ = ["FRAMED", "PLAIN", "STREAM", "USING_EXTENSION", "decode_request", "encode_response"]

USING_EXTENSION = pick(globals(), "._infer_wire", "decode_request", "encode_response")
