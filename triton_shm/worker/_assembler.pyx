# cython: language_level=3, boundscheck=False, wraparound=False
"""Batch assembler in C (csrc/assembler.c). Twin of ``assembler_py``; same API and errors.

The buffers are pinned (held as typed memoryviews) for the whole copy, which runs with
the GIL released, so other instance threads keep running. Copies are guarded: a
client region truncated under the copy raises InvalidArgument instead of a SIGBUS.
"""
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport errno
from libc.stdint cimport uint8_t
from libc.string cimport strerror
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap
from posix.types cimport off_t

from ..errors import Internal, InvalidArgument
from .assembler_py import FAULT

GUARDED = tsm_install_sigbus_guard() == 0


cdef class SharedMapping:
    """A client region mapped shared, read and write, and watched: a SIGBUS inside it (the
    client truncated its object while a model read it in place) puts zero pages over the
    whole mapping and sets ``poisoned`` instead of killing the worker. It exports its
    bytes as a buffer, and is unmapped when the last view of it goes: a model that keeps
    an input after its region is unregistered keeps valid memory. ``watched`` is False
    when the watch table is full; the mapping then serves only guarded copies."""
    cdef uint8_t *base
    cdef size_t length
    cdef int slot

    def __cinit__(self, int fd, size_t length, off_t offset):
        self.base = NULL
        self.slot = -1
        cdef void *address = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset)
        if address == MAP_FAILED:
            raise OSError(errno, strerror(errno).decode())
        self.base, self.length = <uint8_t *>address, length
        self.slot = tsm_watch(address, length)

    def __dealloc__(self):
        if self.base != NULL:
            tsm_unwatch(self.slot)  # before the range can be mapped again by anything else
            munmap(self.base, self.length)

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.base, <Py_ssize_t>self.length, 0, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __len__(self) -> int:
        return self.length

    @property
    def watched(self) -> bool:
        return self.slot >= 0

    @property
    def poisoned(self) -> bool:
        return tsm_poisoned(self.slot) != 0


def copy(dst, src) -> int:
    """Copy ``src`` into the start of ``dst``; returns the bytes copied."""
    cdef uint8_t[::1] out = memoryview(dst).cast("B")
    cdef const uint8_t[::1] inp = memoryview(src).cast("B")
    cdef size_t n = inp.shape[0]
    cdef int rc = 0
    if <Py_ssize_t>n > out.shape[0]:
        raise Internal(f"copy of {n} bytes into a {out.shape[0]}-byte buffer")
    if n:
        with nogil:
            rc = tsm_guarded_copy(&out[0], &inp[0], n)
    if rc != 0:
        raise InvalidArgument(FAULT)
    return n


def gather(dst, srcs) -> int:
    """Copy every buffer of ``srcs`` back to back into ``dst``; returns the bytes written."""
    cdef uint8_t[::1] out = memoryview(dst).cast("B")
    views = [memoryview(s).cast("B") for s in srcs]
    cdef Py_ssize_t n = len(views), i, total = 0
    for v in views:
        total += (<memoryview>v).nbytes
    if total > out.shape[0]:
        raise Internal(f"batch assembler: {total} bytes do not fit the {out.shape[0]}-byte buffer")
    cdef const uint8_t **ptrs = <const uint8_t **>PyMem_Malloc(sizeof(uint8_t *) * (n + 1))
    cdef size_t *sizes = <size_t *>PyMem_Malloc(sizeof(size_t) * (n + 1))
    cdef const uint8_t[::1] src
    cdef uint8_t *base = &out[0] if out.shape[0] else NULL
    cdef int rc
    try:
        if ptrs == NULL or sizes == NULL:
            raise MemoryError()
        for i in range(n):
            src = views[i]
            sizes[i] = src.shape[0]
            ptrs[i] = &src[0] if src.shape[0] else NULL
        rc = 0
        if total:
            with nogil:
                rc = tsm_gather(base, ptrs, sizes, n)
        if rc != 0:
            raise InvalidArgument(FAULT)
        return total
    finally:
        PyMem_Free(ptrs)
        PyMem_Free(sizes)


def scatter(src, dsts) -> int:
    """Copy consecutive spans of ``src`` into each buffer of ``dsts`` (their lengths
    define the split); returns the bytes read."""
    cdef const uint8_t[::1] inp = memoryview(src).cast("B")
    views = [memoryview(d).cast("B") for d in dsts]
    cdef Py_ssize_t n = len(views), i, total = 0
    for v in views:
        total += (<memoryview>v).nbytes
    if total > inp.shape[0]:
        raise Internal(f"batch assembler: destinations need {total} bytes, the batch has {inp.shape[0]}")
    cdef uint8_t **ptrs = <uint8_t **>PyMem_Malloc(sizeof(uint8_t *) * (n + 1))
    cdef size_t *sizes = <size_t *>PyMem_Malloc(sizeof(size_t) * (n + 1))
    cdef uint8_t[::1] dst
    cdef const uint8_t *base = &inp[0] if inp.shape[0] else NULL
    cdef int rc
    try:
        if ptrs == NULL or sizes == NULL:
            raise MemoryError()
        for i in range(n):
            dst = views[i]
            sizes[i] = dst.shape[0]
            ptrs[i] = &dst[0] if dst.shape[0] else NULL
        rc = 0
        if total:
            with nogil:
                rc = tsm_scatter(base, ptrs, sizes, n)
        if rc != 0:
            raise InvalidArgument(FAULT)
        return total
    finally:
        PyMem_Free(ptrs)
        PyMem_Free(sizes)
