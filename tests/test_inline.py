"""The worker's control thread running a single-instance model itself (``Worker._run_inline``):
what that path must keep working. A BLS caller waits for a reply only the ring's reader can
deliver; a slow model must not stop another model's load, inference or unload; batches queued
behind an inline one run in order on the same instance. The models share the CPU worker
(``in_shared_worker``), where these questions arise; an instance process runs its one
instance inline the same way (test_pipelines' BLS models, test_instance_processes).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from .harness import ServerProcess, children
from .models import in_shared_worker, write_model

# Every model reports the thread that ran it: inline batches run on the worker's main thread.
CALLEE_CONFIG = """
    name: "callee"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "THREAD" data_type: TYPE_STRING dims: [ 1 ] } ]
    """

CALLEE_PY = """
import os
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        name = np.array([threading.current_thread().name.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2),
            pb_utils.Tensor("THREAD", name)]) for r in requests]
"""

CALLER_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "THREAD" data_type: TYPE_STRING dims: [ 1 ] }},
             {{ name: "CALLEE_THREAD" data_type: TYPE_STRING dims: [ 1 ] }} ]
    """

# Two BLS calls per request into ``callee`` (same worker): one from execute, one from a helper
# thread of the model's, as models that fan out do.
CALLER_SYNC_PY = """
import os
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

def call(x):
    reply = pb_utils.InferenceRequest(model_name="callee", inputs=[pb_utils.Tensor("X", x)],
                                      requested_output_names=["Y", "THREAD"]).exec()
    if reply.has_error():
        raise pb_utils.TritonModelException(reply.error().message())
    return (pb_utils.get_output_tensor_by_name(reply, "Y").as_numpy(),
            pb_utils.get_output_tensor_by_name(reply, "THREAD").as_numpy())

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            y, _ = call(x)
            got = []
            t = threading.Thread(target=lambda: got.append(call(y)))
            t.start()
            t.join()
            y, callee_thread = got[0]
            name = np.array([threading.current_thread().name.encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), pb_utils.Tensor("THREAD", name),
                                                   pb_utils.Tensor("CALLEE_THREAD", callee_thread)]))
        return out
"""

CALLER_ASYNC_PY = """
import asyncio
import os
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="callee", inputs=[pb_utils.Tensor("X", x * k)],
                                               requested_output_names=["Y", "THREAD"]).async_exec()
                     for k in (1, 2)]
            a, b = await asyncio.gather(*calls)
            y = (pb_utils.get_output_tensor_by_name(a, "Y").as_numpy()
                 + pb_utils.get_output_tensor_by_name(b, "Y").as_numpy())
            name = np.array([threading.current_thread().name.encode()], dtype=np.object_)
            callee = pb_utils.get_output_tensor_by_name(a, "THREAD").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), pb_utils.Tensor("THREAD", name),
                                                   pb_utils.Tensor("CALLEE_THREAD", callee)]))
        return out
"""

# Says it started (a file), blocks until the test creates its flag file (at most ten minutes),
# then echoes its input.
SLOW_CONFIG = """
    name: "slow"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "THREAD" data_type: TYPE_STRING dims: [ 1 ] } ]
    """

SLOW_PY = """
import os
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "go")
        self.started = os.path.join(args["model_repository"], "started")

    def execute(self, requests):
        open(self.started, "w").close()
        deadline = time.monotonic() + 600
        while not os.path.exists(self.flag) and time.monotonic() < deadline:
            time.sleep(0.01)
        name = np.array([threading.current_thread().name.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                                            pb_utils.Tensor("THREAD", name)]) for r in requests]
"""

X = np.array([1, 2, 3, 4], np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("inline")
    repo = root / "models"
    in_shared_worker(write_model(repo, "callee", config=CALLEE_CONFIG, model_py=CALLEE_PY))
    for name, code in (("caller_sync", CALLER_SYNC_PY), ("caller_async", CALLER_ASYNC_PY)):
        in_shared_worker(write_model(repo, name, config=CALLER_CONFIG.format(name=name), model_py=code))
    in_shared_worker(write_model(repo, "slow", config=SLOW_CONFIG, model_py=SLOW_PY))
    srv = ServerProcess(repo, root / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "callee",
                                    "--load-model", "caller_sync", "--load-model", "caller_async",
                                    "--load-model", "slow"]).start()
    srv.repo = repo
    yield srv
    srv.stop_cleanly()


def infer(server: ServerProcess, model: str, x: np.ndarray = X) -> httpclient.InferResult:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return c.infer(model, [inp])


def thread_of(result: httpclient.InferResult, name: str = "THREAD") -> str:
    return result.as_numpy(name)[0].decode()


def test_bls_into_the_same_worker_from_an_inline_model(server):
    """The caller runs on the control thread; its BLS replies are read by the relief reader,
    and the callee (a free single instance too) runs on its own thread meanwhile."""
    threads = set()
    for _ in range(5):
        result = infer(server, "caller_sync")
        np.testing.assert_array_equal(result.as_numpy("Y"), X * 4)
        threads.add(thread_of(result))
        assert thread_of(result, "CALLEE_THREAD") == "instance-callee_0_0"
    # The relief reader hands the ring back before the reply leaves, so the client's next
    # request is read by the control thread and runs inline again (what the relief reads
    # never runs inline).
    assert threads == {"MainThread"}


def test_async_bls_from_an_inline_model(server):
    threads = set()
    for _ in range(5):
        result = infer(server, "caller_async")
        np.testing.assert_array_equal(result.as_numpy("Y"), X * 2 + X * 4)
        threads.add(thread_of(result))
        assert thread_of(result, "CALLEE_THREAD") == "instance-callee_0_0"
    assert threads == {"MainThread"}  # as above: each runs inline


def test_concurrent_bls_callers_and_queued_batches(server):
    """Several requests at once: an instance's second batch is queued behind the inline one
    (no dynamic batching), and every answer is its own request's."""
    xs = [X + 10 * i for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: infer(server, "caller_sync", x), xs))
        callee = list(pool.map(lambda x: infer(server, "callee", x), xs))
    for x, r in zip(xs, results):
        np.testing.assert_array_equal(r.as_numpy("Y"), x * 4)
    for x, r in zip(xs, callee):
        np.testing.assert_array_equal(r.as_numpy("Y"), x * 2)


def test_other_models_load_run_and_unload_while_a_slow_model_runs_inline(server):
    """While the control thread runs ``slow``, the relief reader takes the ring: an unload,
    a load and an inference of another model in the same worker all complete."""
    model_dir = Path(server.repo) / "slow"
    flag, started = model_dir / "go", model_dir / "started"
    slow_result: list = []
    # One plain request first: whatever ran before, ``slow`` is then read by the control thread.
    infer(server, "callee")
    slow = threading.Thread(target=lambda: slow_result.append(infer(server, "slow")))
    slow.start()
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "the slow request never reached the model"
            time.sleep(0.02)
        with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
            c.unload_model("callee")
            assert not c.is_model_ready("callee")
            c.load_model("callee")
            assert c.is_model_ready("callee")
            result = infer(server, "callee")
            np.testing.assert_array_equal(result.as_numpy("Y"), X * 2)
            assert c.is_server_ready()
        assert slow.is_alive() and not slow_result, "the slow model finished before the test let it"
    finally:
        flag.touch()
        slow.join(120)
    (result,) = slow_result
    np.testing.assert_array_equal(result.as_numpy("Y"), X)
    assert thread_of(result) == "MainThread"
    flag.unlink()
    started.unlink()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_leaves_when_the_front_end_dies_during_a_long_inline_execution(tmp_path):
    """The control thread is inside a model that will not return for minutes; the relief
    reader sees the link end and the worker shuts down as it would from its control loop."""
    repo = tmp_path / "models"
    in_shared_worker(write_model(repo, "slow", config=SLOW_CONFIG, model_py=SLOW_PY))
    srv = ServerProcess(repo, tmp_path / "server.log").start()
    (worker,) = children(srv.proc.pid)
    started, flag = repo / "slow" / "started", repo / "slow" / "go"
    def call() -> None:
        with contextlib.suppress(Exception):  # the server is killed under it: any client error will do
            infer(srv, "slow")

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "the request never reached the model"
            time.sleep(0.02)
        srv.proc.kill()
        srv.proc.wait(30)
        deadline = time.monotonic() + 120  # its shutdown waits up to 30 s for the running batch
        while _alive(worker):
            assert time.monotonic() < deadline, "the worker outlived its front-end"
            time.sleep(0.1)
    finally:
        flag.touch()  # a worker left behind finishes the batch and then sees the link's end
        srv.stop()
        caller.join(30)


# -- the relief reader's clock, both twins ----------------------------------------------------

@pytest.fixture(params=["c", "python"])
def watch(request):
    if request.param == "c":
        cls = pytest.importorskip("triton_shm.worker._watch").Watch
    else:
        from triton_shm.worker.watch_py import Watch as cls
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    yield cls(fd)
    os.close(fd)


def test_watch_reports_an_execution_still_running_a_tick_later(watch):
    watch.parked = False
    seq = watch.begin()
    assert (seq, watch.current, watch.count) == (1, 1, 1)
    assert watch.wait(1, 1000) == seq
    watch.end()
    assert watch.current == 0


def test_watch_parked_is_rung_by_the_next_execution(watch):
    assert watch.parked
    seq = watch.begin()          # rings the parked clock
    assert watch.wait(1, 1000) == 0
    assert not watch.parked
    assert watch.wait(1, 1000) == seq  # and then watches it


def test_watch_parks_when_quiet_and_wakes_when_rung(watch):
    watch.parked = False
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(watch.wait(1, 3)))
    waiter.start()
    deadline = time.monotonic() + 30
    while not watch.parked:      # three quiet ticks
        assert time.monotonic() < deadline, "the clock never parked"
        time.sleep(0.005)
    assert waiter.is_alive()     # parked: it sleeps until rung
    watch.ring()
    waiter.join(30)
    assert got == [0]
