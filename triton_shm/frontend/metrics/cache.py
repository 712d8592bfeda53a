"""The response cache's families, under Triton 2.51's names, types and HELP texts: per
model (models with ``response_cache`` on, at zero when the server has no cache, as
Triton shows them) from their statistics, and server-wide gauges read from the cache at
scrape time (only with ``--cache-config``; with several front-end processes, every
process's cache summed: each caches the responses of the models it owns)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from .exposition import Family, Sample

if TYPE_CHECKING:
    from .collect import Loaded
    from ...core.observability.statistics import ModelStats

_PER_MODEL: tuple[tuple[str, str, Callable[["ModelStats"], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.phases["cache_hit"].count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.phases["cache_hit"].ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.phases["cache_miss"].count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.phases["cache_miss"].ns // 1000),
)

@dataclass(frozen=True)
class CacheTotals:
    """The server's response caches as one: ``ResponseCache.counters`` of each front-end
    process that has one, summed (one process: its own cache)."""
    capacity: int
    used: int
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    insertion_ns: int

    @property
    def utilization(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    @classmethod
    def summed(cls, counters: list[dict[str, Any]]) -> "CacheTotals":
        return cls(**{f.name: sum(int(c.get(f.name, 0)) for c in counters) for f in fields(cls)})


_SERVER: tuple[tuple[str, str, Callable[[CacheTotals], float | int]], ...] = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda c: c.utilization),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda c: c.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.lookups),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", lambda c: c.evictions),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
     lambda c: c.lookup_ns // 1000),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
     lambda c: c.insertion_ns // 1000),
)


def model_cache_families(versions: list["Loaded"]) -> list[Family]:
    """Triton's per-model cache counters (they follow the compute durations on its page)."""
    cached = [m for m in versions if m.version.config.response_cache.enable]
    return [Family(name, "counter", help_text, [Sample(m.labels, value(m.stats)) for m in cached])
            for name, help_text, value in _PER_MODEL]


def cache_families(cache: CacheTotals) -> list[Family]:
    return [Family(name, "gauge", help_text, [Sample({}, value(cache))]) for name, help_text, value in _SERVER]
