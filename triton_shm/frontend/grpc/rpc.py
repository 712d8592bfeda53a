"""The transport-neutral shape of an RPC: what both gRPC transports serve.

A method body takes the decoded request (a message, or for a stream an async iterator
of them) and returns the response (or yields responses); it reports failure by raising.
``rpc_status`` maps what it raised to a status once, for both transports.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from google.protobuf.message import DecodeError

from ...errors import GRPC_STATUS, TritonShmError
from .native.framing import INTERNAL, INVALID_ARGUMENT, STATUS_CODES, GrpcError

log = logging.getLogger(__name__)


class Mailbox:
    """An unbounded FIFO with one consumer task: ``put_nowait`` from anywhere on the loop,
    ``await get()`` in the consumer. What a stream uses of asyncio.Queue, without its
    bookkeeping (bounds, putters, task counters), which a stream pays per message."""

    __slots__ = ("_items", "_waiter", "_loop")

    def __init__(self) -> None:  # made on the loop that uses it
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()  # once: each call checks the process id

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def qsize(self) -> int:
        return len(self._items)

    async def get(self) -> Any:
        items = self._items
        while not items:
            self._waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return items.popleft()


def _prefix(size: int) -> bytes:
    return b"\x00" + size.to_bytes(4, "big")


def raw_bytes(data: bytes, framed: bool) -> bytes:
    """Serializer of a body that returns its message already encoded."""
    return b"\x00" + len(data).to_bytes(4, "big") + data if framed else data  # _prefix, inline: once per reply


def pb_serializer(message: Any, framed: bool) -> bytes:
    data = message.SerializeToString()
    return _prefix(len(data)) + data if framed else data


def identity(data: bytes | memoryview) -> bytes | memoryview:
    return data


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC. ``serialize(response, framed)`` gives the message bytes, with the 5-byte
    uncompressed gRPC prefix in front when ``framed`` (so a transport that frames
    messages itself builds each one with a single join)."""
    path: str  # "/package.Service/Name"
    handler: Callable[..., Any]  # async def (request) -> response, or async generator for streams
    deserialize: Callable[[bytes | memoryview], Any] = identity  # a message: bytes or a view of them
    serialize: Callable[[Any, bool], bytes] = pb_serializer
    streaming: bool = False  # bidirectional stream (the only streaming kind served)
    group: str | None = None  # its restricted-API group (frontend/restricted.py)
    # ModelInfer: the service, whose ``tracer.spans`` says when to make the call's
    # InferRequest span (OpenTelemetry tracing); the handler then takes it as 2nd argument.
    # ModelStreamInfer: the service too; its handler always takes a 2nd argument, a
    # RequestSpan holding the call's traceparent, of which each request's span is ``fresh``.
    spans: Any = None
    # ModelInfer, ModelStreamInfer: --grpc-header-forward-pattern applies (the requests'
    # parameters take the call's headers; the stream's handler takes them as 3rd argument)
    forwards_headers: bool = False


def rpc_status(exc: BaseException, path: str) -> tuple[int, str]:
    """(grpc status code, message) for an exception a method body raised."""
    if isinstance(exc, TritonShmError):
        return STATUS_CODES[GRPC_STATUS[exc.code]], exc.message
    if isinstance(exc, GrpcError):
        return exc.code, exc.message
    if isinstance(exc, DecodeError):  # the client's bytes, not our bug: one line, no traceback
        log.warning("gRPC %s: unparseable request message (%s)", path, exc)
        return INVALID_ARGUMENT, f"failed to parse the request message: {exc}"
    log.error("gRPC %s failed", path, exc_info=exc)
    return INTERNAL, f"{type(exc).__name__}: {exc}"
