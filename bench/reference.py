"""Installs the systems triton-shm is compared against, into bench/.cache (idempotent):
the real Triton 2.51 with its python backend (carried by the nvidia-pytriton 0.7.0 wheel;
CPU, python-backend models only) and perf_analyzer from the tritonclient 2.50.0 wheel
(needs Debian's libb64-0d and libcudart.so.12 from nvidia-cuda-runtime-cu12)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

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
    pa = CACHE / "bin" / "perf_analyzer"
    if not pa.exists():
        wheels = CACHE / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        _run(str(py), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "tritonclient==2.50.0",
             "-d", str(wheels))
        wheel = next(wheels.glob("tritonclient-2.50.0-*.whl"))
        pa.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            pa.write_bytes(z.read("tritonclient-2.50.0.data/data/bin/perf_analyzer"))
        pa.chmod(0o755)
    if "libb64.so.0d" not in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout:
        _run("apt-get", "install", "-y", "-qq", "libb64-0d")
    return Reference(python=py, tritonserver=home / "bin" / "tritonserver", backends=home / "backends",
                     triton_libs=site / "nvidia_pytriton.libs", perf_analyzer=pa,
                     pa_libs=site / "nvidia" / "cuda_runtime" / "lib")
