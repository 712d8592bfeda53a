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
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_address: str | None = None
    metrics_interval_ms: float = 2000.0
    metrics_config: list[str] = field(default_factory=list)
    http_max_input_size: int = 64 * 1024 * 1024
    http_header_timeout_secs: float = 30.0
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
    repository_poll_secs: int = 15
    load_model: list[str] = field(default_factory=list)
    strict_readiness: bool = True
    exit_on_error: bool = True
    model_load_thread_count: int = 4
    model_control_mode: str = "none"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-shm",
        description="Triton-compatible inference server (KServe V2 over HTTP and gRPC) with a "
                    "shared-memory data plane. Load testing: 'triton-shm perf --help'.")
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
        help="serve Prometheus metrics at /metrics on --metrics-port (default true)")
    add("--allow-cpu-metrics", type=parse_bool, default=True, metavar="BOOL",
        help="report CPU utilization and memory (nv_cpu_*; default true; needs --allow-metrics)")
    add("--allow-gpu-metrics", type=parse_bool, default=True, metavar="BOOL",
        help="report GPU utilization, memory and power through NVML (nv_gpu_*; default true; "
             "needs --allow-metrics)")
    add("--metrics-address", default=None, metavar="ADDRESS",
        help="address the metrics server binds (default: same as --http-address)")
    add("--metrics-interval-ms", type=float, default=2000.0, metavar="MS",
        help="how often CPU/GPU metrics are sampled, in milliseconds (default 2000)")
    add("--metrics-config", dest="metrics_config", action="append", default=[], metavar="SETTING=VALUE",
        help="as in tritonserver (repeatable): summary_latencies=true adds latency summaries "
             "(nv_inference_*_summary_us, quantiles over the last 60 s), summary_quantiles=0.5:0.05,0.99:0.001 "
             "picks their quantiles, counter_latencies=false drops the latency counters")
    add("--http-max-input-size", type=int, default=64 * 1024 * 1024, metavar="BYTES",
        help="largest HTTP request body accepted, after decompression (default 64 MiB)")
    add("--http-header-timeout-secs", type=float, default=30.0, metavar="SECONDS",
        help="close an HTTP connection whose request headers take longer than this to arrive (default 30)")
    add("--exit-timeout-secs", type=int, default=30, metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight requests may take to finish (default 30)")
    add("--log-verbose", type=int, default=0, metavar="LEVEL", help="verbose logging level (default 0)")
    add("--log-info", type=parse_bool, default=True, metavar="BOOL", help="log INFO messages (default true)")
    add("--log-warning", type=parse_bool, default=True, metavar="BOOL", help="log WARNING messages (default true)")
    add("--log-error", type=parse_bool, default=True, metavar="BOOL", help="log ERROR messages (default true)")
    add("--log-format", default="default", choices=["default", "ISO8601"],
        help="log line prefix: default (I1130 05:29:52.670849 ...) or ISO8601 (2026-11-30T05:29:52Z I ...)")
    add("--log-file", default="", metavar="PATH", help="write the log to this file instead of stderr")
    add("--trace-config", dest="trace_config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
        help="trace setting as in tritonserver: level=OFF|TIMESTAMPS|TENSORS (repeatable), rate=N, count=N "
             "(-1 = no limit), log_frequency=N, file=PATH (or triton,file=PATH), mode=triton")
    add("--model-control-mode", default="none", choices=["none", "poll", "explicit"],
        help="none: load every model at start; poll: also follow changes in the repositories; "
             "explicit: load only --load-model models and what the load/unload API asks (default none)")
    add("--repository-poll-secs", type=int, default=15, metavar="SECONDS",
        help="poll mode: seconds between repository scans; a change is applied once its files have "
             "stayed unchanged for one interval (default 15)")
    add("--load-model", action="append", default=[], metavar="NAME",
        help="explicit mode: a model to load at start; repeat, or '*' for all")
    add("--strict-readiness", type=parse_bool, default=True, metavar="BOOL",
        help="server ready only when every model that should be loaded is READY (default true)")
    add("--exit-on-error", type=parse_bool, default=True, metavar="BOOL",
        help="exit non-zero at start if any model fails to load (default true)")
    add("--model-load-thread-count", type=int, default=4, metavar="N",
        help="how many models load in parallel (default 4)")
    add("--allow-client-shm", type=parse_bool, default=False, metavar="BOOL",
        help="let clients register system/CUDA shared-memory regions (default false)")
    add("--gpus", default=None, metavar="IDS",
        help="comma-separated GPU ids to serve, one worker each (default: all visible GPUs; 'none' for none)")
    return p


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    ns = build_parser().parse_args(argv)
    return ServerOptions(**vars(ns))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "perf":  # `triton-shm perf ...`: the load generator, not the server
        from .perf.cli import main as perf_main
        sys.exit(perf_main(args[1:]))
    options = parse_args(argv)
    from .server import run
    sys.exit(run(options))
