"""Start the grpc.aio server that serves GRPCInferenceService (and health Check)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from ..._proto import grpc_service_pb2_grpc as pb_grpc
from .servicer import GRPCInferenceServicer, health_handler

if TYPE_CHECKING:
    from ...core.service import InferenceService

# Triton's MAX_GRPC_MESSAGE_SIZE; tritonclient sends up to this too.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Keepalive:
    """The connection settings of the --grpc-keepalive-* / --grpc-http2-* / --grpc-max-connection-age*
    flags, in milliseconds; the defaults are tritonserver's. None leaves a setting unset."""
    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_without_data_ms: int = 300_000
    max_ping_strikes: int = 2
    max_connection_age_ms: int | None = None
    max_connection_age_grace_ms: int | None = None

    def options(self) -> list[tuple[str, int]]:
        """As gRPC channel arguments."""
        options = [
            ("grpc.keepalive_time_ms", self.time_ms),
            ("grpc.keepalive_timeout_ms", self.timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.max_pings_without_data),
            # the server-side name of the minimum interval between a client's pings
            ("grpc.http2.min_ping_interval_without_data_ms", self.min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
        ]
        if self.max_connection_age_ms is not None:
            options.append(("grpc.max_connection_age_ms", self.max_connection_age_ms))
        if self.max_connection_age_grace_ms is not None:
            options.append(("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms))
        return options


def server_options(keepalive: Keepalive, max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        # grpcio's default receive limit is 4 MiB, far below what clients send.
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # One server per port: without this a second process could silently share it.
        ("grpc.so_reuseport", 0),
        *keepalive.options(),
    ]


async def start_grpc(service: "InferenceService", host: str, port: int, *,
                     max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES,
                     keepalive: Keepalive = Keepalive()) -> grpc.aio.Server:
    """Bind ``host:port`` and start serving; the caller stops the returned server.

    Raises OSError when the address cannot be bound.
    """
    server = grpc.aio.server(options=server_options(keepalive, max_message_bytes))
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
