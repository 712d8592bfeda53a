"""Protocol-neutral inference request and response.

The HTTP and gRPC adapters translate their wire messages into these types and back;
everything below the adapters (validation, scheduling, workers) sees only these.
Tensor payloads are kept in their wire encoding (little-endian, row-major, BYTES as
4-byte length-prefixed elements) so the front-end never decodes tensor data.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Callable

from .types_py import (RESERVED_PARAMETERS, BatchRequest, Buffer, InferRequest, InferResponse, InputTensor,
                       OutputTensor, ParamValue, Pending, RequestedOutput)

# The request/response types and a request's scheduler entry: C classes when built (a
# construction costs a C call, not a Python __init__ frame: several per request), else
# the dataclass twins.
# Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the twins (the tests run both).
USING_EXTENSION = False
if os.environ.get("TRITON_SHM_NO_EXTENSIONS", "") in ("", "0"):
    try:
        from ._types import (  # type: ignore  # noqa: F811
            BatchRequest, InferRequest, InferResponse, InputTensor, OutputTensor, Pending, RequestedOutput)
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twins serve
        pass

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
    items, and how to tell the model the client is gone (set once the request runs)."""
    queue: "asyncio.Queue"
    cancel: Callable[[], None] | None = None
