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
import concurrent.futures
import json
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_triton import MATMUL_PY, Case, Server, matmul_config, run_generator  # noqa: E402
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


def counts(server: Server, model: str) -> tuple[int, int]:
    """(inferences, executions) of ``model`` so far, from the statistics extension."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def measure(ref, targets: list[tuple[Server, str]], concurrency: int, interval_ms: int) -> tuple[float, float]:
    """Total throughput and mean batch size of the (server, model) ``targets`` loaded at the same time."""
    before = [counts(s, m) for s, m in targets]
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        rows = list(pool.map(lambda t: run_generator(ref, "perf_analyzer", t[0].url("grpc"),
                                                     Case(t[1], t[1], ["--concurrency-range", str(concurrency)]),
                                                     interval_ms), targets))
    after = [counts(s, m) for s, m in targets]
    inferences = sum(a[0] - b[0] for a, b in zip(after, before))
    executions = sum(a[1] - b[1] for a, b in zip(after, before))
    return sum(float(row["Inferences/Second"]) for row in rows), inferences / max(executions, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=3, help="perf_analyzer's measurement window")
    args = parser.parse_args()
    ref = ensure_reference()
    with tempfile.TemporaryDirectory() as tmp:
        one_queue, split, two_models = build(Path(tmp), 2), build(Path(tmp), 1), build(Path(tmp), 1, ("m", "m2"))
        log = open(Path(tmp) / "servers.log", "wb")
        window = args.seconds * 1000

        def start(repo: Path) -> Server:
            return Server("triton-shm", repo, ref, log)
        for r in range(args.rounds):
            server = start(one_queue)
            try:
                total, batch = measure(ref, [(server, "m")], 16, window)
            finally:
                server.stop()
            print(f"round {r}: one queue, count 2, concurrency 16: {total:,.0f} infer/s, mean batch {batch:.2f}")
            servers = [start(split), start(split)]
            try:
                total, batch = measure(ref, [(s, "m") for s in servers], 8, window)
            finally:
                for s in servers:
                    s.stop()
            print(f"round {r}: two servers, count 1 each, concurrency 8 each: {total:,.0f} infer/s, "
                  f"mean batch {batch:.2f}", flush=True)
            server = start(two_models)
            try:
                total, batch = measure(ref, [(server, "m"), (server, "m2")], 8, window)
            finally:
                server.stop()
            print(f"round {r}: one server, two copies of the model, count 1 each, concurrency 8 each: "
                  f"{total:,.0f} infer/s, mean batch {batch:.2f}", flush=True)


if __name__ == "__main__":
    main()
