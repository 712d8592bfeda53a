"""Command line: tritonserver's flag names and forms, plus ``--gpus``.

A deployment script written for tritonserver should start triton-shm by changing only
the program name: ``--flag value`` and ``--flag=value`` both work, booleans are
``true``/``false``, ``--model-repository`` repeats, and an unambiguous prefix of a flag
is accepted (as tritonserver's getopt does). Every flag tritonserver lists is accepted:
those with a meaning here act; the rest are in :data:`INERT_FLAGS` and each one used
logs one start-up warning saying why it has no effect.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from . import TRITON_PROTOCOL_VERSION, __version__
from .core.scheduling.rate_limiter import parse_resource
from .core.data.response_cache import parse_cache_config
from .frontend.grpc.keepalive import Keepalive
from .frontend.restricted import RestrictionError, parse_restrictions
from .frontend.transports import GRPC_TRANSPORTS, HTTP_TRANSPORTS
from .options import ServerOptions
from .perf.cli import positive_int

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


# -- value forms of tritonserver's flags ------------------------------------------------------
def _form(pattern: str, check: Callable[[str], bool]) -> Callable[[str], str]:
    """An argparse type that keeps the text but refuses values not of ``pattern``."""
    def parse(value: str) -> str:
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {pattern}, got '{value}'")
        return value
    parse.__name__ = pattern  # argparse names the type in its error message
    return parse


def _is_number(text: str, kind: type) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _has_setting(value: str) -> bool:
    key, sep, _ = value.rpartition(",")[2].partition("=")
    return bool(sep and key.strip())


def _named_setting(value: str) -> bool:
    name, comma, _ = value.partition(",")
    return bool(comma and name.strip()) and _has_setting(value)


def _fields(value: str, sep: str, kinds: tuple[type, ...], optional: int = 0) -> bool:
    parts = value.split(sep)
    if not len(kinds) - optional <= len(parts) <= len(kinds):
        return False
    return all(_is_number(p, k) for p, k in zip(parts, kinds))


SETTING = _form("[<name>,]<setting>=<value>", _has_setting)
NAMED_SETTING = _form("<name>,<setting>=<value>", _named_setting)
DEVICE_BYTES = _form("<integer>:<integer>", lambda v: _fields(v, ":", (int, int)))
DEVICE_FRACTION = _form("<device_id>:<fraction>", lambda v: _fields(v, ":", (int, float)))
PORT_RANGE = _form("<integer>-<integer>", lambda v: _fields(v, "-", (int, int)))
RESOURCE = _form("<string>:<integer>[:<integer>]",
                 lambda v: _fields(v, ":", (str, int, int), optional=1) and bool(v.split(":")[0]))


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{value}'") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got '{value}'")
    return seconds


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number within [low, high] (tritonserver's bounds)."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{value}'") from None
        if number < low or (high is not None and number > high):
            bounds = f"in the range {low} to {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {number}")
        return number
    parse.__name__ = "INTEGER"
    return parse


def _rate_limit_mode(value: str) -> str:
    mode = value.lower()
    if mode not in ("execution_count", "off"):
        raise argparse.ArgumentTypeError(f"expected execution_count or off, got '{value}'")
    return mode


def _header_pattern(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"invalid regular expression '{value}': {e}") from None
    return value


def _config_name(value: str) -> str:
    # it names a file inside the model's configs/ folder: nothing that could leave it
    if value and (any(c in value for c in "/\\\x00 ") or value in (".", "..")):
        raise argparse.ArgumentTypeError(f"invalid config name '{value}' (a file name without spaces)")
    return value


# -- accepted for compatibility, no effect here -----------------------------------------------
class InertFlag(NamedTuple):
    flag: str
    type: Callable[[str], Any]
    reason: str               # completes "<flag> has no effect: ..."
    repeat: bool = False
    choices: tuple[str, ...] | None = None


INERT_FLAGS: tuple[InertFlag, ...] = (
    InertFlag("--model-load-retry-count", int, "a failed load is not retried; load the model again over the API"),
    InertFlag("--model-namespacing", parse_bool, "model names must be unique across all repositories"),
    InertFlag("--enable-peer-access", parse_bool, "GPU workers do not copy between devices"),
    InertFlag("--reuse-http-port", parse_bool, "each server binds its HTTP port exclusively"),
    InertFlag("--http-thread-count", int, "HTTP is served by the front-end's event loop, not a thread pool"),
    InertFlag("--reuse-grpc-port", parse_bool, "each server binds its gRPC port exclusively"),
    InertFlag("--grpc-infer-allocation-pool-size", int, "gRPC request/response objects are not pooled"),
    InertFlag("--grpc-infer-thread-count", _int_in(2, 128),
              "gRPC is served by each front-end process's event loop, not by handler threads; "
              "--frontend-processes serves it on more cores"),
    InertFlag("--grpc-max-response-pool-size", _int_in(1),
              "responses are not pooled: each one of a stream is encoded and queued for its connection "
              "as it arrives, with no cap on how many wait"),
    InertFlag("--grpc-infer-response-compression-level", str, "gRPC responses are sent uncompressed",
              choices=("none", "low", "medium", "high")),
    InertFlag("--allow-sagemaker", parse_bool, "triton-shm serves no SageMaker endpoint"),
    InertFlag("--sagemaker-port", int, "triton-shm serves no SageMaker endpoint"),
    InertFlag("--sagemaker-safe-port-range", PORT_RANGE, "triton-shm serves no SageMaker endpoint"),
    InertFlag("--sagemaker-thread-count", int, "triton-shm serves no SageMaker endpoint"),
    InertFlag("--allow-vertex-ai", parse_bool, "triton-shm serves no Vertex AI endpoint"),
    InertFlag("--vertex-ai-port", int, "triton-shm serves no Vertex AI endpoint"),
    InertFlag("--vertex-ai-thread-count", int, "triton-shm serves no Vertex AI endpoint"),
    InertFlag("--vertex-ai-default-model", str, "triton-shm serves no Vertex AI endpoint"),
    InertFlag("--backend-directory", str, "the backends (onnxruntime, python) are built in"),
    InertFlag("--repoagent-directory", str, "triton-shm runs no repository agents"),
    InertFlag("--cache-directory", str, "the local response cache is built in (no cache libraries are loaded)"),
    InertFlag("--pinned-memory-pool-byte-size", int, "triton-shm has no pinned-memory pool"),
    InertFlag("--cuda-memory-pool-byte-size", DEVICE_BYTES, "triton-shm has no CUDA memory pool", repeat=True),
    InertFlag("--cuda-virtual-address-size", DEVICE_BYTES, "triton-shm has no growable implicit state",
              repeat=True),
    InertFlag("--min-supported-compute-capability", float, "every GPU listed in --gpus is used"),
    InertFlag("--buffer-manager-thread-count", int, "tensors are copied by the worker's own threads"),
    InertFlag("--host-policy", NAMED_SETTING, "workers are not pinned to NUMA nodes or cores", repeat=True),
    InertFlag("--model-load-gpu-limit", DEVICE_FRACTION, "GPU memory use is not checked before a load",
              repeat=True),
)

# --backend-config settings of the python backend; any other setting gets the generic reason.
BACKEND_SETTINGS: dict[str, str] = {
    "shm-default-byte-size": "Python models share the worker's memory arenas, which grow on demand "
                             "in 64 MiB chunks",
    "shm-growth-byte-size": "Python models share the worker's memory arenas, which grow on demand "
                            "in 64 MiB chunks",
    "shm-message-queue-size": "requests reach Python models over the worker's control channel",
    "shm-region-prefix-name": "worker arenas are anonymous memfd segments with no /dev/shm name",
    "stub-timeout-seconds": "Python models run in the worker process itself (no stub); a dead worker "
                            "is noticed at once",
}
_BACKEND_GENERIC = "the built-in backends take no backend settings"

# Deprecated tracing flags, translated into their --trace-config settings.
DEPRECATED_TRACE: dict[str, str] = {
    "--trace-file": "triton,file", "--trace-level": "level", "--trace-rate": "rate",
    "--trace-count": "count", "--trace-log-frequency": "log_frequency",
}


def _dest(flag: str, kind: str) -> str:
    return f"_{kind}_{flag.lstrip('-').replace('-', '_')}"


def _add_inert(group: argparse._ArgumentGroup, spec: InertFlag) -> None:
    group.add_argument(spec.flag, dest=_dest(spec.flag, "inert"), type=spec.type, choices=spec.choices,
                       action="append" if spec.repeat else "store", default=argparse.SUPPRESS,
                       metavar=_metavar(spec),
                       help=f"no effect: {spec.reason}")


def _metavar(spec: InertFlag) -> str | None:
    if spec.choices:
        return None  # argparse shows the choices
    return {parse_bool: "BOOL", int: "INTEGER", float: "FLOAT", str: "STRING"}.get(spec.type, spec.type.__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-shm", usage="%(prog)s --model-repository PATH [options]",
        description="Triton-compatible inference server (KServe V2 over HTTP and gRPC) with a "
                    "shared-memory data plane. Load testing: 'triton-shm perf --help'.")
    add = p.add_argument
    add("--version", action="version",
        version=f"triton-shm {__version__} (Triton server protocol {TRITON_PROTOCOL_VERSION})")
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
             "picks their quantiles, histogram_latencies=true adds nv_inference_first_response_histogram_ms "
             "(buckets 100, 500, 2000, 5000 ms, or a model's model_metrics), counter_latencies=false drops the "
             "latency counters")
    add("--http-max-input-size", type=positive_int, default=64 * 1024 * 1024, metavar="BYTES",
        help="largest HTTP request body accepted, after decompression (default 64 MiB)")
    add("--http-header-timeout-secs", type=float, default=30.0, metavar="SECONDS",
        help="close an HTTP connection whose request headers take longer than this to arrive (default 30)")
    add("--http-idle-timeout-secs", type=float, default=75.0, metavar="SECONDS",
        help="close an HTTP connection idle (or whose body or reader stalled) for this long (default 75)")
    add("--exit-timeout-secs", type=int, default=30, metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight requests may take to finish (default 30)")
    add("--drain-secs", type=_seconds, default=5.0, metavar="SECONDS",
        help="on SIGTERM, first report not ready while still serving for this long, so load "
             "balancers stop sending before the server stops accepting; SIGINT or a second signal "
             "skips it (default 5)")
    add("--log-verbose", type=int, default=0, metavar="LEVEL", help="verbose logging level (default 0)")
    add("--log-info", type=parse_bool, default=True, metavar="BOOL", help="log INFO messages (default true)")
    add("--log-warning", type=parse_bool, default=True, metavar="BOOL", help="log WARNING messages (default true)")
    add("--log-error", type=parse_bool, default=True, metavar="BOOL", help="log ERROR messages (default true)")
    add("--log-format", default="default", choices=["default", "ISO8601"],
        help="log line prefix: default (I1130 05:29:52.670849 ...) or ISO8601 (2026-11-30T05:29:52Z I ...)")
    add("--log-file", default="", metavar="PATH", help="write the log to this file instead of stderr")
    add("--trace-config", dest="trace_config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
        help="trace setting as in tritonserver: level=OFF|TIMESTAMPS|TENSORS (repeatable), rate=N, count=N "
             "(-1 = no limit), log_frequency=N, file=PATH (or triton,file=PATH), mode=triton|opentelemetry; "
             "opentelemetry,url=HOST:PORT/v1/traces, opentelemetry,resource=KEY=VALUE (repeatable), "
             "opentelemetry,bsp_max_queue_size=N, opentelemetry,bsp_schedule_delay=MS, "
             "opentelemetry,bsp_max_export_batch_size=N")
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
    add("--allow-external-model-links", type=parse_bool, default=False, metavar="BOOL",
        help="load models whose directory is, or holds, a symbolic link leading outside the model "
             "repository (default false: such a model fails to load)")
    add("--grpc-transport", choices=GRPC_TRANSPORTS, default=None,
        help="gRPC server: native (our HTTP/2 server on libnghttp2; the default) or grpcio (grpc.aio; "
             "the default with TRITON_SHM_FALLBACK_TRANSPORTS=1)")
    add("--http-transport", choices=HTTP_TRANSPORTS, default=None,
        help="HTTP server: lean (the infer route parsed in C, aiohttp serving the other routes on the same "
             "port; the default) or aiohttp (all of it; the default with TRITON_SHM_FALLBACK_TRANSPORTS=1, or "
             "without the C extensions and httptools)")
    add("--frontend-processes", type=positive_int, default=1, metavar="N",
        help="front-end processes serving the ports as one server, each on a core of its own; models "
             "without a batcher, sequences or cache, with at least N instances in instance processes or on the "
             "CPU, are served where a request arrives, the others by one process (default 1; docs/deploy.md "
             "says how to size it)")
    add("--gpus", default=None, metavar="IDS",
        help="comma-separated GPU ids to serve, one worker each (default: all visible GPUs; 'none' for none)")
    _add_implemented(p)
    _add_grpc_transport(p.add_argument_group("gRPC transport (milliseconds; tritonserver's defaults)"))
    _add_deprecated(p.add_argument_group("deprecated tritonserver flags (still honoured)"))
    _add_inert_flags(p.add_argument_group(
        "tritonserver compatibility", "accepted so tritonserver command lines start unchanged; each one "
        "used has no effect here and logs one warning at start-up"))
    _add_security(p.add_argument_group(
        "TLS and restricted APIs", "TLS 1.2 or later on each port that asks for it; mutual TLS also requires "
        "client certificates signed by the root certificate; SIGHUP reloads certificates and keys. "
        "See docs/security.md"))
    return p


_TLS_PORTS = {"grpc": "gRPC", "http": "HTTP", "metrics": "metrics"}


def _add_security(g: argparse._ArgumentGroup) -> None:
    add = g.add_argument
    for port, name in _TLS_PORTS.items():
        default = " (default: the HTTP port's)" if port == "metrics" else ""
        add(f"--{port}-use-ssl", type=parse_bool, default=False, metavar="BOOL",
            help=f"serve {name} over TLS (default false)")
        add(f"--{port}-use-ssl-mutual", type=parse_bool, default=False, metavar="BOOL",
            help=f"serve {name} over mutual TLS: clients must present a certificate signed by --{port}-root-cert "
                 f"(implies --{port}-use-ssl; default false)")
        add(f"--{port}-server-cert", default=None, metavar="PATH",
            help=f"{name} server certificate chain (PEM){default}")
        add(f"--{port}-server-key", default=None, metavar="PATH", help=f"{name} server private key (PEM){default}")
        add(f"--{port}-root-cert", default=None, metavar="PATH",
            help=f"CA certificate(s) (PEM) that client certificates must be signed by, for mutual TLS{default}")
    for port in ("http", "grpc"):
        add(f"--{port}-header-forward-pattern", type=_header_pattern, default=None, metavar="<REGEX>",
            help=f"{port.upper() if port == 'http' else 'gRPC'} inference request headers whose name matches REGEX "
                 "(anywhere in it) reach the model as string request parameters; a reserved name (sequence_id, "
                 "priority, timeout, ... or one starting with triton_) is refused")
    add("--http-restricted-api", action="append", default=[], metavar="<API>[,<API>...]:<HEADER>=<VALUE>",
        help="HTTP APIs of these groups (health, metadata, inference, shared-memory, model-config, "
             "model-repository, statistics, trace, logging; and metrics: the metrics port) need HEADER: VALUE; "
             "VALUE may be @FILE or env:NAME (repeatable; each group in one flag only)")
    add("--grpc-restricted-protocol", action="append", default=[], metavar="<PROTOCOL>[,<PROTOCOL>...]:<KEY>=<VALUE>",
        help="gRPC methods of these groups need the metadata triton-grpc-protocol-KEY: VALUE; VALUE may be "
             "@FILE or env:NAME (repeatable)")


def _load_model_error(options: ServerOptions) -> str:
    """What makes the --load-model flags unusable, or '' (tritonserver's words)."""
    if not options.load_model:
        return ""
    if options.model_control_mode != "explicit":
        return "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    if "*" in options.load_model and len(set(options.load_model)) > 1:
        return "Wildcard model name '*' must be the ONLY startup model if specified at all."
    return ""


def _transport_error(options: ServerOptions) -> str:
    """Why the HTTP transport asked for cannot serve, or ''."""
    if options.http_transport == "lean":
        from .frontend.http.request_parser import AVAILABLE
        if not AVAILABLE:
            return ("--http-transport lean needs the C request parser (built with the package) or httptools "
                    "(pip install 'triton-shm[twins]')")
    if options.frontend_processes > 1 and options.allow_grpc:
        from .frontend.transports import default_grpc_transport
        if (options.grpc_transport or default_grpc_transport()) == "grpcio":
            return ("--frontend-processes above 1 serves gRPC on the native transport only (grpcio can not "
                    "serve a listening socket it did not bind): use --grpc-transport native")
    return ""


def _security_error(options: ServerOptions) -> str:
    """What makes the TLS or restricted-API flags unusable, or ''."""
    for port in _TLS_PORTS:
        if not options.uses_tls(port):
            continue
        cert, key, root = options.tls_paths(port)
        metrics = port == "metrics"
        if not (cert and key):
            return (f"--{port}-use-ssl needs --{port}-server-cert and --{port}-server-key"
                    + (" (or --http-server-cert and --http-server-key)" if metrics else ""))
        if getattr(options, f"{port}_use_ssl_mutual") and not root:
            return f"--{port}-use-ssl-mutual needs --{port}-root-cert" + (" (or --http-root-cert)" if metrics else "")
    try:
        parse_restrictions(options.http_restricted_api, "--http-restricted-api")
        parse_restrictions(options.grpc_restricted_protocol, "--grpc-restricted-protocol", grpc=True)
    except RestrictionError as e:
        return str(e)
    return ""


def _unused_tls_files(options: ServerOptions) -> list[str]:
    """Certificate flags given for a port that serves plaintext: a warning each."""
    warnings = []
    for port in ("grpc", "http"):
        if options.uses_tls(port) or (port == "http" and options.uses_tls("metrics")):
            continue
        for name in ("server_cert", "server_key", "root_cert"):
            if getattr(options, f"{port}_{name}"):
                flag = f"--{port}-{name.replace('_', '-')}"
                warnings.append(f"{flag} has no effect: {_TLS_PORTS[port]} is served without TLS "
                                f"(--{port}-use-ssl=true turns it on)")
    return warnings


def _add_implemented(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--id", dest="server_id", default="triton", metavar="STRING",
        help="the server's name in server metadata (default triton)")
    add("--disable-auto-complete-config", action="store_true",
        help="do not complete model configs from the model files: every model needs a config file "
             "that declares its inputs and outputs")
    add("--model-config-name", type=_config_name, default="", metavar="NAME",
        help="load <model>/configs/NAME.pbtxt where it exists instead of config.pbtxt")
    add("--backend-config", action="append", default=[], type=SETTING, metavar="[BACKEND,]SETTING=VALUE",
        help="accepted for compatibility: no setting has an effect here (each one used logs a warning)")
    add("--cache-config", action="append", default=[], metavar="local,size=BYTES",
        help="the response cache for models with response_cache { enable: true }: local,size=BYTES "
             "(least recently used entries are evicted beyond it)")
    add("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
        help="deprecated: --cache-config local,size=BYTES")
    add("--rate-limit", type=_rate_limit_mode, default="off", metavar="execution_count|off",
        help="execution_count: an instance runs only when the resources its instance group's rate_limiter "
             "names are free, by priority; off (the default) ignores them")
    add("--rate-limit-resource", dest="rate_limit_resources", action="append", default=[], type=RESOURCE,
        metavar="NAME:COUNT[:DEVICE]",
        help="how many of a rate-limiter resource exist (repeatable; without DEVICE on every device); once "
             "given, a resource not listed has none")


def _add_grpc_transport(g: argparse._ArgumentGroup) -> None:
    add = g.add_argument
    k = Keepalive()  # tritonserver's defaults
    add("--grpc-keepalive-time", type=int, default=k.time_ms, metavar="MS",
        help="period after which a keepalive ping is sent (default %(default)s)")
    add("--grpc-keepalive-timeout", type=int, default=k.timeout_ms, metavar="MS",
        help="how long to wait for a keepalive ping's acknowledgement (default %(default)s)")
    add("--grpc-keepalive-permit-without-calls", type=parse_bool, default=k.permit_without_calls, metavar="BOOL",
        help="allow keepalive pings without calls in flight (default false)")
    add("--grpc-http2-max-pings-without-data", type=int, default=k.max_pings_without_data, metavar="N",
        help="pings that may be sent without data (0 = no limit; default %(default)s)")
    add("--grpc-http2-min-recv-ping-interval-without-data", type=int,
        default=k.min_recv_ping_interval_without_data_ms, metavar="MS",
        help="shortest interval between a client's pings without data; shorter ones are strikes "
             "(default %(default)s)")
    add("--grpc-http2-max-ping-strikes", type=int, default=k.max_ping_strikes, metavar="N",
        help="bad pings tolerated before GOAWAY (0 = any number; default %(default)s)")
    add("--grpc-max-connection-age", type=int, default=k.max_connection_age_ms, metavar="MS",
        help="longest a connection may live (default unlimited)")
    add("--grpc-max-connection-age-grace", type=int, default=k.max_connection_age_grace_ms, metavar="MS",
        help="grace period after --grpc-max-connection-age (default unlimited)")
    add("--grpc-max-connection-idle", type=_ms_or_unlimited, default=k.max_connection_idle_ms, metavar="MS",
        help="GOAWAY to a connection without calls for this long (0 = never; default %(default)s)")


def _ms_or_unlimited(text: str) -> int | None:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (unlimited) or a number of milliseconds, got {value}")
    return value or None


def _add_deprecated(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--strict-model-config", type=parse_bool, default=None, metavar="BOOL",
                   help="true is --disable-auto-complete-config")
    for flag, kind in (("--trace-file", str), ("--trace-level", str), ("--trace-rate", int),
                       ("--trace-count", int), ("--trace-log-frequency", int)):
        g.add_argument(flag, dest=_dest(flag, "deprecated"), type=kind, default=argparse.SUPPRESS,
                       action="append" if flag == "--trace-level" else "store",
                       metavar="VALUE", help=f"--trace-config {DEPRECATED_TRACE[flag]}=VALUE")


def _add_inert_flags(g: argparse._ArgumentGroup) -> None:
    for spec in INERT_FLAGS:
        _add_inert(g, spec)


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    parser = build_parser()
    values = vars(parser.parse_args(argv))
    inert = _pop_given(values, "inert", [s.flag for s in INERT_FLAGS])
    deprecated = _pop_given(values, "deprecated", list(DEPRECATED_TRACE))
    reasons = {s.flag: s.reason for s in INERT_FLAGS}
    warnings = [f"{flag} has no effect: {reasons[flag]}" for flag in inert]
    backend_config = values.pop("backend_config")
    if backend_config:
        inert["--backend-config"] = backend_config
        warnings += _backend_config_warnings(backend_config)
    warnings += [f"{flag} is deprecated: use --trace-config {DEPRECATED_TRACE[flag]}=<value>" for flag in deprecated]
    values["trace_config"] = _trace_settings(deprecated) + values["trace_config"]
    try:
        values["cache_size"] = parse_cache_config(values.pop("cache_config"), values["response_cache_byte_size"])
        values["rate_limit_resources"] = [parse_resource(r) for r in values["rate_limit_resources"]]
    except ValueError as e:
        parser.error(str(e))
    if values.pop("response_cache_byte_size") is not None:
        warnings.append("--response-cache-byte-size is deprecated: use --cache-config local,size=<bytes>")
    if values["strict_model_config"] is None:
        values["strict_model_config"] = False
    else:
        warnings.append("--strict-model-config is deprecated: use --disable-auto-complete-config")
    options = ServerOptions(**values, inert=inert, startup_warnings=warnings,
                            command_line=list(sys.argv[1:] if argv is None else argv))
    error = _load_model_error(options) or _security_error(options) or _transport_error(options)
    if error:  # tritonserver exits 1 for these
        parser.print_usage(sys.stderr)
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    options.startup_warnings += _unused_tls_files(options)
    return options


def _pop_given(values: dict[str, Any], kind: str, flags: list[str]) -> dict[str, Any]:
    """The flags of one kind that were given (their dests default to SUPPRESS), removed from values."""
    return {flag: values.pop(_dest(flag, kind)) for flag in flags if _dest(flag, kind) in values}


def _backend_config_warnings(items: list[str]) -> list[str]:
    """One warning per distinct setting: each has its own reason."""
    warnings = []
    for item in dict.fromkeys(items):
        setting = item.rpartition(",")[2].partition("=")[0].strip()
        warnings.append(f"--backend-config={item} has no effect: {BACKEND_SETTINGS.get(setting, _BACKEND_GENERIC)}")
    return warnings


def _trace_settings(deprecated: dict[str, Any]) -> list[str]:
    """The deprecated tracing flags as --trace-config settings (given ones come after, so they win)."""
    settings = []
    for flag, value in deprecated.items():
        for v in value if isinstance(value, list) else [value]:
            settings.append(f"{DEPRECATED_TRACE[flag]}={v}")
    return settings


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "perf":  # `triton-shm perf ...`: the load generator, not the server
        from .perf.cli import main as perf_main
        sys.exit(perf_main(args[1:]))
    if args and args[0] == "tune":  # `triton-shm tune ...`: finds a model's best config, a client too
        from .tune.cli import main as tune_main
        sys.exit(tune_main(args[1:]))
    options = parse_args(argv)
    from .server import run
    sys.exit(run(options))
