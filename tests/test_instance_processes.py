"""Each instance of a Python model in a process of its own: what a model sees, what the
server's process tree shows, and what happens when one instance process dies under load.
The real server, the real tritonclient; the rest of the suite runs every Python model this
way too (BLS, decoupled, sequences, kept and lent inputs, cache, rate limiter, drain)."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess, children
from .models import write_model

pytestmark = pytest.mark.timeout(180)

WHO_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "SLEEP_S").as_numpy()[0]
            time.sleep(float(delay))
            who = [str(os.getpid()), self.args["model_instance_name"], self.args["model_instance_kind"],
                   self.args["model_instance_device_id"]]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("WHO", np.array(who, dtype=np.object_))]))
        return responses
"""


def who_config(name: str, count: int, shared: bool = False) -> str:
    param = 'parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } }' if shared else ""
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "SLEEP_S" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "WHO" data_type: TYPE_STRING dims: [ 4 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        {param}
        """


def build_repo(repo: Path) -> Path:
    write_model(repo, "who", config=who_config("who", 2), model_py=WHO_PY)
    write_model(repo, "who_shared", config=who_config("who_shared", 2, shared=True), model_py=WHO_PY)
    write_model(repo, "work4", config=who_config("work4", 4), model_py=WHO_PY)
    return repo


def worker_name(pid: int) -> str:
    """The ``--name`` a worker process was started with."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--name") + 1].decode()


def instance_processes(srv: ServerProcess, model: str) -> dict[str, int]:
    """The server's processes of ``model``'s instances: instance name -> pid."""
    found = {}
    for pid in children(srv.proc.pid):
        try:
            name = worker_name(pid)
        except (OSError, ValueError):
            continue  # exited meanwhile
        instance, _, load = name.partition("@")
        if load.startswith(f"{model}/"):
            found[instance] = pid
    return found


def who(client, model: str, sleep_s: float = 0.0) -> tuple[int, str, str, str]:
    inp = grpcclient.InferInput("SLEEP_S", [1], "FP32")
    inp.set_data_from_numpy(np.array([sleep_s], dtype=np.float32))
    out = client.infer(model, [inp]).as_numpy("WHO")
    pid, name, kind, device = (v.decode() for v in out)
    return int(pid), name, kind, device


def who_concurrently(srv: ServerProcess, model: str, n: int, sleep_s: float) -> set[tuple[int, str, str, str]]:
    def one(_):
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            return who(client, model, sleep_s)
        finally:
            client.close()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return set(pool.map(one, range(n)))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("instances")
    srv = ServerProcess(build_repo(root / "models"), root / "server.log").start()
    yield srv
    srv.stop_cleanly()


def test_each_instance_runs_in_a_process_of_its_own_with_tritons_instance_arguments(server):
    seen = who_concurrently(server, "who", 6, 0.3)
    assert {(name, kind, device) for _, name, kind, device in seen} == {
        ("who_0_0", "CPU", "0"), ("who_0_1", "CPU", "0")}, seen
    pids = {name: pid for pid, name, _, _ in seen}
    assert len(set(pids.values())) == 2, seen
    assert instance_processes(server, "who") == pids  # children of the server, named after their instance
    # its own process group is the server's business: a terminal's signals go to the front-end only
    assert all(os.getpgid(pid) != os.getpgid(server.proc.pid) for pid in pids.values())


def test_process_per_instance_no_keeps_the_instances_as_threads_of_the_shared_worker(server):
    seen = who_concurrently(server, "who_shared", 6, 0.3)
    assert {name for _, name, _, _ in seen} == {"who_shared_0_0", "who_shared_0_1"}, seen
    (pid,) = {pid for pid, _, _, _ in seen}
    assert worker_name(pid) == "cpu"
    assert instance_processes(server, "who_shared") == {}


def test_killing_one_of_four_instances_under_load_loses_only_its_in_flight_work(server):
    before = instance_processes(server, "work4")
    assert sorted(before) == ["work4_0_0", "work4_0_1", "work4_0_2", "work4_0_3"], before
    victim_name, victim = "work4_0_2", before["work4_0_2"]
    stop = threading.Event()
    outcomes: list[tuple[str, str]] = []  # (instance name or "error", error message)
    lock = threading.Lock()

    def load() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            while not stop.is_set():
                try:
                    _, name, _, _ = who(client, "work4", 0.05)
                    result = (name, "")
                except InferenceServerException as e:
                    result = ("error", f"{e.status()} {e.message()}")
                with lock:
                    outcomes.append(result)
        finally:
            client.close()

    readiness: list[bool] = []

    def watch_ready() -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            while not stop.is_set():
                readiness.append(client.is_model_ready("work4"))
                time.sleep(0.02)
        finally:
            client.close()

    threads = [threading.Thread(target=load) for _ in range(8)] + [threading.Thread(target=watch_ready)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len({n for n, _ in outcomes} & set(before)) < 4:  # every instance is busy
            assert time.monotonic() < deadline, outcomes[-20:]
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        killed_at = len(outcomes)
        deadline = time.monotonic() + 30
        while True:  # the instance comes back in a new process and serves again
            after = instance_processes(server, "work4")
            back = after.get(victim_name) not in (None, victim)
            with lock:
                served_again = any(n == victim_name for n, _ in outcomes[killed_at:])
            if back and served_again:
                break
            assert time.monotonic() < deadline, (after, outcomes[-20:], server.log()[-3000:])
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    errors = [message for name, message in outcomes if name == "error"]
    # what the victim was running and the one batch it held, no more; nothing of the others
    assert 1 <= len(errors) <= 2, errors
    for message in errors:
        assert message.startswith("StatusCode.UNAVAILABLE"), message
        assert "model instance 'work4_0_2'" in message and "killed by signal 9" in message, message
    assert all(readiness) and len(readiness) > 10, readiness  # READY throughout: three instances served on
    served = {name for name, _ in outcomes[killed_at:]}
    assert served >= set(before), served
    assert not os.path.exists(f"/proc/{victim}")
    for name, pid in before.items():  # the others kept their processes
        if name != victim_name:
            assert instance_processes(server, "work4")[name] == pid


def test_with_every_instance_dead_the_model_waits_unready_then_serves_again(server):
    before = instance_processes(server, "who")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for pid in before.values():
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while client.is_model_ready("who"):
            assert time.monotonic() < deadline, "the model stayed ready with no instance running"
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        while not client.is_model_ready("who"):
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.05)
    finally:
        client.close()
    after = instance_processes(server, "who")
    assert sorted(after) == sorted(before) and not set(after.values()) & set(before.values()), (before, after)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert who(grpc, "who")[1] in after
    finally:
        grpc.close()


def test_unload_stops_the_instance_processes_and_a_load_starts_new_ones(tmp_path):
    srv = ServerProcess(build_repo(tmp_path / "models"), tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "who"]).start()
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        first = instance_processes(srv, "who")
        assert sorted(first) == ["who_0_0", "who_0_1"], first
        client.unload_model("who")
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{pid}") and pid in children(srv.proc.pid) for pid in first.values()):
            assert time.monotonic() < deadline, "an unloaded instance's process still runs"
            time.sleep(0.05)
        assert instance_processes(srv, "who") == {}
        client.load_model("who")
        second = instance_processes(srv, "who")
        assert sorted(second) == ["who_0_0", "who_0_1"] and not set(second.values()) & set(first.values())
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            assert who(grpc, "who")[0] in second.values()
        finally:
            grpc.close()
    finally:
        client.close()
        assert srv.stop() == 0, srv.log()[-3000:]


def test_statistics_count_every_instance_process_once(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        def counts() -> tuple[int, int, int]:
            (stats,) = client.get_inference_statistics("who")["model_stats"]
            return stats["inference_count"], stats["execution_count"], stats["inference_stats"]["success"]["count"]
        before = counts()
        seen = who_concurrently(server, "who", 8, 0.1)
        assert len({pid for pid, _, _, _ in seen}) == 2, seen  # both instances ran some
        assert tuple(a - b for a, b in zip(counts(), before)) == (8, 8, 8)
    finally:
        client.close()


HALF_FAILS_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_name"].endswith("_1"):
            raise pb_utils.TritonModelException("instance 1 refuses to start")

    def execute(self, requests):
        raise pb_utils.TritonModelException("never loaded")
"""


def test_a_load_that_fails_on_one_instance_leaves_no_instance_process(tmp_path):
    repo = build_repo(tmp_path / "models")
    write_model(repo, "half_fails", config=who_config("half_fails", 2), model_py=HALF_FAILS_PY)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "who"]).start()
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("half_fails")
        assert "instance 1 refuses to start" in e.value.message(), e.value.message()
        deadline = time.monotonic() + 20
        while instance_processes(srv, "half_fails"):
            assert time.monotonic() < deadline, instance_processes(srv, "half_fails")
            time.sleep(0.05)
        assert not client.is_model_ready("half_fails")
        assert sorted(instance_processes(srv, "who")) == ["who_0_0", "who_0_1"]  # the other model untouched
    finally:
        client.close()
        assert srv.stop() == 0, srv.log()[-3000:]
