"""Start the gRPC server for GRPCInferenceService and health Check, on either transport."""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from ..transports import default_grpc_transport
from .keepalive import HANDSHAKE_TIMEOUT_MS, Keepalive
from .servicer import methods

if TYPE_CHECKING:
    from ...core.service import InferenceService
    from ..header_forward import HeaderForward
    from ..restricted import Restrictions
    from ..tls import ServerTls

# Triton's MAX_GRPC_MESSAGE_SIZE; tritonclient sends up to this too.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1

__all__ = ["Keepalive", "MAX_GRPC_MESSAGE_BYTES", "server_options", "start_grpc"]


def server_options(keepalive: Keepalive, max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """grpc.aio's server options."""
    return [
        # grpcio's default receive limit is 4 MiB, far below what clients send.
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # One server per port: without this a second process could silently share it.
        ("grpc.so_reuseport", 0),
        # A connection that never completes its handshake is dropped, as the native transport does.
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        *keepalive.options(),
    ]


async def start_grpc(service: "InferenceService", host: str, port: int, *, transport: str | None = None,
                     max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES, keepalive: Keepalive = Keepalive(),
                     restrictions: "Restrictions | None" = None, tls: "ServerTls | None" = None,
                     sock: socket.socket | None = None, header_forward: "HeaderForward | None" = None) -> Any:
    """Bind ``host:port`` and start serving; the caller stops the returned server with
    ``await server.stop(grace)``. Raises OSError when the address cannot be bound.
    ``restrictions``: --grpc-restricted-protocol; ``tls``: serve over TLS (built with ALPN h2).
    ``sock``: serve on this listening socket instead (made by ``listeners.bind_listener``, maybe
    in another process; ``host:port`` then only name it): the native transport only (ValueError
    on grpcio's). ``header_forward``: --grpc-header-forward-pattern (ModelInfer's headers)."""
    transport = transport or default_grpc_transport()
    table = methods(service)
    if transport == "native":
        from .native.server import start_native
        return await start_native(table, host, port, max_message_bytes=max_message_bytes, keepalive=keepalive,
                                  restrictions=restrictions, ssl=None if tls is None else tls.context, sock=sock,
                                  header_forward=header_forward)
    from .aio import start_aio
    return await start_aio(table, host, port, server_options(keepalive, max_message_bytes), restrictions=restrictions,
                           credentials=None if tls is None else tls.grpc_credentials(), sock=sock,
                           header_forward=header_forward)
