"""Shared-memory arena and control channel, across a real process boundary (fd passing)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from triton_shm.errors import Internal
from triton_shm.ipc import channel, protocol
from triton_shm.ipc.arena import Arena, SegmentMap
from triton_shm.ipc.protocol import RegionDesc


def test_arena_reuses_and_coalesces_freed_space():
    arena = Arena(1 << 16)
    a, b, c = arena.alloc(100), arena.alloc(100), arena.alloc(100)
    assert len(arena.segments) == 1
    arena.free(b.segment.id, b.offset, b.size)
    arena.free(a.segment.id, a.offset, a.size)
    d = arena.alloc(200)  # fits in the coalesced hole a+b
    assert d.offset == a.offset
    arena.free(c.segment.id, c.offset, c.size)
    arena.free(d.segment.id, d.offset, d.size)
    big = arena.alloc(1 << 17)  # larger than a chunk: a one-off segment, dropped when freed
    assert len(arena.segments) == 2
    arena.free(big.segment.id, big.offset, big.size)
    assert len(arena.segments) == 1
    arena.close()


def _free_list_twins() -> list:
    """The allocator's implementations: the pure-Python twin, and C when built."""
    from triton_shm.ipc import arena_py
    twins = [arena_py]
    try:
        from triton_shm.ipc import _arena
        twins.append(_arena)
    except ImportError:  # not built
        pass
    return twins


class _Seg:
    def __init__(self, seg_id: int, size: int):
        self.id, self.size, self.view = seg_id, size, memoryview(bytearray(size))


def _allocator(impl):
    """``impl``'s BlockAllocator over segments the test adds: no room is an error, drops
    are recorded."""
    class Allocator(impl.BlockAllocator):
        dropped: list = []

        def _grow(self, nbytes):
            raise MemoryError(f"no room for {nbytes}")

        def _drop(self, segment):
            self.dropped.append(segment)

    return Allocator()


@pytest.mark.parametrize("impl", _free_list_twins(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_allocator_places_blocks_like_the_reference_first_fit(impl):
    """Random allocs and frees: every block lands where a plain first-fit over sorted
    holes puts it, blocks never overlap, and freeing all coalesces back to one hole."""
    import random

    rng = random.Random(7)
    alloc = _allocator(impl)
    live = [alloc._add_segment(_Seg(1, 1 << 14), False, 100), alloc._add_segment(_Seg(2, 1 << 14), False, 1)]
    assert [(b.segment.id, b.offset, b.size) for b in live] == [(1, 0, 100), (2, 0, 1)]
    model = {1: [[128, (1 << 14) - 128]], 2: [[64, (1 << 14) - 64]]}  # holes [start, size] per segment

    def model_take(n):
        for sid in (1, 2):
            for hole in model[sid]:
                if hole[1] >= n:
                    start = hole[0]
                    hole[0] += n
                    hole[1] -= n
                    model[sid] = [h for h in model[sid] if h[1]]
                    return sid, start
        return None

    def model_give(sid, start, n):
        holes = sorted(model[sid] + [[start, n]])
        merged = []
        for h in holes:
            if merged and merged[-1][0] + merged[-1][1] == h[0]:
                merged[-1][1] += h[1]
            else:
                merged.append(h)
        model[sid] = merged

    for _ in range(3000):
        if live and rng.random() < 0.45:
            b = live.pop(rng.randrange(len(live)))
            how = rng.random()
            if how < 0.33:
                alloc.free(b.segment.id, b.offset, b.size)
            elif how < 0.66:
                alloc.free_blocks([b])
            else:  # as a frame's FREE records
                alloc.free_records([(b.segment.id, b.offset, b.size)])
            model_give(b.segment.id, b.offset, impl.reserved(b.size))
        else:
            n = rng.choice([0, 1, 63, 64, 65, 200, 1000, 3000])
            expected = model_take(impl.reserved(n))
            if expected is None:
                with pytest.raises(MemoryError):
                    alloc.alloc(n)
                continue
            b = alloc.put(bytes([len(live) % 256]) * n) if n % 2 else alloc.alloc(n)
            assert (b.segment.id, b.offset) == expected
            assert b.size == n and b.descriptor() == [b.segment.id, b.offset, n]
            if n % 2:
                assert bytes(b.view) == bytes([len(live) % 256]) * n
            live.append(b)
    strided = memoryview(bytes(range(10)))[::2]  # not contiguous: copied all the same
    block = alloc.put(strided)
    assert bytes(block.view) == bytes([0, 2, 4, 6, 8])
    shaped = alloc.put(memoryview(struct.pack("<4f", 1, 2, 3, 4)).cast("f", [2, 2]))  # any shape and format
    assert bytes(shaped.view) == struct.pack("<4f", 1, 2, 3, 4)
    live.append(shaped)
    for empty in (np.empty((0, 3), np.float32), np.empty((2, 0), np.int64)[:, ::2]):  # a model's [0, 3] output
        zero = alloc.put(empty)
        assert zero.size == 0 and bytes(zero.view) == b""
        live.append(zero)
    alloc.free_blocks([*live, block])
    assert alloc.alloc(1 << 14).offset == 0 and alloc.alloc(1 << 14).segment.id == 2
    assert alloc.dropped == []
    with pytest.raises(Internal, match="free of a block in unknown segment 3"):
        alloc.free(3, 0, 1)


@pytest.mark.parametrize("impl", _free_list_twins(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_allocator_drops_an_oversized_segment_once_empty(impl):
    alloc, seg = _allocator(impl), _Seg(5, 4096)
    a = alloc._add_segment(seg, True, 1000)
    b = alloc.alloc(1000)
    assert (a.offset, b.offset) == (0, 1024)
    alloc.free(5, a.offset, a.size)
    assert alloc.dropped == []
    alloc.free(5, b.offset, b.size)
    assert alloc.dropped == [seg]
    with pytest.raises(MemoryError):
        alloc.alloc(1)
    with pytest.raises(Internal):
        alloc.free(5, 0, 1)


def test_arena_blocks_never_overlap_across_threads():
    """Threads allocating and freeing at once (a worker's instances and its control
    thread) never get overlapping blocks."""
    import threading

    arena = Arena(1 << 16)
    errors: list[str] = []

    def churn(tag: int) -> None:
        for i in range(2000):
            block = arena.put(bytes([tag]) * (1 + i % 300))
            if bytes(block.view) != bytes([tag]) * block.size:
                errors.append(f"thread {tag} saw its block overwritten")
            arena.free(block.segment.id, block.offset, block.size)

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(arena.segments) == 1
    arena.close()


def test_segment_map_rejects_out_of_bounds_descriptors():
    arena = Arena(4096)
    block = arena.alloc(16)
    peer = SegmentMap()
    peer.add(block.segment.id, block.segment.size, os.dup(block.segment.fd))
    block.view[:] = b"0123456789abcdef"
    assert bytes(peer.view(block.descriptor())) == b"0123456789abcdef"
    assert bytes(peer.view((block.segment.id, 4, 3.0))) == b"456"  # not ints: converted
    seg = block.segment.id
    for bad in ([seg, 4090, 16], [seg, -1, 4], [99, 0, 1], [seg, 0, 1 << 62], [seg, 1 << 64, 1],
                [seg, 0, -(1 << 70)], [1 << 80, 0, 1]):
        with pytest.raises(Internal, match="^shared-memory descriptor from peer is out of bounds$"):
            peer.view(bad)
    # a client region's descriptor is never read as an arena block, even with numbers that name one
    for bad in (["x", 0, 1], [1, 2], None, [seg, None, 1], RegionDesc((seg, 0, 1))):
        with pytest.raises(Internal, match="^malformed shared-memory descriptor from peer$"):
            peer.view(bad)
    peer.drop(seg)  # a dropped segment is unknown again
    with pytest.raises(Internal, match="out of bounds"):
        peer.view(block.descriptor())
    peer.close()
    arena.close()


CHILD = r"""
import socket, sys
from triton_shm.ipc import channel, protocol
from triton_shm.ipc.arena import SegmentMap
sock = socket.socket(fileno=int(sys.argv[1]))
data, fds = channel.recv(sock)
msg = protocol.decode(data).body
peer = SegmentMap(); peer.add(msg["seg"], msg["size"], fds[0])
view = peer.view(msg["block"])
data = bytes(view)
view[:] = data.upper()
channel.send(sock, protocol.encode_control(0, {"op": "got", "data": data.decode()}))
"""


def test_channel_passes_segments_to_another_process():
    ours, theirs = channel.socket_pair()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    arena = Arena(4096)
    block = arena.alloc(5)
    block.view[:] = b"hello"
    channel.send(ours, protocol.encode_control(0, {"op": "segment", "seg": block.segment.id,
                                                   "size": block.segment.size, "block": block.descriptor()}),
                 [block.segment.fd])
    reply, _ = channel.recv(ours)
    assert protocol.decode(reply).body == {"op": "got", "data": "hello"}
    assert bytes(block.view) == b"HELLO"  # the child wrote into the same memory
    assert proc.wait(10) == 0
    assert channel.recv(ours) == (None, [])  # end-of-file once the peer is gone
    arena.close()
