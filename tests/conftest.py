"""Shared fixtures: one real server process per test module that asks for it."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import ServerProcess
from .helpers import Regions, connect
from .models import add_sub_onnx_model, python_identity
from .perf_analyzer import PerfAnalyzer, Unavailable, ensure_perf_analyzer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
ALL_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "FP32", "FP64", "BF16", "BYTES"]


def build_core_repository(repo: Path) -> Path:
    """The models most tests use."""
    add_sub_onnx_model(repo)
    for dt in ALL_DATATYPES:
        python_identity(repo, f"identity_{dt.lower()}", dt)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("server")
    repo = build_core_repository(root / "models")
    srv = ServerProcess(repo, root / "server.log").start()
    yield srv
    srv.stop_cleanly()


@pytest.fixture(scope="session")
def perf_analyzer() -> PerfAnalyzer:
    """The real perf_analyzer, installed on first use; skipped only where it cannot be installed."""
    try:
        return ensure_perf_analyzer()
    except Unavailable as e:
        pytest.skip(f"perf_analyzer unavailable: {e}")


@pytest.fixture(params=["http", "grpc"])
def proto(request) -> str:
    """A test that takes it runs over HTTP and over gRPC."""
    return request.param


@pytest.fixture
def client(proto, server):
    """A tritonclient of ``proto`` on the module's server (a module may define its own)."""
    cl = connect(server, proto)
    yield cl
    cl.close()


@pytest.fixture
def regions(server):
    """/dev/shm objects a test makes, destroyed (and unregistered) when it ends."""
    r = Regions(server)
    yield r
    r.cleanup()
