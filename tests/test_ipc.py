"""Shared-memory arena and control channel, across a real process boundary (fd passing)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from triton_shm.errors import Internal
from triton_shm.ipc import channel, protocol
from triton_shm.ipc.arena import Arena, SegmentMap


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


def test_segment_map_rejects_out_of_bounds_descriptors():
    arena = Arena(4096)
    block = arena.alloc(16)
    peer = SegmentMap()
    peer.add(block.segment.id, block.segment.size, os.dup(block.segment.fd))
    block.view[:] = b"0123456789abcdef"
    assert bytes(peer.view(block.descriptor())) == b"0123456789abcdef"
    for bad in ([block.segment.id, 4090, 16], [block.segment.id, -1, 4], [99, 0, 1],
                [block.segment.id, 0, 1 << 62], ["x", 0, 1], [1, 2]):
        with pytest.raises(Internal):
            peer.view(bad)
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
