"""The socket between the front-end and a worker.

A ``SOCK_SEQPACKET`` Unix socket pair: message boundaries are kept by the kernel, a
peer that dies is seen at once as end-of-file, and segment file descriptors ride along
as ``SCM_RIGHTS``. Each message is one frame of ``protocol``: fixed binary records,
never pickles, so neither side can make the other run code by what it sends.
"""
from __future__ import annotations

import array
import os
import socket

MAX_MESSAGE = 1 << 20  # 1 MiB; control messages are far smaller
_SOCKBUF = 4 << 20
_FD_SPACE = socket.CMSG_SPACE(8 * array.array("i").itemsize)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKBUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKBUF)
    return a, b


def send(sock: socket.socket, frame: bytes | bytearray, fds: list[int] | None = None) -> None:
    if len(frame) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(frame)} bytes exceeds {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.send(frame)


class Receiver:
    """Receives frames into one reused buffer: ``recvmsg(MAX_MESSAGE)`` would allocate
    (and fault in) a fresh megabyte per message, which costs more than the message."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = bytearray(MAX_MESSAGE)
        self._view = memoryview(self._buf)

    def recv(self) -> tuple[bytes | None, list[int]]:
        """One frame (a copy, the caller may keep it) and the fds that came with it;
        ``(None, [])`` at end-of-file."""
        n, ancdata, flags, _ = self.sock.recvmsg_into([self._buf], _FD_SPACE)
        fds = _fds(ancdata)
        if not n:
            close_fds(fds)
            return None, []
        if flags & socket.MSG_TRUNC:
            close_fds(fds)
            raise ValueError("control message truncated")
        return bytes(self._view[:n]), fds


def _fds(ancdata: list) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)
    return fds


def recv(sock: socket.socket) -> tuple[bytes | None, list[int]]:
    """One frame on a socket that receives rarely (see ``Receiver``)."""
    return Receiver(sock).recv()


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
