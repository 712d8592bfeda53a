"""BYTES tensor codec: the C extension when built, else its pure-Python twin.

Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the pure-Python code (the tests run both).
"""
from __future__ import annotations

import os

NO_EXTENSIONS = os.environ.get("TRITON_SHM_NO_EXTENSIONS", "") not in ("", "0")

from .codec_py import count_bytes, deserialize_bytes, serialize_bytes, split_bytes, validate_bytes  # noqa: E402

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from ._codec import (  # type: ignore  # noqa: F811
            count_bytes, deserialize_bytes, serialize_bytes, split_bytes, validate_bytes)
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twin serves
        pass

__all__ = ["count_bytes", "deserialize_bytes", "serialize_bytes", "split_bytes", "validate_bytes", "USING_EXTENSION"]
