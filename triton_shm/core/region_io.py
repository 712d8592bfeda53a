"""Reads and writes of a client's shared-memory region by the front-end itself.

Workers do the data plane's reads and writes; the front-end touches a client region
only for the response cache (hashing a shared-memory input, storing a shared-memory
output, writing a hit into the region the request names). Each use maps just the
slice it needs and unmaps it at once, and copies with the batch assembler's guarded
copy, so a client that truncates its region gets a 400, not a front-end killed by
SIGBUS (without the C extensions the size is checked with ``fstat`` first).
"""
from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..worker import assembler

if TYPE_CHECKING:
    from .shm_registry import Region


def _mapped(region: "Region", offset: int, size: int, writable: bool) -> tuple[mmap.mmap, int]:
    if offset < 0 or size < 0 or offset > region.byte_size or size > region.byte_size - offset:
        raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{region.name}'")
    start = region.offset + offset
    if os.fstat(region.fd).st_size < start + size:
        raise InvalidArgument(f"the shared-memory region '{region.name}' has shrunk since it was registered")
    base = start - start % mmap.ALLOCATIONGRANULARITY
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    return mmap.mmap(region.fd, start - base + size, mmap.MAP_SHARED, prot, offset=base), start - base


def read_region(region: "Region", offset: int, size: int) -> bytes:
    """A copy of ``size`` bytes at ``offset`` within the registered region."""
    if size == 0:
        return b""
    m, delta = _mapped(region, offset, size, writable=False)
    try:
        out = bytearray(size)
        with memoryview(m) as view:
            assembler.copy(out, view[delta:delta + size])
        return bytes(out)
    finally:
        m.close()


def write_region(region: "Region", offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` within the registered region."""
    if not data:
        return
    m, delta = _mapped(region, offset, len(data), writable=True)
    try:
        with memoryview(m) as view:
            assembler.copy(view[delta:delta + len(data)], data)
    finally:
        m.close()
