"""Pure-Python twin of ``_arena``: an arena's blocks and the free lists of its segments.
Same API, same results, same errors."""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import Internal
from .protocol_py import RegionDesc

ALIGN = 64


@dataclass(slots=True)
class Block:
    segment: Any  # arena.Segment
    offset: int
    size: int  # bytes requested (the reservation is aligned up)

    @property
    def view(self) -> memoryview:
        return self.segment.view[self.offset:self.offset + self.size]

    def descriptor(self) -> list[int]:
        return [self.segment.id, self.offset, self.size]


def reserved(nbytes: int) -> int:
    """Bytes a block of ``nbytes`` reserves: at least one, aligned up to ALIGN."""
    return (max(nbytes, 1) + ALIGN - 1) & ~(ALIGN - 1)


class _SegmentFree:
    """First-fit free list of one segment with coalescing of neighbours."""

    __slots__ = ("segment", "oversized", "starts", "sizes", "used")

    def __init__(self, segment: Any, oversized: bool):
        self.segment, self.oversized = segment, oversized
        self.starts: list[int] = [0]
        self.sizes: list[int] = [segment.size]
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


class BlockAllocator:
    """Blocks from the free space of a set of segments, first fit in the order segments
    were added: the per-request part of ``arena.Arena``, its base class. Thread-safe:
    each call is atomic. A subclass provides ``_grow(nbytes)``, the block when no
    segment has room (it adds one with ``_add_segment``), and ``_drop(segment)``, called
    once an oversized segment is empty again (removed here already)."""

    def __init__(self) -> None:
        self._free: dict[int, _SegmentFree] = {}
        self._free_lock = threading.Lock()

    def alloc(self, nbytes: int) -> Block:
        block = self._find(nbytes)
        return block if block is not None else self._grow(nbytes)

    def put(self, data: Any) -> Block:
        """A block holding a copy of ``data`` (a contiguous buffer): ``alloc`` and the copy
        in one call."""
        view = memoryview(data)
        block = self.alloc(view.nbytes)
        if view.nbytes:  # a view with a zero in its shape has nothing to copy (and can not be cast)
            block.view[:] = view.cast("B") if view.c_contiguous else view  # any shape and format, as in C
        return block

    def free(self, segment_id: int, offset: int, nbytes: int) -> None:
        with self._free_lock:
            free = self._free.get(segment_id)
            if free is None:
                raise Internal(f"free of a block in unknown segment {segment_id}")
            free.give(offset, reserved(nbytes))
            dropped = free.used == 0 and free.oversized
            if dropped:
                del self._free[segment_id]
        if dropped:
            self._drop(free.segment)

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """``free`` of each block, in one call."""
        for b in blocks:
            self.free(b.segment.id, b.offset, b.size)

    def free_records(self, records: Iterable[tuple[int, int, int]]) -> None:
        """``free`` of each ``(segment id, offset, size)`` (a frame's FREE records), in one call."""
        for segment_id, offset, size in records:
            self.free(segment_id, offset, size)

    def _find(self, nbytes: int) -> Block | None:
        """A block of ``nbytes``, or None when no segment has room."""
        need = reserved(nbytes)
        with self._free_lock:
            for free in self._free.values():
                start = free.take(need)
                if start is not None:
                    return Block(free.segment, start, nbytes)
        return None

    def _add_segment(self, segment: Any, oversized: bool, nbytes: int) -> Block:
        """A new segment (at least ``nbytes`` large) and its first block, of ``nbytes``;
        an ``oversized`` segment is dropped once empty again."""
        free = _SegmentFree(segment, oversized)
        start = free.take(reserved(nbytes))
        if start is None:
            raise ValueError("segment smaller than its first block")
        with self._free_lock:
            self._free[segment.id] = free
        return Block(segment, start, nbytes)

    def _clear(self) -> None:
        with self._free_lock:
            self._free.clear()

    def _grow(self, nbytes: int) -> Block:
        raise NotImplementedError

    def _drop(self, segment: Any) -> None:
        raise NotImplementedError


class SegmentViews:
    """The lookup half of ``arena.SegmentMap`` (its base class): the mapped segments by id.
    ``_map(segment)`` adds (or replaces) one, ``_unmap(seg_id)`` removes one and returns it
    (None when unknown), ``_unmap_all()`` removes and returns them all."""

    def __init__(self) -> None:
        self._segments: dict[int, Any] = {}  # id -> arena.Segment

    def _map(self, segment: Any) -> None:
        self._segments[segment.id] = segment

    def _unmap(self, seg_id: int) -> Any:
        return self._segments.pop(seg_id, None)

    def _unmap_all(self) -> list[Any]:
        segments = list(self._segments.values())
        self._segments.clear()
        return segments

    def view(self, descriptor) -> memoryview:
        """Bounds-checked view of ``[segment id, offset, size]`` from an untrusted peer."""
        if type(descriptor) is RegionDesc:  # a client region's bytes are never an arena's
            raise Internal("malformed shared-memory descriptor from peer")
        try:
            seg_id, offset, size = descriptor
            if type(seg_id) is not int or type(offset) is not int or type(size) is not int:  # decoded: ints
                seg_id, offset, size = int(seg_id), int(offset), int(size)
        except (TypeError, ValueError):
            raise Internal("malformed shared-memory descriptor from peer") from None
        seg = self._segments.get(seg_id)
        if seg is None or offset < 0 or size < 0 or offset > seg.size or size > seg.size - offset:
            raise Internal("shared-memory descriptor from peer is out of bounds")
        return seg.view[offset:offset + size]
