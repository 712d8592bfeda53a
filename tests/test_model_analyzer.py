"""The real Model Analyzer profiling triton-shm in remote mode (tools/model_analyzer.py), opt-in:
it needs Model Analyzer in a venv of its own (``make model-analyzer`` makes .venv-ma) and runs
for about a minute. Set TRITON_SHM_MODEL_ANALYZER to its ``model-analyzer`` executable."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL_ANALYZER = os.environ.get("TRITON_SHM_MODEL_ANALYZER", "")

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.skipif(not MODEL_ANALYZER, reason="opt-in: set TRITON_SHM_MODEL_ANALYZER to the "
                                 "model-analyzer executable (make model-analyzer installs one in .venv-ma)")]


def test_model_analyzer_remote_profile_runs_through(tmp_path):
    """Three configs (the default, max_batch_size 1 and 2), concurrency 1 and 2: Model Analyzer
    loads each through our model-control API with a config override, drives perf_analyzer against
    our gRPC endpoint with our metrics URL, and writes its results CSV and summary report."""
    p = subprocess.run([sys.executable, "tools/model_analyzer.py", "--model-analyzer", MODEL_ANALYZER,
                        "--keep", str(tmp_path / "ma"), "--max-concurrency", "2", "--max-instances", "1",
                        "--max-batch-size", "2"], capture_output=True, text=True, cwd=ROOT, timeout=380)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: Model Analyzer profiled triton-shm" in p.stdout
    assert (tmp_path / "ma" / "export" / "reports" / "summaries" / "batchy" / "result_summary.html").is_file()
