"""IPC round trip: front-end → worker → front-end with an empty frame (PING/PONG).

    python bench/ipc_rtt.py [--n 20000]

Starts the real CPU worker process through WorkerPool and times `ping` calls on the
front-end's event loop (uvloop), the path every inference request takes. Beside it, in
the same run, the floors: a bare SEQPACKET ping-pong between two blocking processes, the
same socket answered to an event loop (what any asyncio front-end on a socket pays), and
a bare ping-pong over two of our shared-memory rings (both sides spinning, then
sleeping: the worker's side on a futex, the front-end's on an eventfd, as in the server).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time

import uvloop

from triton_shm.supervisor.pool import WorkerPool


async def measure(n: int) -> dict[str, float]:
    pool = WorkerPool(gpus=[])
    await pool.start()
    try:
        for _ in range(200):  # warm-up, and wait for the worker to come up
            await pool.ping()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            await pool.ping()
            samples.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        await pool.stop()
    samples.sort()
    return {"n": n, "median_us": statistics.median(samples), "p90_us": samples[int(0.9 * n)],
            "p99_us": samples[int(0.99 * n)]}


def _echo_peer() -> tuple[socket.socket, int]:
    """A SEQPACKET pair whose other end is a forked child echoing every packet; returns our
    end and the child's pid."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        a.close()
        while data := b.recv(256):
            b.send(data)
        os._exit(0)
    b.close()
    return a, pid


def kernel_floor(n: int) -> float:
    """Median blocking ping-pong over a bare SEQPACKET pair: what the machine allows."""
    a, pid = _echo_peer()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        a.send(b'{"op":"ping","id":1}')
        a.recv(256)
        samples.append((time.perf_counter_ns() - t0) / 1000)
    a.close()
    os.waitpid(pid, 0)
    return statistics.median(samples)


def loop_floor(n: int) -> float:
    """Median ping-pong over a SEQPACKET pair, uvloop reader on our side, a blocking echo
    on the other: the socket with an event loop and no protocol work."""
    a, pid = _echo_peer()
    a.setblocking(False)

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def readable() -> None:
            a.recv(256)
            fut.set_result(None)

        loop.add_reader(a.fileno(), readable)
        samples = []
        for _ in range(n):
            fut = loop.create_future()
            t0 = time.perf_counter_ns()
            a.send(b"x" * 20)
            await fut
            samples.append((time.perf_counter_ns() - t0) / 1000)
        loop.remove_reader(a.fileno())
        return samples

    samples = asyncio.run(run())
    a.close()
    os.waitpid(pid, 0)
    return statistics.median(samples)


def ring_floor(n: int) -> float:
    """Median ping-pong over a pair of our rings between two blocking processes."""
    from triton_shm.ipc.link import Link
    ours, theirs, fds = Link.create()
    pid = os.fork()
    if pid == 0:
        ours.sock.close()
        peer = Link.attach(theirs, fds)
        while peer.wait(50_000):
            while (got := peer.recv()) is not None:
                peer.send(got[0])
        os._exit(0)
    theirs.close()
    for fd in fds:
        os.close(fd)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ours.send(b"x" * 20)
        while ours.recv() is None:
            ours.wait(50_000)
        samples.append((time.perf_counter_ns() - t0) / 1000)
    ours.close()
    os.waitpid(pid, 0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    uvloop.install()
    r = asyncio.run(measure(args.n))
    floor = kernel_floor(args.n)
    on_loop = loop_floor(args.n)
    rings = ring_floor(args.n)
    print("| what | median | p90 | p99 |\n|---|---|---|---|")
    print(f"| bare SEQPACKET ping-pong, blocking, no Python work (machine floor) | {floor:.1f} µs | | |")
    print(f"| bare SEQPACKET ping-pong answered to a uvloop reader, no protocol work | {on_loop:.1f} µs | | |")
    print(f"| bare ping-pong over two shared-memory rings (spin, then futex or eventfd) | {rings:.1f} µs | | |")
    print(f"| triton-shm control channel round trip, front-end (uvloop) → worker → front-end, n={r['n']} "
          f"| {r['median_us']:.1f} µs | {r['p90_us']:.1f} µs | {r['p99_us']:.1f} µs |")


if __name__ == "__main__":
    main()
