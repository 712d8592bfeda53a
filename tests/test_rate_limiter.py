"""The rate limiter end to end: the real server with --rate-limit execution_count, and
Python models that write down when each execution starts and ends."""
from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from .harness import ServerProcess, free_port
from .models import write_model

# Appends "<model> <instance> <start> <end>" for each execution to the file named by
# the model's "log" parameter; with a "release" parameter, each execution first writes
# "<release>.started" and waits until the file <release> exists.
TIMED_PY = """
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.log = params["log"]["string_value"]
        self.release = params.get("release", {}).get("string_value", "")
        self.name = args["model_name"] + " " + args["model_instance_name"]

    def execute(self, requests):
        start = time.time()
        if self.release:
            open(self.release + ".started", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.005)
        else:
            time.sleep(0.03)
        end = time.time()
        with open(self.log, "a") as f:
            f.write(f"{self.name} {start!r} {end!r}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""


def timed_model(repo: Path, name: str, log: Path, resources: str = "", count: int = 1, priority: int = 0,
                release: Path | None = None, batching: bool = False) -> None:
    limiter = f"rate_limiter {{ resources [ {resources} ] priority: {priority} }}" if resources or priority else ""
    write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {4 if batching else 0}
        {"dynamic_batching { max_queue_delay_microseconds: 2000 }" if batching else ""}
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: {count} {limiter} }}]
        parameters {{ key: "log" value: {{ string_value: "{log}" }} }}
        {f'parameters {{ key: "release" value: {{ string_value: "{release}" }} }}' if release else ""}
    """, model_py=TIMED_PY)


def executions(log: Path) -> list[tuple[str, float, float]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return sorted(((model, float(start), float(end)) for model, _, start, end in rows), key=lambda r: r[1])


def send(srv: ServerProcess, model: str, n: int, shape: tuple[int, ...] = (1,),
         answered: list | None = None) -> list[threading.Thread]:
    """``n`` requests to ``model`` at once, each on its own connection; each answer's
    OUTPUT0 goes to ``answered``."""
    def one() -> None:
        with httpclient.InferenceServerClient(srv.http_url, network_timeout=120) as cl:
            inp = httpclient.InferInput("INPUT0", list(shape), "FP32")
            inp.set_data_from_numpy(np.ones(shape, dtype=np.float32))
            result = cl.infer(model, [inp])
            if answered is not None:
                answered.append(result.as_numpy("OUTPUT0").tolist())
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def pending(srv: ServerProcess, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'nv_inference_pending_request_count{{model="{model}",'):
                return int(line.rsplit(" ", 1)[1])
    return -1


def start(repo: Path, log_path: Path, *flags: str) -> ServerProcess:
    port = free_port()
    srv = ServerProcess(repo, log_path, extra_args=["--allow-metrics=true", "--metrics-port", str(port),
                                                    "--allow-cpu-metrics=false", "--allow-gpu-metrics=false",
                                                    *flags]).start()
    srv.metrics_port = port
    return srv


def test_instances_sharing_a_resource_never_overlap_across_models(tmp_path):
    log = tmp_path / "executions.log"
    repo = tmp_path / "models"
    timed_model(repo, "a", log, '{ name: "R" count: 1 }', count=2)
    timed_model(repo, "b", log, '{ name: "R" count: 1 }')
    timed_model(repo, "batched", log, '{ name: "R" count: 1 }', batching=True)
    timed_model(repo, "free", log)  # no rate_limiter: runs whenever it is asked
    srv = start(repo, tmp_path / "server.log", "--rate-limit", "execution_count")
    answered: list = []
    try:
        threads = (send(srv, "a", 6) + send(srv, "b", 6) + send(srv, "batched", 8, (1, 1), answered)
                   + send(srv, "free", 2))
        for t in threads:
            t.join(120)
    finally:
        srv.stop_cleanly()
    assert answered == [[[1.0]]] * 8  # every request of the batching model was answered
    rows = executions(log)
    limited = [r for r in rows if r[0] != "free"]
    assert sorted(r[0] for r in limited if r[0] != "batched") == ["a"] * 6 + ["b"] * 6
    for before, after in zip(limited, limited[1:]):
        assert after[1] >= before[2], f"{before} and {after} overlap"
    assert len([r for r in rows if r[0] == "free"]) == 2


def test_priority_one_runs_twice_as_often_as_priority_two(tmp_path):
    log, release = tmp_path / "executions.log", tmp_path / "release"
    repo = tmp_path / "models"
    timed_model(repo, "block", log, '{ name: "R" count: 1 }', release=release)
    timed_model(repo, "hi", log, '{ name: "R" count: 1 }', priority=1)
    timed_model(repo, "lo", log, '{ name: "R" count: 1 }', priority=2)
    srv = start(repo, tmp_path / "server.log", "--rate-limit", "execution_count", "--rate-limit-resource", "R:1")
    try:
        threads = send(srv, "block", 1)  # holds R until the release file exists
        wait_for(lambda: Path(f"{release}.started").exists(), "the blocking execution")
        threads += send(srv, "hi", 6)
        wait_for(lambda: pending(srv, "hi") == 6, "hi's requests to queue")
        threads += send(srv, "lo", 6)
        wait_for(lambda: pending(srv, "lo") == 6, "lo's requests to queue")
        release.touch()
        for t in threads:
            t.join(120)
    finally:
        srv.stop_cleanly()
    order = "".join({"hi": "H", "lo": "L"}[m] for m, _, _ in executions(log) if m != "block")
    assert order == "HLHLHHLHHLLL"  # turns by executions x priority; ties to the longest waiting


def test_an_instance_needing_more_than_exists_fails_to_load(tmp_path):
    log = tmp_path / "executions.log"
    repo = tmp_path / "models"
    timed_model(repo, "big", log, '{ name: "R" count: 3 }')
    timed_model(repo, "unlisted", log, '{ name: "G" global: true count: 5 }')
    timed_model(repo, "fits", log, '{ name: "R" count: 2 }')
    srv = start(repo, tmp_path / "server.log", "--rate-limit", "execution_count", "--rate-limit-resource", "R:2",
                "--exit-on-error=false", "--strict-readiness=false")
    try:
        with httpclient.InferenceServerClient(srv.http_url) as cl:
            index = {m["name"]: m for m in cl.get_model_repository_index()}
            assert index["fits"]["state"] == "READY"
            for name, resource, available, needed in (("big", "R", 2, 3), ("unlisted", "G", 0, 5)):
                assert index[name]["state"] == "UNAVAILABLE"
                assert index[name]["reason"] == (
                    f'Resource count for "{resource}" is limited to {available} which will prevent scheduling of '
                    f"one or more model instances, the minimum required count is {needed}")
        for t in send(srv, "fits", 1):
            t.join(60)
        assert [r[0] for r in executions(log)] == ["fits"]
    finally:
        srv.stop_cleanly()


def test_resources_are_ignored_with_the_rate_limiter_off(tmp_path):
    log = tmp_path / "executions.log"
    repo = tmp_path / "models"
    timed_model(repo, "big", log, '{ name: "R" count: 3 }')
    srv = start(repo, tmp_path / "server.log", "--rate-limit-resource", "R:2")  # --rate-limit is off by default
    try:
        for t in send(srv, "big", 1):
            t.join(60)
        assert [r[0] for r in executions(log)] == ["big"]
    finally:
        srv.stop_cleanly()


@pytest.mark.parametrize("flags, message", [
    (["--rate-limit", "sometimes"], "argument --rate-limit: expected execution_count or off, got 'sometimes'"),
    (["--rate-limit-resource", "R"], "argument --rate-limit-resource: expected <string>:<integer>[:<integer>], "
                                     "got 'R'"),
])
def test_rate_limit_flags_are_checked(tmp_path, flags, message):
    (tmp_path / "models").mkdir()
    srv = ServerProcess(tmp_path / "models", tmp_path / "server.log", extra_args=flags)
    with pytest.raises(RuntimeError) as info:
        srv.start(timeout=30)
    assert message in str(info.value)
    assert srv.proc.returncode == 2


def test_loading_an_instance_needing_more_than_exists_is_a_400(tmp_path):
    log = tmp_path / "executions.log"
    repo = tmp_path / "models"
    timed_model(repo, "big", log, '{ name: "R" count: 3 }')
    srv = start(repo, tmp_path / "server.log", "--model-control-mode", "explicit", "--rate-limit",
                "execution_count", "--rate-limit-resource", "R:2")
    try:
        with httpclient.InferenceServerClient(srv.http_url) as cl:
            with pytest.raises(httpclient.InferenceServerException) as info:
                cl.load_model("big")
            assert info.value.status() == "400"
            assert info.value.message() == (
                "load failed for model 'big': version 1: Resource count for \"R\" is limited to 2 which will "
                "prevent scheduling of one or more model instances, the minimum required count is 3")
            assert not cl.is_model_ready("big")
    finally:
        srv.stop_cleanly()
