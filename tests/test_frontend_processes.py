"""``--frontend-processes 2``: two front-end processes on the same ports, one server to every
client, whichever process each of its connections reaches.

Each test finds a connection to each process (``whoami``, a partitioned model, answers the
pid of the front-end process that ran it: its instance process's parent) and does a thing
through one and checks it through the other: shared memory registered on one connection and
used on another, model control, statistics and metrics summed, a batch gathered from both
processes, a sequence alternating between them, a decoupled stream, a process killed and
restarted, and the drain on SIGTERM.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
import urllib.request
import zlib
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess, children, free_port
from .helpers import connect, expect_error
from .models import onnx_add_sub, python_identity, sequence_model, write_model

PROCESSES = 2

WHOAMI_PY = """
import os
import queue
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([os.getppid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy()),
                                            pb_utils.Tensor("PID", pid)]) for r in requests]
"""


def whoami(repo, name: str = "whoami", count: int = PROCESSES, threads: bool = False) -> None:
    """Partitioned (no batcher, ``count`` >= the processes): served where it arrives.
    ``threads``: its instances are threads of each process's CPU worker (whose parent is
    the front-end process too), not processes of their own."""
    parameters = 'parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } }' if threads else ""
    write_model(repo, name, model_py=WHOAMI_PY, config=f"""
        name: "{name}"
        backend: "python"
        {parameters}
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
                 {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """)


# Dynamic batching with a long delay and preferred size 2: two requests make one batch,
# whichever processes they came through; each answers the batch size it was part of.
BATCH_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        size = np.array([[len(requests)]], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SIZE", size)]) for r in requests]
"""

# Decoupled: one response per element of IN, then the final flag alone.
STREAM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for v in request.inputs()[0].as_numpy().reshape(-1).tolist():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


SLOW_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


def build_repository(repo) -> None:
    whoami(repo)
    whoami(repo, "whoami_threads", threads=True)
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")  # ONNX Runtime, two CPU instances: partitioned
    (repo / "add_sub" / "config.pbtxt").write_text("""
        name: "add_sub"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """)
    python_identity(repo, "cached", "FP32")  # owned: one cache for the whole server
    with open(repo / "cached" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    write_model(repo, "slow", model_py=SLOW_PY, config="""
        name: "slow"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        """)  # owned by process 1 (crc32("slow") % 2)
    python_identity(repo, "identity_fp32", "FP32")  # count 1: one process owns it, the other forwards
    python_identity(repo, "identity_2d", "FP32", dims="[ -1, -1 ]")  # the same, variable dims
    python_identity(repo, "identity_2d_part", "FP32", dims="[ -1, -1 ]")
    with open(repo / "identity_2d_part" / "config.pbtxt", "a") as f:  # partitioned: served where it arrives
        f.write(f"instance_group [ {{ count: {PROCESSES} kind: KIND_CPU }} ]\n")
    write_model(repo, "batched", model_py=BATCH_PY, config="""
        name: "batched"
        backend: "python"
        max_batch_size: 8
        dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3000000 }
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """)
    write_model(repo, "stream", model_py=STREAM_PY, config="""
        name: "stream"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """)
    sequence_model(repo, "seq")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("frontends")
    repo = root / "models"
    build_repository(repo)
    srv = ServerProcess(repo, root / "server.log", extra_args=[
        "--frontend-processes", str(PROCESSES), "--allow-client-shm", "true", "--model-control-mode", "explicit",
        "--load-model", "*", "--cache-config", "local,size=1048576"])
    srv.start()
    yield srv
    srv.stop_cleanly()


@contextlib.contextmanager
def serving(repo, tmp_path, *args: str) -> Iterator[ServerProcess]:
    """A server of its own for one test: PROCESSES front-end processes, stopped cleanly after."""
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--frontend-processes", str(PROCESSES), *args]).start()
    try:
        yield srv
    finally:
        srv.stop_cleanly()


def ask_pid(client, mod) -> int:
    inp = mod.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return int(client.infer("whoami", [inp]).as_numpy("PID")[0])


def by_process(srv: ServerProcess, proto: str, want: int = PROCESSES, tries: int = 80) -> dict[int, object]:
    """One client connected to each front-end process: pid -> client."""
    mod = httpclient if proto == "http" else grpcclient
    found: dict[int, object] = {}
    for _ in range(tries):
        # gRPC's core shares one connection among a process's channels to the same target
        # unless told not to: each client its own connection
        client = connect(srv, proto) if proto == "http" else grpcclient.InferenceServerClient(
            srv.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        pid = ask_pid(client, mod)
        if pid in found:
            client.close()
        else:
            found[pid] = client
        if len(found) == want:
            return found
    raise AssertionError(f"{tries} connections reached only the front-end processes {sorted(found)}")


def frontend_pids(srv: ServerProcess) -> set[int]:
    """The front-end processes: process 0 and its children that run the server itself."""
    pids = {srv.proc.pid}
    for pid in children(srv.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"triton_shm" in args and b"triton_shm.worker" not in args:
            pids.add(pid)
    return pids


def descendants(pid: int) -> set[int]:
    found = set(children(pid))
    for child in list(found):
        found |= descendants(child)
    return found


def fp32(mod, name: str, values) -> object:
    data = np.asarray(values, dtype=np.float32)
    inp = mod.InferInput(name, list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return inp


HOLD_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        print("HOLDING", flush=True)
        time.sleep({seconds})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


def hold_model(repo, seconds: float) -> None:
    """"hold": logs HOLDING, then holds each request ``seconds``; process 1 owns it."""
    assert zlib.crc32(b"hold") % PROCESSES == 1  # share.py's owner
    write_model(repo, "hold", model_py=HOLD_PY.format(seconds=seconds), config="""
        name: "hold"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        """)


class InFlight:
    """One gRPC request sent from a thread of its own; ``outcome()``: its output or error."""

    def __init__(self, client, model: str, inputs: list, output: str):
        self._outcome: list[object] = []
        self.thread = threading.Thread(target=self._send, args=(client, model, inputs, output))
        self.thread.start()

    def _send(self, client, model: str, inputs: list, output: str) -> None:
        try:
            self._outcome.append(client.infer(model, inputs).as_numpy(output))
        except InferenceServerException as e:
            self._outcome.append(e)

    def outcome(self) -> object:
        self.thread.join(60)
        assert len(self._outcome) == 1, "the request did not finish"
        return self._outcome[0]


def wait_for_log(srv: ServerProcess, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in srv.log():
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.01)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_both_processes_serve_and_forward(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    clients = by_process(server, proto)
    assert set(clients) <= frontend_pids(server)
    for client in clients.values():
        assert client.is_server_ready() and client.is_model_ready("identity_fp32")
        out = client.infer("identity_fp32", [fp32(mod, "INPUT0", [1.5, 2.5])]).as_numpy("OUTPUT0")
        assert out.tolist() == [1.5, 2.5]  # one process runs it, the other forwards to it
        meta = client.get_model_metadata("identity_fp32")
        name = meta["name"] if proto == "http" else meta.name
        assert name == "identity_fp32"
        expect_error(proto, lambda c=client: c.infer("identity_fp32", [fp32(mod, "WRONG", [1.0])]),
                     "INVALID_ARGUMENT", "WRONG")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_zero_sized_tensors_through_either_process(server, proto, binary):
    """A tensor with a zero in its shape (``[0, 3]``, no bytes) through either process, to a
    model that process runs and to one it forwards to the other: the same empty answer
    every time (a zero-sized output once failed the pure-Python arena twin, which a run with
    TRITON_SHM_NO_EXTENSIONS=1 hit and a retry with the extensions did not)."""
    if proto == "grpc" and binary:
        pytest.skip("gRPC has one encoding")
    mod = httpclient if proto == "http" else grpcclient
    clients = by_process(server, proto)
    for _ in range(5):
        for client in clients.values():
            for model in ("identity_2d", "identity_2d_part"):
                for shape in ([0, 3], [3, 0], [0, 0]):
                    inp = mod.InferInput("INPUT0", shape, "FP32")
                    data = np.zeros(shape, dtype=np.float32)
                    if proto == "http":
                        inp.set_data_from_numpy(data, binary_data=binary)
                        out = [mod.InferRequestedOutput("OUTPUT0", binary_data=binary)]
                    else:
                        inp.set_data_from_numpy(data)
                        out = [mod.InferRequestedOutput("OUTPUT0")]
                    got = client.infer(model, [inp], outputs=out).as_numpy("OUTPUT0")
                    assert got.shape == tuple(shape) and got.dtype == np.float32, (model, shape, got)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_classification_through_either_process(server, proto):
    """The classes are made once, where the model runs (a forwarded request's owner)."""
    mod = httpclient if proto == "http" else grpcclient
    for client in by_process(server, proto).values():
        outputs = [mod.InferRequestedOutput("OUTPUT0", class_count=2)]
        result = client.infer("identity_fp32", [fp32(mod, "INPUT0", [0.5, 2.5, 1.0])], outputs=outputs)
        assert result.as_numpy("OUTPUT0").tolist() == [b"2.500000:1", b"1.000000:2"]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_instances_in_the_cpu_worker_are_served_where_the_request_arrives(server, proto):
    """A model whose instances are threads of the CPU worker is partitioned too: each
    process's own CPU worker runs its share, so no request is forwarded."""
    mod = httpclient if proto == "http" else grpcclient
    for pid, client in by_process(server, proto).items():
        for _ in range(4):
            out = client.infer("whoami_threads", [fp32(mod, "INPUT0", [1.0])])
            assert int(out.as_numpy("PID")[0]) == pid


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_onnx_model_in_the_cpu_worker_serves_through_both(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    clients = by_process(server, proto)
    before = _inference_count(next(iter(clients.values())), proto, "add_sub")
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for client in clients.values():
        for _ in range(3):
            inputs = [mod.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            out = client.infer("add_sub", inputs)
            assert out.as_numpy("OUTPUT0").tolist() == (a + 1).tolist()
            assert out.as_numpy("OUTPUT1").tolist() == (a - 1).tolist()
    for client in clients.values():  # both processes' shares, counted once wherever asked
        assert _inference_count(client, proto, "add_sub") == before + 3 * len(clients)


def _inference_count(client, proto: str, model: str) -> int:
    stats = client.get_inference_statistics(model)
    if proto == "http":
        return sum(int(s["inference_count"]) for s in stats["model_stats"])
    return sum(s.inference_count for s in stats.model_stats)


def _regions(client, proto: str) -> list[str]:
    status = client.get_system_shared_memory_status()
    return [r["name"] for r in status] if proto == "http" else list(status.regions)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_shm_registered_through_one_process_serves_through_the_other(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    (pid_a, a), (pid_b, b) = by_process(server, proto).items()
    key = f"/frontends_{proto}_{os.getpid()}"
    handle = shm.create_shared_memory_region(f"r_{proto}", key, 64)
    try:
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        a.register_system_shared_memory(f"r_{proto}", key, 64)
        assert f"r_{proto}" in _regions(b, proto)
        for model in ("whoami", "identity_fp32"):  # served where it arrives; forwarded
            inp = mod.InferInput("INPUT0", [4], "FP32")
            inp.set_shared_memory(f"r_{proto}", 16)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"r_{proto}", 16, offset=32)
            for client in (a, b):
                client.infer(model, [inp], outputs=[out])
                got = shm.get_contents_as_numpy(handle, np.float32, [4], offset=32)
                assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
                shm.set_shared_memory_region(handle, [np.zeros(4, dtype=np.float32)], offset=32)
        b.unregister_system_shared_memory(f"r_{proto}")
        assert not _regions(a, proto)
        inp = mod.InferInput("INPUT0", [4], "FP32")
        inp.set_shared_memory(f"r_{proto}", 16)
        expect_error(proto, lambda: a.infer("whoami", [inp]), "NOT_FOUND", f"r_{proto}")
    finally:
        shm.destroy_shared_memory_region(handle)


# Touches the file {started} once it runs, waits (up to 60 s) until the file {release}
# exists, then echoes INPUT0.
HELD_PY = """
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        open({started!r}, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({release!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("count", [PROCESSES, 1], ids=["served_where_it_arrives", "owned"])
def test_shm_unregistered_through_one_process_while_the_other_uses_it(tmp_path, proto, count):
    """A region a request uses through one process, unregistered through the other: as in
    Triton, the call succeeds, every process still lists the region and refuses its name
    until the request is done (which reads and writes it as registered), then it is gone
    from every process. ``count`` 1: the model has one owner, which the request may be
    forwarded to."""
    repo = tmp_path / "models"
    whoami(repo)
    started, release = tmp_path / "started", tmp_path / "release"
    write_model(repo, "held", model_py=HELD_PY.format(started=str(started), release=str(release)), config=f"""
        name: "held"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """)
    mod = httpclient if proto == "http" else grpcclient
    key, name = f"/held_{proto}_{count}_{os.getpid()}", f"held_{proto}"
    handle = shm.create_shared_memory_region(name, key, 64)
    with serving(repo, tmp_path, "--allow-client-shm", "true") as srv:
        clients = by_process(srv, proto)
        try:
            (pid_a, a), (pid_b, b) = clients.items()
            shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32) + 5])
            a.register_system_shared_memory(name, key, 64)
            for user, other in ((pid_a, b), (pid_b, a)):  # the request through either process
                shm.set_shared_memory_region(handle, [np.zeros(4, dtype=np.float32)], offset=32)
                if release.exists():
                    release.unlink()
                    started.unlink()
                    other.register_system_shared_memory(name, key, 64)
                inp = mod.InferInput("INPUT0", [4], "FP32")
                inp.set_shared_memory(name, 16)
                out = mod.InferRequestedOutput("OUTPUT0")
                out.set_shared_memory(name, 16, offset=32)
                outcome: list[object] = []

                def send(pid: int = user, i: object = inp, o: object = out, got: list = outcome) -> None:
                    own = by_process(srv, proto)  # clients of this thread (the HTTP client is not thread-safe)
                    try:
                        got.append(own[pid].infer("held", [i], outputs=[o]))
                    finally:
                        for c in own.values():
                            c.close()

                thread = threading.Thread(target=send)
                thread.start()
                try:
                    wait_until(started.exists)
                    other.unregister_system_shared_memory()
                    for client in (a, b):
                        assert _regions(client, proto) == [name]
                    expect_error(proto, lambda o=other: o.register_system_shared_memory(name, key, 64),
                                 "ALREADY_EXISTS", f"shared memory region '{name}' already in manager")
                finally:
                    release.touch()
                thread.join(60)
                assert len(outcome) == 1, "the request did not finish"
                got = shm.get_contents_as_numpy(handle, np.float32, [4], offset=32)
                assert got.tolist() == [5.0, 6.0, 7.0, 8.0]
                for client in (a, b):  # settled across the processes just after the answer
                    wait_until(lambda c=client: _regions(c, proto) == [])
        finally:
            for client in clients.values():
                client.close()
            shm.destroy_shared_memory_region(handle)


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_model_control_through_one_process_applies_to_both(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    (_, a), (_, b) = by_process(server, proto).items()
    a.unload_model("identity_fp32")
    for client in (a, b):
        assert not client.is_model_ready("identity_fp32")
        expect_error(proto, lambda c=client: c.infer("identity_fp32", [fp32(mod, "INPUT0", [1.0])]),
                     "NOT_FOUND", "has no available versions")
    b.load_model("identity_fp32")
    for client in (a, b):
        assert client.is_model_ready("identity_fp32")
        assert client.infer("identity_fp32", [fp32(mod, "INPUT0", [3.0])]).as_numpy("OUTPUT0").tolist() == [3.0]
    a.load_model("identity_fp32", config=TWO_ELEMENTS)  # a config override through one process: both serve it
    for client in (a, b):
        meta = client.get_model_metadata("identity_fp32")
        dims = meta["inputs"][0]["shape"] if proto == "http" else list(meta.inputs[0].shape)
        assert [int(d) for d in dims] == [2]
        expect_error(proto, lambda c=client: c.infer("identity_fp32", [fp32(mod, "INPUT0", [1.0, 2.0, 3.0])]),
                     "INVALID_ARGUMENT")
    b.load_model("identity_fp32")  # back as on disk
    index_a = a.get_model_repository_index()
    index_b = b.get_model_repository_index()
    assert index_a == index_b


FAILS_IN_PROCESS_1_PY = """
import os
import queue
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        if os.environ.get("TRITON_SHM_FRONTEND", "").startswith("1/"):  # process 0 has none
            raise pb_utils.TritonModelException("no room here")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_a_model_that_fails_in_one_process_fails_in_every_process(tmp_path, proto):
    """A partitioned model whose instances load in process 0 but not in process 1: the load
    fails, and neither process reports it ready or serves it (as one server that could not
    load one of its instances)."""
    mod = httpclient if proto == "http" else grpcclient
    repo = tmp_path / "models"
    whoami(repo)
    write_model(repo, "half", model_py=FAILS_IN_PROCESS_1_PY, config=f"""
        name: "half"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ count: {PROCESSES} kind: KIND_CPU }} ]
        """)
    with serving(repo, tmp_path, "--model-control-mode", "explicit", "--load-model", "whoami") as srv:
        clients = by_process(srv, proto)
        for client in clients.values():  # through either process
            expect_error(proto, lambda c=client: c.load_model("half"), "INVALID_ARGUMENT", "no room here")
            for other in clients.values():
                assert not other.is_model_ready("half")
                expect_error(proto, lambda c=other: c.infer("half", [fp32(mod, "INPUT0", [1.0])]), "NOT_FOUND",
                             "has no available versions")
                index = other.get_model_repository_index()
                entries = index if proto == "http" else [
                    {"name": m.name, "state": m.state, "reason": m.reason} for m in index.models]
                half, = [m for m in entries if m["name"] == "half"]
                assert half["state"] == "UNAVAILABLE" and "no room here" in half["reason"], half
        assert "failed to load in another front-end process" in srv.log()


TWO_ELEMENTS = ('{"name": "identity_fp32", "backend": "python", "max_batch_size": 0, '
                '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}], '
                '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]}')


def _inference_count(client, proto: str, model: str) -> int:
    stats = client.get_inference_statistics(model)
    if proto == "http":
        return sum(int(s["inference_count"]) for s in stats["model_stats"])
    return sum(s.inference_count for s in stats.model_stats)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_statistics_count_the_whole_server_once(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    (_, a), (_, b) = by_process(server, proto).items()
    before = _inference_count(a, proto, "whoami")
    assert _inference_count(b, proto, "whoami") == before
    for _ in range(3):
        a.infer("whoami", [fp32(mod, "INPUT0", [1.0])])
    for _ in range(5):
        b.infer("whoami", [fp32(mod, "INPUT0", [1.0])])
    # by_process asked each process once more per connection it tried: count from here
    assert _inference_count(a, proto, "whoami") == before + 8
    assert _inference_count(b, proto, "whoami") == before + 8


def test_dynamic_batching_batches_requests_from_both_processes(server):
    (_, a), (_, b) = by_process(server, "grpc").items()
    sizes: list[int] = []

    def send(client) -> None:
        result = client.infer("batched", [fp32(grpcclient, "INPUT0", [[1.0]])])
        sizes.append(int(result.as_numpy("SIZE").reshape(-1)[0]))

    threads = [threading.Thread(target=send, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sizes == [2, 2]  # one batch of the two, though they came through different processes


def _seq_inputs(value: int) -> list:
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
    return [inp]


def test_sequence_alternating_between_processes_keeps_its_slot(server):
    (_, a), (_, b) = by_process(server, "grpc").items()
    total, instances = 0, set()
    for step, client in enumerate([a, b, a, b, a]):
        value = step + 1
        result = client.infer("seq", _seq_inputs(value), sequence_id=4242, sequence_start=step == 0,
                              sequence_end=step == 4)
        total += value
        assert int(result.as_numpy("OUTPUT").reshape(-1)[0]) == total  # the state went on
        instances.add(result.as_numpy("WHERE").reshape(-1)[0].decode().split(":")[0])
    assert len(instances) == 1


def test_decoupled_stream_through_either_process(server):
    clients = by_process(server, "grpc")
    for client in clients.values():
        got: list = []
        done = threading.Event()

        def callback(result, error, got=got, done=done):
            if error is not None:
                got.append(error)
            elif result.get_response().parameters.get("triton_final_response") and \
                    result.get_response().parameters["triton_final_response"].bool_param and \
                    not result.get_response().outputs:
                done.set()
            else:
                got.append(int(result.as_numpy("OUT")[0]))
        client.start_stream(callback=callback)
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
        client.async_stream_infer("stream", [inp], enable_empty_final_response=True)
        assert done.wait(30), got
        client.stop_stream()
        assert got == [7, 8, 9]


def test_metrics_sum_every_process(tmp_path):
    """Process 0's page counts every process's requests, and the response cache of the
    process that owns a cached model (process 1 owns "remembered")."""
    assert zlib.crc32(b"remembered") % PROCESSES == 1  # share.py's owner
    repo = tmp_path / "models"
    whoami(repo)
    python_identity(repo, "remembered", "FP32")
    with open(repo / "remembered" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    metrics_port = free_port()
    with serving(repo, tmp_path, "--allow-metrics", "true", "--metrics-port", str(metrics_port),
                 "--allow-cpu-metrics", "false", "--allow-gpu-metrics", "false",
                 "--cache-config", "local,size=1048576") as srv:
        clients = by_process(srv, "http")
        for client in clients.values():
            for _ in range(2):
                client.infer("whoami", [fp32(httpclient, "INPUT0", [1.0])])
                client.infer("remembered", [fp32(httpclient, "INPUT0", [2.0])])  # one miss, then hits
        expected = _inference_count(next(iter(clients.values())), "http", "whoami")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()

        def value(prefix: str) -> float:
            return float(next(x for x in text.splitlines() if x.startswith(prefix)).rsplit(" ", 1)[1])
        assert int(value('nv_inference_count{model="whoami"')) == expected
        assert expected >= 4 + PROCESSES
        lookups = 2 * PROCESSES
        assert (value("nv_cache_num_lookups "), value("nv_cache_num_hits "), value("nv_cache_num_misses ")) == \
            (lookups, lookups - 1, 1)
        assert value("nv_cache_num_entries ") == 1 and 0 < value("nv_cache_util ") < 1
        assert int(value('nv_cache_num_hits_per_model{model="remembered"')) == lookups - 1


def test_histograms_sum_every_process(tmp_path):
    """histogram_latencies=true: process 0's page counts each request's first response once,
    wherever it arrived: "whoami" is served where it arrives, the decoupled "stream" by the one
    process that owns it (forwarded from the other, and timed only there)."""
    repo = tmp_path / "models"
    whoami(repo)
    write_model(repo, "stream", model_py=STREAM_PY, config="""
        name: "stream"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """)
    metrics_port = free_port()
    with serving(repo, tmp_path, "--allow-metrics", "true", "--metrics-port", str(metrics_port),
                 "--allow-cpu-metrics", "false", "--allow-gpu-metrics", "false",
                 "--metrics-config", "histogram_latencies=true") as srv:
        for client in by_process(srv, "http").values():
            client.infer("whoami", [fp32(httpclient, "INPUT0", [1.0])])
        streams = by_process(srv, "grpc")
        for client in streams.values():
            answers: queue.SimpleQueue = queue.SimpleQueue()
            client.start_stream(callback=lambda result, error, answers=answers: answers.put(error or result))
            inp = grpcclient.InferInput("IN", [3], "INT32")
            inp.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
            client.async_stream_infer("stream", [inp])
            for _ in range(3):
                assert not isinstance(answers.get(timeout=30), Exception)
            client.stop_stream()
        answered = _inference_count(next(iter(streams.values())), "grpc", "whoami")  # by_process asks it too
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()

        def value(prefix: str) -> float:
            return float(next(x for x in text.splitlines() if x.startswith(prefix)).rsplit(" ", 1)[1])
        histogram = "nv_inference_first_response_histogram_ms"
        assert value(f'{histogram}_count{{model="whoami"') == answered >= 2 * PROCESSES
        assert value(f'{histogram}_bucket{{model="whoami",version="1",le="+Inf"}}') == answered
        assert value(f'{histogram}_count{{model="stream"') == len(streams) == PROCESSES  # once per request


def test_a_killed_process_is_restarted_and_the_other_serves_on(tmp_path):
    repo = tmp_path / "models"
    build_repository(repo)
    with serving(repo, tmp_path, "--model-control-mode", "explicit", "--load-model", "*") as srv:
        clients = by_process(srv, "http")
        victim = next(pid for pid in clients if pid != srv.proc.pid)
        # what the API changed since the start: a restarted process must take it, not the start-up list
        clients[srv.proc.pid].unload_model("batched")
        clients[victim].load_model("identity_fp32", config=TWO_ELEMENTS)
        clients[victim].update_trace_settings(settings={"trace_rate": "7"})
        clients[srv.proc.pid].update_trace_settings("whoami", {"trace_count": "3"})
        survivor = clients[srv.proc.pid]
        through_0 = by_process(srv, "grpc")[srv.proc.pid]  # gRPC: its client may be used from a thread
        # forwarded to the victim, which owns "slow", when it dies
        request = InFlight(through_0, "slow", [fp32(grpcclient, "INPUT0", [1.0])], "OUTPUT0")
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        failed = request.outcome()
        assert isinstance(failed, InferenceServerException) and failed.status() == "StatusCode.UNAVAILABLE", \
            str(failed)
        assert "front-end process 1" in failed.message(), failed.message()
        # the other process serves on, its own models and the ones it forwards or owns
        for model in ("whoami", "identity_fp32"):
            deadline = time.monotonic() + 30
            while True:  # a model the killed process owned answers once it is back
                try:
                    survivor.infer(model, [fp32(httpclient, "INPUT0", [1.0, 2.0])])
                    break
                except InferenceServerException as e:
                    assert e.status() == "503", e.message()
                    assert time.monotonic() < deadline, e.message()
                    time.sleep(0.2)
        deadline = time.monotonic() + 60
        while len(frontend_pids(srv) - {victim}) < 2:
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.2)
        for client in by_process(srv, "http").values():  # both processes serve again, as the server is now
            assert not client.is_model_ready("batched")
            dims = client.get_model_metadata("identity_fp32")["inputs"][0]["shape"]
            assert [int(d) for d in dims] == [2]
            assert client.get_trace_settings()["trace_rate"] == "7"
            assert client.get_trace_settings("whoami")["trace_count"] == "3"
            assert client.get_trace_settings("whoami")["trace_rate"] == "7"
        assert "front-end process 1 exited" in srv.log()


def test_sigterm_drains_and_stops_every_process(tmp_path):
    repo = tmp_path / "models"
    whoami(repo)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--frontend-processes", "2"]).start()
    pids = frontend_pids(srv)
    assert len(pids) == 2
    everything = descendants(srv.proc.pid) | {srv.proc.pid}
    assert len(everything) >= 2 + PROCESSES  # the front-ends, their CPU workers, whoami's instances
    srv.stop_cleanly()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in everything):
        assert time.monotonic() < deadline, "a process of the server is still running"
        time.sleep(0.1)


def test_stop_waits_for_requests_the_other_process_still_forwards(tmp_path):
    """SIGTERM without a drain, while process 1 runs an ensemble whose first step ("hold",
    which process 1 owns) takes 2 s and whose second ("echo") process 0 owns: process 0 has
    nothing in flight of its own, yet it keeps "echo" loaded until process 1's front-ends
    have answered what they took in."""
    assert zlib.crc32(b"echo") % PROCESSES == 0  # share.py's owner
    repo = tmp_path / "models"
    whoami(repo)
    hold_model(repo, 2)
    python_identity(repo, "echo", "FP32")
    write_model(repo, "held_then_echoed", config="""
        name: "held_then_echoed"
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [
          { model_name: "hold" model_version: -1 input_map { key: "INPUT0" value: "X" }
            output_map { key: "OUTPUT0" value: "H" } },
          { model_name: "echo" model_version: -1 input_map { key: "INPUT0" value: "H" }
            output_map { key: "OUTPUT0" value: "Y" } } ] }
        """)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--frontend-processes", str(PROCESSES), "--drain-secs", "0"]).start()
    try:
        through_1 = next(c for pid, c in by_process(srv, "grpc").items() if pid != srv.proc.pid)
        request = InFlight(through_1, "held_then_echoed", [fp32(grpcclient, "X", [4.0, 2.0])], "Y")
        wait_for_log(srv, "HOLDING")
        srv.proc.send_signal(signal.SIGTERM)
        outcome = request.outcome()
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]
    finally:
        srv.stop()
    assert not isinstance(outcome, Exception), str(outcome)
    assert np.asarray(outcome).tolist() == [4.0, 2.0]


def test_stop_does_not_wait_for_a_process_that_died(tmp_path):
    """Process 0, stopping, waits for process 1's front-ends (a request is held there); when
    process 1 is killed meanwhile, process 0 stops at once, not at --exit-timeout-secs."""
    repo = tmp_path / "models"
    whoami(repo)
    hold_model(repo, 600)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--frontend-processes", str(PROCESSES), "--drain-secs", "0", "--exit-timeout-secs", "600"]).start()
    try:
        clients = by_process(srv, "grpc")
        victim = next(pid for pid in clients if pid != srv.proc.pid)
        request = InFlight(clients[victim], "hold", [fp32(grpcclient, "INPUT0", [1.0])], "OUTPUT0")
        wait_for_log(srv, "HOLDING")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # process 0's front-ends have stopped: it waits for process 1's
        assert srv.proc.poll() is None, srv.log()[-3000:]
        os.kill(victim, signal.SIGKILL)
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]
        outcome = request.outcome()
    finally:
        srv.stop()
    assert isinstance(outcome, InferenceServerException) and outcome.status() == "StatusCode.UNAVAILABLE", \
        str(outcome)
    assert "did not stop their front-ends in time" not in srv.log()


@pytest.mark.parametrize("log_frequency", [0, 3])
def test_one_trace_file_for_the_whole_server(tmp_path, log_frequency):
    """``--trace-config file=``: process 0 writes the one file (or its indexed files), the
    other process passes it its traces; every request traced once, by the process that ran
    it, every id unique."""
    repo = tmp_path / "models"
    whoami(repo)
    python_identity(repo, "identity_fp32", "FP32")  # owned by one process, forwarded by the other
    trace_file = tmp_path / "trace.json"
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=[
        "--frontend-processes", str(PROCESSES), "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
        "--trace-config", f"log_frequency={log_frequency}", "--trace-config", f"file={trace_file}"]).start()
    try:
        clients = by_process(srv, "http")  # asks whoami until it has met each process: traced too
        for client in clients.values():
            for model in ("whoami", "identity_fp32"):
                for _ in range(4):
                    client.infer(model, [fp32(httpclient, "INPUT0", [1.0])])
        counts = {m: _inference_count(next(iter(clients.values())), "http", m) for m in ("whoami", "identity_fp32")}
    finally:
        srv.stop_cleanly()
    assert counts["identity_fp32"] == 4 * PROCESSES
    files = [trace_file] if log_frequency == 0 else sorted(tmp_path.glob("trace.json.*"))
    traces = [t for f in files for t in json.loads(f.read_text())]
    ids = [t["id"] for t in traces]
    assert len(ids) == len(set(ids)), "a trace id appears twice"
    assert {m: sum(t["model_name"] == m for t in traces) for m in counts} == counts  # each request once
    for t in traces:  # a forwarded request too: its model's owner traced it, queue and compute
        names = [stamp["name"] for stamp in t["timestamps"]]
        assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END" and "COMPUTE_START" in names, t
    if log_frequency:  # full files, but for each process's last
        sizes = [len(json.loads(f.read_text())) for f in files]
        assert all(size <= log_frequency for size in sizes) and sum(s < log_frequency for s in sizes) <= PROCESSES


def test_opentelemetry_spans_of_a_forwarded_request(tmp_path):
    """Mode opentelemetry: the request's InferRequest span comes from the process it reached,
    its model and compute spans from the process that owns the model, under it."""
    from .test_trace_otel import HTTP_EVENTS, PARENT, TRACE_ID, TRACEPARENT, Collector, _check_request, _otel_args
    repo = tmp_path / "models"
    whoami(repo)
    python_identity(repo, "identity_fp32", "FP32")  # owned by one process, forwarded by the other
    collector = Collector()
    try:
        with serving(repo, tmp_path, *_otel_args(collector.url, "rate=1")) as srv:
            for client in by_process(srv, "http").values():  # whoami's spans: not in the caller's trace
                collector.clear()
                client.infer("identity_fp32", [fp32(httpclient, "INPUT0", [1.0, 2.0])],
                             headers={"traceparent": TRACEPARENT})
                deadline = time.monotonic() + 10
                while len(mine := [s for s in collector.spans() if s["traceId"] == TRACE_ID]) < 3:
                    assert time.monotonic() < deadline, mine
                    time.sleep(0.05)
                root, _, _ = _check_request(mine, HTTP_EVENTS)
                assert root["parentSpanId"] == PARENT
    finally:
        collector.close()


def test_grpcio_transport_is_refused_with_several_processes(tmp_path):
    srv = ServerProcess(tmp_path, tmp_path / "server.log",
                        extra_args=["--frontend-processes", "2", "--grpc-transport", "grpcio"])
    with pytest.raises(RuntimeError, match="native transport only"):
        srv.start(timeout=30)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_perf_analyzer_registers_on_one_connection_and_infers_on_others(server, proto, perf_analyzer):
    """perf_analyzer registers its regions through one client and infers through one per
    concurrency context: with two processes those reach either."""
    url = server.grpc_url if proto == "grpc" else server.http_url
    args = ["-m", "whoami", "-u", url, "-i", proto, "--shared-memory", "system", "--shape", "INPUT0:256",
            "--output-shared-memory-size", "2048", "--concurrency-range", "8", "--measurement-interval", "1000",
            "--max-trials", "3", "--stability-percentage", "90"]
    for _attempt in range(3):  # a loaded machine can miss the stability window: measure again
        proc = perf_analyzer.run(*args, timeout=120)
        if proc.returncode == 0 or "Failed to obtain stable measurement" not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{server.log()[-3000:]}"
    assert "Throughput" in proc.stdout
    clients = by_process(server, proto)
    for client in clients.values():  # perf_analyzer unregistered its regions everywhere
        assert not _regions(client, proto)


def test_response_cache_is_one_for_the_whole_server(server):
    (_, a), (_, b) = by_process(server, "http").items()
    value = [float(os.getpid() % 1000), 0.25]
    first = a.infer("cached", [fp32(httpclient, "INPUT0", value)]).as_numpy("OUTPUT0").tolist()
    second = b.infer("cached", [fp32(httpclient, "INPUT0", value)]).as_numpy("OUTPUT0").tolist()
    assert first == second == value
    stats = b.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
    assert int(stats["cache_miss"]["count"]) == 1 and int(stats["cache_hit"]["count"]) == 1, stats


def test_poll_mode_applies_a_new_model_in_every_process(tmp_path):
    repo = tmp_path / "models"
    whoami(repo)
    with serving(repo, tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "1") as srv:
        clients = by_process(srv, "http")
        python_identity(repo, "late", "FP32")
        deadline = time.monotonic() + 30
        while not all(c.is_model_ready("late") for c in clients.values()):
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.2)
        for client in clients.values():
            assert client.infer("late", [fp32(httpclient, "INPUT0", [2.0])]).as_numpy("OUTPUT0").tolist() == [2.0]


def test_sighup_reaches_every_process(tmp_path):
    """SIGHUP rereads TLS and restricted-API files: in every front-end process, not only in
    the one it was sent to."""
    repo = tmp_path / "models"
    whoami(repo)
    with serving(repo, tmp_path) as srv:
        pids = frontend_pids(srv)
        assert len(pids) == 2
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            reloaded = {int(line.split()[2]) for line in srv.log().splitlines() if "SIGHUP: reloading" in line}
            if reloaded == pids:
                break
            assert time.monotonic() < deadline, (reloaded, pids, srv.log()[-2000:])
            time.sleep(0.1)
        assert by_process(srv, "http")  # both serve on
