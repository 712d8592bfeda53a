"""Memory the front-end and one worker lend each other past a single message.

``InputLending``: blocks of the front-end's input arena the worker holds past their batch
(BLS replies staged for it, inputs a model keeps after its batch was answered), until the
worker hands them back. ``BatchedFrees``: the worker's output blocks the front-end is done
with, which wait to ride on the next frame to the worker instead of waking it with one of
their own.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from ..errors import TritonShmError
from ..ipc import protocol
from ..ipc.arena import Arena, Block

log = logging.getLogger("triton_shm.workers")

KEEPING_LIMIT = 1 << 16  # kept input blocks announced and not yet answered: more is a broken worker
# Freed output blocks wait for a message to ride on, for at most RELEASE_DELAY seconds,
# or until RELEASE_BYTES of them are waiting: a message of their own wakes the worker,
# which costs more than the memory they hold for a few milliseconds.
RELEASE_DELAY = 0.02
RELEASE_BYTES = 8 << 20


class InputLending:
    """Input-arena blocks lent to one worker, by descriptor ``(segment, offset, size)``."""

    __slots__ = ("name", "staged", "keeping")

    def __init__(self, name: str):
        self.name = name  # the worker's, for logs
        self.staged: dict[tuple, Block] = {}  # lent, until the worker releases them
        # descriptors the worker keeps, until their batch's reply (read by the pool's reply
        # path, which calls ``kept_out`` only when this is not empty)
        self.keeping: set[tuple] = set()

    def stage(self, arena: Arena, data: Any) -> list[int]:
        """Copy bytes into the worker's input arena for it to read (a BLS reply); the
        worker hands the block back with ``release_inputs``."""
        block = arena.put(memoryview(data).cast("B"))
        desc = block.descriptor()
        self.staged[tuple(desc)] = block
        return desc

    def keep(self, descriptors: list) -> None:
        """The worker keeps these input blocks past the reply about to come (a model
        still holds their arrays); ``kept_out`` takes them out of that batch's frees."""
        if len(self.keeping) + len(descriptors) > KEEPING_LIMIT:  # never one reply answers them
            log.warning("worker '%s' keeps more input blocks than are in flight; ignoring", self.name)
            self.keeping.clear()
            return
        self.keeping.update(tuple(d) for d in descriptors if isinstance(d, list))

    def kept_out(self, blocks: list[Block]) -> list[Block]:
        """An answered batch's input blocks, less those the worker keeps: those wait in
        ``staged`` until it releases them (``release_inputs``)."""
        keeping, free = self.keeping, []
        for block in blocks:
            key = (block.segment.id, block.offset, block.size)
            if key in keeping:
                keeping.discard(key)
                self.staged[key] = block
            else:
                free.append(block)
        return free

    def released(self, arena: Arena | None, descriptors: list) -> None:
        """The worker hands these blocks back."""
        for desc in descriptors:  # only blocks we lent: the worker is not trusted
            block = self.staged.pop(tuple(desc) if isinstance(desc, list) else (), None)
            if block is not None and arena is not None:
                arena.free(block.segment.id, block.offset, block.size)

    def clear(self) -> None:
        """The worker is gone, and its arena with it."""
        self.staged.clear()
        self.keeping.clear()


class BatchedFrees:
    """The worker's output blocks given back, waiting to ride on its next frame. One timer,
    armed by the first of them, sends those still waiting after RELEASE_DELAY in a frame of
    their own (an idle worker gets them), and RELEASE_BYTES of them go at once."""

    __slots__ = ("waiting", "bytes", "open", "_send", "_scheduled", "_loop")

    def __init__(self, send: Callable[[bytes | bytearray], None]):
        self.waiting: list[list[int]] = []  # read and reset in place by the handle's request path
        self.bytes = 0
        self.open = False  # the worker runs: frees are taken
        self._send = send  # sends a frame to the worker; raises TritonShmError if it is gone
        self._scheduled = False  # a RELEASE_DELAY timer is armed
        self._loop: asyncio.AbstractEventLoop  # from start() on

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self.open = loop, True

    def take(self) -> list[list[int]]:
        """The frees that wait, for the next frame (the empty list serves again: the
        encoders only read it)."""
        waiting = self.waiting
        if waiting:
            self.waiting, self.bytes = [], 0
        return waiting

    def add(self, descriptors: list[list[int]]) -> None:
        """Give output blocks back to the worker."""
        if descriptors and self.open:  # none (outputs in client shared memory): nothing to wait for
            self.waiting += descriptors
            size = self.bytes
            for d in descriptors:  # ints, checked by SegmentMap.view
                size += d[2]
            self.bytes = size
            if size >= RELEASE_BYTES:
                self.flush()  # an armed timer stays armed: it finds nothing, or later ones
            elif not self._scheduled:
                self._scheduled = True
                self._loop.call_later(RELEASE_DELAY, self._on_time)

    def _on_time(self) -> None:
        """The RELEASE_DELAY timer: the frees that no frame has carried since go on their own."""
        self._scheduled = False
        if self.waiting:  # usually a frame took them
            self.flush()

    def flush(self) -> None:
        waiting = self.waiting
        if waiting and self.open:
            self.waiting, self.bytes = [], 0
            try:
                self._send(protocol.encode_free(waiting))
            except TritonShmError:
                pass  # worker gone: its arena went with it

    def close(self) -> None:
        """The worker is gone: the blocks went with its arena."""
        self.open = False
        self.waiting, self.bytes = [], 0
