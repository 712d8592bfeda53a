"""Layouts shared by the encoder and the decoder of ``_protocol.pyx`` (see ``protocol``)."""
from libc.stdint cimport uint8_t, uint64_t

cdef enum:             # record sizes, ops and statuses of protocol.py
    HEADER_SIZE = 20
    FREE_SIZE = 20
    TENSOR_SIZE = 26
    OUTPUT_SIZE = 23
    OP_INFER = 1
    OP_REPLY = 2
    OP_FAIL = 3
    OP_STREAM = 4
    OP_FREE = 5
    OP_PING = 6
    OP_PONG = 7
    OP_CONTROL = 8
    ST_OK = 0
    ST_ERROR = 1
    ST_DECOUPLED = 2
    ST_NONE = 3
    ST_PARAMS = 4
    ST_ANSWERED = 5


cdef enum:
    BUF_SMALL = 1024   # an encoder's room on the stack: a small request's frame fits, no malloc


cdef struct Buf:       # an encoder's output: in ``small`` until it outgrows it, then on the heap
    char *data         # ``small`` or malloc'd
    size_t len         # bytes written
    size_t cap         # bytes room at ``data``
    char small[BUF_SMALL]


cdef struct Reader:    # a decoder's position in one frame
    const uint8_t *p
    const uint8_t *end
    uint64_t msg_id
