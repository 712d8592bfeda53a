"""Where each inference's CPU goes, process by process: triton-shm and Triton 2.51 side by side.

    python bench/cpu_split.py [--scenarios small] [--protocols http,grpc] [--concurrency 1]
                              [--interval-ms 6000] [--servers triton-shm,triton]

At concurrency 1 a request crosses the load generator, the server's front-end and its model
process one after the other, so the latency is close to the sum of their CPU time per request:
this says which process a gap is in, and whether it is user time (our code) or system time
(syscalls, wake-ups, the socket path). For each case and server it runs perf_analyzer once and
prints user and system CPU-µs per inference for every process of the server (and every thread
that did work), its voluntary context switches per inference, and perf_analyzer's own CPU per
inference. Requests are counted by the server's statistics extension. Same cases, servers and
perf_analyzer as ``compare_triton.py``; run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from compare_triton import SCENARIOS, Case, Server, build_repository, process_tree, run_generator, success_ns
from reference import ensure_reference

TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def _task_counters(path: Path) -> tuple[str, int, int, int]:
    """(name, user ticks, system ticks, voluntary context switches) of one process or thread."""
    fields = (path / "stat").read_text().rsplit(")", 1)[1].split()
    status = (path / "status").read_text()
    voluntary = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
    return (path / "comm").read_text().strip(), int(fields[11]), int(fields[12]), voluntary


def snapshot(pids: list[int]) -> dict[int, tuple[tuple, dict[str, tuple]]]:
    """Counters of each process and of each of its threads."""
    out = {}
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        try:
            threads = {t.name: _task_counters(t) for t in (proc / "task").iterdir()}
            out[pid] = (_task_counters(proc), threads)
        except (OSError, IndexError):
            pass
    return out


def split_rows(before: dict, after: dict, n: int, root: int) -> list[str]:
    rows = []
    for pid, ((name, user, system, _), threads) in after.items():
        if pid not in before:
            continue
        (_, user0, system0, _), threads0 = before[pid]
        if user - user0 + system - system0 == 0:
            continue  # an idle process (Triton's stubs of the models not under load)
        switches = sum(t[3] - threads0[tid][3] for tid, t in threads.items() if tid in threads0)
        role = "main process" if pid == root else "model process"
        rows.append(f"| {name}, {role} | {(user - user0) * TICK_US / n:.1f} | "
                    f"{(system - system0) * TICK_US / n:.1f} | {switches / n:.2f} |")
        busy = [(tid, t) for tid, t in threads.items()
                if tid in threads0 and t[1] + t[2] > threads0[tid][1] + threads0[tid][2]]
        if len(busy) > 1:
            for tid, (tname, tu, ts, tv) in busy:
                _, tu0, ts0, tv0 = threads0[tid]
                rows.append(f"| &nbsp;&nbsp;its thread {tname} {tid} | {(tu - tu0) * TICK_US / n:.1f} | "
                            f"{(ts - ts0) * TICK_US / n:.1f} | {(tv - tv0) / n:.2f} |")
    return rows


def measure(ref, server: Server, case: Case, interval_ms: int) -> str:
    run_generator(ref, "perf_analyzer", server.url(case.protocol), case, 1000)  # warm-up
    pids = process_tree(server.proc.pid)
    before, count0 = snapshot(pids), success_ns(server, case.model)[0]
    client0 = os.times()
    row = run_generator(ref, "perf_analyzer", server.url(case.protocol), case, interval_ms)
    client1 = os.times()
    after, count1 = snapshot(pids), success_ns(server, case.model)[0]
    n = max(count1 - count0, 1)
    lines = [f"{server.kind}, {case.label}: {float(row['Inferences/Second']):.0f} infer/s, "
             f"p50 {float(row['p50 latency']):.0f} µs ({n} inferences counted)", "",
             "| process | user CPU-µs/inf | system CPU-µs/inf | voluntary switches/inf |", "|---|---|---|---|",
             *split_rows(before, after, n, server.proc.pid),
             f"| perf_analyzer | {(client1.children_user - client0.children_user) * 1e6 / n:.1f} | "
             f"{(client1.children_system - client0.children_system) * 1e6 / n:.1f} | |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="small")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", default="1", help="only the cases at this concurrency")
    parser.add_argument("--interval-ms", type=int, default=6000)
    parser.add_argument("--servers", default="triton-shm,triton")
    args = parser.parse_args()
    cases = [c for s in args.scenarios.split(",") for c in SCENARIOS[s]
             if c.protocol in args.protocols.split(",")
             and c.args[c.args.index("--concurrency-range") + 1] == args.concurrency]
    ref = ensure_reference()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo)
        log = open(Path(tmp) / "servers.log", "wb")
        for kind in args.servers.split(","):
            server = Server(kind, repo, ref, log)
            try:
                time.sleep(1)  # let the worker finish loading
                for case in cases:
                    print(measure(ref, server, case, args.interval_ms), end="\n\n", flush=True)
            finally:
                server.stop()


if __name__ == "__main__":
    sys.exit(main())
