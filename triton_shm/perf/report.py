"""Output: a perf_analyzer-like block per step, a summary table, CSV (``-f``), PNG (``--plot``)."""
from __future__ import annotations

import csv
import sys
from typing import TextIO

from . import UsageError
from .measure import Result

CLIENT_SATURATED_PCT = 90.0


def _step_name(r: Result) -> str:
    return f"Request concurrency: {r.value:g}" if r.mode == "concurrency" else f"Request Rate: {r.value:g}"


def print_step(r: Result, has_server: bool, percentile: float | None = None, out: TextIO = sys.stdout) -> None:
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(_step_name(r))
    w("  Client: ")
    w(f"    Request count: {r.requests}")
    w(f"    Throughput: {r.throughput:.2f} infer/sec")
    if r.mode == "request_rate":
        w(f"    Send rate: {r.send_rate:.2f} requests/sec")
    if r.pct_us is not None and percentile is not None:
        w(f"    p{percentile:g} latency (selected by --percentile): {r.pct_us:.0f} usec")
    w(f"    Avg latency: {r.avg_us:.0f} usec (standard deviation {r.std_us:.0f} usec)")
    for p, v in (("p50", r.p50_us), ("p90", r.p90_us), ("p95", r.p95_us), ("p99", r.p99_us)):
        w(f"    {p} latency: {v:.0f} usec")
    w(f"    Errors: {r.errors}")
    w(f"    Client CPU: {r.client_cpu_pct:.0f}% of one core")
    if r.server is not None:
        s = r.server_us
        over = max(0.0, s["success"] - s["queue"] - s["compute_input"] - s["compute_infer"] - s["compute_output"])
        w("  Server: ")
        w(f"    Inference count: {r.server.inference_count}")
        w(f"    Execution count: {r.server.execution_count}")
        w(f"    Successful request count: {r.server.success_count}")
        w(f"    Avg request latency: {s['success']:.0f} usec (overhead {over:.0f} usec + queue {s['queue']:.0f} usec"
          f" + compute input {s['compute_input']:.0f} usec + compute infer {s['compute_infer']:.0f} usec"
          f" + compute output {s['compute_output']:.0f} usec)")
    elif not has_server:
        w("  Server: n/a (no statistics extension)")
    w()
    if r.client_cpu_pct > CLIENT_SATURATED_PCT:
        print(f"warning: the client itself is saturated ({r.client_cpu_pct:.0f}% of one core CPU over the "
              "measurement): these numbers may be limited by the load generator, not by the server",
              file=sys.stderr, flush=True)


def print_summary(results: list[Result], percentile: float | None, out: TextIO = sys.stdout) -> None:
    if not results:
        return
    which = f"p{percentile:g}" if percentile is not None else "Average"
    print(f"Inferences/Second vs. Client {which} Batch Latency", file=out)
    for r in results:
        head = f"Concurrency: {r.value:g}" if r.mode == "concurrency" else f"Request Rate: {r.value:g}"
        flag = "" if r.stable else " (unstable)"
        print(f"{head}, throughput: {r.throughput:.2f} infer/sec, latency {r.latency_us:.0f} usec{flag}", file=out)


CSV_COLUMNS = ["Inferences/Second", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
               "Server Compute Infer", "Server Compute Output", "p50 latency", "p90 latency", "p95 latency",
               "p99 latency", "Avg latency", "Errors", "Client CPU %"]


def csv_rows(results: list[Result]) -> list[list[str]]:
    first = "Concurrency" if not results or results[0].mode == "concurrency" else "Request Rate"
    rows = [[first, *CSV_COLUMNS]]
    for r in results:
        s = r.server_us
        server_total = sum(s.get(p, 0.0) for p in ("queue", "compute_input", "compute_infer", "compute_output"))
        net = max(0.0, r.avg_us - server_total) if s else 0.0
        rows.append([f"{r.value:g}", f"{r.throughput:.2f}", f"{net:.0f}",
                     *(f"{s.get(p, 0.0):.0f}" for p in ("queue", "compute_input", "compute_infer", "compute_output")),
                     *(f"{v:.0f}" for v in (r.p50_us, r.p90_us, r.p95_us, r.p99_us, r.avg_us)),
                     str(r.errors), f"{r.client_cpu_pct:.0f}"])
    return rows


def write_csv(path: str, results: list[Result]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(csv_rows(results))


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed; install it "
                         "(pip install 'triton-shm[plot]' or pip install matplotlib) or drop --plot") from None


def write_plot(path: str, results: list[Result], percentile: float | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r.latency_us / 1000 for r in results]
    ys = [r.throughput for r in results]
    ax.plot(xs, ys, marker="o")
    for r, x, y in zip(results, xs, ys):
        ax.annotate(f"{'c' if r.mode == 'concurrency' else 'rate '}{r.value:g}", (x, y),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)
    which = f"p{percentile:g}" if percentile is not None else "average"
    ax.set_xlabel(f"{which} latency (ms)")
    ax.set_ylabel("throughput (infer/sec)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
