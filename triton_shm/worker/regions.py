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

A model that only reads its inputs (``LoadedModel.inputs_in_place``) is lent a read-only
view of the mapping itself instead of a copy (``ClientRegion.lend``). The mapping is then
watched by the C SIGBUS handler: a truncation while the model reads puts zero pages over
it and marks it poisoned, and the worker fails the requests that read it. A poisoned
mapping is dropped and the region mapped again at its next use. The mapping lives as long
as any view of it, so a model that keeps an input after the region is unregistered keeps
valid memory (zeros, if the client truncates it meanwhile). A CUDA region's mapping follows
the same rule (``cuda.IpcMapping``): a CuPy view lent from it holds it open.
"""
from __future__ import annotations

import mmap
import os

from ..errors import Internal, InvalidArgument
from .assembler import USING_EXTENSION
from .assembler_py import RegionSpan
if USING_EXTENSION:
    from ._assembler import SharedMapping
from .cuda import CudaRegion, DeviceSpan


class ClientRegion:
    def __init__(self, fd: int, offset: int, size: int):
        self.fd, self.offset, self.size = fd, offset, size
        self.start = offset - offset % mmap.ALLOCATIONGRANULARITY
        self.delta = offset - self.start
        self.mapping: SharedMapping | None = None  # mapped at first use (see the module's docstring)

    def view(self, offset: int, size: int) -> memoryview | RegionSpan:
        """The slice's bytes for a guarded copy (or, with the twin, for ``preadv``/``pwrite``)."""
        if offset < 0 or size < 0 or offset > self.size or size > self.size - offset:
            raise InvalidArgument("shared-memory slice lies outside its registered region")
        if size == 0:
            return memoryview(b"")
        if os.fstat(self.fd).st_size < self.offset + self.size:
            raise InvalidArgument("the client's shared-memory region has shrunk since it was registered")
        if not USING_EXTENSION:
            return RegionSpan(self.fd, self.offset + offset, size, self.offset + self.size)
        mapping = self.mapping
        if mapping is None or mapping.poisoned:  # a poisoned one holds zero pages now
            try:
                mapping = self.mapping = SharedMapping(self.fd, self.delta + self.size, self.start)
            except OSError as e:
                raise InvalidArgument(f"cannot map the client's shared-memory region: {e}") from None
        start = self.delta + offset
        return memoryview(mapping)[start:start + size]

    def lend(self, offset: int, size: int) -> tuple[memoryview, SharedMapping] | None:
        """A read-only view of the slice in the mapping itself and the mapping (to ask
        whether it was poisoned once the model has read it); None where the slice can
        only be copied (the pure-Python twin, an empty slice, a full watch table)."""
        view = self.view(offset, size)
        if not isinstance(view, memoryview) or not size or not self.mapping or not self.mapping.watched:
            return None
        return view.toreadonly(), self.mapping

    def close(self) -> None:
        self.mapping = None  # unmapped with the last view of it (a model may still hold one)
        os.close(self.fd)


class RegionMap:
    def __init__(self) -> None:
        self._regions: dict[int, ClientRegion | CudaRegion] = {}

    def add_cuda(self, rid: int, handle: bytes, device: int, size: int) -> None:
        """A client's CUDA IPC region (opened here; a bad handle raises InvalidArgument)."""
        region = CudaRegion.open(handle, device, size)
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
        return self._region(rid).view(offset, size)

    def device_view(self, rid: int, offset: int, size: int) -> DeviceSpan | None:
        """The ``DeviceSpan`` of a slice of a CUDA region; None for a system region."""
        region = self._region(rid)
        return region.view(offset, size) if isinstance(region, CudaRegion) else None

    def lend(self, rid: int, offset: int, size: int) -> tuple[memoryview, SharedMapping] | None:
        """``ClientRegion.lend`` of a system region; None for a CUDA one."""
        region = self._region(rid)
        return region.lend(offset, size) if isinstance(region, ClientRegion) else None

    def _region(self, rid: int) -> ClientRegion | CudaRegion:
        region = self._regions.get(rid)
        if region is None:
            raise Internal(f"shared-memory region {rid} is not mapped in this worker")
        return region

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()
