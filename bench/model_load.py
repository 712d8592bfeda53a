"""Model management: time from the load call to READY, and a reload under load.

    python bench/model_load.py [--rounds 5]

1. Explicit mode: load and unload a small ONNX model (add_sub) and a Python model
   (add_sub) several times; report the median time the load call takes (it returns
   once every version is READY).
2. Poll mode: 8 client threads drive the Python model over gRPC while the model's file
   is rewritten (a reload); report requests served and failed during the run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

from compare_triton import ADD_SUB, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.models import onnx_add_sub  # noqa: E402


def post(url: str, body: dict | None = None) -> int:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status


def start(repo: Path, args: list[str], log) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "triton_shm", "--model-repository", str(repo),
                             "--http-port", str(port), "--grpc-port", str(port + 1), "--allow-metrics", "false",
                             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--drain-secs", "0", *args],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1):
                return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def write_repo(repo: Path) -> None:
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "config.pbtxt").write_text(textwrap.dedent(ADD_SUB[0]))
    (repo / "add_sub" / "1" / "model.py").write_text(textwrap.dedent(ADD_SUB[1]))
    onnx_add_sub(repo / "add_sub_onnx" / "1" / "model.onnx", dims=(16,))


def load_times(repo: Path, rounds: int, log) -> dict[str, float]:
    proc, port = start(repo, ["--model-control-mode", "explicit"], log)
    base = f"http://127.0.0.1:{port}/v2/repository/models"
    out = {}
    try:
        for model in ("add_sub_onnx", "add_sub"):
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                post(f"{base}/{model}/load")
                samples.append(time.perf_counter() - t0)
                post(f"{base}/{model}/unload")
            out[model] = statistics.median(samples)
    finally:
        proc.terminate()
        proc.wait(60)
    return out


def reload_under_load(repo: Path, log, seconds: float = 8.0) -> dict[str, int]:
    """8 client threads send requests back to back (gRPC) while the model file changes
    on disk; every answer is counted. (perf_analyzer cannot be used here: its
    statistics lookup gives up across any reload, of this server and of Triton alike:
    "failed to find the requested model version".)"""
    import numpy as np
    import tritonclient.grpc as grpcclient

    proc, port = start(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1"], log)
    model_py = repo / "add_sub" / "1" / "model.py"
    counts = {"served": 0, "failed": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 1}")
        x = np.ones(16, np.float32)
        inputs = [grpcclient.InferInput(n, [16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(x)
        while time.monotonic() < stop:
            try:
                ok = float(c.infer("add_sub", inputs).as_numpy("OUTPUT0")[0]) == 2.0
            except Exception:  # noqa: BLE001 - counted
                ok = False
            with lock:
                counts["served" if ok else "failed"] += 1
        c.close()

    try:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(2)
        model_py.write_text(model_py.read_text() + "\n# reload\n")
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        proc.wait(60)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        write_repo(repo)
        log = open(Path(tmp) / "server.log", "w")
        times = load_times(repo, args.rounds, log)
        print("| model | load call → READY (median of %d) |\n|---|---|" % args.rounds)
        for model, t in times.items():
            print(f"| {model} ({'ONNX' if 'onnx' in model else 'Python'}) | {t * 1000:.0f} ms |")
        r = reload_under_load(repo, log)
        log.close()
        reloads = Path(tmp, "server.log").read_text(errors="replace").count("changed on disk")
        print(f"\nPoll-mode reload under load (8 gRPC client threads, 8 s): reloads {reloads}, "
              f"requests served {r['served']}, failed {r['failed']}")
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
