"""ONNX Runtime backend: CPU execution provider on KIND_CPU instances, CUDA on KIND_GPU.

A KIND_GPU instance runs with IOBinding: host inputs are bound as CPU inputs (ONNX Runtime
copies each to the device once), CUDA inputs by their device address, and outputs are
bound on the device and handed back as CuPy arrays over ONNX Runtime's buffers (a CUDA
shared-memory output is then written device to device, any other one copied to the host
once). Which providers and which bindings a request gets are pure functions
(``execution_providers``, ``plan_binding``).
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.data.datatypes import numpy_dtype
from ..errors import Internal, InvalidArgument, TritonShmError, Unavailable
from .base import Backend, InstanceSpec, ModelContext, ModelInstance, WorkerRequest, WorkerResponse

log = logging.getLogger("triton_shm.backends.onnxruntime")

DEFAULT_MAX_BATCH_SIZE = 4  # what Triton's ORT auto-complete picks for a batchable model

# ONNX tensor type strings -> model-config types.
_ORT_TO_CONFIG = {
    "tensor(bool)": "TYPE_BOOL", "tensor(uint8)": "TYPE_UINT8", "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64", "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16", "tensor(int32)": "TYPE_INT32", "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16", "tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16",
}
_NUMPY_OF_ORT = {ort: numpy_dtype(cfg.removeprefix("TYPE_")) for ort, cfg in _ORT_TO_CONFIG.items()
                 if cfg not in ("TYPE_STRING", "TYPE_BF16")}


def _import_ort():
    try:
        import onnxruntime
    except ImportError as e:  # pragma: no cover - a dependency, but say so clearly
        raise Unavailable(f"the onnxruntime backend needs the 'onnxruntime' package: {e}") from None
    return onnxruntime


def _model_path(context: ModelContext):
    path = context.version_dir / (context.default_model_filename or "model.onnx")
    if not path.is_file():
        raise InvalidArgument(f"model '{context.name}' version {context.version}: model file '{path.name}' "
                              "not found")
    return path


def _session(context: ModelContext, providers: list) -> Any:
    ort = _import_ort()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(_model_path(context)), sess_options=options, providers=providers)
    except Exception as e:  # noqa: BLE001 - a corrupt or unsupported model file, in ORT's words
        raise InvalidArgument(f"failed to load model '{context.name}' version {context.version} with "
                              f"onnxruntime: {e}") from None


def _io(args) -> list[tuple[str, str, list[int]]]:
    out = []
    for a in args:
        dtype = _ORT_TO_CONFIG.get(a.type)
        if dtype is None:
            raise InvalidArgument(f"ONNX tensor '{a.name}' has unsupported type {a.type}")
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in (a.shape or [])]
        out.append((a.name, dtype, dims))
    return out


def _complete_max_batch(model: str, config: dict[str, Any], tensors: list[tuple[str, str, list[int]]]) -> None:
    """Batching needs a variable first dim on every tensor; without one the model cannot
    batch and any max_batch_size in the config is an error."""
    batchable = all(dims and dims[0] == -1 for _, _, dims in tensors)
    max_batch = int(config.get("max_batch_size", 0) or 0)
    if not batchable:
        if max_batch != 0:
            raise InvalidArgument(f"autofill failed for model '{model}': model does not support batching "
                                  "while non-zero max_batch_size is specified")
        return
    if max_batch == 0:
        max_batch = config["max_batch_size"] = DEFAULT_MAX_BATCH_SIZE
    if max_batch > 1 and "dynamic_batching" not in config and "sequence_batching" not in config:
        config["dynamic_batching"] = {}


def _completed_tensor(name: str, dtype: str, dims: list[int], max_batch: int) -> dict[str, Any]:
    """A config entry for a model tensor. A scalar (per batch row, when batching) is
    ``dims: [1]``, with an empty reshape so the model still gets its own rank; without
    batching a 0-d tensor stays ``dims: [1]`` and the instance reshapes it."""
    entry: dict[str, Any] = {"name": name, "data_type": dtype, "dims": dims[1:] if max_batch > 0 else dims}
    if not entry["dims"]:
        entry["dims"] = [1]
        if max_batch > 0:
            entry["reshape"] = {"shape": []}
    return entry


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    concat_batching = True
    reads_inputs_in_place = True  # it reads its inputs only
    takes_device_inputs = True  # CUDA shared-memory inputs are bound where they lie

    @staticmethod
    def auto_complete(context: ModelContext) -> dict[str, Any]:
        config = copy.deepcopy(context.config)
        session = _session(context, ["CPUExecutionProvider"])
        inputs, outputs = _io(session.get_inputs()), _io(session.get_outputs())
        # As Triton's: a list the config gives (even one naming only some of the model's
        # tensors) is left as it is; only an empty one is completed, whole.
        listed = {"input": bool(config.get("input") or config.get("batch_input")), "output": bool(config.get("output"))}
        if not (listed["input"] and listed["output"]):
            _complete_max_batch(context.name, config, inputs + outputs)
        max_batch = int(config.get("max_batch_size", 0) or 0)
        for key, tensors in (("input", inputs), ("output", outputs)):
            if not listed[key]:
                config[key] = [_completed_tensor(name, dtype, dims, max_batch) for name, dtype, dims in tensors]
            config.setdefault(key, [])  # a graph of constants has no inputs
        known = {n for n, _, _ in inputs}
        for t in config.get("input") or []:
            if t.get("name") not in known:
                raise InvalidArgument(f"model '{context.name}': config input '{t.get('name')}' is not an "
                                      f"input of the ONNX model (it has {sorted(known)})")
        return config

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        providers = execution_providers(spec, self.context.name, _import_ort().get_available_providers())
        session = _session(self.context, providers)
        check_input_count(self.context.name, self.context.config, len(session.get_inputs()))
        return OnnxRuntimeInstance(self.context, session, gpu=spec.kind == "KIND_GPU")


def check_input_count(model: str, config: dict[str, Any], provided: int) -> None:
    """As Triton's ONNX Runtime backend: the model's inputs are exactly those the config
    feeds it (its required inputs, batch inputs, sequence controls and states); a config
    naming only some of them is refused at load, not at the first request."""
    sequence = config.get("sequence_batching") or {}
    expected = (sum(not t.get("optional") for t in config.get("input") or []) + len(config.get("batch_input") or [])
                + len(sequence.get("control_input") or []) + len(sequence.get("state") or []))
    if expected != provided:
        raise InvalidArgument(f"unable to load model '{model}', configuration expects {expected} inputs, "
                              f"model provides {provided}")


def execution_providers(spec: InstanceSpec, model: str, available: list[str]) -> list:
    """The providers of an instance: CUDA (ordinal 0: each GPU worker sees only its own
    device) then CPU for KIND_GPU, CPU alone otherwise."""
    if spec.kind != "KIND_GPU":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise Unavailable(f"instance '{spec.name}' of model '{model}' is KIND_GPU, but this "
                          "onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)")
    return [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]


@dataclass(frozen=True)
class BindStep:
    """One IOBinding call: ``cpu_input`` (a host array), ``device_input`` (a CUDA
    buffer: address, numpy dtype, shape) or ``device_output``."""
    kind: str
    name: str
    array: Any = None
    ptr: int = 0
    dtype: Any = None
    shape: tuple[int, ...] = ()


def plan_binding(feed: dict[str, Any], outputs: list[str], string_outputs: set[str]) -> list[BindStep] | None:
    """The bindings of one request on a CUDA instance, or None where IOBinding cannot
    carry it (strings live on the host: the request runs with ``session.run``)."""
    if string_outputs.intersection(outputs):
        return None
    steps = []
    for name, array in feed.items():
        cai = getattr(array, "__cuda_array_interface__", None)
        if cai is not None:
            steps.append(BindStep("device_input", name, array, int(cai["data"][0]), np.dtype(cai["typestr"]),
                                  tuple(cai["shape"])))
        elif array.dtype == np.object_:
            return None
        else:
            steps.append(BindStep("cpu_input", name, np.ascontiguousarray(array)))
    steps += [BindStep("device_output", name) for name in outputs]
    return steps


def _apply(binding: Any, steps: list[BindStep]) -> None:
    for s in steps:
        if s.kind == "cpu_input":
            binding.bind_cpu_input(s.name, s.array)
        elif s.kind == "device_input":
            binding.bind_input(s.name, "cuda", 0, s.dtype, list(s.shape), s.ptr)
        else:
            binding.bind_output(s.name, "cuda", 0)


def _device_output(value: Any) -> Any:
    """An OrtValue on the device as a CuPy array over its buffer (kept alive by it); with
    no CuPy in this worker, copied to the host."""
    from ..worker import cuda
    try:
        cp = cuda.cupy()
    except TritonShmError:
        return value.numpy()
    dtype = _NUMPY_OF_ORT[value.data_type()]
    shape = tuple(value.shape())
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    memory = cp.cuda.UnownedMemory(value.data_ptr(), nbytes, value)
    return cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(memory, 0))


def _scalar_output_shapes(config: dict[str, Any], names: set[str]) -> dict[str, list[int]]:
    """The shape a 0-d model output takes: its reshape (what the model side is), else its dims."""
    shapes = {}
    for entry in config.get("output") or []:
        if entry.get("name") in names:
            reshape = entry.get("reshape")
            shapes[entry["name"]] = list(reshape.get("shape") or []) if reshape is not None else list(entry["dims"])
    return shapes


class OnnxRuntimeInstance(ModelInstance):
    def __init__(self, context: ModelContext, session, gpu: bool = False):
        self.context = context
        self.session = session
        self.gpu = gpu  # bind inputs and outputs (IOBinding) on the CUDA provider
        self.string_outputs = {o.name for o in session.get_outputs() if o.type == "tensor(string)"}
        self.output_names = [o.name for o in session.get_outputs()]
        # 0-d model tensors travel as the config's one-element shape (dims: [1])
        self.scalar_inputs = {i.name for i in session.get_inputs() if not i.shape}
        self.scalar_outputs = _scalar_output_shapes(context.config, {o.name for o in session.get_outputs()
                                                                     if not o.shape})

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return [self._run(r) for r in requests]

    def _run(self, request: WorkerRequest) -> WorkerResponse:
        feed = {}
        for name, array in request.inputs.items():
            if request.datatypes[name] == "BF16":
                raise InvalidArgument("BF16 tensors are not supported by the onnxruntime backend")
            if array.dtype == np.object_:  # ORT takes strings as str objects
                array = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array) \
                    if array.size else array
            if name in self.scalar_inputs and array.size == 1:
                array = array.reshape(())
            feed[name] = array
        names = request.requested_outputs or self.output_names
        steps = plan_binding(feed, names, self.string_outputs) if self.gpu else None
        try:
            if steps is not None:
                binding = self.session.io_binding()
                _apply(binding, steps)
                self.session.run_with_iobinding(binding)
                results = [_device_output(v) for v in binding.get_outputs()]
            else:
                results = self.session.run(names, feed)
        except Exception as e:  # noqa: BLE001 - ORT's own exception types; reported, not hidden
            # the request passed validation: a failure inside the runtime is INTERNAL, as in Triton
            raise Internal(f"onnxruntime failed to run model '{self.context.name}': {e}") from None
        outputs = {}
        for name, value in zip(names, results):
            if getattr(value, "dtype", None) == np.object_:
                value = np.vectorize(lambda s: s.encode("utf-8") if isinstance(s, str) else bytes(s),
                                     otypes=[object])(value) if value.size else value
            if value.ndim == 0 and name in self.scalar_outputs:
                value = value.reshape(self.scalar_outputs[name])
            outputs[name] = value
        return WorkerResponse(outputs=outputs)
