"""Pure-Python twin of ``_ring``: the ring of ``csrc/ring.h`` (layout documented there)
with ``struct`` on the mapping. Same API and errors.

Python has no memory fences. The data-before-position order holds on x86-64 (stores are
not reordered with stores, loads not with loads), but the wake-up handshake needs a
store-load fence, so this twin never skips a wake: every push asks for one. Spinning is
not offered (it would hold the GIL). The futex on the sleeping word goes through
``ctypes`` (``syscall(2)``; ctypes lets the GIL go meanwhile).

The words the peer reads (head, tail, sleeping) go through native-width memoryview
items: one aligned load or store each, as in C. Never ``struct.pack_into`` there: it clears
the field before it writes the value, and a peer that reads in between sees a position of
0 (a ring "past its end", or full)."""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Any

from ..errors import Internal
from . import channel

HEADER = 4096
_WRAP = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_REC = struct.Struct("<II")
_HEAD, _TAIL, _SLEEPING = 0, 64 // 8, 128 // 4  # word indexes: u64 head and tail, u32 sleeping
ON_SOCKET = 1  # record flag of ``link``: the frame is the next message on the socket
# How long a worker sleeps before it looks at the socket for the front-end's end-of-file:
# only a front-end that died without closing the link waits for it (its close wakes the worker).
PEER_CHECK_NS = 100_000_000

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_FUTEX = ctypes.c_long({"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202))  # syscall(long, ...)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_INT_MAX = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(addr: int, timeout_ns: int) -> bool:
    """Sleep while the u32 at ``addr`` is 1 (``csrc/ring.h``'s tsm_ring_sleep); False on timeout."""
    ts = _Timespec(timeout_ns // 1_000_000_000, timeout_ns % 1_000_000_000) if timeout_ns else None
    rc = _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, 1, ctypes.byref(ts) if ts else None,
                       None, 0)
    return not (rc < 0 and ctypes.get_errno() == errno.ETIMEDOUT)


def _futex_wake(addr: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, _INT_MAX, None, None, 0)


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
        self.kicked = False  # the consumer's own: see ``kick``
        self._futex: Any = None  # the sleeping word as a ctypes object (its address), made on first use

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

    def _futex_addr(self) -> int:
        if self._futex is None:
            self._futex = ctypes.c_uint32.from_buffer(self.buf, _SLEEPING * 4)
        return ctypes.addressof(self._futex)

    def wake(self) -> None:
        """Wake a consumer asleep on the sleeping word (``tsm_ring_wake``)."""
        self._u32[_SLEEPING] = 0
        _futex_wake(self._futex_addr())

    def sleep(self, timeout_ns: int) -> int:
        """After ``prepare_sleep`` said yes: 0 timed out, 1 woken, 2 kicked (``tsm_ring_sleep``)."""
        result = 1
        if not self.kicked and not _futex_wait(self._futex_addr(), timeout_ns):
            result = 0
        self._u32[_SLEEPING] = 0
        if self.kicked:
            self.kicked = False
            result = 2
        return result

    def kick(self) -> None:
        """Another thread of the consumer's process wakes its sleep (the GIL orders the flag)."""
        self.kicked = True
        if self._u32[_SLEEPING]:
            self.wake()


class LinkCore:
    """The per-frame half of ``link.Link`` (its base class; documented there): sending
    and receiving a frame, waiting for one, and clearing the wake-up. ``Link`` provides
    ``socket_state()`` and ``_wait_eventfd(spin_ns)``, and sets
    ``sock``, ``tx``, ``rx``, ``tx_wake``, ``rx_wake`` (an eventfd, or -1: that direction
    wakes its consumer by the futex on the ring's sleeping word) and ``_receiver`` (a
    ``channel.Receiver``)."""

    sock: Any  # socket.socket
    tx: Ring
    rx: Ring
    tx_wake: int
    rx_wake: int
    _receiver: Any  # channel.Receiver

    def send(self, frame: bytes | bytearray, fds: list[int] | None = None) -> None:
        """Raises BlockingIOError when the ring (or the socket) is full."""
        flags = 0
        if fds or len(frame) > self.tx.max_record:
            if self.tx.room() < 8:  # the record that keeps its place must fit once it is sent
                raise BlockingIOError("ring full")
            channel.send(self.sock, frame, fds)
            frame, flags = b"", ON_SOCKET
        rc = self.tx.push(frame, flags)
        if rc < 0:
            raise BlockingIOError("ring full")
        if rc:
            self.wake_peer()

    def wake_peer(self) -> None:
        """Wake the peer as a push would, with nothing pushed (it looks at the link again)."""
        if self.tx_wake >= 0:
            os.eventfd_write(self.tx_wake, 1)
        else:
            self.tx.wake()

    def kick(self) -> None:
        """From another thread of this process: wake the thread that waits for our ring."""
        if self.rx_wake >= 0:
            os.eventfd_write(self.rx_wake, 1)
        else:
            self.rx.kick()

    def wait(self, spin_ns: int) -> bool:
        """Block until a frame may be waiting; False once the peer is gone (``Link.wait``).
        The twin does not spin."""
        if self.rx_wake >= 0:
            return self._wait_eventfd(spin_ns)  # type: ignore[attr-defined]  # Link's
        rx = self.rx
        if not rx.prepare_sleep() or rx.sleep(PEER_CHECK_NS) == 2 or rx.pending():
            return True
        return self.socket_state() != "eof"  # type: ignore[attr-defined]  # Link's

    def recv(self) -> tuple[bytes, list[int]] | None:
        """The next frame and its fds, or None while the ring is empty. Raises
        ``RingCorrupt`` if the peer broke its ring, ConnectionError at end-of-file."""
        record = self.rx.pop()
        if record is None:
            return None
        data, flags = record
        if not flags & ON_SOCKET:
            return data, []
        frame, fds = self._receiver.recv()  # sent before its record: it is there
        if frame is None:
            raise ConnectionError("peer closed the link")
        return frame, fds

    def clear_wake(self) -> None:
        try:
            os.eventfd_read(self.rx_wake)
        except BlockingIOError:
            pass
