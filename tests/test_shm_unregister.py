"""Unregistering a shared-memory region that requests use is deferred, as in Triton: the
call succeeds at once, the region stays listed and its name taken (a new registration of
it is ALREADY_EXISTS) until the requests using it are done, then it is gone without
another call. Registry-level tests here (CUDA regions need no GPU at this level); the
end-to-end ones, with a Python model that holds its request, over HTTP and gRPC and with
two front-end processes, are in test_shm.py."""
from __future__ import annotations

import base64

import pytest

from triton_shm.core.data.shm_registry import Region, SharedMemoryRegistry
from triton_shm.errors import AlreadyExists, NotFound

HANDLE = bytes(range(64))


def _cuda(reg: SharedMemoryRegistry, name: str) -> Region:
    region = reg.prepare_cuda(name, base64.b64encode(HANDLE).decode(), 0, 4096)
    reg.add_cuda(region)
    return region


def _names(reg: SharedMemoryRegistry, kind: str = "cuda") -> list[str]:
    return [r["name"] for r in reg.status(kind)]


@pytest.fixture
def reg():
    r = SharedMemoryRegistry(True, [0])
    r.closed = []
    r.on_close = r.closed.append
    yield r
    r.close()


def test_cuda_region_in_use_is_unregistered_when_its_last_user_is_done(reg):
    region = _cuda(reg, "c")
    first, second = reg.acquire("c"), reg.acquire("c")
    assert reg.unregister("cuda", "c") == ["c"]  # in use: kept, marked
    assert _names(reg) == ["c"] and reg.status("cuda", "c")[0]["byte_size"] == 4096
    with pytest.raises(AlreadyExists, match="shared memory region 'c' already in manager"):
        reg.prepare_cuda("c", HANDLE, 0, 64)
    assert reg.cuda_registrations() == []  # what a restarted process registers again: not this one
    assert reg.acquire("c") is region  # still usable, as in Triton
    reg.release(region)
    reg.release(first)
    assert _names(reg) == ["c"] and reg.closed == []
    reg.release(second)
    assert _names(reg) == [] and reg.closed == [region]
    with pytest.raises(NotFound):
        reg.acquire("c")
    again = _cuda(reg, "c")  # the name is free again
    assert again is not region and _names(reg) == ["c"]


def test_unregister_all_keeps_only_the_regions_in_use(reg):
    used, idle = _cuda(reg, "used"), _cuda(reg, "idle")
    held = reg.acquire("used")
    assert reg.unregister("cuda") == ["used"]
    assert _names(reg) == ["used"] and reg.closed == [idle]
    assert reg.unregister("cuda") == ["used"]  # again: still waiting, nothing else happens
    reg.release(held)
    assert _names(reg) == [] and reg.closed == [idle, used]


def test_the_other_kind_is_left_alone(reg):
    _cuda(reg, "c")
    held = reg.acquire("c")
    assert reg.unregister("system", "c") == []
    reg.release(held)
    assert _names(reg) == ["c"] and reg.closed == []  # never marked: stays registered


def test_several_processes_decide_together(reg):
    """``defer_all`` (what each front-end process does on an unregister): every region is
    marked, the idle ones go only on ``drop_idle``, and not those another process uses;
    an idle region is reported through ``on_idle`` instead of going by itself."""
    idle_seen: list[Region] = []
    reg.on_idle = idle_seen.append
    a, b = _cuda(reg, "a"), _cuda(reg, "b")
    held = reg.acquire("a")
    assert reg.unregister("cuda", defer_all=True) == ["a"]
    assert _names(reg) == ["a", "b"] and reg.closed == []
    reg.drop_idle("cuda", "", keep={"b"})  # b is in use in another process
    assert _names(reg) == ["a", "b"]
    reg.release(held)
    assert idle_seen == [a] and reg.still_awaiting(a) and _names(reg) == ["a", "b"]
    reg.drop_idle("cuda")
    assert _names(reg) == [] and reg.closed == [a, b] and not reg.still_awaiting(a)
