"""The scheduler with the rate limiter, tested directly: schedulers of two models share
one limiter; a clock the test moves and a stand-in pool that answers when told (see
test_scheduler.py). No sleeps."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from triton_shm.core.models.config import parse_pbtxt
from triton_shm.core.observability.statistics import ModelStats
from triton_shm.core.scheduling.dynamic import DynamicScheduler
from triton_shm.core.scheduling.rate_limiter import Claim, RateLimiter

from .test_scheduler import US, FakeClock, Harness, RecordingPool, scenario, settle

DYNAMIC = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100 }"


class Limited(Harness):
    """A model whose instances each need ``needs`` of the shared ``limiter``."""

    def __init__(self, name: str, limiter: RateLimiter, clock: FakeClock, config: str = "max_batch_size: 8",
                 instances: int = 1, needs: dict[str, int] | None = None, priority: int = 1) -> None:
        self.clock, self.pool = clock, RecordingPool()
        model = SimpleNamespace(name=name, version=1, config=parse_pbtxt(f'name: "{name}"\n' + config),
                                instances=[("cpu", i) for i in range(instances)])
        self.claims = [Claim(instance, {(0, r): n for r, n in (needs or {"R": 1}).items()}, priority)
                       for instance in model.instances]
        limiter.register(self.claims)
        self.stats = ModelStats(name, "1")
        self.scheduler = DynamicScheduler(model, self.pool, self.stats, clock=clock, limiter=limiter,
                                          claims=self.claims)
        self.tasks: dict[str, asyncio.Task] = {}


@scenario
async def test_two_models_sharing_one_resource_run_one_at_a_time():
    clock, limiter = FakeClock(), RateLimiter()
    a, b = Limited("a", limiter, clock), Limited("b", limiter, clock)
    await a.submit("a1")
    await b.submit("b1")
    await a.submit("a2")
    assert (a.pool.batches, b.pool.batches) == ([["a1"]], [])  # b waits for R; a holds no second batch
    await a.answer(0)
    assert (a.pool.batches, b.pool.batches) == ([["a1"]], [["b1"]])  # b was first in line
    await b.answer(0)
    assert a.pool.batches == [["a1"], ["a2"]]
    await a.answer(1)
    assert [a.result(r) for r in ("a1", "a2")] == ["out:a1", "out:a2"] and b.result("b1") == "out:b1"
    assert limiter.in_use == {(0, "R"): 0}


@scenario
async def test_instances_of_one_model_share_a_resource_too():
    clock, limiter = FakeClock(), RateLimiter()
    a = Limited("a", limiter, clock, instances=2)
    for rid in ("r1", "r2"):
        await a.submit(rid)
    assert a.pool.batches == [["r1"]]  # the other instance is free, but R is not
    await a.answer(0)
    assert a.pool.batches == [["r1"], ["r2"]]
    assert limiter.in_use == {(0, "R"): 1}


@scenario
async def test_without_a_shared_resource_both_run():
    clock, limiter = FakeClock(), RateLimiter()
    a = Limited("a", limiter, clock, needs={"R": 1})
    b = Limited("b", limiter, clock, needs={"S": 1})
    await a.submit("a1")
    await b.submit("b1")
    assert (a.pool.batches, b.pool.batches) == ([["a1"]], [["b1"]])


@scenario
async def test_a_dynamic_batch_grows_while_its_instance_waits_for_the_resource():
    clock, limiter = FakeClock(), RateLimiter()
    holder = Limited("holder", limiter, clock)
    batched = Limited("batched", limiter, clock, config=DYNAMIC)
    await holder.submit("h")
    for rid in "abc":
        await batched.submit(rid)
    await batched.advance(100 * US)  # ready to go, but R is taken
    assert batched.pool.batches == []
    await batched.submit("d")
    await holder.answer(0)
    assert batched.pool.batches == [["a", "b", "c", "d"]]


@scenario
async def test_a_request_cancelled_while_its_instance_waits_gives_the_turn_away():
    clock, limiter = FakeClock(), RateLimiter()
    a, b = Limited("a", limiter, clock), Limited("b", limiter, clock)
    await a.submit("a1")
    task = await b.submit("b1")  # b's instance is in line for R
    task.cancel()
    await settle()
    await a.submit("a2")
    await a.answer(0)  # b's grant finds no work and is handed back: a runs again
    assert (a.pool.batches, b.pool.batches) == ([["a1"], ["a2"]], [])
    assert limiter.in_use == {(0, "R"): 1}


@scenario
async def test_a_failed_start_releases_the_resource():
    clock, limiter = FakeClock(), RateLimiter()
    a, b = Limited("a", limiter, clock), Limited("b", limiter, clock)
    a.pool.fail_with = RuntimeError("ring full")
    await a.submit("a1")
    assert "ring full" in str(a.result("a1"))
    await b.submit("b1")
    assert b.pool.batches == [["b1"]]


@scenario
async def test_priority_two_gets_half_the_turns_across_models():
    clock, limiter = FakeClock(), RateLimiter()
    hi = Limited("hi", limiter, clock, priority=1)
    lo = Limited("lo", limiter, clock, priority=2)
    blocker = Limited("blocker", limiter, clock)
    await blocker.submit("x")
    for i in range(6):
        await hi.submit(f"h{i}")
    for i in range(6):
        await lo.submit(f"l{i}")
    await blocker.answer(0)
    order = []
    models = {"hi": hi, "lo": lo}
    for _ in range(12):
        running = [(name, m) for name, m in models.items()
                   if len(m.pool.sent) > sum(1 for t in m.tasks.values() if t.done())]
        assert len(running) == 1  # never two at once
        name, model = running[0]
        order.append(name[0].upper())
        await model.answer(len(model.pool.sent) - 1)
    assert "".join(order) == "HLHLHHLHHLLL"
