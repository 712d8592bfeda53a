"""Graceful drain for rolling updates, end to end.

On SIGTERM the server reports not ready while it keeps serving for ``--drain-secs`` (a
second signal ends the drain at once), then stops accepting, lets what is in flight
finish and exits 0. Sixteen clients loop small requests through both phases: each request
either succeeds or is refused before it started (the connection is refused or closed unanswered,
gRPC's GOAWAY turns the stream away, or grpc.aio answers UNAVAILABLE as it stops), and the
model never ran a request that failed; none fails mid-way.
"""
from __future__ import annotations

import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .helpers import client_module, connect
from .models import write_model

CLIENTS = 16

# The smallest work, so that with sixteen clients most requests are between the protocol
# front-end and the model, where a shutdown that refuses them too early shows. It logs each
# value it ran: a request the clients saw fail must not be among them. A negative value is
# the slow request: it stays in the model for SLOW_SECS, so a signal can be sent while a
# request is surely in flight.
SLOW_SECS = 1.0
PAUSE_PY = f"""
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            value = r.inputs()[0].as_numpy()
            print(f"RAN {{int(value[0])}}", flush=True)
            if value[0] < 0:
                time.sleep({SLOW_SECS})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
"""

PAUSE_CONFIG = """
name: "pause"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@dataclass
class Outcome:
    value: int
    sent: float
    done: float
    error: str | None  # None: the right answer came back; "refused": see refused_before_start


def health(srv: ServerProcess, what: str) -> int:
    """The HTTP status of /v2/health/<what>, 0 when the connection fails."""
    try:
        with urllib.request.urlopen(f"http://{srv.http_url}/v2/health/{what}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Client:
    """One tritonclient of ``proto``, asking the pause model to echo a value."""

    def __init__(self, srv: ServerProcess, proto: str):
        self.proto, self.client = proto, connect(srv, proto)

    def infer(self, value: int) -> np.ndarray:
        inp = client_module(self.proto).InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], dtype=np.int32))
        options = {"client_timeout": 60} if self.proto == "grpc" else {}
        return self.client.infer("pause", [inp], **options).as_numpy("OUTPUT0")

    def close(self) -> None:
        self.client.close()


def refused(error: BaseException) -> bool:
    """A failure that says the server did not take the request: the connection was refused
    or closed with no answer (HTTP), or UNAVAILABLE (gRPC: no listening server, a stream
    after the server's GOAWAY, or a refusal), the status a client may retry elsewhere. The
    test also checks the model never ran it."""
    if isinstance(error, InferenceServerException):
        return str(error.status()) == "StatusCode.UNAVAILABLE"
    return isinstance(error, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                              HTTPConnectionClosed))


class Load:
    """``CLIENTS`` threads, each with its own client, looping requests until stopped."""

    def __init__(self, srv: ServerProcess, proto: str):
        self.srv, self.proto = srv, proto
        self.outcomes: list[list[Outcome]] = [[] for _ in range(CLIENTS)]
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _loop(self, index: int) -> None:
        client = Client(self.srv, self.proto)
        mine = self.outcomes[index]
        value = index * 1_000_000
        try:
            while not self.stopping.is_set():
                value += 1
                sent = time.monotonic()
                try:
                    out = client.infer(value)
                    error = None if out.tolist() == [value] else f"wrong answer {out.tolist()} for {value}"
                except Exception as e:  # noqa: BLE001 -- every failure is recorded and judged
                    error = "refused" if refused(e) else f"{type(e).__name__}: {e}"
                mine.append(Outcome(value, sent, time.monotonic(), error))
                if error == "refused":  # the server is going: stop knocking
                    return
        finally:
            client.close()

    def wait_each_done(self, count: int, after: float, timeout: float = 60.0) -> None:
        """Until every client has ``count`` successful requests sent after ``after``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(sum(o.error is None and o.sent > after for o in mine) >= count for mine in self.outcomes):
                return
            time.sleep(0.05)
        raise AssertionError(f"clients did not each finish {count} requests: {self.summary()}")

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(90)
        assert not any(t.is_alive() for t in self.threads), "a client did not finish"

    def failures(self, before: float | None = None) -> list[str]:
        """Requests that failed other than by a refusal before the model ran them; with
        ``before``, also every failure of a request that ended before that moment."""
        ran = {int(v) for v in re.findall(r"^RAN (\d+)$", self.srv.log(), re.MULTILINE)}
        return [f"client {i} value {o.value} sent {o.sent:.3f} done {o.done:.3f}: {o.error}"
                f"{' (the model ran it)' if o.value in ran else ''}"
                for i, mine in enumerate(self.outcomes) for o in mine
                if o.error is not None and (o.error != "refused" or o.value in ran
                                            or (before is not None and o.done < before))]

    def summary(self) -> str:
        return ", ".join(f"{sum(o.error is None for o in m)} ok/{len(m)}" for m in self.outcomes)


TRANSPORTS = {
    "http": ("http", []),
    "grpc-native": ("grpc", ["--grpc-transport", "native"]),
    "grpc-grpcio": ("grpc", ["--grpc-transport", "grpcio"]),
    # two front-end processes: the pause model belongs to one, the other forwards its requests
    "http-2-processes": ("http", ["--frontend-processes", "2"]),
    "grpc-2-processes": ("grpc", ["--grpc-transport", "native", "--frontend-processes", "2"]),
}


@pytest.fixture(params=list(TRANSPORTS))
def transport(request):
    return TRANSPORTS[request.param]


def start(tmp_path: Path, *args: str) -> ServerProcess:
    repo = tmp_path / "models"
    write_model(repo, "pause", config=PAUSE_CONFIG, model_py=PAUSE_PY)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=list(args)).start()
    # Ready (asked over HTTP) only once every front-end listens: gRPC takes connections now.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", srv.grpc_port)) == 0
    return srv


def test_sigterm_drains_then_stops_losing_no_request(tmp_path, transport):
    proto, args = transport
    srv = start(tmp_path, "--drain-secs", "600", "--exit-timeout-secs", "30", *args)
    load = Load(srv, proto)
    try:
        load.wait_each_done(5, after=0.0)
        srv.proc.send_signal(signal.SIGTERM)
        # Drain: not ready, still live, still serving every request on every connection.
        deadline = time.monotonic() + 30
        while health(srv, "ready") != 400 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health(srv, "ready") == 400
        assert health(srv, "live") == 200
        not_ready = time.monotonic()
        load.wait_each_done(5, after=not_ready)
        probe = connect(srv, "grpc")
        try:
            assert probe.is_server_ready() is False
        finally:
            probe.close()
        assert srv.proc.poll() is None
        # A second signal ends the drain: in-flight requests finish, new ones are refused.
        stop_at = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]
    finally:
        load.stop()
        srv.stop()
    assert load.failures(before=stop_at) == [], "\n".join(load.failures(before=stop_at))
    assert "draining" in srv.log()


class SlowRequest:
    """One request that the model holds for ``SLOW_SECS``, sent from a thread of its own."""

    VALUE = -1

    def __init__(self, srv: ServerProcess, proto: str):
        self.srv, self.client = srv, Client(srv, proto)
        self.outcome: Outcome | None = None
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        sent = time.monotonic()
        try:
            out = self.client.infer(self.VALUE)
            error = None if out.tolist() == [self.VALUE] else f"wrong answer {out.tolist()}"
        except Exception as e:  # noqa: BLE001 -- judged by the test
            error = f"{type(e).__name__}: {e}"
        self.outcome = Outcome(self.VALUE, sent, time.monotonic(), error)

    def wait_in_model(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while f"RAN {self.VALUE}\n" not in self.srv.log():
            assert time.monotonic() < deadline, "the slow request did not reach the model"
            time.sleep(0.01)

    def result(self) -> Outcome:
        self.thread.join(90)
        self.client.close()
        assert self.outcome is not None, "the slow request did not finish"
        return self.outcome


def test_sigterm_without_drain_loses_no_request(tmp_path, transport):
    """``--drain-secs 0``: straight to stopping; requests sent around the signal still
    succeed or are refused before they started, and one the model holds at the signal is
    answered."""
    proto, args = transport
    srv = start(tmp_path, "--drain-secs", "0", *args)
    load = Load(srv, proto)
    try:
        load.wait_each_done(5, after=0.0)
        slow = SlowRequest(srv, proto)
        slow.wait_in_model()
        signalled = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]
        held = slow.result()
    finally:
        load.stop()
        srv.stop()
    assert load.failures() == [], "\n".join(load.failures())
    assert held.error is None and held.sent < signalled < held.done, held


def test_drain_ends_by_itself_and_exits_zero(tmp_path):
    srv = start(tmp_path, "--drain-secs", "1")
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) == 0, srv.log()[-3000:]
    assert "draining for 1 s" in srv.log()


def test_sigint_skips_the_drain(tmp_path):
    """Ctrl-C at a terminal: no load balancer to wait for."""
    srv = start(tmp_path, "--drain-secs", "600")
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(60) == 0, srv.log()[-3000:]
    assert "draining" not in srv.log()
    assert "shutting down" in srv.log()


def test_drain_secs_parses():
    from triton_shm.cli import parse_args
    assert parse_args(["--model-repository", "/m"]).drain_secs == 5.0
    assert parse_args(["--model-repository", "/m", "--drain-secs=2.5"]).drain_secs == 2.5
    assert parse_args(["--model-repository", "/m", "--drain-secs", "0"]).drain_secs == 0.0


@pytest.mark.parametrize("value", ["-1", "x", "inf", "nan"])
def test_bad_drain_secs_is_refused(tmp_path, value):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "triton_shm", "--model-repository", str(tmp_path),
                           "--drain-secs", value], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "argument --drain-secs" in proc.stderr


# --------------------------------------------------------------------------- the end of the drain

def _http_request(path: str, body: bytes = b"") -> bytes:
    method = "POST" if body else "GET"
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n").encode() + body


INFER_REQUEST = _http_request("/v2/models/pause/infer", b'{"inputs":[{"name":"INPUT0","shape":[1],'
                                                         b'"datatype":"INT32","data":[7]}]}')
LIVE_REQUEST = _http_request("/v2/health/live")


def one_connection(port: int, request: bytes) -> str:
    """A fresh connection, one request: "answered <status>", "refused" (the connect failed),
    or how it broke (a reset, a broken pipe, closed without a whole response)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    except ConnectionRefusedError:
        return "refused"
    try:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return f"closed without response ({len(data)} bytes)"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return f"closed mid-response ({len(body)} of {length} bytes)"
            body += chunk
        return f"answered {head.split()[1].decode()}"
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    finally:
        sock.close()


@pytest.mark.parametrize("attempt", range(3))
def test_end_of_drain_refuses_or_answers_every_new_connection(tmp_path, attempt):
    """Clients opening a connection per request, four in parallel, across the moment the
    drain ends and the listeners close: each gets an answer or a refused connection, never a
    reset, a broken pipe or a connection closed without a response."""
    srv = start(tmp_path, "--drain-secs", "1.5", "--exit-timeout-secs", "30")
    outcomes: list[tuple[float, str]] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        request = INFER_REQUEST if index % 2 == 0 else LIVE_REQUEST
        refusals = 0
        while not stop.is_set() and refusals < 20:
            outcome = one_connection(srv.http_port, request)
            outcomes.append((time.monotonic(), outcome))
            refusals = refusals + 1 if outcome == "refused" else 0

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
        signalled = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        srv.stop()
    broken = [o for o in outcomes if o[1] != "refused" and not o[1].startswith("answered ")]
    assert not broken, f"{len(broken)} of {len(outcomes)} requests broke: {broken[:10]}"
    answered = [t for t, o in outcomes if o.startswith("answered ")]
    assert answered and any(o == "refused" for _, o in outcomes), outcomes[-10:]
    # answered up to the end of the drain (1.5 s after the signal), when the listeners close
    assert max(answered) > signalled + 1.4, (max(answered) - signalled, outcomes[-10:])
