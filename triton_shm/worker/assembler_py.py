"""Batch assembler, pure Python. Twin of the C extension ``_assembler``.

Unlike the C version it cannot catch a SIGBUS: a client that truncates its region
during the copy takes the worker down (it is restarted). ``GUARDED`` says which.
"""
from __future__ import annotations

from ..errors import Internal

GUARDED = False


def copy(dst, src) -> int:
    """Copy ``src`` into the start of ``dst``; returns the bytes copied."""
    out, inp = memoryview(dst).cast("B"), memoryview(src).cast("B")
    if inp.nbytes > out.nbytes:
        raise Internal(f"copy of {inp.nbytes} bytes into a {out.nbytes}-byte buffer")
    out[:inp.nbytes] = inp
    return inp.nbytes


def gather(dst, srcs) -> int:
    """Copy every buffer of ``srcs`` back to back into ``dst``; returns the bytes written."""
    out = memoryview(dst).cast("B")
    views = [memoryview(s).cast("B") for s in srcs]
    total = sum(v.nbytes for v in views)
    if total > out.nbytes:
        raise Internal(f"batch assembler: {total} bytes do not fit the {out.nbytes}-byte buffer")
    pos = 0
    for v in views:
        out[pos:pos + v.nbytes] = v
        pos += v.nbytes
    return total


def scatter(src, dsts) -> int:
    """Copy consecutive spans of ``src`` into each buffer of ``dsts`` (their lengths
    define the split); returns the bytes read."""
    inp = memoryview(src).cast("B")
    views = [memoryview(d).cast("B") for d in dsts]
    total = sum(v.nbytes for v in views)
    if total > inp.nbytes:
        raise Internal(f"batch assembler: destinations need {total} bytes, the batch has {inp.nbytes}")
    pos = 0
    for v in views:
        v[:] = inp[pos:pos + v.nbytes]
        pos += v.nbytes
    return total
