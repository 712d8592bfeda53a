"""Pure-Python twin of ``_ring``: the ring of ``csrc/ring.h`` (layout documented there)
with ``struct`` on the mapping. Same API and errors.

Python has no memory fences. The data-before-position order holds on x86-64 (stores are
not reordered with stores, loads not with loads), but the wake-up handshake needs a
store-load fence, so this twin never skips a wake: every push asks for one. Spinning is
not offered (it would hold the GIL).

The words the peer reads (head, tail, sleeping) go through native-width memoryview
items: one aligned load or store each, as in C. Never ``struct.pack_into`` there: it clears
the field before it writes the value, and a peer that reads in between sees a position of
0 (a ring "past its end", or full)."""
from __future__ import annotations

import struct

from ..errors import Internal

HEADER = 4096
_WRAP = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_REC = struct.Struct("<II")
_HEAD, _TAIL, _SLEEPING = 0, 64 // 8, 128 // 4  # word indexes: u64 head and tail, u32 sleeping


class RingCorrupt(Internal):
    """The peer wrote positions or lengths that point outside the ring."""


def check_capacity(size: int, capacity: int) -> None:
    if capacity < 64 or capacity & (capacity - 1) or size < HEADER + capacity:
        raise ValueError(f"ring of {capacity} bytes needs a power of two and {HEADER + capacity} mapped bytes")


class Ring:
    def __init__(self, buf, capacity: int):
        check_capacity(len(buf), capacity)
        self.buf = memoryview(buf).cast("B")
        # native-width views of the header: an item store is one aligned store
        self._u64 = self.buf[:HEADER].cast("Q")
        self._u32 = self.buf[:HEADER].cast("I")
        self.capacity = capacity
        self.max_record = capacity // 2 - 8
        self.pos = 0  # ours: the copy in shared memory is what the peer may scribble on

    def push(self, data, flags: int = 0) -> int:
        n = len(data)
        if n > self.max_record:
            return -1
        buf, cap = self.buf, self.capacity
        tail = self.pos
        head = self._u64[_HEAD]
        need = 8 + ((n + 7) & ~7)
        idx = tail & (cap - 1)
        room = cap - idx
        total = need if room >= need else room + need
        if tail - head > cap or total > cap - (tail - head):
            return -1
        if room < need:
            _U32.pack_into(buf, HEADER + idx, _WRAP)
            tail += room
            idx = 0
        _REC.pack_into(buf, HEADER + idx, n, flags)
        buf[HEADER + idx + 8:HEADER + idx + 8 + n] = data
        self.pos = tail + need
        self._u64[_TAIL] = self.pos  # published after the record (x86-64 keeps store order)
        return 1

    def room(self) -> int:
        used = self.pos - self._u64[_HEAD]
        return 0 if used > self.capacity else self.capacity - used

    def pop(self) -> tuple[bytes, int] | None:
        buf, cap = self.buf, self.capacity
        head = self.pos
        tail = self._u64[_TAIL]
        if tail == head:
            return None
        if not 8 <= tail - head <= cap:
            raise RingCorrupt("ring index past its end (the peer broke the ring)")
        idx = head & (cap - 1)
        n, flags = _REC.unpack_from(buf, HEADER + idx)  # idx is 8-aligned: the record header fits
        if n == _WRAP:
            head += cap - idx
            if not 8 <= tail - head <= cap:
                raise RingCorrupt("ring index past its end (the peer broke the ring)")
            idx = 0
            n, flags = _REC.unpack_from(buf, HEADER)
        need = 8 + ((n + 7) & ~7)
        if n > self.max_record or need > tail - head or idx + need > cap:
            raise RingCorrupt("ring index past its end (the peer broke the ring)")
        data = bytes(buf[HEADER + idx + 8:HEADER + idx + 8 + n])
        self.pos = head + need
        self._u64[_HEAD] = self.pos
        return data, flags

    def pending(self) -> bool:
        return self._u64[_TAIL] != self.pos

    def prepare_sleep(self) -> bool:
        self._u32[_SLEEPING] = 1
        if self.pending():
            self._u32[_SLEEPING] = 0
            return False
        return True

    def awake(self) -> None:
        self._u32[_SLEEPING] = 0

    def spin(self, ns: int) -> bool:
        return self.pending()
