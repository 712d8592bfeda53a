"""PyTorch (TorchScript) models end to end, against a real server over a repository built
here: the tests script or trace their models with torch and save them with
``torch.jit.save``; nothing is downloaded.

Triton's naming rules (``INPUT__0`` / ``OUTPUT__1`` by index, forward()'s argument names,
config order otherwise, a ``Dict[str, Tensor]`` input), several outputs, a dtype mix,
strings as ``List[str]``, dynamic batching (one forward per batch), variable dims, the
parameters, KIND_MODEL, the config errors that fail a load and the runtime errors that
fail a request (never the server), system shared-memory inputs lent in place (and copied
for a model that writes its inputs). Every test needs PyTorch and is skipped without it,
except the one that checks the clear load failure where it is missing (and its twin that
hides the installed torch from the server). The GPU tests (KIND_GPU, CUDA shared memory in
and out with the tensors left on the device) also need CuPy and a GPU.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc.aio as aiogrpc
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttp_client
import tritonclient.utils.shared_memory as shm

from triton_shm.backends import pytorch as pt_backend
from triton_shm.errors import InvalidArgument

from .harness import ServerProcess, children
from .helpers import assert_serving, client_module, connect, expect_error
from .models import python_identity, write_model
from .test_gpu import DeviceBuffer, _missing

try:
    import torch
except ImportError:  # the whole file but the missing-torch tests is skipped
    torch = None  # type: ignore[assignment]

NO_TORCH = "PyTorch is not installed (pip install 'triton-shm[pytorch]')"
needs_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)


def _gpu_missing() -> str | None:
    if torch is None:
        return NO_TORCH
    if _missing() is not None:
        return _missing()
    if not torch.cuda.is_available():
        return f"this PyTorch ({torch.__version__}) has no CUDA or sees no GPU"
    return None


needs_gpu = pytest.mark.skipif(_gpu_missing() is not None, reason=_gpu_missing() or "")
# torch.jit.script / trace / save are deprecated in PyTorch 2.10+, and TorchScript is what
# Triton's PyTorch backend serves
pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")]

# -- the models ---------------------------------------------------------------------------

if torch is not None:
    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    class Product(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x * 10 + y

    class Mix(torch.nn.Module):
        def forward(self, f: torch.Tensor, i: torch.Tensor, h: torch.Tensor,
                    b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            return f * 2, i + 1, h * 2, torch.logical_not(b)

    class DictSub(torch.nn.Module):
        def forward(self, d: Dict[str, torch.Tensor]) -> torch.Tensor:
            return d["A"] - d["B"]

    class Affine(torch.nn.Module):  # traced, not scripted
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.arange(6, dtype=torch.float32).reshape(3, 2))

        def forward(self, x):
            return x @ self.w + 1

    class Fails(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool(x.sum() < 0):
                raise RuntimeError("negative input")
            return x

    class Mutates(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.add_(1)
            return x

    class Upper(torch.nn.Module):
        def forward(self, s: List[str]) -> List[str]:
            return [t.upper() for t in s]

    class ToInt(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.int64)

    class Accumulate(torch.nn.Module):  # sequence batching: a START control and an implicit state
        def forward(self, x: torch.Tensor, start: torch.Tensor,
                    state: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            total = state * (1 - start) + x
            return total, total

    class DictOut(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
            return {"y": x}


def save_module(model_dir: Path, module, filename: str = "model.pt", version: int = 1) -> None:
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    torch.jit.save(module, str(model_dir / str(version) / filename))


def tensors(kind: str, *entries: tuple[str, str, str]) -> str:
    body = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in entries)
    return f"{kind} [ {body} ]"


def pt_model(repo: Path, name: str, module, inputs, outputs, *, max_batch_size: int = 0, extra: str = "",
             head: str = 'platform: "pytorch_libtorch"', filename: str = "model.pt") -> None:
    write_model(repo, name, config=f"""
        name: "{name}"
        {head}
        max_batch_size: {max_batch_size}
        {tensors("input", *inputs)}
        {tensors("output", *outputs)}
        {extra}
        """)
    if module is not None:
        save_module(repo / name, module, filename)


FP32_VAR = ("INPUT__0", "TYPE_FP32", "[ -1 ]")
ADD_SUB_IN = [("INPUT__0", "TYPE_FP32", "[ -1 ]"), ("INPUT__1", "TYPE_FP32", "[ -1 ]")]
ADD_SUB_OUT = [("OUTPUT__0", "TYPE_FP32", "[ -1 ]"), ("OUTPUT__1", "TYPE_FP32", "[ -1 ]")]

# model -> what its load failure says
LOAD_FAILURES = {
    "bad_out_index": "the output OUTPUT__1 in the model configuration refers to an output index which doesn't "
                     "exist. This model has 1 outputs",
    "bad_in_count": "unable to load model 'bad_in_count', configuration expects 2 inputs, model provides 1",
    "bad_in_index": "input 'INPUT__5' names forward() argument 5, but forward() takes 2 input(s)",
    "bad_dtype": "unsupported datatype TYPE_UINT32 for output 'OUTPUT__0' for model 'bad_dtype'",
    "bad_file": "failed to load model 'bad_file'",
    "missing_file": "unable to find '",
    "bad_param": "failed to convert 'maybe' to a boolean value for parameter 'INFERENCE_MODE'",
    "dict_out": "It should not be a List / Dictionary of Tensors or a Scalar",
    "no_config": "the model configuration must contain at least one input, none were specified",
    "string_2d": "is TYPE_STRING, which PyTorch models take and return as a 1-dimensional List[str] only",
}


def build_repository(repo: Path) -> Path:
    python_identity(repo, "identity_fp32", "FP32")
    script = torch.jit.script
    pt_model(repo, "add_sub", script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT, max_batch_size=8,
             extra="dynamic_batching { max_queue_delay_microseconds: 300000 }")
    pt_model(repo, "add_sub_nobatch", script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT)
    # config order y, x: the names, not the order, say which argument each is
    pt_model(repo, "by_arg", script(Product()), [("y", "TYPE_INT32", "[ -1 ]"), ("x", "TYPE_INT32", "[ -1 ]")],
             [("product", "TYPE_INT32", "[ -1 ]")])
    # the outputs listed out of order: their index, not their place, picks the result
    pt_model(repo, "mix", script(Mix()),
             [("INPUT__0", "TYPE_FP32", "[ 2 ]"), ("INPUT__1", "TYPE_INT64", "[ 2 ]"),
              ("INPUT__2", "TYPE_FP16", "[ 2 ]"), ("INPUT__3", "TYPE_BOOL", "[ 2 ]")],
             [("OUTPUT__3", "TYPE_BOOL", "[ 2 ]"), ("OUTPUT__0", "TYPE_FP32", "[ 2 ]"),
              ("OUTPUT__2", "TYPE_FP16", "[ 2 ]"), ("OUTPUT__1", "TYPE_INT64", "[ 2 ]")], max_batch_size=4)
    pt_model(repo, "dict_in", script(DictSub()), [("B", "TYPE_FP64", "[ -1 ]"), ("A", "TYPE_FP64", "[ -1 ]")],
             [("DIFF", "TYPE_FP64", "[ -1 ]")])
    pt_model(repo, "traced", torch.jit.trace(Affine(), torch.ones(2, 3)), [("INPUT__0", "TYPE_FP32", "[ 3 ]")],
             [("OUTPUT__0", "TYPE_FP32", "[ 2 ]")], max_batch_size=4)
    pt_model(repo, "fails", script(Fails()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    pt_model(repo, "mutates", script(Mutates()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    pt_model(repo, "upper", script(Upper()), [("INPUT__0", "TYPE_STRING", "[ -1 ]")],
             [("OUTPUT__0", "TYPE_STRING", "[ -1 ]")])
    pt_model(repo, "wrong_type", script(ToInt()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    pt_model(repo, "params", script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT, extra="""
        instance_group [ { kind: KIND_CPU count: 2 } ]
        parameters [
          { key: "INFERENCE_MODE" value: { string_value: "false" } },
          { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } },
          { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } },
          { key: "ENABLE_JIT_PROFILING" value: { string_value: "off" } },
          { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } },
          { key: "ENABLE_CACHE_CLEANING" value: { string_value: "true" } },
          { key: "ENABLE_NVFUSER" value: { string_value: "true" } }
        ]""")
    pt_model(repo, "kind_model", script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT,
             extra="instance_group [ { kind: KIND_MODEL } ]")
    pt_model(repo, "named_file", script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT, head='backend: "pytorch"\n'
             '        default_model_filename: "net.pt"', filename="net.pt")
    write_model(repo, "accumulate", config="""
        platform: "pytorch_libtorch"
        max_batch_size: 4
        sequence_batching {
          direct { }
          control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "STATE__2" output_name: "STATE__1" data_type: TYPE_FP32 dims: [ 1 ]
                    initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" } } ]
        }
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """)
    save_module(repo / "accumulate", script(Accumulate()))
    # load failures
    pt_model(repo, "bad_out_index", script(Fails()), [FP32_VAR], ADD_SUB_OUT)
    pt_model(repo, "bad_in_count", script(Fails()), ADD_SUB_IN, [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    pt_model(repo, "bad_in_index", script(AddSub()), [FP32_VAR, ("INPUT__5", "TYPE_FP32", "[ -1 ]")], ADD_SUB_OUT)
    pt_model(repo, "bad_dtype", script(Fails()), [FP32_VAR], [("OUTPUT__0", "TYPE_UINT32", "[ -1 ]")])
    pt_model(repo, "bad_file", None, [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    (repo / "bad_file" / "1" / "model.pt").write_bytes(b"not TorchScript")
    pt_model(repo, "missing_file", None, [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    pt_model(repo, "bad_param", script(Fails()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")],
             extra='parameters { key: "INFERENCE_MODE" value: { string_value: "maybe" } }')
    pt_model(repo, "dict_out", script(DictOut()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")])
    save_module(repo / "no_config", script(Fails()))  # model.pt alone: detected, but never auto-completed
    pt_model(repo, "string_2d", script(Upper()), [("INPUT__0", "TYPE_STRING", "[ 2, 2 ]")],
             [("OUTPUT__0", "TYPE_STRING", "[ -1 ]")])
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if torch is None:
        pytest.skip(NO_TORCH)
    root = tmp_path_factory.mktemp("pytorch")
    repo = build_repository(root / "models")
    srv = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error=false", "--allow-client-shm=true"])
    srv.start(wait_ready=False)
    srv.wait_repository_loaded()
    yield srv
    srv.stop_cleanly()


def _input(proto: str, name: str, array: np.ndarray, datatype: str):
    inp = client_module(proto).InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _stats(srv: ServerProcess, model: str) -> dict:
    cl = httpclient.InferenceServerClient(srv.http_url)
    try:
        (entry,) = cl.get_inference_statistics(model)["model_stats"]
        return entry
    finally:
        cl.close()


# -- the pure logic (no torch needed) -------------------------------------------------------

def test_named_index():
    assert pt_backend.named_index("INPUT__0") == 0
    assert pt_backend.named_index("OUTPUT__12") == 12
    assert pt_backend.named_index("INPUT0") is None
    assert pt_backend.named_index("a__b__1") is None  # the index follows the first "__"
    assert pt_backend.named_index("INPUT__") is None


def test_options_and_their_defaults():
    assert pt_backend.parse_options("m", {}) == pt_backend.Options()
    opts = pt_backend.parse_options("m", {"parameters": {
        "INFERENCE_MODE": {"string_value": "False"}, "DISABLE_OPTIMIZED_EXECUTION": {"string_value": "on"},
        "INTER_OP_THREAD_COUNT": {"string_value": "2"}, "ENABLE_JIT_EXECUTOR": {"string_value": "0"}}})
    assert (opts.inference_mode, opts.optimized_execution, opts.inter_op_threads, opts.jit_executor,
            opts.jit_profiling) == (False, False, 2, False, None)
    with pytest.raises(InvalidArgument, match="failed to convert 'x' to an integer"):
        pt_backend.parse_options("m", {"parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "x"}}})


def _cfg(inputs, outputs, **extra):
    return {"input": [{"name": n, "data_type": "TYPE_FP32", "dims": [-1]} for n in inputs],
            "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [-1]} for n in outputs], **extra}


def test_io_plan_follows_the_naming_rules():
    sig = pt_backend.Signature((("a", "tensor"), ("b", "tensor")), outputs=2)
    plan = pt_backend.plan_io("m", _cfg(["b", "a"], ["y", "x"]), sig)
    assert plan.inputs == {"b": 1, "a": 0} and plan.outputs == {"y": 0, "x": 1}  # outputs by config order
    plan = pt_backend.plan_io("m", _cfg(["IN__1", "IN__0"], ["OUT__1", "OUT__0"]), sig)
    assert plan.inputs == {"IN__1": 1, "IN__0": 0} and plan.outputs == {"OUT__1": 1, "OUT__0": 0}
    plan = pt_backend.plan_io("m", _cfg(["p", "q"], ["OUT__0"]), sig)
    assert plan.inputs == {"p": 0, "q": 1}  # neither rule: config order
    seq = _cfg(["IN__0"], ["OUT__0"], sequence_batching={"control_input": [{"name": "START__1"}]})
    assert pt_backend.plan_io("m", seq, sig).inputs == {"IN__0": 0, "START__1": 1}
    dict_plan = pt_backend.plan_io("m", _cfg(["A", "B"], ["OUT"]), pt_backend.Signature((("d", "dict"),), 1))
    assert dict_plan.dict_input and set(dict_plan.inputs) == {"A", "B"}


@pytest.mark.parametrize("config, sig, message", [
    (_cfg(["IN__0", "IN__0x"], ["OUT__0"]), pt_backend.Signature((("a", "tensor"),), 1),
     "configuration expects 2 inputs, model provides 1"),
    (_cfg(["A__0", "B__0"], ["OUT__0"]), pt_backend.Signature((("a", "tensor"), ("b", "tensor")), 1),
     "inputs 'A__0' and 'B__0' both name forward() argument 0"),
    (_cfg(["x"], ["OUT__2"]), pt_backend.Signature((("x", "tensor"),), 2),
     "the output OUT__2 in the model configuration refers to an output index which doesn't exist"),
    (_cfg(["x"], ["y"]), pt_backend.Signature((("x", "int"),), 1),
     "an input of type 'int' (forward() argument 'x') was detected in the model"),
])
def test_io_plan_refuses(config, sig, message):
    with pytest.raises(InvalidArgument) as info:
        pt_backend.plan_io("m", config, sig)
    assert message in info.value.message


# -- without PyTorch -----------------------------------------------------------------------

def _load_fails_clearly(tmp_path: Path, env: dict[str, str] | None = None) -> None:
    repo = tmp_path / "models"
    python_identity(repo, "identity_fp32", "FP32")
    write_model(repo, "pt", config=f"""
        platform: "pytorch_libtorch"
        {tensors("input", FP32_VAR)}
        {tensors("output", ("OUTPUT__0", "TYPE_FP32", "[ -1 ]"))}
        """)
    (repo / "pt" / "1" / "model.pt").write_bytes(b"\0" * 64)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--exit-on-error=false"], env=env)
    srv.start(wait_ready=False)
    try:
        srv.wait_repository_loaded()
        cl = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in cl.get_model_repository_index()}
        cl.close()
        assert index["pt"]["state"] == "UNAVAILABLE", index["pt"]
        assert "the pytorch backend needs PyTorch (pip install 'triton-shm[pytorch]')" in index["pt"]["reason"]
        assert "Traceback" not in srv.log()
        assert_serving(srv)
    finally:
        srv.stop_cleanly()


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed here")
def test_without_pytorch_a_model_fails_to_load_clearly(tmp_path):
    _load_fails_clearly(tmp_path)


def test_with_pytorch_hidden_a_model_fails_to_load_clearly(tmp_path):
    """The same where torch is installed: a ``torch`` package that fails to import comes
    first on the server's path."""
    fake = tmp_path / "hide" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch' (hidden by the test)\")\n")
    path = os.pathsep.join(p for p in [str(tmp_path / "hide"), os.environ.get("PYTHONPATH", "")] if p)
    _load_fails_clearly(tmp_path, env={"PYTHONPATH": path})


# -- serving -------------------------------------------------------------------------------

@needs_torch
def test_index_naming_and_several_outputs(proto, client):
    a = np.arange(6, dtype=np.float32).reshape(1, 6)
    b = np.full((1, 6), 2, dtype=np.float32)
    result = client.infer("add_sub", [_input(proto, "INPUT__0", a, "FP32"), _input(proto, "INPUT__1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    # one output asked for
    out = client_module(proto).InferRequestedOutput("OUTPUT__1")
    result = client.infer("add_sub_nobatch", [_input(proto, "INPUT__0", a[0], "FP32"),
                                              _input(proto, "INPUT__1", b[0], "FP32")], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a[0] - b[0])


@needs_torch
def test_argument_naming(proto, client):
    x, y = np.array([1, 2, 3], dtype=np.int32), np.array([4, 5, 6], dtype=np.int32)
    result = client.infer("by_arg", [_input(proto, "x", x, "INT32"), _input(proto, "y", y, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("product"), x * 10 + y)


@needs_torch
def test_dtype_mix_by_output_index(proto, client):
    f = np.array([[1.5, -2.0]], dtype=np.float32)
    i = np.array([[2**40, -1]], dtype=np.int64)
    h = np.array([[0.5, 3.0]], dtype=np.float16)
    b = np.array([[True, False]])
    result = client.infer("mix", [_input(proto, "INPUT__0", f, "FP32"), _input(proto, "INPUT__1", i, "INT64"),
                                  _input(proto, "INPUT__2", h, "FP16"), _input(proto, "INPUT__3", b, "BOOL")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), f * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), i + 1)
    got_h = result.as_numpy("OUTPUT__2")
    assert got_h.dtype == np.float16
    np.testing.assert_array_equal(got_h, h * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__3"), ~b)


@needs_torch
def test_dict_input_traced_model_and_strings(proto, client):
    a, b = np.array([5.0, 7.0]), np.array([1.0, 10.0])
    result = client.infer("dict_in", [_input(proto, "A", a, "FP64"), _input(proto, "B", b, "FP64")])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("traced", [_input(proto, "INPUT__0", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), x @ np.arange(6, dtype=np.float32).reshape(3, 2) + 1)
    words = np.array([b"hello", "h\u00e9".encode(), b""], dtype=np.object_)
    result = client.infer("upper", [_input(proto, "INPUT__0", words, "BYTES")])
    # TorchScript's upper() is ASCII only
    assert result.as_numpy("OUTPUT__0").tolist() == [b"HELLO", "H\u00e9".encode(), b""]


@needs_torch
@pytest.mark.parametrize("width", [1, 5, 300])
def test_variable_dims(proto, client, width):
    rows = 1 + width % 3
    a = np.random.default_rng(width).standard_normal((rows, width)).astype(np.float32)
    result = client.infer("add_sub", [_input(proto, "INPUT__0", a, "FP32"), _input(proto, "INPUT__1", a, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), a * 2)
    assert result.as_numpy("OUTPUT__1").shape == (rows, width)


@needs_torch
def test_parameters_weight_sharing_kind_model_and_file_name(proto, client):
    a, b = np.array([[3.0, 4.0]], dtype=np.float32), np.array([[1.0, 1.0]], dtype=np.float32)
    for model in ("params", "kind_model", "named_file"):
        ins = [_input(proto, "INPUT__0", a[0], "FP32"), _input(proto, "INPUT__1", b[0], "FP32")]
        result = client.infer(model, ins)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a[0] + b[0])
    config = client.get_model_config("named_file") if proto == "http" else \
        client.get_model_config("named_file", as_json=True)["config"]
    assert (config["backend"], config["platform"], config["default_model_filename"]) == (
        "pytorch", "pytorch_libtorch", "net.pt")


@needs_torch
def test_dynamic_batching_runs_one_forward_per_batch(proto, server):
    sizes = [1, 2, 1, 3, 1]
    rng = np.random.default_rng(7)
    pairs = [(rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32))
             for n in sizes]
    before = _stats(server, "add_sub")
    mod = aiogrpc if proto == "grpc" else aiohttp_client

    async def one(cl, a, b):
        ins = [mod.InferInput("INPUT__0", list(a.shape), "FP32"), mod.InferInput("INPUT__1", list(b.shape), "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        r = await cl.infer("add_sub", ins)
        return r.as_numpy("OUTPUT__0"), r.as_numpy("OUTPUT__1")

    async def go():
        cl = mod.InferenceServerClient(server.grpc_url if proto == "grpc" else server.http_url)
        try:
            return await asyncio.gather(*(one(cl, a, b) for a, b in pairs))
        finally:
            await cl.close()
    results = asyncio.run(go())
    for (a, b), (add, sub) in zip(pairs, results):
        np.testing.assert_allclose(add, a + b, rtol=1e-6)
        np.testing.assert_allclose(sub, a - b, rtol=1e-6)
    after = _stats(server, "add_sub")
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert after["execution_count"] - before["execution_count"] < len(sizes)


@needs_torch
def test_sequence_batching_with_control_and_state(proto, client):
    seq = 41 if proto == "http" else 42
    totals = []
    for k, value in enumerate([1.0, 2.0, 3.5]):
        x = np.array([[value]], dtype=np.float32)
        result = client.infer("accumulate", [_input(proto, "INPUT__0", x, "FP32")], sequence_id=seq,
                              sequence_start=k == 0, sequence_end=k == 2)
        totals.append(float(result.as_numpy("OUTPUT__0")[0, 0]))
    assert totals == [1.0, 3.0, 6.5]


@needs_torch
@pytest.mark.parametrize("model", sorted(LOAD_FAILURES))
def test_config_errors_fail_the_load_clearly(server, model):
    cl = httpclient.InferenceServerClient(server.http_url)
    try:
        index = {m["name"]: m for m in cl.get_model_repository_index()}
    finally:
        cl.close()
    entry = index[model]
    assert entry["state"] == "UNAVAILABLE", entry
    assert LOAD_FAILURES[model] in entry["reason"], entry["reason"]


@needs_torch
def test_runtime_errors_fail_the_request_not_the_server(proto, client, server):
    workers = children(server.proc.pid)
    x = np.array([1.0, -5.0], dtype=np.float32)
    expect_error(proto, lambda: client.infer("fails", [_input(proto, "INPUT__0", x, "FP32")]), "INTERNAL",
                 "PyTorch execute failure", "negative input")
    ok = np.array([1.0, 5.0], dtype=np.float32)
    np.testing.assert_array_equal(client.infer("fails", [_input(proto, "INPUT__0", ok, "FP32")])
                                  .as_numpy("OUTPUT__0"), ok)
    expect_error(proto, lambda: client.infer("wrong_type", [_input(proto, "INPUT__0", ok, "FP32")]),
                 "INVALID_ARGUMENT", "configuration expects datatype TYPE_FP32 for output 'OUTPUT__0', model "
                 "provides TYPE_INT64")
    assert_serving(server, workers=workers)


@needs_torch
@pytest.mark.parametrize("model, expected", [("add_sub_nobatch", None), ("mutates", 1.0)])
def test_system_shm_inputs_are_never_written(proto, client, regions, model, expected):
    """Inputs in a client's region are lent to the model in place; one whose graph writes
    a tensor in place gets a copy: the client's memory keeps its values either way."""
    n = 256
    x = np.arange(n, dtype=np.float32)
    handle, name, key = regions.create(x.nbytes, "pt")
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory(name, key, x.nbytes)
    try:
        mod = client_module(proto)
        inputs = []
        for i in range(2 if model == "add_sub_nobatch" else 1):
            inp = mod.InferInput(f"INPUT__{i}", [n], "FP32")
            inp.set_shared_memory(name, x.nbytes)
            inputs.append(inp)
        result = client.infer(model, inputs)
        want = x * 2 if expected is None else x + expected
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), want)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [n]), x)
    finally:
        client.unregister_system_shared_memory(name)


# -- GPU -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    if _gpu_missing() is not None:
        pytest.skip(_gpu_missing())
    root = tmp_path_factory.mktemp("pytorch_gpu")
    repo = root / "models"
    python_identity(repo, "identity_fp32", "FP32")
    gpu = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
    pt_model(repo, "gpu_add_sub", torch.jit.script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT, max_batch_size=8,
             extra=gpu + "\ndynamic_batching { max_queue_delay_microseconds: 300000 }")
    pt_model(repo, "gpu_add_sub_nobatch", torch.jit.script(AddSub()), ADD_SUB_IN, ADD_SUB_OUT, extra=gpu)
    pt_model(repo, "gpu_mutates", torch.jit.script(Mutates()), [FP32_VAR], [("OUTPUT__0", "TYPE_FP32", "[ -1 ]")],
             extra=gpu)
    pt_model(repo, "gpu_mix", torch.jit.script(Mix()),
             [("INPUT__0", "TYPE_FP32", "[ 2 ]"), ("INPUT__1", "TYPE_INT64", "[ 2 ]"),
              ("INPUT__2", "TYPE_FP16", "[ 2 ]"), ("INPUT__3", "TYPE_BOOL", "[ 2 ]")],
             [("OUTPUT__0", "TYPE_FP32", "[ 2 ]"), ("OUTPUT__1", "TYPE_INT64", "[ 2 ]"),
              ("OUTPUT__2", "TYPE_FP16", "[ 2 ]"), ("OUTPUT__3", "TYPE_BOOL", "[ 2 ]")], max_batch_size=4,
             extra=gpu)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true", "--gpus", "0"]).start()
    yield srv
    srv.stop_cleanly()


def _output_shape(result, name: str) -> list[int]:
    """An output's shape from the response (for one placed in shared memory, whose data
    the result does not carry: tritonclient's ``as_numpy`` raises KeyError for it)."""
    out = result.get_output(name)
    assert out is not None, name
    return [int(d) for d in (out["shape"] if isinstance(out, dict) else out.shape)]


def _cuda_add_sub(proto, cl, model: str, a: np.ndarray, b: np.ndarray, tag: str, *, inputs_on_device: bool = True,
                  outputs_on_device: bool = True) -> tuple[np.ndarray, np.ndarray]:
    mod = client_module(proto)
    regions: list[str] = []
    out_bufs = []
    try:
        ins = []
        for i, arr in enumerate((a, b)):
            inp = mod.InferInput(f"INPUT__{i}", list(arr.shape), "FP32")
            if inputs_on_device:
                buf = DeviceBuffer(arr.nbytes)
                buf.put(arr)
                cl.register_cuda_shared_memory(f"{tag}_in{i}", buf.raw_handle, 0, arr.nbytes)
                regions.append(f"{tag}_in{i}")
                inp.set_shared_memory(f"{tag}_in{i}", arr.nbytes)
                out_bufs.append(buf)  # kept alive until the request is answered
            else:
                inp.set_data_from_numpy(arr)
            ins.append(inp)
        outs, dev = [], []
        for j in range(2):
            out = mod.InferRequestedOutput(f"OUTPUT__{j}")
            if outputs_on_device:
                buf = DeviceBuffer(a.nbytes)
                cl.register_cuda_shared_memory(f"{tag}_out{j}", buf.raw_handle, 0, a.nbytes)
                regions.append(f"{tag}_out{j}")
                out.set_shared_memory(f"{tag}_out{j}", a.nbytes)
                dev.append(buf)
            outs.append(out)
        result = cl.infer(model, ins, outputs=outs)
        if outputs_on_device:
            for j in range(2):
                assert _output_shape(result, f"OUTPUT__{j}") == list(a.shape)
            got = tuple(buf.get(np.float32, a.size).reshape(a.shape) for buf in dev)
        else:
            got = (result.as_numpy("OUTPUT__0"), result.as_numpy("OUTPUT__1"))
        if inputs_on_device:  # the client's input buffers keep their values
            np.testing.assert_array_equal(out_bufs[0].get(np.float32, a.size).reshape(a.shape), a)
        return got[0], got[1]
    finally:
        for r in regions:
            cl.unregister_cuda_shared_memory(r)


@needs_gpu
@pytest.mark.parametrize("inputs_on_device, outputs_on_device", [(True, True), (True, False), (False, True)])
def test_gpu_cuda_shared_memory_through_a_torch_model(proto, gpu_server, inputs_on_device, outputs_on_device):
    cl = connect(gpu_server, proto)
    try:
        a = np.arange(2048, dtype=np.float32)
        b = np.full(2048, 0.5, dtype=np.float32)
        tag = f"pt_{proto}_{int(inputs_on_device)}{int(outputs_on_device)}"
        add, sub = _cuda_add_sub(proto, cl, "gpu_add_sub_nobatch", a, b, tag, inputs_on_device=inputs_on_device,
                                 outputs_on_device=outputs_on_device)
        np.testing.assert_array_equal(add, a + b)
        np.testing.assert_array_equal(sub, a - b)
    finally:
        cl.close()


@needs_gpu
def test_gpu_host_tensors_and_dtype_mix(proto, gpu_server):
    cl = connect(gpu_server, proto)
    try:
        f = np.array([[1.5, -2.0]], dtype=np.float32)
        i = np.array([[2**40, -1]], dtype=np.int64)
        h = np.array([[0.5, 3.0]], dtype=np.float16)
        b = np.array([[True, False]])
        result = cl.infer("gpu_mix", [_input(proto, "INPUT__0", f, "FP32"), _input(proto, "INPUT__1", i, "INT64"),
                                      _input(proto, "INPUT__2", h, "FP16"), _input(proto, "INPUT__3", b, "BOOL")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), f * 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), i + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__2"), h * 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__3"), ~b)
    finally:
        cl.close()


@needs_gpu
def test_gpu_model_that_writes_its_input_leaves_the_client_buffer(proto, gpu_server):
    cl = connect(gpu_server, proto)
    x = np.arange(512, dtype=np.float32)
    buf = DeviceBuffer(x.nbytes)
    buf.put(x)
    region = f"pt_mut_{proto}"
    cl.register_cuda_shared_memory(region, buf.raw_handle, 0, x.nbytes)
    try:
        inp = client_module(proto).InferInput("INPUT__0", [x.size], "FP32")
        inp.set_shared_memory(region, x.nbytes)
        np.testing.assert_array_equal(cl.infer("gpu_mutates", [inp]).as_numpy("OUTPUT__0"), x + 1)
        np.testing.assert_array_equal(buf.get(np.float32, x.size), x)
    finally:
        cl.unregister_cuda_shared_memory(region)
        cl.close()


@needs_gpu
def test_gpu_dynamic_batching_with_cuda_shared_memory(proto, gpu_server):
    """Concurrent requests whose inputs and outputs lie in CUDA shared memory run as one
    forward over their joined rows."""
    before = _stats(gpu_server, "gpu_add_sub")
    sizes = [1, 2, 1, 2]
    rng = np.random.default_rng(3)
    pairs = [(rng.standard_normal((n, 64)).astype(np.float32), rng.standard_normal((n, 64)).astype(np.float32))
             for n in sizes]

    def one(k: int):
        cl = connect(gpu_server, proto)
        try:
            a, b = pairs[k]
            return _cuda_add_sub(proto, cl, "gpu_add_sub", a, b, f"ptb_{proto}_{k}")
        finally:
            cl.close()
    with concurrent.futures.ThreadPoolExecutor(len(pairs)) as pool:
        results = list(pool.map(one, range(len(pairs))))
    for (a, b), (add, sub) in zip(pairs, results):
        np.testing.assert_allclose(add, a + b, rtol=1e-6)
        np.testing.assert_allclose(sub, a - b, rtol=1e-6)
    after = _stats(gpu_server, "gpu_add_sub")
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert after["execution_count"] - before["execution_count"] < len(sizes)


@needs_gpu
def test_gpu_with_tritonclient_cuda_shared_memory(proto, gpu_server):
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as e:  # noqa: BLE001 - it needs cuda-python, not always installed
        pytest.skip(f"tritonclient.utils.cuda_shared_memory does not import: {e}")
    a = np.arange(256, dtype=np.float32)
    nbytes = a.nbytes
    handles = {n: cudashm.create_shared_memory_region(f"ptc_{proto}_{n}", nbytes, 0) for n in ("in", "out")}
    cl = connect(gpu_server, proto)
    try:
        cudashm.set_shared_memory_region(handles["in"], [a])
        for n, h in handles.items():
            cl.register_cuda_shared_memory(f"ptc_{proto}_{n}", cudashm.get_raw_handle(h), 0, nbytes)
        mod = client_module(proto)
        ins = []
        for i in range(2):
            inp = mod.InferInput(f"INPUT__{i}", [a.size], "FP32")
            inp.set_shared_memory(f"ptc_{proto}_in", nbytes)
            ins.append(inp)
        out = mod.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory(f"ptc_{proto}_out", nbytes)
        result = cl.infer("gpu_add_sub_nobatch", ins, outputs=[out])
        assert _output_shape(result, "OUTPUT__0") == [a.size]
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(handles["out"], np.float32, [a.size]), a * 2)
    finally:
        for n in handles:
            try:
                cl.unregister_cuda_shared_memory(f"ptc_{proto}_{n}")
            except Exception:  # noqa: BLE001 - registration may have failed
                pass
        cl.close()
        for h in handles.values():
            cudashm.destroy_shared_memory_region(h)
