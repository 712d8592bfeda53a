"""Model control: the modes none / poll / explicit, the load / unload API over HTTP and
gRPC (config and ``file:`` overrides included), reloads and unloads with requests in
flight, concurrent load / unload / infer, versions, start-up failures
(--strict-readiness, --exit-on-error, several repositories) and SIGTERM.

Every test talks to a real server process. Tests that share a module-scoped server
write their own uniquely named model folders into its repository, so they do not
depend on each other's order."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import onnx_add_sub, write_model
from .helpers import connect, expect_error

PROTOS = ["http", "grpc"]
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"

# One Python model serves every purpose here: it answers the constant VALUE, sleeps
# SECONDS first (slow requests) and can sleep or raise in initialize.
CONST_PY = """\
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = {value!r}


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({init_sleep!r})
        {init_extra}

    def execute(self, requests):
        responses = []
        for request in requests:
            secs = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy().reshape(-1)[0])
            print(f"MC-START id={{request.request_id()}}", flush=True)
            if secs > 0:
                time.sleep(secs)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([VALUE], dtype=np.float32))]))
        return responses
"""


def const_config_dict(name: str | None = None, max_batch_size: int = 0, **extra) -> dict:
    cfg = {"backend": "python", "max_batch_size": max_batch_size,
           "input": [{"name": "SECONDS", "data_type": "TYPE_FP32", "dims": [1]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}
    if name:
        cfg["name"] = name
    cfg.update(extra)
    return cfg


def const_config(name: str, extra: str = "") -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + extra)


def const_py(value: float, init_sleep: float = 0.0, init_extra: str = "pass") -> str:
    return CONST_PY.format(value=float(value), init_sleep=float(init_sleep), init_extra=init_extra)


def make_const(repo: Path, name: str, value: float = 1.0, *, versions=(1,), init_sleep: float = 0.0,
               init_extra: str = "pass", extra_config: str = "") -> Path:
    """A constant model; with several versions, version N answers N."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(const_config(name, extra_config))
    for v in versions:
        (model_dir / str(v)).mkdir(exist_ok=True)
        val = value if len(versions) == 1 else float(v)
        (model_dir / str(v) / "model.py").write_text(const_py(val, init_sleep, init_extra))
    return model_dir


def set_value(model_dir: Path, value: float, version: int = 1) -> None:
    """Rewrite model.py atomically so that it answers ``value``."""
    target = model_dir / str(version) / "model.py"
    tmp = model_dir.parent.parent / f".tmp_{uuid.uuid4().hex}"
    tmp.write_text(const_py(value))
    os.replace(tmp, target)


ADD_SUB_CONFIG = {
    "platform": "onnxruntime_onnx", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]}

ADD_SUB_PBTXT = ('name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
                 ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
                 ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')


# --------------------------------------------------------------------------- helpers

def http_call(srv: ServerProcess, method: str, path: str, body=None, timeout: float = 60.0):
    """Raw HTTP: (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read().decode(errors="replace")
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw
    finally:
        conn.close()


def ready_status(srv: ServerProcess) -> int:
    return http_call(srv, "GET", "/v2/health/ready", timeout=5)[0]


def index(srv: ServerProcess) -> list[dict]:
    status, rows = http_call(srv, "POST", "/v2/repository/index", {})
    assert status == 200, rows
    return rows


def rows_of(srv: ServerProcess, name: str) -> list[dict]:
    return [r for r in index(srv) if r["name"] == name]


def states(srv: ServerProcess, name: str) -> dict[str, str]:
    """version → state for ``name`` (empty when listed by name only or absent)."""
    return {r["version"]: r["state"] for r in rows_of(srv, name) if "state" in r}


def grpc_index(srv: ServerProcess) -> list[dict]:
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        return c.get_model_repository_index(as_json=True).get("models", [])


def infer_with(c, proto: str, name: str, seconds: float = 0.0, version: str = "", request_id: str = "",
               timeout: float = 60.0) -> float:
    mod = httpclient if proto == "http" else grpcclient
    inp = mod.InferInput("SECONDS", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    kwargs = {} if proto == "http" else {"client_timeout": timeout}
    result = c.infer(name, [inp], model_version=version, request_id=request_id, **kwargs)
    return float(result.as_numpy("OUTPUT0")[0])


def infer(srv: ServerProcess, proto: str, name: str, **kw) -> float:
    c = connect(srv, proto)
    try:
        return infer_with(c, proto, name, **kw)
    finally:
        c.close()


def load(srv: ServerProcess, proto: str, name: str, config=None, files=None) -> None:
    if isinstance(config, dict):
        config = json.dumps(config)
    c = connect(srv, proto, timeout=120)
    try:
        if proto == "http":
            c.load_model(name, config=config, files=files)
        else:
            c.load_model(name, config=config, files=files, client_timeout=120)
    finally:
        c.close()


def unload(srv: ServerProcess, proto: str, name: str) -> None:
    c = connect(srv, proto, timeout=120)
    try:
        if proto == "http":
            c.unload_model(name)
        else:
            c.unload_model(name, client_timeout=120)
    finally:
        c.close()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Background:
    """Run ``fn`` on a thread; ``result()`` returns its value or re-raises its error."""

    def __init__(self, fn, *args, **kwargs):
        self._value = self._error = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            self._error = e
        self.finished_at = time.monotonic()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 60.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call did not finish"
        if self._error is not None:
            raise self._error
        return self._value


def started(srv: ServerProcess, request_id: str) -> bool:
    return f"MC-START id={request_id}" in srv.log()


def tree(path: Path) -> set[str]:
    """Every path under ``path``, but top-level dot files (a library in the workers drops a
    '.ses' session file into TMPDIR; that is not the server's doing)."""
    if not path.exists():
        return set()
    return {str(p.relative_to(path)) for p in path.rglob("*") if not p.relative_to(path).parts[0].startswith(".")}


def override_dirs(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.glob("triton_shm_model_*"))


def stop_ok(srv: ServerProcess) -> None:
    srv.stop_cleanly()


# --------------------------------------------------------------------------- explicit mode server

@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    """Explicit mode, only ``const_a`` loaded at start; TMPDIR private so that override
    directories can be inspected."""
    root = tmp_path_factory.mktemp("explicit")
    repo = root / "models"
    tmpdir = root / "tmp"
    tmpdir.mkdir()
    make_const(repo, "const_a", 1.0)
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(ADD_SUB_PBTXT)
    write_model(repo, "bad_pbtxt", config="name: \"bad_pbtxt\"\nbackend: \"python\"\ninput [ { name: ",
                model_py=const_py(1.0))
    (repo / "corrupt_onnx" / "1").mkdir(parents=True)
    (repo / "corrupt_onnx" / "config.pbtxt").write_text(ADD_SUB_PBTXT.replace('"add_sub"', '"corrupt_onnx"'))
    (repo / "corrupt_onnx" / "1" / "model.onnx").write_bytes(b"\x08\x07this is not an onnx model" * 10)
    make_const(repo, "init_raises", init_extra="raise RuntimeError('kaboom-init')")
    make_const(repo, "versions_m", versions=(1, 2, 3))
    (repo / "versions_m" / "abc").mkdir()
    srv = ServerProcess(repo, root / "server.log", env={"TMPDIR": str(tmpdir)},
                        extra_args=["--model-control-mode", "explicit", "--load-model", "const_a"]).start()
    srv.repo, srv.tmpdir = repo, tmpdir
    yield srv
    stop_ok(srv)
    assert override_dirs(tmpdir) == [], "override directories left behind after shutdown"


def test_explicit_start_loads_only_load_model(explicit):
    rows = {r["name"]: r for r in index(explicit)}
    assert rows["const_a"] == {"name": "const_a", "version": "1", "state": "READY"}
    for name in ("add_sub", "bad_pbtxt", "corrupt_onnx", "init_raises", "versions_m"):
        assert rows[name] == {"name": name}, f"never-loaded model must be listed by name only: {rows[name]}"
    grows = {r["name"]: r for r in grpc_index(explicit)}
    assert grows["add_sub"] == {"name": "add_sub"}
    assert grows["const_a"]["state"] == "READY"
    assert infer(explicit, "http", "const_a") == 1.0
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        assert not c.is_model_ready("add_sub")
    assert ready_status(explicit) == 200  # models never asked to load do not count


@pytest.mark.parametrize("proto", PROTOS)
def test_load_infer_unload_reload(explicit, proto):
    name = f"lc_{proto}"
    model_dir = make_const(explicit.repo, name, 1.0)
    assert rows_of(explicit, name) == [{"name": name}]  # in the repository, never loaded: no state
    load(explicit, proto, name)
    assert states(explicit, name) == {"1": "READY"}
    assert infer(explicit, proto, name) == 1.0

    unload(explicit, proto, name)
    assert rows_of(explicit, name) == [{"name": name, "version": "1", "state": "UNAVAILABLE",
                                        "reason": "unloaded"}]
    err = expect_error(proto, lambda: infer(explicit, proto, name), "NOT_FOUND")
    assert name in err.message()
    # unloading again (and unloading an unknown model) succeeds, as in Triton
    unload(explicit, proto, name)
    unload(explicit, proto, f"never_existed_{proto}")

    set_value(model_dir, 2.0)
    load(explicit, proto, name)
    assert infer(explicit, proto, name) == 2.0
    # a load of a READY model reloads it from disk
    set_value(model_dir, 3.0)
    load(explicit, proto, name)
    assert infer(explicit, proto, name) == 3.0
    assert states(explicit, name) == {"1": "READY"}
    unload(explicit, proto, name)
    assert infer(explicit, "http", "const_a") == 1.0


FAILURES = {
    # model → (text the caller's error must contain, text the index reason must contain)
    "corrupt_onnx": ("corrupt_onnx", ""),
    "init_raises": ("kaboom-init", "kaboom-init"),
}


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("model", sorted(FAILURES))
def test_failed_load_is_reported(explicit, proto, model):
    in_error, in_reason = FAILURES[model]
    err = expect_error(proto, lambda: load(explicit, proto, model), "INVALID_ARGUMENT")
    assert in_error in err.message() and model in err.message(), err.message()
    rows = rows_of(explicit, model)
    assert rows and all(r["state"] == "UNAVAILABLE" for r in rows), rows
    assert all(r.get("reason") for r in rows), f"no reason in the index: {rows}"
    assert any(in_reason in r["reason"] for r in rows), rows
    # other models are unaffected
    assert states(explicit, "const_a") == {"1": "READY"}
    assert infer(explicit, proto, "const_a") == 1.0


def poll_failed(srv: ServerProcess, proto: str, name: str, fn, detail: str) -> None:
    """``fn`` (a load of ``name``) fails the repository poll, as in Triton: INTERNAL and only
    "failed to poll" to the caller, the reason in the log."""
    err = expect_error(proto, fn, "INTERNAL")
    assert err.message() == f"failed to load '{name}', failed to poll from model repository", err.message()
    assert f"Poll failed for model directory '{name}': " in srv.log()
    assert detail in srv.log().split(f"Poll failed for model directory '{name}': ")[-1].splitlines()[0]


@pytest.mark.parametrize("proto", PROTOS)
def test_load_of_nonexistent_model(explicit, proto):
    name = f"no_such_model_{proto}"
    poll_failed(explicit, proto, name, lambda: load(explicit, proto, name), f"no model directory '{name}'")
    assert rows_of(explicit, name) == []  # not listed: there is no such directory
    assert infer(explicit, proto, "const_a") == 1.0


@pytest.mark.parametrize("proto", PROTOS)
def test_unreadable_config_fails_the_poll(explicit, proto):
    """A config.pbtxt that cannot be parsed fails the poll: the model stays listed by name
    only, as Triton lists it, and the others serve."""
    poll_failed(explicit, proto, "bad_pbtxt", lambda: load(explicit, proto, "bad_pbtxt"), "config.pbtxt")
    assert rows_of(explicit, "bad_pbtxt") == [{"name": "bad_pbtxt"}]
    assert {r["name"]: r for r in grpc_index(explicit)}["bad_pbtxt"] == {"name": "bad_pbtxt"}
    assert infer(explicit, proto, "const_a") == 1.0


@pytest.mark.parametrize("proto", PROTOS)
def test_config_override_max_batch_size(explicit, proto):
    name = f"ovr_{proto}"
    make_const(explicit.repo, name, 4.0)
    load(explicit, proto, name, config=const_config_dict(max_batch_size=4))
    _, cfg = http_call(explicit, "GET", f"/v2/models/{name}/config")
    assert cfg["max_batch_size"] == 4, cfg
    _, meta = http_call(explicit, "GET", f"/v2/models/{name}")
    assert meta["inputs"][0]["shape"] == [-1, 1], meta
    with grpcclient.InferenceServerClient(explicit.grpc_url) as c:
        assert c.get_model_config(name).config.max_batch_size == 4
    # a load without the override goes back to config.pbtxt
    load(explicit, proto, name)
    _, cfg = http_call(explicit, "GET", f"/v2/models/{name}/config")
    assert cfg["max_batch_size"] == 0, cfg
    assert infer(explicit, proto, name) == 4.0
    unload(explicit, proto, name)


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("case", ["other_name", "backend_change", "platform_change", "not_json", "not_object"])
def test_config_override_rejected(explicit, proto, case):
    name = f"rej_{case}_{proto}"
    if case == "platform_change":
        onnx_add_sub(explicit.repo / name / "1" / "model.onnx")
        (explicit.repo / name / "config.pbtxt").write_text(ADD_SUB_PBTXT.replace('"add_sub"', f'"{name}"'))
        good, bad = None, json.dumps({**ADD_SUB_CONFIG, "platform": "tensorrt_plan"})
    else:
        make_const(explicit.repo, name, 7.0)
        good = None
        bad = {"other_name": json.dumps(const_config_dict(name="const_a")),
               "backend_change": json.dumps(const_config_dict(backend="onnxruntime")),
               "not_json": "{nope",
               "not_object": "[1, 2]"}[case]
    load(explicit, proto, name, config=good)
    before = states(explicit, name)
    assert before == {"1": "READY"}
    if case in ("backend_change", "platform_change"):  # a valid config the model cannot take: its load fails
        err = expect_error(proto, lambda: load(explicit, proto, name, config=bad), "INVALID_ARGUMENT")
        assert name in err.message(), err.message()
    else:  # not a config of this model at all: the poll fails, as in Triton
        poll_failed(explicit, proto, name, lambda: load(explicit, proto, name, config=bad), "config")
    # a rejected reload leaves the loaded model serving
    assert states(explicit, name) == before
    if case != "platform_change":
        assert infer(explicit, proto, name) == 7.0
    # and never touches the model it named
    assert states(explicit, "const_a") == {"1": "READY"}
    unload(explicit, proto, name)


@pytest.mark.parametrize("proto", PROTOS)
def test_backend_change_rejected_on_first_load(explicit, proto):
    name = f"pyback_{proto}"
    make_const(explicit.repo, name, 1.0)
    err = expect_error(proto, lambda: load(explicit, proto, name, config=const_config_dict(backend="onnxruntime")),
                       "INVALID_ARGUMENT")
    assert "backend" in err.message(), err.message()
    assert "READY" not in states(explicit, name).values()


@pytest.mark.parametrize("proto", PROTOS)
def test_file_override_loads_onnx_from_bytes(explicit, proto, tmp_path):
    name = f"bytes_onnx_{proto}"
    onnx_add_sub(tmp_path / "model.onnx")
    repo_before = tree(explicit.repo)
    load(explicit, proto, name, config=ADD_SUB_CONFIG,
         files={"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes()})
    assert states(explicit, name) == {"1": "READY"}
    assert tree(explicit.repo) == repo_before, "a file override wrote into the model repository"
    dirs = [d for d in override_dirs(explicit.tmpdir) if (d / name).is_dir()]
    assert len(dirs) == 1, override_dirs(explicit.tmpdir)
    assert (dirs[0] / name / "1" / "model.onnx").read_bytes() == (tmp_path / "model.onnx").read_bytes()

    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    mod = httpclient if proto == "http" else grpcclient
    inputs = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    c = connect(explicit, proto)
    try:
        result = c.infer(name, inputs)
    finally:
        c.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    _, cfg = http_call(explicit, "GET", f"/v2/models/{name}/config")
    assert cfg["max_batch_size"] == 8

    # a second override load replaces the temporary directory: only one is kept
    load(explicit, proto, name, config=ADD_SUB_CONFIG,
         files={"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes()})
    assert len([d for d in override_dirs(explicit.tmpdir) if (d / name).exists()]) == 1
    unload(explicit, proto, name)
    assert rows_of(explicit, name)[0]["state"] == "UNAVAILABLE"


def test_file_override_temp_dir_removed_on_unload(explicit, tmp_path):
    name = "bytes_onnx_cleanup"
    onnx_add_sub(tmp_path / "model.onnx")
    load(explicit, "http", name, config=ADD_SUB_CONFIG,
         files={"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes()})
    assert [d for d in override_dirs(explicit.tmpdir) if (d / name).exists()]
    unload(explicit, "http", name)
    assert not [d for d in override_dirs(explicit.tmpdir) if (d / name).exists()], override_dirs(explicit.tmpdir)


def test_failed_file_override_load_leaves_no_temp_dir(explicit):
    name = "bytes_corrupt"
    before = tree(explicit.tmpdir)
    err = expect_error("http", lambda: load(explicit, "http", name, config=ADD_SUB_CONFIG,
                                                     files={"file:1/model.onnx": b"\x08\x07not an onnx model" * 8}),
                       "INVALID_ARGUMENT")
    assert name in err.message()
    assert rows_of(explicit, name)[0]["state"] == "UNAVAILABLE"
    assert tree(explicit.tmpdir) == before, override_dirs(explicit.tmpdir)


# Override names that can not be laid out under the model's private directory: the
# client's error (400 / INVALID_ARGUMENT, never a 500), nothing written anywhere. Triton
# 2.51 answers these 500 "failed to poll" (its poll wraps the INVALID_ARG of the layout);
# the log keeps its "Poll failed" line.
BAD_PATHS = [("file:../{canary}", "must stay within model directory"),
             ("file:1/../../{canary}", "must stay within model directory"),
             ("file:1/../../../{canary}", "must stay within model directory"),
             ("file:..", "must stay within model directory"),
             ("file:", "names the model directory itself"), ("file:.", "names the model directory itself"),
             ("file:1/\x00x", "NUL")]


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("pattern,why", BAD_PATHS, ids=lambda p: re.sub(r"\W", "_", p))
def test_file_override_bad_paths_rejected(explicit, proto, pattern, why):
    canary = f"mc_canary_{uuid.uuid4().hex}"
    name = f"badpath_{proto}"
    repo_before, tmp_before = tree(explicit.repo), tree(explicit.tmpdir)
    files = {pattern.format(canary=canary): b"payload", "file:1/model.py": const_py(1.0).encode()}
    err = expect_error(proto, lambda: load(explicit, proto, name, config=const_config_dict(), files=files),
                       "INVALID_ARGUMENT", f"failed to load '{name}'", why)
    assert "/tmp" not in err.message() and str(explicit.tmpdir) not in err.message(), err.message()
    assert f"Poll failed for model directory '{name}'" in explicit.log()
    assert "READY" not in states(explicit, name).values()
    assert tree(explicit.repo) == repo_before
    assert tree(explicit.tmpdir) == tmp_before, "a rejected override left files in the temp dir"
    for where in (Path("/tmp"), explicit.tmpdir, explicit.tmpdir.parent, explicit.repo, explicit.repo.parent):
        assert not (where / canary).exists(), f"file written outside the override dir: {where / canary}"


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("order", ["folder_first", "file_first"])
def test_file_override_that_is_a_file_and_a_folder_rejected(explicit, proto, order):
    """``file:1`` beside ``file:1/model.py``, in either order: 400 naming both, nothing left."""
    name = f"fileanddir_{proto}"
    tmp_before = tree(explicit.tmpdir)
    items = [("file:1/model.py", const_py(1.0).encode()), ("file:1", b"x")]
    files = dict(items if order == "folder_first" else items[::-1])
    expect_error(proto, lambda: load(explicit, proto, name, config=const_config_dict(), files=files),
                 "INVALID_ARGUMENT", "Invalid file parameter 'file:1/model.py', directory has been created as a file")
    assert tree(explicit.tmpdir) == tmp_before
    assert "READY" not in states(explicit, name).values()


@pytest.mark.parametrize("proto", PROTOS)
def test_file_override_absolute_and_odd_names_laid_out_inside(explicit, proto):
    """As in Triton, an absolute override name is laid out under the model's private
    directory (``file:/tmp/x`` is ``<dir>/tmp/x``), ``a/../b/x`` is ``b/x``, and a backslash
    is an ordinary character of a file name: the model loads, nothing lands outside."""
    canary = f"mc_canary_{uuid.uuid4().hex}"
    name = f"abspath_{proto}"
    files = {f"file:/tmp/{canary}": b"absolute", "file:/1/model.py": const_py(4.0).encode(),
             f"file:a/../b/{canary}": b"dotted", f"file:1/..\\..\\{canary}": b"backslash"}
    load(explicit, proto, name, config=const_config_dict(), files=files)
    try:
        assert states(explicit, name) == {"1": "READY"}
        assert infer(explicit, proto, name) == 4.0
        dirs = [d / name for d in override_dirs(explicit.tmpdir) if (d / name).is_dir()]
        assert len(dirs) == 1, override_dirs(explicit.tmpdir)
        assert (dirs[0] / "tmp" / canary).read_bytes() == b"absolute"
        assert (dirs[0] / "b" / canary).read_bytes() == b"dotted"
        assert (dirs[0] / "1" / f"..\\..\\{canary}").read_bytes() == b"backslash"
        assert not (dirs[0] / "a").exists()
        for where in (Path("/tmp"), explicit.tmpdir, explicit.tmpdir.parent, explicit.repo, explicit.repo.parent):
            assert not (where / canary).exists(), f"file written outside the override dir: {where / canary}"
    finally:
        unload(explicit, proto, name)


@pytest.mark.parametrize("proto", PROTOS)
def test_file_override_without_config_rejected(explicit, proto):
    name = f"noconf_{proto}"
    tmp_before = tree(explicit.tmpdir)
    files = {"file:1/model.py": const_py(1.0).encode()}
    expect_error(proto, lambda: load(explicit, proto, name, files=files), "INVALID_ARGUMENT",
                 "Load parameter 'config' must be specified for model file override")
    assert tree(explicit.tmpdir) == tmp_before
    assert rows_of(explicit, name) == []


def test_versions_policies(explicit):
    name = "versions_m"
    base = const_config_dict()
    load(explicit, "http", name)  # default: latest 1
    assert states(explicit, name) == {"3": "READY"}
    assert infer(explicit, "grpc", name) == 3.0
    expect_error("grpc", lambda: infer(explicit, "grpc", name, version="1"), "NOT_FOUND")
    assert re.search(r"ignoring 'abc' in model 'versions_m'", explicit.log()), "no warning for folder 'abc'"

    load(explicit, "grpc", name, config={**base, "version_policy": {"all": {}}})
    assert states(explicit, name) == {"1": "READY", "2": "READY", "3": "READY"}
    for v in ("1", "2", "3"):
        assert infer(explicit, "http", name, version=v) == float(v)
        assert infer(explicit, "grpc", name, version=v) == float(v)
    assert infer(explicit, "http", name) == 3.0  # no version: the newest

    load(explicit, "http", name, config={**base, "version_policy": {"specific": {"versions": [1, 3]}}})
    st = states(explicit, name)
    assert st.get("1") == "READY" and st.get("3") == "READY" and st.get("2") != "READY", st
    assert infer(explicit, "grpc", name, version="1") == 1.0
    expect_error("http", lambda: infer(explicit, "http", name, version="2"), "NOT_FOUND")
    _, meta = http_call(explicit, "GET", f"/v2/models/{name}")
    assert meta["versions"] == ["1", "3"], meta

    load(explicit, "grpc", name, config={**base, "version_policy": {"latest": {"num_versions": 2}}})
    st = states(explicit, name)
    assert st.get("2") == "READY" and st.get("3") == "READY" and st.get("1") != "READY", st
    expect_error("grpc", lambda: infer(explicit, "grpc", name, version="1"), "NOT_FOUND")
    assert infer(explicit, "http", name, version="2") == 2.0

    # a policy that selects nothing is a clear error; the loaded versions keep serving
    err = expect_error(
        "http",
        lambda: load(explicit, "http", name, config={**base, "version_policy": {"specific": {"versions": [9]}}}),
        "INVALID_ARGUMENT",
    )
    assert "version" in err.message()
    assert infer(explicit, "http", name, version="3") == 3.0
    unload(explicit, "http", name)
    assert "READY" not in states(explicit, name).values()


TRAVERSAL = ["..", "../const_a", "a/b", "const_a/..", "x/../const_a", "..\\const_a", "const_a/../../etc"]


@pytest.mark.parametrize("name", TRAVERSAL)
def test_traversal_names_in_load_unload(explicit, name):
    before = [r for r in index(explicit)]
    quoted = urllib.parse.quote(name, safe="")
    for action in ("load", "unload"):
        # a load in Triton's words; an unload never names the traversal (as Triton)
        message = f"invalid model name '{name}'" + \
            (", model name must not contain path traversal characters" if action == "load" else "")
        status, body = http_call(explicit, "POST", f"/v2/repository/models/{quoted}/{action}", {})
        assert (status, body) == (400, {"error": message}), action
        expect_error("grpc", lambda action=action: (load if action == "load" else unload)(explicit, "grpc", name),
                     "INVALID_ARGUMENT", message)
    assert index(explicit) == before
    assert states(explicit, "const_a") == {"1": "READY"}
    assert infer(explicit, "http", "const_a") == 1.0


# Triton's own lists (qa/L0_input_validation, its model name validation of loads)
TRITON_TRAVERSAL = ["../etc", "a/../b", "../../etc/passwd", "../../../../etc", "model/..", "..", "/etc/passwd",
                    "model/subdir", "model/", " ..", ".. "]
TRITON_BLANK = ["", " ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "]
TRITON_VALID = ["model123", "model.version1", "...", "..my_model", "model..1", "model....1"]


def test_load_names_as_triton_validates_them(explicit):
    """A load's name is refused in Triton's words (INVALID_ARGUMENT); a name that only looks
    odd is looked for, and not found; an unload never names the traversal."""
    with grpcclient.InferenceServerClient(explicit.grpc_url) as c:
        for name in TRITON_TRAVERSAL:
            with pytest.raises(InferenceServerException) as e:
                c.load_model(name)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", name
            assert e.value.message() == f"invalid model name '{name}', model name must not contain path " \
                                         "traversal characters", name
            try:
                c.unload_model(name)
            except InferenceServerException as e:
                assert "path traversal characters" not in e.message(), name
        for name in TRITON_BLANK:
            with pytest.raises(InferenceServerException) as e:
                c.load_model(name)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", repr(name)
            assert e.value.message() == "Model name cannot be empty. Please enter a valid name to deploy.", repr(name)
        for name in TRITON_VALID:
            with pytest.raises(InferenceServerException) as e:
                c.load_model(name)
            assert "path traversal characters" not in e.value.message(), name
            assert "failed to poll from model repository" in e.value.message(), (name, e.value.message())
    status, body = http_call(explicit, "POST", "/v2/repository/models/%20../load", {})
    assert (status, body) == (400, {"error": "invalid model name ' ..', model name must not contain path traversal "
                                             "characters"})
    assert states(explicit, "const_a") == {"1": "READY"}


def test_slow_load_does_not_block_other_models(explicit):
    make_const(explicit.repo, "slow_init", 9.0, init_sleep=3.0)
    bg = Background(load, explicit, "http", "slow_init")
    wait_for(lambda: states(explicit, "slow_init") == {"1": "LOADING"}, 5, "slow_init to show LOADING")
    hc = httpclient.InferenceServerClient(explicit.http_url)
    gc = grpcclient.InferenceServerClient(explicit.grpc_url)
    try:
        for _ in range(3):
            checks = {
                "http infer": lambda: infer_with(hc, "http", "const_a") == 1.0,
                "grpc infer": lambda: infer_with(gc, "grpc", "const_a") == 1.0,
                "live": lambda: hc.is_server_live(),
                "http metadata": lambda: hc.get_model_metadata("const_a")["name"] == "const_a",
                "grpc metadata": lambda: gc.get_model_metadata("const_a").name == "const_a",
                "grpc model ready": lambda: gc.is_model_ready("const_a"),
                "index": lambda: bool(index(explicit)),
            }
            for what, check in checks.items():
                assert check(), what
            # every call above was answered while the load still ran: none waited for it
            assert not bg.done(), "the slow load finished too early for this test to mean anything"
            time.sleep(0.2)
    finally:
        hc.close()
        gc.close()
    bg.result(timeout=30)
    assert states(explicit, "slow_init") == {"1": "READY"}
    assert infer(explicit, "grpc", "slow_init") == 9.0
    unload(explicit, "http", "slow_init")


@pytest.mark.parametrize("proto", PROTOS)
def test_unload_waits_for_in_flight_request(explicit, proto):
    name = f"inflight_{proto}"
    make_const(explicit.repo, name, 5.0)
    load(explicit, proto, name)
    rid = f"slow-{uuid.uuid4().hex[:8]}"
    req = Background(infer, explicit, proto, name, seconds=2.0, request_id=rid)
    wait_for(lambda: started(explicit, rid), 10, "the slow request to reach the model")
    t0 = time.monotonic()
    unloading = Background(unload, explicit, proto, name)
    # requests arriving while it drains are refused at once, not queued
    time.sleep(0.3)
    expect_error(proto, lambda: infer(explicit, proto, name), "NOT_FOUND",  # as Triton 2.51 answers
                 f"Request for unknown model: '{name}' has no available versions")
    assert not req.done(), "refused while the in-flight request still runs: not queued behind it"
    assert req.result(timeout=30) == 5.0, "the in-flight request failed because of the unload"
    unloading.result(timeout=30)
    assert unloading.finished_at >= req.finished_at - 0.05, "unload returned before the in-flight request"
    assert unloading.finished_at - t0 > 1.0
    assert rows_of(explicit, name) == [{"name": name, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]


@pytest.mark.parametrize("proto", PROTOS)
def test_reload_under_load_loses_no_request(explicit, proto):
    name = f"reload_{proto}"
    model_dir = make_const(explicit.repo, name, 1.0)
    load(explicit, proto, name)
    stop = threading.Event()
    results: list[list] = [[], []]

    def hammer(out: list):
        c = connect(explicit, proto)
        try:
            while not stop.is_set():
                try:
                    out.append(infer_with(c, proto, name, seconds=0.01))
                except InferenceServerException as e:
                    out.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=hammer, args=(r,), daemon=True) for r in results]
    for t in threads:
        t.start()
    time.sleep(0.7)
    set_value(model_dir, 2.0)
    load(explicit, proto, name)
    time.sleep(0.5)
    set_value(model_dir, 3.0)
    load(explicit, "grpc" if proto == "http" else "http", name)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    for out in results:
        failures = [r for r in out if isinstance(r, Exception)]
        assert not failures, f"{len(failures)} of {len(out)} requests failed during reload: {failures[:3]}"
        assert out[0] == 1.0 and out[-1] == 3.0, (out[0], out[-1])
        assert out == sorted(out), "an old version answered after the new one had answered"
        assert set(out) <= {1.0, 2.0, 3.0}
    assert sum(len(o) for o in results) > 20
    assert states(explicit, name) == {"1": "READY"}
    unload(explicit, proto, name)


def test_concurrent_load_unload_infer(explicit):
    name = "churn"
    make_const(explicit.repo, name, 5.0)
    load(explicit, "http", name)
    stop = threading.Event()
    calls: dict[str, list] = {"load": [], "unload": [], "infer": []}
    lock = threading.Lock()

    def record(kind, value):
        with lock:
            calls[kind].append(value)

    def loader(proto):
        while not stop.is_set():
            try:
                load(explicit, proto, name)
                record("load", "ok")
            except InferenceServerException as e:
                record("load", e)
            time.sleep(0.05)

    def unloader(proto):
        while not stop.is_set():
            try:
                unload(explicit, proto, name)
                record("unload", "ok")
            except InferenceServerException as e:
                record("unload", e)
            time.sleep(0.1)

    def inferer(proto):
        c = connect(explicit, proto, timeout=30)
        try:
            while not stop.is_set():
                try:
                    record("infer", infer_with(c, proto, name, timeout=30))
                except InferenceServerException as e:
                    record("infer", e)
        finally:
            c.close()

    threads = [threading.Thread(target=fn, args=(p,), daemon=True)
               for fn, protos in ((loader, PROTOS + ["http"]), (unloader, PROTOS), (inferer, PROTOS * 2))
               for p in protos]
    for t in threads:
        t.start()
    time.sleep(4.0)
    # a Python model's load starts its instance's process: on a busy machine 4 s may not
    # see five of each, so the churn goes on until it has (or a deadline says it hangs)
    deadline = time.monotonic() + 60
    while (len(calls["load"]) < 5 or len(calls["unload"]) < 5) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.1))
    assert not any(t.is_alive() for t in threads), "a load/unload/infer call never returned (deadlock?)"

    load_errors = [e for e in calls["load"] if e != "ok"]
    unload_errors = [e for e in calls["unload"] if e != "ok"]
    assert not load_errors, f"loads failed: {[str(e) for e in load_errors[:3]]}"
    assert not unload_errors, f"unloads failed: {[str(e) for e in unload_errors[:3]]}"
    assert len(calls["load"]) >= 5 and len(calls["unload"]) >= 5, {k: len(v) for k, v in calls.items()}
    answers = [r for r in calls["infer"] if not isinstance(r, Exception)]
    assert answers and set(answers) == {5.0}, "a request was answered with a wrong result"
    for e in (r for r in calls["infer"] if isinstance(r, Exception)):
        # which of the two depends on where the unload was when the request arrived
        assert str(e.status()).replace("StatusCode.", "") in ("UNAVAILABLE", "NOT_FOUND", "503", "404"), e

    # the final state is consistent and the model still works
    load(explicit, "grpc", name)
    assert states(explicit, name) == {"1": "READY"}
    assert infer(explicit, "http", name) == 5.0
    unload(explicit, "http", name)
    assert states(explicit, name) == {"1": "UNAVAILABLE"}
    assert infer(explicit, "grpc", "const_a") == 1.0


# --------------------------------------------------------------------------- small explicit servers

def test_ready_after_explicit_unload(tmp_path):
    repo = tmp_path / "models"
    make_const(repo, "m1", 1.0)
    make_const(repo, "m2", 2.0)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "m1", "--load-model", "m2"])
    srv.start()
    try:
        assert ready_status(srv) == 200
        unload(srv, "http", "m2")
        assert states(srv, "m2") == {"1": "UNAVAILABLE"}
        assert infer(srv, "grpc", "m1") == 1.0
        assert ready_status(srv) == 200, "server not ready after a model was explicitly unloaded"
    finally:
        stop_ok(srv)


def test_override_temp_dirs_removed_at_shutdown(tmp_path):
    repo, tmpdir = tmp_path / "models", tmp_path / "tmp"
    repo.mkdir()
    tmpdir.mkdir()
    srv = ServerProcess(repo, tmp_path / "server.log", env={"TMPDIR": str(tmpdir)},
                        extra_args=["--model-control-mode", "explicit"]).start()
    try:
        load(srv, "grpc", "from_bytes", config=const_config_dict(),
             files={"file:1/model.py": const_py(6.0).encode()})
        assert infer(srv, "http", "from_bytes") == 6.0
        assert len(override_dirs(tmpdir)) == 1
        assert tree(repo) == set()
    finally:
        stop_ok(srv)
    assert override_dirs(tmpdir) == []


def test_load_model_star_and_several_repositories(tmp_path):
    repo_a, repo_b = tmp_path / "a", tmp_path / "b"
    make_const(repo_a, "ma", 1.0)
    make_const(repo_b, "mb", 2.0)
    srv = ServerProcess([repo_a, repo_b], tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "*"]).start()
    try:
        assert states(srv, "ma") == {"1": "READY"} and states(srv, "mb") == {"1": "READY"}
        assert infer(srv, "http", "ma") == 1.0 and infer(srv, "grpc", "mb") == 2.0
        # a model added to the second repository later can be loaded from there
        make_const(repo_b, "mb2", 3.0)
        load(srv, "http", "mb2")
        assert infer(srv, "grpc", "mb2") == 3.0
        # one name in both repositories: the poll fails, as in Triton; the log names both
        make_const(repo_a, "dup2", 1.0)
        make_const(repo_b, "dup2", 2.0)
        poll_failed(srv, "http", "dup2", lambda: load(srv, "http", "dup2"), "more than one model repository")
        assert str(repo_a) in srv.log() and str(repo_b) in srv.log()
    finally:
        stop_ok(srv)


# --------------------------------------------------------------------------- mode none

@pytest.fixture(scope="module")
def none_mode(tmp_path_factory):
    root = tmp_path_factory.mktemp("none_mode")
    make_const(root / "models", "m", 1.0)
    srv = ServerProcess(root / "models", root / "server.log").start()  # default mode: none
    yield srv
    stop_ok(srv)


@pytest.mark.parametrize("proto", PROTOS)
def test_mode_none_refuses_load_unload(none_mode, proto):
    assert states(none_mode, "m") == {"1": "READY"}
    for call, kwargs in ((load, {}), (load, {"config": const_config_dict()}), (unload, {}), (load, {"name": "zz"})):
        name = kwargs.pop("name", "m")
        expect_error(proto, lambda call=call, name=name, kwargs=kwargs: call(none_mode, proto, name, **kwargs),
                     "UNAVAILABLE", NOT_ALLOWED)
    status, body = http_call(none_mode, "POST", "/v2/repository/models/m/unload",
                             {"parameters": {"unload_dependents": True}})
    assert status == 503 and body == {"error": NOT_ALLOWED}, (status, body)
    assert states(none_mode, "m") == {"1": "READY"}
    assert infer(none_mode, proto, "m") == 1.0


# --------------------------------------------------------------------------- poll mode

@pytest.fixture(scope="module")
def poll_mode(tmp_path_factory):
    root = tmp_path_factory.mktemp("poll_mode")
    repo = root / "models"
    make_const(repo, "p_base", 1.0)
    srv = ServerProcess(repo, root / "server.log",
                        extra_args=["--model-control-mode", "poll", "--repository-poll-secs", "1"]).start()
    srv.repo, srv.staging = repo, root / "staging"
    srv.staging.mkdir()
    yield srv
    stop_ok(srv)


def _infer_or_none(srv, name):
    try:
        return infer(srv, "http", name)
    except InferenceServerException:
        return None


def test_poll_add_modify_remove(poll_mode):
    srv = poll_mode
    expect_error("grpc", lambda: load(srv, "grpc", "p_base"), "UNAVAILABLE", NOT_ALLOWED)
    expect_error("http", lambda: unload(srv, "http", "p_base"), "UNAVAILABLE", NOT_ALLOWED)

    staged = make_const(srv.staging, "p_new", 1.0)
    os.rename(staged, srv.repo / "p_new")  # appears at once, complete
    wait_for(lambda: states(srv, "p_new") == {"1": "READY"}, 10, "p_new to load")
    assert infer(srv, "grpc", "p_new") == 1.0

    set_value(srv.repo / "p_new", 2.0)
    wait_for(lambda: _infer_or_none(srv, "p_new") == 2.0, 10, "p_new to reload with the new value")

    shutil.rmtree(srv.repo / "p_new")
    wait_for(lambda: "READY" not in states(srv, "p_new").values(), 10, "p_new to unload")
    expect_error("http", lambda: infer(srv, "http", "p_new"), "NOT_FOUND")
    assert infer(srv, "grpc", "p_base") == 1.0


def test_poll_waits_until_files_stop_changing(poll_mode):
    """model.py is half-written (a syntax error) and a weights file keeps growing, each
    step sooner than the poll interval: a load attempted before the copy ends would fail
    (UNAVAILABLE in the index, an error in the log) or be READY too early."""
    srv = poll_mode
    name = "p_copying"
    model_dir = srv.repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(const_config(name))
    full = const_py(4.0)
    (model_dir / "1" / "model.py").write_text(full[: len(full) // 2])
    blob = model_dir / "1" / "weights.bin"
    seen: list[dict] = []
    t_end = time.monotonic() + 4.0
    chunk = os.urandom(256 * 1024)
    step = 0
    while time.monotonic() < t_end:
        with open(blob, "ab") as f:
            f.write(chunk)
        if step == 3:  # the second half of model.py arrives in the middle of the copy
            with open(model_dir / "1" / "model.py", "a") as f:
                f.write(full[len(full) // 2: len(full) * 3 // 4])
        step += 1
        for _ in range(4):
            seen.append(states(srv, name))
            time.sleep(0.1)
    with open(model_dir / "1" / "model.py", "a") as f:
        f.write(full[len(full) * 3 // 4:])
    copy_done = time.monotonic()
    assert all(s == {} for s in seen), f"the model was loaded while its files were still changing: {seen}"
    assert f"failed to load '{name}'" not in srv.log()
    wait_for(lambda: states(srv, name) == {"1": "READY"}, 10, "the copied model to load")
    assert time.monotonic() - copy_done >= 0.9, "loaded before its files had stayed unchanged for one interval"
    assert infer(srv, "grpc", name) == 4.0
    assert f"failed to load '{name}'" not in srv.log(), srv.log()[-3000:]


def test_poll_broken_model_retried_only_after_change(poll_mode):
    """As Triton: a model that failed to load is tried again once its files change,
    not on every poll."""
    srv = poll_mode
    name = "p_broken"
    staged = make_const(srv.staging, name, init_extra="raise RuntimeError('p_broken init')")
    os.rename(staged, srv.repo / name)
    wait_for(lambda: states(srv, name) == {"1": "UNAVAILABLE"}, 10, "p_broken to fail")
    assert "p_broken init" in rows_of(srv, name)[0]["reason"]
    assert infer(srv, "grpc", "p_base") == 1.0
    time.sleep(4.5)
    attempts = srv.log().count(f"failed to load '{name}' version 1")
    set_value(srv.repo / name, 3.0)
    wait_for(lambda: _infer_or_none(srv, name) == 3.0, 10, "the repaired model to load")
    assert attempts == 1, f"the unchanged broken model was loaded {attempts} times in 4.5 s"


# --------------------------------------------------------------------------- start-up failures

def _repo_with_broken(root: Path) -> Path:
    repo = root / "models"
    make_const(repo, "good", 1.0)
    make_const(repo, "broken_model", init_extra="raise RuntimeError('broken at start')")
    return repo


@pytest.mark.parametrize("strict", [True, False])
def test_strict_readiness_with_failed_model(tmp_path, strict):
    args = ["--exit-on-error=false"] + ([] if strict else ["--strict-readiness", "false"])
    srv = ServerProcess(_repo_with_broken(tmp_path), tmp_path / "server.log", extra_args=args)
    srv.start(wait_ready=False)
    try:
        wait_for(lambda: states(srv, "good") == {"1": "READY"}, 10, "good to load")
        assert states(srv, "broken_model") == {"1": "UNAVAILABLE"}
        assert "broken at start" in rows_of(srv, "broken_model")[0]["reason"]
        assert infer(srv, "http", "good") == 1.0 and infer(srv, "grpc", "good") == 1.0
        assert ready_status(srv) == (400 if strict else 200)
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            assert c.is_server_ready() is (not strict)
            assert c.is_server_live()
    finally:
        stop_ok(srv)


@pytest.mark.parametrize("mode", ["none", "explicit"])
def test_exit_on_error_default_exits_naming_the_model(tmp_path, mode):
    args = [] if mode == "none" else ["--model-control-mode", "explicit", "--load-model", "broken_model",
                                      "--load-model", "good"]
    srv = ServerProcess(_repo_with_broken(tmp_path), tmp_path / "server.log", extra_args=args)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="server exited"):
        srv.start(timeout=30, wait_ready=False)
    assert time.monotonic() - t0 < 20
    code = srv.stop()
    assert code != 0
    log = srv.log()
    assert "broken_model" in log and "broken at start" in log, log[-3000:]


def test_load_model_that_does_not_exist_fails_start(tmp_path):
    make_const(tmp_path / "models", "good", 1.0)
    srv = ServerProcess(tmp_path / "models", tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "missing_model",
                                    "--load-model", "good"])
    exited = False
    try:
        srv.start(timeout=30, wait_ready=False)
    except RuntimeError:
        exited = True
    code = srv.stop()
    assert exited, f"server started although --load-model names no model:\n{srv.log()[-2000:]}"
    assert code != 0
    assert "missing_model" in srv.log()


def test_same_model_in_two_repositories_refuses_to_start(tmp_path):
    a, b = tmp_path / "repo_a", tmp_path / "repo_b"
    make_const(a, "twice", 1.0)
    make_const(b, "twice", 2.0)
    make_const(b, "other", 2.0)
    srv = ServerProcess([a, b], tmp_path / "server.log", extra_args=["--exit-on-error=false"])
    with pytest.raises(RuntimeError, match="server exited"):
        srv.start(timeout=30, wait_ready=False)
    assert srv.stop() != 0
    log = srv.log()
    assert "twice" in log and str(a) in log and str(b) in log, log[-3000:]


# --------------------------------------------------------------------------- SIGTERM

def test_sigterm_readiness_false_first_in_flight_completes(tmp_path):
    make_const(tmp_path / "models", "slowm", 8.0)
    srv = ServerProcess(tmp_path / "models", tmp_path / "server.log").start()
    rid = "sigterm-slow"
    req = Background(infer, srv, "grpc", "slowm", seconds=2.0, request_id=rid)
    wait_for(lambda: started(srv, rid), 10, "the slow request to reach the model")
    polls: list[tuple[float, object]] = []
    stop_polling = threading.Event()

    def poll_ready():
        while not stop_polling.is_set():
            try:
                status = ready_status(srv)
            except Exception as e:  # noqa: BLE001 - refused / reset once the listener closes
                status = type(e).__name__
            polls.append((time.monotonic(), status))
            time.sleep(0.02)

    assert ready_status(srv) == 200
    t_sig = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    poller = threading.Thread(target=poll_ready, daemon=True)
    poller.start()
    assert req.result(timeout=30) == 8.0, "the in-flight request failed during shutdown"
    t_done = req.finished_at
    code = srv.proc.wait(30)
    stop_polling.set()
    poller.join(5)
    assert code == 0, srv.log()[-3000:]
    srv.stop()
    late_ready = [(round(t - t_sig, 3), s) for t, s in polls if s == 200 and t - t_sig > 0.2]
    assert not late_ready, f"still ready after SIGTERM: {late_ready[:5]}"
    assert any(s != 200 and t < t_done for t, s in polls), \
        f"readiness did not turn false before the in-flight request finished: {polls[:10]}"


def test_index_reads_the_repository_each_time(explicit):
    """As Triton 2.51: a model directory added after start is listed by name; removed
    before it was ever loaded, it is no longer listed."""
    name = "added_later"
    model_dir = make_const(explicit.repo, name, 1.0)
    assert rows_of(explicit, name) == [{"name": name}]
    shutil.rmtree(model_dir)
    assert rows_of(explicit, name) == []


# --------------------------------------------------------------------------- tritonclient's example

# The model of tritonclient's simple_{http,grpc}_model_control.py examples ("simple": max_batch_size 8,
# two INT32 [16] inputs, their sum and difference), as a Python model. With COMPLETE its
# auto_complete_config declares the tensors.
SIMPLE_PY = """\
import triton_python_backend_utils as pb_utils
COMPLETE = {complete}
TENSORS = [{{"name": n, "data_type": "TYPE_INT32", "dims": [16]}} for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]


class TritonPythonModel:
    if COMPLETE:
        @staticmethod
        def auto_complete_config(config):
            for t in TENSORS[:2]:
                config.add_input(t)
            for t in TENSORS[2:]:
                config.add_output(t)
            return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                         pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""


def make_simple(repo: Path, name: str, complete: bool) -> None:
    write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
                {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
                 {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
        """, model_py=SIMPLE_PY.format(complete=complete))


def infer_simple(srv: ServerProcess, proto: str, name: str) -> np.ndarray:
    mod = httpclient if proto == "http" else grpcclient
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    c = connect(srv, proto)
    try:
        return c.infer(name, inputs).as_numpy("OUTPUT0")
    finally:
        c.close()


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("complete", [False, True], ids=["no_auto_complete", "auto_complete_config"])
def test_tritonclient_model_control_example(explicit, proto, complete):
    """The steps of tritonclient's simple_{http,grpc}_model_control.py, as Triton 2.51 answers
    them: the example's malformed override fails with "failed to load" (INTERNAL) and leaves the
    model serving; the override {"max_batch_size":"16"} replaces config.pbtxt whole, so the
    model loads with the tensors its auto_complete_config declares, or none; a file path
    component of 256 characters is refused and the server lives on."""
    name = f"simple_{proto}_{'ac' if complete else 'plain'}"
    make_simple(explicit.repo, name, complete)
    c = connect(explicit, proto, timeout=120)
    try:
        c.load_model(name)
        assert c.is_model_ready(name)
        malformed = '"parameters": {"config": {{"max_batch_size": "16"}}}'  # what the example sends
        err = expect_error(proto, lambda: c.load_model(name, config=malformed), "INTERNAL", "failed to load")
        assert err.message() == f"failed to load '{name}', failed to poll from model repository"
        assert c.is_model_ready(name)
        np.testing.assert_array_equal(infer_simple(explicit, proto, name)[0], np.arange(16) + 1)

        c.load_model(name, config='{"max_batch_size":"16"}')
        assert c.is_model_ready(name)
        _, cfg = http_call(explicit, "GET", f"/v2/models/{name}/config")
        assert cfg["max_batch_size"] == 16
        if complete:
            assert [t["name"] for t in cfg["input"]] == ["INPUT0", "INPUT1"]
            assert [t["name"] for t in cfg["output"]] == ["OUTPUT0", "OUTPUT1"]
            np.testing.assert_array_equal(infer_simple(explicit, proto, name)[0], np.arange(16) + 1)
        else:  # nothing on disk is kept: no tensors, and a request naming some is refused
            assert (cfg["input"], cfg["output"]) == ([], [])
            expect_error(proto, lambda: infer_simple(explicit, proto, name), "INVALID_ARGUMENT",
                         "expected 0 inputs but got 2 inputs")
        if proto == "grpc":
            max_batch_size = c.get_model_config(name).config.max_batch_size
        else:
            max_batch_size = c.get_model_config(name)["max_batch_size"]
        assert max_batch_size == 16

        c.unload_model(name)
        assert not c.is_model_ready(name)
        # an override name longer than a file name can be is the client's error (Triton 2.51 aborts)
        err = expect_error(proto, lambda: c.load_model(name, config="{}", files={"file:" + "A" * 256: b"a"}),
                           "INVALID_ARGUMENT", "failed to load", "is too long")
        assert c.is_server_live()
        assert not c.is_model_ready(name)
        expect_error(proto, lambda: c.load_model("wrong_model_name"), "INTERNAL", "failed to load")
    finally:
        c.close()
    assert infer(explicit, proto, "const_a") == 1.0
