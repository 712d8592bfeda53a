"""The relief reader's clock (``relief.py``) in Python: the twin of ``_watch.pyx``. The
GIL orders its reads and writes; each tick takes the GIL, which the C twin avoids."""
from __future__ import annotations

import os
import select


class Watch:
    """``current``: the inline execution running (its number), 0 for none; ``count``: how
    many began; ``parked``: the clock sleeps until ``ring``. ``fd``: a non-blocking eventfd."""

    def __init__(self, fd: int):
        self.fd = fd
        self.current = 0
        self.count = 0
        self.parked = True
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def begin(self) -> int:
        """An inline execution starts; rings a parked clock. Returns its number."""
        self.count = seq = self.count + 1
        self.current = seq
        if self.parked:
            self.ring()
        return seq

    def end(self) -> None:
        self.current = 0

    def ring(self) -> None:
        os.eventfd_write(self.fd, 1)

    def wait(self, tick_ms: int, park_after: int) -> int:
        """Block until one inline execution is still running a tick after it was seen
        (returns its number), or until rung (returns 0)."""
        watched, started, quiet = 0, self.count, 0
        while True:
            if self._poll.poll(-1 if self.parked else tick_ms):
                try:
                    os.eventfd_read(self.fd)
                except BlockingIOError:
                    pass
                self.parked = False
                return 0
            seq = self.current
            if seq and seq == watched:
                return seq
            watched = seq
            if self.count != started or seq:
                started, quiet = self.count, 0
                continue
            quiet += 1
            if quiet >= park_after:
                # parked is set before the count is read again, begin sets the count before it
                # reads parked: one of the two sees the other
                self.parked = True
                if self.count != started or self.current:
                    self.parked = False
                quiet = 0
