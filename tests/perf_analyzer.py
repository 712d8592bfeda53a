"""The real perf_analyzer for tests and benchmarks, installed on first use (idempotent).

The binary comes from the tritonclient 2.50.0 wheel (the last that carries it); it needs
libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel, CPU machines included) and
Debian's libb64-0d (apt, where this process may install packages). Everything else goes
into ``cache``; nothing is installed into the test venv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("TRITON_SHM_TEST_CACHE", Path.home() / ".cache" / "triton-shm-tests"))
_WHEEL_BINARY = "tritonclient-2.50.0.data/data/bin/perf_analyzer"


class Unavailable(Exception):
    """perf_analyzer cannot be installed here; the message says why."""


@dataclass(frozen=True)
class PerfAnalyzer:
    exe: Path
    lib_dir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "LD_LIBRARY_PATH": str(self.lib_dir)}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.exe), *args], env=self.env(), capture_output=True, text=True,
                              timeout=timeout)


def _download(spec: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    name = spec.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               spec, "-d", str(dest)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise Unavailable(f"pip download {spec} failed: {proc.stderr.strip()[-500:]}")
        found = sorted(dest.glob(f"{name}-*.whl"))
    return found[-1]


def _install_binary(cache: Path) -> Path:
    exe = cache / "bin" / "perf_analyzer"
    if not exe.exists():
        wheel = _download("tritonclient==2.50.0", cache / "wheels")
        exe.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            exe.write_bytes(z.read(_WHEEL_BINARY))
        exe.chmod(0o755)
    return exe


def _install_cudart(cache: Path) -> Path:
    lib_dir = cache / "lib"
    if not list(lib_dir.glob("libcudart.so.12*")):
        wheel = _download("nvidia-cuda-runtime-cu12", cache / "wheels")
        lib_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.startswith("nvidia/cuda_runtime/lib/libcudart.so"):
                    (lib_dir / Path(member).name).write_bytes(z.read(member))
    return lib_dir


def _has_system_lib(soname: str) -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return soname in out


def _install_libb64() -> None:
    if _has_system_lib("libb64.so.0d"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable("perf_analyzer needs Debian's libb64-0d, and this process cannot apt-get install it "
                          "(not root or no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "libb64-0d"]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
        proc = subprocess.run(install, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise Unavailable(f"apt-get install libb64-0d failed: {proc.stderr.strip()[-500:]}")


def ensure_perf_analyzer(cache: Path = DEFAULT_CACHE) -> PerfAnalyzer:
    """Install (once) and return perf_analyzer; raises Unavailable with the reason."""
    try:
        pa = PerfAnalyzer(_install_binary(cache), _install_cudart(cache))
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise Unavailable(f"could not unpack perf_analyzer: {e}") from e
    _install_libb64()
    proc = pa.run("--help", timeout=30)
    if "Usage:" not in proc.stdout + proc.stderr:  # it prints its usage for --help, exit code 99
        raise Unavailable(f"perf_analyzer does not start: {proc.stderr.strip()[-500:]}")
    return pa
