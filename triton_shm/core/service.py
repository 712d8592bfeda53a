"""InferenceService: the one entry point both protocol adapters call.

Every method raises :class:`triton_shm.errors.TritonShmError` subclasses on failure;
adapters map those to HTTP/gRPC status once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import NotFound, Unavailable
from .model_config import config_to_json, validate_model_name
from .repository import ModelRepository
from .shm_registry import SharedMemoryRegistry
from .types import InferRequest, InferResponse
from .validation import validate_request

if TYPE_CHECKING:
    from .._proto import model_config_pb2
    from ..worker.pool import WorkerPool

SERVER_NAME = "triton"
# Only what really works is advertised (perf_analyzer reads this list).
EXTENSIONS = ["model_repository", "schedule_policy", "model_configuration", "binary_tensor_data", "parameters",
              "statistics"]


class InferenceService:
    def __init__(self, repository: ModelRepository, workers: "WorkerPool", shm: SharedMemoryRegistry):
        self.repository = repository
        self.workers = workers
        self.shm = shm
        shm.on_close = workers.drop_region
        self.accepting = True  # False once shutdown begins

    # -- health and metadata -------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.accepting and self.workers.all_alive() and self.repository.all_ready()

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if self.shm.enabled:
            extensions.append("system_shared_memory")
        return {"name": SERVER_NAME, "version": __version__, "extensions": extensions}

    # -- shared memory -------------------------------------------------------------------
    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register_system(name, key, offset, byte_size)

    def register_cuda_shm(self, name: str, raw_handle: bytes | str, device_id: int, byte_size: int) -> None:
        self.shm.register_cuda(name, raw_handle, device_id, byte_size)

    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """kind "system" → ``[{"name","key","offset","byte_size"}]``; "cuda" → ``[{"name","device_id","byte_size"}]``."""
        return self.shm.status(kind, name)

    def unregister_shm(self, kind: str, name: str = "") -> None:
        self.shm.unregister(kind, name)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.repository.get(name, version).ready
        except NotFound:
            return False

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """``{"name", "versions", "platform", "inputs", "outputs"}`` as Triton reports it."""
        model = self.repository.get(name, version, require_ready=True)
        return model.metadata(self.repository.versions_of(name))

    def model_config(self, name: str, version: str = "") -> "model_config_pb2.ModelConfig":
        return self.repository.get(name, version, require_ready=True).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}`` as Triton's statistics extension reports it."""
        if name:
            validate_model_name(name)
        return {"model_stats": self.repository.statistics(name, version)}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """``[{"name", "version", "state", "reason"?}]`` sorted by name and version."""
        return self.repository.index(ready_only)

    # -- inference -----------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request. The caller must call ``response.release()`` when done with it."""
        if not self.accepting:
            raise Unavailable("Server is shutting down")
        validate_model_name(request.model_name)
        model = self.repository.get(request.model_name, request.model_version, require_ready=True)
        plan = validate_request(model, request)
        if not (plan.shm_inputs or plan.shm_outputs):
            return await model.scheduler.submit(request, plan, {})
        regions = self.shm.acquire_all(plan)
        try:
            return await model.scheduler.submit(request, plan, regions)
        finally:  # the worker has finished with the regions once it replied
            for region in regions.values():
                self.shm.release(region)
