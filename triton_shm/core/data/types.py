"""Protocol-neutral inference request and response.

The HTTP and gRPC adapters translate their wire messages into these types and back;
everything below the adapters (validation, scheduling, workers) sees only these.
Tensor payloads are kept in their wire encoding (little-endian, row-major, BYTES as
4-byte length-prefixed elements) so the front-end never decodes tensor data.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from ..._twins import pick
from .types_py import (RESERVED_PARAMETERS, BatchRequest, Buffer, InferRequest, InferResponse, InputTensor,
                       OutputTensor, ParamValue, Pending, RequestedOutput)

# The request/response types and a request's scheduler entry: C classes when built (a
# construction costs a C call, not a Python __init__ frame: several per request), else
# the dataclass twins (``_twins``).
USING_EXTENSION = pick(globals(), "._types", "BatchRequest", "InferRequest", "InferResponse", "InputTensor",
                       "OutputTensor", "Pending", "RequestedOutput")

__all__ = ["Buffer", "BatchRequest", "InferRequest", "InferResponse", "InputTensor", "OutputTensor", "ParamValue",
           "Pending", "RESERVED_PARAMETERS", "RequestedOutput", "ResponseStream", "SHM_PARAMETERS", "USING_EXTENSION",
           "request_id_prefix"]

# Parameters that place a tensor in a client shared-memory region.
SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def request_id_prefix(request_id: str) -> str:
    """What starts a request's error message, as Triton writes it."""
    return f"[request id: {request_id or '<id_unknown>'}] "


@dataclass(eq=False)
class ResponseStream:
    """Where a decoupled model's responses go: ``(response | error | None, final)``
    items, and how to tell the model the client is gone (set once the request runs).
    ``opened_ns``: when it was opened (monotonic), while latency histograms time the first
    response (else 0)."""
    queue: "asyncio.Queue"
    cancel: Callable[[], None] | None = None
    opened_ns: int = 0
    # (counts, batched, labels) when outputs were asked for as classes: each response's
    # outputs become their top classes (core/data/classification.py) as they are read
    classify: tuple | None = None
