"""The CPU container image (deploy/docker/Dockerfile): built from this checkout, started with
the example repository mounted read-only on a read-only root filesystem, ready on
/v2/health/ready, serving tritonclient, running as the non-root user, and exiting 0 on
SIGTERM once it has drained.

Needs a container engine that can pull the base image and run containers; skipped, with
the reason, where none can (this project's machines have the docker client but no engine).
Settings, for an engine that needs them:
  TRITON_SHM_CONTAINER_ENGINE  the engine's command line (default: docker, else podman),
                               e.g. "podman --runtime runc --cgroup-manager=cgroupfs"
  TRITON_SHM_CONTAINER_ARGS    extra arguments for its build and run, e.g. "--ulimit nofile=1024:1024"
  TRITON_SHM_PYTHON_IMAGE      the base image (default: the Dockerfile's python:3.11-slim-bookworm)
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from .harness import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DEFAULT_BASE = "python:3.11-slim-bookworm"


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def working_engine(base: str, extra: list[str]) -> list[str]:
    """The first engine that can run a container of ``base``; skips with every reason otherwise."""
    given = os.environ.get("TRITON_SHM_CONTAINER_ENGINE")
    candidates = [shlex.split(given)] if given else [["docker"], ["podman"]]
    reasons = []
    for engine in candidates:
        if shutil.which(engine[0]) is None:
            reasons.append(f"{engine[0]}: not installed")
            continue
        info = run([*engine, "info"], timeout=60)
        if info.returncode != 0:
            reasons.append(f"{engine[0]} info: {last_line(info)}")
            continue
        if run([*engine, "image", "inspect", base], timeout=60).returncode != 0:
            pulled = run([*engine, "pull", base], timeout=600)
            if pulled.returncode != 0:
                reasons.append(f"{engine[0]} cannot pull {base}: {last_line(pulled)}")
                continue
        probe = run([*engine, "run", "--rm", *extra, base, "python3", "-c", "pass"], timeout=120)
        if probe.returncode != 0:
            reasons.append(f"{engine[0]} cannot run a container here: {last_line(probe)}")
            continue
        return engine
    pytest.skip("no container engine works here: " + "; ".join(reasons))


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.mark.timeout(1800)
def test_cpu_image_serves_and_drains():
    base = os.environ.get("TRITON_SHM_PYTHON_IMAGE", DEFAULT_BASE)
    extra = shlex.split(os.environ.get("TRITON_SHM_CONTAINER_ARGS", ""))
    engine = working_engine(base, extra)
    tag = f"localhost/triton-shm-test:{uuid.uuid4().hex[:12]}"
    name = f"triton-shm-test-{uuid.uuid4().hex[:12]}"
    built = run([*engine, "build", *extra, "--build-arg", f"PYTHON_IMAGE={base}", "-f", str(DOCKERFILE),
                 "-t", tag, str(ROOT)], timeout=1500)
    assert built.returncode == 0, f"image build failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    port = free_port()
    try:
        started = run([*engine, "run", "-d", "--name", name, *extra, "--read-only", "--tmpfs", "/tmp",
                       "-p", f"127.0.0.1:{port}:8000",
                       "-v", f"{ROOT / 'examples' / 'model_repository'}:/models:ro", tag,
                       "--model-repository", "/models", "--drain-secs", "1"])
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 180
        while http_status(f"http://127.0.0.1:{port}/v2/health/ready") != 200 and time.monotonic() < deadline:
            assert run([*engine, "inspect", "-f", "{{.State.Running}}", name]).stdout.strip() == "true", \
                run([*engine, "logs", name]).stderr[-4000:]
            time.sleep(0.5)
        assert http_status(f"http://127.0.0.1:{port}/v2/health/ready") == 200, run([*engine, "logs", name]).stderr

        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(a)
            result = client.infer("add_sub_onnx", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        finally:
            client.close()
        user = run([*engine, "exec", name, "id", "-u"])
        assert user.stdout.strip() == "1000", user.stderr

        stopped = run([*engine, "stop", "-t", "60", name], timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        code = run([*engine, "inspect", "-f", "{{.State.ExitCode}}", name]).stdout.strip()
        logs = run([*engine, "logs", name])
        assert code == "0", logs.stdout[-2000:] + logs.stderr[-4000:]
        assert "draining for 1 s" in logs.stdout + logs.stderr
    finally:
        run([*engine, "rm", "-f", name])
        run([*engine, "rmi", "-f", tag])
