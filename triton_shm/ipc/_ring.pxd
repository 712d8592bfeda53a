# C declarations of csrc/ring.h.
from libc.stdint cimport uint8_t, uint32_t, uint64_t


cdef extern from "ring.h" nogil:
    enum:
        TSM_RING_HEADER
        TSM_RING_EMPTY
        TSM_RING_OK
        TSM_RING_FULL
        TSM_RING_CORRUPT
        TSM_RING_TIMED_OUT
        TSM_RING_WOKEN
        TSM_RING_KICKED
    ctypedef struct tsm_ring:
        uint8_t *base
        uint64_t capacity
        uint64_t pos
        uint32_t kicked
    uint64_t tsm_ring_max_record(const tsm_ring *r)
    uint64_t tsm_ring_room(const tsm_ring *r)
    int tsm_ring_push(tsm_ring *r, const uint8_t *data, uint32_t len, uint32_t flags, int *wake)
    int tsm_ring_peek(tsm_ring *r, const uint8_t **data, uint32_t *len, uint32_t *flags, uint64_t *next)
    void tsm_ring_consume(tsm_ring *r, uint64_t next)
    int tsm_ring_pending(const tsm_ring *r)
    int tsm_ring_prepare_sleep(tsm_ring *r)
    void tsm_ring_awake(tsm_ring *r)
    int tsm_ring_spin(const tsm_ring *r, uint64_t ns)
    void tsm_ring_wake(tsm_ring *r)
    int tsm_ring_sleep(tsm_ring *r, uint64_t timeout_ns)
    void tsm_ring_kick(tsm_ring *r)
