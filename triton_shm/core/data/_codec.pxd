# C declarations of csrc/bytes_codec.h, shared by the extension modules.
from libc.stdint cimport uint8_t, uint32_t


cdef extern from "bytes_codec.h" nogil:
    ctypedef enum tsm_bytes_status:
        TSM_BYTES_OK
        TSM_BYTES_SHORT_HEADER
        TSM_BYTES_OVERRUN
        TSM_BYTES_TRAILING

    tsm_bytes_status tsm_bytes_index(const uint8_t *buf, size_t length, size_t count,
                                     size_t *starts, uint32_t *lengths,
                                     size_t *bad_index, size_t *remaining)
    tsm_bytes_status tsm_bytes_count(const uint8_t *buf, size_t length, size_t *count, size_t *remaining)
    size_t tsm_bytes_put(uint8_t *dst, const uint8_t *src, uint32_t n)
