"""Shared fixtures: one real server process per test module that asks for it."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import ServerProcess
from .models import onnx_add_sub, python_identity, write_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
ALL_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "FP32", "FP64", "BF16", "BYTES"]


def build_core_repository(repo: Path) -> Path:
    """The models most tests use."""
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(
        'name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
    for dt in ALL_DATATYPES:
        python_identity(repo, f"identity_{dt.lower()}", dt)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("server")
    repo = build_core_repository(root / "models")
    srv = ServerProcess(repo, root / "server.log").start()
    yield srv
    code = srv.stop()
    assert code == 0, f"server did not exit cleanly ({code}):\n{srv.log()[-4000:]}"
