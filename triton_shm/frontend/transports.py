"""Which transport serves each protocol.

HTTP: ``lean`` (the infer route parsed in C by llhttp, aiohttp serving every other route on
the same port) or ``aiohttp`` alone. gRPC: ``native`` (our HTTP/2 server on libnghttp2) or
``grpcio`` (grpc.aio). The first of each is the default; ``--http-transport`` and
``--grpc-transport`` pick per server, and ``TRITON_SHM_FALLBACK_TRANSPORTS=1`` makes the
fallbacks the default (a whole run of the suite over them). This switch is independent of
``TRITON_SHM_NO_EXTENSIONS`` (``_twins``), which swaps C pieces for their twins only.
HTTP's default also depends on a request parser being there: ``http.app.default_http_transport``.
"""
from __future__ import annotations

import os

HTTP_TRANSPORTS = ("lean", "aiohttp")
GRPC_TRANSPORTS = ("native", "grpcio")

__all__ = ["FALLBACK_TRANSPORTS", "GRPC_TRANSPORTS", "HTTP_TRANSPORTS", "default_grpc_transport"]

FALLBACK_TRANSPORTS: bool = os.environ.get("TRITON_SHM_FALLBACK_TRANSPORTS", "") not in ("", "0")


def default_grpc_transport() -> str:
    return "grpcio" if FALLBACK_TRANSPORTS else "native"
