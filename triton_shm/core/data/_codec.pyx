# cython: language_level=3, boundscheck=False, wraparound=False
"""BYTES tensor codec in C (csrc/bytes_codec.c). Twin of ``codec_py``; same API and errors."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint32_t
from libc.stdlib cimport free, malloc

import numpy as np

from ...errors import InvalidArgument


cdef object _error(tsm_bytes_status status, Py_ssize_t count, size_t bad, size_t remaining):
    if status == TSM_BYTES_SHORT_HEADER:
        return InvalidArgument(
            f"BYTES tensor holds fewer than the {count} elements its shape needs "
            f"(data ends after {bad} elements)")
    if status == TSM_BYTES_OVERRUN:
        return InvalidArgument(
            f"BYTES element {bad} declares more bytes than the {remaining} that remain in the buffer")
    return InvalidArgument(
        f"BYTES tensor has {remaining} unexpected trailing bytes after its {count} elements")


cdef void _index(const uint8_t[::1] view, Py_ssize_t count, size_t *starts, uint32_t *lengths) except *:
    cdef size_t bad = 0, remaining = 0
    cdef tsm_bytes_status status
    cdef const uint8_t *ptr = &view[0] if view.shape[0] else <const uint8_t *>b""
    with nogil:
        status = tsm_bytes_index(ptr, <size_t>view.shape[0], <size_t>count,
                                 starts, lengths, &bad, &remaining)
    if status != TSM_BYTES_OK:
        raise _error(status, count, bad, remaining)


def validate_bytes(buf, Py_ssize_t count):
    """Check that ``buf`` holds exactly ``count`` well-formed elements."""
    cdef const uint8_t[::1] view = memoryview(buf).cast("B")
    _index(view, count, NULL, NULL)


def deserialize_bytes(buf, Py_ssize_t count):
    """Decode ``count`` elements into a 1-D object array of ``bytes``."""
    cdef const uint8_t[::1] view = memoryview(buf).cast("B")
    cdef size_t *starts = <size_t *>malloc(sizeof(size_t) * (count + 1))
    cdef uint32_t *lengths = <uint32_t *>malloc(sizeof(uint32_t) * (count + 1))
    cdef Py_ssize_t i
    if starts == NULL or lengths == NULL:
        free(starts)
        free(lengths)
        raise MemoryError()
    try:
        _index(view, count, starts, lengths)
        out = np.empty(count, dtype=np.object_)
        for i in range(count):
            out[i] = PyBytes_FromStringAndSize(<const char *>&view[0] + starts[i], lengths[i])
        return out
    finally:
        free(starts)
        free(lengths)


def count_bytes(buf):
    """The number of elements ``buf`` holds, when they fill it exactly."""
    cdef const uint8_t[::1] view = memoryview(buf).cast("B")
    cdef const uint8_t *ptr = &view[0] if view.shape[0] else <const uint8_t *>b""
    cdef size_t count = 0, remaining = 0
    cdef tsm_bytes_status status
    with nogil:
        status = tsm_bytes_count(ptr, <size_t>view.shape[0], &count, &remaining)
    if status == TSM_BYTES_SHORT_HEADER:
        raise InvalidArgument(f"BYTES tensor ends in a partial length prefix after {count} elements")
    if status != TSM_BYTES_OK:
        raise InvalidArgument(
            f"BYTES element {count} declares more bytes than the {remaining} that remain in the buffer")
    return count


cdef bytes _as_bytes(item):
    if isinstance(item, bytes):
        return <bytes>item
    if isinstance(item, str):
        return (<str>item).encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(array):
    """Encode an array of bytes/str (any shape, row-major) into the wire form."""
    items = [_as_bytes(x) for x in np.asarray(array, dtype=np.object_).reshape(-1)]
    cdef Py_ssize_t total = 0
    cdef bytes item
    for item in items:
        if len(item) > 0xFFFFFFFF:
            raise InvalidArgument("BYTES element larger than 4 GiB")
        total += 4 + len(item)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *dst = <uint8_t *>PyBytes_AS_STRING(out)
    cdef size_t pos = 0
    for item in items:
        pos += tsm_bytes_put(dst + pos, <const uint8_t *>PyBytes_AS_STRING(item), <uint32_t>len(item))
    return out


def split_bytes(buf, counts):
    """Byte sizes of consecutive groups of ``counts`` elements of an encoded BYTES tensor."""
    cdef const uint8_t[::1] view = memoryview(buf).cast("B")
    cdef Py_ssize_t total = sum(counts), first = 0, n
    cdef size_t *starts = <size_t *>malloc(sizeof(size_t) * (total + 1))
    cdef uint32_t *lengths = <uint32_t *>malloc(sizeof(uint32_t) * (total + 1))
    cdef size_t start = 0, end
    if starts == NULL or lengths == NULL:
        free(starts)
        free(lengths)
        raise MemoryError()
    try:
        _index(view, total, starts, lengths)
        sizes = []
        for n in counts:
            end = starts[first + n - 1] + lengths[first + n - 1] if n else start
            sizes.append(end - start)
            first += n
            start = end
        return sizes
    finally:
        free(starts)
        free(lengths)
