"""bench/gpu/run.sh, the one-call GPU check, on a machine without a GPU: it stops at once,
non-zero, naming the cause, before it builds anything (it must never pass empty)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_gpu import _missing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(_missing() is None, reason="a GPU and CuPy are here: the check would run whole")
def test_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    results = tmp_path / "results"
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu" / "run.sh"), str(results)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 1, run
    assert "bench/gpu/run.sh: no usable GPU through CuPy" in run.stderr, run.stderr
    assert "no usable GPU through CuPy" in (results / "status.txt").read_text()
    assert not (results / "build.log").exists() and not (results / "tests.log").exists()
