"""Does throughput grow with ``--frontend-processes``? Small requests from several load
generators, N = 1, 2, 4, 8 front-end processes, one server at a time.

    python bench/frontend_scaling.py [--processes 1,2,4,8] [--clients 4] [--concurrency 8]
                                     [--protocol grpc|http] [--seconds 8]
                                     [--backend python|onnxruntime]

The model is ``add_sub`` (two FP32[16] inputs), in Python (each instance a process) or
ONNX Runtime (the example repository's model, instances threads of each front-end
process's CPU worker), with as many instances as the largest N, so every front-end
process serves its share where requests arrive. The load
comes from ``--clients`` processes of ``python -m triton_shm.perf``, each at
``--concurrency`` (each in-flight request its own connection over HTTP; over gRPC one
connection per process). After a warm-up, one window of ``--seconds``: throughput from the
server's own statistics (summed over its processes), and the CPU each part used in it, as
a share of one core: every front-end process, the instance processes together, the load
generators together. The last column names what was saturated: a front-end process near a
whole core means more processes would help; the clients or the machine's cores mean the
measurement, not the server, is the limit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

from compare_triton import ADD_SUB, cpu_seconds, free_port, process_tree

SATURATED = 0.9  # of a core


EXAMPLE_ONNX = Path(__file__).resolve().parents[1] / "examples/model_repository/add_sub_onnx/1/model.onnx"
ONNX_CONFIG = """
    name: "add_sub"
    backend: "onnxruntime"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
    """


def write_repository(repo: Path, instances: int, backend: str) -> None:
    (repo / "add_sub" / "1").mkdir(parents=True)
    config, code = (ONNX_CONFIG, None) if backend == "onnxruntime" else ADD_SUB
    (repo / "add_sub" / "config.pbtxt").write_text(
        textwrap.dedent(config) + f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n")
    if code is None:
        shutil.copy(EXAMPLE_ONNX, repo / "add_sub" / "1" / "model.onnx")
    else:
        (repo / "add_sub" / "1" / "model.py").write_text(textwrap.dedent(code))


def inference_count(http_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/add_sub/stats", timeout=10) as r:
        return sum(int(s["inference_count"]) for s in json.load(r)["model_stats"])


def frontends_and_workers(root: int) -> tuple[list[int], list[int]]:
    frontends, workers = [], []
    for pid in process_tree(root):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        (workers if b"triton_shm.worker" in args else frontends).append(pid)
    return frontends, workers


def measure(repo: Path, processes: int, args: argparse.Namespace, log) -> dict:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "triton_shm", "--model-repository", str(repo), "--http-port", str(port),
         "--grpc-port", str(port + 1), "--allow-metrics", "false", "--http-address", "127.0.0.1",
         "--grpc-address", "127.0.0.1", "--drain-secs", "0", "--gpus", "none",
         "--frontend-processes", str(processes)], stdout=log, stderr=subprocess.STDOUT)
    clients: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server with {processes} front-end processes did not start")
            time.sleep(0.2)
        url = f"127.0.0.1:{port + 1 if args.protocol == 'grpc' else port}"
        window_ms = int((args.seconds + args.warmup + 5) * 1000)
        clients = [subprocess.Popen(
            [sys.executable, "-m", "triton_shm.perf", "-m", "add_sub", "-u", url, "-i", args.protocol,
             "--concurrency-range", str(args.concurrency), "--measurement-interval", str(window_ms),
             "--max-trials", "1", "--stability-percentage", "100"],
            stdout=subprocess.DEVNULL, stderr=log) for _ in range(args.clients)]
        time.sleep(args.warmup)
        frontends, workers = frontends_and_workers(server.pid)
        client_pids = [c.pid for c in clients]
        count0, t0 = inference_count(port), time.monotonic()
        cpu0 = {pid: cpu_seconds([pid]) for pid in frontends + workers + client_pids}
        time.sleep(args.seconds)
        count1, t1 = inference_count(port), time.monotonic()
        cpu1 = {pid: cpu_seconds([pid]) for pid in cpu0}
        share = {pid: (cpu1[pid] - cpu0[pid]) / (t1 - t0) for pid in cpu0}
        return {"processes": processes, "throughput": (count1 - count0) / (t1 - t0),
                "frontends": sorted((share[p] for p in frontends), reverse=True),
                "workers": sum(share[p] for p in workers), "clients": sum(share[p] for p in client_pids),
                "cores": os.cpu_count() or 1, "client_count": len(clients)}
    finally:
        for c in clients:
            c.send_signal(signal.SIGINT)
        for c in clients:
            try:
                c.wait(10)
            except subprocess.TimeoutExpired:
                c.kill()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def limit(row: dict) -> str:
    used = max(row["frontends"]) if row["frontends"] else 0.0
    total = sum(row["frontends"]) + row["workers"] + row["clients"]
    if total >= SATURATED * row["cores"]:
        return f"the machine's {row['cores']} cores"
    if row["clients"] >= SATURATED * row["client_count"]:
        return "the load generators"
    if used >= SATURATED:
        return "the front-end processes"
    return "none saturated"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", default="1,2,4,8")
    p.add_argument("--clients", type=int, default=4, help="load generator processes")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per load generator")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--backend", choices=["python", "onnxruntime"], default="python")
    args = p.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        write_repository(repo, max(counts), args.backend)
        rows = []
        with open(Path(tmp) / "server.log", "wb") as log:
            for n in counts:
                rows.append(measure(repo, n, args, log))
                print(f"  N={n}: {rows[-1]['throughput']:,.0f} infer/s", file=sys.stderr, flush=True)
    print(f"add_sub ({args.backend}), {max(counts)} instances, {args.protocol}, {args.clients} load generators "
          f"at concurrency {args.concurrency}, {args.seconds:g} s window, {rows[0]['cores']} cores\n")
    print("| front-end processes | infer/s | vs N = 1 | CPU of each front-end (cores) | instances (cores) "
          "| load generators (cores) | saturated |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        each = " / ".join(f"{c:.2f}" for c in row["frontends"])
        print(f"| {row['processes']} | {row['throughput']:,.0f} | {row['throughput'] / rows[0]['throughput']:.2f} "
              f"| {each} | {row['workers']:.2f} | {row['clients']:.2f} | {limit(row)} |")


if __name__ == "__main__":
    main()
