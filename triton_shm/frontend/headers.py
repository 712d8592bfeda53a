"""Request headers as both native transports (lean HTTP/1.1, native gRPC) hand them over:
raw ``(name, value)`` byte pairs, names as the client spelt them (HTTP/2 sends them lower case)."""
from __future__ import annotations

from typing import Iterable


def first_header(headers: Iterable[tuple[bytes, bytes]], name: str) -> bytes | None:
    """The first value of header ``name`` (lower case) in raw (name, value) pairs."""
    wanted = name.encode("latin-1")
    for n, v in headers:
        if len(n) == len(wanted) and n.lower() == wanted:
            return v
    return None
