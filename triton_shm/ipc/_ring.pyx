# cython: language_level=3, boundscheck=False, wraparound=False
"""The shared-memory ring in C (csrc/ring.h). Twin of ``ring_py``; same API and errors."""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from .ring_py import HEADER, RingCorrupt, check_capacity


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
