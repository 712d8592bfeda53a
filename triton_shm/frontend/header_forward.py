"""``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: request headers
whose name the pattern matches (anywhere in the name, as RE2's PartialMatch) become string
parameters of the inference request. A header named like one of the parameters the server
reads itself (Triton's reserved keys), or starting with ``triton_``, is refused, as in Triton.

Without the flag nothing here runs: the front-ends hold ``None`` instead of a forwarder.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

from ..core.data.types import RESERVED_PARAMETERS
from ..errors import InvalidArgument

# Triton's words for a request parameter (HTTP) starting with "triton_".
RESERVED_PREFIX_ERROR = ("parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                         "specified.")


class HeaderForward:
    """One front-end's pattern."""

    def __init__(self, pattern: str):
        try:
            self.regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"invalid header forward pattern '{pattern}': {e}") from None

    def parameters(self, headers: Iterable[tuple[str, str]], into: dict) -> dict:
        """``into`` with the matching headers added as parameters (a new dict when any
        match; ``into`` itself is never changed). Raises for a reserved name."""
        search = self.regex.search
        out = into
        for name, value in headers:
            if search(name) is None:
                continue
            if name in RESERVED_PARAMETERS or name.startswith("triton_"):
                raise InvalidArgument(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            if out is into:
                out = dict(into)
            out[name] = value
        return out


# What HTTP/2 itself carries in a gRPC call's headers, never its metadata.
_GRPC_TRANSPORT = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})


def call_metadata(headers: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[str, str]]:
    """A gRPC call's metadata among its HTTP/2 headers (no pseudo or transport headers)."""
    for name, value in headers:
        key = name.decode("latin-1")
        if key[:1] != ":" and key not in _GRPC_TRANSPORT:
            yield key, value.decode("latin-1")


def forwarder(pattern: str | None) -> HeaderForward | None:
    """The forwarder of a flag's value (None: no flag, nothing forwarded)."""
    return HeaderForward(pattern) if pattern else None
