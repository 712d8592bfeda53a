"""A worker's request and response as a backend sees them, in pure Python: the twin of
``_types.pyx``, and the definition both follow (same fields, defaults, equality and
repr). ``backends.base`` picks one; import them from there."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.data.types import ParamValue
from ..errors import TritonShmError


@dataclass(slots=True)
class WorkerRequest:
    id: str
    # name -> array. BYTES: 1-D-reshaped object array of ``bytes``; BF16: uint16 words.
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]          # name -> V2 datatype ("FP32", "BYTES", ...)
    requested_outputs: list[str]       # empty = every output in the config
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    # Decoupled models only: send(response or None, final) delivers a response at any
    # time, from any thread; the request is complete once final is True.
    sender: Callable[[WorkerResponse | None, bool], None] | None = None
    is_cancelled: Callable[[], bool] | None = None  # decoupled: the client has gone
    # sequence batching: the correlation ID, and SEQUENCE_START (1) | SEQUENCE_END (2)
    correlation_id: int | str = 0
    flags: int = 0
    # a traced request: [trace id, W3C traceparent or ""] (``pb_utils`` ``request.trace()``)
    trace: list | None = None


@dataclass(slots=True)
class WorkerResponse:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: TritonShmError | None = None
    # the response's parameters (bool, int or str each), sent with it to the client; None: none
    parameters: dict[str, ParamValue] | None = None
