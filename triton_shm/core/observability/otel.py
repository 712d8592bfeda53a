"""OpenTelemetry trace mode (``--trace-config mode=opentelemetry``): W3C trace context,
span records and their export as OTLP/HTTP JSON, as tritonserver 2.51 posts them.

Spans (all kind SERVER, scope ``triton-server``): ``InferRequest`` (the front-end's: its
parent is the caller's ``traceparent``), a child named after the model (REQUEST_START,
QUEUE_START, REQUEST_END; ``triton.*`` attributes), its child ``compute`` (COMPUTE_*), and
for an ensemble one model span per step under the ensemble's.

Export runs in one daemon thread (the batch span processor): ended spans go into a
bounded deque (``bsp_max_queue_size``; when full, new spans are dropped and counted), and
the thread posts them in batches of ``bsp_max_export_batch_size`` every
``bsp_schedule_delay`` ms, or sooner once a batch is full. The request path only appends
to the deque. A collector that cannot be reached is one warning until an export succeeds
again. No opentelemetry package is needed.
"""
from __future__ import annotations

import http.client
import logging
import random
import threading
import time
from collections import deque
from typing import Any, Iterable
from urllib.parse import urlsplit

import orjson

log = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME = "triton-inference-server"
SCOPE = {"name": "triton-server"}
SPAN_KIND_SERVER = 2
BSP_DEFAULTS = {"bsp_max_queue_size": 2048, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 512}
EXPORT_TIMEOUT_S = 10.0

# time.monotonic_ns() (what the stamps are) + this = Unix ns (what OTLP carries)
_UNIX_OFFSET_NS = time.time_ns() - time.monotonic_ns()


def unix_ns(monotonic_ns: int) -> int:
    return monotonic_ns + _UNIX_OFFSET_NS


def new_trace_id() -> str:
    return f"{random.getrandbits(128) or 1:032x}"


def new_span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


_HEX = frozenset("0123456789abcdef")


def parse_traceparent(value: str | bytes | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``),
    None when absent or malformed (the request then starts a trace of its own)."""
    if not value:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    parts = value.strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    trace_id, span_id = parts[1], parts[2]
    if not (_HEX.issuperset(trace_id) and _HEX.issuperset(span_id)) or not int(trace_id, 16) or not int(span_id, 16):
        return None
    return trace_id, span_id


# -- settings -----------------------------------------------------------------------------------
def check_url(url: str) -> str:
    """The collector's URL as given (``host:port/path``, http:// assumed) or with its scheme;
    raises ValueError for one that names no host or port."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--trace-config opentelemetry,url={url}: invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--trace-config opentelemetry,url={url}: expected [http[s]://]HOST[:PORT]/PATH")
    if port == 0:
        raise ValueError(f"--trace-config opentelemetry,url={url}: invalid port")
    return url


class OtelConfig:
    """The ``opentelemetry,<key>=<value>`` settings (start-up only)."""

    def __init__(self) -> None:
        self.url = DEFAULT_URL
        self.resources: list[str] = []  # "key=value", in the order given
        self.bsp: dict[str, int] = dict(BSP_DEFAULTS)

    def set(self, key: str, value: str) -> None:
        """Raises ValueError for an unknown key or a bad value."""
        if key == "url":
            self.url = check_url(value)
        elif key == "resource":
            name, sep, _ = value.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"--trace-config opentelemetry,resource={value}: expected KEY=VALUE")
            self.resources.append(value)
        elif key in self.bsp:
            try:
                number = int(value, 10)
            except ValueError:
                raise ValueError(f"--trace-config opentelemetry,{key}={value}: expected an integer") from None
            if number <= 0 or number >= 2**31:
                raise ValueError(f"--trace-config opentelemetry,{key}={value}: must be a positive integer")
            self.bsp[key] = number
        else:
            raise ValueError(f"--trace-config: unknown opentelemetry setting '{key}' (expected url, resource, "
                             "bsp_max_queue_size, bsp_schedule_delay or bsp_max_export_batch_size)")

    def check(self) -> None:
        if self.bsp["bsp_max_export_batch_size"] > self.bsp["bsp_max_queue_size"]:
            raise ValueError("--trace-config: opentelemetry,bsp_max_export_batch_size must not exceed "
                             "bsp_max_queue_size")

    def settings(self) -> dict[str, Any]:
        """What the trace settings API reports besides the common keys (strings, as Triton)."""
        resource: str | list[str] = self.resources[0] if len(self.resources) == 1 else list(self.resources)
        return {"url": self.url, "resource": resource,
                **{key: str(self.bsp[key]) for key in ("bsp_schedule_delay", "bsp_max_export_batch_size",
                                                        "bsp_max_queue_size")}}

    def resource(self) -> dict[str, Any]:
        attributes = {"telemetry.sdk.name": "opentelemetry", "telemetry.sdk.language": "python",
                      "service.name": DEFAULT_SERVICE_NAME}
        for item in self.resources:
            name, _, value = item.partition("=")
            attributes[name.strip()] = value.strip()
        return {"attributes": [attribute(k, v) for k, v in attributes.items()]}


# -- spans ----------------------------------------------------------------------------------------
def attribute(key: str, value: str | int) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def span(name: str, trace_id: str, span_id: str, parent_id: str | None, start_ns: int, end_ns: int,
         events: Iterable[tuple[str, int]], attributes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One OTLP JSON span; times are monotonic ns."""
    doc: dict[str, Any] = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": SPAN_KIND_SERVER,
                           "startTimeUnixNano": str(unix_ns(start_ns)), "endTimeUnixNano": str(unix_ns(end_ns)),
                           "events": [{"name": n, "timeUnixNano": str(unix_ns(ns))} for n, ns in events]}
    if parent_id:
        doc["parentSpanId"] = parent_id
    if attributes:
        doc["attributes"] = attributes
    return doc


class RequestSpan:
    """The ``InferRequest`` span of one request: made by the front-end (only while spans are
    traced) with the caller's context and its receive times; the service fills ``trace_id``
    and ``span_id`` when it samples the request (a request not sampled leaves ``span_id``
    None and is never exported). ``frontend`` False: the service made it and ends it."""

    __slots__ = ("trace_id", "parent_id", "span_id", "start_ns", "events", "frontend")

    def __init__(self, traceparent: str | bytes | None = None, events: list[tuple[str, int]] | None = None,
                 frontend: bool = True):
        context = parse_traceparent(traceparent)
        self.trace_id: str | None = context[0] if context is not None else None
        self.parent_id: str | None = context[1] if context is not None else None
        self.span_id: str | None = None
        self.start_ns = 0
        self.events = events if events is not None else []
        self.frontend = frontend

    def fresh(self) -> "RequestSpan":
        """The span of another request under the same caller context (each request of a
        gRPC stream: the call's metadata carries the traceparent)."""
        other = RequestSpan()
        other.trace_id, other.parent_id = self.trace_id, self.parent_id
        return other

    def open(self, now_ns: int) -> None:
        if self.trace_id is None:
            self.trace_id = new_trace_id()
        self.span_id = new_span_id()
        self.start_ns = now_ns

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.events.append((name, time.monotonic_ns() if ns is None else ns))

    def to_span(self, end_ns: int) -> dict[str, Any]:
        assert self.trace_id is not None and self.span_id is not None
        return span("InferRequest", self.trace_id, self.span_id, self.parent_id, self.start_ns, end_ns, self.events)


# -- export ---------------------------------------------------------------------------------------
class SpanExporter:
    """The batch span processor and OTLP/HTTP JSON exporter (one daemon thread)."""

    def __init__(self, config: OtelConfig):
        self.url = config.url if "://" in config.url else f"http://{config.url}"
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._resource = config.resource()
        self.max_queue = config.bsp["bsp_max_queue_size"]
        self.delay_s = config.bsp["bsp_schedule_delay"] / 1000
        self.batch = config.bsp["bsp_max_export_batch_size"]
        self._queue: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._connection: http.client.HTTPConnection | None = None
        self.dropped = 0
        self.exported = 0
        self._failing = False  # a warning was logged; the next success logs the recovery

    def add(self, spans: list[dict[str, Any]]) -> None:
        """Called on the event loop: never blocks (a full queue drops the spans)."""
        queue = self._queue
        if len(queue) + len(spans) > self.max_queue:
            if not self.dropped:
                log.warning("OpenTelemetry span queue is full (bsp_max_queue_size=%d): spans are dropped",
                            self.max_queue)
            self.dropped += len(spans)
            return
        queue.extend(spans)  # deque appends are atomic: the export thread pops concurrently
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel-exporter", daemon=True)
            self._thread.start()
        if len(queue) >= self.batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._export_all()
        self._export_all()

    def _export_all(self) -> None:
        queue = self._queue
        while queue:
            batch = [queue.popleft() for _ in range(min(self.batch, len(queue)))]
            if not self._post(batch):  # the collector is away: try again at the next tick
                if self._stop:
                    queue.clear()  # shutting down: give up
                return

    def _post(self, spans: list[dict[str, Any]]) -> bool:
        body = orjson.dumps({"resourceSpans": [{"resource": self._resource,
                                                "scopeSpans": [{"scope": SCOPE, "spans": spans}]}]})
        try:
            if self._connection is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._connection = cls(self._host, self._port, timeout=EXPORT_TIMEOUT_S)
            self._connection.request("POST", self._path, body, {"Content-Type": "application/json"})
            response = self._connection.getresponse()
            response.read()
            if response.status >= 300:
                raise OSError(f"HTTP {response.status} {response.reason}")
        except (OSError, http.client.HTTPException) as e:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            if not self._failing:  # once, not per batch: the collector may be away for long
                self._failing = True
                log.warning("failed to export OpenTelemetry spans to %s: %s (spans are dropped until it "
                            "answers)", self.url, e)
            return False
        if self._failing:
            self._failing = False
            log.info("exporting OpenTelemetry spans to %s again", self.url)
        self.exported += len(spans)
        return True

    def close(self) -> None:
        """Export what is queued and stop the thread (a collector that does not answer
        holds shutdown for at most the export timeout, twice)."""
        thread = self._thread
        if thread is None:
            return
        self._stop = True
        self._wake.set()
        thread.join(2 * EXPORT_TIMEOUT_S)
        if self._connection is not None:
            self._connection.close()
