"""Installs the systems triton-shm is compared against, into bench/.cache (idempotent):
the real Triton 2.51 with its python backend (carried by the nvidia-pytriton 0.7.0 wheel;
CPU, python-backend models only) and perf_analyzer (tests/perf_analyzer.py installs it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.perf_analyzer import ensure_perf_analyzer  # noqa: E402  (the one installer, shared with the tests)

CACHE = Path(__file__).resolve().parent / ".cache"


@dataclass
class Reference:
    python: Path           # venv python with tritonclient and numpy (for the stub)
    tritonserver: Path
    backends: Path
    triton_libs: Path
    perf_analyzer: Path
    pa_libs: Path

    def triton_cmd(self, repo: Path, http_port: int) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.triton_libs),
               "PATH": f"{self.python.parent}:{os.environ.get('PATH', '')}"}
        cmd = [str(self.tritonserver), "--model-repository", str(repo), "--backend-directory", str(self.backends),
               "--http-port", str(http_port), "--grpc-port", str(http_port + 1),
               "--metrics-port", str(http_port + 2), "--allow-metrics", "false"]
        return cmd, env

    def pa_env(self) -> dict[str, str]:
        return {**os.environ, "LD_LIBRARY_PATH": str(self.pa_libs)}


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def ensure_reference() -> Reference:
    venv = CACHE / "ref-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        _run(sys.executable, "-m", "venv", str(venv))
    probe = subprocess.run([str(py), "-c", "import pytriton, tritonclient.grpc, nvidia.cuda_runtime"],
                           capture_output=True)
    if probe.returncode != 0:
        _run(str(py), "-m", "pip", "install", "-q", "nvidia-pytriton==0.7.0", "tritonclient[grpc,http]",
             "nvidia-cuda-runtime-cu12")
    site = Path(subprocess.check_output([str(py), "-c", "import site;print(site.getsitepackages()[0])"],
                                        text=True).strip())
    home = site / "pytriton" / "tritonserver"
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    ver = subprocess.check_output([str(py), "-c", "import sys;print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                                  text=True).strip() or pyver
    stub = home / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():
        shutil.copy(home / "python_backend_stubs" / ver / "triton_python_backend_stub", stub)
    pa = ensure_perf_analyzer(CACHE)
    return Reference(python=py, tritonserver=home / "bin" / "tritonserver", backends=home / "backends",
                     triton_libs=site / "nvidia_pytriton.libs", perf_analyzer=pa.exe,
                     pa_libs=pa.lib_dir)
