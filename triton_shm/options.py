"""The server's settings, as the command line (``cli.py``) fills them and ``server.py``
uses them; a module of its own so neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.scheduling.rate_limiter import ResourceLimit
from .frontend.grpc.keepalive import Keepalive
from .frontend.tls import TlsFiles

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
    drain_secs: float = 5.0
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
    grpc_transport: str | None = None  # None: frontend.transports' default (native)
    http_transport: str | None = None  # None: frontend.transports' default (lean)
    cache_size: int | None = None      # --cache-config local,size=N / --response-cache-byte-size; None: no cache
    rate_limit: str = "off"            # --rate-limit: execution_count or off
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)
    # TLS per port (mutual implies TLS; the metrics port defaults to the HTTP files)
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str | None = None
    grpc_server_key: str | None = None
    grpc_root_cert: str | None = None
    http_use_ssl: bool = False
    http_use_ssl_mutual: bool = False
    http_server_cert: str | None = None
    http_server_key: str | None = None
    http_root_cert: str | None = None
    metrics_use_ssl: bool = False
    metrics_use_ssl_mutual: bool = False
    metrics_server_cert: str | None = None
    metrics_server_key: str | None = None
    metrics_root_cert: str | None = None
    # restricted APIs: "<group>[,<group>...]:<header>=<value>" each (frontend/restricted.py)
    http_restricted_api: list[str] = field(default_factory=list)
    # --http/grpc-header-forward-pattern: headers matching it become request parameters
    http_header_forward_pattern: str | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    frontend_processes: int = 1        # --frontend-processes: front-end processes serving as one server
    command_line: list[str] = field(default_factory=list)  # the arguments, for the other front-end processes
    # compatibility flags that were given: flag -> value, and the warnings to log at start
    inert: dict[str, Any] = field(default_factory=dict)
    startup_warnings: list[str] = field(default_factory=list)

    @property
    def auto_complete_config(self) -> bool:
        """Whether configs are completed from the model files (tritonserver's default)."""
        return not (self.disable_auto_complete_config or self.strict_model_config)

    def uses_tls(self, port: str) -> bool:
        """Whether port "grpc", "http" or "metrics" serves TLS (mutual TLS implies it)."""
        return getattr(self, f"{port}_use_ssl") or getattr(self, f"{port}_use_ssl_mutual")

    def tls_paths(self, port: str) -> tuple[str | None, str | None, str | None]:
        """(certificate, key, root certificate) of a port; the metrics port's default to the HTTP port's."""
        def path(name: str) -> str | None:
            own = getattr(self, f"{port}_{name}")
            return own or (getattr(self, f"http_{name}") if port == "metrics" else None)
        return path("server_cert"), path("server_key"), path("root_cert")

    def tls_files(self, port: str) -> TlsFiles | None:
        """The TLS files of a port, or None when it serves plaintext (checked complete by parse_args)."""
        if not self.uses_tls(port):
            return None
        cert, key, root = self.tls_paths(port)
        if cert is None or key is None:
            raise ValueError(f"--{port}-server-cert and --{port}-server-key are both needed for TLS")
        mutual = getattr(self, f"{port}_use_ssl_mutual")
        if mutual and root is None:
            raise ValueError(f"--{port}-use-ssl-mutual needs --{port}-root-cert")
        return TlsFiles(Path(cert), Path(key), Path(root) if mutual and root is not None else None)
