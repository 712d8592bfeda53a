"""The HTTP connection itself, over raw sockets against a real server: keep-alive,
pipelining across the lean infer path and aiohttp's routes, chunked bodies,
Expect: 100-continue, HTTP/1.0, Connection: close, malformed and oversize requests,
slow headers, and a client that stops reading.

With TRITON_SHM_FALLBACK_TRANSPORTS=1 the server is pure aiohttp: the same exchanges must
work; what only the lean path promises (exact 4xx codes for unparseable requests, the
header timeout) is checked where it runs.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import random
import socket
import threading
import time
import zlib

import numpy as np
import pytest
import uvloop

from triton_shm.frontend.http.app import default_http_transport

from .harness import ServerProcess, rss_kib
from .models import add_sub_onnx_model, python_identity
from .helpers import assert_serving

pytestmark = pytest.mark.timeout(120)

LEAN = default_http_transport() == "lean"
MAX_INPUT = 4_000_000
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 0.5, dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_lean")
    repo = root / "models"
    add_sub_onnx_model(repo)
    python_identity(repo, "identity_fp32", "FP32")
    srv = ServerProcess(repo, root / "server.log", extra_args=[
        "--http-max-input-size", str(MAX_INPUT), "--http-header-timeout-secs", "1"]).start()
    yield srv
    srv.stop_cleanly()


# --------------------------------------------------------------------------- raw HTTP
class Conn:
    """One client connection: send bytes, read responses one by one."""

    def __init__(self, server: ServerProcess, timeout: float = 30):
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.buf += chunk
        return bool(chunk)

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before a response: {self.buf[:200]!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status < 200:
            return status, headers, b""
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                if not self._fill():
                    raise ConnectionError("closed inside a response body")
            body, self.buf = self.buf[:n], self.buf[n:]
        else:  # close-delimited
            while self._fill():
                pass
            body, self.buf = self.buf, b""
        return status, headers, body

    def closed_by_server(self, wait: float = 5.0) -> bool:
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: test"]
    headers = dict(headers or {})
    if (body or method == "POST") and "Transfer-Encoding" not in headers:
        headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def add_sub_body(request_id: str = "", a=A, b=B) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(a.shape),
                       "parameters": {"binary_data_size": a.nbytes}},
                      {"name": "INPUT1", "datatype": "FP32", "shape": list(b.shape),
                       "parameters": {"binary_data_size": b.nbytes}}],
           "parameters": {"binary_data_output": True}}
    if request_id:
        doc["id"] = request_id
    header = json.dumps(doc).encode()
    return header + a.tobytes() + b.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def infer_request(request_id: str = "", path: str = "/v2/models/add_sub/infer", **kw) -> bytes:
    body, headers = add_sub_body(request_id)
    return request("POST", path, body, {**headers, **kw.pop("headers", {})}, **kw)


def check_add_sub(status: int, headers: dict[str, str], body: bytes, request_id: str = "") -> None:
    assert status == 200, body[:500]
    n = int(headers["inference-header-content-length"])
    doc = json.loads(body[:n])
    assert doc.get("id", "") == request_id
    blob = body[n:]
    np.testing.assert_array_equal(np.frombuffer(blob[:64], "<f4"), (A + B).ravel())
    np.testing.assert_array_equal(np.frombuffer(blob[64:128], "<f4"), (A - B).ravel())


def assert_json_error(status: int, headers: dict[str, str], body: bytes, expected: int) -> str:
    assert status == expected, (status, body[:500])
    assert headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert set(doc) == {"error"} and doc["error"], doc
    return doc["error"]


# --------------------------------------------------------------------------- keep-alive and routing
def test_infer_runs_on_the_lean_path(server):
    c = Conn(server)
    c.send(infer_request())
    _, infer_headers, _ = c.read_response()
    c.send(request("GET", "/v2/health/ready"))
    _, other_headers, _ = c.read_response()
    c.close()
    assert "aiohttp" in other_headers.get("server", "")  # every other route: aiohttp, as before
    assert ("aiohttp" in infer_headers.get("server", "")) is not LEAN


def test_keep_alive_mixes_infer_and_other_routes(server):
    c = Conn(server)
    for i in range(30):
        c.send(infer_request(f"r{i}"))
        check_add_sub(*c.read_response(), f"r{i}")
        if i % 5 == 0:
            c.send(request("GET", "/v2/models/add_sub"))
            status, _, body = c.read_response()
            assert status == 200 and json.loads(body)["name"] == "add_sub"
            c.send(request("GET", "/v2/nothing/here"))
            assert json.loads(c.read_response()[2]) == {"error": "Not Found"}
    assert not c.closed_by_server(wait=0.2)
    c.close()


def test_the_same_request_again_answers_alike(server):
    """A client sends one JSON header again and again (what the lean path keeps per route):
    every answer is the same, and the same header on a body of another size is refused
    as the first time."""
    c = Conn(server)
    answers = []
    for _ in range(4):
        c.send(infer_request(path="/v2/models/add_sub/versions/1/infer"))
        status, headers, body = c.read_response()
        check_add_sub(status, headers, body)
        headers.pop("date")
        answers.append((status, headers, body))
    assert answers[1:] == answers[:-1]
    if LEAN:  # aiohttp adds its own (Server)
        assert answers[0][1] == {"content-type": "application/octet-stream", "content-length": str(len(answers[0][2])),
                                 "inference-header-content-length": answers[0][1]["inference-header-content-length"]}
    body, headers = add_sub_body()
    for extra, error in [(b"z", "unexpected additional input data for model 'add_sub'"),
                         (-1, "unexpected size for input 'INPUT1', expecting 1 additional bytes for model "
                              "'add_sub'")]:
        sent = body + extra if isinstance(extra, bytes) else body[:extra]
        c.send(request("POST", "/v2/models/add_sub/versions/1/infer", sent, headers))
        assert assert_json_error(*c.read_response(), 400) == error
    c.send(infer_request(path="/v2/models/add_sub/versions/1/infer"))
    check_add_sub(*c.read_response())
    c.close()


def test_pipelined_requests_answer_in_order(server):
    good_body, good_headers = add_sub_body("x")
    reqs, checks = [], []
    for i in range(12):
        kind = i % 4
        if kind == 0:
            reqs.append(infer_request(f"p{i}"))
            checks.append(lambda r, i=i: check_add_sub(*r, f"p{i}"))
        elif kind == 1:
            reqs.append(request("GET", "/v2/health/live"))
            checks.append(lambda r: r[0] == 200 or pytest.fail(str(r)))
        elif kind == 2:
            reqs.append(request("POST", "/v2/models/nope/infer", good_body, good_headers))
            checks.append(lambda r: "nope" in assert_json_error(*r, 404))
        else:
            reqs.append(request("POST", "/v2/repository/index", b'{"ready": true}'))
            checks.append(lambda r: any(m["name"] == "add_sub" for m in json.loads(r[2])) or pytest.fail(str(r)))
    c = Conn(server)
    c.send(b"".join(reqs))
    for check in checks:
        check(c.read_response())
    c.close()


@pytest.mark.parametrize("path", ["/v2/models/add_sub/versions/1/infer", "/v2/models/add_sub/infer?x=1",
                                  "/v2/models/add%5Fsub/infer"])
def test_infer_url_forms(server, path):
    c = Conn(server)
    c.send(infer_request("u", path=path))
    check_add_sub(*c.read_response(), "u")
    c.close()


def test_wrong_method_and_bad_version_on_infer_route(server):
    c = Conn(server)
    c.send(request("GET", "/v2/models/add_sub/infer"))
    status, headers, body = c.read_response()
    assert json.loads(body) == {"error": "Method Not Allowed"} and status == 405 and "POST" in headers["allow"]
    c.send(infer_request(path="/v2/models/add_sub/versions/abc/infer"))
    assert_json_error(*c.read_response(), 404)
    c.send(infer_request(path="/v2/models/../infer"))
    assert assert_json_error(*c.read_response(), 400) == "invalid model name '..'"
    c.close()


# --------------------------------------------------------------------------- bodies
def chunked(body: bytes, sizes=(1, 7, 100, 3)) -> bytes:
    out, pos, k = [], 0, 0
    while pos < len(body):
        n = sizes[k % len(sizes)]
        out.append(b"%x\r\n%s\r\n" % (len(body[pos:pos + n]), body[pos:pos + n]))
        pos, k = pos + n, k + 1
    return b"".join(out) + b"0\r\n\r\n"


def test_chunked_request_bodies(server):
    body, headers = add_sub_body("c")
    c = Conn(server)
    c.send(request("POST", "/v2/models/add_sub/infer", chunked(body), {**headers, "Transfer-Encoding": "chunked"}))
    check_add_sub(*c.read_response(), "c")
    c.send(request("POST", "/v2/repository/index", chunked(b'{"ready": false}'), {"Transfer-Encoding": "chunked"}))
    status, _, rbody = c.read_response()
    assert status == 200 and any(m["name"] == "add_sub" for m in json.loads(rbody))
    c.close()


def test_body_limit(server):
    c = Conn(server)  # declared too large: the lean path refuses it before the body arrives
    c.send(request("POST", "/v2/models/identity_fp32/infer", headers={"Content-Length": str(MAX_INPUT + 1)})
           + b"\0" * (1000 if LEAN else MAX_INPUT + 1))
    assert assert_json_error(*c.read_response(), 413) == f"Maximum request body size {MAX_INPUT} exceeded."
    c.close()
    # chunked past the limit: refused once it gets there (the client may see the close first)
    c = Conn(server)
    big = b"\0" * (MAX_INPUT + 100_000)
    try:
        c.send(request("POST", "/v2/models/identity_fp32/infer", chunked(big, (1 << 20,)),
                       {"Transfer-Encoding": "chunked"}))
        assert_json_error(*c.read_response(), 413)
    except (BrokenPipeError, ConnectionResetError):
        pass
    c.close()
    assert_serving(server)


def test_compressed_bodies(server):
    body, headers = add_sub_body("z")
    for coding, pack in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        c = Conn(server)
        c.send(request("POST", "/v2/models/add_sub/infer", pack(body),
                       {**headers, "Content-Encoding": coding, "Accept-Encoding": coding}))
        status, rheaders, rbody = c.read_response()
        assert rheaders.get("content-encoding") == coding
        check_add_sub(status, rheaders, zlib.decompress(rbody, 47), "z")
        c.close()
    c = Conn(server)
    c.send(request("POST", "/v2/models/add_sub/infer", b"not compressed", {**headers, "Content-Encoding": "gzip"}))
    assert "decompress" in assert_json_error(*c.read_response(), 400)
    c.send(request("POST", "/v2/models/add_sub/infer", body, {**headers, "Content-Encoding": "br"}))
    assert_json_error(*c.read_response(), 501)
    c.close()


def test_expect_100_continue(server):
    body, headers = add_sub_body("e")
    c = Conn(server)
    head = request("POST", "/v2/models/add_sub/infer", b"", {**headers, "Content-Length": str(len(body)),
                                                             "Expect": "100-continue"})
    c.send(head)
    status, _, _ = c.read_response()
    assert status == 100
    c.send(body)
    check_add_sub(*c.read_response(), "e")
    # a body over the limit is refused before it is sent
    c.send(request("POST", "/v2/models/add_sub/infer", b"", {"Content-Length": str(MAX_INPUT + 1),
                                                             "Expect": "100-continue"}))
    status, rheaders, rbody = c.read_response()
    if status == 100:  # pure aiohttp asks for the body first
        assert not LEAN
        c.send(b"\0" * (MAX_INPUT + 1))
        status, rheaders, rbody = c.read_response()
    assert_json_error(status, rheaders, rbody, 413)
    c.close()


# --------------------------------------------------------------------------- connection semantics
def test_http10_and_connection_close(server):
    c = Conn(server)
    c.send(infer_request("h10", version="1.0"))
    check_add_sub(*c.read_response(), "h10")
    assert c.closed_by_server()
    c.close()
    c = Conn(server)  # HTTP/1.0 keep-alive
    for i in range(2):
        c.send(infer_request(f"k{i}", version="1.0", headers={"Connection": "keep-alive"}))
        status, headers, body = c.read_response()
        check_add_sub(status, headers, body, f"k{i}")
        assert headers.get("connection", "").lower() == "keep-alive"
    c.close()
    for req in (infer_request("cc", headers={"Connection": "close"}),
                request("GET", "/v2/health/ready", headers={"Connection": "close"})):
        c = Conn(server)
        # nothing after Connection: close is served (pure aiohttp refuses the lot with a 400)
        c.send(req + (infer_request("never") if LEAN else b""))
        status, headers, _ = c.read_response()
        assert status == 200 and headers.get("connection", "").lower() == "close"
        assert c.closed_by_server() and c.buf == b""
        c.close()


@pytest.mark.skipif(not LEAN, reason="pure aiohttp closes on the client's half-close")
def test_half_closed_client_gets_its_answers(server):
    c = Conn(server)
    c.send(infer_request("a") + request("GET", "/v2/health/live") + infer_request("b"))
    c.sock.shutdown(socket.SHUT_WR)
    check_add_sub(*c.read_response(), "a")
    assert c.read_response()[0] == 200
    check_add_sub(*c.read_response(), "b")
    assert c.closed_by_server()
    c.close()


@pytest.mark.parametrize("raw,lean_status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /v2/models/add_sub/infer HTTP/9.9\r\n\r\n", 400),
    (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
], ids=["garbage", "bad-version", "bad-content-length", "length-and-chunked", "long-url", "long-header",
        "many-headers"])
def test_bad_requests_are_answered_and_closed(server, raw, lean_status):
    c = Conn(server)
    c.send(raw)
    status, headers, body = c.read_response()
    if LEAN:
        assert_json_error(status, headers, body, lean_status)
    else:  # aiohttp alone answers every request it cannot parse with 400, as text
        assert status == 400, body
    assert c.closed_by_server()
    c.close()
    assert_serving(server)


@pytest.mark.skipif(not LEAN, reason="the header timeout is the lean path's")
def test_slow_headers_time_out(server):
    c = Conn(server)
    c.send(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n")
    start = time.monotonic()
    for _ in range(3):  # trickling more header bytes does not reset the clock
        time.sleep(0.3)
        c.send(b"X-Slow: y\r\n")
    assert_json_error(*c.read_response(), 408)
    assert c.closed_by_server() and time.monotonic() - start < 5
    c.close()
    idle = Conn(server)  # a connection idle between requests is kept (keep-alive timeout)
    time.sleep(2.5)
    idle.send(infer_request("idle"))
    check_add_sub(*idle.read_response(), "idle")
    idle.close()


def test_client_that_stops_reading(server):
    """Pipelined 1 MiB responses nobody reads: the server stops reading too (the client's
    send blocks) instead of buffering them; other clients are served meanwhile."""
    n = 1 << 18  # FP32 elements: 1 MiB in, 1 MiB out
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n],
                       "parameters": {"binary_data_size": 4 * n}}], "parameters": {"binary_data_output": True}}
    header = json.dumps(doc).encode()
    one = request("POST", "/v2/models/identity_fp32/infer", header + bytes(4 * n),
                  {"Inference-Header-Content-Length": str(len(header))})
    c = Conn(server, timeout=3)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    rss0 = rss_kib(server.proc.pid)
    sent, blocked = 0, False
    try:
        for _ in range(200):  # 200 MiB of responses if nothing pushed back
            c.sock.sendall(one)
            sent += 1
    except socket.timeout:
        blocked = True
    assert blocked, f"sent {sent} MiB without the server pushing back"
    grown = (rss_kib(server.proc.pid) - rss0) / 1024
    assert grown < 64, f"front-end grew by {grown:.0f} MiB for a client that does not read"
    done = threading.Event()
    t = threading.Thread(target=lambda: (assert_serving(server), done.set()))
    t.start()
    t.join(30)
    assert done.is_set(), "another client was not served"
    c.sock.settimeout(30)  # reading again drains what was accepted, in order
    for _ in range(2):
        status, headers, body = c.read_response()
        assert status == 200 and len(body) == int(headers["inference-header-content-length"]) + 4 * n
    c.close()
    assert_serving(server)


def test_request_in_pieces(server):
    """Headers split mid-line and a body in several TCP segments, with pauses between."""
    data = infer_request("pieces")
    c = Conn(server)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for cut in (10, 40, 41, len(data) - 100, len(data) - 1):
        c.send(data[:cut])
        data = data[cut:]
        time.sleep(0.05)
    c.send(data)
    check_add_sub(*c.read_response(), "pieces")
    c.close()


def test_garbage_never_hangs_or_crashes(server):
    """Random bytes, corrupted and truncated requests, each followed by the client's half-close:
    every connection is answered or closed promptly, and the server logs no traceback."""
    rng = random.Random(13)
    valid = infer_request("fuzz")
    for i in range(60):
        if i % 3 == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        elif i % 3 == 1:
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(200)] = rng.randrange(256)
            data = bytes(data)
        else:
            data = valid[:rng.randrange(1, len(valid))]
        c = Conn(server, timeout=10)
        try:
            c.send(data)
            c.sock.shutdown(socket.SHUT_WR)
            while c._fill():
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            c.close()
        if c.buf:
            assert c.buf.startswith(b"HTTP/1."), c.buf[:100]
    assert_serving(server)
    if LEAN:
        assert "Traceback" not in server.log(), server.log()[-3000:]


# --------------------------------------------------------------------------- timeouts, in-process
class _Transport:
    """Records what the connection does to its transport."""

    def __init__(self):
        self.calls: list[str] = []
        self.written = b""
        self.closing = False

    def write(self, data):
        self.written += data

    def write_eof(self):
        self.calls.append("write_eof")

    def close(self):
        self.calls.append("close")
        self.closing = True

    def abort(self):
        self.calls.append("abort")
        self.closing = True

    def is_closing(self):
        return self.closing

    def can_write_eof(self):
        return True

    def pause_reading(self):
        self.calls.append("pause_reading")

    def resume_reading(self):
        self.calls.append("resume_reading")


def _with_connection(check) -> None:
    """Run ``check(conn, transport, now)`` on a lean connection with a 1 s header timeout and
    a 5 s keep-alive timeout, its clock driven by hand."""
    from triton_shm.frontend.http.lean import LeanConnection
    from triton_shm.frontend.http.lean_server import LeanContext

    async def main():
        ctx = LeanContext(None, MAX_INPUT, None, header_timeout=1.0, keepalive_timeout=5.0)
        conn, transport = LeanConnection(ctx), _Transport()
        conn.connection_made(transport)
        check(conn, transport, conn.since)
    asyncio.run(main())


@pytest.mark.skipif(not LEAN, reason="the lean connection's own timeouts")
def test_idle_and_stalled_connections_time_out():
    def idle(conn, t, now):
        conn.check_timeouts(now + 4.0)
        assert t.calls == []
        conn.check_timeouts(now + 6.0)  # idle past keep-alive: half-closed, then lingering
        assert t.calls == ["write_eof"] and t.written == b""
        conn.check_timeouts(now + 6.0 + 11.0)  # lingering past its limit
        assert t.calls[-1] == "abort"
    _with_connection(idle)

    def stalled_body(conn, t, now):
        conn.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789")
        conn.check_timeouts(conn.since + 2.0)  # past the header timeout, but the headers are in
        assert t.calls == []
        conn.check_timeouts(conn.since + 6.0)
        assert t.calls == ["write_eof"]
    _with_connection(stalled_body)

    def slow_headers(conn, t, now):
        conn.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n")
        conn.check_timeouts(conn.since + 2.0)
        assert t.written.startswith(b"HTTP/1.1 408 ") and t.calls == ["write_eof"]
    _with_connection(slow_headers)

    def never_reads(conn, t, now):
        conn.pause_writing()
        conn.check_timeouts(conn.since + 6.0)
        assert t.calls == ["abort"]
    _with_connection(never_reads)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_request_runs_without_a_task_on_asyncio_futures(run):
    """``LeanConnection._advance`` drives the request's coroutine by hand (no Task per
    request: about 1.4 µs less each). It relies on asyncio's Future protocol: awaiting a
    pending future yields the future itself, and sending into the coroutine once it is done
    returns its result; a bare yield (sleep(0)) yields None; a cancelled future raises
    CancelledError into the coroutine. This fails if asyncio changes any of it (the request
    would be answered 500, or never)."""
    from triton_shm.frontend.http.infer import InferReply
    from triton_shm.frontend.http.lean import INFER, NOTHING, LeanConnection
    from triton_shm.frontend.http.lean_request import Message
    from triton_shm.frontend.http.lean_server import LeanContext

    async def serve(first, second):
        a = await first
        await asyncio.sleep(0)
        b = await second
        return InferReply(body=a + b, content_type="application/octet-stream")

    async def settle():
        for _ in range(5):
            await asyncio.sleep(0)

    async def main():
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        probe = serve(first, second)
        assert probe.send(None) is first
        probe.close()

        ctx = LeanContext(None, MAX_INPUT, None, header_timeout=1.0, keepalive_timeout=5.0)
        conn, transport = LeanConnection(ctx), _Transport()
        conn.connection_made(transport)

        def start(coroutine) -> None:
            msg = Message()
            msg.keep_alive = True
            conn._serving = INFER
            conn._infer_run, conn._infer_msg, conn._infer_request = coroutine, msg, None
            conn._advance()

        first, second = loop.create_future(), loop.create_future()
        start(serve(first, second))
        first.set_result(b"ab")
        await settle()
        assert transport.written == b""  # past the bare yield, waiting on the second future
        second.set_result(b"cd")
        await settle()
        assert transport.written.startswith(b"HTTP/1.1 200 ") and transport.written.endswith(b"\r\n\r\nabcd")
        assert conn._serving is NOTHING and conn._infer_run is None

        transport.written = b""
        first, second = loop.create_future(), loop.create_future()
        start(serve(first, second))
        first.cancel()  # ends it unanswered, as it would end a Task
        await settle()
        assert transport.written == b"" and transport.calls == []
    run(main())
