"""The server tune works against: its own (``python -m triton_shm`` in explicit mode over the
repository, stopped at the end) or a running one (``--url``), driven through the HTTP
model-repository and model-config APIs, which triton-shm and Triton share."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import TuneError

LOAD_TIMEOUT_S = 300.0


class ServerGone(TuneError):
    """The server stopped answering."""


class Control:
    """The model-control calls tune makes, over HTTP."""

    def __init__(self, http_url: str):
        self.http_url = http_url

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float = 10.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.http_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw).get("error") or raw.decode(errors="replace")
            except (ValueError, AttributeError):
                msg = raw.decode(errors="replace")
            raise TuneError(f"{method} {path}: HTTP {e.code}: {msg}") from None
        except (OSError, urllib.error.URLError) as e:
            reason = getattr(e, "reason", e)
            raise ServerGone(f"the server at {self.http_url} does not answer ({reason})") from None
        return json.loads(raw) if raw.strip() else None

    def live(self) -> bool:
        try:
            self._call("GET", "/v2/health/live", timeout=2.0)
            return True
        except TuneError:
            return False

    def ready(self) -> bool:
        try:
            self._call("GET", "/v2/health/ready", timeout=2.0)
            return True
        except TuneError:
            return False

    def server_metadata(self) -> dict[str, Any]:
        return self._call("GET", "/v2")

    def index(self) -> list[dict[str, Any]]:
        return self._call("POST", "/v2/repository/index", {}) or []

    def model_state(self, model: str) -> str | None:
        """READY, UNAVAILABLE, … as the repository index says ("" for a model it lists without a
        state: never loaded); None for a model it does not list."""
        states = [m.get("state") or "" for m in self.index() if m.get("name") == model]
        if not states:
            return None
        return "READY" if "READY" in states else states[0]

    def config(self, model: str) -> dict[str, Any]:
        return self._call("GET", f"/v2/models/{model}/config")

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._call("POST", f"/v2/repository/models/{model}/load", body, timeout=LOAD_TIMEOUT_S)

    def unload(self, model: str) -> None:
        self._call("POST", f"/v2/repository/models/{model}/unload", {}, timeout=LOAD_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnServer:
    """``python -m triton_shm --model-control-mode explicit`` over the repository, on free local
    ports, its log in ``log_path``."""

    def __init__(self, repository: Path, log_path: Path, extra_args: list[str]):
        self.repository, self.log_path, self.extra_args = repository, log_path, extra_args
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 120.0) -> "OwnServer":
        args = [sys.executable, "-m", "triton_shm", "--model-repository", str(self.repository),
                "--model-control-mode", "explicit", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                "--allow-metrics", "false", *self.extra_args]
        self._log = open(self.log_path, "wb")
        # no __pycache__ left in the user's model directories: tune leaves the repository as it was
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        control = Control(self.http_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TuneError(f"the server exited with {self.proc.returncode} at start; its log: {self.log_path}")
            if control.live():
                return self
            time.sleep(0.1)
        self.stop()
        raise TuneError(f"the server did not start in {timeout:g}s; its log: {self.log_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ProcessTree:
    """CPU seconds and resident memory of a process and its descendants (the server and its
    workers), read from /proc: what one candidate costs the machine."""

    def __init__(self, pid: int):
        self.pid = pid
        self._tick = os.sysconf("SC_CLK_TCK")

    def pids(self) -> list[int]:
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            for path in Path(f"/proc/{p}/task").glob("*/children"):
                try:
                    todo += [int(c) for c in path.read_text().split()]
                except OSError:
                    pass
        return out

    def cpu(self) -> dict[int, float]:
        """CPU seconds (user + system) of each live process of the tree."""
        out = {}
        for p in self.pids():
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[p] = (int(fields[11]) + int(fields[12])) / self._tick
        return out

    def rss_bytes(self) -> int:
        total = 0
        for p in self.pids():
            try:
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total


def listening_pid(host: str, port: int) -> int | None:
    """The process on this machine listening on ``port``, when ``host`` is this machine and /proc
    lets us see it: how tune measures a running server's CPU and memory too."""
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", socket.gethostname()):
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two samples by the processes alive at the second."""
    return sum(v - before.get(p, 0.0) for p, v in after.items())
