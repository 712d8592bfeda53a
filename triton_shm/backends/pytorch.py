"""PyTorch backend: TorchScript models (``platform: "pytorch_libtorch"`` / ``backend:
"pytorch"``, ``<version>/model.pt`` or the config's ``default_model_filename``), served
the way Triton's PyTorch (LibTorch) backend serves them.

PyTorch is an optional extra (``pip install 'triton-shm[pytorch]'``), imported on the
first PyTorch model a worker loads: a worker serving other models never pays its import,
and a server without it fails only its PyTorch models, with a message.

Names (pure functions here, tested without torch):

- inputs: the config's input names are ``forward()``'s argument names, else every one is
  ``<name>__<index>`` (the index of the argument), else they are taken in config order;
  a ``forward`` taking one ``Dict[str, Tensor]`` gets every input by its config name.
  Sequence control inputs and implicit state follow ``<name>__<index>``.
- outputs: ``<name>__<index>`` into the returned tuple (a lone tensor or ``List[str]`` is
  index 0), else config order.

Triton has no auto-complete for TorchScript (a model file does not say what its tensors
are): the config declares every input and output, and the model's ``forward`` signature
is checked against it at load (argument count, output indices where the return type
says how many there are).

An instance is ``KIND_CPU`` (module on the CPU), ``KIND_GPU`` (``cuda:0`` inside the
GPU's own worker, which sees only its device; one CUDA stream per instance; outputs
handed back as CUDA tensors, which the worker writes device to device into CUDA shared
memory or copies to the host once) or ``KIND_MODEL`` (the module where it was saved,
inputs on the CPU). Host inputs become tensors with ``torch.from_numpy`` (no copy), CUDA
inputs with ``torch.from_dlpack`` (no copy).
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Internal, InvalidArgument, TritonShmError, Unavailable
from .base import Backend, InstanceSpec, ModelContext, ModelInstance, WorkerRequest, WorkerResponse

log = logging.getLogger("triton_shm.backends.pytorch")

TORCH_MISSING = "needs PyTorch (pip install 'triton-shm[pytorch]')"
DEFAULT_MODEL_FILENAME = "model.pt"

# The config types Triton's PyTorch backend serves as tensors, by torch dtype name.
# TYPE_STRING travels as a 1-D List[str]; BF16 and the wider unsigned types are refused,
# as Triton 2.51 refuses them.
TORCH_DTYPES = {
    "TYPE_BOOL": "bool", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8", "TYPE_INT16": "int16",
    "TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_FP16": "float16", "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}
STRING = "TYPE_STRING"

_UNSUPPORTED_OUTPUT = ("output must be of type Tensor, List[str] or Tuple containing one of these two types. "
                       "It should not be a List / Dictionary of Tensors or a Scalar")


# --------------------------------------------------------------------------- pure logic

@dataclass(frozen=True)
class Options:
    """The ``parameters`` of a model config that this backend reads. ``None``: not given
    (the JIT settings are then left as they are, as Triton leaves them)."""
    inference_mode: bool = True
    optimized_execution: bool = True
    cudnn: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    jit_profiling: bool | None = None
    jit_executor: bool | None = None
    tensor_fuser: bool | None = None
    intra_op_threads: int = 0   # 0: PyTorch's default
    inter_op_threads: int = 0


_TRUE, _FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")


def _parameter(config: dict[str, Any], key: str) -> str | None:
    entry = (config.get("parameters") or {}).get(key)
    if entry is None:
        return None
    return str(entry.get("string_value", "") if isinstance(entry, dict) else entry).strip()


def _bool(model: str, config: dict[str, Any], key: str) -> bool | None:
    value = _parameter(config, key)
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidArgument(f"failed to convert '{value}' to a boolean value for parameter '{key}' of model "
                          f"'{model}' (true/false, on/off, 1/0)")


def _int(model: str, config: dict[str, Any], key: str) -> int:
    value = _parameter(config, key)
    if value is None:
        return 0
    try:
        return max(int(value), 0)
    except ValueError:
        raise InvalidArgument(f"failed to convert '{value}' to an integer for parameter '{key}' of model "
                              f"'{model}'") from None


def parse_options(model: str, config: dict[str, Any]) -> Options:
    """Triton's PyTorch backend parameters: DISABLE_OPTIMIZED_EXECUTION, INFERENCE_MODE
    (default on), DISABLE_CUDNN, ENABLE_CACHE_CLEANING, ENABLE_WEIGHT_SHARING,
    ENABLE_JIT_PROFILING, ENABLE_JIT_EXECUTOR, ENABLE_TENSOR_FUSER, INTRA_OP_THREAD_COUNT,
    INTER_OP_THREAD_COUNT. A value that is not a boolean (or an integer) fails the load."""
    def flag(key: str, default: bool) -> bool:
        value = _bool(model, config, key)
        return default if value is None else value
    if _parameter(config, "ENABLE_NVFUSER") is not None:
        log.info("model '%s': ENABLE_NVFUSER is ignored (nvFuser is no longer part of PyTorch)", model)
    return Options(
        inference_mode=flag("INFERENCE_MODE", True),
        optimized_execution=not flag("DISABLE_OPTIMIZED_EXECUTION", False),
        cudnn=not flag("DISABLE_CUDNN", False),
        cache_cleaning=flag("ENABLE_CACHE_CLEANING", False),
        weight_sharing=flag("ENABLE_WEIGHT_SHARING", False),
        jit_profiling=_bool(model, config, "ENABLE_JIT_PROFILING"),
        jit_executor=_bool(model, config, "ENABLE_JIT_EXECUTOR"),
        tensor_fuser=_bool(model, config, "ENABLE_TENSOR_FUSER"),
        intra_op_threads=_int(model, config, "INTRA_OP_THREAD_COUNT"),
        inter_op_threads=_int(model, config, "INTER_OP_THREAD_COUNT"),
    )


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name (after its first ``__``), else None."""
    _, sep, index = name.partition("__")
    return int(index) if sep and index.isdigit() else None


@dataclass(frozen=True)
class Signature:
    """``forward``'s arguments (after ``self``) as (name, kind), kind one of "tensor",
    "list" (List[str]), "dict" (Dict[str, Tensor]) or another type's name; and how many
    outputs it returns, where its return type says (None: only the run can tell), or why
    it can never be served."""
    arguments: tuple[tuple[str, str], ...]
    outputs: int | None = None
    output_problem: str = ""


@dataclass(frozen=True)
class IoPlan:
    """Where each tensor goes: input name -> ``forward`` argument index (or dict key, when
    ``dict_input``); output name -> index into what ``forward`` returns."""
    inputs: dict[str, int]
    outputs: dict[str, int]
    dict_input: bool = False
    model_outputs: int | None = None  # from the signature, where it tells
    types: dict[str, str] = field(default_factory=dict)  # tensor name -> config type


def _dims(entry: dict[str, Any]) -> list[int]:
    reshape = entry.get("reshape")
    return list((reshape or {}).get("shape") or []) if reshape is not None else list(entry.get("dims") or [])


def check_config(model: str, config: dict[str, Any]) -> None:
    """What the config alone must satisfy (before the model file is read)."""
    if not config.get("input"):
        raise InvalidArgument(f"model '{model}': the model configuration must contain at least one input, none "
                              "were specified (PyTorch models have no config auto-complete: declare every input "
                              "and output)")
    if not config.get("output"):
        raise InvalidArgument(f"model '{model}': the model configuration must contain at least one output, none "
                              "were specified (PyTorch models have no config auto-complete: declare every input "
                              "and output)")
    batching = int(config.get("max_batch_size", 0) or 0) > 0
    tensors = [("input", t) for t in config.get("input") or []] + [("output", t) for t in config.get("output") or []]
    for st in (config.get("sequence_batching") or {}).get("state") or []:
        tensors.append(("state", {"name": st.get("input_name", ""), "data_type": st.get("data_type", ""),
                                  "dims": st.get("dims") or []}))
    for kind, t in tensors:
        dtype = t.get("data_type", "")
        if dtype == STRING:
            if len(_dims(t)) + (1 if batching else 0) > 1:
                raise InvalidArgument(f"model '{model}': {kind} '{t.get('name')}' is TYPE_STRING, which PyTorch "
                                      "models take and return as a 1-dimensional List[str] only (batch "
                                      "dimension included)")
        elif dtype not in TORCH_DTYPES:
            raise InvalidArgument(f"unsupported datatype {dtype} for {kind} '{t.get('name')}' for model '{model}' "
                                  f"(PyTorch models take {', '.join(TORCH_DTYPES)} and {STRING})")


def _convention(names: list[str], allowed: list[str], model: str) -> dict[str, int]:
    """Triton's order of rules: forward() argument names (inputs only), then
    ``<name>__<index>``, then config order."""
    if allowed and all(n in allowed for n in names):
        return {n: allowed.index(n) for n in names}
    indices = [named_index(n) for n in names]
    named = [i for i in indices if i is not None]
    if len(named) == len(names):
        return dict(zip(names, named))
    if allowed:
        log.warning("input(s) of model '%s' are neither forward() arguments (%s) nor follow the "
                    "<name>__<index> naming convention: taken in model configuration order", model, allowed)
    else:
        log.warning("output(s) of model '%s' do not follow the <name>__<index> naming convention: taken in model "
                    "configuration order", model)
    return {n: i for i, n in enumerate(names)}


def _named(name: str, what: str, model: str) -> int:
    index = named_index(name)
    if index is None:
        raise InvalidArgument(f"PyTorch model '{model}' {what} '{name}', which does not follow the "
                              "<name>__<index> naming convention")
    return index


def plan_io(model: str, config: dict[str, Any], sig: Signature) -> IoPlan:
    """Map the config's tensors onto ``forward``'s arguments and results, with Triton's
    naming rules; what cannot match fails the load, in Triton's words where it has them."""
    inputs = [t["name"] for t in config.get("input") or []]
    outputs = [t["name"] for t in config.get("output") or []]
    sb = config.get("sequence_batching") or {}
    controls = [c["name"] for c in sb.get("control_input") or [] if c.get("name")]
    states = sb.get("state") or []
    types = {t["name"]: t.get("data_type", "") for t in (config.get("input") or []) + (config.get("output") or [])}
    for st in states:
        types[st.get("input_name", "")] = types[st.get("output_name", "")] = st.get("data_type", "")
    kinds = [k for _, k in sig.arguments]
    expected = len(inputs) + len(controls) + len(states)
    dict_input = kinds == ["dict"]
    if not dict_input:
        if "dict" in kinds:
            raise InvalidArgument(f"model '{model}': forward() takes a Dict among other inputs; only a single "
                                  "input of type Dict(str, Tensor) is supported")
        for name, k in sig.arguments:
            if k not in ("tensor", "list"):
                raise InvalidArgument(f"model '{model}': an input of type '{k}' (forward() argument '{name}') was "
                                      "detected in the model. Only a single input of type Dict(str, Tensor) or "
                                      "input(s) of type Tensor are supported")
        if len(sig.arguments) != expected:
            raise InvalidArgument(f"unable to load model '{model}', configuration expects {expected} inputs, model "
                                  f"provides {len(sig.arguments)}")
    # inputs
    if dict_input:
        in_map = {n: i for i, n in enumerate(inputs + controls + [s.get("input_name", "") for s in states])}
    else:
        in_map = _convention(inputs, [n for n, _ in sig.arguments], model)
        if states and not all(named_index(n) is not None for n in inputs):
            raise InvalidArgument(f"PyTorch model '{model}' is using sequence batching with state but not all "
                                  "inputs and outputs follow the <name>__<index> naming convention")
        for c in controls:
            in_map[c] = _named(c, "has the sequence control input", model)
        for st in states:
            in_map[st.get("input_name", "")] = _named(st.get("input_name", ""), "has the state input", model)
        seen: dict[int, str] = {}
        for name, index in in_map.items():
            if index >= len(sig.arguments):
                raise InvalidArgument(f"model '{model}': input '{name}' names forward() argument {index}, but "
                                      f"forward() takes {len(sig.arguments)} input(s)")
            if index in seen:
                raise InvalidArgument(f"model '{model}': inputs '{seen[index]}' and '{name}' both name forward() "
                                      f"argument {index}")
            seen[index] = name
    # outputs
    out_map = _convention(outputs, [], model)
    if states and not all(named_index(n) is not None for n in outputs):
        raise InvalidArgument(f"PyTorch model '{model}' is using sequence batching with state but not all inputs "
                              "and outputs follow the <name>__<index> naming convention")
    for st in states:
        out_map[st.get("output_name", "")] = _named(st.get("output_name", ""), "has the state output", model)
    if sig.output_problem:
        raise InvalidArgument(f"model '{model}': {_UNSUPPORTED_OUTPUT} ({sig.output_problem})")
    if sig.outputs is not None:
        for name, index in out_map.items():
            if index >= sig.outputs:
                raise InvalidArgument(f"model '{model}': the output {name} in the model configuration refers to an "
                                      f"output index which doesn't exist. This model has {sig.outputs} outputs")
    return IoPlan(in_map, out_map, dict_input, sig.outputs, types)


# --------------------------------------------------------------------------- PyTorch

_torch_module: Any = None
_threads_lock = threading.Lock()
_threads_set: dict[str, int] = {}  # "intra"/"inter" -> the count the first model set


def _torch() -> Any:
    """The torch module, or a clear Unavailable (never an ImportError trace)."""
    global _torch_module
    if _torch_module is None:
        try:
            torch = importlib.import_module("torch")
        except Exception as e:  # noqa: BLE001 - ImportError, or a torch build that cannot initialise
            raise Unavailable(f"the pytorch backend {TORCH_MISSING}: {type(e).__name__}: {e}") from None
        # Inputs lent in place from a client's region are read-only arrays; torch has no
        # read-only tensors and warns on every such from_numpy. Safe here: a model that
        # writes tensors in place gets copies of them (``PyTorchInstance._mutates``).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        _torch_module = torch
    return _torch_module


def _set_threads(torch: Any, model: str, options: Options) -> None:
    """INTRA_/INTER_OP_THREAD_COUNT are process-wide in PyTorch: the first model in this
    worker that gives one sets it, later ones are ignored (as in Triton)."""
    with _threads_lock:
        for key, count, setter in (("intra", options.intra_op_threads, torch.set_num_threads),
                                   ("inter", options.inter_op_threads, torch.set_num_interop_threads)):
            if count <= 0:
                continue
            if key in _threads_set:
                if _threads_set[key] != count:
                    log.warning("model '%s': %s-op thread count %d ignored: this worker's PyTorch already runs %d",
                                model, key, count, _threads_set[key])
                continue
            try:
                setter(count)
            except RuntimeError as e:  # set_num_interop_threads after parallel work started
                log.warning("model '%s': could not set the %s-op thread count to %d: %s", model, key, count, e)
            _threads_set[key] = count


def _kind(t: Any) -> str:
    name = str(t.kind())
    if name == "TensorType":
        return "tensor"
    if name == "ListType" and str(t.getElementType()) == "str":
        return "list"
    if name == "DictType":
        return "dict"
    return str(t)


def signature(module: Any) -> Signature:
    """``forward``'s arguments and result count from its TorchScript schema."""
    schema = module.forward.schema
    args = list(schema.arguments)
    if args and str(args[0].type.kind()) == "ClassType":
        args = args[1:]  # self
    arguments = tuple((a.name, _kind(a.type)) for a in args)
    outputs: int | None = None
    problem = ""
    returns = list(schema.returns)
    if len(returns) == 1:
        t = returns[0].type
        kinds = [_kind(e) for e in t.elements()] if str(t.kind()) == "TupleType" else [_kind(t)]
        bad = [k for k in kinds if k not in ("tensor", "list")]
        if not bad:
            outputs = len(kinds)
        elif any(k == "dict" or k.startswith(("List[", "Dict[", "int", "float", "bool", "str")) for k in bad):
            problem = f"forward() returns {t}"
    return Signature(arguments, outputs, problem)


_MUTATING = re.compile(r"Tensor[\[\]?]*\([^)]*!")  # an alias annotation that writes: Tensor(a!)


def writes_tensors(module: Any) -> bool:
    """Whether ``forward`` may write a tensor in place (an op whose schema writes its
    argument, ``add_``, ``copy_``, ``relu_``...), conservatively: any such op anywhere in
    the inlined graph, or a graph that cannot be read, counts."""
    try:
        graph = module.inlined_graph
    except Exception:  # noqa: BLE001 - no graph to read: assume it may
        return True

    def walk(block: Any) -> bool:
        for node in block.nodes():
            kind = node.kind()
            if kind in ("prim::fork", "prim::CallFunction", "prim::CallMethod"):
                return True  # code the inlined graph does not show
            try:
                schema = node.schema()
            except Exception:  # noqa: BLE001 - a node without a schema (prim ops)
                schema = ""
            if _MUTATING.search(schema):
                return True
            if any(walk(b) for b in node.blocks()):
                return True
        return False
    return walk(graph)


class PyTorchBackend(Backend):
    name = "pytorch"
    concat_batching = True  # a batch is one forward over the concatenated rows
    reads_inputs_in_place = True  # inputs are lent; a model that writes tensors in place copies them first
    takes_device_inputs = True  # CUDA shared-memory inputs reach a KIND_GPU instance on its device

    @staticmethod
    def auto_complete(context: ModelContext) -> dict[str, Any]:
        # As Triton: a TorchScript file does not describe its tensors, so the config stays as written.
        log.warning("skipping model configuration auto-complete for '%s': not supported for pytorch backend",
                    context.name)
        check_config(context.name, context.config)  # what is missing, in this backend's words
        return copy.deepcopy(context.config)

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.torch = _torch()
        check_config(context.name, context.config)
        self.options = parse_options(context.name, context.config)
        _set_threads(self.torch, context.name, self.options)
        self._shared: dict[str, Any] = {}  # ENABLE_WEIGHT_SHARING: device -> module
        self._plan: IoPlan | None = None

    def _path(self, spec: InstanceSpec) -> Any:
        path = self.context.version_dir / (self.context.default_model_filename or DEFAULT_MODEL_FILENAME)
        if not path.is_file():
            raise Unavailable(f"unable to find '{path}' for model instance '{spec.name}'")
        return path

    def _device(self, spec: InstanceSpec) -> Any:
        torch = self.torch
        if spec.kind == "KIND_GPU":
            if not torch.cuda.is_available():
                raise Unavailable(f"instance '{spec.name}' of model '{self.context.name}' is KIND_GPU, but this "
                                  f"PyTorch ({torch.__version__}) has no CUDA support or sees no GPU")
            return torch.device("cuda", 0)  # this worker sees only its own GPU
        if spec.kind == "KIND_MODEL":
            return None  # where the model put its tensors
        return torch.device("cpu")

    def _load(self, spec: InstanceSpec, device: Any) -> Any:
        key = str(device)
        if self.options.weight_sharing and key in self._shared:
            log.info("reusing TorchScript model for instance '%s'", spec.name)
            return self._shared[key]
        path = self._path(spec)
        torch = self.torch
        try:
            # as Triton, under inference mode (its guard covers loading too); not eval():
            # the module runs in the mode it was saved in, as it does in Triton
            with torch.inference_mode(self.options.inference_mode):
                module = torch.jit.load(str(path), map_location=device)
        except Exception as e:  # noqa: BLE001 - not TorchScript, corrupt, or saved with another PyTorch
            raise Internal(f"failed to load model '{self.context.name}': {e}") from None
        if self.options.weight_sharing:
            self._shared[key] = module
        return module

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        device = self._device(spec)
        module = self._load(spec, device)
        if self._plan is None:
            try:
                sig = signature(module)
            except Exception as e:  # noqa: BLE001 - a module without a scripted forward
                raise InvalidArgument(f"model '{self.context.name}': cannot read the signature of forward(): "
                                      f"{e}") from None
            self._plan = plan_io(self.context.name, self.context.config, sig)
        return PyTorchInstance(self, spec, module, device, self._plan)


class PyTorchInstance(ModelInstance):
    def __init__(self, backend: PyTorchBackend, spec: InstanceSpec, module: Any, device: Any, plan: IoPlan):
        self.torch = torch = backend.torch
        self.model = backend.context.name
        self.options = backend.options
        self.module, self.device, self.plan = module, device, plan
        self.kind = spec.kind
        self.gpu = spec.kind == "KIND_GPU"
        self.arity = len(plan.inputs)
        self.output_names = [t["name"] for t in backend.context.config.get("output") or []]
        self.torch_types = {getattr(torch, name): cfg for cfg, name in TORCH_DTYPES.items()}
        # A model that may write a tensor in place must not write a client's memory: its
        # inputs lent from a region (read-only host arrays, CuPy views of a CUDA region) are
        # copied first. Every other model reads them where they lie.
        self._mutates = writes_tensors(module)
        self.stream = torch.cuda.Stream(device=device) if self.gpu else None
        self.cuda_outputs = False  # CUDA tensors go back as they are only where the worker has CuPy
        if self.gpu:
            from ..worker import cuda
            try:
                cuda.cupy()
                self.cuda_outputs = True
            except TritonShmError:
                pass

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return [self._run(r) for r in requests]

    # -- inputs ---------------------------------------------------------------------------
    def _tensor(self, name: str, array: Any) -> Any:
        torch = self.torch
        if isinstance(array, np.ndarray):
            if array.dtype == np.object_:  # TYPE_STRING: a 1-D List[str]
                return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
            if self._mutates and not array.flags.writeable and not self.gpu:  # (a GPU gets its own copy)
                array = array.copy()  # lent from a client's region
            tensor = torch.from_numpy(array)
        else:  # a CUDA array (CuPy): an input from CUDA shared memory, on this GPU
            if self._mutates and type(getattr(getattr(array, "data", None), "mem", None)).__name__ == "UnownedMemory":
                array = array.copy()  # a view of the client's CUDA region
            try:
                tensor = torch.from_dlpack(array)
            except Exception:  # noqa: BLE001 - a dtype this DLPack exchange lacks: the CUDA array interface
                tensor = torch.as_tensor(array, device=self.device)
        if self.gpu and tensor.device != self.device:
            tensor = tensor.to(self.device)
        return tensor

    def _arguments(self, request: WorkerRequest) -> list[Any] | dict[str, Any]:
        missing = [n for n in self.plan.inputs if n not in request.inputs]
        if missing:
            raise InvalidArgument(f"model '{self.model}' expects input(s) {missing}: forward() takes every input")
        if self.plan.dict_input:
            return {n: self._tensor(n, request.inputs[n]) for n in self.plan.inputs}
        args: list[Any] = [None] * self.arity
        for name, index in self.plan.inputs.items():
            args[index] = self._tensor(name, request.inputs[name])
        return args

    # -- one execution --------------------------------------------------------------------
    def _settings(self) -> None:
        """Triton's per-execution settings: graph optimization, cuDNN, and the JIT
        switches where the config sets them."""
        C, opt = self.torch._C, self.options
        setter = getattr(C, "_set_graph_executor_optimize", None)
        if setter is not None:
            setter(opt.optimized_execution)
        if self.kind != "KIND_CPU":
            self.torch.backends.cudnn.enabled = opt.cudnn
        for value, name in ((opt.jit_profiling, "_jit_set_profiling_mode"),
                            (opt.jit_executor, "_jit_set_profiling_executor"),
                            (opt.tensor_fuser, "_jit_set_texpr_fuser_enabled")):
            if value is not None and hasattr(C, name):
                getattr(C, name)(value)

    def _run(self, request: WorkerRequest) -> WorkerResponse:
        torch = self.torch
        names = request.requested_outputs or self.output_names
        stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with stream, torch.inference_mode(self.options.inference_mode), torch.no_grad():
            args = self._arguments(request)
            self._settings()
            try:
                result = self.module(args) if self.plan.dict_input else self.module(*args)
                items = _results(result)
                outputs = {n: self._output(n, items) for n in names}
                if self.stream is not None:
                    self.stream.synchronize()  # errors of the run surface here, and outputs are ready
            except TritonShmError:
                raise
            except Exception as e:  # noqa: BLE001 - the model's own error, in PyTorch's words
                raise Internal(f"PyTorch execute failure: {e}") from None
            finally:
                if self.options.cache_cleaning and self.kind != "KIND_CPU":
                    torch.cuda.empty_cache()
        return WorkerResponse(outputs=outputs)

    def _output(self, name: str, items: list[Any]) -> Any:
        index = self.plan.outputs.get(name)
        if index is None:
            raise InvalidArgument(f"model '{self.model}' has no output '{name}'")
        if index >= len(items):
            raise InvalidArgument(f"The output {name} in the model configuration refers to an output index which "
                                  f"doesn't exist. This model has {len(items)} outputs")
        value, want = items[index], self.plan.types.get(name, "")
        if isinstance(value, list):
            if want != STRING:
                raise InvalidArgument(f"configuration expects datatype {want} for output '{name}', model provides "
                                      "List[str]")
            out = np.empty(len(value), dtype=np.object_)
            out[:] = [s.encode("utf-8") for s in value]
            return out
        got = self.torch_types.get(value.dtype, str(value.dtype))
        if got != want:
            raise InvalidArgument(f"configuration expects datatype {want} for output '{name}', model provides "
                                  f"{got}")
        if value.dim() == 0:
            raise InvalidArgument(f"output '{name}' is a scalar which is not supported.")
        value = value.contiguous()
        if value.is_cuda and self.gpu and self.cuda_outputs:
            return value  # the worker writes it device to device, or copies it to the host once
        return value.cpu().numpy()  # no copy for a CPU tensor

    def finalize(self) -> None:
        self.module = None
        if self.gpu:
            self.torch.cuda.empty_cache()


def _results(result: Any) -> list[Any]:
    """What ``forward`` returned as a list: a tuple's items, or the one tensor or List[str]."""
    if isinstance(result, tuple):
        items = list(result)
    else:
        items = [result]
    for i, item in enumerate(items):
        if isinstance(item, list):
            if not all(isinstance(s, str) for s in item):
                raise ValueError(f"output at index {i} must be of type Tensor or List[str]")
        elif not hasattr(item, "dtype") or not hasattr(item, "dim"):
            raise ValueError(_UNSUPPORTED_OUTPUT)
    return items
