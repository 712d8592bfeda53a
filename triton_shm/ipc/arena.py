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

import mmap
import os
import secrets
import threading
from typing import Callable

from .._twins import pick
from ..errors import Internal, Unavailable

INTERNAL_PREFIX = "triton_shm_internal_"

from .arena_py import ALIGN, Block, BlockAllocator, SegmentViews, reserved  # noqa: E402

USING_EXTENSION = pick(globals(), "._arena", "Block", "BlockAllocator", "SegmentViews", "reserved")


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


class Arena(BlockAllocator):
    """Allocator over a growing set of segments. Thread-safe.

    ``alloc(nbytes)``, ``put(data)`` (alloc and copy), ``free(segment id, offset,
    nbytes)``, ``free_blocks(blocks)`` and ``free_records(records)`` (a frame's FREE
    records) are ``BlockAllocator``'s (C: no Python code
    runs per block while a segment has room); this class adds and drops segments.
    ``on_new_segment(segment)`` is called (under the lock) when a segment is created so
    the owner can pass its fd to the peer before any descriptor naming it is sent.
    ``on_drop_segment(segment_id)`` is called when an oversized segment is released.
    """

    def __init__(self, chunk_size: int, *, id_base: int = 1, max_bytes: int = 1 << 40,
                 on_new_segment: Callable[[Segment], None] | None = None,
                 on_drop_segment: Callable[[int], None] | None = None):
        super().__init__()
        self.chunk_size = _align(chunk_size)
        self.max_bytes = max_bytes
        self._next_id = id_base
        self._segments: dict[int, Segment] = {}
        self._lock = threading.Lock()  # serializes changes to the set of segments
        self._on_new = on_new_segment
        self._on_drop = on_drop_segment

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments.values())

    def mapped_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def _grow(self, nbytes: int) -> Block:
        """``alloc`` when no segment has room: a new segment."""
        with self._lock:
            block = self._find(nbytes)  # another thread may have added one meanwhile
            if block is not None:
                return block
            size = max(self.chunk_size, reserved(nbytes))
            if self.mapped_bytes() + size > self.max_bytes:
                raise Unavailable(f"shared-memory arena is full ({self.max_bytes} bytes in use or reserved)")
            try:
                seg = Segment(self._next_id, size)
            except OSError as e:
                raise Unavailable(f"cannot allocate {size} bytes of shared memory: {e.strerror}") from None
            self._next_id += 1
            self._segments[seg.id] = seg
            if self._on_new is not None:  # the peer knows the segment before any block of it is used
                self._on_new(seg)
            return self._add_segment(seg, size > self.chunk_size, nbytes)

    def _drop(self, seg: Segment) -> None:
        """An oversized one-off segment, empty again, goes back to the OS."""
        with self._lock:
            del self._segments[seg.id]
            if self._on_drop is not None:
                self._on_drop(seg.id)
            seg.close()

    def close(self) -> None:
        with self._lock:
            for seg in self._segments.values():
                seg.close()
            self._segments.clear()
            self._clear()


class SegmentMap(SegmentViews):
    """The peer's view of an arena: segments received by fd, looked up by id
    (``view(descriptor)``, bounds-checked, is ``SegmentViews``'s: C when built)."""

    def add(self, seg_id: int, size: int, fd: int) -> None:
        if size <= 0 or os.fstat(fd).st_size < size:
            os.close(fd)
            raise Internal("peer sent a segment smaller than it claims")
        old = self._unmap(seg_id)
        if old is not None:
            old.close()
        self._map(Segment(seg_id, size, fd))

    def drop(self, seg_id: int) -> None:
        seg = self._unmap(seg_id)
        if seg is not None:
            seg.close()

    def close(self) -> None:
        for seg in self._unmap_all():
            seg.close()
