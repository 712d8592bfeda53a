"""Start the grpc.aio server that serves GRPCInferenceService (and health Check)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from ..._proto import grpc_service_pb2_grpc as pb_grpc
from .servicer import GRPCInferenceServicer, health_handler

if TYPE_CHECKING:
    from ...core.service import InferenceService

# Triton's MAX_GRPC_MESSAGE_SIZE; tritonclient sends up to this too.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


async def start_grpc(service: "InferenceService", host: str, port: int, *,
                     max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES) -> grpc.aio.Server:
    """Bind ``host:port`` and start serving; the caller stops the returned server.

    Raises OSError when the address cannot be bound.
    """
    server = grpc.aio.server(options=[
        # grpcio's default receive limit is 4 MiB, far below what clients send.
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # One server per port: without this a second process could silently share it.
        ("grpc.so_reuseport", 0),
    ])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(GRPCInferenceServicer(service), server)
    server.add_generic_rpc_handlers((health_handler(service),))
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:  # some grpcio versions raise instead of returning 0
        bound = 0
        cause: Exception | None = e
    else:
        cause = None
    if bound == 0:
        await server.stop(None)
        raise OSError(f"gRPC server could not bind {address} (address in use or invalid?)") from cause
    await server.start()
    return server
