# C declarations of csrc/assembler.h.
from libc.stdint cimport uint8_t


cdef extern from "assembler.h" nogil:
    void tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n)
    void tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n)
