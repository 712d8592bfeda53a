"""Inputs lent in place from a client's system shared-memory region, against a real server.

A model that declares it never writes its inputs (``SHM_INPUTS_IN_PLACE``, and the ONNX
Runtime backend always) reads a client's region through the worker's mapping instead of a
copy. These tests show the difference from a copy (a write by the client while the model
waits is seen), the read-only arrays, a truncation while the model reads (a clear error,
no dead worker, the region serving again once restored), and a model that keeps an input
after its region is unregistered (valid memory, never a crash). With the pure-Python
twins every input is copied; the tests check that behaviour instead where it differs.

The mapping's own rules (zero pages on a fault, a slot per live mapping) are checked in
process at the end.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from triton_shm.worker.assembler import USING_EXTENSION

from .harness import ServerProcess, children
from .helpers import SHM_DIR, assert_serving, client_module, connect, expect_error
from .models import add_sub_onnx_model, python_identity, write_model
from .test_shm import plain_output, shm_input, wait_started

pytestmark = pytest.mark.timeout(120)

N = 1024  # FP32 elements per request: 4 KiB

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
             {{ name: "WRITABLE" data_type: TYPE_BOOL dims: [ 1 ] }} ]
    {parameters}
    """

# Parameters: "started_file" (touched once the request is inside the model), "sleep_ms"
# (before the input is read), "stash" (keep the input array), "read_stash" (answer the
# sum of the kept array instead of the input).
MODEL_PY = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

STASH = []

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            params = json.loads(params) if isinstance(params, str) and params else (params or {})
            if params.get("started_file"):
                open(params["started_file"], "w").close()
            time.sleep(float(params.get("sleep_ms", 0)) / 1000.0)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            writable = np.array([x.flags.writeable])
            if params.get("stash"):
                STASH.append(x)
            if params.get("read_stash"):
                x = np.array([STASH[-1].sum()], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array(x)), pb_utils.Tensor("WRITABLE", writable)]))
        return responses
"""
LENT = "lent_fp32"      # declares SHM_INPUTS_IN_PLACE
COPIED = "copied_fp32"  # the same model without it
IN_PLACE = USING_EXTENSION  # the twin copies every client input


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProcess:
    root = tmp_path_factory.mktemp("shm_in_place")
    repo = root / "models"
    write_model(repo, LENT, config=CONFIG.format(
        name=LENT, parameters='parameters: { key: "SHM_INPUTS_IN_PLACE" value: { string_value: "yes" } }'),
        model_py=MODEL_PY)
    write_model(repo, COPIED, config=CONFIG.format(name=COPIED, parameters=""), model_py=MODEL_PY)
    python_identity(repo, "identity_fp32", "FP32")
    add_sub_onnx_model(repo)  # ONNX Runtime: lent in place always
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true"]).start()
    yield srv
    assert srv.stop() == 0, srv.log()[-4000:]


def _region(client, regions, name: str, values: np.ndarray):
    """A registered region holding ``values``: (handle, /dev/shm path)."""
    handle, obj, key = regions.create(values.nbytes, name)
    shm.set_shared_memory_region(handle, [values])
    client.register_system_shared_memory(name, key, values.nbytes)
    return handle, os.path.join(SHM_DIR, obj)


def _infer(proto, cl, model: str, region: str | None, data: np.ndarray | None = None, **params):
    if region is not None:
        inp = shm_input(proto, "INPUT0", [N], "FP32", region, N * 4)
    else:
        inp = client_module(proto).InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
    res = cl.infer(model, [inp], outputs=[plain_output(proto, "OUTPUT0"), plain_output(proto, "WRITABLE")],
                   parameters=params or None)
    return res.as_numpy("OUTPUT0"), bool(res.as_numpy("WRITABLE")[0])


def _during_sleep(proto, server, model: str, region: str, tmp_path, action) -> dict:
    """Run one slow request on ``region`` and call ``action`` while the model sleeps,
    before it reads its input; the request's output or error."""
    started = tmp_path / f"started_{model}"
    started.unlink(missing_ok=True)
    result: dict = {}

    def run():
        cl = connect(server, proto)
        try:
            result["output"] = _infer(proto, cl, model, region, sleep_ms=600, started_file=str(started))[0]
        except InferenceServerException as e:
            result["error"] = e
        finally:
            cl.close()

    t = threading.Thread(target=run)
    t.start()
    try:
        wait_started(started, t, result)
        action()
    finally:
        t.join(30)
    assert not t.is_alive()
    return result


def test_a_lent_input_is_the_clients_memory_and_read_only(proto, client, server, regions, tmp_path):
    """The model reads the region as it is when it reads (a copy would show what it held
    when the request arrived), through an array it cannot write; in-band inputs stay
    writable, and a model without the parameter gets a writable copy."""
    before, after = np.arange(N, dtype=np.float32), np.full(N, 7.0, dtype=np.float32)
    handle, _ = _region(client, regions, "lend", before)

    def rewrite():
        shm.set_shared_memory_region(handle, [after])

    result = _during_sleep(proto, server, LENT, "lend", tmp_path, rewrite)
    np.testing.assert_array_equal(result["output"], after if IN_PLACE else before)
    shm.set_shared_memory_region(handle, [before])
    result = _during_sleep(proto, server, COPIED, "lend", tmp_path, rewrite)
    np.testing.assert_array_equal(result["output"], before)  # copied before the model ran

    assert _infer(proto, client, LENT, "lend")[1] is (not IN_PLACE)
    assert _infer(proto, client, COPIED, "lend")[1] is True
    assert _infer(proto, client, LENT, None, before)[1] is True
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [N]), after)  # nothing wrote it


def test_a_truncation_while_the_model_reads_fails_the_request_and_the_worker_lives(
        proto, client, server, regions, tmp_path):
    values = np.arange(N, dtype=np.float32)
    _, path = _region(client, regions, "shrinks", values)
    workers = children(server.proc.pid)

    def truncate():
        with open(path, "r+b") as f:
            f.truncate(0)

    result = _during_sleep(proto, server, LENT, "shrinks", tmp_path, truncate)
    if IN_PLACE:
        e = result.get("error")
        assert e is not None, "a request whose lent input was truncated under the model succeeded"
        assert e.status() == ("400" if proto == "http" else "StatusCode.INVALID_ARGUMENT"), e
        assert "shrank" in e.message(), e.message()
    else:  # the twin copied the input before the model ran
        np.testing.assert_array_equal(result["output"], values)
    assert children(server.proc.pid) == workers, "the worker died (SIGBUS) and was replaced"
    # while the region is short it is refused; restored, it serves again (mapped afresh)
    expect_error(proto, lambda: _infer(proto, client, LENT, "shrinks"), "INVALID_ARGUMENT", "shrunk")
    with open(path, "r+b") as f:
        f.truncate(N * 4)
        f.write((values * 2).tobytes())
    np.testing.assert_array_equal(_infer(proto, client, LENT, "shrinks")[0], values * 2)
    assert_serving(server, workers=workers)


def test_onnx_runtime_reads_lent_inputs(proto, client, regions):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 3.0, dtype=np.float32)
    handle, obj, key = regions.create(128, "onnx")
    shm.set_shared_memory_region(handle, [a, b])
    client.register_system_shared_memory("onnx", key, 128)
    inputs = [shm_input(proto, "INPUT0", [1, 16], "FP32", "onnx", 64),
              shm_input(proto, "INPUT1", [1, 16], "FP32", "onnx", 64, offset=64)]
    res = client.infer("add_sub", inputs, outputs=[plain_output(proto, "OUTPUT0"), plain_output(proto, "OUTPUT1")])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_a_model_keeping_a_lent_input_after_unregister_keeps_valid_memory(proto, client, server, regions):
    values = np.arange(N, dtype=np.float32)
    _, path = _region(client, regions, "kept", values)
    workers = children(server.proc.pid)
    _infer(proto, client, LENT, "kept", stash=True)
    client.unregister_system_shared_memory("kept")
    probe = np.zeros(1, dtype=np.float32)
    assert _infer(proto, client, LENT, None, probe, read_stash=True)[0][0] == values.sum()
    # the client shrinks the object the kept array lies in: a lent view reads zero pages
    with open(path, "r+b") as f:
        f.truncate(0)
    # lent: a view of the client's object, zero pages now; the twin's copy is the worker's own, kept
    assert _infer(proto, client, LENT, None, probe, read_stash=True)[0][0] == (0.0 if IN_PLACE else values.sum())
    assert children(server.proc.pid) == workers, "the worker died reading a kept input"
    assert_serving(server, workers=workers)


def test_only_a_yes_parameter_lends():
    from triton_shm.backends.python.backend import IN_PLACE_PARAMETER, _flag
    for value, expected in (("yes", True), ("TRUE", True), ("on", True), ("1", True), ("no", False),
                            ("", False), ("maybe", False)):
        config = {"parameters": {IN_PLACE_PARAMETER: {"string_value": value}}}
        assert _flag(config, IN_PLACE_PARAMETER) is expected, value
    assert _flag({}, IN_PLACE_PARAMETER) is False


# --------------------------------------------------------------------------- the mapping, in process

needs_extension = pytest.mark.skipif(not USING_EXTENSION, reason="the pure-Python twin never maps a client region")


@pytest.fixture
def shm_file(tmp_path):
    path = os.path.join(SHM_DIR, f"tshm_{os.getpid()}_mapping_unit")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 16)
    os.pwrite(fd, np.arange(1 << 14, dtype=np.float32).tobytes(), 0)
    yield fd
    os.close(fd)
    os.unlink(path)


@needs_extension
def test_mapping_turns_a_truncation_into_zero_pages(shm_file):
    from triton_shm.worker._assembler import SharedMapping
    mapping = SharedMapping(shm_file, 1 << 16, 0)
    assert mapping.watched and not mapping.poisoned and len(mapping) == 1 << 16
    view = np.ndarray((1 << 14,), np.float32, memoryview(mapping).toreadonly())
    assert not view.flags.writeable and view[5] == 5.0
    del mapping  # the view keeps it mapped
    os.ftruncate(shm_file, 0)
    assert view.sum() == 0.0  # a SIGBUS, turned into zero pages
    assert view.base.poisoned  # numpy holds the mapping itself as the base


@needs_extension
def test_mapping_slots_are_freed_with_their_mappings(shm_file):
    from triton_shm.worker._assembler import SharedMapping
    for _ in range(3000):  # more than the watch table holds at once
        assert SharedMapping(shm_file, 4096, 0).watched
    held = []
    while (m := SharedMapping(shm_file, 4096, 0)).watched:
        held.append(m)
        assert len(held) <= 4096, "the watch table never fills"
    assert not m.poisoned  # an unwatched mapping still maps (it serves guarded copies only)
    del held
    assert SharedMapping(shm_file, 4096, 0).watched
