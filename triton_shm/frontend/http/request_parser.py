"""The lean connection's request parser: llhttp with C callbacks (one Python call per
message) when built, else its twin over httptools (one per parser event; ``_twins``).

The twin is imported only when it serves: the C path needs no httptools (the ``twins``
extra). ``AVAILABLE`` says whether either parser can serve; without one, aiohttp alone
serves HTTP.
"""
from __future__ import annotations

import importlib.util

from ..._twins import pick
from .lean_request import BODY, HEADERS, IDLE, ParserSink, RequestUpgrade

__all__ = ["AVAILABLE", "BODY", "HEADERS", "IDLE", "USING_EXTENSION", "ParserSink", "RequestParser",
           "RequestUpgrade"]

USING_EXTENSION = pick(globals(), "._request_parser", "RequestParser")
AVAILABLE = USING_EXTENSION or importlib.util.find_spec("httptools") is not None
if not USING_EXTENSION and AVAILABLE:
    from .request_parser_py import RequestParser
