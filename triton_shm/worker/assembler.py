"""Batch assembler: the C extension when built, else its pure-Python twin
(``TRITON_SHM_NO_EXTENSIONS=1`` forces the twin; the tests run both)."""
from __future__ import annotations

from ..core.codec import NO_EXTENSIONS
from .assembler_py import GUARDED, copy, gather, scatter

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from ._assembler import GUARDED, copy, gather, scatter  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twin serves
        pass

__all__ = ["GUARDED", "copy", "gather", "scatter", "USING_EXTENSION"]
