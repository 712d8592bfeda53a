"""The link between the front-end and one worker: one shared-memory ring per direction,
a wake-up per direction, and the SEQPACKET socket.

Every frame travels in the sender's ring, in order. The receiver is woken only when it
has said it is going to sleep (``ring``'s handshake), so while it is awake and draining,
frames cross without a system call. The front-end sleeps in its event loop, so the worker
wakes it through an eventfd; the worker sleeps on its ring's sleeping word as a futex,
so the front-end wakes it with FUTEX_WAKE, and the wait needs no eventfd read after it.
The socket stays for what a ring cannot carry: file descriptors (the frame goes on the
socket with its fds, and an empty record flagged ``ON_SOCKET`` keeps its place in the
ring's order, so its push wakes the worker) and liveness: the peer's death is end-of-file
on the socket. A futex cannot see that, so the worker's sleep ends every
``PEER_CHECK_NS`` to look at the socket, and the front-end's ``close`` wakes it at once.
"""
from __future__ import annotations

import mmap
import os
import select
import socket

from . import channel
from .arena import INTERNAL_PREFIX
from .ring import HEADER, ON_SOCKET, PEER_CHECK_NS, LinkCore, Ring  # noqa: F401  (the record flag, the check)

RING_CAPACITY = 4 << 20  # a record may take half: every frame (at most MAX_MESSAGE) fits


def _ring_memfd(name: str) -> int:
    fd = os.memfd_create(f"{INTERNAL_PREFIX}ring_{name}", os.MFD_CLOEXEC)
    os.ftruncate(fd, HEADER + RING_CAPACITY)
    os.pwrite(fd, (1).to_bytes(4, "little"), 128)  # the consumer starts asleep: the first frame wakes it
    return fd


class Link(LinkCore):
    """One side of the link. ``tx``/``rx``: the rings this side pushes to and pops from;
    ``tx_wake``/``rx_wake``: their eventfds, -1 for the futex direction (to the worker).
    ``send(frame, fds)``, ``recv()``, ``wait(spin_ns)``, ``wake_peer()``, ``kick()`` and
    ``clear_wake()`` are ``LinkCore``'s (C when built): the first three run once per frame.

    ``wait`` blocks until a frame may be waiting and says False once the peer is gone.
    Spinning first (up to ``spin_ns``, without the GIL) saves a sleep and a wake-up when
    the next frame follows within that time, and wastes the whole spin when it does not
    (one request at a time: the next one is a client round trip away). So it spins only
    while that pays, as an adaptive mutex does: a spin that ran out turns spinning off, a
    sleep shorter than the spin would have been turns it back on. The socket is looked at
    only when the sleep brought no record (every ``PEER_CHECK_NS`` while idle): a frame of
    its own is always followed by its ring record, whose push wakes the sleeper."""

    def __init__(self, sock: socket.socket, tx_ring: int, rx_ring: int, tx_wake: int, rx_wake: int):
        self.sock = sock
        self._maps = [mmap.mmap(fd, HEADER + RING_CAPACITY, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                      for fd in (tx_ring, rx_ring)]
        for fd in (tx_ring, rx_ring):
            os.close(fd)
        self.tx, self.rx = Ring(self._maps[0], RING_CAPACITY), Ring(self._maps[1], RING_CAPACITY)
        self.tx_wake, self.rx_wake = tx_wake, rx_wake
        self._sock_fd = sock.fileno()
        self._receiver = channel.Receiver(sock)
        self._poll: select.poll | None = None

    @classmethod
    def create(cls) -> tuple["Link", socket.socket, list[int]]:
        """The front-end's side, the worker's socket and the fds it needs, in the order
        ``attach`` takes them (they must be inherited by the worker, then closed here)."""
        ours, theirs = channel.socket_pair()
        to_worker, from_worker = _ring_memfd("in"), _ring_memfd("out")
        wake_us = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        fds = [os.dup(to_worker), os.dup(from_worker), os.dup(wake_us)]
        ours.setblocking(False)
        return cls(ours, to_worker, from_worker, -1, wake_us), theirs, fds

    @classmethod
    def attach(cls, sock: socket.socket, fds: list[int]) -> "Link":
        """The worker's side, from ``create``'s fds."""
        rx_ring, tx_ring, tx_wake = fds
        return cls(sock, tx_ring, rx_ring, tx_wake, -1)

    # sending, receiving and waiting for a frame: LinkCore's (send, recv, wait, clear_wake)

    def socket_state(self) -> str:
        """What the socket holds now: "eof" (the peer is gone), "data" (a message waits) or "empty"."""
        try:
            return "data" if self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) else "eof"
        except BlockingIOError:
            return "empty"
        except OSError:
            return "eof"

    def peer_gone(self) -> bool:
        """End-of-file on the socket (no frame waiting there)."""
        return self.socket_state() == "eof"

    def _wait_eventfd(self, spin_ns: int) -> bool:
        """``wait`` for the eventfd direction (the front-end's, which only benchmarks block
        on): poll the eventfd and the socket."""
        if self.rx.spin(spin_ns) or not self.rx.prepare_sleep():
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.rx_wake, select.POLLIN)
            self._poll.register(self._sock_fd, select.POLLIN)
        events = self._poll.poll()
        self.rx.awake()
        self.clear_wake()
        for fd, _ in events:  # the socket is readable: a frame of its own, or the peer's end-of-file
            if fd == self._sock_fd and not self.rx.pending():
                return not self.peer_gone()
        return True

    def close(self) -> None:
        """Closing the socket is what the peer sees (end-of-file); a worker asleep on its
        futex is woken to look."""
        self.sock.close()
        if self.tx_wake < 0:
            self.wake_peer()
        for fd in (self.tx_wake, self.rx_wake):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a ring's view still exists; the mapping goes with it
                pass
