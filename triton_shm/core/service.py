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
from .types import InferRequest, InferResponse
from .validation import validate_request

if TYPE_CHECKING:
    from .._proto import model_config_pb2
    from ..worker.pool import WorkerPool

SERVER_NAME = "triton"
# Only what really works is advertised (perf_analyzer reads this list).
EXTENSIONS = ["model_repository", "model_configuration", "binary_tensor_data", "parameters"]


class InferenceService:
    def __init__(self, repository: ModelRepository, workers: "WorkerPool"):
        self.repository = repository
        self.workers = workers
        self.accepting = True  # False once shutdown begins

    # -- health and metadata -------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.accepting and self.workers.all_alive() and self.repository.all_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

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
        return await self.workers.execute(model, request, plan)
