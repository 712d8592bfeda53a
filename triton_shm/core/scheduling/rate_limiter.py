"""The rate limiter (``--rate-limit execution_count``): a model instance executes only
once the resources its ``instance_group { rate_limiter { resources [...] } }`` names
are free, across every model of the server.

A resource is per device (an instance's GPU; CPU instances count as device 0, as in
Triton) unless the config marks it ``global``. How many of each exist: the largest
count any loaded instance asks for, or, once any ``--rate-limit-resource
name:count[:device]`` is given, what those flags say (0 for a resource they leave
out); an instance that asks for more than exists fails to load.

Schedulers stage an instance (:meth:`RateLimiter.stage`) when it is free and has work;
the limiter grants staged instances strictly in order of their executions times their
``priority`` (so priority 2 gets half the turns of priority 1), the first staged
breaking ties, and never lets a later one pass the first while that one's resources
are taken. A grant is a synchronous call to the claim's ``on_grant``; the scheduler
then runs one batch and releases the claim when the worker answers. Everything runs
on the event loop: no locks, no timers.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from ...errors import InvalidArgument

if TYPE_CHECKING:
    from ..._proto.model_config_pb2 import ModelInstanceGroup

GLOBAL = -1  # the device of global resources
MODES = ("execution_count", "off")

IDLE, STAGED, GRANTED = "idle", "staged", "granted"


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One ``--rate-limit-resource``: ``device`` None applies to every device."""
    name: str
    count: int
    device: int | None = None


def parse_resource(text: str) -> ResourceLimit:
    """``name:count`` or ``name:count:device`` (the name is case-sensitive)."""
    parts = text.split(":")
    error = ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
             f"'<resource_name>:<count>'. Got {text}")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(error)
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(error) from None
    if numbers[0] < 0 or (len(numbers) == 2 and numbers[1] < 0):
        raise ValueError(f"--rate-limit-resource {text}: the count and device must not be negative")
    return ResourceLimit(parts[0], numbers[0], numbers[1] if len(numbers) == 2 else None)


@dataclass(eq=False)
class Claim:
    """One model instance as the limiter sees it: what it needs, and how to tell it that
    it may run. ``on_grant(claim)`` must run one execution and later call
    :meth:`RateLimiter.release`, or hand the grant back with :meth:`RateLimiter.give_back`."""
    instance: tuple[str, int]
    needs: dict[tuple[int, str], int]  # (device or GLOBAL, resource) -> count
    priority: int = 1
    on_grant: Callable[["Claim"], None] | None = None
    executions: int = 0
    state: str = IDLE
    staged_at: int = 0

    @property
    def order(self) -> tuple[int, int]:
        return self.executions * max(self.priority, 1), self.staged_at


def claim_for(group: "ModelInstanceGroup", instance: tuple[str, int], device: int | None) -> Claim:
    """An instance's claim from its instance group (``device`` None for a CPU instance)."""
    limiter = group.rate_limiter
    needs: dict[tuple[int, str], int] = {}
    for r in limiter.resources:
        key = (GLOBAL if getattr(r, "global") else (device or 0), r.name)
        needs[key] = max(needs.get(key, 0), r.count)
    return Claim(instance, needs, limiter.priority or 1)


@dataclass(eq=False)
class RateLimiter:
    explicit: list[ResourceLimit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._claims: list[Claim] = []
        self.limits: dict[tuple[int, str], int] = {}
        self.in_use: dict[tuple[int, str], int] = {}
        self._staged: list[Claim] = []
        self._seq = itertools.count()
        self._granting = False
        self._again = False

    # -- instances coming and going ---------------------------------------------------------
    def register(self, claims: Iterable[Claim]) -> None:
        """Add a model's instances; raises InvalidArgument (Triton's text) when one of them
        needs more of a resource than exists, and then adds none of them."""
        claims = list(claims)
        limits = _limits([*self._claims, *claims], self.explicit)
        self._claims.extend(claims)
        self.limits = limits

    def unregister(self, claims: Iterable[Claim]) -> None:
        gone = set(map(id, claims))
        self._claims = [c for c in self._claims if id(c) not in gone]
        self._staged = [c for c in self._staged if id(c) not in gone]
        self.limits = _limits(self._claims, self.explicit)
        self._attempt()

    # -- the grant cycle --------------------------------------------------------------------
    def stage(self, claim: Claim) -> None:
        """The instance is free and has work: grant it when its turn and resources come."""
        if claim.state != IDLE:
            return
        self._enqueue(claim)
        self._attempt()

    def release(self, claim: Claim, restage: bool = False) -> None:
        """The instance's execution is over: its resources go to the next in line. With
        ``restage`` (it has more work) it is back in line before that is chosen."""
        if claim.state != GRANTED:
            return
        claim.executions += 1
        self._free(claim)
        if restage:
            self._enqueue(claim)
        self._attempt()

    def give_back(self, claim: Claim) -> None:
        """A grant the instance did not use (its work went away meanwhile)."""
        if claim.state == GRANTED:
            self._free(claim)
            self._attempt()

    def _free(self, claim: Claim) -> None:
        for key, n in claim.needs.items():
            self.in_use[key] -= n
        claim.state = IDLE

    def _enqueue(self, claim: Claim) -> None:
        claim.state, claim.staged_at = STAGED, next(self._seq)
        self._staged.append(claim)

    def _fits(self, claim: Claim) -> bool:
        return all(self.in_use.get(key, 0) + n <= self.limits.get(key, 0) for key, n in claim.needs.items())

    def _attempt(self) -> None:
        # A grant runs the scheduler, which may stage, release or give back at once:
        # those calls only ask for another pass, so grants happen one at a time.
        if self._granting:
            self._again = True
            return
        self._granting = True
        try:
            self._again = True
            while self._again:
                self._again = False
                while self._staged:
                    first = min(self._staged, key=lambda c: c.order)
                    if not self._fits(first):
                        break  # nobody passes the first in line
                    self._staged.remove(first)
                    for key, n in first.needs.items():
                        self.in_use[key] = self.in_use.get(key, 0) + n
                    first.state = GRANTED
                    if first.on_grant is not None:
                        first.on_grant(first)
        finally:
            self._granting = False


def _limits(claims: list[Claim], explicit: list[ResourceLimit]) -> dict[tuple[int, str], int]:
    """How many of each resource exist: the most any instance needs, or with explicit
    limits what they say; raises when an instance needs more than that."""
    needed: dict[tuple[int, str], int] = {}
    for claim in claims:
        for key, n in claim.needs.items():
            needed[key] = max(needed.get(key, 0), n)
    global_names = {name for device, name in needed if device == GLOBAL}
    for device, name in needed:
        if device != GLOBAL and name in global_names:
            raise InvalidArgument(f'Resource "{name}" is present as both global and device-specific resource in '
                                  "the model configuration.")
    if not explicit:
        return needed
    limits = {}
    for (device, name), n in needed.items():
        counts = [r.count for r in explicit
                  if r.name == name and (device == GLOBAL or r.device is None or r.device == device)]
        available = max(counts, default=0)
        if available < n:
            raise InvalidArgument(f'Resource count for "{name}" is limited to {available} which will prevent '
                                  "scheduling of one or more model instances, the minimum required count is "
                                  f"{n}")
        limits[(device, name)] = available
    return limits


def bind_claims(claims: list[Claim] | None, on_grant: Callable[[Claim], None]) -> dict[tuple[str, int], Claim]:
    """A scheduler's claims by instance, each granted through ``on_grant``."""
    by_instance = {c.instance: c for c in claims or ()}
    for claim in by_instance.values():
        claim.on_grant = on_grant
    return by_instance
