"""A request waiting in a scheduler (``Pending``) and how it is answered (``resolve``):
the dynamic and the sequence scheduler queue and answer requests the same way.

``Pending`` is defined beside the request types (``data/types_py.py``, and as a C class in
``data/_types.pyx``, whose construction costs no Python ``__init__`` frame); this is where
the schedulers take it from."""
from __future__ import annotations

from typing import Any

from ..data.types import InferResponse, Pending

__all__ = ["Pending", "resolve"]


def resolve(p: Pending, result: Any) -> None:
    """Answer ``p``'s caller with ``result`` (a response, None, or the exception to raise);
    a caller that stopped waiting (timeout, disconnect) gets nothing, and a response it
    missed gives its buffers back."""
    if p.future.done():
        if isinstance(result, InferResponse):
            result.release()
        return
    if isinstance(result, Exception):
        p.future.set_exception(result)
    else:
        p.future.set_result(result)
