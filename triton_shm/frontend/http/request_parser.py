"""The lean connection's request parser: llhttp with C callbacks (one Python call per
message) when built, else its twin over httptools (one per parser event).

Set ``TRITON_SHM_NO_EXTENSIONS=1`` to force the twin (the parser tests run both).
"""
from __future__ import annotations

from ...core.data.codec import NO_EXTENSIONS
from .request_parser_py import BODY, HEADERS, IDLE, ParserSink, RequestParser, RequestUpgrade

USING_EXTENSION = False
if not NO_EXTENSIONS:
    try:
        from ._request_parser import RequestParser  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    except ImportError:  # not built: the twin serves
        pass

__all__ = ["BODY", "HEADERS", "IDLE", "USING_EXTENSION", "ParserSink", "RequestParser", "RequestUpgrade"]
