"""The lean connection's request parser over httptools (llhttp with a Python call per
event): the pure-Python twin of :mod:`._request_parser`, same interface and refusals.

A parser reads one connection's bytes into :class:`.lean_request.Message` objects and tells
its sink (the connection) only what the sink acts on:

- ``headers_complete(msg)``: the headers are in and the message is refused already (413 by
  Content-Length), asks ``Expect: 100-continue``, or ``headers_hook`` was set (the
  restricted-API check). Setting ``msg.error`` or ``msg.refusal`` there drops the body.
- ``body_too_large(msg)``: the body outgrew ``max_input_size``; the rest is dropped.
- ``message_complete(msg)``: the message is whole: its ``body`` is set, and its ``route``
  (:func:`.lean_request.infer_route`) when it is a POST.

``feed_data`` raises :class:`.lean_request.HttpLimit` for a request over a limit or malformed
(400 with llhttp's reason) and :class:`RequestUpgrade` after a message asking for an
upgrade; any other exception is a bug of the sink's. ``state`` (IDLE, HEADERS, BODY) and
``began`` (a message began during the last ``feed_data``) are what the timeouts read.
"""
from __future__ import annotations

import httptools  # the [twins] extra: the C parser needs no httptools

from .lean_request import (BODY, FIELDS, HEADERS, IDLE, MAX_FIELD, MAX_HEADERS, MAX_URL, ROUTES, Field, HttpLimit,
                           Message, ParserSink, RequestUpgrade, infer_route, too_large_message)

_OTHER, _HEADER_LENGTH, _CONTENT_LENGTH = Field.OTHER, Field.HEADER_LENGTH, Field.CONTENT_LENGTH
_CONTENT_ENCODING, _ACCEPT_ENCODING = Field.CONTENT_ENCODING, Field.ACCEPT_ENCODING


class RequestParser:
    def __init__(self, sink: ParserSink, max_input_size: int, headers_hook: bool):
        self._sink = sink
        self._max_input_size = max_input_size
        self._headers_hook = headers_hook
        self._parser = httptools.HttpRequestParser(self)
        self.msg: Message | None = None
        self._parts: list[bytes] = []  # the body so far
        self.state = IDLE
        self.began = False

    def feed_data(self, data: bytes) -> None:
        self.began = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise RequestUpgrade() from None
        except httptools.HttpParserCallbackError as e:
            raise (e.__context__ or e) from None  # the callback's own: a limit, or a bug
        except httptools.HttpParserError as e:
            raise HttpLimit(400, f"malformed HTTP request: {e}") from None

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.msg = Message()
        self._parts = []
        self.state = HEADERS
        self.began = True

    def on_url(self, url: bytes) -> None:
        msg = self.msg
        assert msg is not None  # llhttp calls back only between message begin and complete
        msg.url += url
        if len(msg.url) > MAX_URL:
            raise HttpLimit(414, f"request line is longer than {MAX_URL} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        msg = self.msg
        assert msg is not None
        headers = msg.headers
        headers.append((name, value))
        if len(name) + len(value) > MAX_FIELD or len(headers) > MAX_HEADERS:
            raise HttpLimit(431, f"a header field is longer than {MAX_FIELD} bytes"
                            if len(name) + len(value) > MAX_FIELD else f"more than {MAX_HEADERS} header fields")
        field = FIELDS.get(name) or FIELDS.get(name.lower())
        if field is None or field is _OTHER:
            return
        if field is _HEADER_LENGTH:
            msg.header_length = value.decode("latin-1")
        elif field is _CONTENT_LENGTH:
            try:
                declared = int(value)
            except ValueError:
                return  # llhttp refuses it
            if declared > self._max_input_size:
                msg.error = (413, too_large_message(self._max_input_size))
        elif field is _CONTENT_ENCODING:
            msg.content_encoding = value.decode("latin-1")
        elif field is _ACCEPT_ENCODING:
            msg.accept_encoding = value.decode("latin-1")
        elif value.lower() == b"100-continue":
            msg.expect_continue = True

    def on_headers_complete(self) -> None:
        msg = self.msg
        assert msg is not None
        parser = self._parser
        msg.method = parser.get_method()
        msg.version = parser.get_http_version()
        msg.keep_alive = parser.should_keep_alive()
        self.state = BODY
        if msg.error is not None or msg.expect_continue or self._headers_hook:
            self._sink.headers_complete(msg)

    def on_body(self, chunk: bytes) -> None:
        msg = self.msg
        assert msg is not None
        if msg.error is not None or msg.refusal is not None:
            return  # read and dropped, so the answer can follow
        msg.size += len(chunk)
        if msg.size > self._max_input_size:
            msg.error = (413, too_large_message(self._max_input_size))
            self._parts.clear()
            self._sink.body_too_large(msg)
            return
        self._parts.append(chunk)

    def on_message_complete(self) -> None:
        msg, self.msg = self.msg, None
        assert msg is not None
        parts = self._parts
        if parts:
            msg.body = parts[0] if len(parts) == 1 else b"".join(parts)
            self._parts = []
        if msg.method == b"POST":
            url = msg.url
            msg.route = ROUTES[url] if url in ROUTES else infer_route(msg.method, url)
        self.state = IDLE
        self._sink.message_complete(msg)
