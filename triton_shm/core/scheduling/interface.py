"""What every scheduler of a model version offers (Triton's ``Scheduler`` interface:
``Enqueue``, ``InflightInferenceCount``, ``Stop``), so the service, the model manager
and the metrics hold one type whichever scheduler a model's config picks: the dynamic
batcher (``dynamic.DynamicScheduler``, also the scheduler of a model without batching),
the sequence batcher (``sequence.SequenceScheduler``) or an ensemble's
(``ensemble.EnsembleScheduler``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Protocol

if TYPE_CHECKING:
    from ..data.shm_registry import Region
    from ..data.types import InferRequest, InferResponse, ResponseStream
    from ..models.validation import RequestPlan

Instance = tuple[str, int]  # (worker name, instance index)


class Scheduler(Protocol):
    def submit(self, request: InferRequest, plan: RequestPlan, regions: dict[str, Region], trace: Any = None,
               stream: ResponseStream | None = None) -> Awaitable[InferResponse | None]:
        """Take a validated request: what this returns resolves to its response, or for a
        decoupled model to None (its responses go to ``stream``). A refusal (unloading, a
        full queue, a bad priority or timeout) may raise at the call or at the await.

        A plain def returning an awaitable, not a coroutine function: the dynamic
        scheduler hands a request that goes straight to a free instance its future itself,
        one coroutine fewer per request (measured: bench/scheduler_submit.py). The other
        schedulers' ``async def`` fits this signature."""
        ...

    def inflight_count(self) -> int:
        """Requests taken and not yet answered whose caller still waits (queued or running)."""
        ...

    async def drain(self) -> None:
        """Refuse new requests, serve every queued and running one, then return."""
        ...

    def instance_down(self, instance: Instance, reason: str) -> None:
        """``instance``'s worker died (``reason``: what a client is told)."""
        ...

    def instance_up(self, instance: Instance) -> None:
        """``instance``'s worker runs again, with the model loaded."""
        ...
