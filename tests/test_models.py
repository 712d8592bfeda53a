"""Model loading and the Python-backend model API against a real server.

One module-scoped server hosts many small models built in a temporary repository: ONNX
models completed from the file, Python models exercising ``pb_utils``, models whose
entries are broken on purpose, and version policies. The ``finalize`` check starts and
stops a server of its own, since it looks at what a model leaves behind after shutdown.
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import onnx_add_sub, write_model
from .helpers import assert_serving, connect

# --------------------------------------------------------------------------- model sources

AUTOCOMPLETE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
                for r in requests]
"""

ARGS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        payload = np.array([json.dumps(self.args).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", payload)]) for _ in requests]
"""

PARAMS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            names = request.requested_output_names()
            outputs = {
                "PARAMS": np.array([request.parameters().encode()], dtype=np.object_),
                "NAMES": np.array([json.dumps(sorted(names)).encode()], dtype=np.object_),
                "OTHER": np.array([b"other"], dtype=np.object_),
            }
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, outputs[n]) for n in names]))
        return responses
"""

ERRORS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

def ok(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([value], dtype=np.int32))])

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0])
            if mode == 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("boom")))
            elif mode == 2:
                raise ValueError("bad value 42")
            elif mode == 3:
                return []
            elif mode == 4:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", np.array([1.5], dtype=np.float64))]))
            elif mode == 5:
                return None
            elif mode == 6:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad argument here", pb_utils.TritonError.INVALID_ARG)))
            elif mode == 7:
                return [ok(7), ok(7)]
            elif mode == 8:
                raise pb_utils.TritonModelException("model exception text")
            else:
                responses.append(ok(mode))
        return responses
"""

UTILS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        out1 = pb_utils.get_output_config_by_name(cfg, "OUTPUT1")
        assert pb_utils.get_output_config_by_name(cfg, "NOPE") is None
        self.out1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])
        assert self.out1_dtype == np.int64, self.out1_dtype
        self.in_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_input_config_by_name(cfg, "INPUT0")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            assert t.as_numpy().dtype == self.in_dtype
            # capsule round trip
            back = pb_utils.Tensor.from_dlpack("OUTPUT0", t.to_dlpack())
            assert back.triton_dtype() == pb_utils.TYPE_FP32
            # object-with-__dlpack__ round trip (a pb_utils.Tensor itself)
            again = pb_utils.Tensor.from_dlpack("OUTPUT0", back)
            out1 = pb_utils.Tensor("OUTPUT1", (t.as_numpy() * 2).astype(self.out1_dtype))
            responses.append(pb_utils.InferenceResponse([again, out1]))
        return responses
"""

INIT_RAISES_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("init exploded")

    def execute(self, requests):
        return []
"""

VERSIONED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.offset = int(args["model_version"]) * 100

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + self.offset)])
                for r in requests]
"""

FINALIZE_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.path = cfg["parameters"]["finalize_path"]["string_value"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([1], dtype=np.int32))])
                for _ in requests]

    def finalize(self):
        with open(self.path, "w") as f:
            f.write("finalized")
"""


def _io_config(name: str, inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]],
               extra: str = "", max_batch_size: int = 0) -> str:
    fmt = lambda ts: ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in ts)  # noqa: E731
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
            f"input [ {fmt(inputs)} ]\noutput [ {fmt(outputs)} ]\n{extra}\n")


def _versioned(repo, name: str, extra: str = "") -> None:
    for v in (1, 2):
        write_model(repo, name, version=v, model_py=VERSIONED_PY,
                    config=_io_config(name, [("INPUT0", "TYPE_INT32", "[ 1 ]")],
                                      [("OUTPUT0", "TYPE_INT32", "[ 1 ]")], extra))


@pytest.fixture(scope="module")
def models_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    repo = root / "models"
    # ONNX: no config at all, and a config with only name/platform.
    onnx_add_sub(repo / "onnx_noconfig" / "1" / "model.onnx")
    onnx_add_sub(repo / "onnx_minimal" / "1" / "model.onnx")
    (repo / "onnx_minimal" / "config.pbtxt").write_text('name: "onnx_minimal"\nplatform: "onnxruntime_onnx"\n')
    # ONNX configs that list some of the model's tensors: as Triton's, left as they are.
    fp32 = lambda *names: [(n, "TYPE_FP32", "[ 16 ]") for n in names]  # noqa: E731
    for name, inputs, outputs in (("onnx_some_inputs", fp32("INPUT0"), fp32("OUTPUT0", "OUTPUT1")),
                                  ("onnx_some_outputs", fp32("INPUT0", "INPUT1"), fp32("OUTPUT1"))):
        onnx_add_sub(repo / name / "1" / "model.onnx")
        config = _io_config(name, inputs, outputs, max_batch_size=8)
        (repo / name / "config.pbtxt").write_text(config.replace('backend: "python"', 'platform: "onnxruntime_onnx"'))
    # Python models.
    write_model(repo, "py_autocomplete", model_py=AUTOCOMPLETE_PY)
    write_model(repo, "py_args", model_py=ARGS_PY, config=_io_config(
        "py_args", [("DUMMY", "TYPE_INT32", "[ 1 ]")], [("ARGS", "TYPE_STRING", "[ 1 ]")],
        'parameters { key: "greeting" value { string_value: "hello" } }'))
    write_model(repo, "py_params", model_py=PARAMS_PY, config=_io_config(
        "py_params", [("DUMMY", "TYPE_INT32", "[ 1 ]")],
        [("PARAMS", "TYPE_STRING", "[ 1 ]"), ("NAMES", "TYPE_STRING", "[ 1 ]"), ("OTHER", "TYPE_STRING", "[ 1 ]")]))
    write_model(repo, "py_errors", model_py=ERRORS_PY, config=_io_config(
        "py_errors", [("MODE", "TYPE_INT32", "[ 1 ]")], [("OUTPUT0", "TYPE_INT32", "[ 1 ]")]))
    write_model(repo, "py_utils", model_py=UTILS_PY, config=_io_config(
        "py_utils", [("INPUT0", "TYPE_FP32", "[ -1 ]")],
        [("OUTPUT0", "TYPE_FP32", "[ -1 ]"), ("OUTPUT1", "TYPE_INT64", "[ -1 ]")]))
    # Broken entries.
    write_model(repo, "bad_pbtxt", model_py=ARGS_PY, config='name: "bad_pbtxt"\nthis is { not a config\n')
    (repo / "bad_onnx" / "1").mkdir(parents=True)
    (repo / "bad_onnx" / "1" / "model.onnx").write_bytes(os.urandom(2048))
    write_model(repo, "bad_init", model_py=INIT_RAISES_PY, config=_io_config(
        "bad_init", [("INPUT0", "TYPE_INT32", "[ 1 ]")], [("OUTPUT0", "TYPE_INT32", "[ 1 ]")]))
    write_model(repo, "odd_versions", model_py=VERSIONED_PY, config=_io_config(
        "odd_versions", [("INPUT0", "TYPE_INT32", "[ 1 ]")], [("OUTPUT0", "TYPE_INT32", "[ 1 ]")]))
    (repo / "odd_versions" / "abc").mkdir()
    (repo / "odd_versions" / "abc" / "model.py").write_text("raise SystemExit('must never be imported')\n")
    # Version policies.
    _versioned(repo, "vers_latest")
    _versioned(repo, "vers_all", "version_policy: { all {} }")
    _versioned(repo, "vers_specific", "version_policy: { specific { versions: [ 1 ] } }")

    srv = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error=false"]).start(wait_ready=False)
    srv.repo = repo
    srv.wait_repository_loaded()
    yield srv
    srv.stop_cleanly()



def _get(srv, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://{srv.http_url}{path}", timeout=30) as r:
            body = r.read()
            return r.status, json.loads(body) if body else {}
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else {}


def _int_input(mod, name: str, values, shape=None):
    arr = np.array(values, dtype=np.int32)
    if shape is not None:
        arr = arr.reshape(shape)
    inp = mod.InferInput(name, list(arr.shape), "INT32")
    inp.set_data_from_numpy(arr)
    return inp


def _run_add_sub(client, mod, model: str, batch: int = 2) -> None:
    a = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
    b = np.full((batch, 16), 0.5, dtype=np.float32)
    inputs = [mod.InferInput("INPUT0", [batch, 16], "FP32"), mod.InferInput("INPUT1", [batch, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# --------------------------------------------------------------------------- auto-complete

@pytest.mark.parametrize("model", ["onnx_noconfig", "onnx_minimal"])
def test_onnx_config_completed(models_server, model):
    status, cfg = _get(models_server, f"/v2/models/{model}/config")
    assert status == 200, cfg
    assert cfg["name"] == model
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    for key in ("input", "output"):
        tensors = {t["name"]: t for t in cfg[key]}
        names = ["INPUT0", "INPUT1"] if key == "input" else ["OUTPUT0", "OUTPUT1"]
        assert sorted(tensors) == names
        for t in tensors.values():
            assert t["data_type"] == "TYPE_FP32"
            assert t["dims"] == [16]  # batch dimension stripped

    with connect(models_server, "grpc") as client:
        gcfg = client.get_model_config(model, as_json=True)["config"]
        assert gcfg["max_batch_size"] == 4
        assert sorted(t["name"] for t in gcfg["input"]) == ["INPUT0", "INPUT1"]
        assert [int(d) for d in gcfg["input"][0]["dims"]] == [16]
        md = client.get_model_metadata(model, as_json=True)
        assert [int(d) for d in md["inputs"][0]["shape"]] == [-1, 16]
        _run_add_sub(client, grpcclient, model, batch=4)
    client = connect(models_server, "http")
    try:
        _run_add_sub(client, httpclient, model, batch=1)
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
            _run_add_sub(client, httpclient, model, batch=5)
    finally:
        client.close()


def test_onnx_listed_outputs_are_not_completed(models_server):
    """As Triton's ONNX Runtime backend: a config that lists inputs and outputs is not
    auto-completed, even where it names only some of the model's outputs (those are what
    the model serves); one naming only some inputs fails to load (BROKEN)."""
    status, cfg = _get(models_server, "/v2/models/onnx_some_outputs/config")
    assert status == 200, cfg
    assert [t["name"] for t in cfg["output"]] == ["OUTPUT1"]
    assert [t["name"] for t in cfg["input"]] == ["INPUT0", "INPUT1"]
    assert "dynamic_batching" not in cfg  # not completed: nothing added
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), dtype=np.float32)
    with connect(models_server, "http") as client:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("onnx_some_outputs", inputs)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        with pytest.raises(InferenceServerException, match="OUTPUT0"):
            client.infer("onnx_some_outputs", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0")])


def test_python_auto_complete_config(models_server):
    status, cfg = _get(models_server, "/v2/models/py_autocomplete/config")
    assert status == 200, cfg
    assert cfg["backend"] == "python"
    assert cfg["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [("INPUT0", "TYPE_INT32", [3])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [("OUTPUT0", "TYPE_INT32", [3])]
    with connect(models_server, "grpc") as client:
        gcfg = client.get_model_config("py_autocomplete", as_json=True)["config"]
        assert gcfg["max_batch_size"] == 8 and gcfg["output"][0]["name"] == "OUTPUT0"
        result = client.infer("py_autocomplete", [_int_input(grpcclient, "INPUT0", [[1, 2, 3], [4, 5, 6]])])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2, 4, 6], [8, 10, 12]])


# --------------------------------------------------------------------------- pb_utils API

def test_initialize_args(models_server):
    with connect(models_server, "grpc") as client:
        result = client.infer("py_args", [_int_input(grpcclient, "DUMMY", [0])])
    args = json.loads(result.as_numpy("ARGS")[0])
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_version"] == "1"
    assert args["model_name"] == "py_args"
    assert args["model_instance_name"] == "py_args_0_0"  # group py_args_0 (Triton's default name), instance 0
    # Triton passes the model's own directory as "model_repository".
    assert os.path.samefile(args["model_repository"], models_server.repo / "py_args")
    cfg = json.loads(args["model_config"])
    assert cfg["name"] == "py_args"
    assert cfg["backend"] == "python"
    assert [o["name"] for o in cfg["output"]] == ["ARGS"]
    assert cfg["parameters"]["greeting"]["string_value"] == "hello"
    assert all(isinstance(v, str) for v in args.values())


def test_request_parameters_and_requested_outputs_http(models_server):
    client = connect(models_server, "http")
    try:
        result = client.infer(
            "py_params", [_int_input(httpclient, "DUMMY", [0])],
            outputs=[httpclient.InferRequestedOutput("PARAMS"), httpclient.InferRequestedOutput("NAMES")],
            parameters={"custom": "x", "count": 5, "flag": True})
    finally:
        client.close()
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params["custom"] == "x" and params["count"] == 5 and params["flag"] is True
    assert "binary_data_size" not in params
    assert json.loads(result.as_numpy("NAMES")[0]) == ["NAMES", "PARAMS"]
    assert result.as_numpy("OTHER") is None  # not requested, not returned


def test_request_parameters_and_requested_outputs_grpc(models_server):
    with connect(models_server, "grpc") as client:
        result = client.infer("py_params", [_int_input(grpcclient, "DUMMY", [0])],
                              parameters={"custom": "y", "count": 7})
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params["custom"] == "y" and params["count"] == 7
    # No outputs requested: the model is told every output is wanted.
    assert json.loads(result.as_numpy("NAMES")[0]) == ["NAMES", "OTHER", "PARAMS"]
    assert result.as_numpy("OTHER")[0] == b"other"


def test_dlpack_and_config_helpers(models_server):
    data = np.array([0.5, -1.0, 3.0, 1e6], dtype=np.float32)
    with connect(models_server, "grpc") as client:
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer("py_utils", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    out1 = result.as_numpy("OUTPUT1")
    assert out1.dtype == np.int64
    np.testing.assert_array_equal(out1, (data * 2).astype(np.int64))


# --------------------------------------------------------------------------- model errors

def _errors_http(srv, mode: int):
    client = connect(srv, "http")
    try:
        return client.infer("py_errors", [_int_input(httpclient, "MODE", [mode])]).as_numpy("OUTPUT0")
    finally:
        client.close()


@pytest.mark.parametrize("mode,status,needles", [
    (1, 500, ["boom"]),                                            # TritonError, default INTERNAL
    (6, 400, ["bad argument here"]),                                # TritonError(INVALID_ARG)
    (2, 500, ["ValueError", "bad value 42"]),                      # execute raises
    (8, 500, ["model exception text"]),                             # TritonModelException
    # Triton: "Number of InferenceResponse objects do not match the number of InferenceRequest
    # objects. InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0"
    (3, 500, [r"Number of InferenceResponse objects do not match", r"size is:1\b", r"size is:0\b"]),
    (7, 500, [r"Number of InferenceResponse objects do not match", r"size is:2\b"]),
    (5, 500, ["InferenceResponse", "None"]),
    (4, 400, ["OUTPUT0", "FP64", "INT32"]),                        # output dtype vs config
], ids=["triton_error", "triton_error_invalid_arg", "raises_value_error", "model_exception",
        "zero_responses", "two_responses", "returns_none", "wrong_output_dtype"])
def test_model_errors_http(models_server, mode, status, needles):
    with pytest.raises(InferenceServerException) as e:
        _errors_http(models_server, mode)
    assert e.value.status() == str(status), (e.value.status(), e.value.message())
    for needle in needles:
        assert re.search(needle, e.value.message()), (needle, e.value.message())
    assert_serving(models_server, "py_errors", datatype="INT32", input_name="MODE",
                   values=np.array([9], dtype=np.int32))


@pytest.mark.parametrize("mode,code,needle", [
    (1, "StatusCode.INTERNAL", "boom"),
    (6, "StatusCode.INVALID_ARGUMENT", "bad argument here"),
    (2, "StatusCode.INTERNAL", "bad value 42"),
])
def test_model_errors_grpc(models_server, mode, code, needle):
    with connect(models_server, "grpc") as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("py_errors", [_int_input(grpcclient, "MODE", [mode])])
    assert e.value.status() == code
    assert needle in e.value.message()
    assert_serving(models_server, "py_errors", datatype="INT32", input_name="MODE",
                   values=np.array([9], dtype=np.int32))


def test_finalize_called_on_shutdown(tmp_path):
    repo = tmp_path / "models"
    marker = tmp_path / "finalized.txt"
    write_model(repo, "py_finalize", model_py=FINALIZE_PY, config=_io_config(
        "py_finalize", [("INPUT0", "TYPE_INT32", "[ 1 ]")], [("OUTPUT0", "TYPE_INT32", "[ 1 ]")],
        f'parameters {{ key: "finalize_path" value {{ string_value: "{marker}" }} }}'))
    srv = ServerProcess(repo, tmp_path / "server.log").start()
    try:
        with connect(srv, "grpc") as client:
            r = client.infer("py_finalize", [_int_input(grpcclient, "INPUT0", [0])])
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), [1])
        assert not marker.exists()
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
    assert marker.read_text() == "finalized", srv.log()[-3000:]


# --------------------------------------------------------------------------- broken entries

BROKEN = {"bad_onnx": "onnx", "bad_init": "init exploded", "onnx_some_inputs":
          "unable to load model 'onnx_some_inputs', configuration expects 1 inputs, model provides 2"}


def test_broken_models_do_not_stop_the_server(models_server):
    with connect(models_server, "http") as client:
        assert client.is_server_live()
        # Strict readiness: a model failed to load, so the server is not ready.
        assert not client.is_server_ready()
        index = {(m["name"], m.get("version", "")): m for m in client.get_model_repository_index()}
        names = {name for name, _ in index}
        for model, needle in BROKEN.items():
            assert model in names, index
            rows = [m for (name, _), m in index.items() if name == model]
            assert all(m["state"] == "UNAVAILABLE" for m in rows), rows
            assert any(needle.lower() in m.get("reason", "").lower() for m in rows), rows
            assert not client.is_model_ready(model)
        # As Triton: a config.pbtxt that cannot be parsed fails the repository poll, so the
        # model is never loaded, and listed by name only.
        assert [m for (name, _), m in index.items() if name == "bad_pbtxt"] == [{"name": "bad_pbtxt"}]
        assert not client.is_model_ready("bad_pbtxt")
        # Everything else loaded.
        for model in ("onnx_noconfig", "py_errors", "py_args", "odd_versions", "vers_all"):
            assert client.is_model_ready(model), model
    with connect(models_server, "grpc") as client:
        gindex = client.get_model_repository_index(as_json=True)["models"]
        bad = [m for m in gindex if m["name"] == "bad_init"]
        assert bad and bad[0]["state"] == "UNAVAILABLE" and "init exploded" in bad[0]["reason"]


@pytest.mark.parametrize("model", sorted(BROKEN))
def test_infer_on_broken_model_gives_clear_error(models_server, model):
    with connect(models_server, "http") as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer(model, [_int_input(httpclient, "INPUT0", [1])])
        # 404, as Triton 2.51 answers for a model that failed to load
        assert e.value.status() == "404", (e.value.status(), e.value.message())
        assert e.value.message() == f"Request for unknown model: '{model}' has no available versions"
        status, body = _get(models_server, f"/v2/models/{model}/config")
        assert status == 404, (status, body)
        assert body == {"error": f"Request for unknown model: '{model}' has no available versions"}
    assert_serving(models_server, "py_errors", datatype="INT32", input_name="MODE",
                   values=np.array([9], dtype=np.int32))


def test_model_that_failed_the_poll_is_not_found(models_server):
    """As Triton 2.51: a model never loaded (its config.pbtxt cannot be parsed) is unknown,
    and it is not in the start-up table."""
    for path in ("/v2/models/bad_pbtxt/config", "/v2/models/bad_pbtxt"):
        assert _get(models_server, path) == (404, {"error": "Request for unknown model: 'bad_pbtxt' is not found"})
    with connect(models_server, "grpc") as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("bad_pbtxt", [_int_input(grpcclient, "INPUT0", [1])])
        assert (e.value.status(), e.value.message()) == (
            "StatusCode.NOT_FOUND", "Request for unknown model: 'bad_pbtxt' is not found")
    assert not any(ln.startswith("| bad_pbtxt ") for ln in models_server.log().splitlines())
    assert "Poll failed for model directory 'bad_pbtxt': failed to parse config.pbtxt" in models_server.log()


def test_non_numeric_version_folder_is_ignored(models_server):
    assert "ignoring 'abc'" in models_server.log() and "odd_versions" in models_server.log()
    with connect(models_server, "grpc") as client:
        md = client.get_model_metadata("odd_versions", as_json=True)
        assert md["versions"] == ["1"]
        r = client.infer("odd_versions", [_int_input(grpcclient, "INPUT0", [1])])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), [101])


def test_status_table_lists_broken_models(models_server):
    log = models_server.log()
    for model in BROKEN:
        line = next((ln for ln in log.splitlines() if ln.startswith(f"| {model} ")), None)
        assert line is not None and "UNAVAILABLE" in line, log[-3000:]


# --------------------------------------------------------------------------- version policy

def _infer_version(client, model: str, version: str = "") -> int:
    r = client.infer(model, [_int_input(grpcclient, "INPUT0", [1])], model_version=version)
    return int(r.as_numpy("OUTPUT0")[0])


def test_version_policy_latest_default(models_server):
    with connect(models_server, "grpc") as client:
        assert client.is_model_ready("vers_latest", "2")
        assert not client.is_model_ready("vers_latest", "1")
        assert client.get_model_metadata("vers_latest", as_json=True)["versions"] == ["2"]
        assert _infer_version(client, "vers_latest") == 201
        assert _infer_version(client, "vers_latest", "2") == 201
        with pytest.raises(InferenceServerException) as e:
            _infer_version(client, "vers_latest", "1")
        assert e.value.status() == "StatusCode.NOT_FOUND"
        assert "version 1" in e.value.message()


def test_version_policy_all(models_server):
    with connect(models_server, "grpc") as client:
        assert client.is_model_ready("vers_all", "1") and client.is_model_ready("vers_all", "2")
        assert client.get_model_metadata("vers_all", as_json=True)["versions"] == ["1", "2"]
        assert _infer_version(client, "vers_all", "1") == 101
        assert _infer_version(client, "vers_all", "2") == 201
        assert _infer_version(client, "vers_all") == 201  # no version: the highest
    client = connect(models_server, "http")
    try:
        r = client.infer("vers_all", [_int_input(httpclient, "INPUT0", [5])], model_version="1")
        assert int(r.as_numpy("OUTPUT0")[0]) == 105
        assert r.get_response()["model_version"] == "1"
    finally:
        client.close()


def test_version_policy_specific(models_server):
    with connect(models_server, "grpc") as client:
        assert client.is_model_ready("vers_specific", "1")
        assert not client.is_model_ready("vers_specific", "2")
        assert _infer_version(client, "vers_specific") == 101
