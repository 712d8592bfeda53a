# cython: language_level=3, boundscheck=False, wraparound=False
"""An arena's blocks and the free lists of its segments in C. Twin of ``arena_py``; same
API, results and errors.

Thread-safe without a lock: every method runs holding the GIL and calls no Python code
while the lists are inconsistent (objects are made only before or after a change)."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.sequence cimport PySequence_GetSlice
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove

from ..errors import Internal
from .protocol_py import RegionDesc

cdef type _REGION_DESC = RegionDesc

cdef enum:
    ALIGN = 64


cdef inline uint64_t _reserved(uint64_t nbytes):
    return ((nbytes if nbytes > 1 else 1) + ALIGN - 1) & ~<uint64_t>(ALIGN - 1)


def reserved(nbytes) -> int:
    """Bytes a block of ``nbytes`` reserves: at least one, aligned up to ALIGN."""
    return (max(nbytes, 1) + ALIGN - 1) & ~(ALIGN - 1)


cdef class Block:
    """``size`` bytes requested at ``offset`` of ``segment`` (the reservation is aligned up)."""
    cdef public object segment
    cdef public object offset
    cdef public object size

    def __init__(self, segment, offset, size):
        self.segment, self.offset, self.size = segment, offset, size

    @property
    def view(self):
        return self.segment.view[self.offset:self.offset + self.size]

    def descriptor(self):
        return [self.segment.id, self.offset, self.size]

    def __repr__(self):
        return f"Block(segment={self.segment!r}, offset={self.offset!r}, size={self.size!r})"

    def __eq__(self, other):
        if not isinstance(other, Block):
            return NotImplemented
        return (self.segment, self.offset, self.size) == ((<Block>other).segment, (<Block>other).offset,
                                                          (<Block>other).size)

    __hash__ = None


cdef Block _block(object segment, uint64_t offset, uint64_t size):
    cdef Block b = Block.__new__(Block)
    b.segment, b.offset, b.size = segment, offset, size
    return b


cdef class _SegmentFree:
    """First-fit free list of one segment with coalescing of neighbours: ``n`` holes,
    sorted by start."""
    cdef object segment
    cdef bint oversized
    cdef uint64_t *starts
    cdef uint64_t *sizes
    cdef Py_ssize_t n, cap
    cdef uint64_t used

    def __cinit__(self, segment, bint oversized):
        self.segment, self.oversized = segment, oversized
        self.starts = <uint64_t *>malloc(8 * sizeof(uint64_t))
        self.sizes = <uint64_t *>malloc(8 * sizeof(uint64_t))
        if self.starts == NULL or self.sizes == NULL:
            raise MemoryError()
        self.cap, self.n, self.used = 8, 1, 0
        self.starts[0], self.sizes[0] = 0, <uint64_t>segment.size

    def __dealloc__(self):
        free(self.starts)
        free(self.sizes)

    cdef int _remove(self, Py_ssize_t i):
        memmove(&self.starts[i], &self.starts[i + 1], (self.n - i - 1) * sizeof(uint64_t))
        memmove(&self.sizes[i], &self.sizes[i + 1], (self.n - i - 1) * sizeof(uint64_t))
        self.n -= 1
        return 0

    cdef int take(self, uint64_t need, uint64_t *start):
        """1 and ``*start`` set, or 0 when no hole fits."""
        cdef Py_ssize_t i
        for i in range(self.n):
            if self.sizes[i] >= need:
                start[0] = self.starts[i]
                if self.sizes[i] == need:
                    self._remove(i)
                else:
                    self.starts[i] += need
                    self.sizes[i] -= need
                self.used += need
                return 1
        return 0

    cdef int give(self, uint64_t start, uint64_t size) except -1:
        cdef Py_ssize_t lo = 0, hi = self.n, mid, i
        cdef uint64_t *p
        while lo < hi:  # bisect_left
            mid = (lo + hi) // 2
            if self.starts[mid] < start:
                lo = mid + 1
            else:
                hi = mid
        i = lo
        if self.n == self.cap:
            p = <uint64_t *>realloc(self.starts, 2 * self.cap * sizeof(uint64_t))
            if p == NULL:
                raise MemoryError()
            self.starts = p
            p = <uint64_t *>realloc(self.sizes, 2 * self.cap * sizeof(uint64_t))
            if p == NULL:
                raise MemoryError()
            self.sizes = p
            self.cap *= 2
        memmove(&self.starts[i + 1], &self.starts[i], (self.n - i) * sizeof(uint64_t))
        memmove(&self.sizes[i + 1], &self.sizes[i], (self.n - i) * sizeof(uint64_t))
        self.starts[i], self.sizes[i] = start, size
        self.n += 1
        self.used -= size
        if i + 1 < self.n and self.starts[i] + self.sizes[i] == self.starts[i + 1]:
            self.sizes[i] += self.sizes[i + 1]
            self._remove(i + 1)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == self.starts[i]:
            self.sizes[i - 1] += self.sizes[i]
            self._remove(i)
        return 0


cdef class BlockAllocator:
    """Blocks from the free space of a set of segments, first fit in the order segments
    were added: the per-request part of ``arena.Arena``, its base class. Thread-safe:
    each call is atomic. A subclass provides ``_grow(nbytes)``, the block when no
    segment has room (it adds one with ``_add_segment``), and ``_drop(segment)``, called
    once an oversized segment is empty again (removed here already)."""
    cdef list _order   # _SegmentFree, in the order added
    cdef dict _by_id   # segment id -> _SegmentFree

    def __cinit__(self, *args, **kwargs):
        self._order, self._by_id = [], {}

    cdef _SegmentFree _take(self, uint64_t need, uint64_t *start):
        cdef _SegmentFree free
        for free in self._order:
            if free.take(need, start):
                return free
        return None

    def alloc(self, nbytes):
        cdef uint64_t start
        cdef _SegmentFree free = self._take(_reserved(nbytes), &start)
        if free is None:
            return self._grow(nbytes)
        return _block(free.segment, start, nbytes)

    def put(self, data):
        """A block holding a copy of ``data`` (a contiguous buffer): ``alloc`` and the copy
        in one call."""
        cdef Py_buffer src, dst
        cdef uint64_t start
        cdef _SegmentFree free
        cdef Block block
        try:
            PyObject_GetBuffer(data, &src, PyBUF_SIMPLE)
        except BufferError:  # not contiguous: memoryview copies it, as the twin does
            view = memoryview(data)
            block = self.alloc(view.nbytes)
            block.view[:] = view
            return block
        try:
            free = self._take(_reserved(<uint64_t>src.len), &start)
            if free is None:
                block = self._grow(src.len)
                segment, start = block.segment, block.offset
            else:
                segment = free.segment
                block = _block(segment, start, <uint64_t>src.len)
            PyObject_GetBuffer(segment.view, &dst, PyBUF_SIMPLE | PyBUF_WRITABLE)
            if <uint64_t>dst.len < start + <uint64_t>src.len:
                PyBuffer_Release(&dst)
                raise ValueError("block outside its segment")
            memcpy(<char *>dst.buf + start, src.buf, src.len)
            PyBuffer_Release(&dst)
            return block
        finally:
            PyBuffer_Release(&src)

    cdef int _free(self, segment_id, uint64_t offset, uint64_t nbytes) except -1:
        cdef _SegmentFree free = self._by_id.get(segment_id)
        if free is None:
            raise Internal(f"free of a block in unknown segment {segment_id}")
        free.give(offset, _reserved(nbytes))
        if free.used == 0 and free.oversized:
            del self._by_id[segment_id]
            self._order.remove(free)
            self._drop(free.segment)
        return 0

    def free(self, segment_id, uint64_t offset, uint64_t nbytes):
        self._free(segment_id, offset, nbytes)

    def free_blocks(self, blocks):
        """``free`` of each block, in one call."""
        cdef Block b
        for b in blocks:
            self._free(b.segment.id, b.offset, b.size)

    def free_records(self, records):
        """``free`` of each ``(segment id, offset, size)`` (a frame's FREE records), in one call."""
        for segment_id, offset, size in records:
            self._free(segment_id, offset, size)

    def _find(self, nbytes):
        """A block of ``nbytes``, or None when no segment has room."""
        cdef uint64_t start
        cdef _SegmentFree free = self._take(_reserved(nbytes), &start)
        return None if free is None else _block(free.segment, start, nbytes)

    def _add_segment(self, segment, bint oversized, nbytes):
        """A new segment (at least ``nbytes`` large) and its first block, of ``nbytes``;
        an ``oversized`` segment is dropped once empty again."""
        cdef uint64_t start
        cdef _SegmentFree free = _SegmentFree(segment, oversized)
        if not free.take(_reserved(nbytes), &start):
            raise ValueError("segment smaller than its first block")
        self._by_id[segment.id] = free
        self._order.append(free)
        return _block(segment, start, nbytes)

    def _clear(self):
        self._order.clear()
        self._by_id.clear()

    def _grow(self, nbytes):
        raise NotImplementedError

    def _drop(self, segment):
        raise NotImplementedError


cdef class _Mapped:
    """One mapped segment as ``view`` reads it: its memoryview and size held in C, so a
    view costs a bounds check and one slice, no attribute lookups on the ``Segment``."""
    cdef object segment    # arena.Segment, returned by _unmap for closing
    cdef object view       # its memoryview
    cdef long long size


cdef class SegmentViews:
    """The lookup half of ``arena.SegmentMap`` (its base class): the mapped segments by id.
    ``_map(segment)`` adds (or replaces) one, ``_unmap(seg_id)`` removes one and returns it
    (None when unknown), ``_unmap_all()`` removes and returns them all."""
    cdef dict _mapped      # segment id -> _Mapped

    def __cinit__(self, *args, **kwargs):
        self._mapped = {}

    def _map(self, segment):
        cdef _Mapped m = _Mapped.__new__(_Mapped)
        m.segment, m.view, m.size = segment, segment.view, segment.size
        self._mapped[segment.id] = m

    def _unmap(self, seg_id):
        cdef _Mapped m = self._mapped.pop(seg_id, None)
        return None if m is None else m.segment

    def _unmap_all(self):
        segments = [(<_Mapped>m).segment for m in self._mapped.values()]
        self._mapped.clear()
        return segments

    def view(self, descriptor):
        """Bounds-checked view of ``[segment id, offset, size]`` from an untrusted peer."""
        cdef long long offset, size
        cdef int offset_overflow = 0, size_overflow = 0
        if type(descriptor) is _REGION_DESC:  # a client region's bytes are never an arena's
            raise Internal("malformed shared-memory descriptor from peer")
        try:
            seg_id, o, s = descriptor
            if type(seg_id) is not int or type(o) is not int or type(s) is not int:  # decoded: ints
                seg_id, o, s = int(seg_id), int(o), int(s)
        except (TypeError, ValueError):
            raise Internal("malformed shared-memory descriptor from peer") from None
        cdef _Mapped m = self._mapped.get(seg_id)
        offset = PyLong_AsLongLongAndOverflow(o, &offset_overflow)  # overflow: past any segment
        size = PyLong_AsLongLongAndOverflow(s, &size_overflow)
        if m is None or offset_overflow or size_overflow or offset < 0 or size < 0 or offset > m.size \
                or size > m.size - offset:
            raise Internal("shared-memory descriptor from peer is out of bounds")
        return PySequence_GetSlice(m.view, <Py_ssize_t>offset, <Py_ssize_t>(offset + size))
