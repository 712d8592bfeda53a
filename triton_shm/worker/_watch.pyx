# cython: language_level=3
"""The relief reader's clock in C (``relief.py``): it ticks without the GIL, so watching
inline executions costs the executing thread nothing. Twin of ``watch_py``; same API."""
from libc.stdint cimport uint64_t
from posix.unistd cimport read, write


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    const short POLLIN


cdef extern from * nogil:
    """
    #define tsm_fence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
    """
    void tsm_fence()


cdef class Watch:
    """``current``: the inline execution running (its number), 0 for none; ``count``: how
    many began; ``parked``: the clock sleeps until ``ring``. ``fd``: a non-blocking eventfd."""
    cdef public uint64_t current
    cdef public uint64_t count
    cdef public bint parked
    cdef int fd

    def __init__(self, int fd):
        self.fd = fd
        self.current = 0
        self.count = 0
        self.parked = True

    def begin(self) -> int:
        """An inline execution starts; rings a parked clock. Returns its number."""
        self.count += 1
        self.current = self.count
        tsm_fence()  # the count is stored before parked is read (``wait`` does the converse)
        if self.parked:
            self.ring()
        return self.current

    def end(self) -> None:
        self.current = 0

    def ring(self) -> None:
        cdef uint64_t one = 1
        write(self.fd, &one, 8)

    def wait(self, int tick_ms, int park_after) -> int:
        """Block until one inline execution is still running a tick after it was seen
        (returns its number), or until rung (returns 0)."""
        cdef uint64_t watched = 0, started = self.count, seq = 0, drained
        cdef int quiet = 0
        cdef pollfd p
        p.fd = self.fd
        p.events = POLLIN
        with nogil:
            while True:
                if poll(&p, 1, -1 if self.parked else tick_ms) > 0:
                    read(self.fd, &drained, 8)
                    self.parked = False
                    seq = 0
                    break
                seq = self.current
                if seq != 0 and seq == watched:
                    break
                watched = seq
                if self.count != started or seq != 0:
                    started = self.count
                    quiet = 0
                    continue
                quiet += 1
                if quiet >= park_after:
                    self.parked = True
                    tsm_fence()
                    if self.count != started or self.current != 0:
                        self.parked = False
                    quiet = 0
        return seq
