"""Start the real server as a separate process and wait until it answers."""
from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"process {pid} has no VmRSS")


def children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (a server's workers)."""
    out: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in path.read_text().split()]
        except OSError:
            pass
    return sorted(set(out))


_handed_out: set[int] = set()


def free_port() -> int:
    """A port that is free now and below the kernel's ephemeral range (32768+), so no
    outgoing connection can take it before the server binds it; never the same twice."""
    while True:
        port = random.randint(20000, 32000)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


class ServerProcess:
    """``python -m triton_shm`` (or ``program``, e.g. an installed console script) on 127.0.0.1
    with its own ports and log file."""

    def __init__(self, repository: Path | list[Path], log_path: Path, *, extra_args: list[str] = (),
                 env: dict[str, str] | None = None, program: list[str] | None = None,
                 cwd: Path | None = None, https: ssl.SSLContext | None = None,
                 health_headers: dict[str, str] | None = None):
        self.program = program or [sys.executable, "-m", "triton_shm"]
        self.cwd = cwd
        self.repositories = repository if isinstance(repository, list) else [repository]
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.https = https  # the client context for a server that serves HTTPS
        self.health_headers = health_headers or {}  # for a server whose health API is restricted

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 90.0, wait_ready: bool = True) -> "ServerProcess":
        args = [*self.program, "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                "--allow-metrics", "false", "--drain-secs", "0", *self.extra_args]
        if not any(a == "--gpus" or a.startswith("--gpus=") for a in self.extra_args):
            # a test's server runs on the CPU unless the test names its GPUs: what the suite
            # expects of placement (KIND_AUTO on the CPU, one worker) holds on a GPU machine too
            args += ["--gpus", "none"]
        for repo in self.repositories:
            args += ["--model-repository", str(repo)]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if self._answers(wait_ready):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become ready in {timeout}s:\n{self.log()}")

    def _answers(self, ready: bool) -> bool:
        path = "/v2/health/ready" if ready else "/v2/health/live"
        scheme = "http" if self.https is None else "https"
        request = urllib.request.Request(f"{scheme}://{self.http_url}{path}", headers=self.health_headers)
        try:
            with urllib.request.urlopen(request, timeout=1, context=self.https) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_repository_loaded(self, timeout: float = 90.0) -> None:
        """Live comes before the repository finishes loading; wait for the model table."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "| Model" in self.log():
                return
            time.sleep(0.1)
        raise AssertionError(f"repository did not finish loading:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop_cleanly(self) -> None:
        """Stop and require a graceful exit (code 0), showing the log otherwise."""
        code = self.stop()
        assert code == 0, f"server did not exit cleanly ({code}):\n{self.log()[-4000:]}"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
