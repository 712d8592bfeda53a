"""Shared-memory arenas that carry tensor bytes between processes.

An :class:`Arena` is owned by one process and hands out blocks from anonymous
``memfd`` segments (mode 0600, never visible in /dev/shm, so no other process can open
them by name and none is left behind by a crash). A new segment's file descriptor is
passed to the peer over the control channel; the peer maps it with a
:class:`SegmentMap`. A block is described on the wire as ``(segment id, offset, size)``.

The front-end owns one arena per worker for inputs; each worker owns one for outputs.
The peer never trusts a descriptor: :meth:`SegmentMap.view` bounds-checks every one.
"""
from __future__ import annotations

import bisect
import mmap
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Callable

from ..errors import Internal, Unavailable

ALIGN = 64
INTERNAL_PREFIX = "triton_shm_internal_"


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Segment:
    """One memfd mapping."""

    def __init__(self, seg_id: int, size: int, fd: int | None = None):
        self.id = seg_id
        self.size = size
        if fd is None:
            fd = os.memfd_create(f"{INTERNAL_PREFIX}{secrets.token_hex(8)}", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd = fd
        self.mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.mmap)

    def close(self) -> None:
        self.view.release()
        try:
            self.mmap.close()
        except BufferError:  # a view is still exported; the mapping goes with the last one
            pass
        os.close(self.fd)


@dataclass(slots=True)
class Block:
    segment: Segment
    offset: int
    size: int  # bytes requested (the reservation is aligned up)

    @property
    def view(self) -> memoryview:
        return self.segment.view[self.offset:self.offset + self.size]

    def descriptor(self) -> list[int]:
        return [self.segment.id, self.offset, self.size]


class _FreeList:
    """First-fit free list of one segment with coalescing of neighbours."""

    def __init__(self, size: int):
        self.starts: list[int] = [0]
        self.sizes: list[int] = [size]
        self.used = 0

    def take(self, n: int) -> int | None:
        for i, free in enumerate(self.sizes):
            if free >= n:
                start = self.starts[i]
                if free == n:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += n
                    self.sizes[i] -= n
                self.used += n
                return start
        return None

    def give(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.sizes.insert(i, n)
        self.used -= n
        if i + 1 < len(self.starts) and self.starts[i] + self.sizes[i] == self.starts[i + 1]:
            self.sizes[i] += self.sizes.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == self.starts[i]:
            self.sizes[i - 1] += self.sizes.pop(i)
            self.starts.pop(i)


class Arena:
    """Allocator over a growing set of segments. Thread-safe.

    ``on_new_segment(segment)`` is called (under the lock) when a segment is created so
    the owner can pass its fd to the peer before any descriptor naming it is sent.
    ``on_drop_segment(segment_id)`` is called when an oversized segment is released.
    """

    def __init__(self, chunk_size: int, *, id_base: int = 1, max_bytes: int = 1 << 40,
                 on_new_segment: Callable[[Segment], None] | None = None,
                 on_drop_segment: Callable[[int], None] | None = None):
        self.chunk_size = _align(chunk_size)
        self.max_bytes = max_bytes
        self._next_id = id_base
        self._segments: dict[int, Segment] = {}
        self._free: dict[int, _FreeList] = {}
        self._lock = threading.Lock()
        self._on_new = on_new_segment
        self._on_drop = on_drop_segment

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments.values())

    def mapped_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def alloc(self, nbytes: int) -> Block:
        need = _align(max(nbytes, 1))
        with self._lock:
            for seg_id, free in self._free.items():
                start = free.take(need)
                if start is not None:
                    return Block(self._segments[seg_id], start, nbytes)
            size = max(self.chunk_size, need)
            if self.mapped_bytes() + size > self.max_bytes:
                raise Unavailable(f"shared-memory arena is full ({self.max_bytes} bytes in use or reserved)")
            try:
                seg = Segment(self._next_id, size)
            except OSError as e:
                raise Unavailable(f"cannot allocate {size} bytes of shared memory: {e.strerror}") from None
            self._next_id += 1
            self._segments[seg.id] = seg
            free = _FreeList(size)
            self._free[seg.id] = free
            if self._on_new is not None:
                self._on_new(seg)
            start = free.take(need)
            assert start is not None
            return Block(seg, start, nbytes)

    def free(self, segment_id: int, offset: int, nbytes: int) -> None:
        with self._lock:
            free = self._free.get(segment_id)
            if free is None:
                raise Internal(f"free of a block in unknown segment {segment_id}")
            free.give(offset, _align(max(nbytes, 1)))
            seg = self._segments[segment_id]
            # Oversized one-off segments go back to the OS once empty.
            if free.used == 0 and seg.size > self.chunk_size:
                del self._segments[segment_id], self._free[segment_id]
                if self._on_drop is not None:
                    self._on_drop(segment_id)
                seg.close()

    def close(self) -> None:
        with self._lock:
            for seg in self._segments.values():
                seg.close()
            self._segments.clear()
            self._free.clear()


class SegmentMap:
    """The peer's view of an arena: segments received by fd, looked up by id."""

    def __init__(self) -> None:
        self._segments: dict[int, Segment] = {}

    def add(self, seg_id: int, size: int, fd: int) -> None:
        if size <= 0 or os.fstat(fd).st_size < size:
            os.close(fd)
            raise Internal("peer sent a segment smaller than it claims")
        old = self._segments.pop(seg_id, None)
        if old is not None:
            old.close()
        self._segments[seg_id] = Segment(seg_id, size, fd)

    def drop(self, seg_id: int) -> None:
        seg = self._segments.pop(seg_id, None)
        if seg is not None:
            seg.close()

    def view(self, descriptor) -> memoryview:
        """Bounds-checked view of ``[segment id, offset, size]`` from an untrusted peer."""
        try:
            seg_id, offset, size = (int(x) for x in descriptor)
        except (TypeError, ValueError):
            raise Internal("malformed shared-memory descriptor from peer") from None
        seg = self._segments.get(seg_id)
        if seg is None or offset < 0 or size < 0 or offset > seg.size or size > seg.size - offset:
            raise Internal("shared-memory descriptor from peer is out of bounds")
        return seg.view[offset:offset + size]

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
