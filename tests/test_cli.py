"""The command line accepts every flag tritonserver 2.71 lists (2.51's and those added since):
the ones with a meaning act, the others log one start-up warning each, and unknown flags
stay errors."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_shm import cli
from triton_shm.cli import INERT_FLAGS, parse_args
from triton_shm.core.models import config as mcfg
from triton_shm.frontend.tls import TlsFiles
from triton_shm.frontend.grpc.server import Keepalive, server_options
from triton_shm.server import grpc_keepalive

from .harness import ServerProcess
from .models import add_sub_onnx_model, onnx_add_sub

REPO = ["--model-repository", "/models"]

# Every flag of `tritonserver --help` (2.71: its command_line_parser.cc) with a value of the
# form its help gives; ADDED_SINCE_2_51 are those the 2.51 binary does not list.
ADDED_SINCE_2_51 = {"--grpc-infer-thread-count", "--grpc-max-response-pool-size", "--allow-client-shm",
                    "--http-max-input-size"}
TRITONSERVER_FLAGS: dict[str, str | None] = {
    "--grpc-infer-thread-count": "4", "--grpc-max-response-pool-size": "16", "--allow-client-shm": "true",
    "--http-max-input-size": "1048576",
    "--id": "edge", "--exit-timeout-secs": "5", "--log-verbose": "1", "--log-info": "true",
    "--log-warning": "true", "--log-error": "true", "--log-format": "ISO8601", "--log-file": "/tmp/x.log",
    "--model-store": "/models", "--model-repository": "/models", "--exit-on-error": "false",
    "--disable-auto-complete-config": None, "--strict-readiness": "true", "--model-control-mode": "explicit",
    "--repository-poll-secs": "3", "--load-model": "*", "--model-config-name": "h100",
    "--model-load-thread-count": "2", "--model-load-retry-count": "1", "--model-namespacing": "false",
    "--enable-peer-access": "true", "--allow-http": "true", "--http-address": "127.0.0.1",
    "--http-port": "8000", "--reuse-http-port": "false", "--http-header-forward-pattern": "x-.*",
    "--http-thread-count": "8", "--http-restricted-api": "health:k=v", "--allow-grpc": "true",
    "--grpc-address": "127.0.0.1", "--grpc-port": "8001", "--reuse-grpc-port": "false",
    "--grpc-header-forward-pattern": "x-.*", "--grpc-infer-allocation-pool-size": "8",
    "--grpc-use-ssl": "false", "--grpc-use-ssl-mutual": "false", "--grpc-server-cert": "s.pem",
    "--grpc-server-key": "k.pem", "--grpc-root-cert": "r.pem", "--grpc-infer-response-compression-level": "none",
    "--grpc-keepalive-time": "1000", "--grpc-keepalive-timeout": "500",
    "--grpc-keepalive-permit-without-calls": "true", "--grpc-http2-max-pings-without-data": "0",
    "--grpc-http2-min-recv-ping-interval-without-data": "1000", "--grpc-http2-max-ping-strikes": "0",
    "--grpc-max-connection-age": "60000", "--grpc-max-connection-age-grace": "1000",
    "--grpc-restricted-protocol": "inference:k=v", "--allow-sagemaker": "false", "--sagemaker-port": "8080",
    "--sagemaker-safe-port-range": "8000-8010", "--sagemaker-thread-count": "8", "--allow-vertex-ai": "false",
    "--vertex-ai-port": "8080", "--vertex-ai-thread-count": "8", "--vertex-ai-default-model": "m",
    "--allow-metrics": "true", "--allow-gpu-metrics": "false", "--allow-cpu-metrics": "true",
    "--metrics-address": "127.0.0.1", "--metrics-port": "8002", "--metrics-interval-ms": "1000.5",
    "--metrics-config": "summary_latencies=true", "--trace-config": "rate=10",
    "--backend-directory": "/opt/tritonserver/backends", "--backend-config": "python,shm-default-byte-size=1048576",
    "--repoagent-directory": "/opt/tritonserver/repoagents", "--cache-config": "local,size=1048576",
    "--cache-directory": "/opt/tritonserver/caches", "--rate-limit": "execution_count",
    "--rate-limit-resource": "R1:10:0", "--pinned-memory-pool-byte-size": "0",
    "--cuda-memory-pool-byte-size": "0:0", "--cuda-virtual-address-size": "0:1073741824",
    "--min-supported-compute-capability": "6.0", "--buffer-manager-thread-count": "0",
    "--host-policy": "gpu0,numa-node=0", "--model-load-gpu-limit": "0:0.8",
    "--strict-model-config": "false", "--response-cache-byte-size": "0", "--trace-file": "/tmp/trace.json",
    "--trace-level": "TIMESTAMPS", "--trace-rate": "1000", "--trace-count": "-1", "--trace-log-frequency": "0",
}


def _argv(flags: dict[str, str | None]) -> list[str]:
    return [f"{k}={v}" if v is not None else k for k, v in flags.items()]


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# -- the flag list --------------------------------------------------------------------------------
def test_flag_list_is_the_real_binarys():
    """Where the real tritonserver (2.51) is installed, its --help lists exactly these flags
    but those added since."""
    env_sh = Path("/root/.cache/triton-reference/env.sh")
    if not env_sh.exists():
        pytest.skip("the real tritonserver is not installed here")
    out = subprocess.run(["bash", "-c", f"source {env_sh}; LD_LIBRARY_PATH=$TRITON_LIBS $TRITON_BIN --help"],
                         capture_output=True, text=True, timeout=60)
    listed = set(re.findall(r"^  (--[a-z0-9-]+)", out.stdout + out.stderr, re.M)) - {"--help"}
    assert listed == set(TRITONSERVER_FLAGS) - ADDED_SINCE_2_51


def test_help_lists_every_tritonserver_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    listed = set(re.findall(r"(?:^  |, )(--[a-z0-9-]+)", capsys.readouterr().out, re.M))  # aliases too
    assert set(TRITONSERVER_FLAGS) - listed == set()


def test_a_tritonserver_2_6x_start_script_starts():
    """The gRPC flags added after 2.51 no longer stop a start: each is accepted, kept and warned about."""
    options = parse_args(REPO + ["--grpc-infer-thread-count=8", "--grpc-max-response-pool-size", "64"])
    assert options.inert == {"--grpc-infer-thread-count": 8, "--grpc-max-response-pool-size": 64}
    assert options.startup_warnings == [
        "--grpc-infer-thread-count has no effect: gRPC is served by each front-end process's event loop, not by "
        "handler threads; --frontend-processes serves it on more cores",
        "--grpc-max-response-pool-size has no effect: responses are not pooled: each one of a stream is encoded "
        "and queued for its connection as it arrives, with no cap on how many wait"]


@pytest.mark.parametrize("argv, message", [
    (["--grpc-infer-thread-count=1"], "argument --grpc-infer-thread-count: must be in the range 2 to 128, got 1"),
    (["--grpc-infer-thread-count=129"], "must be in the range 2 to 128, got 129"),
    (["--grpc-infer-thread-count=two"], "expected an integer, got 'two'"),
    (["--grpc-max-response-pool-size=0"], "argument --grpc-max-response-pool-size: must be >= 1, got 0"),
    (["--http-max-input-size=0"], "argument --http-max-input-size: expected a positive integer, got '0'"),
])
def test_values_tritonserver_refuses(argv, message, capsys):
    """tritonserver 2.71's bounds (it refuses these at start too)."""
    assert message in _error(REPO + argv, capsys)


# As with tritonserver, the deprecated cache flag and its successor are refused together.
EXCLUSIVE = {"--response-cache-byte-size"}


def test_every_tritonserver_flag_is_accepted():
    flags = {k: v for k, v in TRITONSERVER_FLAGS.items() if k not in EXCLUSIVE}
    options = parse_args(_argv(flags))
    assert options.model_repositories == [Path("/models"), Path("/models")]
    given_inert = {s.flag for s in INERT_FLAGS} & set(flags)
    assert set(options.inert) == given_inert | {"--backend-config"}


def test_every_listed_flag_has_a_parser_option():
    known = set(cli.build_parser()._option_string_actions)
    assert set(TRITONSERVER_FLAGS) - known == set()


# -- implemented ----------------------------------------------------------------------------------
def test_id_defaults_to_triton():
    assert parse_args(REPO).server_id == "triton"
    assert parse_args(REPO + ["--id", "edge-7"]).server_id == "edge-7"


@pytest.mark.parametrize("argv, auto_complete", [
    ([], True),
    (["--disable-auto-complete-config"], False),
    (["--strict-model-config=true"], False),
    (["--strict-model-config", "false"], True),
    (["--strict-model-config=false", "--disable-auto-complete-config"], False),
])
def test_auto_complete_setting(argv, auto_complete):
    assert parse_args(REPO + argv).auto_complete_config is auto_complete


def test_strict_model_config_warns_deprecated():
    assert parse_args(REPO + ["--strict-model-config=true"]).startup_warnings == [
        "--strict-model-config is deprecated: use --disable-auto-complete-config"]
    assert parse_args(REPO + ["--disable-auto-complete-config"]).startup_warnings == []


def test_disable_auto_complete_takes_no_value(capsys):
    assert "ignored explicit argument 'true'" in _error(REPO + ["--disable-auto-complete-config=true"], capsys)


def test_model_config_name(tmp_path, capsys):
    assert parse_args(REPO + ["--model-config-name=h100"]).model_config_name == "h100"
    assert "invalid config name '../x'" in _error(REPO + ["--model-config-name=../x"], capsys)
    model = tmp_path / "m"
    (model / "configs").mkdir(parents=True)
    assert mcfg.config_path(model, "h100") == model / "config.pbtxt"  # none there: the default file
    (model / "configs" / "h100.pbtxt").write_text("max_batch_size: 2\n")
    assert mcfg.config_path(model, "h100") == model / "configs" / "h100.pbtxt"
    assert mcfg.config_path(model, "") == model / "config.pbtxt"
    assert mcfg.read_config(model, "h100").max_batch_size == 2


def test_grpc_keepalive_defaults_are_tritonservers():
    assert grpc_keepalive(parse_args(REPO)).options() == [
        ("grpc.keepalive_time_ms", 7_200_000), ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 2),
        ("grpc.http2.min_ping_interval_without_data_ms", 300_000), ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", 300_000)]


def test_grpc_keepalive_flags_reach_the_server_options():
    options = parse_args(REPO + [
        "--grpc-keepalive-time=1000", "--grpc-keepalive-timeout", "500", "--grpc-keepalive-permit-without-calls=1",
        "--grpc-http2-max-pings-without-data=0", "--grpc-http2-min-recv-ping-interval-without-data=250",
        "--grpc-http2-max-ping-strikes=5", "--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=30",
        "--grpc-max-connection-idle=0"])
    keepalive = grpc_keepalive(options)
    assert keepalive == Keepalive(1000, 500, True, 0, 250, 5, 60000, 30, None)
    assert server_options(keepalive, 1024) == [
        ("grpc.max_receive_message_length", 1024), ("grpc.max_send_message_length", 1024),
        ("grpc.so_reuseport", 0), ("grpc.server_handshake_timeout_ms", 10_000),
        ("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 500),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 250), ("grpc.http2.max_ping_strikes", 5),
        ("grpc.max_connection_age_ms", 60000), ("grpc.max_connection_age_grace_ms", 30)]


def test_deprecated_trace_flags_become_trace_config():
    options = parse_args(REPO + ["--trace-file=/tmp/t.json", "--trace-level=TIMESTAMPS", "--trace-level", "TENSORS",
                                 "--trace-rate=5", "--trace-count=3", "--trace-log-frequency=2",
                                 "--trace-config", "rate=7"])
    assert options.trace_config == ["triton,file=/tmp/t.json", "level=TIMESTAMPS", "level=TENSORS", "rate=5",
                                    "count=3", "log_frequency=2", "rate=7"]
    assert options.startup_warnings == [
        f"{f} is deprecated: use --trace-config {s}=<value>" for f, s in [
            ("--trace-file", "triton,file"), ("--trace-level", "level"), ("--trace-rate", "rate"),
            ("--trace-count", "count"), ("--trace-log-frequency", "log_frequency")]]


def test_load_model_star():
    options = parse_args(REPO + ["--model-control-mode=explicit", "--load-model=*"])
    assert (options.model_control_mode, options.load_model) == ("explicit", ["*"])
    assert parse_args(REPO + ["--model-control-mode=explicit", "--load-model=*", "--load-model=*"]).load_model


@pytest.mark.parametrize("argv, error", [
    (["--model-control-mode=explicit", "--load-model=*", "--load-model=m"],
     "Wildcard model name '*' must be the ONLY startup model if specified at all."),
    (["--model-control-mode=explicit", "--load-model=m", "--load-model", "*"],
     "Wildcard model name '*' must be the ONLY startup model if specified at all."),
    (["--load-model=m"], "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--model-control-mode=poll", "--load-model=*"],
     "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
])
def test_load_model_flags_tritonserver_refuses(argv, error, capsys):
    """As tritonserver 2.51: exit status 1 and its words, nothing loaded."""
    with pytest.raises(SystemExit) as exc:
        parse_args(REPO + argv)
    assert exc.value.code == 1
    assert capsys.readouterr().err.endswith(f"triton-shm: error: {error}\n")


# -- inert, with one warning each -----------------------------------------------------------------
@pytest.mark.parametrize("spec", INERT_FLAGS, ids=lambda s: s.flag)
def test_inert_flag_warns_once(spec):
    value = TRITONSERVER_FLAGS[spec.flag]
    argv = REPO + [f"{spec.flag}={value}"] * (2 if spec.repeat else 1)
    options = parse_args(argv)
    assert options.startup_warnings == [f"{spec.flag} has no effect: {spec.reason}"]
    assert options.inert == {spec.flag: [spec.type(value)] * 2 if spec.repeat else spec.type(value)}


def test_pinned_memory_warning_text():
    assert parse_args(REPO + ["--pinned-memory-pool-byte-size=0"]).startup_warnings == [
        "--pinned-memory-pool-byte-size has no effect: triton-shm has no pinned-memory pool"]


def test_backend_config_warns_per_setting():
    options = parse_args(REPO + [
        "--backend-config=python,shm-default-byte-size=1048576", "--backend-config=python,shm-growth-byte-size=1024",
        "--backend-config=python,stub-timeout-seconds=60", "--backend-config=onnxruntime,foo=1",
        "--backend-config=python,shm-default-byte-size=1048576"])
    arenas = "Python models share the worker's memory arenas, which grow on demand in 64 MiB chunks"
    assert options.startup_warnings == [
        f"--backend-config=python,shm-default-byte-size=1048576 has no effect: {arenas}",
        f"--backend-config=python,shm-growth-byte-size=1024 has no effect: {arenas}",
        "--backend-config=python,stub-timeout-seconds=60 has no effect: Python models run in the worker process "
        "itself (no stub); a dead worker is noticed at once",
        "--backend-config=onnxruntime,foo=1 has no effect: the built-in backends take no backend settings"]


def test_no_warnings_by_default():
    assert parse_args(REPO).startup_warnings == []
    assert parse_args(REPO).inert == {}


# -- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--bogus-flag=1"], "unrecognized arguments: --bogus-flag=1"),
    (["--log-verbx=1"], "unrecognized arguments: --log-verbx=1"),
    (["--grpc-keepalive-t=5"], "ambiguous option: --grpc-keepalive-t=5 could match --grpc-keepalive-time, "
                                "--grpc-keepalive-timeout"),
    (["--http-thread-count=abc"], "argument --http-thread-count: invalid int value: 'abc'"),
    (["--cuda-memory-pool-byte-size=12"], "argument --cuda-memory-pool-byte-size: expected <integer>:<integer>, "
                                          "got '12'"),
    (["--backend-config=foo"], "argument --backend-config: expected [<name>,]<setting>=<value>, got 'foo'"),
    (["--host-policy=numa-node=0"], "expected <name>,<setting>=<value>, got 'numa-node=0'"),
    (["--rate-limit=bogus"], "argument --rate-limit: expected execution_count or off, got 'bogus'"),
    (["--cache-config=local,size=1", "--response-cache-byte-size=1"],
     "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one or "
     "the other."),
    (["--cache-config=size=1"], "--cache-config option format is '<cache name>,<setting>=<value>'. Got size=1"),
    (["--rate-limit-resource=R:1:2:3"], "argument --rate-limit-resource: expected <string>:<integer>[:<integer>]"),
    (["--grpc-infer-response-compression-level=max"], "invalid choice: 'max'"),
    (["--strict-model-config=maybe"], "expected true or false, got 'maybe'"),
])
def test_refused(argv, message, capsys):
    assert message in _error(REPO + argv, capsys)


def test_ssl_off_is_accepted_silently():
    options = parse_args(REPO + ["--grpc-use-ssl=false", "--grpc-use-ssl-mutual=false"])
    assert (options.startup_warnings, options.inert) == ([], {})
    assert options.tls_files("grpc") is None


def test_certificates_of_a_plaintext_port_are_warned_about():
    options = parse_args(REPO + ["--grpc-server-cert=s.pem", "--http-root-cert=r.pem"])
    assert options.startup_warnings == [
        "--grpc-server-cert has no effect: gRPC is served without TLS (--grpc-use-ssl=true turns it on)",
        "--http-root-cert has no effect: HTTP is served without TLS (--http-use-ssl=true turns it on)"]


def test_tls_files_per_port():
    options = parse_args(REPO + ["--grpc-use-ssl-mutual=true", "--grpc-server-cert=g.pem", "--grpc-server-key=g.key",
                                 "--grpc-root-cert=ca.pem", "--http-use-ssl=true", "--http-server-cert=h.pem",
                                 "--http-server-key=h.key", "--http-root-cert=hca.pem", "--metrics-use-ssl=true"])
    assert options.tls_files("grpc") == TlsFiles(Path("g.pem"), Path("g.key"), Path("ca.pem"))
    assert options.tls_files("http") == TlsFiles(Path("h.pem"), Path("h.key"))  # not mutual: no client CA
    assert options.tls_files("metrics") == TlsFiles(Path("h.pem"), Path("h.key"))  # the HTTP port's files
    own = parse_args(REPO + ["--metrics-use-ssl-mutual=true", "--metrics-server-cert=m.pem",
                             "--metrics-server-key=m.key", "--http-root-cert=hca.pem"])
    assert own.tls_files("metrics") == TlsFiles(Path("m.pem"), Path("m.key"), Path("hca.pem"))
    assert own.startup_warnings == []  # the HTTP root certificate is the metrics port's


@pytest.mark.parametrize("argv, message", [
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=c", "--grpc-server-key=k"],
     "--grpc-use-ssl-mutual needs --grpc-root-cert"),
    (["--http-use-ssl=true", "--http-server-cert=c"], "--http-use-ssl needs --http-server-cert and --http-server-key"),
    (["--metrics-use-ssl=true"], "--metrics-use-ssl needs --metrics-server-cert and --metrics-server-key "
                                 "(or --http-server-cert and --http-server-key)"),
    (["--metrics-use-ssl-mutual=true", "--http-server-cert=c", "--http-server-key=k"],
     "--metrics-use-ssl-mutual needs --metrics-root-cert (or --http-root-cert)"),
])
def test_incomplete_tls_flags_exit_1(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(REPO + argv)
    assert exc.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"triton-shm: error: {message}"


def test_transports_are_chosen_per_protocol(monkeypatch, capsys):
    options = parse_args(REPO + ["--http-transport", "aiohttp", "--grpc-transport", "grpcio"])
    assert (options.http_transport, options.grpc_transport) == ("aiohttp", "grpcio")
    assert (parse_args(REPO).http_transport, parse_args(REPO).grpc_transport) == (None, None)  # the defaults
    from triton_shm.frontend.http import request_parser
    monkeypatch.setattr(request_parser, "AVAILABLE", False)  # no C parser built, no httptools
    with pytest.raises(SystemExit) as exc:
        parse_args(REPO + ["--http-transport", "lean"])
    assert exc.value.code == 1
    assert "--http-transport lean needs the C request parser" in capsys.readouterr().err


def test_unambiguous_prefix_is_accepted_as_tritonserver_does():
    # tritonserver's getopt_long takes a unique prefix (--model-repo, --log-verb=1); so does this parser
    options = parse_args(["--model-repo", "/m", "--log-verb=1", "--id=x"])
    assert (options.model_repositories, options.log_verbose, options.server_id) == ([Path("/m")], 1, "x")


def test_help_groups_the_compatibility_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: triton-shm --model-repository PATH [options]\n")
    for title in ("gRPC transport", "deprecated tritonserver flags", "tritonserver compatibility",
                  "TLS and restricted APIs"):
        assert f"\n{title}" in out
    compat = out[out.index("\ntritonserver compatibility"):out.index("\nTLS and restricted APIs")]
    assert "--pinned-memory-pool-byte-size INTEGER" in compat
    assert "no effect: triton-shm has no pinned-memory pool" in compat


# -- end to end -----------------------------------------------------------------------------------
def _repository(root: Path) -> Path:
    repo = root / "models"
    add_sub_onnx_model(repo)   # full config: loads without auto-complete
    (repo / "add_sub" / "configs").mkdir()
    small = (repo / "add_sub" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 2")
    (repo / "add_sub" / "configs" / "small.pbtxt").write_text(small)
    onnx_add_sub(repo / "bare" / "1" / "model.onnx")  # no config.pbtxt: needs auto-complete
    return repo


TRITONSERVER_STYLE = [
    "--id=edge-7", "--strict-model-config=true", "--model-config-name=small", "--exit-on-error=false",
    "--strict-readiness=false", "--gpus=none",
    "--backend-config=python,shm-default-byte-size=1048576", "--pinned-memory-pool-byte-size=0",
    "--cuda-memory-pool-byte-size=0:0", "--http-thread-count", "4", "--grpc-infer-allocation-pool-size=16",
    "--rate-limit=off", "--cache-config=local,size=1048576", "--backend-directory=/opt/tritonserver/backends",
    "--grpc-keepalive-time=10000", "--grpc-keepalive-timeout=5000", "--grpc-keepalive-permit-without-calls=true",
    "--grpc-http2-max-pings-without-data=0", "--grpc-http2-min-recv-ping-interval-without-data=5000",
    "--grpc-http2-max-ping-strikes=0", "--grpc-max-connection-age=600000",
    "--grpc-infer-thread-count=4", "--grpc-max-response-pool-size=128",  # 2.6x's
]
EXPECTED_WARNINGS = [
    "--http-thread-count has no effect: HTTP is served by the front-end's event loop, not a thread pool",
    "--grpc-infer-allocation-pool-size has no effect: gRPC request/response objects are not pooled",
    "--grpc-infer-thread-count has no effect: gRPC is served by each front-end process's event loop, not by "
    "handler threads; --frontend-processes serves it on more cores",
    "--grpc-max-response-pool-size has no effect: responses are not pooled: each one of a stream is encoded "
    "and queued for its connection as it arrives, with no cap on how many wait",
    "--backend-directory has no effect: the backends (onnxruntime, python) are built in",
    "--pinned-memory-pool-byte-size has no effect: triton-shm has no pinned-memory pool",
    "--cuda-memory-pool-byte-size has no effect: triton-shm has no CUDA memory pool",
    "--backend-config=python,shm-default-byte-size=1048576 has no effect: Python models share the worker's "
    "memory arenas, which grow on demand in 64 MiB chunks",
    "--strict-model-config is deprecated: use --disable-auto-complete-config",
]


@pytest.fixture(scope="module")
def compat_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    srv = ServerProcess(_repository(root), root / "server.log", extra_args=TRITONSERVER_STYLE).start()
    yield srv
    srv.stop_cleanly()


def test_warnings_are_logged_once_each(compat_server):
    log = compat_server.log()
    for warning in EXPECTED_WARNINGS:
        assert log.count(warning) == 1, warning
    warned = [line for line in log.splitlines() if line.startswith("W") and "triton_shm.server]" in line]
    assert len(warned) == len(EXPECTED_WARNINGS)


def test_id_in_server_metadata(compat_server):
    http = httpclient.InferenceServerClient(compat_server.http_url)
    assert http.get_server_metadata()["name"] == "edge-7"
    grpc = grpcclient.InferenceServerClient(compat_server.grpc_url)
    assert grpc.get_server_metadata().name == "edge-7"


def test_config_less_model_fails_without_auto_complete(compat_server):
    """As Triton: without auto-complete a model with no config file fails the repository poll,
    so it is never loaded and the index lists it by name only (no version, state or reason);
    the log says why."""
    http = httpclient.InferenceServerClient(compat_server.http_url)
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["bare"] == {"name": "bare"}
    with grpcclient.InferenceServerClient(compat_server.grpc_url) as grpc:
        grpc_index = {m["name"]: m for m in grpc.get_model_repository_index(as_json=True)["models"]}
    assert grpc_index["bare"] == {"name": "bare"}
    path = Path(compat_server.repositories[0]) / "bare" / "config.pbtxt"
    assert (f"Poll failed for model directory 'bare': model 'bare' has no config.pbtxt ({path}): a config "
            "file is required when config auto-complete is disabled") in compat_server.log()
    assert index["add_sub"]["state"] == "READY"
    table = compat_server.log().split("| Model")[1].split("\n\n")[0]
    assert "bare" not in table, table  # not in the model table either


def test_config_less_model_without_auto_complete_keeps_server_ready(tmp_path):
    """Strict readiness does not count a model that failed the poll, as Triton does not; an
    explicit load of it is refused as Triton refuses it, and it stays listed by name only."""
    repo = _repository(tmp_path)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--disable-auto-complete-config", "--exit-on-error=false", "--gpus=none"]).start()
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        assert http.is_server_ready()
        assert {m["name"]: m for m in http.get_model_repository_index()}["bare"] == {"name": "bare"}
    finally:
        srv.stop_cleanly()
    srv = ServerProcess(repo, tmp_path / "explicit.log",
                        extra_args=["--disable-auto-complete-config", "--model-control-mode=explicit",
                                    "--gpus=none"]).start()
    try:
        for proto in ("http", "grpc"):
            client = (httpclient if proto == "http" else grpcclient).InferenceServerClient(
                srv.http_url if proto == "http" else srv.grpc_url)
            with pytest.raises(InferenceServerException) as info:
                client.load_model("bare")
            assert info.value.status() == ("500" if proto == "http" else "StatusCode.INTERNAL")
            assert info.value.message() == "failed to load 'bare', failed to poll from model repository"
            client.load_model("add_sub")
            assert client.is_server_ready()
        http = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index == {"add_sub": {"name": "add_sub", "version": "1", "state": "READY"}, "bare": {"name": "bare"}}
    finally:
        srv.stop_cleanly()


def test_wildcard_with_another_load_model_exits_1(tmp_path):
    """The server itself, as tritonserver: exit status 1 before anything starts."""
    repo = _repository(tmp_path)
    run = subprocess.run([sys.executable, "-m", "triton_shm", "--model-repository", str(repo),
                          "--model-control-mode=explicit", "--load-model=*", "--load-model=add_sub",
                          "--http-port=0", "--grpc-port=0", "--allow-metrics=false"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1, run.stderr
    assert "Wildcard model name '*' must be the ONLY startup model if specified at all." in run.stderr
    assert "started worker" not in run.stderr


def test_model_config_name_picks_configs_file(compat_server):
    http = httpclient.InferenceServerClient(compat_server.http_url)
    assert http.get_model_config("add_sub")["max_batch_size"] == 2


def test_grpc_serves_with_keepalive_flags(compat_server):
    grpc = grpcclient.InferenceServerClient(compat_server.grpc_url)
    a, b = np.arange(32, dtype=np.float32).reshape(2, 16), np.ones((2, 16), np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [2, 16], "FP32"), grpcclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = grpc.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_load_model_star_loads_all_in_explicit_mode(tmp_path):
    repo = _repository(tmp_path)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--model-control-mode=explicit", "--load-model=*", "--gpus=none"]).start()
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
        assert index == {"add_sub": "READY", "bare": "READY"}
        assert http.get_model_config("add_sub")["max_batch_size"] == 8  # no --model-config-name: config.pbtxt
        assert http.get_server_metadata()["name"] == "triton"
        assert "ignoring 'configs'" not in srv.log()
    finally:
        srv.stop_cleanly()


def test_config_less_model_exits_with_exit_on_error(tmp_path):
    repo = _repository(tmp_path)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--disable-auto-complete-config", "--gpus=none"])
    with pytest.raises(RuntimeError, match="server exited with 1"):
        srv.start(timeout=60)
    srv.stop()
    assert "failed to load all models" in srv.log()
    assert os.path.basename(str(repo / "bare" / "config.pbtxt")) in srv.log()


def test_connection_time_limits_and_external_links_flags():
    defaults = parse_args(REPO)
    assert (defaults.http_header_timeout_secs, defaults.http_idle_timeout_secs, defaults.grpc_max_connection_idle,
            defaults.allow_external_model_links) == (30.0, 75.0, 300_000, False)
    options = parse_args(REPO + ["--http-idle-timeout-secs=5", "--grpc-max-connection-idle", "2500",
                                 "--allow-external-model-links=true"])
    assert (options.http_idle_timeout_secs, options.allow_external_model_links) == (5.0, True)
    assert ("grpc.max_connection_idle_ms", 2500) in grpc_keepalive(options).options()
    with pytest.raises(SystemExit):
        parse_args(REPO + ["--grpc-max-connection-idle=-1"])


# -- response cache and rate limiter ----------------------------------------------------------------
def test_cache_and_rate_limit_options():
    o = parse_args(REPO + ["--cache-config=local,size=1048576", "--rate-limit=EXECUTION_COUNT",
                           "--rate-limit-resource=R1:10:0", "--rate-limit-resource", "R2:3"])
    assert (o.cache_size, o.rate_limit) == (1048576, "execution_count")
    assert [(r.name, r.count, r.device) for r in o.rate_limit_resources] == [("R1", 10, 0), ("R2", 3, None)]
    assert o.startup_warnings == []
    old = parse_args(REPO + ["--response-cache-byte-size=4096"])
    assert old.cache_size == 4096
    assert old.startup_warnings == ["--response-cache-byte-size is deprecated: use --cache-config local,size=<bytes>"]
    defaults = parse_args(REPO)
    assert (defaults.cache_size, defaults.rate_limit, defaults.rate_limit_resources) == (None, "off", [])
