"""TensorRT backend (``platform: "tensorrt_plan"`` / ``backend: "tensorrt"``, ``model.plan``).

Runs in the worker of each GPU. The engine is deserialized with the ``tensorrt`` Python
API (imported on first use: a server without it says so, never with an ImportError
trace). Its I/O tensors and optimization profiles are read once into an
:class:`EngineDescription`, a plain description that the config completion and the
binding checks work on (pure functions, tested without a GPU). Each instance has its own
execution context, CUDA stream and optimization profile; a batch sets its input shapes
(``set_input_shape``), binds device buffers (``set_tensor_address``) and runs
``execute_async_v3`` on the instance's stream. Outputs stay on the GPU as CuPy arrays: a
CUDA shared-memory output gets them device to device, any other one copied to the host once.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..errors import Internal, InvalidArgument, Unsupported
from .base import Backend, InstanceSpec, ModelContext, ModelInstance, WorkerRequest, WorkerResponse

TENSORRT_MISSING = "the tensorrt backend needs a GPU and the TensorRT Python package (pip install tensorrt)"

# TensorRT DataType member names -> model-config types (what TensorRT has and Triton serves).
TRT_TO_CONFIG = {
    "FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8",
}


@dataclass(frozen=True)
class EngineTensor:
    name: str
    data_type: str             # a model-config type, "TYPE_FP32"
    shape: tuple[int, ...]     # the engine's shape, -1 where dynamic
    is_input: bool
    # inputs: per optimization profile, the (min, opt, max) shapes
    profiles: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class EngineDescription:
    tensors: tuple[EngineTensor, ...]
    num_profiles: int = 1

    @property
    def inputs(self) -> list[EngineTensor]:
        return [t for t in self.tensors if t.is_input]

    @property
    def outputs(self) -> list[EngineTensor]:
        return [t for t in self.tensors if not t.is_input]


# --------------------------------------------------------------------------- pure logic

def engine_max_batch(desc: EngineDescription) -> int:
    """The batch size the engine takes: 0 when some tensor has no dynamic first dimension
    (it cannot batch), else the smallest profile maximum of the inputs' first dimension."""
    if not desc.tensors or any(not t.shape or t.shape[0] != -1 for t in desc.tensors):
        return 0
    maxima = [mx[0] for t in desc.inputs for (_, _, mx) in t.profiles if mx]
    return min(maxima) if maxima else 0


def complete_config(model: str, config: dict[str, Any], desc: EngineDescription) -> dict[str, Any]:
    """The config completed from the engine, as Triton completes a plan's: max_batch_size
    from the profiles where the config has none, missing inputs and outputs from the
    engine's I/O tensors; what the config states is checked against the engine."""
    config = copy.deepcopy(config)
    engine_batch = engine_max_batch(desc)
    max_batch = int(config.get("max_batch_size", 0) or 0)
    if "max_batch_size" not in config or max_batch == 0 and not (config.get("input") or config.get("output")):
        max_batch = config["max_batch_size"] = engine_batch
    if max_batch > 0 and engine_batch == 0:
        raise InvalidArgument(f"unable to autofill for '{model}': model does not support batching while "
                              f"non-zero max_batch_size is specified")
    if max_batch > engine_batch > 0:
        raise InvalidArgument(f"unexpected configuration maximum batch size {max_batch} for '{model}', model "
                              f"maximum is {engine_batch}")
    if max_batch > 1 and "dynamic_batching" not in config and "sequence_batching" not in config:
        config["dynamic_batching"] = {}
    for key, tensors in (("input", desc.inputs), ("output", desc.outputs)):
        by_name = {t.name: t for t in tensors}
        entries = config.setdefault(key, [])
        for entry in entries:
            t = by_name.get(entry.get("name"))
            if t is None:
                raise InvalidArgument(f"unexpected {key} '{entry.get('name')}' in the configuration of "
                                      f"'{model}': the engine's {key}s are {sorted(by_name)}")
            if entry.get("data_type") and entry["data_type"] != t.data_type:
                raise InvalidArgument(f"unexpected datatype {entry['data_type']} for {key} '{t.name}' of "
                                      f"'{model}', the engine has {t.data_type}")
        present = {e.get("name") for e in entries}
        for t in tensors:
            if t.name not in present:
                dims = list(t.shape[1:] if max_batch > 0 else t.shape)
                entries.append({"name": t.name, "data_type": t.data_type, "dims": dims or [1]})
    return config


def select_profile(desc: EngineDescription, shapes: dict[str, list[int]], first: int = 0) -> int:
    """The first profile, from ``first`` on (an instance's own), whose ranges hold every
    input shape; InvalidArgument naming the ranges otherwise."""
    by_name = {t.name: t for t in desc.inputs}
    missing = sorted(set(by_name) - set(shapes))
    if missing:
        raise InvalidArgument(f"the engine needs input(s) {missing}")
    order = [*range(first, desc.num_profiles), *range(0, first)]
    for p in order:
        if all(_within(by_name[n].profiles[p], s) for n, s in shapes.items() if n in by_name
               and p < len(by_name[n].profiles)):
            return p
    ranges = {n: [list(r) for r in by_name[n].profiles[first]] for n in shapes if n in by_name
              and by_name[n].profiles}
    raise InvalidArgument(f"input shapes {shapes} lie outside every optimization profile of the engine "
                          f"(min/opt/max of profile {first}: {ranges})")


def _within(profile: tuple[tuple[int, ...], ...], shape: list[int]) -> bool:
    lo, _, hi = profile
    return len(shape) == len(lo) and all(a <= d <= b for a, d, b in zip(lo, shape, hi))


# --------------------------------------------------------------------------- TensorRT

def _trt() -> Any:
    try:
        import tensorrt
    except Exception as e:  # noqa: BLE001 - ImportError, or a TensorRT that finds no CUDA
        raise Unsupported(f"{TENSORRT_MISSING}: {type(e).__name__}: {e}") from None
    return tensorrt


def _engine(context: ModelContext) -> tuple[Any, Any]:
    trt = _trt()
    path = context.version_dir / (context.default_model_filename or "model.plan")
    if not path.is_file():
        raise InvalidArgument(f"model '{context.name}' version {context.version}: model file '{path.name}' "
                              "not found")
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:  # built by another TensorRT version, or for another GPU
        raise InvalidArgument(f"unable to create TensorRT engine for '{context.name}': the plan cannot be "
                              f"deserialized by TensorRT {trt.__version__} on this GPU (plans are tied to the "
                              "TensorRT version and the GPU they were built with)")
    return runtime, engine


def describe(engine: Any) -> EngineDescription:
    """An engine's I/O tensors and profiles, through the TensorRT 8.5+ tensor API."""
    trt = _trt()
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dtype = TRT_TO_CONFIG.get(engine.get_tensor_dtype(name).name)
        if dtype is None:
            raise InvalidArgument(f"TensorRT tensor '{name}' has unsupported type {engine.get_tensor_dtype(name)}")
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        profiles = tuple(_profile(engine.get_tensor_profile_shape(name, p))
                         for p in range(engine.num_optimization_profiles)) if is_input else ()
        tensors.append(EngineTensor(name, dtype, tuple(engine.get_tensor_shape(name)), is_input, profiles))
    return EngineDescription(tuple(tensors), engine.num_optimization_profiles)


def _profile(shapes: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(min, opt, max) shapes of an input in one optimization profile."""
    low, opt, high = shapes
    return tuple(low), tuple(opt), tuple(high)


class TensorRTBackend(Backend):
    name = "tensorrt"
    concat_batching = True
    reads_inputs_in_place = True  # it reads its inputs only
    takes_device_inputs = True  # CUDA shared-memory inputs are bound where they lie

    @staticmethod
    def auto_complete(context: ModelContext) -> dict[str, Any]:
        _, engine = _engine(context)
        return complete_config(context.name, context.config, describe(engine))

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self._runtime: Any = None
        self._engine: Any = None
        self._desc: EngineDescription | None = None
        self._instances = 0

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        if spec.kind != "KIND_GPU":
            raise InvalidArgument(f"instance '{spec.name}' of model '{self.context.name}': TensorRT models "
                                  "run on KIND_GPU instances only")
        desc = self._desc
        if self._engine is None or desc is None:
            self._runtime, self._engine = _engine(self.context)
            desc = self._desc = describe(self._engine)
        profile = self._instances % max(desc.num_profiles, 1)  # instances spread over profiles
        self._instances += 1
        return TensorRTInstance(self.context, self._engine, desc, profile)


class TensorRTInstance(ModelInstance):
    def __init__(self, context: ModelContext, engine: Any, desc: EngineDescription, profile: int):
        from ..worker import cuda
        self.cp = cuda.cupy()
        self.context_name = context.name
        self.desc, self.profile = desc, profile
        self.exec_context = engine.create_execution_context()
        if self.exec_context is None:
            raise Internal(f"TensorRT could not create an execution context for '{context.name}' (GPU memory?)")
        self.stream = self.cp.cuda.Stream(non_blocking=True)
        if desc.num_profiles > 1:
            self.exec_context.set_optimization_profile_async(profile, self.stream.ptr)
        self.dtypes = {t.name: t.data_type for t in desc.tensors}

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return [self._run(r) for r in requests]

    def _run(self, request: WorkerRequest) -> WorkerResponse:
        cp, ctx = self.cp, self.exec_context
        shapes = {n: list(a.shape) for n, a in request.inputs.items()}
        profile = select_profile(self.desc, shapes, self.profile)
        if profile != self.profile:
            raise InvalidArgument(f"input shapes {shapes} need optimization profile {profile} of "
                                  f"'{self.context_name}', and this instance runs profile {self.profile}")
        keep = []  # device buffers live until the stream is done
        with self.stream:
            for name, array in request.inputs.items():
                device = cp.ascontiguousarray(cp.asarray(array))  # the one host-to-device copy
                keep.append(device)
                if not ctx.set_input_shape(name, tuple(device.shape)):
                    raise InvalidArgument(f"TensorRT refused shape {list(device.shape)} for input '{name}'")
                ctx.set_tensor_address(name, device.data.ptr)
            outputs = {}
            for t in self.desc.outputs:
                shape = tuple(ctx.get_tensor_shape(t.name))
                if any(d < 0 for d in shape):
                    raise Internal(f"TensorRT left output '{t.name}' of '{self.context_name}' with shape {shape}")
                out = cp.empty(shape, dtype=_numpy_dtype(t.data_type))
                ctx.set_tensor_address(t.name, out.data.ptr)
                outputs[t.name] = out
            if not ctx.execute_async_v3(self.stream.ptr):
                raise Internal(f"TensorRT failed to run '{self.context_name}'")
        self.stream.synchronize()
        names = request.requested_outputs or list(outputs)
        return WorkerResponse(outputs={n: outputs[n] for n in names})


def _numpy_dtype(config_type: str):
    import numpy as np
    from ..core.data.datatypes import numpy_dtype
    wire = config_type.removeprefix("TYPE_")
    return np.uint16 if wire == "BF16" else numpy_dtype(wire)
