# C declarations of csrc/assembler.h.
from libc.stdint cimport uint8_t


cdef extern from "assembler.h" nogil:
    int tsm_install_sigbus_guard()
    int tsm_watch(void *start, size_t length)
    void tsm_unwatch(int slot)
    int tsm_poisoned(int slot)
    int tsm_guarded_copy(uint8_t *dst, const uint8_t *src, size_t n)
    int tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n)
    int tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n)
