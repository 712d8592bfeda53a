"""The order candidates are measured in: every point of a small space, else a hill climb.

The climb (the anchor is Model Analyzer's "quick" search): measure the start; measure its
unmeasured neighbours; move to the best point measured so far and measure its neighbours;
stop when the best point's neighbours are all measured (a local optimum), when the space
is exhausted, or when the caller stops asking (the time budget).
"""
from __future__ import annotations

from typing import Any, Callable

from .space import BRUTE_FORCE_MAX, Knobs, Space

Score = tuple[Any, ...]


class Search:
    def __init__(self, space: Space, base: Knobs, score: Callable[[Knobs], Score | None]):
        """``score(knobs)``: the measured candidate's rank (higher is better), None if not measured."""
        self.space, self.base, self._score = space, base, score
        self.brute = space.size() <= BRUTE_FORCE_MAX
        self._queue: list[tuple[int, ...]] = list(space.all_points()) if self.brute else [space.start()]
        self._handed: dict[Knobs, tuple[int, ...]] = {}
        self._expanded: set[tuple[int, ...]] = set()

    @property
    def strategy(self) -> str:
        return "brute force" if self.brute else "hill climbing"

    def planned(self) -> int:
        """Candidates handed out plus those queued (an upper bound grows as the climb moves)."""
        return len(self._handed) + len({self.space.knobs(p, self.base) for p in self._queue} - set(self._handed))

    def next(self) -> Knobs | None:
        while True:
            while self._queue:
                point = self._queue.pop(0)
                k = self.space.knobs(point, self.base)
                if k not in self._handed:
                    self._handed[k] = point
                    return k
            if self.brute:
                return None
            scored = [(s, p) for k, p in self._handed.items() if (s := self._score(k)) is not None]
            if not scored:
                return None
            best = max(scored, key=lambda sp: sp[0])[1]
            if best in self._expanded:
                return None  # a local optimum: every neighbour of the best point is measured
            self._expanded.add(best)
            self._queue = list(self.space.neighbours(best))
