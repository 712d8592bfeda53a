"""``supervisor/readiness.py`` alone: which instances are asked, and how a check still
running is shared (the end-to-end behaviour is in test_model_readiness.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from triton_shm.supervisor.readiness import Readiness


class Worker:
    """Stands in for a WorkerHandle: counts the checks asked and answers when told."""

    def __init__(self) -> None:
        self.alive, self.asked, self.answers = True, [], asyncio.Queue()

    async def call(self, message: dict) -> dict:
        self.asked.append(message)
        return await self.answers.get()


def _mv(key: str = "m/1#0"):
    return SimpleNamespace(key=key, name="m", version=1, instances=[("w", 0), ("w", 1)])


def test_a_model_without_is_ready_costs_no_call():
    async def go():
        r, w, mv = Readiness(), Worker(), _mv()
        r.loaded(mv.key, "w", {})
        assert not r.defined(mv) and await r.ready(mv, {"w": w}) and w.asked == []
    asyncio.run(go())


def test_only_the_instances_that_define_it_are_asked_and_the_first_false_decides():
    async def go():
        r, w, mv = Readiness(), Worker(), _mv()
        r.loaded(mv.key, "w", {"readiness": [1]})
        w.answers.put_nowait({"ready": False, "message": ""})
        assert r.defined(mv) and not await r.ready(mv, {"w": w})
        assert [m["instance"] for m in w.asked] == [1]
        r.forget(mv.key)
        assert await r.ready(mv, {"w": w}) and len(w.asked) == 1
    asyncio.run(go())


def test_callers_meanwhile_share_the_running_check():
    async def go():
        r, w, mv = Readiness(), Worker(), _mv()
        r.loaded(mv.key, "w", {"readiness": [0]})
        callers = [asyncio.ensure_future(r.ready(mv, {"w": w})) for _ in range(3)]
        while not w.asked:
            await asyncio.sleep(0)
        w.answers.put_nowait({"ready": True, "message": ""})
        assert await asyncio.gather(*callers) == [True] * 3 and len(w.asked) == 1
        w.alive = False  # a worker that is down is not ready, without a call
        assert not await r.ready(mv, {"w": w}) and len(w.asked) == 1
    asyncio.run(go())
