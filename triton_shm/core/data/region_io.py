"""Reads and writes of a client's shared-memory region by the front-end itself.

Workers do the data plane's reads and writes; the front-end touches a client region
only for the response cache (hashing a shared-memory input, storing a shared-memory
output, writing a hit into the region the request names). It never maps the region:
it reads with ``pread`` and writes with ``pwrite`` on the registered fd, after checking
the object still holds the slice, so a client that truncates its region gets a 400 and
can never bring the front-end down with a SIGBUS.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...errors import InvalidArgument

if TYPE_CHECKING:
    from .shm_registry import Region


def _position(region: "Region", offset: int, size: int) -> int:
    if offset < 0 or size < 0 or offset > region.byte_size or size > region.byte_size - offset:
        raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{region.name}'")
    start = region.offset + offset
    if os.fstat(region.fd).st_size < start + size:
        raise _shrunk(region)
    return start


def _shrunk(region: "Region") -> InvalidArgument:
    return InvalidArgument(f"the shared-memory region '{region.name}' has shrunk since it was registered")


def read_region(region: "Region", offset: int, size: int) -> bytes:
    """A copy of ``size`` bytes at ``offset`` within the registered region."""
    start = _position(region, offset, size)
    out = bytearray(size)
    view, done = memoryview(out), 0
    while done < size:
        n = os.preadv(region.fd, [view[done:]], start + done)
        if n == 0:  # the object was truncated under the read
            raise _shrunk(region)
        done += n
    return bytes(out)


def write_region(region: "Region", offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` within the registered region."""
    start = _position(region, offset, len(data))
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.pwrite(region.fd, view[done:], start + done)
