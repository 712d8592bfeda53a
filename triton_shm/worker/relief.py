"""The relief reader: who reads the worker's ring while the control thread runs a model.

The control thread runs a batch itself when that saves a hand-off (``Worker._run_inline``);
meanwhile it reads no frames. A frame that arrives during a short execution simply waits
for it. A long execution, or a model that waits for a frame (a BLS reply), must not stall
the link: this thread then takes the reader's role (``Worker._relieve``) until the
execution ends.

It watches without costing the control thread a wake-up: it ticks every ``TICK`` while
inline executions happen and takes over when one execution is still the same one a tick
later (so it has run at least ``TICK``), or at once when rung with ``urgent`` (BLS). After
``PARK_AFTER`` quiet ticks it parks, and the next inline execution rings it.
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .process import Worker

TICK = float(os.environ.get("TRITON_SHM_WORKER_RELIEF_MS", "5")) / 1000
PARK_AFTER = 100  # quiet ticks (0.5 s by default) before the thread sleeps until rung


class Relief:
    def __init__(self, worker: "Worker"):
        self.worker = worker
        self.parked = True   # read by the control thread: ring before an inline execution
        self.urgent = 0      # the inline execution (sequence number) that waits for a frame
        self._bell = threading.Lock()
        self._bell.acquire()  # held: ``ring`` releases it, the thread's wait takes it back
        self._thread = threading.Thread(target=self._run, name="relief", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def ring(self) -> None:
        try:
            self._bell.release()
        except RuntimeError:  # already rung
            pass

    def call(self, seq: int) -> None:
        """Inline execution ``seq`` is about to wait for a frame: take over now."""
        self.urgent = seq
        self.ring()

    def _run(self) -> None:
        worker = self.worker
        watched = 0                    # the inline execution seen at the last tick
        started = worker.inline_count  # inline executions begun so far
        quiet = 0
        while True:
            self._bell.acquire(timeout=-1 if self.parked else TICK)
            self.parked = False
            seq = worker.inline
            if seq and (seq == watched or seq == self.urgent):
                worker.relieve(seq)
                watched = 0
                continue
            watched = seq
            if worker.inline_count != started or seq:
                started, quiet = worker.inline_count, 0
                continue
            quiet += 1
            if quiet >= PARK_AFTER:
                # parked is set before the count is read again and an inline execution sets the
                # count before it reads parked: one of the two sees the other
                self.parked = True
                if worker.inline_count != started or worker.inline:
                    self.parked = False
                quiet = 0
