"""The worker's shared memory: what it reads inputs from and writes outputs into.

Three kinds, all mapped from fds the front-end sends (``ipc.arena``, ``regions``):
the front-end's input arena (``inputs``, its segments read in place), the clients'
shared-memory regions (``regions``), and the worker's own output arena (``arena``, whose
segments the front-end maps). Inputs a model keeps past its batch hold their memory until
they are collected (``keep_held``); the memory goes back with the next reply
(``flush_released``).

It talks to the front-end only through the ``send`` callable it is given (a control op),
so the execution and BLS code can use it without knowing the worker.
"""
from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Any, Callable

from ..ipc.arena import Arena, Block, Segment, SegmentMap
from ..ipc.protocol import ControlOp, Desc, RegionDesc
from . import assembler
from .assembler_py import RegionSpan
from .cuda import DeviceSpan
from .regions import RegionMap

OUTPUT_CHUNK = 64 << 20

# a control op to the front-end, with the fds to pass beside it
Send = Callable[[dict[str, Any], list[int] | None], None]


class WorkerMemory:
    def __init__(self, send: Send):
        self._send = send
        self.inputs = SegmentMap()
        self.regions = RegionMap()
        self.arena = Arena(OUTPUT_CHUNK, on_new_segment=self._share_segment, on_drop_segment=self._drop_segment)
        # memory of kept inputs collected since the last flush; the worker's reply checks
        # it (truthiness) before each frame, so it is a plain deque, not behind a method
        self.released: deque[list | Block] = deque()

    # -- inputs a model keeps ------------------------------------------------------------
    def keep_held(self, held: list[tuple[Any, list | Block]], scratch: list[Block] | None) -> None:
        """After a batch: the input arrays a model still holds (stored, or handed to a
        thread of a decoupled model) keep their memory until they die. A block of the
        front-end's arena stays out of its reuse (``keep_inputs``, sent before the reply,
        which would free it); a block of our own is taken out of ``scratch``. Each comes
        back once its array is collected (``flush_released``)."""
        keep: list[list] = []
        for entry in held:
            if sys.getrefcount(entry[0]) <= 2:  # the tuple and the argument: nobody else holds it
                continue
            array, memory = entry
            if isinstance(memory, list):
                keep.append(memory)
            elif scratch is not None:
                scratch.remove(memory)
            weakref.finalize(array, self.released.append, memory)  # deque.append: safe from any thread
        if keep:
            self._send({"op": ControlOp.KEEP_INPUTS, "blocks": keep}, None)

    def flush_released(self) -> None:
        """Give back the memory of kept inputs that have been collected since."""
        released = []
        while self.released:
            released.append(self.released.popleft())
        ours = [m for m in released if not isinstance(m, list)]
        if ours:
            self.arena.free_blocks(ours)
        if len(ours) < len(released):
            self._send({"op": ControlOp.RELEASE_INPUTS, "blocks": [m for m in released if isinstance(m, list)]}, None)

    # -- reading inputs ------------------------------------------------------------------
    def view(self, desc: Desc) -> "memoryview | RegionSpan":
        """An input's bytes: an ``ArenaDesc`` in the front-end's arena, or a ``RegionDesc``
        in a client region."""
        if type(desc) is RegionDesc:
            rid, offset, size = desc
            view = self.regions.view(int(rid), int(offset), int(size))
            return view.to_host() if isinstance(view, DeviceSpan) else view  # CUDA: one device-to-host copy
        return self.inputs.view(desc)

    def input_bytes(self, desc: Desc, scratch: list[Block] | None, lent: list | None = None) -> memoryview:
        """What a model may read: arena bytes in place; a client region's bytes copied
        once, with a guarded copy, since the client may shrink its region at any time and
        a later read would fault. The copy goes into an output-arena block appended to
        ``scratch`` (pages already mapped; the caller frees it once the batch is answered),
        or, without ``scratch``, into memory of its own that lives as long as the model
        holds it (decoupled models answer after execute returns).

        With ``lent`` (a model that only reads its inputs), a system region's bytes are
        lent in place instead, read-only, and their mapping appended to ``lent``: the
        caller fails the request if a truncation poisoned it (``regions``)."""
        if type(desc) is not RegionDesc:
            return self.inputs.view(desc)
        if lent is not None:
            loan = self.regions.lend(int(desc[0]), int(desc[1]), int(desc[2]))
            if loan is not None:
                lent.append(loan[1])
                return loan[0]
        view = self.regions.view(int(desc[0]), int(desc[1]), int(desc[2]))
        if isinstance(view, DeviceSpan):
            return view.to_host()  # already private memory
        if scratch is None:
            private = memoryview(bytearray(view.nbytes))
        else:
            block = self.arena.alloc(view.nbytes)
            scratch.append(block)
            private = block.view
        assembler.copy(private, view)
        return private

    # -- the output arena's segments, announced to the front-end -------------------------
    def _share_segment(self, seg: Segment) -> None:
        self._send({"op": ControlOp.SEGMENT, "seg": seg.id, "size": seg.size}, [seg.fd])

    def _drop_segment(self, seg_id: int) -> None:
        self._send({"op": ControlOp.DROP, "seg": seg_id}, None)

    def close(self) -> None:
        self.inputs.close()
        self.regions.close()
        self.arena.close()
