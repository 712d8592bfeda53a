"""Content-Encoding of HTTP bodies: request inflation under a cap, response compression.

Shared by the aiohttp handlers and the lean infer path so both treat bodies alike.
"""
from __future__ import annotations

import zlib

from ...errors import InvalidArgument, Unsupported

_WBITS = {"gzip": 31, "deflate": 15}  # gzip framing; zlib framing (what aiohttp sends for deflate)


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The request body with its Content-Encoding undone (gzip or deflate), at most ``limit`` bytes."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        return inflate(body, limit)
    if encoding not in ("", "identity"):
        raise Unsupported(f"unsupported Content-Encoding '{encoding}'")
    return body


def inflate(body: bytes, limit: int) -> bytes:
    """Decompress with a cap on the output size (decompression bombs)."""
    d = zlib.decompressobj(wbits=47)  # 32 + 15: auto-detect gzip or zlib framing
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise InvalidArgument(f"failed to decompress the request body: {e}") from None
    if len(out) > limit:
        raise InvalidArgument(f"decompressed request body exceeds the limit of {limit} bytes")
    if not d.eof:
        raise InvalidArgument("failed to decompress the request body: truncated stream")
    return out


def accepted_coding(header: str | None) -> str | None:
    """"gzip" or "deflate" if the client accepts it (q=0 means refused); else None."""
    if not header:
        return None
    accepted = set()
    for part in header.split(","):
        token, _, params = part.strip().partition(";")
        q = params.strip()
        if q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"):
            continue
        accepted.add(token.strip().lower())
    if "gzip" in accepted:
        return "gzip"
    if "deflate" in accepted:
        return "deflate"
    return None


def compress(body: bytes, coding: str) -> bytes:
    c = zlib.compressobj(wbits=_WBITS[coding])
    return c.compress(body) + c.flush()
