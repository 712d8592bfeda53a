"""Which restricted-API group an HTTP request path belongs to, and the check itself.

The groups are tritonserver's, decided by the path alone (not the method: a GET on an
infer URL is refused as inference, as tritonserver does). A path that is no API of any
group is left to the router (404). Every request on the HTTP port passes one of two
checks: :func:`restriction_middleware` for what aiohttp serves (every route, the
generate extension included), and the lean connection's before it serves an infer
request (``lean.py``). Both classify with :func:`api_group`; aiohttp's check runs on
``rel_url.path_safe``, the string its router matches, so check and route cannot disagree.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import orjson
from aiohttp import web

from ..restricted import Restrictions

_MODEL = r"/v2/models/[^/]+(?:/versions/[0-9]+)?"
_SHM = r"/v2/(?:system|cuda)sharedmemory"

# In tritonserver's order: "/v2/models/stats" is statistics before it could be a model's metadata.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), g) for p, g in (
    (r"/v2/health/(?:live|ready)", "health"),
    (r"/v2", "metadata"),
    (r"/v2/models/stats", "statistics"),
    (_MODEL, "metadata"),
    (_MODEL + r"/ready", "health"),
    (_MODEL + r"/config", "model-config"),
    (_MODEL + r"/stats", "statistics"),
    (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
    (r"/v2/models/[^/]+/trace/setting", "trace"),
    (r"/v2/repository/index", "model-repository"),
    (r"/v2/repository/models/[^/]+/(?:load|unload)", "model-repository"),
    (_SHM + r"(?:/region/[^/]+)?/(?:status|register|unregister)", "shared-memory"),
    (r"/v2/trace/setting", "trace"),
    (r"/v2/logging", "logging"),
))


def api_group(path: str) -> str | None:
    """The group of a request path (no query string), or None for a path of no API."""
    for pattern, group in _PATTERNS:
        if pattern.fullmatch(path):
            return group
    return None


def refusal_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _header_lookup(request: web.Request) -> Any:
    def lookup(name: str) -> bytes | None:
        value = request.headers.get(name)  # the first occurrence, case-insensitive
        return None if value is None else value.encode("utf-8", "surrogateescape")
    return lookup


def restriction_middleware(restrictions: Restrictions, group_of: Callable[[str], str | None] = api_group) -> Any:
    """aiohttp middleware: 403 ``{"error": ...}`` for a restricted API without its header.
    ``group_of`` maps a path to its group (the metrics port: every path is "metrics")."""
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        refusal = restrictions.refusal(group_of(request.rel_url.path_safe), _header_lookup(request))
        if refusal is not None:
            return web.Response(status=403, body=refusal_body(refusal), content_type="application/json")
        return await handler(request)
    return check
