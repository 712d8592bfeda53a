"""The request and response types (and a request's scheduler entry) in pure Python: the
twin of ``_types.pyx``, and the definition both follow (same fields, defaults, equality
and repr).
``core.data.types`` picks one; import them from there."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

if TYPE_CHECKING:
    from ..models.validation import RequestPlan
    from .shm_registry import Region
    from .types import ResponseStream

# Request/response parameter values, as both protocols can express them.
ParamValue = Union[bool, int, float, str]
Buffer = Union[bytes, bytearray, memoryview]


# Request parameters that mean something to the server (Triton's reserved keys, plus
# every key starting "triton_"); models see only the others.
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                 "headers", "binary_data_output"})


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: Buffer | None = None  # wire-encoded bytes (None while unset)
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" = the version policy's highest
    id: str = ""
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty = all outputs

    def model_parameters(self) -> dict[str, ParamValue]:
        """The parameters a model may see (``request.parameters()`` in Python models)."""
        params = self.parameters
        if not params:
            return {}
        return {k: v for k, v in params.items() if k not in RESERVED_PARAMETERS and not k.startswith("triton_")}


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: Buffer  # wire-encoded bytes; may be a view into shared memory, see release()
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    in_shared_memory: bool = False  # written into the client's region; ``data`` is empty
    shm_byte_size: int = 0          # then: how many bytes were written there


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    outputs: list[OutputTensor] = field(default_factory=list)
    _release: Callable[[], None] | None = None

    def release(self) -> None:
        """Give the output buffers back. Call once the wire message is built."""
        if self._release is not None:
            release, self._release = self._release, None
            release()


@dataclass(eq=False)
class BatchRequest:
    """One request of a batch as the scheduler hands it to the worker pool: validated,
    with what validation learned, the client shared-memory regions it uses, and for a
    decoupled model the stream its responses go to."""
    request: InferRequest
    plan: "RequestPlan"
    regions: dict[str, "Region"]
    stream: "ResponseStream | None"


@dataclass(eq=False)
class Pending(BatchRequest):
    """A queued request (the scheduler's): what the pool needs (``BatchRequest``) and the
    queue's own state."""
    rows: int                     # batch rows this request contributes (1 without batching)
    priority: int
    enqueued_ns: int
    deadline_ns: int | None
    reject_on_timeout: bool
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    seq: int = 0
    result: Any = None            # preserve_ordering: held until earlier requests are answered
    trace: Any = None             # a tracing.Trace when this request is traced
    # the scheduler's pending count drops when it is answered (no coroutine of the
    # scheduler's waits for it to drop the count when the caller stops waiting)
    count_on_answer: bool = False
