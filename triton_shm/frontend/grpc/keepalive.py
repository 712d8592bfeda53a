"""gRPC connection settings, shared by both transports (no protobuf imports here)."""
from __future__ import annotations

from dataclasses import dataclass

HANDSHAKE_TIMEOUT_MS = 10_000  # a new connection's preface (and TLS handshake) must arrive within this


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
    # Beyond tritonserver (whose gRPC leaves idle connections open forever): a connection
    # with no call for this long gets GOAWAY, so idle sockets cannot pile up.
    max_connection_idle_ms: int | None = 300_000

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
        if self.max_connection_idle_ms is not None:
            options.append(("grpc.max_connection_idle_ms", self.max_connection_idle_ms))
        return options
