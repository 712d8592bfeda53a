"""The future a queued request's caller awaits, which also tells a worker when that caller
has gone.

A client that goes away (a gRPC cancel, a closed connection) cancels the task awaiting
the request, and with it this future. A request still queued is dropped by its scheduler;
one whose batch a worker already holds stays in execution, as in Triton, and the worker
is told (a ``cancel`` control op) so the model's ``request.is_cancelled()`` turns True and
it may stop early and answer CANCELLED; the rest of the batch is unaffected. ``held_by``
is set by the worker pool when the batch is sent (request ``index`` of batch ``msg_id``
on ``worker``); a request whose future is cancelled for another reason (its timeout)
uses ``Future.cancel`` itself and tells nobody.
"""
from __future__ import annotations

from asyncio import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...supervisor.handle import WorkerHandle


class RequestFuture(Future):
    __slots__ = ("held_by",)
    held_by: tuple[WorkerHandle, int, int] | None  # unset (not None) until the batch is sent

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        held_by = getattr(self, "held_by", None)
        if held_by is not None:
            worker, msg_id, index = held_by
            worker.cancel(msg_id, index)
        return True
