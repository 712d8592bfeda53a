"""An ensemble's back-pressure (``ensemble_scheduling { max_inflight_requests: N }``), as
Triton 2.71 does it: one limiter per step, shared by every request of the ensemble. A
step's request counts from the moment it is dispatched to its model until that model's
final response to it (a decoupled step's request stays in flight while it streams); a
step whose limit is reached is dispatched once one of its requests in flight finishes.
0 (the default) makes no limiter at all: nothing is counted or awaited."""
from __future__ import annotations

import asyncio
import logging
from collections import deque

log = logging.getLogger("triton_shm.ensemble")

# As Triton: a step that waits this long for a slot proceeds anyway (logged), rather than
# a pipeline that can never drain deadlocking for good.
WAIT_LIMIT_S = 300.0


class StepLimiter:
    """At most ``limit`` requests of one ensemble step in flight."""

    def __init__(self, limit: int, ensemble: str, step: int):
        self.limit, self.ensemble, self.step = limit, ensemble, step
        self.inflight = 0
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        if self.inflight >= self.limit:
            try:
                await asyncio.wait_for(self._until_free(), WAIT_LIMIT_S)
            except asyncio.TimeoutError:
                log.error("ensemble '%s' unable to schedule step %d (inflight: %d >= limit: %d) for %d seconds. "
                          "Proceeding to avoid deadlock.", self.ensemble, self.step, self.inflight, self.limit,
                          WAIT_LIMIT_S)
        self.inflight += 1

    async def _until_free(self) -> None:
        loop = asyncio.get_running_loop()
        while self.inflight >= self.limit:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()

    def release(self) -> None:
        if self.inflight == 0:
            log.error("ensemble '%s' step %d: in-flight request limiter underflow", self.ensemble, self.step)
            return
        self.inflight -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break


def step_limiters(config) -> list[StepLimiter] | None:
    """One limiter per step of an ensemble config, or None where it sets no limit."""
    limit = config.ensemble_scheduling.max_inflight_requests
    if limit <= 0:
        return None
    log.info("Ensemble model '%s' configured with max_inflight_requests: %d", config.name, limit)
    return [StepLimiter(limit, config.name, i) for i in range(len(config.ensemble_scheduling.step))]
