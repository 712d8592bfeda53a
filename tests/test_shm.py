"""System shared-memory extension against a real server process (port of Triton's
``qa/L0_shared_memory`` plus the checks triton-shm adds: reserved keys, path-like keys,
regions that shrink or vanish under the server, unregister while a request runs, and
the real perf_analyzer with ``--shared-memory system``).

Every test runs over HTTP and gRPC. Each test creates its own /dev/shm objects under a
unique key (pid + counter) and a finalizer destroys them and unregisters everything on
the server, whatever the outcome.
"""
from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from .conftest import build_core_repository
from .harness import ServerProcess, children
from .models import python_identity, write_model
from .helpers import SHM_DIR, SHM_NAMES, Regions, assert_serving, client_module, connect, expect_error

pytestmark = pytest.mark.timeout(120)

FLAG = "--allow-client-shm=true"

SLOW_CONFIG = """
    name: "slow_fp32"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
    """

# Touches the file named by the request parameter "started_file" once it runs (so a test
# knows the request is inside the model), sleeps "sleep_ms" or waits (up to 60 s) until the
# file "release_file" exists, then echoes INPUT0.
SLOW_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            params = json.loads(params) if isinstance(params, str) and params else (params or {})
            if params.get("started_file"):
                open(params["started_file"], "w").close()
            time.sleep(float(params.get("sleep_ms", 0)) / 1000.0)
            deadline = time.monotonic() + 60
            while params.get("release_file") and not os.path.exists(params["release_file"]) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


# --------------------------------------------------------------------------- servers

@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("shm_server")
    repo = root / "models"
    build_core_repository(repo)
    write_model(repo, "slow_fp32", config=SLOW_CONFIG, model_py=SLOW_PY)
    srv = ServerProcess(repo, root / "server.log", extra_args=[FLAG]).start()
    yield srv
    # After everything: unregister all leaves nothing behind, and nothing of ours is left in /dev/shm.
    try:
        cl = httpclient.InferenceServerClient(srv.http_url)
        cl.unregister_system_shared_memory()
        assert cl.get_system_shared_memory_status() == []
        cl.close()
        leftovers = [n for n in os.listdir(SHM_DIR) if n.startswith(f"tshm_{os.getpid()}_")]
        assert not leftovers, f"test left /dev/shm objects behind: {leftovers}"
    finally:
        code = srv.stop()
    assert code == 0, f"server did not exit cleanly ({code}):\n{srv.log()[-4000:]}"


@pytest.fixture(scope="module")
def server_noshm(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("noshm_server")
    repo = root / "models"
    python_identity(repo, "identity_fp32", "FP32")
    srv = ServerProcess(repo, root / "server.log").start()
    yield srv
    assert srv.stop() == 0, srv.log()[-4000:]


# --------------------------------------------------------------------------- helpers

def status(proto: str, cl, name: str = "") -> dict[str, dict]:
    """name -> {name, key, offset, byte_size} for either protocol."""
    if proto == "http":
        return {r["name"]: {**r, "offset": int(r.get("offset", 0)), "byte_size": int(r["byte_size"])}
                for r in cl.get_system_shared_memory_status(name)}
    doc = cl.get_system_shared_memory_status(name, as_json=True)
    return {n: {"name": r["name"], "key": r["key"], "offset": int(r.get("offset", 0)),
                "byte_size": int(r["byte_size"])}
            for n, r in doc.get("regions", {}).items()}


def extensions(proto: str, cl) -> list[str]:
    md = cl.get_server_metadata() if proto == "http" else cl.get_server_metadata(as_json=True)
    return list(md.get("extensions", []))


def shm_input(proto, name, shape, datatype, region, byte_size, offset=0):
    inp = client_module(proto).InferInput(name, shape, datatype)
    inp.set_shared_memory(region, byte_size, offset)
    return inp


def data_input(proto, name, array):
    inp = client_module(proto).InferInput(name, list(array.shape), "BYTES" if array.dtype == object else
                                    {np.float32: "FP32"}[array.dtype.type])
    inp.set_data_from_numpy(array)
    return inp


def shm_output(proto, name, region, byte_size, offset=0):
    out = client_module(proto).InferRequestedOutput(name)
    out.set_shared_memory(region, byte_size, offset)
    return out


def plain_output(proto, name):
    return client_module(proto).InferRequestedOutput(name, binary_data=True) if proto == "http" \
        else grpcclient.InferRequestedOutput(name)


def shm_listing() -> set[str]:
    return set(os.listdir(SHM_DIR))


_OTHERS = re.compile(r"tshm_(\d+)_.*|triton_python_backend_shm_region_[0-9a-f-]{36}|psm_[0-9a-f]+|sem\..*"
                     r"|soak_\w+_\d+_.*")


def new_shm_objects(before: set[str]) -> set[str]:
    """What appeared in /dev/shm since ``before``, less what concurrent processes make
    (other runs of this file, a real Triton's python backend, multiprocessing, the
    soak of bench/faults.py)."""
    def ours(n: str) -> bool:
        m = _OTHERS.fullmatch(n)
        return m is None or (m.group(1) is not None and int(m.group(1)) == os.getpid())
    return {n for n in shm_listing() - before if ours(n)}


def normal_infer(proto, cl) -> None:
    """add_sub with in-band tensors answers correctly."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    res = cl.infer("add_sub", [data_input(proto, "INPUT0", a), data_input(proto, "INPUT1", b)],
                   outputs=[plain_output(proto, "OUTPUT0"), plain_output(proto, "OUTPUT1")])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def wait_started(started: Path, thread: threading.Thread, result: dict | None = None, timeout: float = 20) -> None:
    """Until the slow model has touched ``started`` (its request is inside the model)."""
    deadline = time.monotonic() + timeout
    while not started.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists(), f"the slow request never reached the model: {result}"


def wait_serving(proto, cl, timeout: float = 60) -> None:
    """Until the server is ready and add_sub answers again (after a worker restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cl.is_server_ready():
                normal_infer(proto, cl)
                return
        except InferenceServerException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("server did not serve again")
        time.sleep(0.1)


def raw_http(srv: ServerProcess, path: str, body) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{srv.http_url}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def raw_grpc_infer(srv: ServerProcess, model: str, inputs: list[dict], raw: list[bytes] = ()) -> tuple[str, str]:
    """ModelInfer with hand-built input parameters; (status code name, details)."""
    req = service_pb2.ModelInferRequest(model_name=model)
    for spec in inputs:
        t = req.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        for k, v in spec.get("parameters", {}).items():
            if isinstance(v, str):
                t.parameters[k].string_param = v
            elif isinstance(v, bool):
                t.parameters[k].bool_param = v
            else:
                t.parameters[k].int64_param = v
    req.raw_input_contents.extend(raw)
    with grpc.insecure_channel(srv.grpc_url) as ch:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details()


F32_16 = np.arange(16, dtype=np.float32).reshape(1, 16)


# =========================================================================== enablement

def test_client_shm_disabled_by_default(proto, server_noshm, tmp_path):
    cl = connect(server_noshm, proto)
    name = Regions.unique("off")
    handle = shm.create_shared_memory_region(name, "/" + name, 64)
    try:
        expect_error(proto, lambda: cl.register_system_shared_memory("off", "/" + name, 64),
                     "UNIMPLEMENTED", FLAG)
        expect_error(proto, lambda: cl.unregister_system_shared_memory("off"), "UNIMPLEMENTED", FLAG)
        assert status(proto, cl) == {}  # status still answers
        assert "system_shared_memory" not in extensions(proto, cl)
        assert "cuda_shared_memory" not in extensions(proto, cl)
        # a request naming a region fails cleanly (nothing can be registered)
        inp = shm_input(proto, "INPUT0", [16], "FP32", "off", 64)
        expect_error(proto, lambda: cl.infer("identity_fp32", [inp]), "NOT_FOUND",
                     "Unable to find shared memory region: 'off'")
        assert cl.is_server_ready()
    finally:
        cl.close()
        shm.destroy_shared_memory_region(handle)


def test_extensions_with_flag(proto, client):
    ext = extensions(proto, client)
    assert "system_shared_memory" in ext
    assert "cuda_shared_memory" in ext  # listed with no GPU too, as Triton lists it (registering fails)


# =========================================================================== happy paths

def test_valid_create_set_register_infer(proto, client, regions):
    """Two inputs at different offsets of one region; both outputs in another region."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.float32)
    hin, _, kin = regions.create(256, "in")
    hout, _, kout = regions.create(256, "out")
    shm.set_shared_memory_region(hin, [a], offset=0)
    shm.set_shared_memory_region(hin, [b], offset=128)
    client.register_system_shared_memory("in", kin, 256)
    client.register_system_shared_memory("out", kout, 256)
    st = status(proto, client)
    assert st == {"in": {"name": "in", "key": kin, "offset": 0, "byte_size": 256},
                  "out": {"name": "out", "key": kout, "offset": 0, "byte_size": 256}}
    for _ in range(2):  # the second run reuses the worker's mapping
        res = client.infer("add_sub", [shm_input(proto, "INPUT0", [1, 16], "FP32", "in", 64, 0),
                                       shm_input(proto, "INPUT1", [1, 16], "FP32", "in", 64, 128)],
                           outputs=[shm_output(proto, "OUTPUT0", "out", 64, 0),
                                    shm_output(proto, "OUTPUT1", "out", 64, 192)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [1, 16], 0), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [1, 16], 192), a - b)
        out0 = res.get_output("OUTPUT0")
        assert out0 is not None
        shape = out0["shape"] if proto == "http" else list(out0.shape)
        assert list(shape) == [1, 16]
        shm.set_shared_memory_region(hout, [np.zeros((1, 64), np.float32)])
    client.unregister_system_shared_memory()
    assert status(proto, client) == {}


def test_registered_offset_is_relative(proto, client, regions):
    """A region registered at a non-zero offset: tensor offsets count from there."""
    hin, _, kin = regions.create(8192, "in")
    x = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(hin, [x], offset=4096 + 100)
    client.register_system_shared_memory("in_off", kin, 1000, offset=4096)
    assert status(proto, client, "in_off")["in_off"]["offset"] == 4096
    res = client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "in_off", 64, 100)],
                       outputs=[plain_output(proto, "OUTPUT0")])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x)


def test_mixed_raw_shm(proto, client, regions):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.float32)
    hin, _, kin = regions.create(64, "in")
    hout, _, kout = regions.create(64, "out")
    shm.set_shared_memory_region(hin, [a])
    client.register_system_shared_memory("in", kin, 64)
    client.register_system_shared_memory("out", kout, 64)
    res = client.infer("add_sub", [shm_input(proto, "INPUT0", [1, 16], "FP32", "in", 64),
                                   data_input(proto, "INPUT1", b)],
                       outputs=[shm_output(proto, "OUTPUT0", "out", 64), plain_output(proto, "OUTPUT1")])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [1, 16]), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_bytes_round_trip(proto, client, regions):
    data = np.array([b"hello", b"", b"\x00wor\x00ld" * 3, "héllo".encode()], dtype=np.object_)
    ser = serialize_byte_tensor(data)
    size = serialized_byte_size(ser)
    hin, _, kin = regions.create(size + 16, "in")
    hout, _, kout = regions.create(size + 16, "out")
    shm.set_shared_memory_region(hin, [ser], offset=16)
    client.register_system_shared_memory("bin", kin, size + 16)
    client.register_system_shared_memory("bout", kout, size + 16)
    client.infer("identity_bytes", [shm_input(proto, "INPUT0", [4], "BYTES", "bin", size, 16)],
                 outputs=[shm_output(proto, "OUTPUT0", "bout", size + 16)])
    got = shm.get_contents_as_numpy(hout, np.object_, [4])
    assert list(got) == list(data)
    # too small an output region for the BYTES result
    expect_error(proto, lambda: client.infer(
        "identity_bytes", [shm_input(proto, "INPUT0", [4], "BYTES", "bin", size, 16)],
        outputs=[shm_output(proto, "OUTPUT0", "bout", size - 1)]), "INVALID_ARGUMENT", "should be at least")


@pytest.mark.parametrize("payload,shape", [
    (struct.pack("<I", 1000) + b"abc", [1]),             # length prefix runs past byte_size
    (struct.pack("<I", 3) + b"abc", [2]),                 # fewer elements than the shape needs
    (struct.pack("<I", 1) + b"a" + b"\x00\x00", [1]),    # truncated second prefix / trailing bytes
    (b"\x01\x00", [1]),                                   # shorter than one prefix
], ids=["overrun", "short", "trailing", "tiny"])
def test_bytes_malformed(proto, client, server, regions, payload, shape):
    workers = children(server.proc.pid)
    h, _, key = regions.create(64, "in")
    shm.set_shared_memory_region(h, [np.frombuffer(payload + b"\xff" * (64 - len(payload)), np.uint8)])
    client.register_system_shared_memory("bad", key, 64)
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_bytes", [shm_input(proto, "INPUT0", shape, "BYTES", "bad", len(payload))])
    assert info.value.status() == ("400" if proto == "http" else "StatusCode.INVALID_ARGUMENT"), info.value
    assert "BYTES" in info.value.message()
    assert_serving(server, workers=workers)


# =========================================================================== register / status / unregister

def test_status_all_one_unknown(proto, client, regions):
    _, _, k1 = regions.create(64, "a")
    _, _, k2 = regions.create(128, "b")
    client.register_system_shared_memory("r1", k1, 64)
    client.register_system_shared_memory("r2", k2, 32, offset=64)
    assert status(proto, client) == {"r1": {"name": "r1", "key": k1, "offset": 0, "byte_size": 64},
                                     "r2": {"name": "r2", "key": k2, "offset": 64, "byte_size": 32}}
    assert status(proto, client, "r2") == {"r2": {"name": "r2", "key": k2, "offset": 64, "byte_size": 32}}
    expect_error(proto, lambda: client.get_system_shared_memory_status("zzz"), "NOT_FOUND",
                 "Unable to find system shared memory region: 'zzz'")


def test_unregister_variants(proto, client, regions):
    _, _, k1 = regions.create(64, "a")
    _, _, k2 = regions.create(64, "b")
    _, _, k3 = regions.create(64, "c")
    client.unregister_system_shared_memory("never_registered")      # before register: OK
    client.register_system_shared_memory("r1", k1, 64)
    client.register_system_shared_memory("r2", k2, 64)
    client.register_system_shared_memory("r3", k3, 64)
    client.unregister_system_shared_memory("r2")
    assert set(status(proto, client)) == {"r1", "r3"}
    client.unregister_system_shared_memory("r2")                    # twice: OK
    client.unregister_system_shared_memory("unknown")               # unknown: OK
    client.unregister_system_shared_memory()                        # all
    assert status(proto, client) == {}
    client.unregister_system_shared_memory()                        # all, when empty: OK


def test_reregister_and_duplicate(proto, client, regions):
    h1, _, k1 = regions.create(64, "a")
    h2, _, k2 = regions.create(64, "b")
    shm.set_shared_memory_region(h1, [np.full(16, 1, np.float32)])
    shm.set_shared_memory_region(h2, [np.full(16, 2, np.float32)])
    client.register_system_shared_memory("dup", k1, 64)
    expect_error(proto, lambda: client.register_system_shared_memory("dup", k2, 64), "ALREADY_EXISTS",
                 "shared memory region 'dup' already in manager")
    assert status(proto, client)["dup"]["key"] == k1  # the failed attempt changed nothing

    def run():
        res = client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "dup", 64)],
                           outputs=[plain_output(proto, "OUTPUT0")])
        return res.as_numpy("OUTPUT0")

    np.testing.assert_array_equal(run(), np.full(16, 1, np.float32))
    client.unregister_system_shared_memory("dup")
    expect_error(proto, run, "NOT_FOUND", "Unable to find shared memory region: 'dup'")
    client.register_system_shared_memory("dup", k2, 64)  # same name, another object
    np.testing.assert_array_equal(run(), np.full(16, 2, np.float32))
    client.unregister_system_shared_memory("dup")
    client.register_system_shared_memory("dup", k1, 64)  # and back
    np.testing.assert_array_equal(run(), np.full(16, 1, np.float32))


def _invalid_register_cases(obj: str):
    """(id, key, byte_size, offset, grpc code, message fragment)."""
    return [
        ("too_big", "/" + obj, 65, 0, "INVALID_ARGUMENT", "Invalid shared memory region"),
        ("too_big_with_offset", "/" + obj, 64, 1, "INVALID_ARGUMENT", "Invalid shared memory region"),
        ("large_offset", "/" + obj, 1, 1 << 40, "INVALID_ARGUMENT", "Invalid shared memory region"),
        ("offset_int64_max", "/" + obj, 1, (1 << 63) - 1, "INVALID_ARGUMENT", "Invalid shared memory region"),
        ("byte_size_int64_max", "/" + obj, (1 << 63) - 1, 8, "INVALID_ARGUMENT", "Invalid shared memory region"),
        ("no_such_key", f"/{obj}_nope", 64, 0, "INVALID_ARGUMENT", "Unable to open shared memory region"),
        ("dotdot", "../etc/passwd", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("dotdot_abs", f"/../{obj}", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("dotdot_only", "..", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("dot_only", "/.", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("abs_path", "/a/b", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("dev_shm_path", f"/dev/shm/{obj}", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("all_slashes", "///", 64, 0, "INVALID_ARGUMENT", "invalid shared memory key"),
        ("empty", "", 64, 0, "INVALID_ARGUMENT", "shared memory key"),
        ("internal", "triton_shm_internal_x", 64, 0, "INVALID_ARGUMENT", "reserved"),
        ("internal_slash", "/triton_shm_internal_x", 64, 0, "INVALID_ARGUMENT", "reserved"),
        ("python_backend", "/triton_python_backend_shm_region_1", 64, 0, "INVALID_ARGUMENT", "reserved"),
        ("python_backend_slashes", "//triton_python_backend_shm_region_1", 64, 0, "INVALID_ARGUMENT",
         "reserved"),
        ("python_backend_many_slashes", "////triton_python_backend_shm_region_1", 64, 0,
         "INVALID_ARGUMENT", "reserved"),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _invalid_register_cases("x")])
def test_register_invalid(proto, client, server, regions, case):
    _, obj, _ = regions.create(64, "valid")
    _, key, size, offset, grpc_code, fragment = next(
        c for c in _invalid_register_cases(obj) if c[0] == case)
    before = shm_listing()
    expect_error(proto, lambda: client.register_system_shared_memory("bad", key, size, offset=offset),
                 grpc_code, fragment)
    assert status(proto, client) == {}
    assert new_shm_objects(before) == set(), "register created something in /dev/shm"
    assert os.path.getsize(os.path.join(SHM_DIR, obj)) == 64  # never truncated or grown
    client.register_system_shared_memory("good", "/" + obj, 64)  # the server still registers fine
    assert set(status(proto, client)) == {"good"}


@pytest.mark.parametrize("prefix", ["triton_python_backend_shm_region_", "triton_shm_internal_"])
def test_register_reserved_existing_object(proto, client, regions, prefix):
    """The object exists under a reserved name: refused because of the name, not a failed open."""
    name = f"{prefix}tshm_{os.getpid()}_{next(SHM_NAMES)}"
    path = regions.path(name)
    with open(path, "wb") as f:
        f.truncate(64)
    for key in (name, "/" + name, "//" + name):
        expect_error(proto, lambda key=key: client.register_system_shared_memory("rsv", key, 64),
                     "INVALID_ARGUMENT", "reserved")
    assert status(proto, client) == {}


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_register_not_a_shm_object(proto, client, regions, tmp_path, kind):
    """Only regular objects directly in /dev/shm: symlinks are not followed (O_NOFOLLOW)."""
    name = Regions.unique(kind)
    path = regions.path(name)
    target = tmp_path / "secret"
    target.write_bytes(b"s" * 4096)
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        os.mkfifo(path)
    expect_error(proto, lambda: client.register_system_shared_memory("odd", "/" + name, 64),
                 "INVALID_ARGUMENT")
    assert status(proto, client) == {}
    assert target.read_bytes() == b"s" * 4096


def test_register_nul_in_key_or_name(proto, client, server, regions):
    _, obj, key = regions.create(64, "nul")
    before = shm_listing()
    if proto == "http":
        code, body = raw_http(server, "/v2/systemsharedmemory/region/nul/register",
                              {"key": key + "\x00../../etc/passwd", "offset": 0, "byte_size": 64})
        assert code == 400 and "NUL" in body, (code, body)
        code, body = raw_http(server, "/v2/systemsharedmemory/region/a%00b/register",
                              {"key": key, "offset": 0, "byte_size": 64})
        assert code == 400, (code, body)
        # malformed bodies / types are 400 too
        for bad in (b"{", b"[]", {"key": key, "byte_size": "64"}, {"key": key, "byte_size": -1},
                    {"key": key, "byte_size": 64, "offset": -1}, {"key": key}, {"key": 5, "byte_size": 64},
                    {"key": key, "byte_size": 64.0}, {"key": key, "byte_size": True}):
            code, body = raw_http(server, "/v2/systemsharedmemory/region/nul/register", bad)
            assert code == 400, (bad, code, body)
    else:
        expect_error(proto, lambda: client.register_system_shared_memory("nul", key + "\x00../x", 64),
                     "INVALID_ARGUMENT", "NUL")
        expect_error(proto, lambda: client.register_system_shared_memory("a\x00b", key, 64),
                     "INVALID_ARGUMENT")
        expect_error(proto, lambda: client.register_system_shared_memory("", key, 64), "INVALID_ARGUMENT")
        expect_error(proto, lambda: client.register_system_shared_memory("big", key, (1 << 64) - 1),
                     "INVALID_ARGUMENT")
    assert new_shm_objects(before) == set()
    assert status(proto, client) == {}


# =========================================================================== infer-time checks

@pytest.fixture
def in_region(client, regions):
    """A registered 128-byte input region 'in' holding two FP32[16] and a 64-byte output region 'out'."""
    hin, _, kin = regions.create(128, "in")
    hout, _, kout = regions.create(64, "out")
    shm.set_shared_memory_region(hin, [F32_16, F32_16 * 2])
    client.register_system_shared_memory("in", kin, 128)
    client.register_system_shared_memory("out", kout, 64)
    return hin, hout


INFER_ERRORS = [
    # id, input0 (byte_size, offset), output0 (byte_size, offset) or None, code, fragment
    ("offset_oob", (64, 128), None, "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("offset_past_end", (64, 129), None, "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("offset_partly_out", (64, 65), None, "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("offset_int64_max", (64, (1 << 63) - 1), None, "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("size_mismatch", (60, 0), None, "INVALID_ARGUMENT", "input byte size mismatch"),
    ("size_huge", ((1 << 63) - 1, 0), None, "INVALID_ARGUMENT", "input byte size mismatch"),
    ("out_too_small", (64, 0), (32, 0), "INVALID_ARGUMENT", "should be at least"),
    ("out_offset_oob", (64, 0), (64, 1), "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("out_offset_int64_max", (64, 0), (64, (1 << 63) - 1), "INVALID_ARGUMENT", "Invalid offset + byte size"),
    ("out_size_huge", (64, 0), ((1 << 63) - 1, 0), "INVALID_ARGUMENT", "Invalid offset + byte size"),
]


@pytest.mark.parametrize("case", INFER_ERRORS, ids=[c[0] for c in INFER_ERRORS])
def test_infer_bounds(proto, client, server, in_region, case):
    _, (isize, ioff), out, grpc_code, fragment = case
    inputs = [shm_input(proto, "INPUT0", [1, 16], "FP32", "in", isize, ioff),
              shm_input(proto, "INPUT1", [1, 16], "FP32", "in", 64, 64)]
    outputs = [shm_output(proto, "OUTPUT0", "out", *out)] if out else None
    expect_error(proto, lambda: client.infer("add_sub", inputs, outputs=outputs), grpc_code,
                 fragment)
    assert_serving(server)


def test_infer_byte_size_out_of_bound(proto, client, server, in_region):
    """Shape and byte_size agree (256 bytes) but the region holds 128."""
    expect_error(proto, lambda: client.infer("identity_fp32", [shm_input(proto, "INPUT0", [64], "FP32", "in", 256)]),
                 "INVALID_ARGUMENT", "Invalid offset + byte size")


def test_infer_unknown_region(proto, client, in_region):
    expect_error(proto, lambda: client.infer("add_sub", [shm_input(proto, "INPUT0", [1, 16], "FP32", "zzz", 64),
                                                         shm_input(proto, "INPUT1", [1, 16], "FP32", "in", 64)]),
                 "NOT_FOUND", "Unable to find shared memory region: 'zzz'")
    expect_error(proto, lambda: client.infer("add_sub", [shm_input(proto, "INPUT0", [1, 16], "FP32", "in", 64),
                                                         shm_input(proto, "INPUT1", [1, 16], "FP32", "in", 64)],
                                             outputs=[shm_output(proto, "OUTPUT0", "zzz", 64)]),
                 "NOT_FOUND", "Unable to find shared memory region: 'zzz'")


# (id, parameters, the core's message, HTTP's message where its decoder answers first: an
# input whose parameters name no region has no data field, in Triton's wording)
_RID = "[request id: <id_unknown>] input 'INPUT0': "
_NO_DATA = ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But no field is set")
_TOGETHER = _RID + "'shared_memory_region' and 'shared_memory_byte_size' must be given together"
_SIZE = _RID + "'shared_memory_byte_size' must be a non-negative integer"
RAW_PARAM_CASES = [
    ("region_only", {"shared_memory_region": "in"}, _TOGETHER, None),
    ("byte_size_only", {"shared_memory_byte_size": 64}, _TOGETHER, _NO_DATA),
    ("offset_only", {"shared_memory_offset": 0}, _TOGETHER, _NO_DATA),
    ("negative_offset", {"shared_memory_region": "in", "shared_memory_byte_size": 64, "shared_memory_offset": -1},
     _RID + "'shared_memory_offset' must be a non-negative integer", None),
    ("negative_size", {"shared_memory_region": "in", "shared_memory_byte_size": -64}, _SIZE, None),
    ("region_not_string", {"shared_memory_region": 5, "shared_memory_byte_size": 64},
     _RID + "'shared_memory_region' must be a string", None),
    ("size_not_int", {"shared_memory_region": "in", "shared_memory_byte_size": "64"}, _SIZE, None),
    ("size_bool", {"shared_memory_region": "in", "shared_memory_byte_size": True}, _SIZE, None),
]


@pytest.mark.parametrize("case", RAW_PARAM_CASES, ids=[c[0] for c in RAW_PARAM_CASES])
def test_infer_malformed_shm_params(proto, client, server, in_region, case):
    _, params, message, http_message = case
    if proto == "http":
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "parameters": params}]}
        code, text = raw_http(server, "/v2/models/identity_fp32/infer", body)
        assert (code, json.loads(text)) == (400, {"error": http_message or message})
    else:
        code, details = raw_grpc_infer(server, "identity_fp32",
                                       [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "parameters": params}])
        assert (code, details) == ("INVALID_ARGUMENT", message)
    assert_serving(server)


_ONE_OF = ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
           "'shared_memory_region' in 'parameters'. But set ")


def test_infer_data_and_shm(proto, client, server, in_region):
    params = {"shared_memory_region": "in", "shared_memory_byte_size": 64}
    if proto == "http":
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "parameters": params,
                            "data": list(range(16))}]}
        code, text = raw_http(server, "/v2/models/identity_fp32/infer", body)
        assert (code, json.loads(text)) == (400, {"error": _ONE_OF + "'data' 'shared_memory_region'"})
        # binary form: binary_data_size plus shm parameters
        header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16],
                                         "parameters": {**params, "binary_data_size": 64}}]}).encode()
        req = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer",
                                     data=header + F32_16.tobytes(), method="POST",
                                     headers={"Inference-Header-Content-Length": str(len(header)),
                                              "Content-Type": "application/octet-stream"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        assert (info.value.code, json.loads(info.value.read())) == (
            400, {"error": _ONE_OF + "'binary_data_size' 'shared_memory_region'"})
    else:
        code, details = raw_grpc_infer(server, "identity_fp32",
                                       [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "parameters": params}],
                                       raw=[F32_16.tobytes()])
        assert (code, details) == ("INVALID_ARGUMENT", "expected 0 raw_input_contents entries (one per input not in "
                                                       "shared memory) but got 1 for model 'identity_fp32'")
    assert_serving(server)


def test_infer_http_json_offset_beyond_int64(client, server, in_region, proto):
    """JSON integers are unbounded; offsets past 2**64 must not wrap."""
    if proto != "http":
        pytest.skip("JSON only")
    for offset in (1 << 64, (1 << 64) + 64, 1 << 200):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16],
                            "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64,
                                           "shared_memory_offset": offset}}]}
        code, text = raw_http(server, "/v2/models/identity_fp32/infer", body)
        assert code == 400, (offset, code, text)
    assert_serving(server)


# =========================================================================== client misbehaviour

@pytest.mark.parametrize("which", ["input", "output"])
def test_client_truncates_region(proto, client, server, regions, which):
    workers = children(server.proc.pid)
    hin, in_name, kin = regions.create(128, "in")
    hout, out_name, kout = regions.create(128, "out")
    x = np.arange(32, dtype=np.float32)
    shm.set_shared_memory_region(hin, [x])
    client.register_system_shared_memory("tin", kin, 128)
    client.register_system_shared_memory("tout", kout, 128)

    def run():
        return client.infer("identity_fp32", [shm_input(proto, "INPUT0", [32], "FP32", "tin", 128)],
                            outputs=[shm_output(proto, "OUTPUT0", "tout", 128)])

    run()  # the worker maps both regions
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [32]), x)
    fd = os.open(os.path.join(SHM_DIR, in_name if which == "input" else out_name), os.O_RDWR)
    try:
        os.ftruncate(fd, 16)
    finally:
        os.close(fd)
    expect_error(proto, run, "INVALID_ARGUMENT", "shrunk")
    # a fresh registration of the shrunken object is refused at register time
    expect_error(proto, lambda: client.register_system_shared_memory(
        "again", kin if which == "input" else kout, 128), "INVALID_ARGUMENT", "Invalid shared memory region")
    assert_serving(server, workers=workers)
    # NB: the test must not read its own mapping past the new end (SIGBUS here, not in the server)


def test_client_truncates_input_during_inference(proto, client, server, regions, tmp_path):
    workers = children(server.proc.pid)
    hin, in_name, kin = regions.create(4096, "in")
    shm.set_shared_memory_region(hin, [np.arange(1024, dtype=np.float32)])
    client.register_system_shared_memory("tin", kin, 4096)
    started = tmp_path / "started"
    result: dict = {}

    def slow():
        cl = connect(server, proto)
        try:
            cl.infer("slow_fp32", [shm_input(proto, "INPUT0", [1024], "FP32", "tin", 4096)],
                     outputs=[plain_output(proto, "OUTPUT0")],
                     parameters={"sleep_ms": 800, "started_file": str(started)})
            result["ok"] = True
        except InferenceServerException as e:
            result["error"] = e
        finally:
            cl.close()

    t = threading.Thread(target=slow)
    t.start()
    try:
        wait_started(started, t)
        fd = os.open(os.path.join(SHM_DIR, in_name), os.O_RDWR)
        os.ftruncate(fd, 0)
        os.close(fd)
        t.join(30)
        assert not t.is_alive()
        # acceptable: a clean 4xx (or success from a copy taken before the truncation); the worker survives
        if "error" in result:
            assert result["error"].status() == ("400" if proto == "http" else "StatusCode.INVALID_ARGUMENT"), \
                result["error"]
        assert children(server.proc.pid) == workers, "the worker died (SIGBUS) and was replaced"
        assert_serving(server, workers=workers)
    finally:  # whatever happened, leave a serving server to the next test
        t.join(30)
        wait_serving(proto, client)


def test_client_unlinks_region(proto, client, server, regions):
    workers = children(server.proc.pid)
    hin, in_name, kin = regions.create(64, "in")
    hout, out_name, kout = regions.create(64, "out")
    x = np.arange(16, dtype=np.float32) * 3
    shm.set_shared_memory_region(hin, [x])
    client.register_system_shared_memory("uin", kin, 64)
    client.register_system_shared_memory("uout", kout, 64)
    os.unlink(os.path.join(SHM_DIR, in_name))
    os.unlink(os.path.join(SHM_DIR, out_name))
    # the server's fd keeps the objects alive: it still works (or would fail cleanly)
    client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "uin", 64)],
                 outputs=[shm_output(proto, "OUTPUT0", "uout", 64)])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [16]), x)
    assert set(status(proto, client)) == {"uin", "uout"}
    client.unregister_system_shared_memory("uin")
    client.unregister_system_shared_memory("uout")
    assert not os.path.exists(os.path.join(SHM_DIR, in_name))  # the server never re-creates it
    assert_serving(server, workers=workers)


# =========================================================================== unregister during inference

def _start_slow(proto, srv, region_in, region_out, started: Path, sleep_ms=0, release: Path | None = None):
    """A slow_fp32 request from a thread, once it runs in the model; ``release``: it waits
    there until that file exists."""
    result: dict = {}
    parameters = {"sleep_ms": sleep_ms, "started_file": str(started)}
    if release is not None:
        parameters["release_file"] = str(release)

    def run():
        cl = connect(srv, proto)
        try:
            cl.infer("slow_fp32", [shm_input(proto, "INPUT0", [16], "FP32", region_in, 64)],
                     outputs=[shm_output(proto, "OUTPUT0", region_out, 64)], parameters=parameters)
            result["ok"] = True
        except Exception as e:  # noqa: BLE001
            result["error"] = e
        finally:
            cl.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_started(started, t, result)
    return t, result


def test_unregister_shm_during_inference_single_req(proto, client, server, regions, tmp_path):
    """As in Triton: unregistering regions a request uses succeeds at once, they stay listed
    and their names taken until the request is done, which reads and writes them as
    registered; then they are gone without another call."""
    workers = children(server.proc.pid)
    hin, _, kin = regions.create(64, "in")
    hout, _, kout = regions.create(64, "out")
    hnew, _, knew = regions.create(64, "new")
    x = np.arange(16, dtype=np.float32) + 100
    shm.set_shared_memory_region(hin, [x])
    shm.set_shared_memory_region(hnew, [np.full(16, 7, np.float32)])
    client.register_system_shared_memory("din", kin, 64)
    client.register_system_shared_memory("dout", kout, 64)
    release = tmp_path / "release"
    t, result = _start_slow(proto, server, "din", "dout", tmp_path / "started", release=release)
    try:
        client.unregister_system_shared_memory("din")
        client.unregister_system_shared_memory("dout")
        assert set(status(proto, client)) == {"din", "dout"}  # in use: still registered
        assert status(proto, client, "din")["din"]["key"] == kin
        expect_error(proto, lambda: client.register_system_shared_memory("din", knew, 64), "ALREADY_EXISTS",
                     "shared memory region 'din' already in manager")
        # the other kind's unregister-all leaves them
        client.unregister_cuda_shared_memory()
        assert set(status(proto, client)) == {"din", "dout"}
    finally:
        release.touch()
    t.join(30)
    assert not t.is_alive()
    assert result.get("ok"), result.get("error")
    # the request read the input and wrote into the output region as registered
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [16]), x)
    assert status(proto, client) == {}  # gone once the request was done
    expect_error(proto, lambda: client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "din", 64)]),
                 "NOT_FOUND", "din")
    client.register_system_shared_memory("din", knew, 64)  # the name is free again
    res = client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "din", 64)],
                       outputs=[plain_output(proto, "OUTPUT0")])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), np.full(16, 7, np.float32))
    client.unregister_system_shared_memory()
    assert status(proto, client) == {}
    assert_serving(server, workers=workers)


def test_unregister_shm_during_inference_multiple_req(proto, client, server, regions, tmp_path):
    """Unregister-all while two requests are held in the model (two instances): every region
    stays until the requests using it are done; an unused one goes at once."""
    workers = children(server.proc.pid)
    handles = []
    for i in range(2):
        hin, _, kin = regions.create(64, f"in{i}")
        hout, _, kout = regions.create(64, f"out{i}")
        shm.set_shared_memory_region(hin, [np.arange(16, dtype=np.float32) * (i + 2)])
        client.register_system_shared_memory(f"in{i}", kin, 64)
        client.register_system_shared_memory(f"out{i}", kout, 64)
        handles.append(hout)
    _, _, kidle = regions.create(64, "idle")
    client.register_system_shared_memory("idle", kidle, 64)
    release = tmp_path / "release"
    try:
        t0, r0 = _start_slow(proto, server, "in0", "out0", tmp_path / "s0", release=release)
        t1, r1 = _start_slow(proto, server, "in1", "out1", tmp_path / "s1", release=release)
        client.unregister_system_shared_memory()
        assert set(status(proto, client)) == {"in0", "out0", "in1", "out1"}
    finally:
        release.touch()
    for t, r in ((t0, r0), (t1, r1)):
        t.join(30)
        assert r.get("ok"), r.get("error")
    for i, handle in enumerate(handles):
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [16]),
                                      np.arange(16, dtype=np.float32) * (i + 2))
    assert status(proto, client) == {}
    assert_serving(server, workers=workers)


def test_unregister_after_inference_and_register_after(proto, client, server, regions):
    hin, _, kin = regions.create(64, "in")
    x = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(hin, [x])
    for _ in range(3):
        client.register_system_shared_memory("cycle", kin, 64)
        res = client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "cycle", 64)],
                           outputs=[plain_output(proto, "OUTPUT0")])
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x)
        client.unregister_system_shared_memory("cycle")
        assert status(proto, client) == {}


def test_server_fd_count_bounded(proto, client, server, regions):
    """Register/infer/unregister cycles do not leak fds in the front-end (Triton's python_client_leak)."""
    hin, _, kin = regions.create(64, "in")
    shm.set_shared_memory_region(hin, [np.arange(16, dtype=np.float32)])

    def cycle():
        client.register_system_shared_memory("leak", kin, 64)
        client.infer("identity_fp32", [shm_input(proto, "INPUT0", [16], "FP32", "leak", 64)])
        client.unregister_system_shared_memory("leak")

    cycle()
    fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    for _ in range(30):
        cycle()
    time.sleep(0.2)
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= fds + 2
    for w in children(server.proc.pid):
        n = sum(1 for p in os.listdir(f"/proc/{w}/fd")
                if os.readlink(f"/proc/{w}/fd/{p}").startswith(f"{SHM_DIR}/{kin[1:]}"))
        assert n == 0, f"worker {w} still holds {n} fds of an unregistered region"


# =========================================================================== perf_analyzer

@pytest.mark.parametrize("output_shm", [False, True], ids=["in_shm", "in_out_shm"])
def test_perf_analyzer_system_shm(proto, server, output_shm, perf_analyzer):
    url = server.grpc_url if proto == "grpc" else server.http_url
    args = ["-m", "identity_fp32", "-u", url, "-i", proto, "--shared-memory", "system",
            "--shape", "INPUT0:1024", "--concurrency-range", "2", "--measurement-interval", "1000",
            "--max-trials", "3", "--stability-percentage", "80"]
    if output_shm:
        args += ["--output-shared-memory-size", "4096"]
    before = shm_listing()
    for _attempt in range(3):  # on a loaded machine the 80% stability window can be missed: measure again
        proc = perf_analyzer.run(*args, timeout=90)
        unstable = "Failed to obtain stable measurement" in proc.stdout + proc.stderr
        if proc.returncode == 0 or not unstable:
            break
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{server.log()[-3000:]}"
    assert "Client:" in proc.stdout and "Throughput" in proc.stdout, proc.stdout[-3000:]
    cl = connect(server, proto)
    try:
        assert status(proto, cl) == {}, "perf_analyzer's regions are still registered"
    finally:
        cl.close()
    assert new_shm_objects(before) == set(), "perf_analyzer's regions were left in /dev/shm"
