"""Model management: time from the load call to READY, and a reload under load.

    python bench/model_load.py [--rounds 5]

1. Explicit mode: load and unload a small ONNX model (add_sub) and a Python model
   (add_sub) several times; report the median time the load call takes (it returns
   once every version is READY).
2. Poll mode: perf_analyzer drives the Python model at concurrency 8 over gRPC while
   the model's file is rewritten (a reload); report requests served and failed during
   the run, from the server's own statistics and perf_analyzer's exit status.
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
from reference import ensure_reference

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
                             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", *args],
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


def reload_under_load(repo: Path, log) -> dict[str, object]:
    ref = ensure_reference()
    proc, port = start(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1"], log)
    model_py = repo / "add_sub" / "1" / "model.py"
    try:
        def touch_model() -> None:  # two edits: the change is applied once it stays put
            time.sleep(4)
            model_py.write_text(model_py.read_text() + "\n# reload 1\n")
        threading.Thread(target=touch_model, daemon=True).start()
        pa = subprocess.run([str(ref.perf_analyzer), "-m", "add_sub", "-u", f"127.0.0.1:{port + 1}", "-i", "grpc",
                             "--concurrency-range", "8", "--measurement-interval", "3000", "--max-trials", "4",
                             "--stability-percentage", "1000"], env=ref.pa_env(), capture_output=True, text=True,
                            timeout=300)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats") as r:
            stats = json.load(r)["model_stats"][0]["inference_stats"]
        # perf_analyzer exits non-zero when any request fails; the statistics belong to
        # the version loaded last (a reload starts fresh counters)
        return {"perf_analyzer_exit": pa.returncode, "served_by_new_version": stats["success"]["count"],
                "failed": stats["fail"]["count"]}
    finally:
        proc.terminate()
        proc.wait(60)


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
        print(f"\nPoll-mode reload under perf_analyzer load (gRPC, concurrency 8): perf_analyzer exit "
              f"{r['perf_analyzer_exit']}, reloads seen {reloads}, requests failed {r['failed']} "
              f"(requests served by the new version afterwards: {r['served_by_new_version']})")
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
