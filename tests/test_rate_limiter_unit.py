"""The rate limiter's grant logic on its own: resources, limits, priority order. Grants
are synchronous calls, so every step here is driven by hand."""
from __future__ import annotations

import pytest

from triton_shm.core.models.config import mc
from triton_shm.core.scheduling.rate_limiter import (GLOBAL, GRANTED, IDLE, STAGED, Claim, RateLimiter, ResourceLimit,
                                          claim_for, parse_resource)
from triton_shm.errors import InvalidArgument


class Recorder:
    """Claims whose grants are written down (and held until released by the test)."""

    def __init__(self) -> None:
        self.granted: list[str] = []

    def claim(self, name: str, needs: dict[str, int], priority: int = 1, device: int = 0) -> Claim:
        c = Claim((name, 0), {(device, r): n for r, n in needs.items()}, priority)
        c.on_grant = lambda claim: self.granted.append(claim.instance[0])
        return c


def test_a_count_one_resource_is_held_by_one_at_a_time():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}), rec.claim("b", {"R": 1})
    limiter.register([a, b])
    assert limiter.limits == {(0, "R"): 1}  # the most any instance asks for
    limiter.stage(a)
    limiter.stage(b)
    assert rec.granted == ["a"] and (a.state, b.state) == (GRANTED, STAGED)
    limiter.release(a)
    assert rec.granted == ["a", "b"] and a.state == IDLE and a.executions == 1
    limiter.release(b)
    assert limiter.in_use == {(0, "R"): 0}


def test_resources_that_fit_together_are_granted_together():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}), rec.claim("b", {"R": 2})
    limiter.register([a, b])  # R: 2 exist
    limiter.stage(a)
    limiter.stage(b)
    assert rec.granted == ["a"]  # b needs both
    c = rec.claim("c", {"R": 1})
    limiter.register([c])
    limiter.stage(c)
    assert rec.granted == ["a"]  # c must not pass b, first in line
    limiter.release(a)
    assert rec.granted == ["a", "b"]
    limiter.release(b)
    assert rec.granted == ["a", "b", "c"]


def test_no_resources_no_waiting():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {}), rec.claim("b", {})
    limiter.register([a, b])
    limiter.stage(a)
    limiter.stage(b)
    assert rec.granted == ["a", "b"]


def test_priority_two_gets_half_the_turns():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}, priority=1), rec.claim("b", {"R": 1}, priority=2)
    limiter.register([a, b])
    limiter.stage(a)
    limiter.stage(b)
    claims = {"a": a, "b": b}
    for _ in range(11):  # both always have more work: back in line as they finish
        limiter.release(claims[rec.granted[-1]], restage=True)
    assert "".join(rec.granted) == "ababaabaabaa"
    assert rec.granted.count("a") == 2 * rec.granted.count("b")


def test_priority_zero_counts_as_one():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}, priority=0), rec.claim("b", {"R": 1}, priority=1)
    limiter.register([a, b])
    limiter.stage(a)
    limiter.stage(b)
    for _ in range(5):
        limiter.release({"a": a, "b": b}[rec.granted[-1]], restage=True)
    assert "".join(rec.granted) == "ababab"


def test_give_back_is_not_an_execution():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}), rec.claim("b", {"R": 1})
    limiter.register([a, b])
    limiter.stage(a)
    limiter.stage(b)
    limiter.give_back(a)
    assert a.executions == 0 and rec.granted == ["a", "b"]


def test_a_grant_may_act_on_the_limiter_at_once():
    """The scheduler's grant callback gives back or stages within the grant itself."""
    limiter = RateLimiter()
    order: list[str] = []
    a = Claim(("a", 0), {(0, "R"): 1})
    b = Claim(("b", 0), {(0, "R"): 1})
    a.on_grant = lambda c: (order.append("a"), limiter.give_back(c))  # no work after all
    b.on_grant = lambda c: order.append("b")
    limiter.register([a, b])
    limiter.stage(a)
    assert order == ["a"] and a.state == IDLE
    limiter.stage(b)
    assert order == ["a", "b"] and b.state == GRANTED


def test_unregister_drops_staged_claims_and_limits():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}), rec.claim("b", {"R": 3})
    limiter.register([a, b])
    limiter.stage(b)
    limiter.stage(a)  # waits behind b's grant
    limiter.release(b)
    limiter.unregister([b])
    assert limiter.limits == {(0, "R"): 1}


def test_resources_are_per_device_unless_global():
    rec, limiter = Recorder(), RateLimiter()
    a, b = rec.claim("a", {"R": 1}, device=0), rec.claim("b", {"R": 1}, device=1)
    limiter.register([a, b])
    limiter.stage(a)
    limiter.stage(b)
    assert rec.granted == ["a", "b"]
    g1 = Claim(("g1", 0), {(GLOBAL, "G"): 1}, on_grant=lambda c: rec.granted.append("g1"))
    g2 = Claim(("g2", 0), {(GLOBAL, "G"): 1}, on_grant=lambda c: rec.granted.append("g2"))
    limiter.register([g1, g2])
    limiter.stage(g1)
    limiter.stage(g2)
    assert rec.granted == ["a", "b", "g1"]


# -- explicit limits --------------------------------------------------------------------------
def test_explicit_limit_for_every_device_and_for_one():
    rec = Recorder()
    limiter = RateLimiter([ResourceLimit("R", 2), ResourceLimit("R", 5, 1)])
    a, b = rec.claim("a", {"R": 1}, device=0), rec.claim("b", {"R": 1}, device=1)
    limiter.register([a, b])
    assert limiter.limits == {(0, "R"): 2, (1, "R"): 5}


def test_more_than_exists_fails_with_tritons_message():
    rec = Recorder()
    limiter = RateLimiter([ResourceLimit("R", 2)])
    ok = rec.claim("ok", {"R": 2})
    limiter.register([ok])
    with pytest.raises(InvalidArgument) as info:
        limiter.register([rec.claim("big", {"R": 3})])
    assert info.value.message == ('Resource count for "R" is limited to 2 which will prevent scheduling of one or '
                                  'more model instances, the minimum required count is 3')
    assert limiter.limits == {(0, "R"): 2}  # the failed model left nothing behind


def test_an_unlisted_resource_has_none_once_any_is_listed():
    limiter = RateLimiter([ResourceLimit("R", 2)])
    with pytest.raises(InvalidArgument) as info:
        limiter.register([Claim(("g", 0), {(GLOBAL, "G"): 5})])
    assert info.value.message == ('Resource count for "G" is limited to 0 which will prevent scheduling of one or '
                                  'more model instances, the minimum required count is 5')


def test_global_resource_takes_the_largest_listed_count():
    limiter = RateLimiter([ResourceLimit("G", 1, 0), ResourceLimit("G", 3, 1)])
    limiter.register([Claim(("g", 0), {(GLOBAL, "G"): 2})])
    assert limiter.limits == {(GLOBAL, "G"): 3}


def test_global_and_device_resource_of_one_name_is_refused():
    limiter = RateLimiter()
    with pytest.raises(InvalidArgument) as info:
        limiter.register([Claim(("a", 0), {(GLOBAL, "R"): 1}), Claim(("b", 0), {(0, "R"): 1})])
    assert info.value.message == ('Resource "R" is present as both global and device-specific resource in the '
                                  'model configuration.')


def test_claim_from_an_instance_group():
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[1])
    group.rate_limiter.priority = 3
    group.rate_limiter.resources.add(name="R", count=2)
    g = group.rate_limiter.resources.add(name="G", count=1)
    setattr(g, "global", True)
    claim = claim_for(group, ("gpu1", 0), 1)
    assert (claim.needs, claim.priority) == ({(1, "R"): 2, (GLOBAL, "G"): 1}, 3)
    cpu = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)
    cpu.rate_limiter.resources.add(name="R", count=1)
    assert claim_for(cpu, ("cpu", 0), None).needs == {(0, "R"): 1}  # CPU instances count as device 0
    assert claim_for(cpu, ("cpu", 0), None).priority == 1


@pytest.mark.parametrize("text, expected", [
    ("R:1", ResourceLimit("R", 1)), ("R:4:1", ResourceLimit("R", 4, 1)), ("Big_R:0", ResourceLimit("Big_R", 0)),
])
def test_parse_resource(text, expected):
    assert parse_resource(text) == expected


@pytest.mark.parametrize("text", ["R", "R:x", ":1", "R:1:2:3", "R:1:y"])
def test_parse_resource_errors(text):
    with pytest.raises(ValueError) as info:
        parse_resource(text)
    assert str(info.value) == ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                               f"'<resource_name>:<count>'. Got {text}")
