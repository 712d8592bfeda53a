"""The HTTP/1.1 hot path of ``triton-shm perf`` (perf/http1.py) against real sockets: the
response framings servers use (Content-Length, chunked, Connection: close), reuse of
keep-alive connections, and the failures it must report instead of hanging (a server
that closes mid-response, a malformed status line, nothing listening)."""
from __future__ import annotations

import asyncio

import pytest

from triton_shm.perf.http1 import Http1Client, HttpConnectionError

pytestmark = pytest.mark.timeout(30)


async def _serve(answers: list[bytes]):
    """A TCP server on 127.0.0.1 that reads one request per answer and writes the answer
    (bytes after a NUL are written after a pause; an answer ending in NUL closes the socket)."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
            await reader.readexactly(length)
            answer = answers.pop(0)
            first, _, rest = answer.partition(b"\0")
            writer.write(first)
            await writer.drain()
            if rest or answer.endswith(b"\0"):
                await asyncio.sleep(0.05)
                writer.write(rest)
                if answer.endswith(b"\0"):
                    writer.close()
                    return
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


def _run(answers: list[bytes], requests: int) -> tuple[list, int]:
    async def main():
        server, port, connections = await _serve(answers)
        client = Http1Client(f"127.0.0.1:{port}")
        req = client.request_bytes("/v2/models/m/infer", b"{}", {"Content-Type": "application/json"})
        results = []
        try:
            for _ in range(requests):
                try:
                    results.append(await asyncio.wait_for(client.send(req), 5))
                except HttpConnectionError as e:
                    results.append(e)
        finally:
            client.close()
            server.close()
        return results, len(connections)
    return asyncio.run(main())


def test_content_length_responses_reuse_one_connection():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    results, connections = _run([ok, ok[:30] + b"\0" + ok[30:], ok], 3)
    assert results == [(200, b"hello")] * 3
    assert connections == 1


def test_chunked_response_with_trailers():
    chunked = (b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n\0" b"6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    results, _ = _run([chunked], 1)
    assert results == [(400, b"hello world")]


def test_connection_close_opens_a_new_connection():
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    results, connections = _run([closing, closing], 2)
    assert results == [(200, b"ok")] * 2
    assert connections == 2


def test_server_closing_mid_response_is_an_error_not_a_hang():
    results, _ = _run([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial\0"], 1)
    assert isinstance(results[0], HttpConnectionError)


def test_malformed_status_line_is_an_error():
    results, _ = _run([b"SPDY nonsense\r\n\r\n"], 1)
    assert isinstance(results[0], HttpConnectionError) and "malformed" in str(results[0])


def test_nothing_listening():
    async def main():
        import socket
        with socket.socket() as s:  # a port that was free a moment ago
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = Http1Client(f"127.0.0.1:{port}")
        with pytest.raises(HttpConnectionError, match="cannot connect"):
            await client.send(client.request_bytes("/", b"", {}))
    asyncio.run(main())


def test_https_urls_are_refused_clearly():
    with pytest.raises(ValueError, match="only http://"):
        Http1Client("https://127.0.0.1:8000")
