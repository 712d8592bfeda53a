"""``triton-shm tune`` on the models of bench/compare_triton.py: what it chooses for each and
the gain over the model's own config, as a Markdown table (docs/benchmarks.md, "tune").

    python bench/tune.py [--models add_sub,sleep_1ms,...] [--time-budget-s 90] [--keep DIR]

Each model is tuned by the command users run (its own server, explicit model control), with
the same flags: a p99 budget, the concurrency sweep 1,4,16, a time budget per model. The gain
is the chosen config's best throughput within the budget over the default's, both measured in
the same run (tune measures the default first).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from compare_triton import build_repository  # noqa: E402

DEFAULT_MODELS = "add_sub,sleep_1ms,cpu_work_1,matmul_nobatch,matmul_batch"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--time-budget-s", type=float, default=90)
    ap.add_argument("--latency-budget-ms", type=float, default=50)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the repository and outputs in DIR")
    ns = ap.parse_args()
    work = Path(ns.keep or tempfile.mkdtemp(prefix="triton-shm-tune-bench-"))
    repo = work / "models"
    if not repo.exists():
        build_repository(repo)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    rows = []
    for model in ns.models.split(","):
        out = work / f"tune-{model}"
        cmd = [sys.executable, "-m", "triton_shm", "tune", "--model-repository", str(repo), "--model", model,
               "--output", str(out), "--latency-budget-ms", f"{ns.latency_budget_ms:g}",
               "--concurrency", ns.concurrency, "--time-budget-s", f"{ns.time_budget_s:g}",
               "--server-arg=--gpus=none"]
        print("$", " ".join(cmd[1:]), flush=True)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        print("\n".join(line for line in p.stderr.splitlines() if not line.startswith("[tune]")), flush=True)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
        rows.append((model, summary))

    def cell(best: dict | None) -> str:
        if not best:
            return "n/a"
        within = "" if best["feasible"] else " (over budget)"
        return f"{best['throughput']:.0f}/s at c{best['concurrency']}, p99 {best['p99_ms']:.1f} ms{within}"

    print(f"\n| model | default config | default, best within {ns.latency_budget_ms:g} ms | tune chose | "
          "chosen, best within the budget | gain | candidates / s |")
    print("|---|---|---|---|---|---|---|")
    for model, s in rows:
        d, c = (s.get("default") or {}), (s.get("chosen") or {})
        db, cb = d.get("best"), c.get("best")
        gain = (f"{cb['throughput'] / db['throughput']:.2f}x" if db and cb and db.get("feasible")
                and db["throughput"] else "n/a (default over budget)" if cb else "n/a")
        chose = c.get("config", "nothing") if c.get("candidate") != "default" else "its own config"
        print(f"| {model} | {d.get('config', '')} | {cell(db)} | {chose} | {cell(cb)} | {gain} | "
              f"{s.get('candidates', 0)} / {s.get('seconds', 0):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
