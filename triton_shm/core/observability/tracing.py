"""Triton's trace extension: trace settings (global and per model), sampling, recording
and the trace file, or OpenTelemetry spans (``mode=opentelemetry``, see ``otel.py``).

Settings are Triton's: ``trace_level`` (``OFF`` | ``TIMESTAMPS`` and/or ``TENSORS``),
``trace_rate`` (trace every Nth request), ``trace_count`` (traces left to take, -1 =
unlimited; it counts down), ``log_frequency`` (write every N traces to ``<file>.<index>``;
0 = all to ``<file>``, finished at shutdown), ``trace_file`` and ``trace_mode`` (start-up
only; with ``mode=opentelemetry`` also ``url``, ``resource`` and ``bsp_*`` instead of
the file's keys). A model's settings override some keys and take the others from the global ones;
clearing a key (null) of a model falls back to the global value, of the global settings to
the start-up value.

Only TIMESTAMPS are recorded (TENSORS is accepted and reported, but no tensors are
written). While every level is OFF the inference path pays one attribute check
(``Tracer.active``).

The file is Triton's JSON array; each trace is one object
``{"id", "model_name", "model_version", "request_id"?, "timestamps": [{"name", "ns"}]}``
(Triton spreads one trace over several objects with the same ``id``; tools that merge by
``id``, such as Triton's ``trace_summary.py``, read both). Timestamps are
``time.monotonic_ns()`` (Triton's steady clock). Writes happen in one background thread.
The steps of a traced ensemble are traced too, each a child (``parent_id``) of its trace,
and so are the BLS calls a Python model makes with ``trace=request.trace()`` (the worker
names the calling request's trace id; ``Tracer.live`` finds it while the request runs).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Iterable, Protocol

import orjson

from ...errors import InvalidArgument, Unsupported
from .otel import OtelConfig, RequestSpan, SpanExporter, attribute, new_span_id, span

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
DEFAULTS: dict[str, Any] = {"trace_level": ("OFF",), "trace_rate": 1000, "trace_count": -1, "log_frequency": 0}
_KEYS = tuple(DEFAULTS)
_STREAM_CHUNK = 256  # log_frequency 0: traces buffered before an append to the file


# -- values ---------------------------------------------------------------------------------
def _parse_int(key: str, value: Any) -> int:
    """A ``--trace-config`` value: a decimal number in the setting's range (rate 0 is
    allowed: only requests that carry a caller's OpenTelemetry context are traced, as
    tritonserver does)."""
    try:
        number = int(value.strip(), 10)
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}") from None
    if key == "trace_count":
        if number < -1:
            raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= -1, got: {value}")
    elif number < 0 or number >= 2**32:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}")
    return number


# What C's strtol reads of a string: leading white space, a sign, decimal digits (the rest is ignored).
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT32 = (-2**31, 2**31 - 1)
_UINT32_MAX = 2**32 - 1


def _parse_wire_int(key: str, value: Any) -> int:
    """A settings-API value, read as tritonserver reads it: ``std::stoi`` (so "12abc" is 12,
    and a number beyond int32 is out of range), then ``trace_rate`` and ``log_frequency``
    kept as uint32 (so "-1" is 4294967295, "-2" 4294967294) and ``trace_count`` as int32 of at
    least -1. Rate 0 is checked against the level once the change is applied (``_check``)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"'{key}' must be a string, got: {orjson.dumps(value).decode()}")
    match = _STOI.match(value)
    if match is None:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}")
    number = int(match.group(1))
    count = key == "trace_count"
    if not _INT32[0] <= number <= _INT32[1]:
        low, high = (-1, _INT32[1]) if count else (0, _UINT32_MAX)
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}")
    if count:
        if number < -1:
            raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= -1, got: {value}")
        return number
    return number & _UINT32_MAX


def _parse_level(value: Any) -> tuple[str, ...] | None:
    """None: no change (an empty list, as in Triton)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument("'trace_level' must be an array of strings")
    if not value:
        return None
    for v in value:
        if v not in LEVELS:
            raise InvalidArgument(f"Unknown trace level '{v}', expecting one of OFF, TIMESTAMPS, TENSORS")
    if "OFF" in value:
        if len(value) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ("OFF",)
    return tuple(level for level in LEVELS if level in value)


def parse_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """Wire values → ``{key: parsed value or None (clear)}``; unknown keys and
    ``trace_mode`` are ignored, as Triton does."""
    if "trace_file" in changes:
        raise Unsupported("trace file location can not be updated through network protocol")
    parsed: dict[str, Any] = {}
    for key in _KEYS:
        if key not in changes:
            continue
        value = changes[key]
        if value is None:
            parsed[key] = None
        elif key == "trace_level":
            level = _parse_level(value)
            if level is not None:
                parsed[key] = level
        else:
            parsed[key] = _parse_wire_int(key, value)
    return parsed


def _check(values: dict[str, Any]) -> None:
    """A scope's settings after a change: tracing on needs a non-zero rate (with every level
    OFF any rate is kept, as tritonserver keeps it)."""
    if values["trace_level"] != ("OFF",) and values["trace_rate"] == 0:
        raise InvalidArgument("Attempting to set invalid trace setting :sample rate must be non-zero")


# -- settings ------------------------------------------------------------------------------
class TraceSetting:
    """Effective settings of one scope (global or a model with overrides) and its
    sampling state."""

    __slots__ = ("level", "timestamps", "rate", "count", "log_frequency", "_seen")

    def __init__(self, values: dict[str, Any]):
        self.level: tuple[str, ...] = values["trace_level"]
        self.timestamps = "TIMESTAMPS" in self.level
        self.rate: int = values["trace_rate"]
        self.count: int = values["trace_count"]
        self.log_frequency: int = values["log_frequency"]
        self._seen = 0

    def values(self) -> dict[str, Any]:
        return {"trace_level": self.level, "trace_rate": self.rate, "trace_count": self.count,
                "log_frequency": self.log_frequency}

    def sample(self, forced: bool = False) -> bool:
        """Whether to trace the next request. ``forced``: it carries a caller's
        OpenTelemetry context, traced whatever ``rate`` and ``count`` say (and not counted
        against them), as tritonserver traces such requests."""
        if not self.timestamps:
            return False
        if forced:
            return True
        if self.count == 0 or self.rate == 0:
            return False
        self._seen += 1
        if self._seen % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        return True


@dataclass(frozen=True)
class Handover:
    """A sampled request that a front-end process forwards to the one owning its model: the
    owner records its trace (queue and compute times, BLS calls) from the start the
    forwarding process saw, under the same parent; the forwarding process records none.
    ``otel``: the W3C trace id and the span the model's span goes under."""
    start_ns: int
    log_frequency: int
    parent_id: int = 0
    otel: tuple[str, str] | None = None


class Trace:
    """Timestamps of one sampled request (``parent_id``: its ensemble's trace, else 0)."""

    __slots__ = ("id", "model_name", "model_version", "request_id", "stamps", "log_frequency", "parent_id",
                 "tracer", "handed_over")

    def __init__(self, trace_id: int, model_name: str, model_version: int, request_id: str,
                 log_frequency: int, start_ns: int, parent_id: int = 0):
        self.id, self.model_name, self.model_version = trace_id, model_name, model_version
        self.request_id, self.log_frequency, self.parent_id = request_id, log_frequency, parent_id
        self.stamps: list[tuple[str, int]] = [("REQUEST_START", start_ns)]
        self.tracer: Tracer | None = None  # set by the Tracer that made it (an ensemble's steps are its children)
        self.handed_over = False  # another front-end process records it (``hand_over``)

    def hand_over(self) -> Handover:
        """The request goes to the front-end process owning its model, which traces it."""
        self.handed_over = True
        return Handover(self.stamps[0][1], self.log_frequency, self.parent_id)

    def context(self) -> str:
        """What a Python model's ``request.trace().get_context()`` carries: nothing here."""
        return ""

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def computed(self, start_ns: int, timing: tuple[int, int, int]) -> None:
        """The batch ran from ``start_ns`` until now; ``timing`` is the worker's
        (input, infer, output) durations."""
        end = time.monotonic_ns()
        input_end = min(start_ns + timing[0], end)
        output_start = min(input_end + timing[1], end)
        self.stamps += [("COMPUTE_START", start_ns), ("COMPUTE_INPUT_END", input_end),
                        ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", end)]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "model_name": self.model_name, "model_version": self.model_version}
        if self.parent_id:
            doc["parent_id"] = self.parent_id
        if self.request_id:
            doc["request_id"] = self.request_id
        doc["timestamps"] = [{"name": name, "ns": ns} for name, ns in self.stamps]
        return doc


class SpanTrace(Trace):
    """A Trace in OpenTelemetry mode: the model's span (``span_id``) in W3C trace ``trace_id``
    under span ``parent_span`` (the request's InferRequest span, or the ensemble's model
    span for a step). ``own``: an InferRequest span no front-end made, ended with this."""

    __slots__ = ("trace_id", "span_id", "parent_span", "own")

    def __init__(self, trace_id: int, model_name: str, model_version: int, request_id: str, start_ns: int,
                 parent_id: int, otel_trace: str, parent_span: str, own: RequestSpan | None = None):
        super().__init__(trace_id, model_name, model_version, request_id, 0, start_ns, parent_id)
        self.trace_id, self.parent_span, self.own = otel_trace, parent_span, own
        self.span_id = new_span_id()

    def context(self) -> str:
        """The W3C traceparent of this request's model span: a BLS call's spans go under it."""
        return f"00-{self.trace_id}-{self.span_id}-01"

    def hand_over(self) -> Handover:
        return replace(super().hand_over(), otel=(self.trace_id, self.parent_span))

    def spans(self) -> list[dict[str, Any]]:
        """The model's span and, if the model ran, its ``compute`` span (the stamps end with
        REQUEST_END)."""
        stamps = self.stamps
        model_events = [s for s in stamps if not s[0].startswith("COMPUTE_")]
        compute = [s for s in stamps if s[0].startswith("COMPUTE_")]
        attributes = [attribute("triton.model_name", self.model_name),
                      attribute("triton.model_version", self.model_version),
                      attribute("triton.trace_id", self.id), attribute("triton.trace_parent_id", self.parent_id)]
        if self.request_id:
            attributes.append(attribute("triton.request_id", self.request_id))
        out = []
        if compute:
            out.append(span("compute", self.trace_id, new_span_id(), self.span_id, compute[0][1], compute[-1][1],
                            compute))
        end = stamps[-1][1]
        out.append(span(self.model_name, self.trace_id, self.span_id, self.parent_span, stamps[0][1], end,
                        model_events, attributes))
        if self.own is not None:
            out.append(self.own.to_span(end))
        return out


# -- the trace file ---------------------------------------------------------------------------
class TraceWriter(Protocol):
    """Where finished traces go, called in the tracer's one writer thread: the trace file,
    or (a front-end process other than 0) process 0, which writes them to its file."""

    def append(self, docs: list[bytes]) -> None: ...

    def write_indexed(self, docs: list[bytes]) -> None: ...

    def close(self) -> None: ...


class TraceFile:
    """Triton's TraceFile: one JSON array in ``path`` built up across appends and closed
    at shutdown, plus whole arrays in ``path.0``, ``path.1``, ... Called in one thread."""

    def __init__(self, path: str):
        self.path = path
        self.index = 0
        self._stream: BinaryIO | None = None

    def append(self, docs: list[bytes]) -> None:
        if self._stream is None:
            self._stream = open(self.path, "wb")
            self._stream.write(b"[")
        else:
            self._stream.write(b",")
        self._stream.write(b",".join(docs))
        self._stream.flush()

    def write_indexed(self, docs: list[bytes]) -> None:
        path = f"{self.path}.{self.index}"
        self.index += 1
        partial = f"{path}.partial"
        with open(partial, "wb") as f:
            f.write(b"[" + b",".join(docs) + b"]")
        os.replace(partial, path)  # readers never see half a file

    def close(self) -> None:
        if self._stream is not None:
            self._stream.write(b"]")
            self._stream.close()
            self._stream = None


class Tracer:
    """Trace settings of the server and the recorder of sampled requests."""

    def __init__(self, startup: dict[str, Any] | None = None, file: str = "", mode: str = "triton",
                 otel: OtelConfig | None = None):
        self.startup = {**DEFAULTS, **(startup or {})}
        self.file, self.mode = file, mode
        self.otel = (otel or OtelConfig()) if mode == "opentelemetry" else None
        self._exporter = SpanExporter(self.otel) if self.otel is not None else None
        self._global_values = dict(self.startup)
        self._overrides: dict[str, dict[str, Any]] = {}
        self._global = TraceSetting(self._global_values)
        self._models: dict[str, TraceSetting] = {}
        self.active = False        # the hot-path check: some scope traces TIMESTAMPS
        self.spans = False         # the front-ends' check: active, in OpenTelemetry mode
        self._next_id = 1
        self._id_step = 1  # several front-end processes: each numbers its own residue class
        self._live: dict[int, Trace] = {}  # traces not yet finished, by id: a BLS call names its parent
        self._indexed: list[bytes] = []   # log_frequency > 0: traces for the next <file>.<index>
        self._streamed: list[bytes] = []  # log_frequency 0: traces for <file>
        self._writer: TraceWriter | None = TraceFile(file) if file else None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._warned_no_file = False
        self._closed = False  # the file is finished (shutdown)
        self._refresh()

    @classmethod
    def from_config(cls, items: Iterable[str]) -> "Tracer":
        startup, file, mode, otel = parse_trace_config(items)
        return cls(startup, file, mode, otel)

    # -- settings ----------------------------------------------------------------------------
    def _refresh(self) -> None:
        self._models = {name: TraceSetting({**self._global_values, **over})
                        for name, over in self._overrides.items()}
        self.active = self._global.timestamps or any(s.timestamps for s in self._models.values())
        self.spans = self.active and self._exporter is not None
        if self.active and self._writer is None and self._exporter is None and not self._warned_no_file:
            self._warned_no_file = True
            log.warning("tracing is on but no trace file was given at start-up (--trace-config file=PATH): "
                        "traces are sampled but not written")

    def _setting(self, model: str) -> TraceSetting:
        return self._models.get(model) or self._global

    def settings(self, model: str = "") -> dict[str, Any]:
        """Triton's HTTP form: ``{"trace_level": [..], "trace_rate": "1000", ...}``."""
        s = self._setting(model) if model else self._global
        common = {"trace_level": list(s.level), "trace_rate": str(s.rate), "trace_count": str(s.count)}
        if self.otel is not None:  # no file, so no trace_file or log_frequency
            return {**common, "trace_mode": self.mode, **self.otel.settings()}
        return {**common, "log_frequency": str(s.log_frequency), "trace_file": self.file, "trace_mode": self.mode}

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply wire values (strings / lists of strings / null) to a model's or the
        global settings; all or nothing. Returns the new effective settings."""
        parsed = parse_changes(changes)
        if parsed:
            if model:
                over = dict(self._overrides.get(model, {}))
                for key, value in parsed.items():
                    if value is None:
                        over.pop(key, None)
                    else:
                        over[key] = value
                _check({**self._global_values, **over})
                if over:
                    self._overrides[model] = over
                else:
                    self._overrides.pop(model, None)
            else:
                values = {**self._global_values,
                          **{key: self.startup[key] if value is None else value for key, value in parsed.items()}}
                _check(values)
                self._global_values = values
                self._global = TraceSetting(values)
            self._refresh()
            log.info("trace settings updated%s: %s", f" for model '{model}'" if model else "",
                     {k: v for k, v in self.settings(model).items() if k in parsed})
        return self.settings(model)

    def api_changes(self) -> list[tuple[str, dict[str, Any]]]:
        """What the settings API changed since start-up, as ``(model, changes)`` in the wire
        form ``update`` takes (global first): a restarted front-end process replays them."""
        def wire(values: dict[str, Any]) -> dict[str, Any]:  # what _parse_wire_int reads back as the value
            return {k: list(v) if k == "trace_level" else str(v - 2**32 if v > _INT32[1] else v)
                    for k, v in values.items()}
        changed = {k: v for k, v in self._global_values.items() if v != self.startup[k]}
        scopes = [("", wire(changed))] + [(model, wire(over)) for model, over in self._overrides.items()]
        return [(model, changes) for model, changes in scopes if changes]

    # -- several front-end processes -----------------------------------------------------------
    def share_file(self, first_id: int, count: int, writer: TraceWriter | None) -> None:
        """One of ``count`` front-end processes: trace ids unique in the whole server (this
        process takes ``first_id``, then every ``count``-th: ids of one residue class), and,
        other than process 0, finished traces handed to ``writer`` (which passes them to
        process 0) rather than written to the file here."""
        self._next_id, self._id_step = first_id, count
        if self._writer is not None and writer is not None:
            self._writer = writer

    def write_from_peer(self, indexed: bool, docs: list[bytes]) -> None:
        """Process 0: another process's finished traces, written to the file in this
        process's writer thread (after what it queued before)."""
        writer = self._writer
        if self._closed:
            log.warning("%d traces from another front-end process came after the trace file was finished; "
                        "dropped", len(docs))
        elif writer is not None and docs:
            self._submit(writer.write_indexed if indexed else writer.append, docs)

    # -- recording ------------------------------------------------------------------------
    def sample(self, model_name: str, model_version: int, request_id: str, start_ns: int,
               request_span: RequestSpan | None = None) -> Trace | None:
        """A Trace if this request is to be traced (call only while ``active``).
        ``request_span``: the front-end's InferRequest span (OpenTelemetry mode)."""
        setting = self._models.get(model_name) or self._global
        if not setting.sample(request_span is not None and request_span.parent_id is not None):
            return None
        trace_id, self._next_id = self._next_id, self._next_id + self._id_step
        trace: Trace
        if self._exporter is None:
            trace = Trace(trace_id, model_name, model_version, request_id, setting.log_frequency, start_ns)
            trace.tracer = self
            self._live[trace_id] = trace
            return trace
        own = None
        if request_span is None:  # no front-end span (a caller in the process): the trace has its own
            request_span = own = RequestSpan(frontend=False)
        request_span.open(start_ns)
        assert request_span.trace_id is not None and request_span.span_id is not None
        trace = SpanTrace(trace_id, model_name, model_version, request_id, start_ns, 0, request_span.trace_id,
                          request_span.span_id, own)
        trace.tracer = self
        self._live[trace_id] = trace
        return trace

    def live(self, trace_id: Any) -> Trace | None:
        """The unfinished trace ``trace_id`` (a BLS call's parent), None if there is none
        (finished, never sampled, or a worker's bad id)."""
        return self._live.get(trace_id) if type(trace_id) is int else None

    def child(self, parent: Trace | Handover, model_name: str, model_version: int, request_id: str) -> Trace:
        """The trace of an ensemble step or a BLS call of traced ``parent`` (always traced,
        as Triton traces a child trace), or of a request another front-end process sampled
        and forwarded here (``Handover``)."""
        trace_id, self._next_id = self._next_id, self._next_id + self._id_step
        now = time.monotonic_ns()
        trace: Trace
        if isinstance(parent, Handover):
            if parent.otel is not None and self._exporter is not None:
                trace = SpanTrace(trace_id, model_name, model_version, request_id, parent.start_ns, parent.parent_id,
                                  *parent.otel)
            else:
                trace = Trace(trace_id, model_name, model_version, request_id, parent.log_frequency, parent.start_ns,
                              parent.parent_id)
        elif isinstance(parent, SpanTrace):
            trace = SpanTrace(trace_id, model_name, model_version, request_id, now, parent.id, parent.trace_id,
                              parent.span_id)
        else:
            trace = Trace(trace_id, model_name, model_version, request_id, parent.log_frequency, now, parent.id)
        trace.tracer = self
        self._live[trace_id] = trace
        return trace

    def end_request(self, request_span: RequestSpan) -> None:
        """The front-end has sent the response: export its InferRequest span if sampled."""
        if request_span.span_id is not None and self._exporter is not None:
            self._exporter.add([request_span.to_span(time.monotonic_ns())])

    def finish(self, trace: Trace) -> None:
        self._live.pop(trace.id, None)
        trace.stamp("REQUEST_END")
        if trace.handed_over:  # the owner of its model records it; a request span made here ends here
            if isinstance(trace, SpanTrace) and trace.own is not None and self._exporter is not None:
                self._exporter.add([trace.own.to_span(trace.stamps[-1][1])])
            return
        if isinstance(trace, SpanTrace):
            if self._exporter is not None:
                self._exporter.add(trace.spans())
            return
        if self._writer is None:
            return
        doc = orjson.dumps(trace.to_json())
        if trace.log_frequency > 0:
            self._indexed.append(doc)
            if len(self._indexed) >= trace.log_frequency:
                docs, self._indexed = self._indexed, []
                self._submit(self._writer.write_indexed, docs)
        else:
            self._streamed.append(doc)
            if len(self._streamed) >= _STREAM_CHUNK:
                docs, self._streamed = self._streamed, []
                self._submit(self._writer.append, docs)

    def _submit(self, fn, docs: list[bytes]) -> concurrent.futures.Future:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        future = self._executor.submit(fn, docs)
        future.add_done_callback(_log_write_error)
        return future

    def _flush_all(self) -> None:
        """Write what is buffered and finish the file (in the writer thread's order)."""
        writer = self._writer
        if writer is None:
            return
        if self._indexed:
            docs, self._indexed = self._indexed, []
            self._submit(writer.write_indexed, docs)
        if self._streamed:
            docs, self._streamed = self._streamed, []
            self._submit(writer.append, docs)
        if self._executor is not None:
            self._executor.submit(writer.close).add_done_callback(_log_write_error)
            self._executor.shutdown(wait=True)
            self._executor = None

    async def close(self) -> None:
        """At shutdown: write every buffered trace (export every queued span)."""
        if self._exporter is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._exporter.close)
        if self._writer is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._flush_all)
        self._closed = True
        if isinstance(self._writer, TraceFile):  # not when another process writes the file
            log.info("trace file %s written", self.file)


def _log_write_error(future: concurrent.futures.Future) -> None:
    error = future.exception()
    if error is not None:
        log.error("failed to write traces: %s", error)


# -- --trace-config ------------------------------------------------------------------------------
_CLI_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "log_frequency": "log_frequency",
             "log-frequency": "log_frequency"}


def parse_trace_config(items: Iterable[str]) -> tuple[dict[str, Any], str, str, OtelConfig | None]:
    """Triton's ``--trace-config [<mode>,]<key>=<value>`` flags → (start-up settings,
    file, mode, the opentelemetry settings when that is the mode). Raises ValueError."""
    startup: dict[str, Any] = {}
    levels: list[str] = []
    mode, files = "triton", {}
    otel = OtelConfig()
    for item in items:
        scope, _, setting = item.rpartition(",")
        key, sep, value = setting.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"--trace-config: expected [<mode>,]<setting>=<value>, got '{item}'")
        if scope:
            if key == "file":
                files[scope] = value
                continue
            if scope not in MODES:
                raise ValueError(f"--trace-config: unknown trace mode '{scope}' in '{item}'")
            if scope == "opentelemetry":
                otel.set(key, value)
                continue
        if key == "mode":
            mode = value.lower()
        elif key == "file":
            files["triton"] = value
        elif key == "level":
            levels.append(value.upper())
        elif key in _CLI_KEYS:
            try:
                startup[_CLI_KEYS[key]] = _parse_int(_CLI_KEYS[key], value)
            except InvalidArgument as e:
                raise ValueError(f"--trace-config {item}: {e.message}") from None
        else:
            raise ValueError(f"--trace-config: unknown setting '{key}' in '{item}'")
    if mode not in MODES:
        raise ValueError(f"--trace-config mode={mode}: invalid trace mode, expected 'triton' or 'opentelemetry'")
    if levels:
        try:
            startup["trace_level"] = _parse_level(levels) or DEFAULTS["trace_level"]
        except InvalidArgument as e:
            raise ValueError(f"--trace-config: {e.message}") from None
    if mode == "opentelemetry":
        otel.check()
        return startup, "", mode, otel
    return startup, files.get(mode, ""), mode, None
