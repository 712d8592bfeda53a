"""What the worker's parts may use of the worker that hosts them.

The instance runners (``execution``) and the BLS client (``bls``) answer through the
worker's link and read its cancellations, nothing more; they get this instead of the
``Worker``, so they never import ``process`` and cannot reach its control loop. Its
fields are the worker's bound methods: a runner copies the ones it calls into attributes
of its own, so a reply costs no more lookups than a call on the worker did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .memory import Send


@dataclass(frozen=True)
class Host:
    name: str  # the worker's, for error messages
    send: Send  # a control op of our own (bls, keep_inputs, release_inputs, ...)
    reply: Callable[[int, dict[str, Any]], None]  # answer message ``id``: a batch's results or an error
    stream: Callable[[dict[str, Any]], None]  # one response of a decoupled request
    reply_failed: Callable[[OSError], None]  # a reply could not be sent: the worker decides whether to leave
    need_reader: Callable[[], None]  # about to wait for a frame (BLS): make sure the ring is read
    cancelled: set[tuple[int, int]]  # (batch message id, request index) of clients gone; the control thread adds
