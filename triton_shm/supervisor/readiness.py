"""A Python model's own readiness: the ``is_ready()`` its instances define.

As in Triton, a model version is ready when every instance is: instance by instance, the
first that is not decides. An instance whose model defines ``is_ready()`` is asked in its
worker (on a thread of its own there, beside executions); the others cost nothing (the
worker said at load which define it). A check still running is not asked again: whoever
asks meanwhile waits for that one's answer. Each caller waits at most ``TIMEOUT_S`` (the
python backend's 5 s) and then counts the instance not ready; the check goes on, and the
next caller waits for its answer.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.models.version import ModelVersion
    from .handle import WorkerHandle

log = logging.getLogger("triton_shm.workers")

TIMEOUT_S = 5.0  # Triton's python backend: kUserModelReadinessTimeoutMs


class Readiness:
    def __init__(self) -> None:
        # model version key -> its instances (worker, index) that define is_ready()
        self._defined: dict[str, set[tuple[str, int]]] = {}
        self._running: dict[tuple[str, str, int], asyncio.Future] = {}

    def loaded(self, key: str, worker: str, reply: Any) -> None:
        """A worker's answer to a load: the indexes of its instances that define is_ready()."""
        found = {(worker, int(i)) for i in (reply or {}).get("readiness") or ()}
        have = self._defined.get(key, set())
        have = {i for i in have if i[0] != worker} | found
        if have:
            self._defined[key] = have
        else:
            self._defined.pop(key, None)

    def forget(self, key: str) -> None:
        self._defined.pop(key, None)

    def defined(self, mv: "ModelVersion") -> bool:
        """Whether some instance of ``mv`` here defines is_ready()."""
        return mv.key in self._defined

    async def ready(self, mv: "ModelVersion", workers: dict[str, "WorkerHandle"]) -> bool:
        checked = self._defined.get(mv.key)
        if not checked:
            return True
        for instance in mv.instances:
            if instance in checked and not await self._instance_ready(mv, instance, workers):
                return False
        return True

    async def _instance_ready(self, mv: "ModelVersion", instance: tuple[str, int],
                              workers: dict[str, "WorkerHandle"]) -> bool:
        worker, index = instance
        key = (mv.key, worker, index)
        running = self._running.get(key)
        if running is None:
            handle = workers.get(worker)
            if handle is None or not handle.alive:
                return False
            running = asyncio.ensure_future(handle.call({"op": "is_ready", "key": mv.key, "instance": index}))
            self._running[key] = running
            running.add_done_callback(lambda f: self._done(key, f))
        try:
            reply = await asyncio.wait_for(asyncio.shield(running), TIMEOUT_S)
        except asyncio.TimeoutError:
            log.debug("model '%s' version %d is not ready: timed out waiting for is_ready() of instance %d in '%s'",
                     mv.name, mv.version, index, worker)
            return False
        except Exception as e:  # noqa: BLE001 - the worker went away or the instance was unloaded
            log.debug("model '%s' version %d is not ready: %s", mv.name, mv.version, e)
            return False
        if not reply.get("ready"):
            log.debug("model '%s' version %d is not ready: %s", mv.name, mv.version,
                     reply.get("message") or "is_ready() returned False")
        return bool(reply.get("ready"))

    def _done(self, key: tuple[str, str, int], f: asyncio.Future) -> None:
        if self._running.get(key) is f:
            del self._running[key]
        if not f.cancelled():
            f.exception()  # retrieved: nobody may be waiting any more
