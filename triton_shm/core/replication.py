"""The core's one view of the other front-end processes (``--frontend-processes N``).

Every change of the server's state is an *op*: a name the service's ``appliers`` map to
what applies it in one process, with a JSON body. ``InferenceService`` applies an op here,
then has ``Replicas.others`` apply it in every other process (and gathers their answers)
before the client is answered; a process that asks the same of this one reaches the same
applier (``InferenceService.apply_here``). So the core reads the same with one process and
with several, and a stateful API that goes through ``apply`` is replicated by construction.

``LocalReplicas`` is the one process of the server (N = 1): there are no others, and model
control goes straight to the model manager. ``cluster/control.py: Cluster`` is the
replicated implementation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .models.manager import ModelManager
    from .models.version import ModelVersion


class Replicas(Protocol):
    async def others(self, op: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``op`` applied in every other front-end process; their answers (none with one
        process). One that cannot be reached is left out (it takes the server's state when
        it is back); another's error is raised once all have answered."""

    async def load(self, name: str, config: str | None, files: dict[str, bytes]) -> None:
        """Load (or reload) ``name`` in every process; answered once all have."""

    async def unload(self, name: str, dependents: bool) -> None:
        """Unload ``name`` (and its dependents) in every process; answered once all have."""

    async def model_ready(self, mv: "ModelVersion", everywhere: bool = False) -> bool:
        """The instances of ``mv`` in its owner (another process), or (``everywhere``) in
        every other process, say they are ready."""


class LocalReplicas:
    """One front-end process: nothing to replicate; model control is the model manager's."""

    def __init__(self, models: "ModelManager"):
        self.models = models

    async def others(self, op: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    async def load(self, name: str, config: str | None, files: dict[str, bytes]) -> None:
        await self.models.load(name, config, files)

    async def unload(self, name: str, dependents: bool) -> None:
        await self.models.unload(name, dependents)

    async def model_ready(self, mv: "ModelVersion", everywhere: bool = False) -> bool:
        return True  # no other process runs an instance of it
