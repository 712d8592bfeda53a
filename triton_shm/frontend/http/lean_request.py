"""What the lean connection knows of one request: its parsed form, the infer route, the
limits it is held to, and the head of its response."""
from __future__ import annotations

import enum
import re
from http import HTTPStatus
from typing import Protocol

import orjson

from .common_shape import RouteCodec

# Limits as aiohttp's parser has them, so a request the lean parser accepts is one the
# bridge can hand on.
MAX_URL = 8190
MAX_FIELD = 8190
MAX_HEADERS = 128

# Path only (no query): percent-escapes, "." and ".." segments and anything else go to
# aiohttp, whose router decides them exactly as before.
_INFER_PATH = re.compile(rb"/v2/models/([^/%]+)(?:/versions/(\d+))?/infer")
_DOT_SEGMENTS = (b".", b"..")
ROUTES: dict[bytes, RouteCodec | None] = {}  # request target -> infer route, POST only
_MAX_ROUTES = 1024
_MAX_CACHED_URL = 256
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_STATUS_LINES = {status: f"HTTP/1.1 {status} {reason}\r\nDate: " for status, reason in _REASONS.items()}


class Field(enum.Enum):
    """The request header fields the lean path reads."""
    HEADER_LENGTH = b"inference-header-content-length"
    CONTENT_ENCODING = b"content-encoding"
    ACCEPT_ENCODING = b"accept-encoding"
    CONTENT_LENGTH = b"content-length"
    EXPECT = b"expect"
    OTHER = b""  # a field every client sends that the lean path does not read


# Field name -> field, lower case and as clients usually spell it (saves a lower() a field).
_READ = [f for f in Field if f is not Field.OTHER]
FIELDS = {**{f.value: f for f in _READ}, **{f.value.title(): f for f in _READ},
          **dict.fromkeys([b"Host", b"host", b"Accept", b"accept", b"User-Agent", b"Content-Type", b"Connection"],
                          Field.OTHER)}


class HttpLimit(Exception):
    """A request over a limit, raised from a parser callback (it stops the parser)."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


# A parser's ``state``, what the timeouts read: between messages, in the headers, in the body.
IDLE, HEADERS, BODY = 0, 1, 2


class RequestUpgrade(Exception):
    """The message parsed last asks for a protocol upgrade (or is a CONNECT)."""


class ParserSink(Protocol):
    """What a request parser (``request_parser``: C, or the httptools twin) tells the connection."""

    def headers_complete(self, msg: "Message") -> None: ...
    def body_too_large(self, msg: "Message") -> None: ...
    def message_complete(self, msg: "Message") -> None: ...


class Message:
    """One parsed request."""

    __slots__ = ("method", "url", "version", "headers", "body", "size", "keep_alive", "route",
                 "error", "refusal", "header_length", "content_encoding", "accept_encoding", "expect_continue")

    def __init__(self) -> None:
        self.method = b""
        self.version = "1.1"
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""  # set once the message is complete (empty when its body is dropped)
        self.size = 0
        self.route: RouteCodec | None = None  # the infer route (model, version), set once complete
        self.error: tuple[int, str] | None = None  # answered instead of served, then closed
        self.refusal: str | None = None  # a restricted API without its header: 403, body dropped
        self.header_length: str | None = None
        self.content_encoding: str | None = None
        self.accept_encoding: str | None = None
        self.expect_continue = False
        self.keep_alive = False


def infer_route(method: bytes, url: bytes) -> RouteCodec | None:
    """The infer route a request target names, made once per target (a client sends the
    same few again and again): the parsers look it up in ``ROUTES`` first (a miss calls this)."""
    if method != b"POST":
        return None
    try:
        return ROUTES[url]
    except KeyError:
        pass
    route = _infer_route(url)
    if len(url) <= _MAX_CACHED_URL:
        if len(ROUTES) >= _MAX_ROUTES:
            ROUTES.clear()
        ROUTES[url] = route
    return route


def _infer_route(url: bytes) -> RouteCodec | None:
    path = url.split(b"?", 1)[0]
    m = _INFER_PATH.fullmatch(path)
    if m is None or m.group(1) in _DOT_SEGMENTS:
        return None
    try:
        model = m.group(1).decode()
    except UnicodeDecodeError:
        return None
    version = m.group(2)
    return RouteCodec(model, version.decode() if version else "")



def too_large_message(max_input_size: int) -> str:
    return f"Maximum request body size {max_input_size} exceeded."  # aiohttp's words


def held_bytes(msg: Message) -> int:
    return msg.size if msg.error is None and msg.refusal is None else 0  # a refused body is dropped


def url_path(url: bytes) -> str:
    """The path of a request target, as the restricted-API groups are matched on."""
    return url.split(b"?", 1)[0].decode("latin-1")


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


_CLOSE = "Connection: close\r\n"
_KEEP_ALIVE = "Connection: keep-alive\r\n"
CONNECTION_LINES = {_CLOSE: _CLOSE.encode(), _KEEP_ALIVE: _KEEP_ALIVE.encode(), "": b""}


def connection_line(msg: Message) -> str:
    """The response's Connection header: close is said, keep-alive only to HTTP/1.0."""
    if not msg.keep_alive or msg.error is not None:
        return _CLOSE
    return _KEEP_ALIVE if msg.version == "1.0" else ""


def response_head(msg: Message, status: int, content_type: str, length: int, headers: dict[str, str] | None,
                  date: str) -> bytes:
    extra = ""
    if headers:
        for k, v in headers.items():
            extra += f"{k}: {v}\r\n"
    extra += connection_line(msg)
    start = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Error\r\nDate: "
    return f"{start}{date}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n{extra}\r\n".encode("latin-1")


def timeout_message() -> Message:
    msg = Message()
    msg.error = (408, "timed out waiting for the request headers")
    return msg
