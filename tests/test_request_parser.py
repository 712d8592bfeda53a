"""The lean connection's request parsers, both of them (llhttp with C callbacks, and the
httptools twin): what they hand the connection, every refusal, and a pipelined stream
split at every byte boundary. End to end, tests/test_http_lean.py covers the connection."""
from __future__ import annotations

import pytest

from triton_shm.frontend.http import request_parser, request_parser_py
from triton_shm.frontend.http.lean_request import MAX_FIELD, MAX_HEADERS, MAX_URL, HttpLimit, Message

PARSERS = [pytest.param(request_parser_py.RequestParser, id="httptools")]
if request_parser.USING_EXTENSION:
    PARSERS.append(pytest.param(request_parser.RequestParser, id="llhttp-c"))

MAX_INPUT = 1000
INFER = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
         b"Inference-Header-Content-Length: 5\r\nAccept-Encoding: gzip\r\nContent-Length: 9\r\n\r\n{\"a\":1}xy")
GET = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = (b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Encoding: deflate\r\n\r\n"
           b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
HTTP10 = b"GET /v2 HTTP/1.0\r\n\r\n"


class Sink:
    """Records what the parser hands the connection, as (event, message)."""

    def __init__(self, refuse: str | None = None):
        self.events: list[tuple[str, Message]] = []
        self.refuse = refuse

    def headers_complete(self, msg: Message) -> None:
        self.events.append(("headers", msg))
        if self.refuse is not None:
            msg.refusal = self.refuse

    def body_too_large(self, msg: Message) -> None:
        self.events.append(("too_large", msg))

    def message_complete(self, msg: Message) -> None:
        self.events.append(("complete", msg))


def parse(cls, data: bytes, *, hook: bool = False, sink: Sink | None = None, pieces: int = 1):
    sink = sink or Sink()
    parser = cls(sink, MAX_INPUT, hook)
    step = max(1, len(data) // pieces)
    for i in range(0, len(data), step):
        parser.feed_data(data[i:i + step])
    return parser, sink


def refusal(cls, data: bytes) -> HttpLimit:
    with pytest.raises(HttpLimit) as e:
        parse(cls, data)
    return e.value


def summary(msg: Message) -> tuple:
    return (msg.method, msg.url, msg.version, msg.keep_alive, msg.body, msg.size, msg.header_length,
            msg.content_encoding, msg.accept_encoding, msg.expect_continue, msg.error, msg.refusal)


@pytest.mark.parametrize("cls", PARSERS)
def test_one_call_per_message_with_the_fields_the_lean_path_reads(cls):
    parser, sink = parse(cls, INFER)
    assert [e for e, _ in sink.events] == ["complete"]
    msg = sink.events[0][1]
    assert summary(msg) == (b"POST", b"/v2/models/add_sub/infer", "1.1", True, b'{"a":1}xy', 9, "5", None, "gzip",
                            False, None, None)
    assert msg.headers == [(b"Host", b"x"), (b"Content-Type", b"application/octet-stream"),
                           (b"Inference-Header-Content-Length", b"5"), (b"Accept-Encoding", b"gzip"),
                           (b"Content-Length", b"9")]
    assert parser.msg is None and parser.state == request_parser.IDLE and parser.began


@pytest.mark.parametrize("cls", PARSERS)
def test_a_complete_message_carries_its_infer_route(cls):
    versioned = INFER.replace(b"/add_sub/infer", b"/add_sub/versions/3/infer?x=1")
    _, sink = parse(cls, INFER + versioned + GET + INFER.replace(b"/infer", b"/ready"))
    routes = [m.route for _, m in sink.events]
    assert [(r.model, r.version) for r in routes[:2]] == [("add_sub", ""), ("add_sub", "3")]
    assert routes[2:] == [None, None]
    _, sink = parse(cls, INFER)
    assert sink.events[0][1].route is routes[0]  # made once per request target


@pytest.mark.parametrize("cls", PARSERS)
def test_headers_hook_and_a_refusal_drops_the_body(cls):
    _, sink = parse(cls, INFER, hook=True, sink=Sink(refuse="no"))
    assert [e for e, _ in sink.events] == ["headers", "complete"]
    msg = sink.events[1][1]
    assert msg.refusal == "no" and msg.body == b"" and msg.size == 0


@pytest.mark.parametrize("cls", PARSERS)
def test_state_while_reading(cls):
    sink = Sink()
    parser = cls(sink, MAX_INPUT, False)
    parser.feed_data(INFER[:10])
    assert parser.state == request_parser.HEADERS and parser.began and parser.msg is not None
    parser.feed_data(INFER[10:-3])
    assert parser.state == request_parser.BODY and not parser.began and parser.msg.size == 6
    parser.feed_data(INFER[-3:])
    assert parser.state == request_parser.IDLE and not parser.began and sink.events[0][1].body == b'{"a":1}xy'


@pytest.mark.parametrize("cls", PARSERS)
def test_chunked_body_http10_and_connection_close(cls):
    _, sink = parse(cls, CHUNKED + HTTP10)
    (_, chunked), (_, old) = sink.events
    assert summary(chunked) == (b"POST", b"/v2/models/m/infer", "1.1", True, b"abcde", 5, None, "deflate", None,
                                False, None, None)
    assert (old.version, old.keep_alive) == ("1.0", False)
    _, sink = parse(cls, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert sink.events[0][1].keep_alive is False
    _, sink = parse(cls, b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert sink.events[0][1].keep_alive is True


@pytest.mark.parametrize("cls", PARSERS)
def test_expect_continue_calls_back_at_the_headers(cls):
    data = b"POST /v2/models/m/infer HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab"
    _, sink = parse(cls, data)
    assert [e for e, _ in sink.events] == ["headers", "complete"]
    assert sink.events[0][1].expect_continue and sink.events[1][1].body == b"ab"


@pytest.mark.parametrize("cls", PARSERS)
def test_body_limits(cls):
    declared = f"POST /x HTTP/1.1\r\nContent-Length: {MAX_INPUT + 1}\r\n\r\n".encode() + b"z" * (MAX_INPUT + 1)
    _, sink = parse(cls, declared)
    assert [e for e, _ in sink.events] == ["headers", "complete"]
    msg = sink.events[0][1]
    assert msg.error == (413, f"Maximum request body size {MAX_INPUT} exceeded.") and msg.body == b""
    chunk = b"%x\r\n%s\r\n" % (MAX_INPUT // 2 + 1, b"z" * (MAX_INPUT // 2 + 1))
    streamed = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3 + b"0\r\n\r\n"
    _, sink = parse(cls, streamed, pieces=7)
    assert [e for e, _ in sink.events] == ["too_large", "complete"]
    msg = sink.events[0][1]
    assert msg.error == (413, f"Maximum request body size {MAX_INPUT} exceeded.") and msg.body == b""


@pytest.mark.parametrize("cls", PARSERS)
def test_limits_on_the_head(cls):
    long_url = b"GET /" + b"a" * MAX_URL + b" HTTP/1.1\r\n\r\n"
    e = refusal(cls, long_url)
    assert (e.status, e.message) == (414, f"request line is longer than {MAX_URL} bytes")
    long_field = b"GET / HTTP/1.1\r\nX-Big: " + b"v" * MAX_FIELD + b"\r\n\r\n"
    e = refusal(cls, long_field)
    assert (e.status, e.message) == (431, f"a header field is longer than {MAX_FIELD} bytes")
    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n"
    e = refusal(cls, many)
    assert (e.status, e.message) == (431, f"more than {MAX_HEADERS} header fields")
    at_limits = (b"GET /" + b"a" * (MAX_URL - 1) + b" HTTP/1.1\r\n"
                 + b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS - 1))
                 + b"X-Big: " + b"v" * (MAX_FIELD - 5) + b"\r\n\r\n")
    _, sink = parse(cls, at_limits, pieces=5)
    assert len(sink.events[0][1].headers) == MAX_HEADERS


@pytest.mark.parametrize("cls", PARSERS)
@pytest.mark.parametrize("data, reason", [
    (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", "Invalid character in Content-Length"),
    (b"GET / HTTP/9.9\r\n\r\n", "Invalid HTTP version"),
    (b"BREW / HTTP/1.1\r\n\r\n", "Invalid method encountered"),
    (b"GET / HTTP/1.1\r\nBad Header: v\r\n\r\n", "Invalid header token"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "Invalid character in chunk size"),
    (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Duplicate Content-Length"),
])
def test_malformed_requests_carry_llhttps_reason(cls, data, reason):
    e = refusal(cls, data)
    assert (e.status, e.message) == (400, f"malformed HTTP request: {reason}")


@pytest.mark.parametrize("cls", PARSERS)
def test_upgrade_is_raised_after_its_message(cls):
    sink = Sink()
    parser = cls(sink, MAX_INPUT, False)
    with pytest.raises(request_parser.RequestUpgrade):
        parser.feed_data(b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nrest")
    assert [(e, m.url) for e, m in sink.events] == [("complete", b"/")]


@pytest.mark.parametrize("cls", PARSERS)
def test_a_sink_error_comes_out_of_feed_data(cls):
    class Failing(Sink):
        def message_complete(self, msg: Message) -> None:
            raise KeyError("bug")

    with pytest.raises(KeyError):
        cls(Failing(), MAX_INPUT, False).feed_data(GET)


@pytest.mark.parametrize("cls", PARSERS)
def test_pipelined_stream_split_at_every_byte(cls):
    stream = INFER + GET + CHUNKED + INFER
    _, whole = parse(cls, stream)
    expected = [summary(m) for _, m in whole.events]
    assert len(expected) == 4
    for cut in range(1, len(stream)):
        for second in (cut + 1, len(stream)):
            sink = Sink()
            parser = cls(sink, MAX_INPUT, False)
            for piece in (stream[:cut], stream[cut:second], stream[second:]):
                parser.feed_data(piece)
            assert [summary(m) for _, m in sink.events] == expected, cut
            assert [m.headers for _, m in sink.events] == [m.headers for _, m in whole.events], cut


@pytest.mark.parametrize("cls", PARSERS)
def test_empty_values_trailers_and_buffers(cls):
    data = (b"GET / HTTP/1.1\r\nX-E:\r\nHost: a\r\n\r\n"
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-T: 1\r\n\r\n")
    sink = Sink()
    parser = cls(sink, MAX_INPUT, False)
    parser.feed_data(memoryview(data)[:30])
    parser.feed_data(bytearray(data[30:]))
    assert [m.headers for _, m in sink.events] == [[(b"X-E", b""), (b"Host", b"a")],
                                                   [(b"Transfer-Encoding", b"chunked"), (b"X-T", b"1")]]
    assert sink.events[1][1].body == b"a"
