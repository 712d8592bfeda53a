"""The interface between a worker and the backends that run model instances.

A worker decodes tensors from shared memory into numpy arrays, hands a list of
:class:`WorkerRequest` to :meth:`ModelInstance.execute`, and encodes the arrays of each
:class:`WorkerResponse` back into shared memory. Backends never see shared memory,
sockets or protocol details.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.types import ParamValue
from ..errors import TritonShmError


@dataclass(slots=True)
class ModelContext:
    """What a backend knows about the model it runs."""
    name: str
    version: int
    model_dir: Path          # <repository>/<name>
    config: dict[str, Any]   # model config in Triton's JSON form (proto field names)

    @property
    def repository(self) -> Path:
        return self.model_dir.parent

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)

    @property
    def default_model_filename(self) -> str:
        return self.config.get("default_model_filename") or ""


@dataclass(slots=True)
class InstanceSpec:
    name: str         # e.g. "add_sub_0"
    kind: str         # "KIND_CPU" | "KIND_GPU" | "KIND_MODEL"
    device_id: int    # GPU ordinal for KIND_GPU, else 0


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


@dataclass(slots=True)
class WorkerResponse:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: TritonShmError | None = None


class ModelInstance(ABC):
    """One instance of a model. ``execute`` runs on the instance's own thread."""

    @abstractmethod
    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        """Exactly one response per request, in order."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds; called once at unload."""


class Backend(ABC):
    """A model family (ONNX Runtime, Python). One object per loaded model version."""

    name: str = ""
    # True when a batch runs as one request whose tensors hold every request's rows
    # (the worker's batch assembler concatenates them); False to get the list of
    # requests, as Triton's python backend does.
    concat_batching: bool = False

    def __init__(self, context: ModelContext):
        self.context = context

    @staticmethod
    @abstractmethod
    def auto_complete(context: ModelContext) -> dict[str, Any]:
        """Return the config completed from the model itself (inputs, outputs,
        max_batch_size where the config leaves them out), as Triton's auto-complete does.
        Raise TritonShmError when the model cannot be read."""

    @abstractmethod
    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        """Build one instance (loads weights, runs user initialize code)."""
