"""Batch assembler: the C extension when built and its SIGBUS guard installed, else its
pure-Python twin (``TRITON_SHM_NO_EXTENSIONS=1`` forces the twin; the tests run both).
Both are guarded against a client region truncated under a copy."""
from __future__ import annotations

from ..core.data.codec import NO_EXTENSIONS
from .assembler_py import FAULT, GUARDED, copy, gather, scatter

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from . import _assembler
    except ImportError:  # not built: the pure-Python twin serves
        pass
    else:
        if _assembler.GUARDED:  # else the twin, which needs no signal handler
            from ._assembler import GUARDED, copy, gather, scatter  # type: ignore[no-redef]  # noqa: F811
            USING_EXTENSION = True

__all__ = ["FAULT", "GUARDED", "copy", "gather", "scatter", "USING_EXTENSION"]
