"""The scheduler of a model version another front-end process owns: every request goes to
the owner over the peer link, and the owner's scheduler queues, batches and runs it."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable

from ..errors import Unavailable

if TYPE_CHECKING:
    from ..core.data.shm_registry import Region
    from ..core.data.types import InferRequest, InferResponse, ResponseStream
    from ..core.models.validation import RequestPlan
    from ..core.observability.tracing import Trace
    from ..core.models.version import ModelVersion
    from ..core.scheduling.interface import Instance, Scheduler
    from .peers import Peers


class ForwardingScheduler:
    """``Scheduler`` (core/scheduling/interface.py) for a model version owned by process
    ``owner``. The local validation's plan and regions are not sent: the owner validates
    the request again and resolves its shared memory from its own registry (kept the same
    as ours by broadcast)."""

    def __init__(self, peers: Peers, owner: int, model_name: str):
        self.peers, self.owner, self.model_name = peers, owner, model_name
        self._inflight = 0
        self._draining = False
        self._idle: asyncio.Event | None = None  # set when nothing is in flight, while draining

    def submit(self, request: InferRequest, plan: RequestPlan, regions: dict[str, Region], trace: Trace | None = None,
               stream: ResponseStream | None = None) -> Awaitable[InferResponse | None]:
        if self._draining:
            raise Unavailable(f"model '{self.model_name}' is unloading")
        self._inflight += 1
        handover = trace.hand_over() if trace is not None else None  # the owner traces it
        return self.peers.forward(self.owner, request, stream, self._answered, handover)

    def _answered(self) -> None:
        self._inflight -= 1
        if not self._inflight and self._idle is not None:
            self._idle.set()

    def inflight_count(self) -> int:
        return self._inflight

    async def drain(self) -> None:
        self._draining = True
        if self._idle is None:
            self._idle = asyncio.Event()
        if not self._inflight:
            self._idle.set()
        await self._idle.wait()

    def instance_down(self, instance: Instance, reason: str) -> None:
        pass  # the owner's instances: its scheduler sees them go

    def instance_up(self, instance: Instance) -> None:
        pass


def forwarding_to(peers: Peers) -> Callable[[ModelVersion, int], ForwardingScheduler]:
    """The model manager's factory of schedulers for the models another process owns."""
    return lambda mv, owner: ForwardingScheduler(peers, owner, mv.name)


if TYPE_CHECKING:
    def _is_a_scheduler(scheduler: ForwardingScheduler) -> Scheduler:
        return scheduler  # mypy checks that it implements the protocol
