"""Scheduling: requests wait in a queue per model version until an instance is free.

Without ``dynamic_batching`` each request runs alone. With it, requests that arrive
within ``max_queue_delay_microseconds`` are combined into one batch of at most
``max_batch_size`` rows (preferring a ``preferred_batch_size``), ordered by priority
level, subject to the queue policy (``max_queue_size``, timeouts with REJECT or DELAY).
Each instance runs one batch at a time; the scheduler hands a batch to a free one.

Dispatch is synchronous: it runs where the queue or the set of free instances changes
(a request arrives, a worker's reply frees an instance, the batching delay or a deadline
timer fires), so a freed instance is handed its next batch before the event loop turns
to anything else. On a busy front-end each loop iteration can take milliseconds of
protocol work, and a hop through a separate dispatcher task would leave the instance
idle for that long.
"""
from __future__ import annotations

import asyncio
import collections
import functools
from asyncio import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable

from ...errors import Internal, InvalidArgument, TritonShmError, Unavailable
from ..clock import Clock, LoopClock, Wakeup
from ..data.types import InferRequest, InferResponse, ResponseStream
from ..models.config import mc
from ..observability.statistics import ModelStats, failed
from .interface import Instance
from .pending import Pending, resolve
from .rate_limiter import IDLE, STAGED, Claim, RateLimiter, bind_claims
from .request_future import RequestFuture

if TYPE_CHECKING:
    from ...supervisor.pool import WorkerPool
    from ..data.shm_registry import Region
    from ..models.validation import RequestPlan
    from ..models.version import ModelVersion

REJECT = mc.ModelQueuePolicy.REJECT
HELD_BATCHES = 1  # batches an instance may hold in its worker beside the one it runs


@dataclass(slots=True)
class _Policy:
    reject_on_timeout: bool
    default_timeout_us: int
    allow_override: bool
    max_queue_size: int
    default_timeout_ns: int | None  # the deadline offset of a request that names no timeout (None: none)


def _policy(p) -> _Policy:
    timeout_us = p.default_timeout_microseconds
    return _Policy(p.timeout_action == REJECT, timeout_us, p.allow_timeout_override, p.max_queue_size,
                   timeout_us * 1000 if timeout_us > 0 else None)


def check_batching_config(config) -> None:
    """Reasons a batching config cannot load (raised at load time)."""
    if not config.HasField("dynamic_batching"):
        return
    db, name = config.dynamic_batching, config.name
    if config.max_batch_size == 0:
        raise InvalidArgument(f"model '{name}': dynamic batching needs max_batch_size > 0")
    for size in db.preferred_batch_size:
        if size < 1 or size > config.max_batch_size:
            raise InvalidArgument(f"model '{name}': preferred batch size {size} must be between 1 and "
                                  f"max_batch_size {config.max_batch_size}")
    if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
        raise InvalidArgument(f"model '{name}': default_priority_level {db.default_priority_level} must be "
                              f"between 1 and priority_levels {db.priority_levels}")
    for level in db.priority_queue_policy:
        if not 1 <= level <= db.priority_levels:
            raise InvalidArgument(f"model '{name}': priority_queue_policy names level {level}, outside "
                                  f"1..{db.priority_levels}")


class DynamicScheduler:
    """The queue and dispatcher of one model version (an ``interface.Scheduler``)."""

    def __init__(self, model: "ModelVersion", pool: "WorkerPool", stats: ModelStats, clock: Clock | None = None,
                 limiter: RateLimiter | None = None, claims: list[Claim] | None = None):
        self.model, self.pool, self.stats = model, pool, stats
        self.clock: Clock = clock or LoopClock()
        # --rate-limit: an instance with a claim runs a batch only when the limiter grants it
        self.limiter, self.claims = limiter, bind_claims(claims, self._granted)
        config = model.config
        self.dynamic = config.HasField("dynamic_batching") and config.max_batch_size > 0
        db = config.dynamic_batching
        self.max_rows = config.max_batch_size
        self.preferred = sorted(set(db.preferred_batch_size))
        self.delay_ns = db.max_queue_delay_microseconds * 1000
        self.levels = db.priority_levels if self.dynamic else 0
        self.default_level = (db.default_priority_level or 1) if self.levels else 1
        self.preserve_ordering = self.dynamic and db.preserve_ordering
        self.policies = {lvl: _policy(db.default_queue_policy) for lvl in range(1, max(self.levels, 1) + 1)}
        for lvl, p in db.priority_queue_policy.items():
            self.policies[lvl] = _policy(p)
        self.queues: dict[int, collections.deque[Pending]] = {lvl: collections.deque() for lvl in self.policies}
        # One request per execution, one queue, no rate limiter: _pump's direct path applies.
        self._direct: collections.deque[Pending] | None = (
            self.queues[1] if not self.dynamic and not self.claims and len(self.queues) == 1 else None)
        # Free slots: without dynamic batching an instance holds a second batch in its
        # worker, which it starts the moment it answers the first, instead of idling for
        # a round trip to us. A dynamic batch waits here instead: it grows meanwhile.
        self.depth = 1 if self.dynamic or self.claims else HELD_BATCHES + 1
        self.idle: collections.deque[Instance] = collections.deque(model.instances * self.depth)
        self._running: dict[Instance, int] = dict.fromkeys(model.instances, 0)  # batches sent, per instance
        self._seq = 0
        self._released = 0                      # preserve_ordering: next seq to answer
        self._held: dict[int, Pending] = {}     # finished, waiting for earlier ones
        self._wakeup = Wakeup(self.clock, self._pump)
        self._closing = False
        self._loop = asyncio.get_running_loop()  # each request's future: made on it, not looked up
        self._one_instance = len(model.instances) == 1  # then every free slot is that instance's
        # instances whose worker died, until it is back: they get no batch (their slots
        # are out of ``idle``), and a batch of theirs that fails gives no slot back
        self._down: set[Instance] = set()

    # -- admission -----------------------------------------------------------------------
    def _priority(self, request: InferRequest) -> int:
        value = request.parameters.get("priority", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument("'priority' must be a non-negative integer")
        if value == 0 or not self.levels:
            return self.default_level
        if value > self.levels:
            raise InvalidArgument(f"priority {value} is outside the model's priority levels 1..{self.levels}")
        return value

    def _timeout_ns(self, request: InferRequest, policy: _Policy) -> int | None:
        """The deadline offset of a request that names a timeout."""
        timeout_us = policy.default_timeout_us
        value = request.parameters["timeout"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument("'timeout' must be a non-negative integer (microseconds)")
        if policy.allow_override or not self.dynamic:
            timeout_us = value
        return timeout_us * 1000 if timeout_us > 0 else None

    def submit(self, request: InferRequest, plan: "RequestPlan", regions: dict[str, "Region"],
               trace: Any = None, stream: ResponseStream | None = None) -> Awaitable[InferResponse | None]:
        """Queue a request: what this returns resolves once its batch has executed, to the
        response, or for a decoupled model to None (its responses go to ``stream``). A
        refusal (unloading, queue full, a bad priority or timeout) raises at the call. A
        request that goes straight to a free instance gets its future itself, not a
        coroutine around it (one fewer per request): nothing is left to do for it but
        wait (it is in no queue to leave if its caller goes); it counts as pending until
        answered."""
        if self._closing:
            raise Unavailable(f"model '{self.model.name}' version {self.model.version} is unloading")
        # Most requests name neither a priority nor a timeout (most name no parameter at
        # all): the level and the deadline are then the defaults.
        params = request.parameters
        level = self._priority(request) if params and "priority" in params else self.default_level
        policy = self.policies[level]
        queue = self.queues[level]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            self.stats.record_failure(0, "REJECTED", responded=False)
            raise Unavailable(f"Exceeds maximum queue size for model '{self.model.name}'")
        now = self.clock.now()
        timeout = self._timeout_ns(request, policy) if params and "timeout" in params else policy.default_timeout_ns
        deadline = now + timeout if timeout else None
        direct = False  # straight to a free slot: no deadline, nothing waiting before it, batching off
        if deadline is None and queue is self._direct and not queue and self.idle:
            direct = True
        pending = Pending(request, plan, regions, stream, plan.batch_size or 1, level, now, deadline,
                          policy.reject_on_timeout, RequestFuture(loop=self._loop), self._seq, None, trace, direct)
        if trace is not None:
            trace.stamp("QUEUE_START", now)
        self._seq += 1
        self.stats.pending += 1  # until the caller stops waiting (_wait), or for a direct one until answered
        if direct:
            # What _pump's direct path does with the one request waiting and a free
            # slot, without the detour through the queue: it goes to that slot now.
            self._start([pending], self._take_slot())
            if self._wakeup.when_ns is not None:  # nothing waits: no timer either
                self._wakeup.arm(None)
            return pending.future
        queue.append(pending)
        return self._wait(pending, queue)

    async def _wait(self, pending: Pending, queue: collections.deque[Pending]) -> InferResponse | None:
        """A queued request's dispatch and wait (``submit``'s)."""
        try:
            self._pump()
            params = pending.request.parameters
            if pending.deadline_ns is None or not pending.reject_on_timeout or not params.get("timeout"):
                return await pending.future
            # A timeout the client asked for bounds the whole request: a model that hangs
            # does not hold the client (its instance stays busy until the model returns).
            # The config's default timeout, as in Triton, bounds only the time in the queue.
            return await self._wait_until(pending, pending.deadline_ns)
        except asyncio.CancelledError:
            # The caller is gone (a client's RST_STREAM or disconnect): a request still in
            # the queue is dropped so it never reaches an instance (nor an answer); one
            # already in a batch runs, its model told (RequestFuture).
            try:
                queue.remove(pending)
            except ValueError:
                pass
            raise
        finally:
            self.stats.pending -= 1

    async def _wait_until(self, pending: Pending, deadline_ns: int) -> Any:
        expired = False

        def expire() -> None:
            nonlocal expired
            if not pending.future.done():
                expired = True
                Future.cancel(pending.future)  # its caller still waits: no worker is told it has gone

        timer = self.clock.call_at(deadline_ns, expire)
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            if expired:
                raise Unavailable("Request timeout expired") from None
            pending.future.cancel()  # the caller is gone
            raise
        finally:
            timer.cancel()

    # -- dispatch ------------------------------------------------------------------------
    def _expire(self, now: int) -> None:
        for queue in self.queues.values():
            for p in [p for p in queue if p.deadline_ns is not None and now >= p.deadline_ns]:
                if p.reject_on_timeout:
                    queue.remove(p)
                    self._finish(p, Unavailable("Request timeout expired"))
                else:  # DELAY: no longer ahead of requests without a deadline
                    p.deadline_ns = None
                    queue.remove(p)
                    queue.append(p)

    def _queued_rows(self) -> int:
        return sum(p.rows for q in self.queues.values() for p in q)

    def _oldest_ns(self) -> int | None:
        heads = [q[0].enqueued_ns for q in self.queues.values() if q]
        return min(heads) if heads else None

    def _take_batch(self) -> list[Pending]:
        """Requests in priority order, up to the largest preferred size that the queue
        can fill (else up to max_batch_size)."""
        if not self.dynamic:  # one request per execution, whatever its batch dimension
            return [next(q for q in self.queues.values() if q).popleft()]
        queued = self._queued_rows()
        reachable = [s for s in self.preferred if s <= queued]
        target = reachable[-1] if reachable else self.max_rows
        batch: list[Pending] = []
        rows = 0
        for level in sorted(self.queues):
            queue = self.queues[level]
            while queue and rows + queue[0].rows <= target:
                p = queue.popleft()
                batch.append(p)
                rows += p.rows
            if queue:
                break  # keep priority order: never skip a waiting higher-priority request
        return batch

    def _ready_to_go(self, now: int) -> bool:
        """A dynamic batch leaves once it reaches the largest preferred size (or
        max_batch_size), or once its oldest request has waited max_queue_delay."""
        if self._queued_rows() >= (self.preferred[-1] if self.preferred else self.max_rows):
            return True
        oldest = self._oldest_ns()
        return oldest is not None and now - oldest >= self.delay_ns

    def _pump(self) -> None:
        """Start every batch that is ready while an instance is free, then set the timer
        for the next moment the queue needs a look on its own."""
        queue = self._direct
        if queue is not None:
            # Batching off, one queue, no rate limiter. With one request waiting, without
            # a deadline, and a free slot, the loop below would expire nothing and hand it
            # alone to that slot; with none waiting it would only clear the timer. Do just
            # that; anything else (more waiting, deadlines, no free slot) takes the loop.
            if self.idle and len(queue) == 1 and queue[0].deadline_ns is None:
                self._start([queue.popleft()], self._take_slot())
            if not queue:
                if self._wakeup.when_ns is not None:
                    self._wakeup.arm(None)
                return
        now = self.clock.now()
        self._expire(now)
        wake_ns = None
        while self.idle and any(self.queues.values()):
            if self.dynamic and not self._ready_to_go(now):
                oldest = self._oldest_ns()
                wake_ns = None if oldest is None else oldest + self.delay_ns
                break
            if self.claims:
                self._stage_free_instances()
                break
            batch = self._take_batch()
            if not batch:
                break
            self._start(batch, self._take_slot())
            now = self.clock.now()
        deadlines = [p.deadline_ns for q in self.queues.values() for p in q if p.deadline_ns is not None]
        if deadlines:  # timeouts fire while every instance is busy
            wake_ns = min(deadlines) if wake_ns is None else min(wake_ns, *deadlines)
        self._wakeup.arm(wake_ns)

    def _take_slot(self) -> Instance:
        """A free slot, on an instance with nothing to do if there is one."""
        if self._one_instance:
            instance = self.idle.popleft()
        else:
            for i, instance in enumerate(self.idle):
                if not self._running[instance]:
                    del self.idle[i]
                    break
            else:
                instance = self.idle.popleft()
        self._running[instance] += 1
        return instance

    def _free_slot(self, instance: Instance) -> None:
        self._running[instance] -= 1
        down = instance in self._down
        if not down:
            self.idle.append(instance)
        claim = self.claims.get(instance)
        if claim is not None:  # in line again at once if there is more to do, as Triton re-stages
            self._limiter().release(claim, restage=not down and any(self.queues.values()))

    # -- instances that die and come back ------------------------------------------------
    def instance_down(self, instance: Instance, reason: str) -> None:
        """``instance``'s worker died (``reason``: what a client is told): the other
        instances serve on. When none is left, the queued requests fail now rather than
        wait for a restart of unknown length."""
        if instance not in self._running or instance in self._down:
            return
        self._down.add(instance)
        self.idle = collections.deque(i for i in self.idle if i != instance)
        if len(self._down) == len(self._running):
            error = Unavailable(f"model '{self.model.name}' is not available: {reason}")
            for queue in self.queues.values():
                while queue:
                    self._finish(queue.popleft(), error)
            self._wakeup.arm(None)

    def instance_up(self, instance: Instance) -> None:
        """``instance``'s worker runs again, with the model loaded: it takes batches."""
        if instance not in self._down:
            return
        self._down.discard(instance)
        self.idle.extend([instance] * max(self.depth - self._running[instance], 0))
        self._pump()

    # -- the rate limiter ----------------------------------------------------------------
    def _limiter(self) -> RateLimiter:
        """The limiter the claims belong to (a scheduler has claims only with a limiter)."""
        if self.limiter is None:
            raise Internal(f"model '{self.model.name}': instances with rate-limiter claims but no limiter")
        return self.limiter

    def _stage_free_instances(self) -> None:
        """Put free instances in the limiter's line, no more than there are requests waiting."""
        for instance in list(self.idle):
            waiting = sum(len(q) for q in self.queues.values())
            if sum(c.state == STAGED for c in self.claims.values()) >= waiting:
                break
            claim = self.claims[instance]
            if claim.state == IDLE and instance in self.idle:
                self._limiter().stage(claim)  # may be granted (and start a batch) right here

    def _granted(self, claim: Claim) -> None:
        """The limiter lets ``claim``'s instance run: one batch, if one is ready."""
        instance, now = claim.instance, self.clock.now()
        self._expire(now)
        if instance in self.idle and any(self.queues.values()) and not (self.dynamic and not self._ready_to_go(now)):
            batch = self._take_batch()
            if batch:
                self.idle.remove(instance)
                self._running[instance] += 1
                self._start(batch, instance)
                return
        self._limiter().give_back(claim)

    def _start(self, batch: list[Pending], instance: Instance) -> None:
        start = self.clock.now()
        try:
            self.pool.start_batch(
                self.model, instance, batch, functools.partial(self._completed, batch, instance, start)
            )
        except Exception as e:  # noqa: BLE001 - never leave a client waiting; a fault of ours is INTERNAL
            self._free_slot(instance)
            error = e if isinstance(e, TritonShmError) else Internal(f"internal error: {type(e).__name__}: {e}")
            for p in batch:
                self._finish(p, error)

    def _completed(self, batch: list[Pending], instance: Instance, start: int,
                   results: list[Any], timing: tuple[int, int, int] | None) -> None:
        """The worker answered (or died): the instance takes its next batch first, then
        each request gets its result. ``timing`` is None when the model did not run."""
        if self.claims or self._down:
            self._free_slot(instance)
        else:  # _free_slot without a rate limiter or an instance down
            self._running[instance] -= 1
            self.idle.append(instance)
        queue = self._direct
        if queue is None or queue or self._wakeup.when_ns is not None:  # else _pump has nothing to do
            self._pump()
        if timing is not None and len(batch) == 1:
            p, result = batch[0], results[0]
            if p.trace is None and not self.preserve_ordering and not isinstance(result, Exception):
                # The common answer: one request that ran and succeeded, not traced, no
                # order to keep. What the loop below does for it, in fewer calls: its
                # execution and its success recorded at once, then _finish's resolve.
                in_ns, infer_ns, out_ns = timing
                enqueued = p.enqueued_ns
                self.stats.record_single(p.rows, self.clock.now() - enqueued, start - enqueued, in_ns, infer_ns,
                                         out_ns)
                if p.count_on_answer:
                    self.stats.pending -= 1
                if not p.future.done():
                    p.future.set_result(result)
                elif isinstance(result, InferResponse):  # the caller stopped waiting: free what it missed
                    result.release()
                return
        in_ns, infer_ns, out_ns = timing or (0, 0, 0)
        if timing is not None:  # the model ran (even if every request failed), as Triton counts executions
            rows = batch[0].rows if len(batch) == 1 else sum(p.rows for p in batch)
            self.stats.record_execution(rows, in_ns, infer_ns, out_ns)
        for p, result in zip(batch, results):
            if p.trace is not None:
                p.trace.computed(start, (in_ns, infer_ns, out_ns))
            if not failed(result):
                total = self.clock.now() - p.enqueued_ns
                self.stats.record_success(p.rows, total, start - p.enqueued_ns, in_ns, infer_ns, out_ns)
            self._finish(p, result)

    def _finish(self, p: Pending, result: Any) -> None:
        if failed(result):
            reason = "REJECTED" if isinstance(result, Unavailable) else "BACKEND"
            self.stats.record_failure(self.clock.now() - p.enqueued_ns, reason)
        if p.count_on_answer:  # only without preserve_ordering (a direct request)
            self.stats.pending -= 1
        if not self.preserve_ordering:
            resolve(p, result)
            return
        p.result = result
        self._held[p.seq] = p
        while self._released in self._held:
            q = self._held.pop(self._released)
            resolve(q, q.result)
            self._released += 1

    def inflight_count(self) -> int:
        return self.stats.pending

    async def drain(self) -> None:
        """Refuse new requests, serve every queued and running one, then stop."""
        self._closing = True
        while any(self._running.values()) or any(self.queues.values()):
            self._pump()
            await asyncio.sleep(0.001)
        self._wakeup.arm(None)
