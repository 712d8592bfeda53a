"""The HTTP/2 gRPC hot path of ``triton-shm perf`` (perf/grpc_h2.py) against a scripted
HTTP/2 peer on 127.0.0.1, for the frames a real server may send that the tests against
our own server do not provoke: PING (must be acknowledged), a header block split over
CONTINUATION frames, padded DATA, a trailers-only error, RST_STREAM and GOAWAY. (Normal
calls, errors, 16 MiB messages under flow control and a server going away mid-run are
covered against the real server in test_perf.py.)"""
from __future__ import annotations

import asyncio
import struct

import hpack
import pytest

from triton_shm.perf.grpc_h2 import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING,
                                     PREFACE, RST_STREAM, SETTINGS, GrpcCallError, GrpcH2Client, H2Error, _frame)

pytestmark = pytest.mark.timeout(30)


def _read_frames(buf: bytearray) -> list[tuple[int, int, int, bytes]]:
    frames = []
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            break
        frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big"), bytes(buf[9:9 + n])))
        del buf[:9 + n]
    return frames


async def _peer(script):
    """Serve one connection: check the preface, send SETTINGS, then for each request stream
    run ``script(stream, encoder)`` and write the frames it returns. Records what it got."""
    seen: list[tuple[int, int, int, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(PREFACE)) == PREFACE
        writer.write(_frame(SETTINGS, 0, 0))
        encoder, buf = hpack.Encoder(), bytearray()
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buf += data
            for frame in _read_frames(buf):
                seen.append(frame)
                kind, flags, stream, _ = frame
                if kind == DATA and flags & END_STREAM:
                    writer.write(script(stream, encoder))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def _grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def _call(script, calls: int = 1):
    async def main():
        server, port, seen = await _peer(script)
        client = GrpcH2Client("127.0.0.1", port)
        results = []
        try:
            for _ in range(calls):
                try:
                    results.append(await asyncio.wait_for(client.unary("/pkg.Svc/Method", b"request"), 5))
                except (GrpcCallError, H2Error) as e:
                    results.append(e)
        finally:
            client.close()
            server.close()
        return results, seen
    return asyncio.run(main())


def test_ping_continuation_and_padding():
    def script(stream, enc):
        block = enc.encode([(":status", "200"), ("content-type", "application/grpc")])
        body = _grpc_message(b"response")
        padded = bytes((3,)) + body + b"\0\0\0"
        return (_frame(PING, 0, 0, b"12345678")
                + _frame(HEADERS, 0, stream, block[:2]) + _frame(CONTINUATION, END_HEADERS, stream, block[2:])
                + _frame(DATA, PADDED, stream, padded)
                + _frame(HEADERS, END_HEADERS | END_STREAM, stream, enc.encode([("grpc-status", "0")])))
    results, seen = _call(script, calls=3)  # the same blocks again: the decoded-block cache
    assert results == [b"response"] * 3
    assert (PING, 1, 0, b"12345678") in seen                       # the PING was acknowledged
    assert any(kind == SETTINGS and flags == 1 for kind, flags, _, _ in seen)  # and the SETTINGS


def test_trailers_only_error_is_decoded():
    def script(stream, enc):
        return _frame(HEADERS, END_HEADERS | END_STREAM, stream, enc.encode(
            [(":status", "200"), ("grpc-status", "3"), ("grpc-message", "bad%20input: shape")]))
    (result,), _ = _call(script)
    assert isinstance(result, GrpcCallError) and result.code == 3 and result.message == "bad input: shape"


def test_rst_stream_fails_the_call():
    (result,), _ = _call(lambda stream, enc: _frame(RST_STREAM, 0, stream, struct.pack(">I", 2)))
    assert isinstance(result, GrpcCallError) and "reset the stream" in result.message


def test_goaway_fails_the_call_and_the_next_one_reconnects():
    answered = []

    def script(stream, enc):
        answered.append(stream)
        if len(answered) == 1:
            return _frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0) + b"shutting down")
        return (_frame(HEADERS, END_HEADERS, stream, enc.encode([(":status", "200")]))
                + _frame(DATA, 0, stream, _grpc_message(b"ok"))
                + _frame(HEADERS, END_HEADERS | END_STREAM, stream, enc.encode([("grpc-status", "0")])))
    results, _ = _call(script, calls=2)
    assert isinstance(results[0], H2Error) and "GOAWAY: shutting down" in str(results[0])
    assert results[1] == b"ok"
    assert answered == [1, 1]  # the second call went out on a new connection


def test_nothing_listening():
    async def main():
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with pytest.raises(H2Error, match="cannot open"):
            await GrpcH2Client("127.0.0.1", port).unary("/pkg.Svc/Method", b"")
    asyncio.run(main())
