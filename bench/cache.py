"""The response cache: a repeated request answered from the cache (hit) against one the
cache has never seen (miss) and against the same model without the cache, on triton-shm
and on the real Triton 2.51, both started with a 64 MiB local cache, in one run.

    python bench/cache.py [--requests 400] [--rounds 2] [--interval-ms 3000]

Two python models (add_sub on two FP32[16]; the same with a 2 ms sleep standing in for
compute), each in a cached and an uncached copy. For every case the client is
tritonclient's gRPC client, one request at a time: "hit" sends the same inputs every
time (the first request fills the entry), "miss" sends inputs no request sent before,
"no cache" sends the same inputs to the uncached copy. Printed per server and case: the
client's p50 and p99 latency, and the server's own time per request from its statistics
(success ns / count; for hits Triton and triton-shm count only the cache lookup path).
perf_analyzer then drives the cached add_sub at concurrency 1 and 8 (perf_analyzer sends
the same data every time: all hits after the first). Cases alternate between the two
servers (A B A B), and the medians over --rounds are printed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np

from compare_triton import ADD_SUB, Case, Server, run_case
from reference import ensure_reference

CACHE_BYTES = 64 << 20
SLOW_PY = ADD_SUB[1].replace("import triton_python_backend_utils as pb_utils",
                             "import time\n    import triton_python_backend_utils as pb_utils").replace(
    "            out = []", "            time.sleep(0.002)\n            out = []")
MODELS = {  # name: (code, response cache on)
    "add_sub_cached": (ADD_SUB[1], True), "add_sub_plain": (ADD_SUB[1], False),
    "slow_cached": (SLOW_PY, True), "slow_plain": (SLOW_PY, False),
}
CASES = (("add_sub", "hit", "add_sub_cached"), ("add_sub", "miss", "add_sub_cached"),
         ("add_sub", "no cache", "add_sub_plain"), ("2 ms model", "hit", "slow_cached"),
         ("2 ms model", "miss", "slow_cached"), ("2 ms model", "no cache", "slow_plain"))


def write_repo(repo: Path) -> None:
    for name, (code, cached) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        config = textwrap.dedent(ADD_SUB[0]).replace('"add_sub"', f'"{name}"')
        if cached:
            config += "response_cache { enable: true }\n"
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def server_ns(port: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as r:
        s = json.load(r)["model_stats"][0]["inference_stats"]["success"]
    return int(s["count"]), int(s["ns"])


_fresh = itertools.count(1)


def measure(port: int, model: str, kind: str, n: int) -> tuple[float, float, float]:
    """(p50 µs, p99 µs, server µs per request) of ``n`` sequential gRPC requests."""
    import tritonclient.grpc as g
    client = g.InferenceServerClient(f"127.0.0.1:{port + 1}")
    same = np.arange(16, dtype=np.float32)

    def request(x: np.ndarray) -> None:
        inputs = [g.InferInput("INPUT0", [16], "FP32"), g.InferInput("INPUT1", [16], "FP32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(x)
        client.infer(model, inputs)

    def data() -> np.ndarray:
        return same if kind != "miss" else same + np.float32(next(_fresh) * 1000)

    for _ in range(20):
        request(data())  # warm-up (and, for hits, the entry)
    count0, ns0 = server_ns(port, model)
    samples = []
    for _ in range(n):
        x = data()
        t0 = time.perf_counter()
        request(x)
        samples.append((time.perf_counter() - t0) * 1e6)
    count1, ns1 = server_ns(port, model)
    client.close()
    samples.sort()
    server_us = (ns1 - ns0) / max(count1 - count0, 1) / 1e3
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], server_us


def print_latencies(results: dict, kinds: tuple[str, ...]) -> None:
    print("| model | request | server | p50 µs | p99 µs | server µs/request |")
    print("|---|---|---|---|---|---|")
    for label, kind, _ in CASES:
        for k in kinds:
            rows = results[(label, kind, k)]
            med = [statistics.median(r[i] for r in rows) for i in range(3)]
            print(f"| {label} | {kind} | {k} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.1f} |")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    kinds = ("triton-shm", "triton")
    results: dict[tuple, list[tuple[float, float, float]]] = {}
    pa: dict[tuple, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        write_repo(repo)
        log = open(Path(tmp) / "servers.log", "wb")
        flags = {"triton-shm": ["--cache-config", f"local,size={CACHE_BYTES}"],
                 "triton": ["--cache-config", f"local,size={CACHE_BYTES}",
                            "--cache-directory", str(ref.backends.parent / "caches")]}
        servers = {k: Server(k, repo, ref, log, flags[k]) for k in kinds}
        try:
            for _ in range(args.rounds):
                for label, kind, model in CASES:
                    for k in kinds:
                        results.setdefault((label, kind, k), []).append(
                            measure(servers[k].port, model, kind, args.requests))
            print_latencies(results, kinds)
            for _ in range(args.rounds):
                for conc in (1, 8):
                    for k in kinds:
                        case = Case(f"c{conc}", "add_sub_cached", ["--concurrency-range", str(conc)])
                        pa.setdefault((conc, k), []).append(run_case(ref, servers[k], case, args.interval_ms))
        finally:
            for s in servers.values():
                s.stop()
    print("| perf_analyzer, cached add_sub (all hits), gRPC | server | infer/s | p50 µs | p99 µs |")
    print("|---|---|---|---|---|")
    for conc in (1, 8):
        for k in kinds:
            rows = pa[(conc, k)]
            print(f"| concurrency {conc} | {k} | {statistics.median(r['throughput'] for r in rows):.0f} | "
                  f"{statistics.median(r['p50_us'] for r in rows):.0f} | "
                  f"{statistics.median(r['p99_us'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
