"""The relief reader: who reads the worker's ring while the control thread runs a model.

The control thread runs a batch itself when that saves a hand-off (``Worker._run_inline``);
meanwhile it reads no frames. A frame that arrives during a short execution simply waits
for it. A long execution, or a model that waits for a frame (a BLS reply), must not stall
the link: this thread then takes the reader's role (``Worker.relieve``) until the
execution ends.

It watches without costing the control thread a wake-up: its clock (``Watch``: C, ticking
without the GIL, or its Python twin: ``_twins``) ticks every
``TICK_MS`` while inline executions happen and reports one that is still the same a tick
later (it has run at least a tick); ``call`` (BLS) rings it at once. After ``PARK_AFTER``
quiet ticks the clock parks, and the next inline execution rings it.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from .._twins import pick
from .watch_py import Watch

pick(globals(), "._watch", "Watch")

log = logging.getLogger("triton_shm.worker")

TICK_MS = int(os.environ.get("TRITON_SHM_WORKER_RELIEF_MS", "5"))
PARK_AFTER = 100  # quiet ticks (0.5 s by default) before the clock sleeps until rung


class Relief:
    def __init__(self, relieve: Callable[[int], None]):
        self._relieve = relieve  # reads frames while inline execution ``seq`` runs (``Worker.relieve``)
        self.watch = Watch(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
        self.urgent = 0  # the inline execution that waits for a frame
        self._thread = threading.Thread(target=self._run, name="relief", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call(self, seq: int) -> None:
        """Inline execution ``seq`` is about to wait for a frame: take over now."""
        self.urgent = seq
        self.watch.ring()

    def _run(self) -> None:
        watch = self.watch
        while True:
            seq = watch.wait(TICK_MS, PARK_AFTER)
            if not seq:  # rung: a BLS call waits, or the first inline execution after a quiet spell
                seq = self.urgent
                if not seq or seq != watch.current:
                    continue
            try:
                self._relieve(seq)
            except Exception:  # noqa: BLE001 - the relief must outlive any one frame
                log.exception("the relief reader failed")
