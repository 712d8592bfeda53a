"""Sequence batching (``sequence_batching`` in config.pbtxt): stateful models.

A sequence is the run of requests that share a correlation ID (``sequence_id``), from
the one flagged ``sequence_start`` to the one flagged ``sequence_end``. Each sequence
holds a *slot* of one model instance for its whole life, so every request of it runs on
that instance, one at a time and in order:

- ``direct``: an instance has ``max_batch_size`` slots (1 without batching) and a batch
  is laid out by slot: row *i* is slot *i*'s next request, and a slot with nothing to run
  below the highest one that has gets a null request (``READY`` false) there.
- ``oldest``: an instance has ``max_candidate_sequences`` slots and a batch takes the
  oldest waiting request of up to ``max_batch_size`` of them (``preferred_batch_size``
  and ``max_queue_delay_microseconds`` as the dynamic batcher's).

A sequence that finds every slot taken waits in a backlog. One that sends nothing for
``max_sequence_idle_microseconds`` (default 1 s) loses its slot: its next request needs
the START flag again.

The model sees the ``control_input`` tensors (START, END, READY with their false/true
values, CORRID with the correlation ID) and the ``state`` inputs as ordinary inputs;
the state output a model returns is kept and fed back on the sequence's next request.

``SequenceBook`` is the pure bookkeeping (slots, backlog, batches, idle release; the
time is an argument), ``SequenceScheduler`` the asyncio scheduler on top of it (an
``interface.Scheduler``).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import Internal, InvalidArgument, TritonShmError, Unavailable, Unsupported
from ..clock import Clock, LoopClock, Wakeup
from ..data.datatypes import config_to_wire, element_size, numpy_dtype
from ..data.types import BatchRequest, InferRequest, InferResponse, InputTensor, ResponseStream
from ..models.config import data_type_name, mc
from ..models.validation import RequestPlan
from ..observability.statistics import ModelStats, failed
from .interface import Instance
from .pending import Pending, resolve
from .request_future import RequestFuture
from .rate_limiter import IDLE, Claim, RateLimiter, bind_claims

if TYPE_CHECKING:
    from ...supervisor.pool import WorkerPool
    from ..data.shm_registry import Region
    from ..models.version import ModelVersion

log = logging.getLogger("triton_shm.sequence")

Kind = mc.ModelSequenceBatching.Control.Kind
START, READY, END, CORRID = (Kind.CONTROL_SEQUENCE_START, Kind.CONTROL_SEQUENCE_READY,
                             Kind.CONTROL_SEQUENCE_END, Kind.CONTROL_SEQUENCE_CORRID)
MAX_STRING_ID = 128                 # characters of a string correlation ID
DEFAULT_IDLE_US = 1_000_000         # max_sequence_idle_microseconds when unset (Triton's default)
CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


# -- config ----------------------------------------------------------------------------------
@dataclass(slots=True)
class ControlSpec:
    """One control tensor: its input name, kind, datatype and (flags) false/true values."""
    name: str
    kind: int
    datatype: str
    values: tuple[Any, Any] = (0, 1)


@dataclass(slots=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str
    dims: list[int]
    initial: bytes                   # wire bytes a sequence starts from


@dataclass(slots=True)
class SequenceConfig:
    strategy: str                    # "direct" | "oldest"
    batched: bool                    # max_batch_size > 0: tensors carry a batch dimension
    max_rows: int                    # requests per batch
    slots: int                       # slots per instance
    preferred: list[int]             # oldest: preferred batch sizes
    delay_ns: int                    # oldest: max queue delay; direct: with minimum_slot_utilization
    min_utilization: float           # direct: share of active slots a batch should fill
    idle_ns: int
    controls: list[ControlSpec]
    states: list[StateSpec]

    @property
    def string_ids(self) -> bool | None:
        """Whether the CORRID input takes strings (None: the model has no CORRID input)."""
        for c in self.controls:
            if c.kind == CORRID:
                return c.datatype == "BYTES"
        return None


def _control(name: str, model: str, control) -> ControlSpec:
    kind = control.kind
    kind_name = Kind.Name(kind)
    if kind == CORRID:
        datatype = config_to_wire(data_type_name(control.data_type))
        if datatype not in CORRID_TYPES:
            raise InvalidArgument(f"model '{model}': control input '{name}' ({kind_name}) must have data_type "
                                  "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return ControlSpec(name, kind, datatype)
    given = [(dt, list(v)) for dt, v in (("INT32", control.int32_false_true), ("FP32", control.fp32_false_true),
                                         ("BOOL", control.bool_false_true)) if len(v)]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise InvalidArgument(f"model '{model}': control input '{name}' ({kind_name}) must give exactly two values "
                              "(false, true) in one of int32_false_true, fp32_false_true, bool_false_true")
    datatype, values = given[0]
    return ControlSpec(name, kind, datatype, (values[0], values[1]))


def _initial_state(model: str, model_dir: Path | None, state, datatype: str, dims: list[int]) -> bytes:
    init = state.initial_state[0] if len(state.initial_state) else None
    if init is not None and len(init.dims):
        dims = list(init.dims)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"model '{model}': state '{state.input_name}' has variable dims {dims}: give an "
                              "initial_state with fixed dims")
    count = int(np.prod(dims)) if dims else 1
    size = element_size(datatype)
    zeros = bytes(count * (size or 4))  # BYTES: empty strings, a zero length prefix each
    if init is None or init.WhichOneof("state_data") != "data_file":
        return zeros
    path = (model_dir / "initial_state" / init.data_file) if model_dir is not None else Path(init.data_file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidArgument(f"model '{model}': initial state file '{init.data_file}' can not be read: "
                              f"{e.strerror}") from None
    if size and len(data) != len(zeros):
        raise InvalidArgument(f"model '{model}': initial state file '{init.data_file}' holds {len(data)} bytes, "
                              f"state '{state.input_name}' needs {len(zeros)}")
    return data


def sequence_config(config, model_dir: Path | None = None) -> SequenceConfig:
    """The sequence batcher's settings; raises InvalidArgument for a config that can not load."""
    sb, name = config.sequence_batching, config.name
    oldest = sb.WhichOneof("strategy_choice") == "oldest"
    max_rows = max(config.max_batch_size, 1)
    controls, seen = [], set()
    for ci in sb.control_input:
        if not ci.name or len(ci.control) != 1:
            raise InvalidArgument(f"model '{name}': each sequence batching control input needs a name and one control")
        spec = _control(ci.name, name, ci.control[0])
        if spec.kind in seen:
            raise InvalidArgument(f"model '{name}': more than one control input for {Kind.Name(spec.kind)}")
        seen.add(spec.kind)
        controls.append(spec)
    states = []
    for st in sb.state:
        if not st.input_name or not st.output_name:
            raise InvalidArgument(f"model '{name}': a sequence batching state needs input_name and output_name")
        datatype = config_to_wire(data_type_name(st.data_type))
        if datatype == "INVALID":
            raise InvalidArgument(f"model '{name}': state '{st.input_name}' needs a data_type")
        states.append(StateSpec(st.input_name, st.output_name, datatype, list(st.dims),
                                _initial_state(name, model_dir, st, datatype, list(st.dims))))
    if states and config.model_transaction_policy.decoupled:
        raise InvalidArgument(f"model '{name}': implicit state (sequence_batching.state) is not supported for "
                              "decoupled models")
    if oldest:
        o = sb.oldest
        for size in o.preferred_batch_size:
            if size < 1 or size > max_rows:
                raise InvalidArgument(f"model '{name}': preferred batch size {size} must be between 1 and "
                                      f"max_batch_size {max_rows}")
        return SequenceConfig("oldest", config.max_batch_size > 0, max_rows, max(o.max_candidate_sequences, 1),
                              sorted(set(o.preferred_batch_size)), o.max_queue_delay_microseconds * 1000, 0.0,
                              (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000, controls, states)
    d = sb.direct
    return SequenceConfig("direct", config.max_batch_size > 0, max_rows, max_rows, [],
                          d.max_queue_delay_microseconds * 1000, d.minimum_slot_utilization,
                          (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000, controls, states)


def check_sequence_config(config, model_dir: Path | None = None) -> None:
    """Reasons a sequence batching config cannot load (raised at load time)."""
    if config.HasField("sequence_batching"):
        sequence_config(config, model_dir)


# -- request parameters ----------------------------------------------------------------------
def sequence_flags(request: InferRequest, model: str, string_ids: bool | None) -> tuple[int | str, bool, bool]:
    """``(correlation ID, start, end)`` from the request's parameters, as Triton checks them."""
    params = request.parameters
    value = params.get("sequence_id")
    if value is None or value == 0 or value == "":
        raise InvalidArgument(f"inference request to model '{model}' must specify a non-zero or non-empty "
                              "correlation ID")
    if isinstance(value, str):
        if len(value) > MAX_STRING_ID:
            raise Unsupported(f"string correlation ID cannot be longer than {MAX_STRING_ID} characters")
        if string_ids is False:
            raise InvalidArgument(f"inference request to model '{model}' has the string correlation ID '{value}', "
                                  "but the model's CORRID control input takes integers")
    elif isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 64:
        raise InvalidArgument("'sequence_id' must be an unsigned 64-bit integer or a string")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        flag = params.get(key, False)
        if not isinstance(flag, bool):
            raise InvalidArgument(f"'{key}' must be a boolean")
        flags.append(flag)
    return value, flags[0], flags[1]


def start_error(key: int | str, model: str) -> InvalidArgument:
    return InvalidArgument(f"inference request for sequence {key} to model '{model}' must specify the START flag "
                           "on the first request of the sequence")


# -- bookkeeping -----------------------------------------------------------------------------
@dataclass(eq=False)
class Sequence:
    """One live sequence: its slot (once it has one) and its requests waiting to run."""
    key: Any
    instance: Instance | None = None
    slot: int = -1
    queue: collections.deque = field(default_factory=collections.deque)
    last_ns: int = 0                 # when it last received or finished a request
    ending: bool = False             # its END request has arrived: it takes no more
    running: bool = False
    state: dict[str, tuple[list[int], bytes]] = field(default_factory=dict)  # state input -> (shape, bytes)


@dataclass(eq=False)
class Entry:
    """A request queued in a sequence, with its flags."""
    item: Any                        # the scheduler's Pending
    start: bool
    end: bool
    enqueued_ns: int


class SequenceBook:
    """Slots, backlog and batch formation for one model version. No clock of its own:
    every call that needs the time is given it."""

    def __init__(self, cfg: SequenceConfig, instances: list[Instance]):
        self.cfg = cfg
        self.instances = list(instances)
        self.slots: dict[Instance, list[Sequence | None]] = {i: [None] * cfg.slots for i in self.instances}
        # one batch at a time per instance, as Triton's sequence batcher: what arrives
        # meanwhile joins the next batch (a second batch held in the worker measured no faster
        # and splits batches into ones of a single request)
        self.busy: dict[Instance, bool] = dict.fromkeys(self.instances, False)
        self.live: dict[Any, Sequence] = {}          # correlation ID -> the sequence that takes its requests
        self.backlog: collections.deque[Sequence] = collections.deque()

    # admission
    def admit(self, key, start: bool, end: bool, item: Any, now: int, model: str) -> Entry:
        """Queue a request in its sequence (a new one on START); raises the START error.
        START on a live sequence begins it again in its slot (its state is reset when that
        request runs)."""
        seq = self.live.get(key)
        if seq is None or seq.ending:
            if not start:
                raise start_error(key, model)
            seq = Sequence(key)
            self.live[key] = seq
            self._place(seq)
        entry = Entry(item, start, end, now)
        seq.queue.append(entry)
        seq.last_ns = now
        if end:
            seq.ending = True
        return entry

    def withdraw(self, key, entry: Entry) -> None:
        """A queued request whose caller went away."""
        for seq in [self.live.get(key), *self.backlog, *(s for slots in self.slots.values() for s in slots if s)]:
            if seq is not None and entry in seq.queue:
                seq.queue.remove(entry)
                return

    def _place(self, seq: Sequence) -> bool:
        """A free slot for the sequence: the lowest slot index, spread over the instances."""
        for index in range(self.cfg.slots):
            for instance in self.instances:
                if self.slots[instance][index] is None:
                    self.slots[instance][index] = seq
                    seq.instance, seq.slot = instance, index
                    return True
        self.backlog.append(seq)
        return False

    def _release(self, seq: Sequence) -> None:
        if seq.instance is not None:
            self.slots[seq.instance][seq.slot] = None
        elif seq in self.backlog:
            self.backlog.remove(seq)
        seq.instance, seq.slot = None, -1
        if self.live.get(seq.key) is seq:
            del self.live[seq.key]
        while self.backlog:  # the oldest waiting sequence takes the freed slot
            waiting = self.backlog.popleft()
            if not self._place(waiting):
                break

    # batches
    def ready(self, instance: Instance, now: int) -> tuple[list[int], int | None]:
        """The slots of a free instance whose next request may run now, or ``([], wake)``:
        nothing yet, look again at ``wake`` (None: when something arrives or the batch answers)."""
        if self.busy[instance]:
            return [], None
        slots = self.slots[instance]
        ready = [i for i, s in enumerate(slots) if s is not None and s.queue and not s.running]
        if not ready:
            return [], None
        live = {i: s for i, s in enumerate(slots) if s is not None}  # ready ones are all live
        oldest = min(live[i].queue[0].enqueued_ns for i in ready)
        if self.cfg.strategy == "direct":
            active = sum(1 for s in slots if s is not None)
            underused = len(ready) < self.cfg.min_utilization * active
            if self.cfg.delay_ns and underused and now - oldest < self.cfg.delay_ns:
                return [], oldest + self.cfg.delay_ns
        else:
            full = self.cfg.preferred[-1] if self.cfg.preferred else self.cfg.max_rows
            if len(ready) < full and now - oldest < self.cfg.delay_ns:
                return [], oldest + self.cfg.delay_ns
        return ready, None

    def take_batch(self, instance: Instance, now: int) -> tuple[list[tuple[Sequence | None, Entry | None]], int | None]:
        """The next batch for a free instance as ``(sequence, entry)`` rows (``(None, None)``:
        a null request in a direct batch), or ``([], wake)`` as :meth:`ready` says."""
        ready, wake = self.ready(instance, now)
        if not ready:
            return [], wake
        live = {i: s for i, s in enumerate(self.slots[instance]) if s is not None}  # ready ones are all live
        if self.cfg.strategy == "direct":
            rows: list[tuple[Sequence | None, Entry | None]] = []
            for i in range(max(ready) + 1):
                rows.append((live[i], live[i].queue.popleft()) if i in ready else (None, None))
        else:
            ready.sort(key=lambda i: live[i].queue[0].enqueued_ns)
            reachable = [s for s in self.cfg.preferred if s <= len(ready)]
            take = reachable[-1] if reachable else min(len(ready), self.cfg.max_rows)
            rows = [(live[i], live[i].queue.popleft()) for i in ready[:take]]
        for seq, _ in rows:
            if seq is not None:
                seq.running = True
        self.busy[instance] = True
        return rows, None

    def finished(self, instance: Instance, rows: list[tuple[Sequence | None, Entry | None]], now: int) -> None:
        """A batch answered: its instance is free and each ended sequence gives its slot back."""
        self.busy[instance] = False
        for seq, entry in rows:
            if seq is None or entry is None:  # a null request's row
                continue
            seq.running = False
            seq.last_ns = now
            if entry.end:
                self._release(seq)

    # idle sequences
    def _idle(self) -> list[Sequence]:
        return [s for slots in self.slots.values() for s in slots
                if s is not None and not s.queue and not s.running]

    def release_idle(self, now: int) -> list[Sequence]:
        """Free the slots of sequences that sent nothing for the idle time."""
        expired = [s for s in self._idle() if now - s.last_ns >= self.cfg.idle_ns]
        for seq in expired:
            self._release(seq)
        return expired

    def next_idle_ns(self) -> int | None:
        idle = self._idle()
        return min(s.last_ns for s in idle) + self.cfg.idle_ns if idle else None

    def queued(self) -> list[Entry]:
        sequences = [*(s for slots in self.slots.values() for s in slots if s is not None), *self.backlog]
        return [e for s in sequences for e in s.queue]

    def empty(self) -> bool:
        return not any(self.busy.values()) and not self.queued()


# -- tensors the model sees ------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _flag(datatype: str, value: Any) -> bytes:
    """A control flag's value in wire encoding (a handful per model: encoded once)."""
    return np.array(value, dtype=numpy_dtype(datatype)).tobytes()


def control_tensors(cfg: SequenceConfig, key: Any, start: bool, end: bool, ready: bool) -> list[InputTensor]:
    """The control inputs of one request (``key`` None: a null request, CORRID 0 or "")."""
    tensors = []
    for c in cfg.controls:
        if c.kind == CORRID and c.datatype == "BYTES":
            raw = b"" if key is None else str(key).encode()
            data = struct.pack("<I", len(raw)) + raw
        elif c.kind == CORRID:  # the ID's low bytes, as the unsigned 64-bit ID cast to the type
            size = element_size(c.datatype)
            data = ((key if isinstance(key, int) else 0) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        else:
            flags: dict[int, bool] = {START: start, END: end, READY: ready}
            flag = flags[c.kind]
            data = _flag(c.datatype, c.values[1] if flag else c.values[0])
        tensors.append(InputTensor(c.name, c.datatype, [1, 1] if cfg.batched else [1], data))
    return tensors


def _initial(cfg: SequenceConfig) -> dict[str, tuple[list[int], bytes]]:
    out = {}
    for st in cfg.states:
        count = len(st.initial) // (element_size(st.datatype) or 4)
        dims = st.dims if st.dims and all(d >= 0 for d in st.dims) else [count]
        out[st.input_name] = (([1] if cfg.batched else []) + list(dims), st.initial)
    return out


# -- the scheduler ---------------------------------------------------------------------------
class _Discard(asyncio.Queue):
    """Where a decoupled model's responses to a null request go: released, unread."""

    def put_nowait(self, item: tuple[Any, bool]) -> None:
        if isinstance(item[0], InferResponse):
            item[0].release()


class SequencePending(Pending):
    """A queued request of a sequence: its sequence key and its place in the book."""
    __slots__ = ("key", "entry")

    def __init__(self, *args: Any, key: Any = None, entry: Entry | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.key, self.entry = key, entry


class SequenceBatchItem(BatchRequest):
    """A sequence request as its model sees it (``_expand``), with what the worker pool
    reads of the queued request: its caller's future (a client that goes away is told to
    the worker holding the batch: ``request.is_cancelled()``) and its trace (BLS calls
    traced as its children)."""
    __slots__ = ("future", "trace")
    future: asyncio.Future
    trace: Any


class SequenceScheduler:
    """The sequence batcher of one model version (an ``interface.Scheduler``)."""

    def __init__(self, model: ModelVersion, pool: WorkerPool, stats: ModelStats, clock: Clock | None = None,
                 limiter: RateLimiter | None = None, claims: list[Claim] | None = None):
        self.model, self.pool, self.stats = model, pool, stats
        self.clock: Clock = clock or LoopClock()
        # --rate-limit: an instance with a claim runs a batch only when the limiter grants it
        self.limiter, self.claims = limiter, bind_claims(claims, self._granted)
        self.cfg = sequence_config(model.config, model.model_dir)
        self.book = SequenceBook(self.cfg, model.instances)
        self.state_outputs = {st.output_name: st.datatype for st in self.cfg.states}
        self._state_input = {st.output_name: st.input_name for st in self.cfg.states}
        self._wakeup = Wakeup(self.clock, self._pump)
        self._closing = False

    @property
    def queues(self) -> dict[int, list[Entry]]:
        """Requests waiting to run, as the metrics read a scheduler's queues (one level)."""
        return {1: self.book.queued()}

    async def submit(self, request: InferRequest, plan: RequestPlan, regions: dict[str, Region],
                     trace: Any = None, stream: ResponseStream | None = None) -> InferResponse | None:
        name = self.model.name
        if self._closing:
            raise Unavailable(f"model '{name}' version {self.model.version} is unloading")
        key, start, end = sequence_flags(request, name, self.cfg.string_ids)
        if (plan.batch_size or 1) != 1:
            raise InvalidArgument(f"inference request to model '{name}' must specify batch-size 1 due to "
                                  "requirements of sequence batcher")
        now = self.clock.now()
        pending = SequencePending(request, plan, regions, stream, 1, 0, now, None, False,
                                  RequestFuture(loop=asyncio.get_running_loop()), trace=trace, key=key)
        pending.entry = self.book.admit(key, start, end, pending, now, name)
        if trace is not None:
            trace.stamp("QUEUE_START", now)
        self.stats.pending += 1
        try:
            self._pump()
            return await pending.future
        except asyncio.CancelledError:
            self.book.withdraw(key, pending.entry)  # still queued: it never runs
            raise
        finally:
            self.stats.pending -= 1

    # dispatch
    def _limiter(self) -> RateLimiter:
        """The limiter the claims belong to (a scheduler has claims only with a limiter)."""
        if self.limiter is None:
            raise Internal(f"model '{self.model.name}': instances with rate-limiter claims but no limiter")
        return self.limiter

    def _pump(self) -> None:
        now = self.clock.now()
        for seq in self.book.release_idle(now):
            log.info("model '%s': sequence %s released after %d us without a request", self.model.name, seq.key,
                     self.cfg.idle_ns // 1000)
        wakes = [self.book.next_idle_ns()]
        for instance in self.book.instances:
            claim = self.claims.get(instance)
            if claim is None:
                rows, wake = self.book.take_batch(instance, now)
                if rows:
                    self._start(instance, rows)
                wakes.append(wake)
                continue
            ready, wake = self.book.ready(instance, now)
            wakes.append(wake)
            if ready and claim.state == IDLE:
                self._limiter().stage(claim)  # may be granted (and start the batch) right here
        due = [w for w in wakes if w is not None]
        self._wakeup.arm(min(due) if due else None)

    def _granted(self, claim: Claim) -> None:
        """The limiter lets ``claim``'s instance run: one batch, if one is still ready."""
        rows, _ = self.book.take_batch(claim.instance, self.clock.now())
        if rows:
            self._start(claim.instance, rows)
        else:
            self._limiter().give_back(claim)

    @functools.cached_property
    def _null(self) -> BatchRequest:
        """The null request (an empty direct slot): zeros for every input, no outputs wanted."""
        inputs = []
        for spec in self.model.inputs.values():
            dims = [max(d, 1) for d in spec.dims]
            shape = ([1] if self.cfg.batched else []) + dims
            count = int(np.prod(shape)) if shape else 1
            zeros = bytes(count * (element_size(spec.datatype) or 4))
            inputs.append(InputTensor(spec.name, spec.datatype, shape, zeros))
        request = InferRequest(self.model.name, str(self.model.version), inputs=inputs)
        stream = ResponseStream(_Discard()) if self.model.decoupled else None
        return BatchRequest(request, RequestPlan(outputs=[], batch_size=1), {}, stream)

    def _expand(self, seq: Sequence | None, entry: Entry | None) -> BatchRequest:
        """The request as the model sees it: its inputs, the control tensors and the state."""
        if entry is None:
            base = self._null
            extra = control_tensors(self.cfg, None, False, False, False)
            state = _initial(self.cfg)
        else:
            if seq is None:  # a real request always has its sequence
                raise Internal("a sequence request without its sequence")
            p: SequencePending = entry.item
            base = p
            if entry.start or not seq.state:
                seq.state = _initial(self.cfg)
            extra = control_tensors(self.cfg, seq.key, entry.start, entry.end, True)
            state = seq.state
        for st in self.cfg.states:
            shape, data = state[st.input_name]
            extra.append(InputTensor(st.input_name, st.datatype, list(shape), data))
        r = base.request
        request = InferRequest(r.model_name, r.model_version, r.id, r.parameters, [*r.inputs, *extra], r.outputs)
        sequence = None if entry is None or seq is None else (seq.key, entry.start, entry.end)
        plan = dataclasses.replace(base.plan, state_outputs=self.state_outputs, sequence=sequence)
        if entry is None:
            return BatchRequest(request, plan, base.regions, base.stream)
        item = SequenceBatchItem(request, plan, base.regions, base.stream)
        item.future, item.trace = p.future, p.trace
        return item

    def _start(self, instance: Instance, rows: list[tuple[Sequence | None, Entry | None]]) -> None:
        start = self.clock.now()
        try:
            batch = [self._expand(seq, entry) for seq, entry in rows]
            self.pool.start_batch(self.model, instance, batch,
                                  functools.partial(self._completed, instance, rows, start))
        except Exception as e:  # noqa: BLE001 - never leave a client waiting; a fault of ours is INTERNAL
            error = e if isinstance(e, TritonShmError) else Internal(f"internal error: {type(e).__name__}: {e}")
            self._completed(instance, rows, start, [error] * len(rows), None)

    def _completed(self, instance: Instance, rows: list[tuple[Sequence | None, Entry | None]], start: int,
                   results: list[Any], timing: tuple[int, int, int] | None) -> None:
        now = self.clock.now()
        for (seq, entry), result in zip(rows, results):
            if entry is None:  # a null request: its answer goes nowhere
                if isinstance(result, InferResponse):
                    result.release()
                continue
            if isinstance(result, InferResponse) and self.state_outputs and seq is not None:
                self._keep_state(seq, result)
        self.book.finished(instance, rows, now)
        claim = self.claims.get(instance)
        if claim is not None:  # its resources go to the next in line; _pump stages it again if it has work
            self._limiter().release(claim)
        self._pump()
        in_ns, infer_ns, out_ns = timing or (0, 0, 0)
        real = [(entry.item, result) for (_, entry), result in zip(rows, results) if entry is not None]
        if timing is not None:
            self.stats.record_execution(len(real), in_ns, infer_ns, out_ns)
        for p, result in real:
            if p.trace is not None:
                p.trace.computed(start, (in_ns, infer_ns, out_ns))
            if failed(result):
                reason = "REJECTED" if isinstance(result, Unavailable) else "BACKEND"
                self.stats.record_failure(now - p.enqueued_ns, reason)
            else:
                self.stats.record_success(1, now - p.enqueued_ns, start - p.enqueued_ns, in_ns, infer_ns, out_ns)
            resolve(p, result)

    def _keep_state(self, seq: Sequence, response: InferResponse) -> None:
        """Take the state outputs off the response (the client never sees them) and keep
        a copy of each for the sequence's next request."""
        kept = []
        for out in response.outputs:
            input_name = self._state_input.get(out.name)
            if input_name is None:
                kept.append(out)
            elif not out.in_shared_memory:
                seq.state[input_name] = (list(out.shape), bytes(out.data))
        response.outputs = kept

    def instance_down(self, instance: Instance, reason: str) -> None:
        """A sequence keeps its instance (its slot there): while that instance's worker
        restarts, the sequence's requests fail with UNAVAILABLE (``pool.start_batch``),
        and the other instances' sequences go on. The state lives here, so a sequence
        resumes where it was once its instance is back."""

    def instance_up(self, instance: Instance) -> None:
        self._pump()

    def inflight_count(self) -> int:
        return self.stats.pending

    async def drain(self) -> None:
        """Refuse new requests, serve every queued and running one, then stop."""
        self._closing = True
        while not self.book.empty():
            self._pump()
            await asyncio.sleep(0.001)
        self._wakeup.arm(None)
