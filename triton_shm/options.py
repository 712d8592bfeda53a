"""The server's settings, as the command line (``cli.py``) fills them and ``server.py``
uses them; a module of its own so neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .frontend.grpc.keepalive import Keepalive

_KEEPALIVE = Keepalive()  # tritonserver's gRPC connection defaults, defined once there


@dataclass
class ServerOptions:
    model_repositories: list[Path] = field(default_factory=list)
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_address: str | None = None
    metrics_interval_ms: float = 2000.0
    metrics_config: list[str] = field(default_factory=list)
    http_max_input_size: int = 64 * 1024 * 1024
    http_header_timeout_secs: float = 30.0
    http_idle_timeout_secs: float = 75.0
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""
    trace_config: list[str] = field(default_factory=list)
    gpus: str | None = None
    allow_client_shm: bool = False
    allow_external_model_links: bool = False
    repository_poll_secs: int = 15
    load_model: list[str] = field(default_factory=list)
    strict_readiness: bool = True
    exit_on_error: bool = True
    model_load_thread_count: int = 4
    model_control_mode: str = "none"
    server_id: str = "triton"
    disable_auto_complete_config: bool = False
    strict_model_config: bool = False
    model_config_name: str = ""
    # gRPC transport (milliseconds), tritonserver's defaults; None leaves the setting unset
    grpc_keepalive_time: int = _KEEPALIVE.time_ms
    grpc_keepalive_timeout: int = _KEEPALIVE.timeout_ms
    grpc_keepalive_permit_without_calls: bool = _KEEPALIVE.permit_without_calls
    grpc_http2_max_pings_without_data: int = _KEEPALIVE.max_pings_without_data
    grpc_http2_min_recv_ping_interval_without_data: int = _KEEPALIVE.min_recv_ping_interval_without_data_ms
    grpc_http2_max_ping_strikes: int = _KEEPALIVE.max_ping_strikes
    grpc_max_connection_age: int | None = _KEEPALIVE.max_connection_age_ms
    grpc_max_connection_age_grace: int | None = _KEEPALIVE.max_connection_age_grace_ms
    grpc_max_connection_idle: int | None = _KEEPALIVE.max_connection_idle_ms
    grpc_transport: str | None = None  # None: native, or grpcio without C extensions
    # compatibility flags that were given: flag -> value, and the warnings to log at start
    inert: dict[str, Any] = field(default_factory=dict)
    startup_warnings: list[str] = field(default_factory=list)

    @property
    def auto_complete_config(self) -> bool:
        """Whether configs are completed from the model files (tritonserver's default)."""
        return not (self.disable_auto_complete_config or self.strict_model_config)
