"""What tune varies, for one model: the knobs that apply to it, a candidate's config, and the
order candidates are tried in (hill-climbing from a sensible start, as Model Analyzer's
"quick" search; every point when the space is small).

A point of the space is one index per dimension. Each dimension is an ordered list of
values, so that a neighbour (one index up or down in one dimension) is a small change:
instance counts 1, 2, 4 … cores; max_batch_size 1, 2, 4 … the model's; batching off, then
on with growing queue delays; and the two-valued ones (kind, preferred batch size,
process per instance).
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

PROCESS_PER_INSTANCE = "PROCESS_PER_INSTANCE"
QUEUE_DELAYS_US = (0, 100, 500, 2000)
BRUTE_FORCE_MAX = 12          # a space this small is measured whole


@dataclass(frozen=True)
class Knobs:
    """The tuned fields of one candidate. ``queue_delay_us`` is None with dynamic batching off."""

    instances: int
    kind: str = "KIND_CPU"
    max_batch_size: int = 0
    queue_delay_us: int | None = None
    preferred_max: bool = False               # preferred_batch_size [ max_batch_size ]
    process_per_instance: bool | None = None  # Python models only

    @property
    def dynamic_batching(self) -> bool:
        return self.queue_delay_us is not None

    def label(self) -> str:
        parts = [f"{self.instances}x{self.kind[5:]}"]
        if self.max_batch_size:
            parts.append(f"mbs {self.max_batch_size}")
            parts.append(f"dyn {self.queue_delay_us}us" if self.dynamic_batching else "no dyn")
            if self.preferred_max:
                parts.append(f"pref {self.max_batch_size}")
        if self.process_per_instance is False:
            parts.append("shared proc")
        return ", ".join(parts)


def knobs_of(config: dict[str, Any]) -> Knobs:
    """The knobs of a served config (JSON, as the model-config API returns it)."""
    groups = config.get("instance_group") or [{}]
    count = sum(int(g.get("count", 1) or 1) * max(1, len(g.get("gpus") or []) if g.get("kind") == "KIND_GPU"
                                                 else 1) for g in groups)
    kind = groups[0].get("kind") or "KIND_CPU"
    mbs = int(config.get("max_batch_size", 0) or 0)
    dyn = config.get("dynamic_batching")
    delay = int(dyn.get("max_queue_delay_microseconds", 0) or 0) if isinstance(dyn, dict) else None
    preferred = [int(x) for x in (dyn or {}).get("preferred_batch_size", []) or []] if isinstance(dyn, dict) else []
    ppi = None
    if config.get("backend") == "python":
        value = ((config.get("parameters") or {}).get(PROCESS_PER_INSTANCE) or {}).get("string_value", "")
        ppi = value.strip().lower() not in ("no", "false", "0", "off")
    return Knobs(instances=max(1, count), kind=kind,
                 max_batch_size=mbs, queue_delay_us=delay if mbs else None,
                 preferred_max=bool(mbs and preferred == [mbs]), process_per_instance=ppi)


def apply(config: dict[str, Any], k: Knobs) -> dict[str, Any]:
    """The served config with the candidate's knobs: what tune loads as the config override."""
    c = copy.deepcopy(config)
    group = dict((c.get("instance_group") or [{}])[0])
    group.update(count=k.instances, kind=k.kind)
    if k.kind != "KIND_GPU":
        group.pop("gpus", None)
    group.pop("name", None)
    c["instance_group"] = [group]
    if k.max_batch_size:
        c["max_batch_size"] = k.max_batch_size
        if k.dynamic_batching:
            dyn = dict(c.get("dynamic_batching") or {})
            dyn["max_queue_delay_microseconds"] = k.queue_delay_us
            if k.preferred_max:
                dyn["preferred_batch_size"] = [k.max_batch_size]
            else:
                dyn.pop("preferred_batch_size", None)
            c["dynamic_batching"] = dyn
        else:
            c.pop("dynamic_batching", None)
    if k.process_per_instance is not None:
        params = dict(c.get("parameters") or {})
        if k.process_per_instance:
            params.pop(PROCESS_PER_INSTANCE, None)
        else:
            params[PROCESS_PER_INSTANCE] = {"string_value": "no"}
        c["parameters"] = params
    return c


def _powers_up_to(n: int) -> list[int]:
    out, v = [], 1
    while v < n:
        out.append(v)
        v *= 2
    return out + [n]


@dataclass
class Space:
    """The dimensions that apply to one model, in a fixed order."""

    dims: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def for_model(cls, config: dict[str, Any], *, cores: int, gpus: int, max_batch_size_cap: int | None = None
                  ) -> "Space":
        base = knobs_of(config)
        dims: dict[str, list[Any]] = {}
        if gpus and base.kind in ("KIND_CPU", "KIND_GPU"):  # KIND_MODEL: the model places itself
            dims["kind"] = ["KIND_CPU", "KIND_GPU"]
        dims["instances"] = _powers_up_to(max(1, cores))
        if base.max_batch_size and "sequence_batching" not in config:
            cap = max(1, max_batch_size_cap or base.max_batch_size)
            dims["max_batch_size"] = _powers_up_to(cap)
            dims["queue_delay_us"] = [None, *QUEUE_DELAYS_US]
            dims["preferred_max"] = [False, True]
        elif base.max_batch_size:
            dims["max_batch_size"] = _powers_up_to(max(1, max_batch_size_cap or base.max_batch_size))
        if config.get("backend") == "python":
            dims["process_per_instance"] = [True, False]
        return cls(dims)

    def size(self) -> int:
        n = 1
        for values in self.dims.values():
            n *= len(values)
        return n

    def knobs(self, point: tuple[int, ...], base: Knobs) -> Knobs:
        values = {name: self.dims[name][i] for name, i in zip(self.dims, point)}
        k = replace(base, **values)
        if not k.dynamic_batching and k.preferred_max:  # meaningless without the dynamic batcher
            k = replace(k, preferred_max=False)
        return k

    def start(self) -> tuple[int, ...]:
        """Where the climb starts: one CPU instance, the largest batch, dynamic batching with no
        delay, its own process (Model Analyzer's quick search also starts small)."""
        point = []
        for name, values in self.dims.items():
            if name == "max_batch_size":
                point.append(len(values) - 1)
            elif name == "queue_delay_us":
                point.append(1)
            else:
                point.append(0)
        return tuple(point)

    def neighbours(self, point: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        for d, values in enumerate(self.dims.values()):
            for step in (1, -1):
                i = point[d] + step
                if 0 <= i < len(values):
                    yield point[:d] + (i,) + point[d + 1:]

    def all_points(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(len(v)) for v in self.dims.values()))
