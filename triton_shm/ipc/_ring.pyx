# cython: language_level=3, boundscheck=False, wraparound=False
"""The shared-memory ring in C (csrc/ring.h). Twin of ``ring_py``; same API and errors."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport EAGAIN, errno
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport read, write

import os

from . import channel
from .ring_py import HEADER, ON_SOCKET, PEER_CHECK_NS, RingCorrupt, check_capacity


cdef class Ring:
    """One direction of a worker's rings over ``buf`` (a writable mapping of
    ``HEADER + capacity`` bytes). One side only pushes, the other only pops."""
    cdef tsm_ring r
    cdef object buf
    cdef uint8_t[::1] view

    def __init__(self, buf, uint64_t capacity):
        check_capacity(len(buf), capacity)
        self.buf = buf
        self.view = memoryview(buf).cast("B")
        self.r.base = &self.view[0]
        self.r.capacity = capacity
        self.r.pos = 0
        self.r.kicked = 0

    @property
    def max_record(self) -> int:
        return tsm_ring_max_record(&self.r)

    def push(self, data, uint32_t flags=0) -> int:
        """1: pushed, wake the consumer; 0: pushed, it is awake; -1: full (nothing pushed)."""
        cdef const uint8_t[::1] v = data
        cdef int wake = 0, rc
        cdef const uint8_t *p = &v[0] if v.shape[0] else <const uint8_t *>b""
        if <uint64_t>v.shape[0] > tsm_ring_max_record(&self.r):
            return -1
        rc = tsm_ring_push(&self.r, p, <uint32_t>v.shape[0], flags, &wake)
        if rc == TSM_RING_FULL:
            return -1
        return 1 if wake else 0

    def room(self) -> int:
        """Bytes free for records (producer side)."""
        return tsm_ring_room(&self.r)

    def pop(self):
        """``(payload, flags)`` of the next record, or None when empty."""
        cdef const uint8_t *p
        cdef uint32_t n, flags
        cdef uint64_t next_pos
        cdef int rc = tsm_ring_peek(&self.r, &p, &n, &flags, &next_pos)
        if rc == TSM_RING_EMPTY:
            return None
        if rc == TSM_RING_CORRUPT:
            raise RingCorrupt("ring index past its end (the peer broke the ring)")
        data = PyBytes_FromStringAndSize(<const char *>p, n)
        tsm_ring_consume(&self.r, next_pos)
        return data, flags

    def pending(self) -> bool:
        return tsm_ring_pending(&self.r) != 0

    def prepare_sleep(self) -> bool:
        return tsm_ring_prepare_sleep(&self.r) != 0

    def awake(self) -> None:
        tsm_ring_awake(&self.r)

    def spin(self, uint64_t ns) -> bool:
        """Wait up to ``ns`` for a record without sleeping; the GIL is released meanwhile."""
        cdef int got
        with nogil:
            got = tsm_ring_spin(&self.r, ns)
        return got != 0


cdef int _eventfd_write(int fd) except -1:
    cdef uint64_t one = 1
    if write(fd, &one, 8) != 8:
        raise OSError(errno, os.strerror(errno))  # BlockingIOError for EAGAIN, as os.eventfd_write
    return 0


cdef uint64_t _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <uint64_t>t.tv_sec * 1000000000u + <uint64_t>t.tv_nsec


cdef class LinkCore:
    """The per-frame half of ``link.Link`` (its base class; documented there): sending
    and receiving a frame, waiting for one, and clearing the wake-up, in C. ``Link`` provides
    ``socket_state()`` and ``_wait_eventfd(spin_ns)``, and sets
    ``sock``, ``tx``, ``rx``, ``tx_wake``, ``rx_wake`` (an eventfd, or -1: that direction
    wakes its consumer by the futex on the ring's sleeping word) and ``_receiver`` (a
    ``channel.Receiver``)."""
    cdef public Ring tx, rx
    cdef public int tx_wake, rx_wake
    cdef public object sock, _receiver
    cdef bint _spinning

    def __cinit__(self):
        self._spinning = True

    cdef inline int _wake(self) except -1:
        if self.tx_wake >= 0:
            _eventfd_write(self.tx_wake)
        else:
            with nogil:
                tsm_ring_wake(&self.tx.r)
        return 0

    def send(self, frame, fds=None):
        """Raises BlockingIOError when the ring (or the socket) is full."""
        cdef Py_buffer buf
        cdef uint32_t flags = 0
        cdef int wake = 0, rc
        if fds or <uint64_t>len(frame) > tsm_ring_max_record(&self.tx.r):
            if tsm_ring_room(&self.tx.r) < 8:  # the record that keeps its place must fit once it is sent
                raise BlockingIOError("ring full")
            channel.send(self.sock, frame, fds)
            frame, flags = b"", ON_SOCKET
        PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE)
        rc = tsm_ring_push(&self.tx.r, <const uint8_t *>buf.buf, <uint32_t>buf.len, flags, &wake)
        PyBuffer_Release(&buf)
        if rc == TSM_RING_FULL:
            raise BlockingIOError("ring full")
        if wake:
            self._wake()

    def wake_peer(self):
        """Wake the peer as a push would, with nothing pushed (it looks at the link again)."""
        self._wake()

    def kick(self):
        """From another thread of this process: wake the thread that waits for our ring."""
        if self.rx_wake >= 0:
            _eventfd_write(self.rx_wake)
        else:
            tsm_ring_kick(&self.rx.r)

    def wait(self, uint64_t spin_ns):
        """Block until a frame may be waiting; False once the peer is gone (``Link.wait``)."""
        if self.rx_wake >= 0:
            return self._wait_eventfd(spin_ns)
        if self._sleep(spin_ns, PEER_CHECK_NS):
            return True
        return self.socket_state() != "eof"

    cdef bint _sleep(self, uint64_t spin_ns, uint64_t timeout_ns) except -1:
        """The futex direction: True when a record may be there (or ``kick``), False when none
        came within ``timeout_ns`` or the wake-up brought none. Spins first while that pays."""
        cdef int got, rc
        cdef uint64_t slept
        if self._spinning:
            with nogil:
                got = tsm_ring_spin(&self.rx.r, spin_ns)
            if got:
                return True
            self._spinning = False
        if not tsm_ring_prepare_sleep(&self.rx.r):
            return True
        with nogil:
            slept = _now_ns()
            rc = tsm_ring_sleep(&self.rx.r, timeout_ns)
            slept = _now_ns() - slept
        self._spinning = slept < spin_ns
        return rc == TSM_RING_KICKED or tsm_ring_pending(&self.rx.r) != 0

    def recv(self):
        """The next frame and its fds, or None while the ring is empty. Raises
        ``RingCorrupt`` if the peer broke its ring, ConnectionError at end-of-file."""
        cdef const uint8_t *p
        cdef uint32_t n, flags
        cdef uint64_t next_pos
        cdef int rc = tsm_ring_peek(&self.rx.r, &p, &n, &flags, &next_pos)
        if rc == TSM_RING_EMPTY:
            return None
        if rc == TSM_RING_CORRUPT:
            raise RingCorrupt("ring index past its end (the peer broke the ring)")
        data = PyBytes_FromStringAndSize(<const char *>p, n)
        tsm_ring_consume(&self.rx.r, next_pos)
        if not flags & ON_SOCKET:
            return data, []
        frame, fds = self._receiver.recv()  # sent before its record: it is there
        if frame is None:
            raise ConnectionError("peer closed the link")
        return frame, fds

    def clear_wake(self):
        cdef uint64_t value
        if read(self.rx_wake, &value, 8) < 0 and errno != EAGAIN:
            raise OSError(errno, os.strerror(errno))
