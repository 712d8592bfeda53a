"""Batch assembler: the C extension when built and its SIGBUS guard installed, else its
pure-Python twin (``_twins``). Both are guarded against a client region truncated under a copy."""
from __future__ import annotations

from .._twins import pick
from .assembler_py import FAULT, GUARDED, copy, gather, scatter

__all__ = ["FAULT", "GUARDED", "copy", "gather", "scatter", "USING_EXTENSION"]

# Without its guard (no signal handler) the C copies would not survive a truncated region.
USING_EXTENSION = pick(globals(), "._assembler", "GUARDED", "copy", "gather", "scatter",
                       usable=lambda module: bool(module.GUARDED))
