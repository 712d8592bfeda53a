"""The scheduler's decisions, tested directly: a clock the test moves and a stand-in for the
worker pool that records each batch and answers when the test says so. Deterministic, no
sleeps; the end-to-end tests (test_batching.py) check the same paths through a real server."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from triton_shm.core.data.types import InferRequest
from triton_shm.core.models.config import parse_pbtxt
from triton_shm.core.models.validation import RequestPlan
from triton_shm.core.observability.statistics import ModelStats
from triton_shm.core.scheduling.dynamic import DynamicScheduler
from triton_shm.errors import Internal, InvalidArgument, Unavailable

US = 1000  # ns


class FakeClock:
    """Time moves only in ``advance``; timers due by then run in time order."""

    def __init__(self) -> None:
        self.t = 0
        self.timers: list[_Timer] = []

    def now(self) -> int:
        return self.t

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> "_Timer":
        timer = _Timer(when_ns, callback)
        self.timers.append(timer)
        return timer

    def advance(self, ns: int) -> None:
        target = self.t + ns
        while due := sorted((t for t in self.timers if not t.cancelled and t.when <= target), key=lambda t: t.when):
            timer = due[0]
            self.timers.remove(timer)
            self.t = max(self.t, timer.when)
            timer.callback()
        self.t = target


@dataclass
class _Timer:
    when: int
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Sent:
    instance: tuple[str, int]
    ids: list[str]
    done: Callable[[list[Any], Any], None]


class RecordingPool:
    """Records every batch the scheduler starts; ``answer`` completes one."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.fail_with: Exception | None = None

    def start_batch(self, mv, instance, batch, done) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(Sent(instance, [p.request.id for p in batch], done))

    def answer(self, index: int = 0, results: list[Any] | None = None) -> None:
        sent = self.sent[index]
        sent.done(results if results is not None else [f"out:{i}" for i in sent.ids], (1, 2, 3))

    @property
    def batches(self) -> list[list[str]]:
        return [s.ids for s in self.sent]


class Harness:
    def __init__(self, config: str, instances: int = 1) -> None:
        self.clock, self.pool = FakeClock(), RecordingPool()
        model = SimpleNamespace(name="m", version=1, config=parse_pbtxt('name: "m"\n' + config),
                                instances=[("cpu", i) for i in range(instances)])
        self.stats = ModelStats("m", "1")
        self.scheduler = DynamicScheduler(model, self.pool, self.stats, clock=self.clock)
        self.tasks: dict[str, asyncio.Task] = {}

    async def submit(self, rid: str, rows: int = 1, **parameters: Any) -> asyncio.Task:
        task = asyncio.ensure_future(self.scheduler.submit(
            InferRequest("m", id=rid, parameters=parameters), RequestPlan(outputs=[], batch_size=rows), {}))
        self.tasks[rid] = task
        await settle()
        return task

    async def advance(self, ns: int) -> None:
        self.clock.advance(ns)
        await settle()

    async def answer(self, index: int = 0, results: list[Any] | None = None) -> None:
        self.pool.answer(index, results)
        await settle()

    def result(self, rid: str) -> Any:
        task = self.tasks[rid]
        assert task.done(), f"request {rid} is still waiting"
        return task.exception() or task.result()


async def settle() -> None:
    """Let every task that can run do so (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


def scenario(fn):
    """Run an async test body in a fresh event loop."""
    def run():
        asyncio.run(fn())
    run.__name__ = fn.__name__
    return run


DYNAMIC = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


# --------------------------------------------------------------------------- without dynamic batching
@scenario
async def test_without_dynamic_batching_each_request_runs_alone_and_an_instance_holds_one_more():
    h = Harness("max_batch_size: 8")
    for rid in "abc":
        await h.submit(rid, rows=4)
    assert h.pool.batches == [["a"], ["b"]]  # one running, one held in the worker
    await h.answer(0)
    assert h.pool.batches == [["a"], ["b"], ["c"]]
    assert h.result("a") == "out:a" and not h.tasks["c"].done()


@scenario
async def test_without_dynamic_batching_a_client_timeout_ends_a_request_queued_or_running():
    h = Harness("max_batch_size: 8")
    await h.submit("a")
    await h.submit("b", timeout=300)  # starts at once (the instance holds one more) with a deadline
    await h.submit("c", timeout=100)  # waits for a free slot
    await h.submit("d")
    assert h.pool.batches == [["a"], ["b"]]
    await h.advance(100 * US)
    error = h.result("c")
    assert isinstance(error, Unavailable) and error.message == "Request timeout expired"
    await h.answer(0)
    assert h.pool.batches == [["a"], ["b"], ["d"]]  # the expired request never reached an instance
    await h.advance(200 * US)
    assert isinstance(h.result("b"), Unavailable)
    assert h.stats.failures == {"REJECTED": 1} and h.stats.pending == 1  # b still runs: counted once answered


@scenario
async def test_the_in_flight_count_is_requests_queued_or_running_until_answered_or_given_up():
    h = Harness("max_batch_size: 8")
    assert h.scheduler.inflight_count() == 0
    for rid in "abc":
        await h.submit(rid)
    assert h.pool.batches == [["a"], ["b"]] and h.scheduler.inflight_count() == 3  # two sent, one queued
    h.tasks["c"].cancel()  # its caller gives up while it is queued
    await settle()
    assert h.scheduler.inflight_count() == 2
    await h.answer(0)
    assert h.result("a") == "out:a" and h.scheduler.inflight_count() == 1
    await h.answer(1)
    assert h.scheduler.inflight_count() == 0


# --------------------------------------------------------------------------- batch formation
@scenario
async def test_batch_waits_for_the_queue_delay_then_takes_everything_queued():
    h = Harness(DYNAMIC)
    for rid in "abc":
        await h.submit(rid)
    await h.advance(99 * US)
    assert h.pool.batches == []
    await h.advance(1 * US)
    assert h.pool.batches == [["a", "b", "c"]]
    await h.answer(0)
    assert [h.result(r) for r in "abc"] == ["out:a", "out:b", "out:c"]
    assert h.stats.execution_count == 1 and h.stats.inference_count == 3


@scenario
async def test_delay_is_counted_from_the_oldest_request():
    h = Harness(DYNAMIC)
    await h.submit("a")
    await h.advance(60 * US)
    await h.submit("b")
    await h.advance(40 * US)
    assert h.pool.batches == [["a", "b"]]


@scenario
async def test_a_full_batch_leaves_at_once_and_never_exceeds_max_batch_size():
    h = Harness(DYNAMIC, instances=2)
    for i in range(11):
        await h.submit(f"r{i}")
    assert h.pool.batches == [[f"r{i}" for i in range(8)]]  # no delay waited
    await h.advance(100 * US)
    assert h.pool.batches[1] == ["r8", "r9", "r10"]


@scenario
async def test_rows_of_batched_requests_count_towards_max_batch_size():
    h = Harness(DYNAMIC)
    for rid in "abc":
        await h.submit(rid, rows=3)
    await h.advance(100 * US)
    assert h.pool.batches == [["a", "b"]]  # 6 rows; a third request would make 9 > 8
    await h.answer(0)
    await h.advance(100 * US)
    assert h.pool.batches[1] == ["c"]


@scenario
async def test_largest_preferred_size_leaves_without_waiting():
    h = Harness(
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 }"
    )
    for rid in "abcde":
        await h.submit(rid)
    assert h.pool.batches == [["a", "b", "c", "d"]]


@scenario
async def test_at_the_delay_the_batch_is_the_largest_preferred_size_the_queue_fills():
    h = Harness(
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 }"
    )
    for rid in "abc":
        await h.submit(rid)
    await h.advance(100 * US)
    assert h.pool.batches == [["a", "b"]]  # 2 of the 3, not 3
    await h.answer(0)
    assert h.pool.batches == [["a", "b"], ["c"]]  # c waited its delay already


# --------------------------------------------------------------------------- priorities
PRIORITIES = """
max_batch_size: 2
dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 3 default_priority_level: 2 }
"""


@scenario
async def test_higher_priority_requests_go_first():
    h = Harness(PRIORITIES)
    await h.submit("running", rows=2)
    await h.submit("low", priority=3)
    await h.submit("default")
    await h.submit("high", priority=1)
    await h.answer(0)
    assert h.pool.batches[1] == ["high", "default"]  # two rows fill the batch: by level, not by arrival
    await h.answer(1)
    await h.advance(100 * US)
    assert h.pool.batches[2] == ["low"]


@scenario
async def test_priority_outside_the_levels_is_invalid():
    h = Harness(PRIORITIES)
    with pytest.raises(InvalidArgument, match=r"priority 4 is outside the model's priority levels 1\.\.3"):
        await h.scheduler.submit(InferRequest("m", parameters={"priority": 4}), RequestPlan([], 1), {})
    with pytest.raises(InvalidArgument, match="'priority' must be a non-negative integer"):
        await h.scheduler.submit(InferRequest("m", parameters={"priority": -1}), RequestPlan([], 1), {})


# --------------------------------------------------------------------------- queue policy
def policy(text: str, max_batch_size: int = 8, extra: str = "") -> str:
    return (f"max_batch_size: {max_batch_size}\n"
            f"dynamic_batching {{ max_queue_delay_microseconds: 0 default_queue_policy {{ {text} }} {extra} }}")


@scenario
async def test_max_queue_size_rejects_at_once():
    h = Harness(policy("max_queue_size: 2", max_batch_size=1))
    await h.submit("running")
    await h.submit("q1")
    await h.submit("q2")
    with pytest.raises(Unavailable, match=r"^Exceeds maximum queue size for model 'm'$"):
        await h.scheduler.submit(InferRequest("m", id="q3"), RequestPlan([], 1), {})
    assert h.stats.failures == {"REJECTED": 1}
    await h.answer(0)
    assert h.pool.batches == [["running"], ["q1"]]


@scenario
async def test_default_timeout_reject_fails_a_request_still_queued_at_its_deadline():
    h = Harness(policy("timeout_action: REJECT default_timeout_microseconds: 50", max_batch_size=1))
    await h.submit("running")
    await h.submit("queued")
    await h.advance(49 * US)
    assert not h.tasks["queued"].done()
    await h.advance(1 * US)
    error = h.result("queued")
    assert isinstance(error, Unavailable) and error.message == "Request timeout expired"
    assert h.stats.failures == {"REJECTED": 1}
    await h.answer(0)
    assert h.pool.batches == [["running"]]  # the expired request never reached an instance


@scenario
async def test_default_timeout_bounds_only_the_time_in_the_queue():
    h = Harness(policy("timeout_action: REJECT default_timeout_microseconds: 50", max_batch_size=1))
    await h.submit("slow")
    await h.advance(1000 * US)  # the model takes long; the queue timeout no longer applies
    await h.answer(0)
    assert h.result("slow") == "out:slow"


@scenario
async def test_client_timeout_with_reject_bounds_the_whole_request():
    h = Harness(policy("timeout_action: REJECT allow_timeout_override: true", max_batch_size=1))
    await h.submit("hangs", timeout=100)
    assert h.pool.batches == [["hangs"]]
    await h.advance(100 * US)
    error = h.result("hangs")
    assert isinstance(error, Unavailable) and error.message == "Request timeout expired"
    await h.answer(0)  # the late answer is dropped; the instance is free again
    await h.submit("next")
    assert h.pool.batches[-1] == ["next"]


@scenario
async def test_timeout_override_is_ignored_unless_allowed():
    h = Harness(policy("timeout_action: REJECT default_timeout_microseconds: 500", max_batch_size=1))
    await h.submit("running")
    await h.submit("queued", timeout=10)
    await h.advance(10 * US)
    assert not h.tasks["queued"].done()  # the config's 500 µs holds
    await h.advance(490 * US)
    assert isinstance(h.result("queued"), Unavailable)


@scenario
async def test_delay_moves_an_expired_request_behind_those_without_a_deadline():
    h = Harness(policy("timeout_action: DELAY allow_timeout_override: true", max_batch_size=2))
    await h.submit("running", rows=2)
    await h.submit("expires", timeout=50)
    await h.submit("patient")
    await h.advance(50 * US)
    assert not h.tasks["expires"].done()  # DELAY never fails it
    await h.answer(0)
    assert h.pool.batches[1] == ["patient", "expires"]
    await h.answer(1)
    assert h.result("expires") == "out:expires" and h.result("patient") == "out:patient"


@scenario
async def test_without_a_deadline_the_queue_keeps_arrival_order():
    """The control for the DELAY test: the same requests, no timeout, arrival order."""
    h = Harness(policy("timeout_action: DELAY allow_timeout_override: true", max_batch_size=2))
    await h.submit("running", rows=2)
    await h.submit("first")
    await h.submit("second")
    await h.advance(50 * US)
    await h.answer(0)
    assert h.pool.batches[1] == ["first", "second"]


@scenario
async def test_priority_levels_have_their_own_queue_policy():
    h = Harness("""max_batch_size: 1
dynamic_batching {
  max_queue_delay_microseconds: 0 priority_levels: 2 default_priority_level: 2
  priority_queue_policy { key: 1 value: { timeout_action: REJECT default_timeout_microseconds: 10 } }
}""")
    await h.submit("running")
    await h.submit("urgent", priority=1)
    await h.submit("normal")
    await h.advance(10 * US)
    assert isinstance(h.result("urgent"), Unavailable) and not h.tasks["normal"].done()


# --------------------------------------------------------------------------- preserve_ordering
@scenario
async def test_preserve_ordering_answers_in_arrival_order():
    h = Harness("max_batch_size: 1\ndynamic_batching { preserve_ordering: true }", instances=2)
    await h.submit("a")
    await h.submit("b")
    assert h.pool.batches == [["a"], ["b"]] and h.pool.sent[0].instance != h.pool.sent[1].instance
    await h.answer(1)
    assert not h.tasks["b"].done()  # held until a is answered
    await h.answer(0)
    assert h.result("a") == "out:a" and h.result("b") == "out:b"


@scenario
async def test_without_preserve_ordering_a_request_is_answered_when_its_batch_is():
    h = Harness("max_batch_size: 1\ndynamic_batching { }", instances=2)
    await h.submit("a")
    await h.submit("b")
    await h.answer(1)
    assert h.result("b") == "out:b" and not h.tasks["a"].done()


# --------------------------------------------------------------------------- failures
@scenario
async def test_an_unexpected_error_starting_a_batch_is_internal_and_frees_the_instance():
    h = Harness("max_batch_size: 1")
    h.pool.fail_with = KeyError("segment")
    await h.submit("a")
    error = h.result("a")
    assert isinstance(error, Internal) and error.message == "internal error: KeyError: 'segment'"
    assert h.stats.failures == {"BACKEND": 1}
    h.pool.fail_with = None
    await h.submit("b")
    assert h.pool.batches == [["b"]]


@scenario
async def test_a_pool_error_is_passed_on_as_it_is():
    h = Harness("max_batch_size: 1")
    h.pool.fail_with = Unavailable("worker 'cpu' is restarting")
    await h.submit("a")
    error = h.result("a")
    assert type(error) is Unavailable and error.message == "worker 'cpu' is restarting"


@scenario
async def test_per_request_errors_of_a_batch_reach_their_requests():
    h = Harness(DYNAMIC)
    await h.submit("ok")
    await h.submit("bad")
    await h.advance(100 * US)
    await h.answer(0, ["out:ok", InvalidArgument("bad input")])
    assert h.result("ok") == "out:ok" and h.result("bad").message == "bad input"
    assert h.stats.execution_count == 1 and h.stats.failures == {"BACKEND": 1}


@scenario
async def test_a_cancelled_request_still_queued_never_reaches_an_instance():
    h = Harness(policy("", max_batch_size=1))
    await h.submit("running")
    gone = await h.submit("gone")
    gone.cancel()
    await settle()
    await h.answer(0)
    assert h.pool.batches == [["running"]]
    assert h.stats.pending == 0


@scenario
async def test_unloading_refuses_new_requests():
    h = Harness("max_batch_size: 1")
    h.scheduler._closing = True
    with pytest.raises(Unavailable, match=r"model 'm' version 1 is unloading"):
        await h.scheduler.submit(InferRequest("m"), RequestPlan([], 1), {})


# -- instances whose worker dies and comes back ----------------------------------------------

@scenario
async def test_a_dead_instance_gets_no_batch_and_its_failed_batches_give_no_slot_back():
    h = Harness("max_batch_size: 8", instances=2)
    for rid in "ab":
        await h.submit(rid)
    assert [s.instance for s in h.pool.sent] == [("cpu", 0), ("cpu", 1)]  # an idle instance first
    h.scheduler.instance_down(("cpu", 1), "model instance 'm_0_1' is restarting")
    await h.answer(1, [Unavailable("model instance 'm_0_1' was killed by signal 9")])  # its batch fails
    assert isinstance(h.result("b"), Unavailable)
    for rid in "cde":
        await h.submit(rid)
    # only instance 0 takes work: c beside a (it holds one more), d and e wait
    assert [(s.instance, s.ids) for s in h.pool.sent[2:]] == [(("cpu", 0), ["c"])]
    await h.answer(0)
    assert [(s.instance, s.ids) for s in h.pool.sent[3:]] == [(("cpu", 0), ["d"])]
    h.scheduler.instance_up(("cpu", 1))  # back: takes the waiting request at once
    await settle()
    assert [(s.instance, s.ids) for s in h.pool.sent[4:]] == [(("cpu", 1), ["e"])]
    await h.answer(4)
    assert h.result("e") == "out:e"


@scenario
async def test_with_every_instance_down_the_queued_requests_fail_and_new_ones_wait_for_one():
    h = Harness(DYNAMIC, instances=2)
    for rid in "ab":
        await h.submit(rid)
    h.scheduler.instance_down(("cpu", 0), "model instance 'm_0_0' is restarting")
    h.scheduler.instance_down(("cpu", 1), "model instance 'm_0_1' is restarting")
    await settle()
    for rid in "ab":
        error = h.result(rid)
        assert isinstance(error, Unavailable), error
        assert error.message == "model 'm' is not available: model instance 'm_0_1' is restarting", error
    assert h.stats.failures == {"REJECTED": 2}
    await h.submit("c")
    await h.advance(1000 * US)
    assert h.pool.batches == [] and not h.tasks["c"].done()
    h.scheduler.instance_up(("cpu", 0))
    await settle()
    assert h.pool.batches == [["c"]]


@scenario
async def test_drain_waits_for_running_batches_not_for_a_dead_instance_slots():
    h = Harness("max_batch_size: 8", instances=2)
    await h.submit("a")
    h.scheduler.instance_down(("cpu", 1), "model instance 'm_0_1' is restarting")
    drain = asyncio.ensure_future(h.scheduler.drain())
    await asyncio.sleep(0.01)
    assert not drain.done()  # a still runs on instance 0
    await h.answer(0)
    await asyncio.wait_for(drain, 1)
