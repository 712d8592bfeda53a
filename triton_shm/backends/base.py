"""The interface between a worker and the backends that run model instances.

A worker decodes tensors from shared memory into numpy arrays, hands a list of
:class:`WorkerRequest` to :meth:`ModelInstance.execute`, and encodes the arrays of each
:class:`WorkerResponse` back into shared memory. Backends never see shared memory,
sockets or protocol details.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._twins import pick
from .types_py import WorkerRequest, WorkerResponse

# The request and response a backend gets and returns: C classes when built (the worker
# builds one of each per request: a C call, not a Python __init__ frame), else the
# dataclass twins (``_twins``).
USING_EXTENSION = pick(globals(), "._types", "WorkerRequest", "WorkerResponse")

__all__ = ["Backend", "InstanceSpec", "ModelContext", "ModelInstance", "USING_EXTENSION", "WorkerRequest",
           "WorkerResponse"]


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
    # True when the model never writes into its input arrays: inputs that arrive in a
    # client's system shared-memory region are then lent to it in place, as read-only
    # arrays, instead of copied out of the region first.
    reads_inputs_in_place: bool = False
    # True when a KIND_GPU instance takes its inputs on its device: an input in a client's
    # CUDA shared-memory region then reaches it as a CuPy array on the GPU (a view of the
    # region when ``reads_inputs_in_place``, else one device copy) instead of a host copy.
    # The GPU backends always do; a Python model does with FORCE_CPU_ONLY_INPUT_TENSORS "no".
    takes_device_inputs: bool = False

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
