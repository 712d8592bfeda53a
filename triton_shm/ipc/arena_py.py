"""Pure-Python twin of ``_arena``: an arena's blocks and the free lists of its segments.
Same API, same results, same errors."""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any

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


class FreeLists:
    """The free space of every segment of one arena, first fit in the order segments
    were added. Thread-safe: each call is atomic."""

    def __init__(self) -> None:
        self._free: dict[int, _SegmentFree] = {}
        self._lock = threading.Lock()

    def add(self, segment: Any, oversized: bool, nbytes: int) -> Block:
        """A new segment (at least ``nbytes`` large) and its first block, of ``nbytes``;
        an ``oversized`` segment is removed once empty again."""
        free = _SegmentFree(segment, oversized)
        start = free.take(reserved(nbytes))
        assert start is not None
        with self._lock:
            self._free[segment.id] = free
        return Block(segment, start, nbytes)

    def take(self, nbytes: int) -> Block | None:
        """A block of ``nbytes``, or None when no segment has room."""
        need = reserved(nbytes)
        with self._lock:
            for free in self._free.values():
                start = free.take(need)
                if start is not None:
                    return Block(free.segment, start, nbytes)
        return None

    def put(self, data: Any) -> Block | None:
        """A block holding a copy of ``data`` (a contiguous buffer), or None when no
        segment has room."""
        view = memoryview(data)
        block = self.take(view.nbytes)
        if block is not None:
            block.view[:] = view
        return block

    def give(self, segment_id: int, offset: int, nbytes: int) -> Any:
        """Return a block. None, or the segment when it was an oversized one and is now
        empty (removed here: the caller closes it). KeyError for an unknown segment."""
        with self._lock:
            free = self._free[segment_id]
            free.give(offset, reserved(nbytes))
            if free.used == 0 and free.oversized:
                del self._free[segment_id]
                return free.segment
        return None

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
