"""Listening sockets made by one process and served by others (several front-end processes)."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_shm.frontend.grpc.aio import start_aio
from triton_shm.frontend.listeners import LISTEN_BACKLOG, bind_listener

from .harness import free_port

ROOT = Path(__file__).resolve().parents[1]
SERVE = Path(__file__).with_name("serve_on_socket.py")


class Served:
    """``serve_on_socket.py`` in a child process, serving on an inherited listening socket."""

    def __init__(self, sock: socket.socket, protocol: str, name: str, log: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, str(SERVE), str(sock.fileno()), protocol, name],
                                     pass_fds=[sock.fileno()], stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=ROOT)

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "serving" not in self.log():
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"not serving after {timeout}s:\n{self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def server_name(protocol: str, port: int) -> str:
    """The server id that answers a fresh connection's metadata request."""
    if protocol.startswith("http"):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            return client.get_server_metadata()["name"]
        finally:
            client.close()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as grpc_client:
        return grpc_client.get_server_metadata().name


def test_bind_listener_makes_an_inheritable_listening_socket():
    port = free_port()
    sock = bind_listener("127.0.0.1", port)
    try:
        assert sock.getsockname() == ("127.0.0.1", port)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert sock.get_inheritable() and not sock.getblocking()
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):  # no second server beside it
            bind_listener("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the kernel completes the handshake: it listens
    finally:
        sock.close()
    assert LISTEN_BACKLOG == 1024


def test_bind_listener_takes_ipv6_hosts():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    port = free_port()
    try:
        sock = bind_listener("::1", port)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    with sock:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[:2] == ("::1", port)
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        with socket.create_connection(("::1", port), timeout=5):
            pass


def test_grpcio_transport_refuses_an_inherited_socket():
    async def start() -> None:
        await start_aio([], "127.0.0.1", 0, [], sock=sock)
    with bind_listener("127.0.0.1", free_port()) as sock:
        with pytest.raises(ValueError, match="use --grpc-transport native"):
            asyncio.run(start())


@pytest.mark.parametrize("protocol", ["http-lean", "http-aiohttp", "grpc-native"])
def test_two_processes_serve_one_inherited_socket(tmp_path, protocol):
    """Two front-ends inherit one listening socket: tritonclient's requests are answered,
    each process takes some of the connections, and both stop cleanly together."""
    port = free_port()
    sock = bind_listener("127.0.0.1", port)
    served = []
    try:
        served = [Served(sock, protocol, f"front-end-{i}", tmp_path / f"{i}.log") for i in range(2)]
        sock.close()  # the children hold it now
        for s in served:
            s.wait_serving()
        seen: set[str] = set()
        for _ in range(200):  # each request on a new connection, which either process may accept
            seen.add(server_name(protocol, port))
            if len(seen) == 2:
                break
        assert seen == {"front-end-0", "front-end-1"}
    finally:
        sock.close()
        codes = [s.stop() for s in served]
    assert codes == [0, 0], "\n".join(s.log() for s in served)
    assert all("stopped" in s.log() for s in served)
