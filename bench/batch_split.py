"""Dynamic batching through one queue against the same load split over two queues.

    python bench/batch_split.py [--rounds 2] [--seconds 3]

Several front-end processes that each schedule their own requests
(docs/design/frontend-processes.md) split a model's queue: does batching lose by it? This
simulates the split with today's server: the batch-friendly matmul model (compare_triton's,
dynamic batching, max_queue_delay 500 µs) with `count: 2` on one server at concurrency 16,
against two servers with `count: 1` each at concurrency 8 each, at the same time. It prints
the throughput perf_analyzer measured and the mean batch size the statistics extension
counted (inferences / executions) for each, rounds alternating. A third case splits the
queue inside one server (two copies of the model, `count: 1` each, concurrency 8 each),
which tells the split queue's cost from that of a second front-end process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_triton import MATMUL_PY, free_port, matmul_config  # noqa: E402
from reference import ensure_reference  # noqa: E402


def build(root: Path, count: int, models: tuple[str, ...] = ("m",)) -> Path:
    repo = root / f"count{count}-{len(models)}"
    for name in models:
        (repo / name / "1").mkdir(parents=True)
        group = f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
        config = textwrap.dedent(matmul_config(name, True)) + group
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(MATMUL_PY))
    return repo


class Server:
    def __init__(self, repo: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_shm", "--model-repository", str(repo), "--http-port", str(self.port),
             "--grpc-port", str(self.port + 1), "--allow-metrics", "false", "--http-address", "127.0.0.1",
             "--grpc-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/m/ready", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.1)

    def counts(self, model: str = "m") -> tuple[int, int]:
        """(inferences, executions) of ``model`` so far."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.load(r)["model_stats"][0]
        return stats["inference_count"], stats["execution_count"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def load(ref, server: Server, concurrency: int, seconds: int, model: str = "m") -> subprocess.Popen:
    return subprocess.Popen(
        [str(ref.perf_analyzer), "-m", model, "-u", f"127.0.0.1:{server.port + 1}", "-i", "grpc",
         "--concurrency-range", str(concurrency), "--measurement-interval", str(seconds * 1000),
         "--stability-percentage", "50", "--max-trials", "3"],
        env=ref.pa_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def throughput(run: subprocess.Popen) -> float:
    out = run.communicate(timeout=600)[0]
    for line in out.splitlines():
        if "Throughput:" in line:
            return float(line.split("Throughput:")[1].split()[0])
    raise RuntimeError(f"perf_analyzer failed:\n{out[-2000:]}")


def measure(ref, targets: list[tuple[Server, str]], concurrency: int, seconds: int) -> tuple[float, float]:
    """Total throughput and mean batch size of the (server, model) ``targets`` loaded at the same time."""
    before = [s.counts(m) for s, m in targets]
    runs = [load(ref, s, concurrency, seconds, m) for s, m in targets]
    total = sum(throughput(r) for r in runs)
    after = [s.counts(m) for s, m in targets]
    inferences = sum(a[0] - b[0] for a, b in zip(after, before))
    executions = sum(a[1] - b[1] for a, b in zip(after, before))
    return total, inferences / max(executions, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=3, help="perf_analyzer's measurement window")
    args = parser.parse_args()
    ref = ensure_reference()
    with tempfile.TemporaryDirectory() as tmp:
        one_queue, split, two_models = build(Path(tmp), 2), build(Path(tmp), 1), build(Path(tmp), 1, ("m", "m2"))
        for r in range(args.rounds):
            server = Server(one_queue)
            try:
                total, batch = measure(ref, [(server, "m")], 16, args.seconds)
            finally:
                server.stop()
            print(f"round {r}: one queue, count 2, concurrency 16: {total:,.0f} infer/s, mean batch {batch:.2f}")
            servers = [Server(split), Server(split)]
            try:
                total, batch = measure(ref, [(s, "m") for s in servers], 8, args.seconds)
            finally:
                for s in servers:
                    s.stop()
            print(f"round {r}: two servers, count 1 each, concurrency 8 each: {total:,.0f} infer/s, "
                  f"mean batch {batch:.2f}", flush=True)
            server = Server(two_models)
            try:
                total, batch = measure(ref, [(server, "m"), (server, "m2")], 8, args.seconds)
            finally:
                server.stop()
            print(f"round {r}: one server, two copies of the model, count 1 each, concurrency 8 each: "
                  f"{total:,.0f} infer/s, mean batch {batch:.2f}", flush=True)


if __name__ == "__main__":
    main()
