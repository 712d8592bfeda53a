"""The scheduler's own cost per request: queue time (submit → hand-off to an instance)
from the statistics extension, at concurrency 1 (nothing waits for an instance, so the
queue time is the scheduler's work plus one event-loop turn).

    python bench/scheduler_cost.py [--n 2000]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from compare_triton import ADD_SUB
from model_load import start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        (repo / "add_sub" / "1").mkdir(parents=True)
        (repo / "add_sub" / "config.pbtxt").write_text(textwrap.dedent(ADD_SUB[0]))
        (repo / "add_sub" / "1" / "model.py").write_text(textwrap.dedent(ADD_SUB[1]))
        proc, port = start(repo, [], open(Path(tmp) / "server.log", "w"))
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 1}")
            inputs = [grpcclient.InferInput(n, [16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(np.ones(16, np.float32))
            for _ in range(args.n):
                client.infer("add_sub", inputs)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats") as r:
                s = json.load(r)["model_stats"][0]["inference_stats"]
        finally:
            proc.terminate()
            proc.wait(60)
    per = {k: s[k]["ns"] / max(s[k]["count"], 1) / 1000 for k in
           ("queue", "compute_input", "compute_infer", "compute_output", "success")}
    print("| per request, µs (n=%d, gRPC, concurrency 1) | queue (scheduler) | compute input | compute infer "
          "| compute output | whole request in the server |\n|---|---|---|---|---|---|" % args.n)
    print(f"| python add_sub | {per['queue']:.0f} | {per['compute_input']:.0f} | {per['compute_infer']:.0f} "
          f"| {per['compute_output']:.0f} | {per['success']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
