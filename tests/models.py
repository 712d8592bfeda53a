"""Models the tests build: ONNX graphs made with the onnx helper, Python models written
to temporary repositories. Nothing is downloaded."""
from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING, "BF16": TensorProto.BFLOAT16,
}


def save_onnx(graph, path: Path, opset: int = 13) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def onnx_add_sub(path: Path, dims=("batch", 16), datatype: str = "FP32") -> None:
    t = ONNX_TYPES[datatype]
    io = lambda n: helper.make_tensor_value_info(n, t, list(dims))  # noqa: E731
    save_onnx(helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub", [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")]), path)


def onnx_identity(path: Path, datatype: str, dims=("batch", "n")) -> None:
    t = ONNX_TYPES[datatype]
    save_onnx(helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", t, list(dims))],
        [helper.make_tensor_value_info("OUTPUT0", t, list(dims))]), path)


def write_model(repo: Path, name: str, *, config: str | None = None, model_py: str | None = None,
                version: int = 1) -> Path:
    """A model folder with an optional config.pbtxt and model.py (dedented)."""
    model_dir = repo / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    if model_py is not None:
        (model_dir / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return model_dir


def in_shared_worker(model_dir: Path) -> Path:
    """A Python model's instances as threads of the shared CPU worker (PROCESS_PER_INSTANCE
    "no"), for tests of that worker itself: its crashes, its inline executions."""
    config = model_dir / "config.pbtxt"
    param = 'parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } }'
    config.write_text(f"{config.read_text()}\n{param}\n")
    return model_dir


IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        self.outputs = [o["name"] for o in json.loads(args["model_config"])["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = [pb_utils.Tensor(out, t.as_numpy())
                       for out, t in zip(self.outputs, request.inputs())]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""


def python_identity(repo: Path, name: str, datatype: str, dims: str = "[ -1 ]", max_batch_size: int = 0) -> None:
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: {config_type} dims: {dims} }} ]
        output [ {{ name: "OUTPUT0" data_type: {config_type} dims: {dims} }} ]
        """, model_py=IDENTITY_PY)


# A BLS model: calls ``callee`` (FP32 [-1] INPUT0 -> OUTPUT0) twice, with
# trace=request.trace() (traced as its child) and without (not traced), and answers the
# first call's output and ``request.trace().get_context()`` ("none" for None) as CONTEXT.
BLS_TRACED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

CALLEE = {callee!r}

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outputs = []
            for trace in (request.trace(), None):
                call = pb_utils.InferenceRequest(model_name=CALLEE, inputs=[pb_utils.Tensor("INPUT0", x)],
                                                 requested_output_names=["OUTPUT0"], trace=trace)
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                outputs.append(pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy())
            context = request.trace().get_context() or "none"
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", outputs[0]),
                pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=np.object_))]))
        return responses
"""


def python_bls_traced(repo: Path, name: str, callee: str) -> None:
    write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
                 {{ name: "CONTEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        """, model_py=BLS_TRACED_PY.format(callee=callee))


# A Python model that reports what reached it: request.parameters(), the requested
# output names and the request id.
ECHO_CONFIG = """
    name: "echo"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [
      { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "REQUESTED" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "REQUEST_ID" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    """

ECHO_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            if not isinstance(params, str):
                params = json.dumps(params)
            names = sorted(request.requested_output_names())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PARAMS", np.array([params.encode()], dtype=np.object_)),
                pb_utils.Tensor("REQUESTED", np.array([json.dumps(names).encode()], dtype=np.object_)),
                pb_utils.Tensor("REQUEST_ID", np.array([request.request_id().encode()], dtype=np.object_)),
            ]))
        return responses
"""


def add_sub_onnx_model(repo: Path) -> None:
    """``add_sub``: the ONNX add/sub model over FP32[16] inputs with max_batch_size 8."""
    onnx_add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text(
        'name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')


# A sequence model (``sequence_batching``): accumulates INPUT into its implicit state and
# reports what the sequence batcher gave it: the control values, the correlation ID, and
# where the request ran (instance, row in the batch, batch size, null requests in the batch)
# and the request's flags() and correlation_id().
SEQUENCE_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.batched = json.loads(args["model_config"]).get("max_batch_size", 0) > 0

    def execute(self, requests):
        delays = [json.loads(r.parameters() or "{}").get("delay_ms", 0) for r in requests]
        if max(delays):
            time.sleep(max(delays) / 1000)
        nulls = sum(1 for r in requests if not _value(r, "READY"))
        shape = [1, 1] if self.batched else [1]
        responses = []
        for row, r in enumerate(requests):
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().astype(np.int32)
            state = pb_utils.get_input_tensor_by_name(r, "INPUT_STATE")
            total = x + (state.as_numpy() if state is not None else 0)
            corrid = _value(r, "CORRID")
            corrid = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            control = [float(_value(r, n)) for n in ("START", "END", "READY")]
            where = f"{self.instance}:{row}:{len(requests)}:{nulls}:{r.flags()}:{r.correlation_id()}"
            outputs = [pb_utils.Tensor("OUTPUT", total.astype(np.int32)),
                       pb_utils.Tensor("CONTROL", np.array(control, dtype=np.float32).reshape(shape[:-1] + [3])),
                       pb_utils.Tensor("CORRID_OUT", np.array([corrid], dtype=object).reshape(shape)),
                       pb_utils.Tensor("WHERE", np.array([where], dtype=object).reshape(shape))]
            if state is not None and json.loads(r.parameters() or "{}").get("keep_state", True):
                outputs.append(pb_utils.Tensor("OUTPUT_STATE", total.astype(np.int32)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def sequence_model(repo: Path, name: str, *, max_batch_size: int = 4, strategy: str = "direct { }",
                   corrid_type: str = "TYPE_UINT64", idle_us: int = 5_000_000, instances: int = 1,
                   state: bool = True) -> Path:
    """A python sequence model (SEQUENCE_PY): START as FP32 0/1, END as BOOL, READY as
    INT32 0/1, CORRID of ``corrid_type``, and an INT32 state INPUT_STATE/OUTPUT_STATE."""
    dims = "[ 1 ]"
    state_cfg = f"""
          state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: {dims}
                    initial_state: {{ data_type: TYPE_INT32 dims: {dims} zero_data: true name: "zero" }} }} ]""" \
        if state else ""
    return write_model(repo, name, model_py=SEQUENCE_PY, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        sequence_batching {{
          {strategy}
          max_sequence_idle_microseconds: {idle_us}
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] }} ] }},
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
          ]{state_cfg}
        }}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: {dims} }} ]
        output [
          {{ name: "OUTPUT" data_type: TYPE_INT32 dims: {dims} }},
          {{ name: "CONTROL" data_type: TYPE_FP32 dims: [ 3 ] }},
          {{ name: "CORRID_OUT" data_type: TYPE_STRING dims: {dims} }},
          {{ name: "WHERE" data_type: TYPE_STRING dims: {dims} }}
        ]
        instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
        """)
