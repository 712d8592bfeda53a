"""The scheduler's time: monotonic nanoseconds and timers at a moment on that scale.

The default runs on the event loop; a test hands the scheduler its own clock and moves
time itself, so queue delays and timeouts are decided without sleeping."""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> int:
        """Monotonic nanoseconds."""
        ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once ``now()`` reaches ``when_ns``."""
        ...


class LoopClock:
    """``time.monotonic_ns`` and the running loop's timers."""

    # the builtin itself: a reading costs no Python frame (schedulers read it per request)
    now = staticmethod(time.monotonic_ns)

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer:
        return self._loop.call_later(max(when_ns - time.monotonic_ns(), 0) / 1e9, callback)


class Wakeup:
    """One pending call of ``callback`` at the latest moment asked for: ``arm(when)``
    replaces the previous one (``None`` cancels it). Schedulers keep one, for the next
    moment their queue needs a look on its own."""

    def __init__(self, clock: Clock, callback: Callable[[], None]):
        self._clock, self._callback = clock, callback
        self._timer: Timer | None = None
        self.when_ns: int | None = None  # the moment armed for (None: not armed)

    def arm(self, when_ns: int | None) -> None:
        if when_ns == self.when_ns:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self.when_ns = None, when_ns
        if when_ns is not None:
            self._timer = self._clock.call_at(when_ns, self._fire)

    def _fire(self) -> None:
        self._timer, self.when_ns = None, None
        self._callback()
