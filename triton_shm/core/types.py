"""Protocol-neutral inference request and response.

The HTTP and gRPC adapters translate their wire messages into these types and back;
everything below the adapters (validation, scheduling, workers) sees only these.
Tensor payloads are kept in their wire encoding (little-endian, row-major, BYTES as
4-byte length-prefixed elements) so the front-end never decodes tensor data.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    from .shm_registry import Region
    from .validation import RequestPlan

# Request/response parameter values, as both protocols can express them.
ParamValue = Union[bool, int, float, str]
Buffer = Union[bytes, bytearray, memoryview]


# Request parameters that mean something to the server (Triton's reserved keys, plus
# every key starting "triton_"); models see only the others.
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                 "headers", "binary_data_output"})

# Parameters that place a tensor in a client shared-memory region.
SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def request_id_prefix(request_id: str) -> str:
    """What starts a request's error message, as Triton writes it."""
    return f"[request id: {request_id or '<id_unknown>'}] "


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
class ResponseStream:
    """Where a decoupled model's responses go: ``(response | error | None, final)``
    items, and how to tell the model the client is gone (set once the request runs)."""
    queue: "asyncio.Queue"
    cancel: Callable[[], None] | None = None


@dataclass(eq=False)
class BatchRequest:
    """One request of a batch as the scheduler hands it to the worker pool: validated,
    with what validation learned, the client shared-memory regions it uses, and for a
    decoupled model the stream its responses go to."""
    request: InferRequest
    plan: "RequestPlan"
    regions: dict[str, "Region"]
    stream: ResponseStream | None
