"""Listening sockets: binding one to share with other processes, and closing one without
resetting a connection the kernel has accepted for it.

:func:`bind_listener` makes a listening socket that child processes inherit (several
front-end processes accept on one socket, one accept queue: a process that dies leaves its
share of the queue to the others, which SO_REUSEPORT's per-socket queues would reset).

A TCP handshake completes in the kernel before the server accepts the connection: the
client may already have sent its request when the listening socket closes, and closing it
resets every connection still in its accept queue (the client sees ECONNRESET, EPIPE, or a
connection closed without a response). :func:`stop_listening` closes in an order that leaves
a client only a refused connection or one the server takes and answers:

1. a socket filter that drops every SYN makes the listener deaf to new handshakes (a SYN
   dropped is retried by the client, and the retry finds the port closed: refused), while
   the handshakes under way complete;
2. the connections already in the accept queue are accepted and handed to the caller;
3. the listening socket closes, its queue empty.

The filter is Linux's (``SO_ATTACH_FILTER``, classic BPF: no privilege needed); elsewhere
step 1 is skipped, and only a handshake completing between steps 2 and 3 can be reset.

Front-end processes that bind one port with SO_REUSEPORT (:func:`bind_listener`) each
have a socket and a queue of their own: the filter deafens only the stopping process's
socket, and the kernel sends new connections to the others. A socket several processes
inherited is one socket: the filter makes it deaf for all of them, which is right only
when the whole server stops.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import sys
from typing import Callable, Iterable

log = logging.getLogger(__name__)

_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)  # Linux's value; Python does not export it
# Classic BPF over the TCP header (where a TCP socket's filter starts): drop a segment whose
# flags have SYN without ACK (a new handshake), keep the rest (the last ACK of a handshake
# under way completes it, into the queue that is taken next).
_DROP_SYN = b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in (
    (0x30, 0, 0, 13),          # ldb [13]: the flags byte
    (0x54, 0, 0, 0x12),        # and #(SYN | ACK)
    (0x15, 0, 1, 0x02),        # jeq #SYN: next, else skip one
    (0x06, 0, 0, 0),           # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: keep all of it
))


LISTEN_BACKLOG = 1024


def bind_listener(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A non-blocking TCP socket bound to ``host:port``, listening (backlog ``LISTEN_BACKLOG``)
    unless ``listen`` is False (the server that serves it listens), inheritable, for child
    processes to serve on (``subprocess``'s ``pass_fds``). The address is resolved as
    ``loop.create_server`` does (IPv6 hosts, names; the first address found), with SO_REUSEADDR
    and, for IPv6, IPV6_V6ONLY as it sets them. ``reuse_port``: SO_REUSEPORT, so the
    front-end processes of one server (the same user's) each bind the port and the kernel
    spreads new connections over them. Raises OSError when it cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as e:
            raise OSError(e.errno, f"could not bind {host}:{port} ({e.strerror})") from None
        if listen:
            sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def refuse_new_connections(sock: socket.socket) -> bool:
    """Drop every SYN that reaches the listening ``sock``: no new handshake begins (the
    client's retry finds the port closed), those under way complete; False where that
    cannot be done."""
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(_DROP_SYN, len(_DROP_SYN))
    fprog = struct.pack("HP", len(_DROP_SYN) // 8, ctypes.addressof(program))  # struct sock_fprog (copied)
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError as e:
        log.debug("cannot filter the listening socket: %s", e)
        return False
    return True


def take_accept_queue(sock: socket.socket) -> list[socket.socket]:
    """Accept every connection waiting in the listening ``sock``'s queue (made non-blocking)."""
    taken = []
    sock.setblocking(False)
    while True:
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            break
        except ConnectionAbortedError:
            continue  # that one is gone already; the others may still wait
        except OSError as e:
            log.debug("accept at shutdown: %s", e)
            break
        taken.append(conn)
    return taken


async def stop_listening(server: asyncio.AbstractServer, accept: Callable[[socket.socket], None]) -> int:
    """Close ``server``'s listening sockets as the module says, handing each connection
    taken from their queues to ``accept``; returns how many were taken. The event loop turns
    first, so the connections it has accepted already get their protocols while the server is
    still open (asyncio makes no transport for a closed server: it would drop them).
    A socket inherited by other processes is deafened for them too (see the module's note);
    each process closes only its own descriptor."""
    loop = asyncio.get_running_loop()
    listeners = list(getattr(server, "sockets", None) or ())  # asyncio.Server's and uvloop's have them
    sockets = [socket.socket(fileno=os.dup(s.fileno())) for s in listeners]
    try:
        for listener, sock in zip(listeners, sockets):
            refuse_new_connections(sock)
            try:  # asyncio's own loop accepts no more (uvloop's accepts on: its transports need no open server)
                loop.remove_reader(listener.fileno())
            except (NotImplementedError, ValueError, OSError):
                pass
        for _ in range(2):  # what the loop accepted gets its transport now
            await asyncio.sleep(0)
        taken = [conn for sock in sockets for conn in take_accept_queue(sock)]
        server.close()
    finally:
        for sock in sockets:
            sock.close()
    for conn in taken:
        accept(conn)
    return len(taken)


def retrieve_failures(tasks: Iterable[asyncio.Task]) -> None:
    """Consume the errors of connections taken at shutdown that failed to start (a TLS
    handshake) once done, so asyncio does not log them as never retrieved."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.debug("a connection taken at shutdown failed: %s", task.exception())
