"""Command line: tritonserver's flag names and forms, plus ``--gpus``.

A deployment script written for tritonserver should start triton-shm by changing only
the program name: ``--flag value`` and ``--flag=value`` both work, booleans are
``true``/``false``, ``--model-repository`` repeats.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


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
    http_max_input_size: int = 64 * 1024 * 1024
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    gpus: str | None = None
    allow_client_shm: bool = False
    model_control_mode: str = "none"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-shm",
        description="Triton-compatible inference server (KServe V2 over HTTP and gRPC) with a "
                    "shared-memory data plane.")
    add = p.add_argument
    add("--model-repository", "--model-store", dest="model_repositories", action="append", type=Path,
        required=True, metavar="PATH", help="model repository path; repeat for several")
    add("--http-address", default="0.0.0.0", help="address the HTTP server binds (default 0.0.0.0)")
    add("--http-port", type=int, default=8000, help="HTTP port (default 8000)")
    add("--grpc-address", default="0.0.0.0", help="address the gRPC server binds (default 0.0.0.0)")
    add("--grpc-port", type=int, default=8001, help="gRPC port (default 8001)")
    add("--metrics-port", type=int, default=8002, help="Prometheus metrics port (default 8002)")
    add("--allow-http", type=parse_bool, default=True, metavar="BOOL", help="serve HTTP (default true)")
    add("--allow-grpc", type=parse_bool, default=True, metavar="BOOL", help="serve gRPC (default true)")
    add("--allow-metrics", type=parse_bool, default=True, metavar="BOOL",
        help="serve Prometheus metrics (default true; not available in this build yet)")
    add("--http-max-input-size", type=int, default=64 * 1024 * 1024, metavar="BYTES",
        help="largest HTTP request body accepted, after decompression (default 64 MiB)")
    add("--exit-timeout-secs", type=int, default=30, metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight requests may take to finish (default 30)")
    add("--log-verbose", type=int, default=0, metavar="LEVEL", help="verbose logging level (default 0)")
    add("--model-control-mode", default="none", choices=["none"],
        help="model control mode (only 'none' in this build: every model loads at start)")
    add("--allow-client-shm", type=parse_bool, default=False, metavar="BOOL",
        help="let clients register system/CUDA shared-memory regions (default false)")
    add("--gpus", default=None, metavar="IDS",
        help="comma-separated GPU ids to serve, one worker each (default: all visible GPUs; 'none' for none)")
    return p


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    ns = build_parser().parse_args(argv)
    return ServerOptions(**vars(ns))


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    from .server import run
    sys.exit(run(options))
