"""The core's seam to the other front-end processes (core/replication.py), without processes:
two services whose ``Replicas`` hand every op to the other's ``apply_here``, as the peer
links do. A change made through either is the same in both, and one service alone (N = 1,
``LocalReplicas``) changes its own state the same way. End-to-end, with two real processes:
test_frontend_processes.py."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from triton_shm.core.data.shm_registry import SharedMemoryRegistry
from triton_shm.core.models.manager import ModelManager
from triton_shm.core.models.repository import ModelRepository
from triton_shm.core.replication import LocalReplicas
from triton_shm.core.service import InferenceService
from triton_shm.errors import InvalidArgument
from triton_shm.supervisor.pool import WorkerPool


def _service(tmp_path) -> InferenceService:
    models = ModelManager(ModelRepository([tmp_path]), WorkerPool([]), mode="explicit")
    return InferenceService(models, SharedMemoryRegistry(True, [0]))


class Peer:
    """``Replicas`` whose one other process is ``service`` (what it was asked is kept)."""

    def __init__(self, service: InferenceService):
        self.service, self.ops = service, []

    async def others(self, op: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        self.ops.append(op)
        return [await self.service.apply_here(op, body)]

    async def load(self, name: str, config: str | None, files: dict[str, bytes]) -> None:
        raise AssertionError("not used here")

    async def unload(self, name: str, dependents: bool) -> None:
        raise AssertionError("not used here")

    async def model_ready(self, mv, everywhere: bool = False) -> bool:
        raise AssertionError("not used here")


@pytest.fixture
def pair(tmp_path):
    a, b = _service(tmp_path), _service(tmp_path)
    a.replicate(Peer(b))
    b.replicate(Peer(a))
    yield a, b
    a.shm.close()
    b.shm.close()


def test_one_service_alone_has_no_others(tmp_path):
    service = _service(tmp_path)
    assert isinstance(service.replicas, LocalReplicas)
    assert service.shm.on_idle is None  # alone, the registry drops an idle region itself
    assert asyncio.run(service.replicas.others("log_update", {"changes": {}})) == []


def test_settings_changed_through_one_are_the_same_in_both(pair):
    a, b = pair

    async def change() -> None:
        settings = await a.update_trace_settings("", {"trace_rate": "7"})
        assert settings["trace_rate"] == "7"
        await b.update_log_settings({"log_verbose_level": 2})
    asyncio.run(change())
    assert a.trace_settings() == b.trace_settings()
    assert a.get_log_settings()["log_verbose_level"] == b.get_log_settings()["log_verbose_level"] == 2
    assert a.replicas.ops == ["trace_update"] and b.replicas.ops == ["log_update"]


def test_a_refused_change_reaches_no_other_process(pair):
    a, b = pair
    with pytest.raises(InvalidArgument):
        asyncio.run(a.update_log_settings({"log_info": "yes"}))
    assert a.replicas.ops == []


def test_cuda_registration_and_unregistration_reach_both(pair):
    """CUDA regions need no GPU at the registry's level; the worker that opens the handle
    is stood in for."""
    a, b = pair
    for s in (a, b):
        async def opened(region) -> None:
            pass
        s.workers.open_cuda_region = opened  # type: ignore[method-assign]

    async def register_then_unregister() -> None:
        await a.register_cuda_shm("c", bytes(range(64)), 0, 4096)
        assert [r["name"] for r in b.shm_status("cuda")] == ["c"]
        held = b.shm.acquire("c")  # a request in the other process uses it
        await a.unregister_shm("cuda", "c")
        assert [r["name"] for r in a.shm_status("cuda")] == ["c"]  # kept until no process uses it
        b.shm.release(held)  # the other process settles it
        for _ in range(100):
            if not a.shm_status("cuda") and not b.shm_status("cuda"):
                break
            await asyncio.sleep(0.01)
    asyncio.run(register_then_unregister())
    assert a.shm_status("cuda") == [] and b.shm_status("cuda") == []
