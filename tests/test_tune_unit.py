"""``triton-shm tune``'s pieces alone: the config.pbtxt rewrite (only the tuned fields change),
the search space of a model, the search order (brute force, hill climb to a local optimum),
and how a candidate is ranked against the latency budget."""
from __future__ import annotations

from triton_shm.core.models.config import config_to_json, parse_pbtxt
from triton_shm.tune.choose import clearly_better, verdict
from triton_shm.tune.configfile import changes, tuned_text
from triton_shm.tune.measure import Point
from triton_shm.tune.pbtxt import replace_fields, top_level_fields
from triton_shm.tune.search import Search
from triton_shm.tune.space import Knobs, Space, apply, knobs_of

USER = """# my model
name: "m"   # its name
backend: "python"
max_batch_size: 8 # up to 8
input [ { name: "I" data_type: TYPE_FP32 dims: [ 4 ] } ]  # one input
output [ { name: "O" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group { count: 1 kind: KIND_CPU }
instance_group { count: 1 kind: KIND_CPU }  # a second group
parameters { key: "note" value { string_value: "braces } and # inside" } }
parameters: { key: "PROCESS_PER_INSTANCE" value: { string_value: "yes" } }
"""


def served() -> dict:
    return config_to_json(parse_pbtxt(USER))


def test_top_level_fields_skip_strings_comments_and_nesting():
    names = [s.name for s in top_level_fields(USER)]
    assert names == ["name", "backend", "max_batch_size", "input", "output", "instance_group", "instance_group",
                     "parameters", "parameters"]
    spans = top_level_fields(USER)
    assert spans[7].text == 'parameters { key: "note" value { string_value: "braces } and # inside" } }'
    assert replace_fields("a: 1\nb: 2\n", [], "c: 3") == "a: 1\nb: 2\nc: 3\n"


def test_tuned_text_changes_only_the_tuned_fields():
    cfg = served()
    base = knobs_of(cfg)
    assert base == Knobs(instances=2, kind="KIND_CPU", max_batch_size=8, queue_delay_us=None,
                         preferred_max=False, process_per_instance=True)
    chosen = Knobs(instances=1, kind="KIND_CPU", max_batch_size=4, queue_delay_us=100, preferred_max=True,
                   process_per_instance=False)
    text = tuned_text(USER, apply(cfg, chosen), base, chosen, ["tuned", "figures"])
    for kept in ("# my model", 'name: "m"   # its name', "# one input",
                 'parameters { key: "note" value { string_value: "braces } and # inside" } }'):
        assert kept in text
    for gone in ("# up to 8", "# a second group", 'string_value: "yes"'):
        assert gone not in text
    assert "# tuned\n# figures\n" in text
    parsed = parse_pbtxt(text)
    assert parsed.max_batch_size == 4 and len(parsed.instance_group) == 1 and parsed.instance_group[0].count == 1
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4]
    assert parsed.parameters["PROCESS_PER_INSTANCE"].string_value == "no"
    assert parsed.parameters["note"].string_value == "braces } and # inside"
    assert knobs_of(config_to_json(parsed)) == chosen
    assert changes(base, chosen) == [
        "instance_group: 2 x KIND_CPU -> 1 x KIND_CPU", "max_batch_size: 8 -> 4",
        "dynamic_batching: off -> max_queue_delay_microseconds 100, preferred_batch_size [ 4 ]",
        "parameters PROCESS_PER_INSTANCE: yes -> no"]
    # nothing chosen differently: the user's file as written, the comment at its end
    assert tuned_text(USER, apply(cfg, base), base, base, ["same"]) == USER + "# same\n"


def test_space_applies_only_what_fits_the_model():
    cfg = served()
    s = Space.for_model(cfg, cores=4, gpus=0)
    assert s.dims["instances"] == [1, 2, 4]
    assert s.dims["max_batch_size"] == [1, 2, 4, 8] and s.dims["queue_delay_us"][0] is None
    assert "kind" not in s.dims and "process_per_instance" in s.dims
    assert "kind" in Space.for_model(cfg, cores=4, gpus=1).dims
    own = dict(cfg, instance_group=[{"count": 1, "kind": "KIND_MODEL"}])
    assert "kind" not in Space.for_model(own, cores=4, gpus=1).dims
    assert apply(own, knobs_of(own))["instance_group"][0]["kind"] == "KIND_MODEL"
    onnx = dict(cfg, backend="onnxruntime", max_batch_size=0)
    s = Space.for_model(onnx, cores=2, gpus=0)
    assert list(s.dims) == ["instances"] and s.size() == 2
    seq = dict(cfg, sequence_batching={})
    assert "queue_delay_us" not in Space.for_model(seq, cores=2, gpus=0).dims


def test_brute_force_small_space_every_candidate_once():
    cfg = dict(served(), backend="onnxruntime", max_batch_size=0)
    space = Space.for_model(cfg, cores=8, gpus=0)
    search = Search(space, knobs_of(cfg), lambda k: None)
    assert search.strategy == "brute force"
    seen = []
    while (k := search.next()) is not None:
        seen.append(k.instances)
    assert seen == [1, 2, 4, 8]


def test_hill_climb_reaches_the_optimum_and_stops():
    """A score peaked at 4 instances, max_batch_size 4, delay 500 us: the climb gets there and
    stops when every neighbour of the best point is measured, long before the whole space."""
    cfg = served()
    space = Space.for_model(cfg, cores=8, gpus=0)
    target = {"instances": 4, "max_batch_size": 4, "queue_delay_us": 500}
    scores: dict = {}

    def value(k: Knobs) -> float:
        d = abs(space.dims["instances"].index(k.instances) - 2) + abs(space.dims["max_batch_size"].index(
            k.max_batch_size) - 2) + abs(space.dims["queue_delay_us"].index(k.queue_delay_us) - 3)
        return -d - (0.1 if k.preferred_max else 0) - (0.1 if not k.process_per_instance else 0)

    search = Search(space, knobs_of(cfg), lambda k: scores.get(k))
    assert search.strategy == "hill climbing"
    n = 0
    while (k := search.next()) is not None:
        scores[k] = (value(k),)
        n += 1
    best = max(scores, key=lambda k: scores[k])
    assert {f: getattr(best, f) for f in target} == target
    assert n < space.size() / 3


def pt(c: int, tp: float, p99: float, errors: int = 0) -> Point:
    return Point(concurrency=c, throughput=tp, p50_ms=p99 / 2, p99_ms=p99, avg_ms=p99 / 2, stable=True,
                 errors=errors)


def test_verdict_respects_the_budget_and_objective():
    points = [pt(1, 100, 5), pt(4, 300, 20), pt(16, 500, 80)]
    v = verdict(points, "throughput", 50)
    assert v is not None and v.feasible and v.point.concurrency == 4
    v = verdict(points, "throughput", None)
    assert v is not None and v.point.concurrency == 16
    v = verdict(points, "latency", 50)
    assert v is not None and v.point.concurrency == 1
    v = verdict(points, "throughput", 1)
    assert v is not None and not v.feasible and "over budget" in v.text
    assert verdict([pt(1, 100, 5, errors=3)], "throughput", None) is None
    a, b = verdict([pt(4, 105, 5)], "throughput", None), verdict([pt(4, 100, 5)], "throughput", None)
    assert a is not None and b is not None
    assert not clearly_better(a, b, "throughput", 10) and clearly_better(a, b, "throughput", 2)
