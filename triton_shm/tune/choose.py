"""How tune ranks a measured candidate, and when a change to the user's config has earned its place."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

@dataclass
class Verdict:
    """A measured candidate's rank: feasible ones (a point within the budget) above the rest."""

    key: tuple[Any, ...]
    point: Any            # the Point that gives the score
    feasible: bool
    text: str = ""


def verdict(points: list, objective: str, budget_ms: float | None) -> Verdict | None:
    good = [p for p in points if p.errors == 0 and p.throughput > 0]
    if not good:
        return None
    within = [p for p in good if budget_ms is None or p.p99_ms <= budget_ms]
    if within:
        if objective == "throughput":
            best = max(within, key=lambda p: (p.throughput, -p.p99_ms))
            key: tuple[Any, ...] = (1, best.throughput, -best.p99_ms)
        else:
            best = min(within, key=lambda p: (p.p99_ms, -p.throughput))
            key = (1, -best.p99_ms, best.throughput)
        return Verdict(key, best, True, f"{best.throughput:.1f} infer/s at concurrency {best.concurrency}, "
                                        f"p99 {best.p99_ms:.2f} ms")
    best = min(good, key=lambda p: p.p99_ms)  # nearest the budget, to lead the climb there
    return Verdict((0, -best.p99_ms, best.throughput), best, False,
                   f"over budget: lowest p99 {best.p99_ms:.2f} ms at concurrency {best.concurrency}")


def clearly_better(a: Verdict, b: Verdict, objective: str, noise_pct: float) -> bool:
    """Whether ``a`` beats ``b`` by more than the stability tolerance: a change to the user's config
    has to earn its place."""
    margin = 1.0 + noise_pct / 100.0
    if objective == "throughput":
        return a.point.throughput > b.point.throughput * margin
    return a.point.p99_ms * margin < b.point.p99_ms
