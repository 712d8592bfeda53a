# cython: language_level=3, boundscheck=False, wraparound=False
"""The receive path's walk over HTTP/2 frame headers, in C. Twin of ``frames_py``
(same API and results); ``framing`` picks one."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer


def whole_frames_end(buf, Py_ssize_t pos, Py_ssize_t end):
    """The end of the whole frames in ``buf[pos:end]`` (``pos`` is a frame header): the
    start of the one cut short by ``end``, or ``end``."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t after
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    p = <const unsigned char *>view.buf
    if end > view.len:
        end = view.len
    while end - pos >= 9:
        after = pos + 9 + (<Py_ssize_t>p[pos] << 16 | <Py_ssize_t>p[pos + 1] << 8 | p[pos + 2])
        if after > end:
            break
        pos = after
    PyBuffer_Release(&view)
    return pos
