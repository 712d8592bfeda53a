"""Statistics summed over front-end processes: ModelStats snapshots and merge_statistics."""
from __future__ import annotations

import copy
import json

from triton_shm.core.observability.statistics import ModelStats, merge_statistics


def served(name: str, version: str, *, singles: int = 0, batch4: int = 0, failures: int = 0,
           cache_hits: int = 0) -> ModelStats:
    """Statistics that recorded real requests: ``singles`` batches of one, ``batch4``
    executions of four requests, ``failures`` BACKEND failures, ``cache_hits`` hits."""
    stats = ModelStats(name, version)
    for i in range(singles):
        stats.record_single(1, 10_000 + i, 1_000, 2_000, 5_000 + i, 500)
    for _ in range(batch4):
        stats.record_execution(4, 300, 7_000, 200)
        for _ in range(4):
            stats.record_success(1, 20_000, 3_000, 75, 1_750, 50)
    for _ in range(failures):
        stats.record_failure(4_000, "BACKEND")
    for _ in range(cache_hits):
        stats.record_cache_hit(900, 100, 400)
    return stats


def test_snapshot_is_json_and_adds_every_count():
    a = served("m", "1", singles=3, batch4=2, failures=1)
    b = served("m", "1", singles=2, batch4=1, failures=2, cache_hits=1)
    b.record_failure(1_000, "REJECTED")
    b.pending = 4
    a.last_inference_ms, b.last_inference_ms = 5_000, 7_000

    snap = json.loads(json.dumps(b.snapshot()))  # what crosses a process boundary
    a.add_snapshot(snap)

    assert a.inference_count == 3 + 8 + 2 + 4
    assert a.execution_count == 3 + 2 + 2 + 1
    assert a.last_inference_ms == 7_000
    assert a.pending == 4
    assert a.phases["success"].count == 3 + 8 + 2 + 4 + 1
    assert a.phases["success"].ns == (30_003 + 160_000) + (20_001 + 80_000 + 900)
    assert a.phases["compute_infer"].ns == (15_003 + 14_000) + (10_001 + 7_000)
    assert a.phases["fail"].count == 4 and a.phases["fail"].ns == 3 * 4_000 + 1_000
    assert a.phases["cache_hit"].as_dict() == {"count": 1, "ns": 400}
    assert a.failures == {"BACKEND": 3, "REJECTED": 1}
    assert sorted(a.batches) == [1, 4]
    assert a.batches[1].compute_infer.as_dict() == {"count": 5, "ns": 15_003 + 10_001}
    assert a.batches[4].compute_input.as_dict() == {"count": 3, "ns": 900}


def test_merged_copy_leaves_the_local_stats_and_shares_summaries():
    local = served("m", "2", singles=2)
    local.enable_summaries()
    local.record_single(1, 1_000_000, 0, 0, 1_000_000, 0)
    before = local.as_dict()
    peer = served("m", "2", batch4=1).snapshot()

    merged = local.merged_with([peer, peer])

    assert local.as_dict() == before
    assert merged.inference_count == 3 + 2 * 4
    assert merged.batches[4].compute_infer.count == 2
    assert merged.summaries is local.summaries  # per process: quantiles cannot be summed
    assert merged.summaries is not None and merged.summaries["request"].count == 1


def test_merge_sums_the_same_version_and_keeps_the_others():
    p0 = [served("a", "1", singles=2).as_dict(), served("b", "1", batch4=1).as_dict()]
    p1 = [served("a", "1", singles=1, batch4=2).as_dict(), served("a", "2", singles=5).as_dict()]
    p2 = [served("b", "1", singles=1, failures=3).as_dict(), served("c", "10", singles=1).as_dict(),
          served("c", "9", singles=1).as_dict()]
    p0[0]["last_inference"], p1[0]["last_inference"] = 9_000, 8_000
    inputs = copy.deepcopy((p0, p1, p2))

    merged = merge_statistics(p0, [p1, p2])

    assert (p0, p1, p2) == inputs  # nothing changed in place
    assert [(e["name"], e["version"]) for e in merged] == [("a", "1"), ("a", "2"), ("b", "1"), ("c", "9"),
                                                           ("c", "10")]
    a1, a2, b1 = merged[0], merged[1], merged[2]
    assert a1["inference_count"] == 2 + 1 + 8 and a1["execution_count"] == 2 + 1 + 2
    assert a1["last_inference"] == 9_000
    assert a1["inference_stats"]["success"] == {"count": 11, "ns": 20_001 + 10_000 + 160_000}
    assert [b["batch_size"] for b in a1["batch_stats"]] == [1, 4]
    assert a1["batch_stats"][0]["compute_infer"] == {"count": 3, "ns": 5_000 + 5_001 + 5_000}
    assert a1["batch_stats"][1]["compute_output"] == {"count": 2, "ns": 400}
    assert a2 == p1[1]  # listed by one process only: as it is
    assert b1["inference_stats"]["fail"] == {"count": 3, "ns": 12_000}
    assert b1["inference_count"] == 4 + 1
    assert set(a1) == set(p0[0])  # the statistics extension's fields, no more


def test_merge_of_one_process_is_its_list():
    local = [served("a", "1", singles=2, batch4=1).as_dict(), served("b", "3", failures=1).as_dict()]
    assert merge_statistics(local, []) == local
    assert merge_statistics([], [[], local]) == local
