"""Scalars, reshape and shape rules in model configs, over HTTP and gRPC.

ONNX models are completed from the file (no config.pbtxt): a scalar tensor becomes
``dims: [1]``, with ``reshape { shape: [] }`` when the model batches, so clients send the
shapes a Triton client sends, while the model sees its own shapes. Python models show the
same ``reshape`` handling (and a 0-d output keeps its shape). Configs with a zero or an
empty dim are refused at load with the model-config messages.
"""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from .harness import ServerProcess
from .models import save_onnx, write_model
from .helpers import connect, expect_error

FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32
DIM_MESSAGE = "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"


# --------------------------------------------------------------------------- ONNX models

def _vi(name: str, elem: int, dims: list) -> object:
    return helper.make_tensor_value_info(name, elem, dims)


def onnx_scalar_scalar(path: Path) -> None:
    """Y = 2 * X, both 0-d."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    save_onnx(helper.make_graph([helper.make_node("Mul", ["X", "two"], ["Y"])], "scalar_scalar",
                                [_vi("X", FLOAT, [])], [_vi("Y", FLOAT, [])], [two]), path)


def onnx_sum_to_scalar(path: Path) -> None:
    """Y = sum(X): a variable-length vector in, a 0-d tensor out."""
    save_onnx(helper.make_graph([helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=0)], "sum_to_scalar",
                                [_vi("X", FLOAT, ["n"])], [_vi("Y", FLOAT, [])]), path)


def onnx_batch_rows(path: Path) -> None:
    """Y = 3 * X over a batch of scalars: X and Y are [batch]."""
    three = numpy_helper.from_array(np.array(3.0, dtype=np.float32), "three")
    save_onnx(helper.make_graph([helper.make_node("Mul", ["X", "three"], ["Y"])], "batch_rows",
                                [_vi("X", FLOAT, ["batch"])], [_vi("Y", FLOAT, ["batch"])], [three]), path)


def onnx_no_inputs(path: Path) -> None:
    """Constants only: C = [1, 2, 3] (INT32) and S = 0.5 (0-d FP32)."""
    nodes = [helper.make_node("Constant", [], ["C"], value=numpy_helper.from_array(np.array([1, 2, 3], np.int32))),
             helper.make_node("Constant", [], ["S"], value=numpy_helper.from_array(np.array(0.5, np.float32)))]
    save_onnx(helper.make_graph(nodes, "no_inputs", [], [_vi("C", INT32, [3]), _vi("S", FLOAT, [])]), path)


def onnx_identity(path: Path, dims: list) -> None:
    save_onnx(helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                                [_vi("X", FLOAT, dims)], [_vi("Y", FLOAT, dims)]), path)


# --------------------------------------------------------------------------- Python models

SCALAR_OUT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().sum() * 2, np.float32))])
                for r in requests]
"""

# Reports the shape it was handed and returns IN + 1 as [batch, 2, -1].
RESHAPE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SHAPE", np.array(x.shape, dtype=np.int64)),
                pb_utils.Tensor("OUT", x.reshape(x.shape[0], 2, -1) + 1)]))
        return responses
"""

CONST_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]) for _ in requests]
"""


def _py_config(inputs: str, outputs: str, max_batch_size: int = 0) -> str:
    return f'backend: "python"\nmax_batch_size: {max_batch_size}\n{inputs}\n{outputs}\n'


def _one(kind: str, name: str, dtype: str, dims: str, extra: str = "") -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {dtype} dims: {dims} {extra} }} ]'


# Refused at load: model -> the reason's text.
REFUSED = {
    "onnx_zero_dim_config": f"model input 'X' {DIM_MESSAGE} for onnx_zero_dim_config",
    "onnx_zero_dim_graph": f"model input 'X' {DIM_MESSAGE} for onnx_zero_dim_graph",
    "onnx_zero_output_dim": f"model output 'Y' {DIM_MESSAGE} for onnx_zero_output_dim",
    "py_zero_dim": f"model input 'IN' {DIM_MESSAGE} for py_zero_dim",
    "py_zero_reshape": "model input 'IN' reshape dimensions must be integer >= 1, or -1 to indicate a "
                       "variable-size dimension for py_zero_reshape",
    "py_empty_dims": "model input 'IN' must specify 'dims' for py_empty_dims",
    "py_empty_reshape_unbatched": "model input 'IN' cannot have empty reshape for non-batching model as scalar "
                                  "tensors are not supported for py_empty_reshape_unbatched",
    "py_reshape_size": "model output 'OUT' has different size for dims and reshape for py_reshape_size",
    "onnx_scalar_batched": "autofill failed for model 'onnx_scalar_batched': model does not support batching "
                           "while non-zero max_batch_size is specified",
}


def onnx_reshape_to_four(path: Path) -> None:
    """X[n] -> Y[2, 2]: valid for the config ([-1]); the runtime fails unless n == 4."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])
    save_onnx(helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])], "reshape_to_four",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])], initializer=[shape]), path)


def _build(repo: Path) -> None:
    onnx_scalar_scalar(repo / "scalar_scalar" / "1" / "model.onnx")
    onnx_sum_to_scalar(repo / "sum_to_scalar" / "1" / "model.onnx")
    onnx_batch_rows(repo / "batch_rows" / "1" / "model.onnx")
    onnx_batch_rows(repo / "batch_rows_delayed" / "1" / "model.onnx")
    (repo / "batch_rows_delayed" / "config.pbtxt").write_text(
        "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n")
    onnx_no_inputs(repo / "no_inputs" / "1" / "model.onnx")
    onnx_reshape_to_four(repo / "reshape_to_four" / "1" / "model.onnx")
    write_model(repo, "py_scalar_out", model_py=SCALAR_OUT_PY, config=_py_config(
        _one("input", "IN", "TYPE_FP32", "[ -1 ]"), _one("output", "OUT", "TYPE_FP32", "[ 1 ]")))
    write_model(repo, "py_reshape", model_py=RESHAPE_PY, config=_py_config(
        _one("input", "IN", "TYPE_FP32", "[ 2, 3, -1 ]", "reshape { shape: [ 6, -1 ] }"),
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1, 2, -1 ] reshape { shape: [ 2, -1 ] } },\n'
        '         { name: "SHAPE" data_type: TYPE_INT64 dims: [ -1 ] } ]', max_batch_size=4))
    write_model(repo, "py_no_inputs", model_py=CONST_PY,
                config=_py_config("", _one("output", "OUT", "TYPE_INT32", "[ 1 ]")))
    # refused
    onnx_identity(repo / "onnx_zero_dim_config" / "1" / "model.onnx", ["n"])
    (repo / "onnx_zero_dim_config" / "config.pbtxt").write_text(
        _one("input", "X", "TYPE_FP32", "[ 0 ]") + "\n" + _one("output", "Y", "TYPE_FP32", "[ -1 ]") + "\n")
    onnx_identity(repo / "onnx_zero_dim_graph" / "1" / "model.onnx", [0])
    onnx_identity(repo / "onnx_zero_output_dim" / "1" / "model.onnx", ["n"])
    (repo / "onnx_zero_output_dim" / "config.pbtxt").write_text(
        _one("input", "X", "TYPE_FP32", "[ -1 ]") + "\n" + _one("output", "Y", "TYPE_FP32", "[ 2, 0 ]") + "\n")
    onnx_scalar_scalar(repo / "onnx_scalar_batched" / "1" / "model.onnx")
    (repo / "onnx_scalar_batched" / "config.pbtxt").write_text("max_batch_size: 4\n")
    out1 = _one("output", "OUT", "TYPE_INT32", "[ 1 ]")
    write_model(repo, "py_zero_dim", model_py=CONST_PY,
                config=_py_config(_one("input", "IN", "TYPE_INT32", "[ 0 ]"), out1))
    write_model(repo, "py_zero_reshape", model_py=CONST_PY,
                config=_py_config(_one("input", "IN", "TYPE_INT32", "[ 1 ]", "reshape { shape: [ 0 ] }"), out1))
    write_model(repo, "py_empty_dims", model_py=CONST_PY,
                config=_py_config(_one("input", "IN", "TYPE_INT32", "[ ]"), out1))
    write_model(repo, "py_empty_reshape_unbatched", model_py=CONST_PY,
                config=_py_config(_one("input", "IN", "TYPE_INT32", "[ 1 ]", "reshape { shape: [ ] }"), out1))
    write_model(repo, "py_reshape_size", model_py=CONST_PY, config=_py_config(
        _one("input", "IN", "TYPE_INT32", "[ 1 ]"),
        _one("output", "OUT", "TYPE_INT32", "[ 2, 3 ]", "reshape { shape: [ 5 ] }")))


# --------------------------------------------------------------------------- server and helpers

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx_shapes")
    repo = root / "models"
    _build(repo)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error=false"]).start(wait_ready=False)
    srv.wait_repository_loaded()
    yield srv
    srv.stop_cleanly()



def _config(srv: ServerProcess, model: str) -> dict:
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{model}/config", timeout=30) as r:
        return json.loads(r.read())


def _infer(srv: ServerProcess, protocol: str, model: str, arrays: dict[str, np.ndarray], datatype: str = "FP32"):
    mod = httpclient if protocol == "http" else grpcclient
    inputs = []
    for name, array in arrays.items():
        inp = mod.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    with connect(srv, protocol) as client:
        return client.infer(model, inputs)


def _shape(result, name: str) -> list[int]:
    return [int(d) for d in result.get_output(name)["shape"]] if isinstance(result, httpclient.InferResult) \
        else [int(d) for d in result.get_output(name).shape]


def _io(config: dict, key: str) -> dict[str, dict]:
    return {t["name"]: {"dims": t["dims"], "reshape": t.get("reshape")} for t in config[key]}


PROTOCOLS = ["http", "grpc"]


# --------------------------------------------------------------------------- auto-complete of scalars

def test_scalar_model_completes_as_dims_one_without_batching(server):
    cfg = _config(server, "scalar_scalar")
    assert cfg["max_batch_size"] == 0
    assert "dynamic_batching" not in cfg
    assert _io(cfg, "input") == {"X": {"dims": [1], "reshape": None}}
    assert _io(cfg, "output") == {"Y": {"dims": [1], "reshape": None}}


def test_batched_scalars_complete_with_an_empty_reshape(server):
    cfg = _config(server, "batch_rows")
    assert cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    assert _io(cfg, "input") == {"X": {"dims": [1], "reshape": {"shape": []}}}
    assert _io(cfg, "output") == {"Y": {"dims": [1], "reshape": {"shape": []}}}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        md = client.get_model_metadata("batch_rows", as_json=True)
    assert [int(d) for d in md["inputs"][0]["shape"]] == [-1, 1]


def test_first_dim_not_dynamic_means_no_batching(server):
    cfg = _config(server, "sum_to_scalar")
    assert cfg["max_batch_size"] == 0
    assert _io(cfg, "input") == {"X": {"dims": [-1], "reshape": None}}
    assert _io(cfg, "output") == {"Y": {"dims": [1], "reshape": None}}


# --------------------------------------------------------------------------- inference

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_scalar_in_scalar_out(server, protocol):
    result = _infer(server, protocol, "scalar_scalar", {"X": np.array([1.25], dtype=np.float32)})
    assert _shape(result, "Y") == [1]
    np.testing.assert_array_equal(result.as_numpy("Y"), np.array([2.5], dtype=np.float32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_vector_in_scalar_out(server, protocol):
    result = _infer(server, protocol, "sum_to_scalar", {"X": np.array([1, 2, 3, 4.5], dtype=np.float32)})
    assert _shape(result, "Y") == [1]
    np.testing.assert_array_equal(result.as_numpy("Y"), np.array([10.5], dtype=np.float32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_of_scalars(server, protocol):
    x = np.array([[1], [2], [-4]], dtype=np.float32)
    result = _infer(server, protocol, "batch_rows", {"X": x})
    assert _shape(result, "Y") == [3, 1]
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 3)


def test_batched_scalars_concatenated(server):
    """Requests joined into one execution keep their own [rows, 1] shapes."""
    sizes = [1, 2, 1]
    arrays = [np.arange(n, dtype=np.float32).reshape(n, 1) + 10 * i for i, n in enumerate(sizes)]
    with httpclient.InferenceServerClient(server.http_url, concurrency=len(sizes)) as client:
        before = client.get_inference_statistics("batch_rows_delayed")["model_stats"][0]
        pending = []
        for a in arrays:
            inp = httpclient.InferInput("X", list(a.shape), "FP32")
            inp.set_data_from_numpy(a)
            pending.append(client.async_infer("batch_rows_delayed", [inp]))
        results = [p.get_result() for p in pending]
        after = client.get_inference_statistics("batch_rows_delayed")["model_stats"][0]
    for a, r in zip(arrays, results):
        assert _shape(r, "Y") == [a.shape[0], 1]
        np.testing.assert_array_equal(r.as_numpy("Y"), a * 3)
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert after["execution_count"] - before["execution_count"] == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_graph_without_inputs(server, protocol):
    cfg = _config(server, "no_inputs")
    assert cfg["input"] == [] and cfg["max_batch_size"] == 0
    assert _io(cfg, "output") == {"C": {"dims": [3], "reshape": None}, "S": {"dims": [1], "reshape": None}}
    result = _infer(server, protocol, "no_inputs", {})
    assert _shape(result, "C") == [3] and _shape(result, "S") == [1]
    np.testing.assert_array_equal(result.as_numpy("C"), np.array([1, 2, 3], dtype=np.int32))
    np.testing.assert_array_equal(result.as_numpy("S"), np.array([0.5], dtype=np.float32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_model_without_inputs(server, protocol):
    result = _infer(server, protocol, "py_no_inputs", {})
    assert _shape(result, "OUT") == [1]
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([7], dtype=np.int32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_zero_d_output_keeps_its_shape(server, protocol):
    result = _infer(server, protocol, "py_scalar_out", {"IN": np.array([1, 2, 3], dtype=np.float32)})
    assert _shape(result, "OUT") == []
    out = result.as_numpy("OUT")
    assert out.shape == () and out == np.float32(12.0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_reshape_with_variable_dims(server, protocol):
    """dims [2, 3, -1] reshape [6, -1] in; reshape [2, -1] to dims [1, 2, -1] out."""
    x = np.arange(2 * 2 * 3 * 5, dtype=np.float32).reshape(2, 2, 3, 5)
    result = _infer(server, protocol, "py_reshape", {"IN": x})
    np.testing.assert_array_equal(result.as_numpy("SHAPE"), np.array([2, 6, 5], dtype=np.int64))
    assert _shape(result, "OUT") == [2, 1, 2, 15]
    np.testing.assert_array_equal(result.as_numpy("OUT"), x.reshape(2, 1, 2, 15) + 1)


# --------------------------------------------------------------------------- refused configs

@pytest.mark.parametrize("model", sorted(REFUSED))
def test_invalid_shapes_refused_at_load(server, model):
    with httpclient.InferenceServerClient(server.http_url) as client:
        rows = [m for m in client.get_model_repository_index() if m["name"] == model]
        assert rows and all(m["state"] == "UNAVAILABLE" for m in rows), rows
        assert any(REFUSED[model] in m.get("reason", "") for m in rows), rows
        assert not client.is_model_ready(model)


# --------------------------------------------------------------------------- runtime failures
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failure_inside_onnx_runtime_is_internal(server, protocol):
    """The request matches the config; ONNX Runtime fails to run it: INTERNAL (500), as
    Triton's onnxruntime backend answers, naming the model and the runtime's reason."""
    np.testing.assert_array_equal(
        _infer(server, protocol, "reshape_to_four", {"X": np.arange(4, dtype=np.float32)}).as_numpy("Y"),
        np.arange(4, dtype=np.float32).reshape(2, 2))
    e = expect_error(protocol, lambda: _infer(server, protocol, "reshape_to_four", {"X": np.ones(3, np.float32)}),
                     "INTERNAL", "onnxruntime failed to run model 'reshape_to_four'")
    assert "Reshape" in e.message(), e.message()
