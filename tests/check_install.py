"""The user's path, checked before the test suite: what `pip install` gives must serve.

    python tests/check_install.py [--keep]

1. `python -m build` (isolated, clean build environments) makes an sdist and, from that
   sdist, a wheel: the path every published wheel takes.
2. Three clean virtualenvs, none editable and none on the source tree: one from the wheel,
   one from the sdist, one from `pip install <checkout>`.
3. In each, from a directory outside the checkout, the `triton-shm` console script serves a
   copy of examples/model_repository and answers tritonclient over HTTP and gRPC; the wheel's
   venv also checks `--version`, that `triton-shm perf` without the 'perf' extra says
   what to install instead of failing on an import, and serves again with
   `--frontend-processes 2`.

Exits non-zero with the failing step's output. The driver (this script) runs in the test
venv, which has tritonclient; the servers run from their own venvs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.harness import ServerProcess  # noqa: E402
from triton_shm import TRITON_PROTOCOL_VERSION, __version__  # noqa: E402


class CheckFailed(Exception):
    pass


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
        ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode not in ok_codes:
        raise CheckFailed(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                          f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def clean_env() -> dict[str, str]:
    """The environment without this venv and without the switch that builds no extensions."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TRITON_SHM_NO_EXTENSIONS", "TRITON_SHM_FALLBACK_TRANSPORTS")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bindir)
    return env


def build_dists(out: Path) -> tuple[Path, Path]:
    run(sys.executable, "-m", "build", "--outdir", out, ROOT, env=clean_env())
    sdist, = out.glob("triton_shm-*.tar.gz")
    wheel, = out.glob("triton_shm-*.whl")
    return sdist, wheel


def make_venv(path: Path, target: str | Path, base_python: str) -> Path:
    run(base_python, "-m", "venv", path)
    run(path / "bin" / "python", "-m", "pip", "install", "-q", target, cwd=path.parent, env=clean_env())
    return path


def check_installed_package(venv: Path, outside: Path) -> None:
    """The import resolves into the venv, with the generated stubs and compiled extensions."""
    probe = ("import triton_shm, triton_shm._proto.grpc_service_pb2 as g, triton_shm.core.data._codec as c, "
             "triton_shm.worker._assembler as a, triton_shm.ipc._protocol as p, triton_shm.ipc._ring as r, "
             "triton_shm.frontend.grpc._infer_wire as w, triton_shm.worker._watch as t, "
             "triton_shm.frontend.http._common_shape as h, triton_shm.ipc._arena as ar, "
             "triton_shm.core.data._types as ty, "
             "triton_shm.backends._types as bt, triton_shm.frontend.http._request_parser as rq; "
             "print(triton_shm.__file__); "
             "print(c.__file__); print(a.__file__); print(p.__file__); print(r.__file__); print(w.__file__); "
             "print(t.__file__); print(h.__file__); print(ar.__file__); print(ty.__file__); print(bt.__file__); "
             "print(rq.__file__)")
    files = run(venv / "bin" / "python", "-c", probe, cwd=outside, env=clean_env()).stdout.split()
    for f in files:
        if not Path(f).resolve().is_relative_to(venv.resolve()):
            raise CheckFailed(f"{f} is not inside {venv}: the check ran against the source tree")


def check_vendored(venv: Path, outside: Path) -> None:
    """The wheel carries the vendored llhttp's licence, and needs no httptools (the twins extra)."""
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(any(f.name == 'LICENSE' and 'llhttp' in str(f) for f in m.files('triton-shm')), "
             "u.find_spec('httptools') is not None)")
    out = run(venv / "bin" / "python", "-c", probe, cwd=outside, env=clean_env()).stdout.split()
    if out != ["True", "False"]:
        raise CheckFailed(f"llhttp's LICENSE in the wheel, httptools installed: {out}, expected True False")


def check_version(venv: Path, outside: Path) -> None:
    out = run(venv / "bin" / "triton-shm", "--version", cwd=outside, env=clean_env()).stdout.strip()
    want = f"triton-shm {__version__} (Triton server protocol {TRITON_PROTOCOL_VERSION})"
    if out != want:
        raise CheckFailed(f"--version printed {out!r}, expected {want!r}")


def check_perf_without_extra(venv: Path, outside: Path) -> None:
    proc = run(venv / "bin" / "triton-shm", "perf", "-m", "add_sub_onnx", cwd=outside, env=clean_env(),
               ok_codes=(2,))
    if "pip install 'triton-shm[perf]'" not in proc.stderr or "Traceback" in proc.stderr:
        raise CheckFailed(f"triton-shm perf without the perf extra said:\n{proc.stderr}")


def check_serves(venv: Path, outside: Path, repo: Path, extra_args: list[str] = ()) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    server = ServerProcess(repo, outside / f"{venv.name}.log", program=[str(venv / "bin" / "triton-shm")],
                           cwd=outside, env=clean_env(), extra_args=list(extra_args))
    server.start(timeout=120)
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2, dtype=np.float32)
        http = httpclient.InferenceServerClient(server.http_url)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a, binary_data=True)
        inputs[1].set_data_from_numpy(b, binary_data=True)
        result = http.infer("add_sub_onnx", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        http.close()

        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        text = np.array([[b"hello", b"pip"]], dtype=np.object_)
        inp = grpcclient.InferInput("TEXT", [1, 2], "BYTES")
        inp.set_data_from_numpy(text)
        result = grpc.infer("text_py", [inp])
        assert result.as_numpy("UPPER").tolist() == [[b"HELLO", b"PIP"]], result.as_numpy("UPPER")
        assert result.as_numpy("LENGTH").tolist() == [[5, 3]], result.as_numpy("LENGTH")
        grpc.close()
        if "Started HTTPService" not in server.log() or "(lean)" not in server.log():  # the C parser serves
            raise CheckFailed("HTTP is not served on the lean path")
    except Exception as e:
        raise CheckFailed(f"{venv.name}: {type(e).__name__}: {e}\n{server.log()[-4000:]}") from e
    finally:
        code = server.stop()
    if code != 0:
        raise CheckFailed(f"{venv.name}: server exited {code} on SIGTERM\n{server.log()[-4000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="triton-shm-install-"))
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    started = time.monotonic()
    try:
        outside = tmp / "elsewhere"
        outside.mkdir()
        repo = outside / "model_repository"
        shutil.copytree(ROOT / "examples" / "model_repository", repo)
        print("check_install: building sdist and wheel", flush=True)
        sdist, wheel = build_dists(tmp / "dist")
        for name, target in (("from-wheel", wheel), ("from-sdist", sdist), ("from-checkout", ROOT)):
            print(f"check_install: {name}: installing {Path(target).name}", flush=True)
            venv = make_venv(tmp / name, target, base_python)
            check_installed_package(venv, outside)
            if name == "from-wheel":
                check_version(venv, outside)
                check_vendored(venv, outside)
                check_perf_without_extra(venv, outside)
            check_serves(venv, outside, repo)
            print(f"check_install: {name}: serves HTTP and gRPC", flush=True)
            if name == "from-wheel":  # the other front-end processes start from the installed package too
                check_serves(venv, outside, repo, ["--frontend-processes", "2"])
                print(f"check_install: {name}: serves with --frontend-processes 2", flush=True)
    except CheckFailed as e:
        print(f"check_install: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"check_install: all passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
