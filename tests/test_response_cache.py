"""The response cache end to end: the real server, tritonclient over HTTP and gRPC.

The test model counts its executions and returns the count (RUNS), so an answer from
the cache shows itself: it carries the count of the execution that made it."""
from __future__ import annotations

import itertools
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess, free_port
from .models import write_model

COUNTER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.runs += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.size and x.flat[0] < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"negative input (run {self.runs})")))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32)),
                pb_utils.Tensor("RUNS", np.array([self.runs], dtype=np.int64))]))
        return responses
"""


TEXT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        self.runs += len(requests)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("TEXT_OUT", pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()),
            pb_utils.Tensor("RUNS", np.array([self.runs], dtype=np.int64))]) for r in requests]
"""
TEXT_CONFIG = """
    name: "text"
    backend: "python"
    max_batch_size: 0
    input [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]
    output [{ name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] },
            { name: "RUNS" data_type: TYPE_INT64 dims: [ 1 ] }]
    response_cache { enable: true }
"""


# An ensemble with the cache on over "plain", which has it off.
ENSEMBLE_CONFIG = """
    name: "ens"
    platform: "ensemble"
    max_batch_size: 0
    input [{ name: "X" data_type: TYPE_FP32 dims: [ -1, -1 ] }]
    output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1, -1 ] }, { name: "N" data_type: TYPE_INT64 dims: [ 1 ] }]
    ensemble_scheduling { step [{ model_name: "plain" model_version: -1 input_map { key: "INPUT0" value: "X" }
                                  output_map [{ key: "OUTPUT0" value: "Y" }, { key: "RUNS" value: "N" }] }] }
    response_cache { enable: true }
"""


def counter_config(name: str, cache: bool = True, decoupled: bool = False) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
                {{ name: "RUNS" data_type: TYPE_INT64 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
        {"response_cache { enable: true }" if cache else ""}
        {"model_transaction_policy { decoupled: true }" if decoupled else ""}
    """


def counter_model(repo: Path, name: str, **kw) -> None:
    write_model(repo, name, config=counter_config(name, **kw), model_py=COUNTER_PY)


def start(root: Path, models: dict[str, dict], *flags: str, text: bool = False) -> ServerProcess:
    repo = root / "models"
    for name, kw in models.items():
        counter_model(repo, name, **kw)
    if text:
        write_model(repo, "text", config=TEXT_CONFIG, model_py=TEXT_PY)
        write_model(repo, "ens", config=ENSEMBLE_CONFIG)
    port = free_port()
    srv = ServerProcess(repo, root / "server.log", extra_args=[
        "--allow-metrics=true", "--metrics-port", str(port), "--allow-cpu-metrics=false",
        "--allow-gpu-metrics=false", *flags]).start()
    srv.metrics_port = port
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("cache"),
                {"counter": {}, "counter_stats": {}, "plain": {"cache": False}, "dec": {"decoupled": True}},
                "--cache-config", "local,size=1048576", "--allow-client-shm=true",
                "--exit-on-error=false", "--strict-readiness=false", text=True)
    yield srv
    srv.stop_cleanly()


def module(proto: str):
    return httpclient if proto == "http" else grpcclient


def client(proto: str, srv: ServerProcess):
    return httpclient.InferenceServerClient(srv.http_url) if proto == "http" \
        else grpcclient.InferenceServerClient(srv.grpc_url)


_values = itertools.count(1)


def fresh(shape=(1, 4)) -> np.ndarray:
    """Input no other test sends (so no other test's entry answers it)."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float32) + 1000 * next(_values)).reshape(shape)


def infer(proto: str, srv: ServerProcess, model: str, x: np.ndarray, rid: str = "", outputs=None):
    mod = module(proto)
    inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    requested = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    with client(proto, srv) as cl:
        return cl.infer(model, [inp], request_id=rid, outputs=requested)


def response_id(proto: str, result) -> str:
    return result.get_response()["id"] if proto == "http" else result.get_response().id


def stats(srv: ServerProcess, model: str) -> dict:
    with httpclient.InferenceServerClient(srv.http_url) as cl:
        return cl.get_inference_statistics(model)["model_stats"][0]


def grpc_stats(srv: ServerProcess, model: str) -> dict:
    with grpcclient.InferenceServerClient(srv.grpc_url) as cl:
        return cl.get_inference_statistics(model, as_json=True)["model_stats"][0]


def scrape(srv: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def cache_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "nv_cache_" in line]


# -- hits and misses ---------------------------------------------------------------------------
def test_a_repeated_request_is_answered_from_the_cache(proto, server):
    x = fresh()
    first = infer(proto, server, "counter", x, rid="first")
    second = infer(proto, server, "counter", x, rid="second")
    assert second.as_numpy("RUNS")[0] == first.as_numpy("RUNS")[0]  # the model did not run again
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), x + 1)
    assert (response_id(proto, first), response_id(proto, second)) == ("first", "second")


def test_hits_are_shared_by_http_and_grpc(server):
    x = fresh()
    over_http = infer("http", server, "counter", x)
    over_grpc = infer("grpc", server, "counter", x)
    assert over_grpc.as_numpy("RUNS")[0] == over_http.as_numpy("RUNS")[0]
    np.testing.assert_array_equal(over_grpc.as_numpy("OUTPUT0"), x + 1)


def test_the_same_bytes_under_another_shape_are_a_miss(proto, server):
    x = fresh((1, 4))
    first = infer(proto, server, "counter", x)
    other = infer(proto, server, "counter", x.reshape(2, 2))
    assert other.as_numpy("RUNS")[0] == first.as_numpy("RUNS")[0] + 1
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), x.reshape(2, 2) + 1)


def test_other_requested_outputs_are_a_miss(proto, server):
    x = fresh()
    runs = stats(server, "counter")["execution_count"]
    only = infer(proto, server, "counter", x, outputs=["OUTPUT0"])
    both = infer(proto, server, "counter", x, outputs=["OUTPUT0", "RUNS"])
    assert stats(server, "counter")["execution_count"] == runs + 2
    assert only.as_numpy("RUNS") is None
    assert both.as_numpy("RUNS")[0] == runs + 2
    again = infer(proto, server, "counter", x, outputs=["OUTPUT0", "RUNS"])  # now that one is cached
    assert again.as_numpy("RUNS")[0] == runs + 2


def test_error_responses_are_not_cached(proto, server):
    x = -fresh()
    messages = []
    for _ in range(2):
        with pytest.raises(InferenceServerException) as info:
            infer(proto, server, "counter", x)
        assert info.value.status() == ("500" if proto == "http" else "StatusCode.INTERNAL")
        messages.append(re.search(r"negative input \(run (\d+)\)", info.value.message()).group(1))
    assert int(messages[1]) == int(messages[0]) + 1  # the model ran both times


def test_statistics_as_triton_counts_them(server):
    x = fresh()
    infer("http", server, "counter_stats", x)  # miss: runs
    infer("http", server, "counter_stats", x)  # hit
    infer("grpc", server, "counter_stats", x)  # hit
    s = stats(server, "counter_stats")
    assert (s["inference_count"], s["execution_count"]) == (1, 1)
    counts = {phase: d["count"] for phase, d in s["inference_stats"].items()}
    assert counts == {"success": 3, "fail": 0, "queue": 3, "compute_input": 1, "compute_infer": 1,
                      "compute_output": 1, "cache_hit": 2, "cache_miss": 1}
    assert s["inference_stats"]["cache_hit"]["ns"] > 0 and s["inference_stats"]["cache_miss"]["ns"] > 0
    g = grpc_stats(server, "counter_stats")["inference_stats"]
    assert {phase: int(g[phase].get("count", 0)) for phase in counts} == counts
    assert int(g["cache_hit"]["ns"]) == s["inference_stats"]["cache_hit"]["ns"]


def test_a_model_without_the_cache_reports_zeros(server):
    x = fresh()
    before = stats(server, "plain")["execution_count"]
    infer("http", server, "plain", x)
    infer("http", server, "plain", x)
    s = stats(server, "plain")
    assert s["execution_count"] == before + 2
    assert s["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    assert s["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}
    g = grpc_stats(server, "plain")["inference_stats"]
    assert g["cache_hit"] == {} and g["cache_miss"] == {}  # proto3 JSON: present, all zero


def test_an_ensemble_is_cached_as_a_whole(server):
    x = fresh()
    with grpcclient.InferenceServerClient(server.grpc_url) as cl:
        runs = []
        for _ in range(2):
            inp = grpcclient.InferInput("X", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            result = cl.infer("ens", [inp])
            np.testing.assert_array_equal(result.as_numpy("Y"), x + 1)
            runs.append(result.as_numpy("N")[0])
    assert runs[1] == runs[0]  # the step did not run again
    assert stats(server, "ens")["inference_stats"]["cache_hit"]["count"] == 1


def test_decoupled_model_with_the_cache_is_refused_at_load(server):
    with httpclient.InferenceServerClient(server.http_url) as cl:
        index = {m["name"]: m for m in cl.get_model_repository_index()}
    assert index["dec"]["state"] == "UNAVAILABLE"
    assert index["dec"]["reason"] == ("Response Cache does not currently support model dec with 'decoupled' "
                                      "transaction policy. Please disable the response cache.")


def test_per_model_metrics_follow_the_statistics(server):
    text = scrape(server)
    per_model = [line for line in cache_lines(text) if "_per_model" in line and not line.startswith("#")]
    models = {re.search(r'model="([^"]+)"', line).group(1) for line in per_model}
    assert models == {"counter", "counter_stats", "text", "ens"}  # only models with the cache on
    s = stats(server, "counter_stats")["inference_stats"]
    labels = '{model="counter_stats",version="1"}'
    for line in (f"nv_cache_num_hits_per_model{labels} {s['cache_hit']['count']}",
                 f"nv_cache_hit_duration_per_model{labels} {s['cache_hit']['ns'] // 1000}",
                 f"nv_cache_num_misses_per_model{labels} {s['cache_miss']['count']}",
                 f"nv_cache_miss_duration_per_model{labels} {s['cache_miss']['ns'] // 1000}"):
        assert line in per_model


# -- shared memory ---------------------------------------------------------------------------
def test_a_hit_is_written_into_the_shared_memory_output(proto, server):
    x = fresh()
    tag = f"cache_{proto}_{next(_values)}"
    regions = [shm.create_shared_memory_region(f"{tag}_{n}", f"/{tag}_{n}", 16) for n in ("in", "out")]
    mod = module(proto)
    try:
        with client(proto, server) as cl:
            for n in ("in", "out"):
                cl.register_system_shared_memory(f"{tag}_{n}", f"/{tag}_{n}", 16)
            shm.set_shared_memory_region(regions[0], [x])
            runs = []
            for _ in range(2):
                shm.set_shared_memory_region(regions[1], [np.zeros_like(x)])
                inp = mod.InferInput("INPUT0", [1, 4], "FP32")
                inp.set_shared_memory(f"{tag}_in", 16)
                out = mod.InferRequestedOutput("OUTPUT0")
                out.set_shared_memory(f"{tag}_out", 16)
                result = cl.infer("counter", [inp], outputs=[out, mod.InferRequestedOutput("RUNS")])
                runs.append(result.as_numpy("RUNS")[0])
                np.testing.assert_array_equal(shm.get_contents_as_numpy(regions[1], np.float32, [1, 4]), x + 1)
            assert runs[1] == runs[0]  # the second was a hit, written into the region all the same
            cl.unregister_system_shared_memory()
    finally:
        for r in regions:
            shm.destroy_shared_memory_region(r)


def test_a_bytes_output_in_shared_memory_is_cached(server):
    words = np.array([f"word {next(_values)}".encode(), b"", b"third"], dtype=np.object_)
    tag = f"cache_text_{next(_values)}"
    region = shm.create_shared_memory_region(tag, f"/{tag}", 64)
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as cl:
            cl.register_system_shared_memory(tag, f"/{tag}", 64)
            runs = []
            for _ in range(2):
                shm.set_shared_memory_region(region, [np.zeros(64, dtype=np.uint8)])
                inp = grpcclient.InferInput("TEXT", [3], "BYTES")
                inp.set_data_from_numpy(words)
                out = grpcclient.InferRequestedOutput("TEXT_OUT")
                out.set_shared_memory(tag, 64)
                result = cl.infer("text", [inp], outputs=[out, grpcclient.InferRequestedOutput("RUNS")])
                runs.append(result.as_numpy("RUNS")[0])
                assert list(shm.get_contents_as_numpy(region, np.object_, [3])) == list(words)
            assert runs[1] == runs[0]
            cl.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region)


def test_a_hit_into_a_too_small_region_is_refused(server):
    x = fresh()
    infer("http", server, "counter", x)  # cached now
    tag = f"cache_small_{next(_values)}"
    region = shm.create_shared_memory_region(tag, f"/{tag}", 8)
    try:
        with httpclient.InferenceServerClient(server.http_url) as cl:
            cl.register_system_shared_memory(tag, f"/{tag}", 8)
            inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(tag, 8)
            with pytest.raises(InferenceServerException) as info:
                cl.infer("counter", [inp], outputs=[out, httpclient.InferRequestedOutput("RUNS")])
            assert info.value.status() == "400"
            assert ("shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at "
                    "least 16 bytes to hold the results") in info.value.message()
            cl.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region)


# -- bounded memory ----------------------------------------------------------------------------
# One [1,4] answer is 100 bytes: key 32, OUTPUT0 7+4+16+16, RUNS 4+5+8+8.
ENTRY = 100


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("cache_small"), {"counter": {}},
                "--response-cache-byte-size", str(ENTRY + ENTRY // 2))
    yield srv
    srv.stop_cleanly()


def test_least_recently_used_is_evicted_and_too_big_is_not_cached(small_server):
    a, b, big = fresh(), fresh(), fresh((1, 64))
    runs = [infer("http", small_server, "counter", x).as_numpy("RUNS")[0] for x in (a, a, b, a, big, big)]
    # a: miss, hit; b: miss (a evicted); a: miss again (b evicted); big: larger than the cache, twice
    assert runs == [1, 1, 2, 3, 4, 5]
    s = stats(small_server, "counter")["inference_stats"]
    text = scrape(small_server)
    lookup = re.search(r"^nv_cache_lookup_duration (\d+)$", text, re.M).group(1)
    insertion = re.search(r"^nv_cache_insertion_duration (\d+)$", text, re.M).group(1)
    labels = '{model="counter",version="1"}'
    assert cache_lines(text) == [
        "# HELP nv_cache_num_hits_per_model Number of cache hits per model",
        "# TYPE nv_cache_num_hits_per_model counter",
        f"nv_cache_num_hits_per_model{labels} 1",
        "# HELP nv_cache_hit_duration_per_model Total cache hit duration per model, in microseconds",
        "# TYPE nv_cache_hit_duration_per_model counter",
        f"nv_cache_hit_duration_per_model{labels} {s['cache_hit']['ns'] // 1000}",
        "# HELP nv_cache_num_misses_per_model Number of cache misses per model",
        "# TYPE nv_cache_num_misses_per_model counter",
        f"nv_cache_num_misses_per_model{labels} 5",
        "# HELP nv_cache_miss_duration_per_model Total cache miss (insert+lookup) duration per model, in "
        "microseconds",
        "# TYPE nv_cache_miss_duration_per_model counter",
        f"nv_cache_miss_duration_per_model{labels} {s['cache_miss']['ns'] // 1000}",
        "# HELP nv_cache_util Cache utilization [0.0 - 1.0]",
        "# TYPE nv_cache_util gauge",
        f"nv_cache_util {ENTRY / (ENTRY + ENTRY // 2)!r}",
        "# HELP nv_cache_num_entries Number of responses stored in response cache",
        "# TYPE nv_cache_num_entries gauge",
        "nv_cache_num_entries 1",
        "# HELP nv_cache_num_hits Number of cache hits in response cache",
        "# TYPE nv_cache_num_hits gauge",
        "nv_cache_num_hits 1",
        "# HELP nv_cache_num_misses Number of cache misses in response cache",
        "# TYPE nv_cache_num_misses gauge",
        "nv_cache_num_misses 5",
        "# HELP nv_cache_num_lookups Number of cache lookups in response cache",
        "# TYPE nv_cache_num_lookups gauge",
        "nv_cache_num_lookups 6",
        "# HELP nv_cache_num_evictions Number of cache evictions in response cache",
        "# TYPE nv_cache_num_evictions gauge",
        "nv_cache_num_evictions 2",
        "# HELP nv_cache_lookup_duration Total cache lookup duration (hit and miss), in microseconds",
        "# TYPE nv_cache_lookup_duration gauge",
        f"nv_cache_lookup_duration {lookup}",
        "# HELP nv_cache_insertion_duration Total cache insertion duration, in microseconds",
        "# TYPE nv_cache_insertion_duration gauge",
        f"nv_cache_insertion_duration {insertion}",
    ]
    assert "--response-cache-byte-size is deprecated: use --cache-config local,size=<bytes>" in small_server.log()


# -- no cache configured ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def nocache_server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("nocache"), {"counter": {}})
    yield srv
    srv.stop_cleanly()


def test_without_a_cache_a_cache_model_loads_and_never_hits(proto, nocache_server):
    x = fresh()
    runs = [infer(proto, nocache_server, "counter", x).as_numpy("RUNS")[0] for _ in range(2)]
    assert runs[1] == runs[0] + 1
    s = stats(nocache_server, "counter")["inference_stats"]
    assert s["cache_hit"] == {"count": 0, "ns": 0} and s["cache_miss"] == {"count": 0, "ns": 0}
    labels = '{model="counter",version="1"}'
    assert cache_lines(scrape(nocache_server)) == [  # as Triton: the model's series at zero, no server gauges
        "# HELP nv_cache_num_hits_per_model Number of cache hits per model",
        "# TYPE nv_cache_num_hits_per_model counter",
        f"nv_cache_num_hits_per_model{labels} 0",
        "# HELP nv_cache_hit_duration_per_model Total cache hit duration per model, in microseconds",
        "# TYPE nv_cache_hit_duration_per_model counter",
        f"nv_cache_hit_duration_per_model{labels} 0",
        "# HELP nv_cache_num_misses_per_model Number of cache misses per model",
        "# TYPE nv_cache_num_misses_per_model counter",
        f"nv_cache_num_misses_per_model{labels} 0",
        "# HELP nv_cache_miss_duration_per_model Total cache miss (insert+lookup) duration per model, in "
        "microseconds",
        "# TYPE nv_cache_miss_duration_per_model counter",
        f"nv_cache_miss_duration_per_model{labels} 0",
    ]


def test_cache_flags_are_checked(tmp_path):
    root = tmp_path
    counter_model(root / "models", "counter")
    for flags, message in ((["--cache-config", "local,size=10", "--response-cache-byte-size", "10"],
                            "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
                           (["--cache-config", "redis,host=h"], "cache 'redis' is not available")):
        srv = ServerProcess(root / "models", root / "server.log", extra_args=flags)
        with pytest.raises(RuntimeError) as info:
            srv.start(timeout=30)
        assert message in str(info.value)
        assert srv.proc.returncode == 2
