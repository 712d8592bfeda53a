"""Unit tests of the sequence batcher (``core/scheduling/sequence.py``): the bookkeeping (slots,
backlog, batch layout by strategy, idle release, the request checks), where the time is
an argument of every call, and the scheduler on a clock the test moves (state, null rows,
timers). Nothing here sleeps; the end-to-end behaviour is in test_sequence.py."""
from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from triton_shm.core.models.config import parse_pbtxt
from triton_shm.core.scheduling.rate_limiter import Claim, RateLimiter
from triton_shm.core.models.version import TensorSpec
from triton_shm.core.scheduling.sequence import (SequenceBook, SequenceScheduler, control_tensors, sequence_config,
                                      sequence_flags)
from triton_shm.core.observability.statistics import ModelStats
from triton_shm.core.data.types import InferRequest, InferResponse, InputTensor, OutputTensor
from triton_shm.core.models.validation import RequestPlan
from triton_shm.errors import InvalidArgument, Unsupported

from .test_scheduler import FakeClock, settle

INSTANCES = [("cpu", 0), ("cpu", 1)]
CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 7 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]"""


def config(strategy: str = "direct { }", max_batch_size: int = 2, idle_us: int = 1000, corrid: str = "TYPE_UINT64",
           extra: str = ""):
    return parse_pbtxt(f"""
        name: "m" backend: "python" max_batch_size: {max_batch_size}
        sequence_batching {{ {strategy} max_sequence_idle_microseconds: {idle_us} {CONTROLS % corrid} {extra} }}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]""")


def book(**kw) -> SequenceBook:
    return SequenceBook(sequence_config(config(**kw)), INSTANCES)


def admit(b: SequenceBook, key, now: int, start=False, end=False, item=None):
    return b.admit(key, start, end, item if item is not None else f"{key}@{now}", now, "m")


def layout(rows) -> list:
    """A batch as the correlation IDs of its rows (None: a null request)."""
    return [None if seq is None else seq.key for seq, _ in rows]


# -- slots and batches ---------------------------------------------------------------------
def test_direct_slots_spread_over_instances_then_fill_rows():
    b = book()
    for key in (1, 2, 3):
        admit(b, key, 0, start=True)
    placed = {key: (s.instance, s.slot) for key, s in b.live.items()}
    assert placed == {1: (("cpu", 0), 0), 2: (("cpu", 1), 0), 3: (("cpu", 0), 1)}


def test_direct_batch_is_laid_out_by_slot_with_null_rows():
    b = SequenceBook(sequence_config(config(max_batch_size=4)), [("cpu", 0)])
    first = admit(b, 1, 0, start=True)
    for key in (2, 3):
        admit(b, key, 0, start=True)
    rows, wake = b.take_batch(("cpu", 0), 0)
    assert layout(rows) == [1, 2, 3] and wake is None
    b.finished(("cpu", 0), rows, 10)
    admit(b, 3, 20)  # only the sequence in slot 2 has work: slots 0 and 1 are null rows
    rows, _ = b.take_batch(("cpu", 0), 20)
    assert layout(rows) == [None, None, 3]
    assert rows[0][1] is None and rows[2][1].item == "3@20"
    assert first.start and not first.end  # the entries keep their flags


def test_requests_of_a_sequence_run_one_at_a_time_in_order():
    b = SequenceBook(sequence_config(config()), [("cpu", 0)])
    admit(b, 1, 0, start=True, item="a")
    admit(b, 1, 1, item="b")
    rows, _ = b.take_batch(("cpu", 0), 2)
    assert [e.item for _, e in rows] == ["a"]
    assert b.take_batch(("cpu", 0), 3) == ([], None)  # "b" waits until "a" answers
    b.finished(("cpu", 0), rows, 4)
    rows, _ = b.take_batch(("cpu", 0), 5)
    assert [e.item for _, e in rows] == ["b"]


def test_one_batch_at_a_time_per_instance():
    b = SequenceBook(sequence_config(config(max_batch_size=4)), [("cpu", 0)])
    admit(b, 1, 0, start=True)
    first, _ = b.take_batch(("cpu", 0), 0)
    admit(b, 2, 1, start=True)
    admit(b, 1, 1)
    assert b.take_batch(("cpu", 0), 1) == ([], None)  # what arrives meanwhile joins the next batch
    b.finished(("cpu", 0), first, 2)
    second, _ = b.take_batch(("cpu", 0), 2)
    assert layout(first) == [1] and layout(second) == [1, 2]


def test_end_frees_the_slot_for_the_backlog():
    b = SequenceBook(sequence_config(config(max_batch_size=1)), [("cpu", 0)])
    admit(b, 1, 0, start=True, end=True)
    admit(b, 2, 1, start=True)
    assert b.live[2].instance is None and list(b.backlog) == [b.live[2]]
    rows, _ = b.take_batch(("cpu", 0), 2)
    assert layout(rows) == [1]
    b.finished(("cpu", 0), rows, 3)
    assert 1 not in b.live and b.live[2].instance == ("cpu", 0) and not b.backlog
    rows, _ = b.take_batch(("cpu", 0), 4)
    assert layout(rows) == [2]


def test_oldest_takes_the_oldest_heads_and_waits_for_the_preferred_size():
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100 }"
    b = SequenceBook(sequence_config(config(strategy, max_batch_size=4)), [("cpu", 0)])
    admit(b, 1, 0, start=True)
    rows, wake = b.take_batch(("cpu", 0), 1_000)
    assert rows == [] and wake == 100_000  # one candidate of the preferred two: wait the delay
    admit(b, 3, 2_000, start=True)
    admit(b, 2, 3_000, start=True)
    rows, _ = b.take_batch(("cpu", 0), 3_000)
    assert layout(rows) == [1, 3]  # the two oldest, no null rows
    b.finished(("cpu", 0), rows, 4_000)
    rows, wake = b.take_batch(("cpu", 0), 5_000)
    assert rows == [] and wake == 103_000
    rows, _ = b.take_batch(("cpu", 0), 103_000)
    assert layout(rows) == [2]


def test_direct_minimum_slot_utilization_waits_up_to_the_delay():
    b = SequenceBook(sequence_config(config(
        "direct { max_queue_delay_microseconds: 50 minimum_slot_utilization: 1.0 }")), [("cpu", 0)])
    admit(b, 1, 0, start=True)
    admit(b, 2, 0, start=True)
    rows, _ = b.take_batch(("cpu", 0), 0)  # both active slots ready
    b.finished(("cpu", 0), rows, 1)
    admit(b, 1, 10)
    assert b.take_batch(("cpu", 0), 20) == ([], 50_010)
    rows, _ = b.take_batch(("cpu", 0), 50_010)
    assert layout(rows) == [1]


# -- flags and lifetimes -------------------------------------------------------------------
def test_start_is_required_for_a_new_sequence_and_after_end():
    b = book()
    with pytest.raises(InvalidArgument) as e:
        admit(b, 5, 0)
    assert e.value.message == ("inference request for sequence 5 to model 'm' must specify the START flag on the "
                               "first request of the sequence")
    admit(b, 5, 0, start=True, end=True)
    with pytest.raises(InvalidArgument):
        admit(b, 5, 1)  # its END has arrived: the ID is free for a new sequence only
    admit(b, 5, 2, start=True)
    assert b.live[5].instance is not None


def test_idle_sequences_lose_their_slot():
    b = SequenceBook(sequence_config(config(idle_us=100)), [("cpu", 0)])
    admit(b, 1, 0, start=True)
    rows, _ = b.take_batch(("cpu", 0), 0)
    b.finished(("cpu", 0), rows, 10_000)
    assert b.next_idle_ns() == 110_000
    assert b.release_idle(109_999) == []
    assert [s.key for s in b.release_idle(110_000)] == [1]
    assert b.live == {} and b.slots[("cpu", 0)] == [None, None]
    with pytest.raises(InvalidArgument):
        admit(b, 1, 120_000)


def test_a_sequence_with_work_is_never_idle():
    b = SequenceBook(sequence_config(config(idle_us=100)), [("cpu", 0)])
    admit(b, 1, 0, start=True)
    assert b.release_idle(10**9) == []  # queued
    rows, _ = b.take_batch(("cpu", 0), 0)
    assert b.release_idle(10**9) == []  # running
    b.finished(("cpu", 0), rows, 10**9)
    assert b.release_idle(10**9 + 99_999) == []


def test_withdrawn_request_never_runs():
    b = SequenceBook(sequence_config(config()), [("cpu", 0)])
    entry = admit(b, 1, 0, start=True)
    b.withdraw(1, entry)
    assert b.take_batch(("cpu", 0), 1) == ([], None)


# -- parameters and tensors ----------------------------------------------------------------
@pytest.mark.parametrize("params", [{}, {"sequence_id": 0}, {"sequence_id": ""}])
def test_correlation_id_required(params):
    with pytest.raises(InvalidArgument) as e:
        sequence_flags(InferRequest("m", parameters=params), "m", None)
    assert e.value.message == "inference request to model 'm' must specify a non-zero or non-empty correlation ID"


def test_correlation_id_checks():
    def flags(params, strings=None):
        return sequence_flags(InferRequest("m", parameters=params), "m", strings)
    assert flags({"sequence_id": 7, "sequence_start": True}) == (7, True, False)
    assert flags({"sequence_id": "abc", "sequence_end": True}, True) == ("abc", False, True)
    assert flags({"sequence_id": "x" * 128}, True) == ("x" * 128, False, False)
    with pytest.raises(Unsupported, match="^string correlation ID cannot be longer than 128 characters$"):
        flags({"sequence_id": "x" * 129}, True)
    with pytest.raises(InvalidArgument, match="CORRID control input takes integers"):
        flags({"sequence_id": "abc"}, False)
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(InvalidArgument, match="'sequence_id' must be an unsigned 64-bit integer or a string"):
            flags({"sequence_id": bad})
    with pytest.raises(InvalidArgument, match="^'sequence_start' must be a boolean$"):
        flags({"sequence_id": 1, "sequence_start": 1})


def test_control_tensors_carry_the_configured_values():
    cfg = sequence_config(config())
    tensors = {t.name: t for t in control_tensors(cfg, 2**64 - 1, True, False, True)}
    assert {n: (t.datatype, t.shape) for n, t in tensors.items()} == {
        "START": ("FP32", [1, 1]), "END": ("BOOL", [1, 1]), "READY": ("INT32", [1, 1]), "CORRID": ("UINT64", [1, 1])}
    assert np.frombuffer(tensors["START"].data, "<f4").tolist() == [1.0]
    assert np.frombuffer(tensors["END"].data, np.bool_).tolist() == [False]
    assert np.frombuffer(tensors["READY"].data, "<i4").tolist() == [7]
    assert np.frombuffer(tensors["CORRID"].data, "<u8").tolist() == [2**64 - 1]
    null = {t.name: t for t in control_tensors(cfg, None, False, False, False)}
    assert np.frombuffer(null["READY"].data, "<i4").tolist() == [0]
    assert np.frombuffer(null["CORRID"].data, "<u8").tolist() == [0]
    strings = sequence_config(config(corrid="TYPE_STRING", max_batch_size=0))
    corrid = next(t for t in control_tensors(strings, "abc", False, False, True) if t.name == "CORRID")
    assert (corrid.datatype, corrid.shape, bytes(corrid.data)) == ("BYTES", [1], struct.pack("<I", 3) + b"abc")


@pytest.mark.parametrize("corrid, dtype", [("TYPE_INT64", "<i8"), ("TYPE_UINT32", "<u4"), ("TYPE_INT32", "<i4")])
def test_a_64_bit_id_fills_a_narrower_or_signed_corrid_with_its_low_bits(corrid, dtype):
    """An ID of 2**63 and above (gRPC's negative int64_param) is the unsigned ID: a CORRID of
    another integer type gets it cast, as C does, rather than an overflow."""
    cfg = sequence_config(config(corrid=corrid))
    for sid in (2**64 - 1, 2**63, 2**32 + 5, 7):
        tensor = next(t for t in control_tensors(cfg, sid, True, False, True) if t.name == "CORRID")
        assert np.frombuffer(tensor.data, dtype).tolist() == [np.array([sid], np.uint64).astype(dtype)[0]]


@pytest.mark.parametrize("extra, words", [
    ('control_input [ { name: "S2" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]',
     "more than one control input for CONTROL_SEQUENCE_START"),
    ('control_input [ { name: "C2" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 1 ] } ] } ]',
     "must give exactly two values"),
    ('state [ { input_name: "S" output_name: "" data_type: TYPE_INT32 dims: [ 1 ] } ]',
     "needs input_name and output_name"),
    ('state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ -1 ] } ]', "variable dims"),
])
def test_bad_configs_are_refused(extra, words):
    with pytest.raises(InvalidArgument, match=words):
        sequence_config(config(extra=extra))


def test_bad_corrid_type_is_refused():
    with pytest.raises(InvalidArgument, match="must have data_type TYPE_UINT64"):
        sequence_config(config(corrid="TYPE_FP32"))


# -- the scheduler on a clock the test moves (tests/test_scheduler.py's clock and pool) -----------
STATE = 'state [ { input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]'


class BatchPool:
    """Keeps every batch the scheduler starts (the requests as the model would get them)."""

    def __init__(self) -> None:
        self.sent: list[tuple[tuple[str, int], list, Any]] = []

    def start_batch(self, mv, instance, batch, done) -> None:
        self.sent.append((instance, batch, done))

    def answer(self, index: int, state: list[int | None]) -> None:
        """Each row answers OUTPUT = its INPUT, and OUT_STATE = ``state[row]`` (None: none)."""
        _, batch, done = self.sent[index]
        results = []
        for p, value in zip(batch, state):
            outputs = [OutputTensor("OUTPUT", "INT32", [1, 1], bytes(p.request.inputs[0].data))]
            if value is not None:
                outputs.append(OutputTensor("OUT_STATE", "INT32", [1, 1], np.int32([[value]]).tobytes()))
            results.append(InferResponse("m", "1", outputs=outputs))
        done(results, (1, 2, 3))


def _inputs(p) -> dict[str, Any]:
    """A request's inputs as the model sees them: name -> first value."""
    out = {}
    for t in p.request.inputs:
        out[t.name] = (bytes(t.data)[4:].decode() if t.datatype == "BYTES"
                       else np.frombuffer(t.data, np.dtype("<" + {"FP32": "f4", "INT32": "i4", "UINT64": "u8",
                                                                    "BOOL": "?"}[t.datatype]))[0].item())
    return out


class SeqHarness:
    def __init__(self, **kw) -> None:
        self.clock, self.pool = FakeClock(), BatchPool()
        model = SimpleNamespace(name="m", version=1, config=config(**kw), instances=[("cpu", 0)], model_dir=None,
                                decoupled=False, inputs={"INPUT": TensorSpec("INPUT", "INT32", [1])})
        self.stats = ModelStats("m", "1")
        self.scheduler = SequenceScheduler(model, self.pool, self.stats, clock=self.clock)

    async def submit(self, value: int, **parameters: Any) -> asyncio.Task:
        data = np.int32([[value]]).tobytes()
        request = InferRequest("m", parameters=parameters, inputs=[InputTensor("INPUT", "INT32", [1, 1], data)])
        task = asyncio.ensure_future(self.scheduler.submit(request, RequestPlan(outputs=["OUTPUT"], batch_size=1), {}))
        await settle()
        return task


def test_state_goes_round_and_is_hidden_from_the_client():
    async def run():
        h = SeqHarness(extra=STATE)
        first = await h.submit(5, sequence_id=9, sequence_start=True)
        h.pool.answer(0, [42])
        await settle()
        response = first.result()
        assert [o.name for o in response.outputs] == ["OUTPUT"]  # the state output stays with the server
        second = await h.submit(6, sequence_id=9)
        (row,) = h.pool.sent[1][1]
        assert _inputs(row)["IN_STATE"] == 42 and row.plan.state_outputs == {"OUT_STATE": "INT32"}
        assert row.plan.sequence == (9, False, False)
        h.pool.answer(1, [None])  # a model that returns no state leaves it as it was
        await settle()
        await h.submit(0, sequence_id=9, sequence_end=True)
        (row,) = h.pool.sent[2][1]
        assert _inputs(row)["IN_STATE"] == 42 and row.plan.sequence == (9, False, True)
        assert second.done()
    asyncio.run(run())


def test_null_rows_reach_the_model_and_count_for_nobody():
    async def run():
        h = SeqHarness(max_batch_size=4)
        a = await h.submit(1, sequence_id=1, sequence_start=True)
        h.pool.answer(0, [None])
        b = await h.submit(2, sequence_id=2, sequence_start=True)  # slot 1: row 0 is a null request
        null, real = h.pool.sent[1][1]
        got = (_inputs(null)["READY"], _inputs(null)["CORRID"], null.plan.outputs, null.plan.sequence)
        assert got == (0, 0, [], None)
        assert (_inputs(real)["READY"], _inputs(real)["START"], _inputs(real)["CORRID"]) == (7, 1.0, 2)
        h.pool.answer(1, [None, None])
        await settle()
        assert a.done() and b.done() and np.frombuffer(b.result().outputs[0].data, "<i4").tolist() == [2]
        assert (h.stats.inference_count, h.stats.execution_count) == (2, 2)
    asyncio.run(run())


def test_idle_timer_releases_a_sequence_with_no_request():
    async def run():
        h = SeqHarness(idle_us=100)
        await h.submit(1, sequence_id=3, sequence_start=True)
        h.pool.answer(0, [None])
        await settle()
        h.clock.advance(99_999)
        assert 3 in h.scheduler.book.live
        h.clock.advance(1)  # the scheduler's own timer fires: nothing else happens meanwhile
        assert h.scheduler.book.live == {}
        with pytest.raises(InvalidArgument, match="must specify the START flag"):
            await h.scheduler.submit(InferRequest("m", parameters={"sequence_id": 3}), RequestPlan(["OUTPUT"], 1), {})
    asyncio.run(run())


def test_oldest_delay_timer_starts_the_batch():
    async def run():
        strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 50 }"
        h = SeqHarness(strategy=strategy, max_batch_size=4)
        await h.submit(1, sequence_id=1, sequence_start=True)
        assert h.pool.sent == []
        h.clock.advance(50_000)
        await settle()
        assert len(h.pool.sent) == 1 and len(h.pool.sent[0][1]) == 1
    asyncio.run(run())


def test_rate_limited_instances_run_only_when_granted():
    """Two instances needing the one unit of resource R (tests/test_scheduler_rate_limit.py's
    limiter): never two batches at once; the second instance runs when the first answers."""
    async def run():
        clock, pool, limiter = FakeClock(), BatchPool(), RateLimiter()
        instances = [("cpu", 0), ("cpu", 1)]
        claims = [Claim(i, {(0, "R"): 1}) for i in instances]
        limiter.register(claims)
        model = SimpleNamespace(name="m", version=1, config=config(max_batch_size=1), instances=instances,
                                model_dir=None, decoupled=False, inputs={"INPUT": TensorSpec("INPUT", "INT32", [1])})
        scheduler = SequenceScheduler(model, pool, ModelStats("m", "1"), clock=clock, limiter=limiter, claims=claims)

        async def submit(sid: int, **flags):
            request = InferRequest("m", parameters={"sequence_id": sid, **flags},
                                   inputs=[InputTensor("INPUT", "INT32", [1, 1], np.int32([[sid]]).tobytes())])
            task = asyncio.ensure_future(scheduler.submit(request, RequestPlan(outputs=["OUTPUT"], batch_size=1), {}))
            await settle()
            return task

        first = await submit(1, sequence_start=True)
        second = await submit(2, sequence_start=True)  # the other instance's slot, but R is taken
        assert [inst for inst, _, _ in pool.sent] == [("cpu", 0)]
        pool.answer(0, [None])
        await settle()
        assert [inst for inst, _, _ in pool.sent] == [("cpu", 0), ("cpu", 1)] and first.done()
        pool.answer(1, [None])
        await settle()
        assert second.done() and limiter.in_use == {(0, "R"): 0}
    asyncio.run(run())
