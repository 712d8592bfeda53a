"""The control channel between the front-end and a worker.

A ``SOCK_SEQPACKET`` Unix socket pair: message boundaries are kept by the kernel, a
peer that dies is seen at once as end-of-file, and segment file descriptors ride along
as ``SCM_RIGHTS``. Messages are small JSON objects (orjson): descriptors, names,
shapes, never tensor bytes and never pickles, so neither side can make the other run
code by what it sends.
"""
from __future__ import annotations

import array
import socket
from typing import Any

import orjson

MAX_MESSAGE = 1 << 20  # 1 MiB; control messages are far smaller
_SOCKBUF = 4 << 20
_FD_SPACE = socket.CMSG_SPACE(8 * array.array("i").itemsize)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKBUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKBUF)
    return a, b


def encode(message: dict[str, Any]) -> bytes:
    data = orjson.dumps(message)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = encode(message)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds that came with it; ``(None, [])`` at end-of-file."""
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE, _FD_SPACE)
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)
    if not data:
        for fd in fds:
            _close_quietly(fd)
        return None, []
    if flags & socket.MSG_TRUNC:
        for fd in fds:
            _close_quietly(fd)
        raise ValueError("control message truncated")
    return orjson.loads(data), fds


def _close_quietly(fd: int) -> None:
    import os
    try:
        os.close(fd)
    except OSError:
        pass
