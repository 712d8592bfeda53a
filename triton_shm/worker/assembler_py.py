"""Batch assembler, pure Python. Twin of the C extension ``_assembler``.

The C copies catch a SIGBUS from a client region truncated under them; Python cannot.
So the twin never touches client memory through a mapping: a client region's slice is a
:class:`RegionSpan` (``regions.py`` hands those out when the twin serves), read with
``preadv`` (a truncated region reads short, which is the same error as the C guard's) and
written with ``pwrite`` after checking the region's size. A client that truncates its
region between that check and the write gets its file extended back to the slice's end
(never a dead worker).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import Internal, InvalidArgument

GUARDED = True
FAULT = "a client's shared-memory region shrank while it was being read or written"


@dataclass(frozen=True, slots=True)
class RegionSpan:
    """``nbytes`` bytes at ``offset`` of the client region open as ``fd``, which must stay
    at least ``end`` bytes long."""
    fd: int
    offset: int
    nbytes: int
    end: int


def _read(span: RegionSpan, out: memoryview) -> None:
    done = 0
    while done < span.nbytes:
        n = os.preadv(span.fd, [out[done:span.nbytes]], span.offset + done)
        if n <= 0:
            raise InvalidArgument(FAULT)
        done += n


def _write(span: RegionSpan, data: memoryview) -> None:
    if os.fstat(span.fd).st_size < span.end:
        raise InvalidArgument(FAULT)
    done = 0
    while done < data.nbytes:
        done += os.pwrite(span.fd, data[done:], span.offset + done)


def _nbytes(buf) -> int:
    return buf.nbytes if isinstance(buf, RegionSpan) else memoryview(buf).nbytes


def copy(dst, src) -> int:
    """Copy ``src`` into the start of ``dst``; returns the bytes copied."""
    n, room = _nbytes(src), _nbytes(dst)
    if n > room:
        raise Internal(f"copy of {n} bytes into a {room}-byte buffer")
    if isinstance(dst, RegionSpan):
        src_view = memoryview(src).cast("B")  # never both: the model's bytes are in our memory
        _write(RegionSpan(dst.fd, dst.offset, n, dst.end), src_view)
    elif isinstance(src, RegionSpan):
        _read(src, memoryview(dst).cast("B"))
    else:
        memoryview(dst).cast("B")[:n] = memoryview(src).cast("B")
    return n


def gather(dst, srcs) -> int:
    """Copy every buffer of ``srcs`` back to back into ``dst``; returns the bytes written."""
    out = memoryview(dst).cast("B")
    sizes = [_nbytes(s) for s in srcs]
    total = sum(sizes)
    if total > out.nbytes:
        raise Internal(f"batch assembler: {total} bytes do not fit the {out.nbytes}-byte buffer")
    pos = 0
    for src, n in zip(srcs, sizes):
        if isinstance(src, RegionSpan):
            _read(src, out[pos:pos + n])
        else:
            out[pos:pos + n] = memoryview(src).cast("B")
        pos += n
    return total


def scatter(src, dsts) -> int:
    """Copy consecutive spans of ``src`` into each buffer of ``dsts`` (their lengths
    define the split); returns the bytes read."""
    inp = memoryview(src).cast("B")
    sizes = [_nbytes(d) for d in dsts]
    total = sum(sizes)
    if total > inp.nbytes:
        raise Internal(f"batch assembler: destinations need {total} bytes, the batch has {inp.nbytes}")
    pos = 0
    for dst, n in zip(dsts, sizes):
        if isinstance(dst, RegionSpan):
            _write(dst, inp[pos:pos + n])
        else:
            memoryview(dst).cast("B")[:] = inp[pos:pos + n]
        pos += n
    return total
