"""The native gRPC transport against a running server: abusive HTTP/2 peers (raw frames,
built with hyperframe and hpack from the h2 package) each get the protocol's answer and
leave the server serving everyone else; then clients of every kind, compression,
deadlines, cancellation and 16 MiB messages both ways."""
from __future__ import annotations

import asyncio
import gzip
import os
import socket
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import ngh2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from hpack import Decoder, Encoder
from hpack.struct import NeverIndexedHeaderTuple
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_shm._twins import NO_EXTENSIONS
from triton_shm.frontend.grpc.native.server import RECEIVE_BUFFER, NativeServer
from triton_shm.frontend.grpc.rpc import Mailbox

from .conftest import build_core_repository
from .harness import ServerProcess
from .models import write_model
from .helpers import assert_serving

pytestmark = pytest.mark.timeout(120)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x1, 0x7, 0x8, 0x9, 0xB
MAX_STREAMS = 1000  # what the server advertises

SLEEPY_CONFIG = """
    name: "sleepy"
    backend: "python"
    max_batch_size: 0
    input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "SECONDS_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """
SLEEPY_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "SECONDS").as_numpy()
            time.sleep(float(t[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SECONDS_OUT", t)]))
        return out
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_native")
    repo = build_core_repository(root / "models")
    write_model(repo, "sleepy", config=SLEEPY_CONFIG, model_py=SLEEPY_PY)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--grpc-transport", "native"]).start()
    yield srv
    srv.stop_cleanly()


def identity_inputs(values: np.ndarray) -> list:
    inp = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    inp.set_data_from_numpy(values)
    return [inp]


def infer_message() -> bytes:
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    body = req.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


class RawH2:
    """A client speaking HTTP/2 frame by frame, so a test can misbehave precisely."""

    def __init__(self, server, settings: dict[int, int] | None = None, handshake: bool = True):
        host, port = server.grpc_url.split(":")
        deadline = time.monotonic() + 10
        while True:  # the gRPC port opens a moment after HTTP reports ready
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=10)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.buf = b""
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.eof = False
        if handshake:
            self.send(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def header_block(self, path: str = INFER_PATH, extra: list[tuple[str, str]] = ()) -> bytes:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]
        # never indexed: the same block can be sent again and again
        return self.encoder.encode([NeverIndexedHeaderTuple(k, v) for k, v in headers])

    def headers(self, stream_id: int, end_stream: bool = False, **kw) -> bytes:
        flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream else [])
        return HeadersFrame(stream_id, data=self.header_block(**kw), flags=flags).serialize()

    def call(self, stream_id: int, message: bytes, **kw) -> None:
        chunks = [message[i:i + 16384] for i in range(0, len(message), 16384)] or [b""]
        self.send(self.headers(stream_id, **kw) + b"".join(
            DataFrame(stream_id, data=c, flags=["END_STREAM"] if i == len(chunks) - 1 else []).serialize()
            for i, c in enumerate(chunks)))

    def frames(self, timeout: float = 10.0):
        """Frames as they arrive, until EOF or ``timeout``; SETTINGS are acknowledged."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(self.buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buf[9:9 + length]))
                self.buf = self.buf[9 + length:]
                if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                    self.send(SettingsFrame(0, flags=["ACK"]).serialize())
                if isinstance(frame, HeadersFrame):  # our frames are small: no CONTINUATION
                    frame.headers = {
                        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                        for k, v in self.decoder.decode(frame.data)
                    }
                yield frame
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                return
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                return
            self.buf += data

    def wait_for(self, predicate, timeout: float = 10.0):
        for frame in self.frames(timeout):
            if predicate(frame):
                return frame
        return None

    def close(self) -> None:
        self.sock.close()


def stream_headers(conn: RawH2, stream_id: int, timeout: float = 10.0) -> dict[str, str]:
    """Every header of ``stream_id``'s response until it ends (trailers included)."""
    out: dict[str, str] = {}
    for f in conn.frames(timeout):
        if f.stream_id != stream_id:
            continue
        if isinstance(f, HeadersFrame):
            out.update(f.headers)
        if "END_STREAM" in getattr(f, "flags", ()) or isinstance(f, RstStreamFrame):
            break
    return out


# -- abusive peers ---------------------------------------------------------------------------
def test_raw_client_gets_an_answer(server):
    conn = RawH2(server)
    conn.call(1, infer_message())
    assert stream_headers(conn, 1)["grpc-status"] == "0"
    conn.close()


def test_more_streams_than_advertised_are_refused(server):
    """Before the client has acknowledged our SETTINGS the excess stream is refused
    (RST_STREAM REFUSED_STREAM, retryable); once it has, exceeding the limit it knows
    is a protocol error that ends the connection (GOAWAY PROTOCOL_ERROR)."""
    early = RawH2(server, handshake=False)
    early.send(PREFACE + SettingsFrame(0).serialize()
               + b"".join(early.headers(1 + 2 * i) for i in range(MAX_STREAMS + 1)))
    rst = early.wait_for(lambda f: isinstance(f, (RstStreamFrame, GoAwayFrame)))
    assert isinstance(rst, RstStreamFrame) and rst.stream_id == 1 + 2 * MAX_STREAMS
    assert rst.error_code == REFUSED_STREAM
    assert_serving(server)
    early.close()  # the open calls are cancelled with the connection

    late = RawH2(server)
    settings = late.wait_for(lambda f: isinstance(f, SettingsFrame) and "ACK" not in f.flags)
    assert settings.settings[SettingsFrame.MAX_CONCURRENT_STREAMS] == MAX_STREAMS
    late.send(b"".join(late.headers(1 + 2 * i) for i in range(MAX_STREAMS + 1)))
    goaway = late.wait_for(lambda f: isinstance(f, GoAwayFrame))
    assert goaway is not None and goaway.error_code == PROTOCOL_ERROR
    late.close()
    assert_serving(server)


def test_rapid_reset_is_bounded_and_goaway(server):
    conn = RawH2(server)
    conn.wait_for(lambda f: isinstance(f, SettingsFrame))
    message = infer_message()
    burst = b"".join(conn.headers(sid) + DataFrame(sid, data=message, flags=["END_STREAM"]).serialize()
                     + RstStreamFrame(sid, error_code=CANCEL).serialize() for sid in range(1, 6001, 2))
    try:
        conn.send(burst)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may hang up before it has read everything
    goaway = conn.wait_for(lambda f: isinstance(f, GoAwayFrame))
    assert goaway is not None and goaway.error_code != 0
    assert_serving(server)
    conn.close()


def test_continuation_flood_closes_connection(server):
    conn = RawH2(server)
    block = conn.header_block()
    frames = HeadersFrame(1, data=block[:10]).serialize()
    frames += b"".join(ContinuationFrame(1, data=b"").serialize() for _ in range(200))
    try:
        conn.send(frames)
    except (BrokenPipeError, ConnectionResetError):
        pass
    list(conn.frames(5))
    assert conn.eof, "the server kept a CONTINUATION flood open"
    assert_serving(server)


def test_oversized_header_block_is_refused(server):
    conn = RawH2(server)
    block = conn.header_block(extra=[("x-big", "a" * 100_000)])
    chunks = [block[i:i + 16384] for i in range(0, len(block), 16384)]
    frames = HeadersFrame(1, data=chunks[0]).serialize()
    for i, chunk in enumerate(chunks[1:], 1):
        frames += ContinuationFrame(1, data=chunk, flags=["END_HEADERS"] if i == len(chunks) - 1 else []).serialize()
    try:
        conn.send(frames)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = conn.wait_for(lambda f: isinstance(f, (GoAwayFrame, RstStreamFrame)), timeout=5)
    assert answer is not None or conn.eof, "an oversized header block was accepted"
    assert_serving(server)
    conn.close()


@pytest.mark.parametrize("kind", ["ping", "settings"])
def test_control_frame_flood_gets_goaway(server, kind):
    conn = RawH2(server)
    conn.wait_for(lambda f: isinstance(f, SettingsFrame))
    frame = (PingFrame(0, opaque_data=b"12345678") if kind == "ping" else SettingsFrame(0, settings={})).serialize()
    try:
        conn.send(frame * 3000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    goaways = [f for f in conn.frames(5) if isinstance(f, GoAwayFrame)]
    assert [g.error_code for g in goaways] == [ENHANCE_YOUR_CALM]  # one GOAWAY, then the rest is dropped
    assert conn.eof
    assert_serving(server)
    conn.close()


def test_a_whole_read_of_control_frames_stays_under_the_engines_cap():
    """A read is fed to the engine whole: one full of the smallest control frames (empty
    SETTINGS, 9 bytes) must not trip the engine's cap on unsent acknowledgements (a fatal
    error, the connection dropped without a word) before our limit can answer GOAWAY."""
    native = NativeServer([], max_message_bytes=1 << 20)
    h2 = ngh2.Connection(ngh2.Role.SERVER, native.h2_config)
    h2.initiate_connection(native.settings)
    h2.receive_data(PREFACE + SettingsFrame(0).serialize())
    h2.receive_data(SettingsFrame(0, settings={}).serialize() * (RECEIVE_BUFFER // 9))
    assert sum(isinstance(e, ngh2.SettingsReceived) for e in h2.events()) == RECEIVE_BUFFER // 9 + 1


def test_mailbox_keeps_order_and_survives_a_cancelled_get():
    """The FIFO between a stream's reader and its handler (and the stream's replies)."""
    async def main() -> None:
        box = Mailbox()
        waiting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        waiting.cancel()  # a handler cancelled while it waits for the next message
        with pytest.raises(asyncio.CancelledError):
            await waiting
        box.put_nowait(1)
        box.put_nowait(None)
        assert box.qsize() == 2
        assert [await box.get(), await box.get()] == [1, None]
        getter = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        box.put_nowait(3)  # wakes the waiting consumer
        assert await getter == 3 and box.qsize() == 0
    asyncio.run(main())


def test_message_over_the_limit_is_resource_exhausted(server):
    conn = RawH2(server)
    # the prefix claims 2 GiB (over INT32_MAX): refused before any body is buffered
    conn.send(conn.headers(1) + DataFrame(1, data=b"\x00\x80\x00\x00\x00").serialize())
    status = stream_headers(conn, 1)
    assert status["grpc-status"] == "8", status
    assert "larger than max" in status["grpc-message"]
    conn.call(3, infer_message())  # the connection goes on
    assert stream_headers(conn, 3)["grpc-status"] == "0"
    conn.close()
    assert_serving(server)


def test_truncated_message_is_internal(server):
    conn = RawH2(server)
    conn.call(1, infer_message()[:3])  # inside the prefix
    status = stream_headers(conn, 1)
    assert status["grpc-status"] == "13" and "truncated" in status["grpc-message"], status
    conn.call(3, infer_message()[:20])  # inside the body
    status = stream_headers(conn, 3)
    assert status["grpc-status"] == "13" and "truncated" in status["grpc-message"], status
    conn.close()
    assert_serving(server)


def test_unary_request_framing(server):
    """A unary call's one request message in any DATA frames; anything else is INTERNAL."""
    conn = RawH2(server)
    message = infer_message()

    def data(sid: int, payload: bytes, end: bool = False) -> bytes:
        return DataFrame(sid, data=payload, flags=["END_STREAM"] if end else []).serialize()

    # one message cut inside its prefix and inside its body: served
    conn.send(conn.headers(1) + data(1, message[:2]) + data(1, message[2:9]) + data(1, message[9:], end=True))
    assert stream_headers(conn, 1)["grpc-status"] == "0"
    more = "more than one request message on a unary call"
    # a second whole message in a payload of its own, and two in one payload
    conn.send(conn.headers(3) + data(3, message) + data(3, message, end=True))
    assert stream_headers(conn, 3) == {":status": "200", "content-type": "application/grpc",
                                       "grpc-accept-encoding": "identity,deflate,gzip",
                                       "grpc-status": "13", "grpc-message": more}  # trailers-only
    conn.send(conn.headers(5) + data(5, message + message, end=True))
    assert stream_headers(conn, 5)["grpc-message"] == more
    # a whole message, then the start of another: the request ends inside a message
    conn.send(conn.headers(7) + data(7, message) + data(7, message[:9], end=True))
    status = stream_headers(conn, 7)
    assert status["grpc-status"] == "13", status
    assert status["grpc-message"] == "request ended inside a message (truncated gRPC message)"
    # no message at all: END_STREAM on an empty DATA frame, or on the HEADERS
    conn.send(conn.headers(9) + data(9, b"", end=True))
    assert stream_headers(conn, 9)["grpc-message"] == "unary call ended without a request message"
    conn.send(conn.headers(11, end_stream=True))
    assert stream_headers(conn, 11)["grpc-message"] == "unary call ended without a request message"
    conn.close()
    assert_serving(server)


def test_unknown_method_and_not_grpc(server):
    conn = RawH2(server)
    conn.call(1, infer_message(), path="/inference.GRPCInferenceService/NoSuchThing")
    assert stream_headers(conn, 1)["grpc-status"] == "12"
    conn.send(HeadersFrame(3, data=conn.encoder.encode([
        (":method", "GET"), (":scheme", "http"), (":path", INFER_PATH), (":authority", "t")]),
        flags=["END_HEADERS", "END_STREAM"]).serialize())
    assert stream_headers(conn, 3)[":status"] == "405"
    conn.close()


def test_content_type_and_te(server):
    """Served without content-type (as gRPC's C core serves it); another content-type is 415.
    Without te: trailers refused as gRPC's C core (Triton 2.51) refuses it: trailers-only
    UNKNOWN "Missing :te header" (HTTP 200); a te other
    than trailers is a malformed request (RST_STREAM PROTOCOL_ERROR, RFC 9113 8.2.2; the C core
    resets "Trailers" too)."""
    conn = RawH2(server)
    start = [(":method", "POST"), (":scheme", "http"), (":path", INFER_PATH), (":authority", "test")]

    def call(sid: int, headers: list[tuple[str, str]]) -> None:
        block = conn.encoder.encode([NeverIndexedHeaderTuple(k, v) for k, v in start + headers])
        conn.send(HeadersFrame(sid, data=block, flags=["END_HEADERS"]).serialize()
                  + DataFrame(sid, data=infer_message(), flags=["END_STREAM"]).serialize())

    answered = {":status": "200", "content-type": "application/grpc", "grpc-status": "0"}
    for sid, headers in ((1, [("te", "trailers")]), (3, [("content-type", "application/grpc"), ("te", "trailers")]),
                         (5, [("content-type", "application/grpc+proto"), ("te", "trailers")])):
        call(sid, headers)
        got = stream_headers(conn, sid)
        assert {k: got.get(k) for k in answered} == answered, (headers, got)
    refused = {":status": "200", "content-type": "application/grpc", "grpc-status": "2",
               "grpc-message": "Missing :te header"}
    for sid, headers in ((7, [("content-type", "application/grpc")]), (9, [])):
        call(sid, headers)
        head = conn.wait_for(lambda f, sid=sid: f.stream_id == sid)
        assert isinstance(head, HeadersFrame) and "END_STREAM" in head.flags, head  # trailers-only
        assert {k: head.headers.get(k) for k in refused} == refused, (headers, head.headers)
    call(11, [("content-type", "text/plain"), ("te", "trailers")])
    assert stream_headers(conn, 11) == {":status": "415"}
    for sid, te in ((13, "gzip"), (15, "Trailers")):
        call(sid, [("content-type", "application/grpc"), ("te", te)])
        reset = conn.wait_for(lambda f, sid=sid: f.stream_id == sid and isinstance(f, RstStreamFrame))
        assert reset is not None and reset.error_code == PROTOCOL_ERROR, te
    conn.close()
    assert_serving(server)


def test_malformed_header_block_ends_connection(server):
    conn = RawH2(server)
    conn.wait_for(lambda f: isinstance(f, SettingsFrame))
    conn.send(HeadersFrame(1, data=b"\xff\xff\xff\xff\xff", flags=["END_HEADERS"]).serialize())
    goaway = conn.wait_for(lambda f: isinstance(f, GoAwayFrame), timeout=5)
    assert goaway is not None and goaway.error_code == COMPRESSION_ERROR
    conn.close()
    assert_serving(server)


def test_compressed_request_gets_compressed_reply(server):
    conn = RawH2(server)
    body = gzip.compress(infer_message()[5:])
    conn.call(1, b"\x01" + struct.pack(">I", len(body)) + body,
              extra=[("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity,gzip")])
    headers, data = {}, b""
    for f in conn.frames():
        if f.stream_id == 1 and isinstance(f, HeadersFrame):
            headers.update(f.headers)
        elif f.stream_id == 1 and isinstance(f, DataFrame):
            data += f.data
        if f.stream_id == 1 and "END_STREAM" in getattr(f, "flags", ()):
            break
    assert headers["grpc-status"] == "0" and headers["grpc-encoding"] == "gzip", headers
    assert data[0] == 1  # the compressed flag
    reply = service_pb2.ModelInferResponse.FromString(gzip.decompress(data[5:]))
    assert reply.raw_output_contents[0] == np.arange(4, dtype=np.float32).tobytes()
    conn.call(3, b"\x01" + struct.pack(">I", len(body)) + body, extra=[("grpc-encoding", "br")])
    assert stream_headers(conn, 3)["grpc-status"] == "12"  # UNIMPLEMENTED: an encoding we do not speak
    conn.close()


def test_zero_window_holds_response_without_blocking_others(server):
    conn = RawH2(server, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0})
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1 << 18])
    req.raw_input_contents.append(bytes(1 << 20))
    body = req.SerializeToString()
    # past the default 64 KiB windows: wait for the server's larger ones
    conn.wait_for(lambda f: isinstance(f, WindowUpdateFrame) and f.stream_id == 0)
    conn.call(1, b"\x00" + struct.pack(">I", len(body)) + body)
    got = list(conn.frames(1.0))
    assert any(isinstance(f, HeadersFrame) and f.stream_id == 1 for f in got)
    assert not any(isinstance(f, DataFrame) and f.stream_id == 1 and f.data for f in got)
    assert_serving(server)
    # opening the window lets the response through
    conn.send(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 22}).serialize()
              + WindowUpdateFrame(0, window_increment=1 << 22).serialize())
    received = 0
    for f in conn.frames(10):
        if isinstance(f, DataFrame) and f.stream_id == 1:
            received += len(f.data)
            conn.send(WindowUpdateFrame(0, window_increment=len(f.data)).serialize() if f.data else b"")
        if isinstance(f, HeadersFrame) and "END_STREAM" in f.flags:
            break
    assert received > 1 << 20
    conn.close()


def test_slow_reader_is_held_by_backpressure(server):
    """A client that opens big windows and then stops reading: its responses wait (the
    transport pauses, the engine holds the rest) while others are served; once it reads
    again every response arrives whole."""
    conn = RawH2(server, settings={SettingsFrame.INITIAL_WINDOW_SIZE: (1 << 31) - 1})
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    conn.wait_for(lambda f: isinstance(f, WindowUpdateFrame) and f.stream_id == 0)
    conn.send(WindowUpdateFrame(0, window_increment=(1 << 31) - 1 - 65535).serialize())
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1 << 20])
    req.raw_input_contents.append(bytes(4 << 20))
    body = req.SerializeToString()
    message = b"\x00" + struct.pack(">I", len(body)) + body
    streams = [1, 3, 5, 7]
    for sid in streams:
        conn.call(sid, message)
    time.sleep(1.0)  # not reading: 16 MiB of answers against a 64 KiB receive buffer
    assert_serving(server)
    ended, received = set(), 0
    for f in conn.frames(30):
        if isinstance(f, DataFrame):
            received += len(f.data)
        if isinstance(f, HeadersFrame) and "END_STREAM" in f.flags:
            assert f.headers.get("grpc-status") == "0", f.headers
            ended.add(f.stream_id)
            if ended == set(streams):
                break
    assert ended == set(streams) and received > 4 * (4 << 20)
    conn.close()


def test_idle_and_slow_clients_do_not_block_others(server):
    idle = RawH2(server, handshake=False)
    slow = RawH2(server, handshake=False)
    slow.send(PREFACE[:5])  # a preface that never finishes
    assert_serving(server)
    if not NO_EXTENSIONS:  # once is enough: it waits for the timeout
        list(idle.frames(15))
        assert idle.eof, "a client that never sent its preface was kept open"
    idle.close()
    slow.close()


# -- clients -------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_both_ways(server, algorithm):
    x = np.random.default_rng(0).random(4096, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        result = c.infer("identity_fp32", identity_inputs(x), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_16_mib_both_ways(server):
    x = np.random.default_rng(1).random(4 << 20, dtype=np.float32)  # 16 MiB
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", identity_inputs(x)).as_numpy("OUTPUT0"), x)


def test_16_mib_calls_on_parallel_connections_keep_their_own_data(server):
    """Connections share the server's receive buffer: large messages read in turns over
    several connections must each arrive (and come back) intact."""
    values = [np.random.default_rng(seed).random((4 << 20) + 1, dtype=np.float32) for seed in range(3)]  # 16 MiB + 4 B

    def call(x: np.ndarray) -> np.ndarray:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            return c.infer("identity_fp32", identity_inputs(x)).as_numpy("OUTPUT0")

    with ThreadPoolExecutor(len(values)) as pool:
        results = list(pool.map(call, values))
    for x, y in zip(values, results):
        np.testing.assert_array_equal(y, x)


def test_large_frames_cut_anywhere_between_reads_arrive_whole(server):
    """A large DATA frame that a read cuts is kept back until its end arrives: cut inside a
    frame header (byte by byte through one), just after one, inside a payload and exactly
    at a frame's end, over frames of several sizes, the message arrives (and comes back)
    byte for byte, and the connection serves the next call."""
    x = np.random.default_rng(7).random(150_000, dtype=np.float32)  # 600 kB
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[x.size])
    req.raw_input_contents.append(x.tobytes())
    body = req.SerializeToString()
    message = b"\x00" + struct.pack(">I", len(body)) + body
    conn = RawH2(server, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 24})
    conn.send(WindowUpdateFrame(0, window_increment=1 << 24).serialize())
    # the server's SETTINGS (64 KiB frames) are acknowledged before any DATA is sent
    assert conn.wait_for(lambda f: isinstance(f, SettingsFrame) and "ACK" not in f.flags)
    wire, starts, pos, sizes = conn.headers(1), [], 0, (65536, 20000, 65536, 17000, 1000)
    while pos < len(message):
        chunk = message[pos:pos + sizes[len(starts) % len(sizes)]]
        pos += len(chunk)
        starts.append(len(wire))
        wire += DataFrame(1, data=chunk, flags=["END_STREAM"] if pos == len(message) else []).serialize()
    assert len(starts) >= 12
    cuts = sorted({starts[1] + 3, starts[2] + 9, starts[3] + 9 + 30000, starts[5], starts[6] + 40000,
                   *range(starts[8] + 1, starts[8] + 9), starts[10] + 9 + 100})
    for a, b in zip([0, *cuts], [*cuts, len(wire)]):
        conn.send(wire[a:b])
        time.sleep(0.02)  # so that the server reads the pieces apart
    data, status = b"", {}
    for f in conn.frames():
        if f.stream_id == 1 and isinstance(f, DataFrame):
            data += f.data
        elif f.stream_id == 1 and isinstance(f, HeadersFrame):
            status.update(f.headers)
            if "END_STREAM" in f.flags:
                break
    assert status["grpc-status"] == "0", status
    reply = service_pb2.ModelInferResponse.FromString(data[5:])
    assert reply.raw_output_contents[0] == x.tobytes()
    conn.call(3, infer_message())
    assert stream_headers(conn, 3)["grpc-status"] == "0"
    conn.close()
    assert_serving(server)


def sleepy_inputs(seconds: float) -> list:
    inp = grpcclient.InferInput("SECONDS", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return [inp]


def test_deadline_exceeded(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            c.infer("sleepy", sleepy_inputs(2.0), client_timeout=0.3)
        assert "DEADLINE_EXCEEDED" in str(e.value.status())
        assert time.monotonic() - t0 < 1.5
        assert c.infer("sleepy", sleepy_inputs(0.0)).as_numpy("SECONDS_OUT")[0] == 0.0


def test_aio_client_and_cancellation(server):
    async def main():
        async with aiogrpcclient.InferenceServerClient(server.grpc_url) as c:
            assert await c.is_server_ready()
            slow = asyncio.ensure_future(c.infer("sleepy", sleepy_inputs(1.0)))
            await asyncio.sleep(0.2)
            slow.cancel()  # RST_STREAM: the server cancels the request
            with pytest.raises(asyncio.CancelledError):
                await slow
            x = np.arange(8, dtype=np.float32)
            results = await asyncio.gather(*(c.infer("identity_fp32", identity_inputs(x)) for _ in range(32)))
            for r in results:
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    asyncio.run(main())
    assert_serving(server)


def sleepy_message(seconds: float) -> bytes:
    req = service_pb2.ModelInferRequest(model_name="sleepy")
    req.inputs.add(name="SECONDS", datatype="FP32", shape=[1])
    req.raw_input_contents.append(np.array([seconds], dtype=np.float32).tobytes())
    body = req.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def sleepy_executions(server) -> int:
    import json
    import urllib.request
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/sleepy/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]["execution_count"]


def test_reset_cancels_the_queued_request(server):
    """RST_STREAM on a call still waiting in the scheduler: it never reaches the model."""
    with grpcclient.InferenceServerClient(server.grpc_url) as c:  # queued behind whatever still runs
        c.infer("sleepy", sleepy_inputs(0.0))
    before = sleepy_executions(server)
    conn = RawH2(server)
    conn.call(1, sleepy_message(0.5))  # runs on the one instance
    conn.call(3, sleepy_message(0.5))  # held by the instance's worker, next to run
    time.sleep(0.1)
    conn.call(5, sleepy_message(0.5))  # waits in the scheduler's queue
    time.sleep(0.1)
    conn.send(RstStreamFrame(5, error_code=CANCEL).serialize())
    assert stream_headers(conn, 1)["grpc-status"] == "0"
    assert stream_headers(conn, 3)["grpc-status"] == "0"
    time.sleep(0.8)  # long enough for the third call to have run, had it not been cancelled
    assert sleepy_executions(server) == before + 2
    conn.close()


def test_plain_grpcio_stubs_and_health(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
        md = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="identity_fp32"))
        assert md.inputs[0].name == "INPUT0"
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="no_such_model"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"") == b"\x08\x01"  # SERVING
        stream = stub.ModelStreamInfer(iter([service_pb2.ModelInferRequest(
            model_name="identity_fp32", inputs=[service_pb2.ModelInferRequest.InferInputTensor(
                name="INPUT0", datatype="FP32", shape=[2])],
            raw_input_contents=[np.ones(2, np.float32).tobytes()])] * 3))
        replies = list(stream)
        assert len(replies) == 3 and all(not r.error_message for r in replies)


def test_perf_analyzer_streaming(server, perf_analyzer):
    args = ["-m", "identity_fp32", "-u", server.grpc_url, "-i", "grpc", "--streaming", "--shape", "INPUT0:16",
            "--concurrency-range", "4", "--measurement-interval", "1000", "--max-trials", "5",
            "--stability-percentage", "80"]
    for _attempt in range(3):  # a loaded machine can miss the stability window: measure again
        proc = perf_analyzer.run(*args, timeout=90)
        if proc.returncode == 0 or "Failed to obtain stable measurement" not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0 and "Throughput" in proc.stdout, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_max_connection_age_and_ping_policy(tmp_path):
    """--grpc-max-connection-age: GOAWAY after the age, clients reconnect and go on;
    --grpc-http2-max-ping-strikes: pings with no data in between get GOAWAY too_many_pings."""
    repo = build_core_repository(tmp_path / "models")
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--grpc-transport", "native", "--grpc-max-connection-age", "700", "--grpc-max-connection-age-grace", "500",
        "--grpc-http2-max-ping-strikes", "1"]).start()
    try:
        conn = RawH2(srv)
        t0 = time.monotonic()
        goaway = conn.wait_for(lambda f: isinstance(f, GoAwayFrame), timeout=5)
        assert goaway is not None and goaway.error_code == 0 and 0.5 < time.monotonic() - t0 < 2
        conn.close()
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            for _ in range(3):
                x = np.arange(4, dtype=np.float32)
                np.testing.assert_array_equal(c.infer("identity_fp32", identity_inputs(x)).as_numpy("OUTPUT0"), x)
                time.sleep(0.4)
        pinger = RawH2(srv)
        pinger.send(PingFrame(0, opaque_data=b"12345678").serialize() * 3)  # strikes 1 and 2: past the limit of 1
        goaway = pinger.wait_for(lambda f: isinstance(f, GoAwayFrame), timeout=5)
        assert (
            goaway is not None
            and goaway.error_code == ENHANCE_YOUR_CALM
            and b"too_many_pings" in goaway.additional_data
        )
        pinger.close()
    finally:
        srv.stop_cleanly()


def test_shutdown_finishes_in_flight_calls(tmp_path):
    """SIGTERM: GOAWAY to every connection, the call in flight still gets its answer,
    and the server exits cleanly."""
    repo = build_core_repository(tmp_path / "models")
    write_model(repo, "sleepy", config=SLEEPY_CONFIG, model_py=SLEEPY_PY)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--grpc-transport", "native"]).start()
    try:
        async def main():
            async with aiogrpcclient.InferenceServerClient(srv.grpc_url) as c:
                assert await c.is_server_live()
                call = asyncio.ensure_future(c.infer("sleepy", sleepy_inputs(1.0)))
                await asyncio.sleep(0.3)
                srv.proc.terminate()
                result = await call
                assert result.as_numpy("SECONDS_OUT")[0] == 1.0
        asyncio.run(main())
    finally:
        srv.stop_cleanly()


# -- gRPC framing, no server ---------------------------------------------------------------------
def test_message_reader_splits_and_bounds():
    from triton_shm.frontend.grpc.native.framing import RESOURCE_EXHAUSTED, GrpcError, MessageReader
    wire = b"".join(b"\x00" + struct.pack(">I", len(m)) + m for m in (b"abc", b"", b"x" * 70000))
    for step in (1, 3, 7, 16384, len(wire)):  # any split across DATA frames
        reader = MessageReader(1 << 20, b"identity")
        got = [m for i in range(0, len(wire), step) for m in reader.feed(wire[i:i + step])]
        assert got == [b"abc", b"", b"x" * 70000] and not reader.pending
    reader = MessageReader(10, b"identity")
    with pytest.raises(GrpcError) as e:
        reader.feed(b"\x00\x00\x00\x00\x0b")  # 11 bytes declared: refused from the prefix alone
    assert e.value.code == RESOURCE_EXHAUSTED
    reader = MessageReader(10, b"identity")
    reader.feed(b"\x00\x00\x00")
    assert reader.pending  # a truncated prefix is seen at end of stream


@pytest.mark.parametrize("twin", ["frames_py", "_frames"])
def test_whole_frames_end(twin):
    import importlib
    frames = importlib.import_module(f"triton_shm.frontend.grpc.native.{twin}")
    wire = memoryview(SettingsFrame(0).serialize() + DataFrame(1, data=b"x" * 300).serialize()
                      + PingFrame(0, opaque_data=b"12345678").serialize())
    ends = [9, 9 + 309, 9 + 309 + 17]
    assert frames.whole_frames_end(wire, 0, len(wire)) == len(wire)
    for end in range(len(wire) + 1):  # every cut: the start of the frame it falls in
        assert frames.whole_frames_end(wire, 0, end) == max([0] + [e for e in ends if e <= end])
    assert frames.whole_frames_end(wire, 9, len(wire)) == len(wire)
    assert frames.whole_frames_end(wire, 0, len(wire) + 100) == len(wire)  # never past the buffer


def test_receive_buffers_are_bounded_and_reused():
    from triton_shm.frontend.grpc.native.connection import ReceiveBuffers
    pool = ReceiveBuffers(1000, limit=2)
    a, b = pool.take(), pool.take()
    assert a is not None and b is not None and len(a) == 1000
    assert pool.take() is None  # past the limit a connection keeps nothing back
    pool.give(a)
    assert pool.take() is a


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_compression_round_trip_and_bomb(encoding):
    from triton_shm.frontend.grpc.native.framing import RESOURCE_EXHAUSTED, GrpcError, MessageReader, compress
    body = compress(b"hello" * 1000, encoding)
    reader = MessageReader(1 << 20, encoding)
    assert reader.feed(b"\x01" + struct.pack(">I", len(body)) + body) == [b"hello" * 1000]
    bomb = compress(bytes(50 << 20), encoding)  # 50 MiB of zeros in ~50 KiB
    reader = MessageReader(1 << 20, encoding)
    with pytest.raises(GrpcError) as e:
        reader.feed(b"\x01" + struct.pack(">I", len(bomb)) + bomb)
    assert e.value.code == RESOURCE_EXHAUSTED


def test_timeout_and_message_text():
    from triton_shm.frontend.grpc.native.framing import encode_message_text, parse_timeout
    assert parse_timeout(b"100m") == pytest.approx(0.1)
    assert parse_timeout(b"2S") == 2.0 and parse_timeout(b"1H") == 3600.0
    for bad in (b"", b"m", b"123456789S", b"10x", b"-1S"):
        with pytest.raises(ValueError):
            parse_timeout(bad)
    assert encode_message_text("plain text") == b"plain text"
    assert encode_message_text("50% é\n") == b"50%25 %C3%A9%0A"


def test_tls_requires_alpn_h2(tmp_path):
    """The native server behind TLS (what the security work plugs in): ALPN must pick h2."""
    import ssl
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    from triton_shm.frontend.grpc.native.server import NativeServer
    from triton_shm.frontend.grpc.rpc import Method, raw_bytes

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)

    async def echo(request: bytes) -> bytes:
        return request

    async def main():
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        server = NativeServer([Method("/t.T/Echo", echo, serialize=raw_bytes)], max_message_bytes=1 << 20)
        await server.start("127.0.0.1", 0, ssl=server_ctx)

        async def frames_after_preface(alpn: list[str]) -> bytes:
            ctx = ssl.create_default_context(cafile=str(cert))
            ctx.set_alpn_protocols(alpn)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx,
                                                          server_hostname="localhost")
            writer.write(PREFACE + SettingsFrame(0).serialize())
            try:
                return await asyncio.wait_for(reader.read(9), 5)
            finally:
                writer.close()

        head = await frames_after_preface(["h2"])
        assert head[3] == 0x4  # the server's SETTINGS frame
        assert await frames_after_preface(["http/1.1"]) == b""  # closed: not h2
        await server.stop(1)
    asyncio.run(main())


@pytest.mark.parametrize("switches, expected", [
    ({}, "lean native"), ({"TRITON_SHM_NO_EXTENSIONS": "1"}, "lean native"),
    ({"TRITON_SHM_FALLBACK_TRANSPORTS": "1"}, "aiohttp grpcio"),
    ({"TRITON_SHM_FALLBACK_TRANSPORTS": "0"}, "lean native"),
])
def test_default_transports(switches, expected):
    """The lean HTTP path and the native gRPC server by default, the twins' run included;
    the fallbacks only under their own switch."""
    code = ("from triton_shm.frontend.transports import default_grpc_transport; "
            "from triton_shm.frontend.http.app import default_http_transport; "
            "print(default_http_transport(), default_grpc_transport())")
    switch_names = ("TRITON_SHM_NO_EXTENSIONS", "TRITON_SHM_FALLBACK_TRANSPORTS")
    env = {k: v for k, v in os.environ.items() if k not in switch_names}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, **switches})
    assert out.stdout.strip() == expected
