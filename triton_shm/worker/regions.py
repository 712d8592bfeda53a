"""Client shared-memory regions as a worker sees them.

The front-end passes the fd of a registered region; the worker maps exactly the
registered ``[offset, offset + byte_size)`` (from the page boundary below it) and hands
out views into it. Every view is bounds-checked against the registration, and the
object's current size is checked with ``fstat`` at use, so a client that truncates its
region after registering gets an error instead of the worker taking a SIGBUS. (A
truncation after that check, during the copy, is the assembler's to survive: the C copies
are guarded; with the pure-Python twin a view is a ``RegionSpan`` it reads and writes with
``preadv``/``pwrite``, never through the mapping.) The mapping is made at first use, not
when the fd arrives: a region truncated before its first use is refused until the client
restores its size, then maps and serves.
"""
from __future__ import annotations

import mmap
import os

from ..errors import Internal, InvalidArgument
from .assembler import USING_EXTENSION
from .assembler_py import RegionSpan
from .cuda import CudaRegion, DeviceSpan


class ClientRegion:
    def __init__(self, fd: int, offset: int, size: int):
        self.fd, self.offset, self.size = fd, offset, size
        self.start = offset - offset % mmap.ALLOCATIONGRANULARITY
        self.delta = offset - self.start
        self.mmap: mmap.mmap | None = None  # mapped at first use (see the module's docstring)

    def view(self, offset: int, size: int) -> memoryview | RegionSpan:
        if offset < 0 or size < 0 or offset > self.size or size > self.size - offset:
            raise InvalidArgument("shared-memory slice lies outside its registered region")
        if size == 0:
            return memoryview(b"")
        if os.fstat(self.fd).st_size < self.offset + self.size:
            raise InvalidArgument("the client's shared-memory region has shrunk since it was registered")
        if not USING_EXTENSION:
            return RegionSpan(self.fd, self.offset + offset, size, self.offset + self.size)
        if self.mmap is None:
            try:
                self.mmap = mmap.mmap(self.fd, self.delta + self.size, mmap.MAP_SHARED,
                                      mmap.PROT_READ | mmap.PROT_WRITE, offset=self.start)
            except (OSError, ValueError) as e:
                raise InvalidArgument(f"cannot map the client's shared-memory region: {e}") from None
        start = self.delta + offset
        return memoryview(self.mmap)[start:start + size]

    def close(self) -> None:
        if self.mmap is not None:
            try:
                self.mmap.close()
            except BufferError:  # a request still holds a view; unmapped with the last one
                pass
        os.close(self.fd)


class RegionMap:
    def __init__(self) -> None:
        self._regions: dict[int, ClientRegion | CudaRegion] = {}

    def add_cuda(self, rid: int, handle: bytes, device: int, size: int) -> None:
        """A client's CUDA IPC region (opened here; a bad handle raises InvalidArgument)."""
        region = CudaRegion(handle, device, size)
        old = self._regions.pop(rid, None)
        if old is not None:
            old.close()
        self._regions[rid] = region

    def add(self, rid: int, offset: int, size: int, fd: int) -> None:
        region = ClientRegion(fd, offset, size)
        old = self._regions.pop(rid, None)
        if old is not None:
            old.close()
        self._regions[rid] = region

    def drop(self, rid: int) -> None:
        region = self._regions.pop(rid, None)
        if region is not None:
            region.close()

    def view(self, rid: int, offset: int, size: int) -> memoryview | RegionSpan | DeviceSpan:
        """Bytes of a system region, or a ``DeviceSpan`` of a CUDA region."""
        region = self._regions.get(rid)
        if region is None:
            raise Internal(f"shared-memory region {rid} is not mapped in this worker")
        return region.view(offset, size)

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()
