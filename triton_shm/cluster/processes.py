"""The tree of front-end processes: process 0 (the one the user started) starts processes
1..N-1, restarts one that dies, and passes the stop signals on.

Each process is the same program (``python -m triton_shm`` with the user's command line)
told its place by the environment: ``TRITON_SHM_FRONTEND`` ("index/count"),
``TRITON_SHM_FRONTEND_DIR`` (the private directory of the peer sockets) and
``TRITON_SHM_FRONTEND_PARENT`` (a pipe from process 0: its end of file means process 0 is
gone, and the process stops). ``TRITON_SHM_FRONTEND_RESTART=1`` marks a restart: the
process takes the server's current state from process 0 instead of the start-up one.

Every process binds the HTTP and gRPC ports itself with SO_REUSEPORT (process 0 first, before
it starts the others, so a port in use fails the start), and the kernel spreads new
connections over them by their addresses. One listening socket inherited by all was the
first design; measured, it gave every connection to one process (the one the kernel wakes
first takes the whole accept queue: 80 connections of 80 in tests/test_frontend_processes.py),
so the others idled (docs/design/frontend-processes.md).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("triton_shm.frontends")

ENV_PLACE = "TRITON_SHM_FRONTEND"
ENV_DIR = "TRITON_SHM_FRONTEND_DIR"
ENV_PARENT = "TRITON_SHM_FRONTEND_PARENT"
ENV_RESTART = "TRITON_SHM_FRONTEND_RESTART"
RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0)  # seconds before a restart, by how many came before (last one repeats)


@dataclass
class Place:
    """Where this process stands among the front-end processes."""
    index: int = 0
    count: int = 1
    directory: Path | None = None           # the peer sockets' directory (several processes only)
    listeners: dict[str, socket.socket] = field(default_factory=dict)  # "http"/"grpc": bound with SO_REUSEPORT
    parent_fd: int | None = None            # process 1..N-1: the pipe whose end of file says process 0 left
    restarted: bool = False

    @property
    def several(self) -> bool:
        return self.count > 1


def place_from_environment(count: int) -> Place:
    """This process's place: a process started by process 0 reads it from the environment;
    the one the user started is process 0 of ``count``."""
    spec = os.environ.get(ENV_PLACE)
    if not spec:
        return Place(0, max(count, 1))
    index, _, total = spec.partition("/")
    parent = os.environ.get(ENV_PARENT)
    return Place(int(index), int(total), Path(os.environ[ENV_DIR]), {}, int(parent) if parent else None,
                 os.environ.get(ENV_RESTART) == "1")


class FrontendProcesses:
    """Process 0's children: processes 1..count-1, restarted when one dies (not while the
    server stops)."""

    def __init__(self, place: Place, command_line: list[str]):
        self.place = place
        self.command_line = command_line
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = False
        self._watchers: list[asyncio.Task] = []
        self._parent_read, self._parent_write = os.pipe()  # the children hold the read end
        # the peer sockets' directory: private to the server's user (mkdtemp: mode 0700)
        place.directory = Path(tempfile.mkdtemp(prefix="triton-shm-frontends-"))

    async def start(self) -> None:
        for index in range(1, self.place.count):
            await self._spawn(index, restarted=False)
            self._watchers.append(asyncio.get_running_loop().create_task(self._watch(index)))

    async def _spawn(self, index: int, restarted: bool) -> None:
        env = dict(os.environ)
        env.update({ENV_PLACE: f"{index}/{self.place.count}", ENV_DIR: str(self.place.directory),
                    ENV_PARENT: str(self._parent_read), ENV_RESTART: "1" if restarted else "0"})
        # its own session: a terminal's Ctrl-C reaches process 0, which passes the signal on
        self.children[index] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "triton_shm", *self.command_line, env=env,
            pass_fds=[self._parent_read], start_new_session=True)
        log.info("started front-end process %d (pid %d)", index, self.children[index].pid)

    async def _watch(self, index: int) -> None:
        restarts = 0
        while True:
            code = await self.children[index].wait()
            if self.stopping:
                return
            delay = RESTART_DELAYS[min(restarts, len(RESTART_DELAYS) - 1)]
            log.error("front-end process %d exited (%s); starting it again in %g s", index,
                      f"signal {-code}" if code < 0 else f"code {code}", delay)
            restarts += 1
            await asyncio.sleep(delay)
            if self.stopping:
                return
            await self._spawn(index, restarted=True)

    def signal(self, sig: int) -> None:
        """Pass a signal on to every child: SIGTERM or SIGINT (they drain and stop as process
        0 does), SIGHUP (they read their TLS files again)."""
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        for child in self.children.values():
            if child.returncode is None:
                try:
                    child.send_signal(sig)
                except ProcessLookupError:
                    pass

    async def stop(self, timeout: float) -> None:
        """Stop the children (SIGTERM, then SIGKILL after ``timeout``) and remove the
        peer directory."""
        self.signal(signal.SIGTERM)
        for task in self._watchers:
            task.cancel()
        running = [c for c in self.children.values() if c.returncode is None]
        if running:
            _, late = await asyncio.wait([asyncio.ensure_future(c.wait()) for c in running], timeout=timeout)
            for child in running:
                if child.returncode is None:
                    log.warning("front-end process (pid %d) did not stop in time; killing it", child.pid)
                    child.kill()
            if late:
                await asyncio.wait(late, timeout=5.0)
        os.close(self._parent_write)
        os.close(self._parent_read)
        if self.place.directory is not None:
            shutil.rmtree(self.place.directory, ignore_errors=True)


def watch_parent(place: Place, gone) -> None:
    """Call ``gone()`` once process 0 has exited (its pipe's end of file)."""
    if place.parent_fd is None:
        return
    loop = asyncio.get_running_loop()
    fd = place.parent_fd

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            gone()
    loop.add_reader(fd, readable)
