"""The ``python`` backend: loads ``<model>/<version>/model.py`` (or the config's
``default_model_filename``) and runs its ``TritonPythonModel`` the way Triton's python
backend does, in the worker process that owns the instance.

Lifecycle, as in Triton: ``auto_complete_config(ModelConfig)`` (static, optional) when
the config is completed; ``initialize(args)`` per instance with Triton's string-valued
``args``; ``execute(requests)`` (plain or ``async def``) per batch; ``finalize()`` at
unload.
"""
from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib.util
import inspect
import json
import logging
import re
import sys
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from ...errors import (
    AlreadyExists, Cancelled, Internal, InvalidArgument, NotFound, TritonShmError,
    Unavailable, Unsupported)
from ...worker import cuda
from ..base import Backend, InstanceSpec, ModelContext, ModelInstance, WorkerRequest, WorkerResponse
from . import install_module_alias
from . import triton_python_backend_utils as pb_utils

log = logging.getLogger("triton_shm.backends.python")

DEFAULT_MODEL_FILENAME = "model.py"
MODEL_CLASS = "TritonPythonModel"

# pb_utils.TritonError code -> our error class.
_ERROR_BY_CODE: dict[int, type[TritonShmError]] = {
    pb_utils.TritonError.UNKNOWN: TritonShmError,
    pb_utils.TritonError.INTERNAL: Internal,
    pb_utils.TritonError.NOT_FOUND: NotFound,
    pb_utils.TritonError.INVALID_ARG: InvalidArgument,
    pb_utils.TritonError.UNAVAILABLE: Unavailable,
    pb_utils.TritonError.UNSUPPORTED: Unsupported,
    pb_utils.TritonError.ALREADY_EXISTS: AlreadyExists,
    pb_utils.TritonError.CANCELLED: Cancelled,
}

_KIND_ARG = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL", "KIND_AUTO": "CPU"}

# what ``_request`` and ``_response`` use per request, bound once (no module lookups then)
_WIRE_TO_ENUM = pb_utils._WIRE_TO_ENUM
_Tensor, _InferenceResponse = pb_utils.Tensor, pb_utils.InferenceResponse
_new_tensor = _Tensor.__new__
_new_request = pb_utils.InferenceRequest._of
_ndarray = np.ndarray

_import_lock = threading.Lock()
# module name -> (file fingerprint, module): auto_complete and create_instance in one
# process import the file once; a changed file (reload) is imported afresh.
_modules: dict[str, tuple[tuple[int, int], ModuleType]] = {}


def _error_from_triton_error(err: Any) -> TritonShmError:
    if isinstance(err, pb_utils.TritonError):
        cls = _ERROR_BY_CODE.get(err.code(), Internal)
        return cls(err.message())
    return Internal(str(err))


def _answered(err: Any) -> WorkerResponse:
    """An error response the model returned: the request's answer, which Triton's
    statistics count as a success (an execution that raised is a failure)."""
    error = _error_from_triton_error(err)
    error.answered = True  # type: ignore[attr-defined]
    return WorkerResponse(error=error)


def _describe(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, the form Triton's python backend reports."""
    return f"{type(exc).__name__}: {exc}"


def _model_file(context: ModelContext) -> Path:
    return context.version_dir / (context.default_model_filename or DEFAULT_MODEL_FILENAME)


def _module_name(context: ModelContext) -> str:
    safe = re.sub(r"[^0-9A-Za-z_]", "_", context.name)
    if safe != context.name:  # keep distinct names distinct after sanitising
        safe += "_" + hashlib.sha1(context.name.encode()).hexdigest()[:8]
    return f"triton_shm_model_{safe}_{context.version}"


def load_model_module(context: ModelContext) -> ModuleType:
    """Import the model file under a unique module name, with the version directory on
    ``sys.path`` so the model can import its sibling modules, as in Triton."""
    path = _model_file(context)
    where = f"Python model '{context.name}' version {context.version}"
    try:
        st = path.stat()
    except OSError:
        raise InvalidArgument(f"failed to load {where}: Python model file not found in '{path}'") from None
    if not path.is_file():
        raise InvalidArgument(f"failed to load {where}: '{path}' is not a file")
    fingerprint = (st.st_mtime_ns, st.st_size)
    name = _module_name(context)
    with _import_lock:
        cached = _modules.get(name)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        install_module_alias()
        version_dir = str(path.parent)
        if version_dir not in sys.path:
            sys.path.insert(0, version_dir)
        spec = importlib.util.spec_from_file_location(name, str(path))
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"failed to load {where}: cannot import '{path}'")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:  # noqa: BLE001 - user code: SyntaxError, SystemExit, ...
            sys.modules.pop(name, None)
            if isinstance(e, KeyboardInterrupt):
                raise
            log.error("failed to import %s from '%s':\n%s", where, path, traceback.format_exc())
            raise Internal(f"failed to load {where}: {_describe(e)}") from None
        _modules[name] = (fingerprint, module)
        return module


def load_model_class(context: ModelContext) -> type:
    module = load_model_module(context)
    cls = getattr(module, MODEL_CLASS, None)
    if cls is None:
        raise InvalidArgument(
            f"failed to load Python model '{context.name}' version {context.version}: "
            f"'{_model_file(context)}' defines no class '{MODEL_CLASS}'")
    if not isinstance(cls, type):
        raise InvalidArgument(
            f"failed to load Python model '{context.name}' version {context.version}: "
            f"'{MODEL_CLASS}' in '{_model_file(context)}' is not a class")
    return cls


# The model config parameter that opts a Python model into inputs lent in place
# (``Backend.reads_inputs_in_place``): ``parameters: { key: "SHM_INPUTS_IN_PLACE"
# value: { string_value: "yes" } }``.
IN_PLACE_PARAMETER = "SHM_INPUTS_IN_PLACE"


# Triton's python-backend parameter: "no" lets a KIND_GPU instance's inputs stay on the
# GPU (here: inputs in a client's CUDA shared memory arrive as GPU tensors); "yes", the
# default, gives every input on the host.
FORCE_CPU_PARAMETER = "FORCE_CPU_ONLY_INPUT_TENSORS"


def _parameter(config: dict[str, Any], key: str) -> str:
    value = ((config.get("parameters") or {}).get(key) or {}).get("string_value", "")
    return str(value).strip().lower()


def _flag(config: dict[str, Any], key: str, default: bool = False) -> bool:
    """A yes/no model config parameter, as Triton's python backend spells them."""
    value = _parameter(config, key)
    if value in ("yes", "true", "on", "1"):
        return True
    return False if value in ("no", "false", "off", "0") else default


class PythonBackend(Backend):
    name = "python"

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self._model_class: type | None = None
        # A model's own promise that it never writes into its input arrays (Triton's
        # python backend always hands a model copies it may write).
        self.reads_inputs_in_place = _flag(context.config, IN_PLACE_PARAMETER)
        self.takes_device_inputs = not _flag(context.config, FORCE_CPU_PARAMETER, default=True)

    @staticmethod
    def auto_complete(context: ModelContext) -> dict[str, Any]:
        cls = load_model_class(context)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            return context.config
        config = copy.deepcopy(context.config)
        config.setdefault("name", context.name)
        wrapper = pb_utils.ModelConfig(config)
        try:
            result = hook(wrapper)
        except BaseException as e:  # noqa: BLE001 - user code
            if isinstance(e, KeyboardInterrupt):
                raise
            log.error("auto_complete_config of Python model '%s' failed:\n%s",
                      context.name, traceback.format_exc())
            raise InvalidArgument(
                f"auto-complete of Python model '{context.name}' failed: {_describe(e)}") from None
        if result is None:
            result = wrapper  # lenient: the hook changed the wrapper but returned nothing
        if isinstance(result, pb_utils.ModelConfig):
            return result.as_dict()
        if isinstance(result, dict):
            return result
        raise InvalidArgument(
            f"auto_complete_config of Python model '{context.name}' must return the "
            f"ModelConfig object it was given, not {type(result).__name__}")

    def _class(self) -> type:
        if self._model_class is None:
            self._model_class = load_model_class(self.context)
        return self._model_class

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        return PythonModelInstance(self.context, spec, self._class())


class PythonModelInstance(ModelInstance):
    """One ``TritonPythonModel`` object."""

    def __init__(self, context: ModelContext, spec: InstanceSpec, model_class: type):
        self.context = context
        self.spec = spec
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_loop: asyncio.AbstractEventLoop | None = None  # async is_ready(): beside execute's loop
        config = context.config
        self._all_outputs = [o["name"] for o in config.get("output", []) or [] if "name" in o]
        # sequence batching's state outputs: always taken from a response, never listed as requested
        self._state_outputs = {s.get("output_name") for s in (config.get("sequence_batching") or {}).get("state") or []}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self._label = f"Failed to process the request(s) for model '{spec.name}', message: "
        self.args = {
            "model_config": json.dumps(config),
            "model_instance_kind": _KIND_ARG.get(spec.kind, "CPU"),
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(context.model_dir),
            "model_version": str(context.version),
            "model_name": context.name,
        }
        where = f"Python model '{context.name}' instance '{spec.name}'"
        # a KIND_GPU instance's code runs with its GPU current (its process sees them all)
        self._device = spec.device_id if spec.kind == "KIND_GPU" else None
        if self._device is not None:
            cuda.use_device(self._device)
        try:
            self.model = model_class()
        except BaseException as e:  # noqa: BLE001 - user code
            if isinstance(e, KeyboardInterrupt):
                raise
            log.error("creating %s failed:\n%s", where, traceback.format_exc())
            raise Internal(f"failed to create {where}: {_describe(e)}") from None
        init = getattr(self.model, "initialize", None)
        if init is not None:
            try:
                result = init(dict(self.args))
                if inspect.isawaitable(result):
                    self._run_coroutine(result)
            except BaseException as e:  # noqa: BLE001 - user code
                if isinstance(e, KeyboardInterrupt):
                    raise
                log.error("initialize of %s failed:\n%s", where, traceback.format_exc())
                self._close_loop()
                raise Internal(f"failed to initialize {where}: {_describe(e)}") from None
        # Triton asks a model that defines is_ready() for its readiness (found once, as its stub does)
        self.has_is_ready = hasattr(self.model, "is_ready")

    def check_ready(self) -> tuple[bool, str]:
        """The model's own ``is_ready()`` (plain or ``async def``), run beside executions as
        Triton's stub runs it: ``(ready, why not)``. An exception or a value that is not a
        bool is not ready, with Triton's words."""
        try:
            result = self.model.is_ready()
            if inspect.isawaitable(result):
                if self._ready_loop is None:
                    self._ready_loop = asyncio.new_event_loop()
                result = self._ready_loop.run_until_complete(result)
            if not isinstance(result, bool):
                return False, "is_ready() must return a boolean value"
            return result, ""
        except BaseException as e:  # noqa: BLE001 - user code
            if isinstance(e, KeyboardInterrupt):
                raise
            log.error("is_ready of Python model '%s' raised:\n%s", self.spec.name, traceback.format_exc())
            return False, _describe(e)

    # ------------------------------------------------------------------ async support
    def _run_coroutine(self, awaitable):
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:  # noqa: BLE001
                pass
            loop.close()

    # ------------------------------------------------------------------ execute
    def _request(self, r: WorkerRequest) -> pb_utils.InferenceRequest:
        datatypes = r.datatypes
        # The worker decoded each input in its datatype's numpy dtype (BF16: uint16 words), so
        # the checks of ``Tensor.__init__`` have nothing to do: its fields are set as they are.
        # A loop, not a comprehension or a helper: no frame per input.
        inputs = []
        for name, array in r.inputs.items():
            t = _new_tensor(_Tensor)
            t._name, t._array, t._triton_dtype, t._device_array = name, array, _WIRE_TO_ENUM[datatypes[name]], None
            if type(array) is not _ndarray:  # a CuPy array: an input left on the GPU (takes_device_inputs)
                t._array, t._device_array = _ndarray(0, array.dtype), array
            inputs.append(t)
        requested = list(r.requested_outputs) if r.requested_outputs else list(self._all_outputs)
        if self._state_outputs:
            requested = [n for n in requested if n not in self._state_outputs]
        request = _new_request(
            r.id, r.correlation_id, inputs, requested, self.context.name, self.context.version, r.flags,
            pb_utils._parameters_json(r.parameters) if r.parameters else "{}")
        if r.sender is not None:
            self._attach_sender(request, r, r.sender)
        elif r.is_cancelled is not None:
            request._is_cancelled = r.is_cancelled
        if r.trace is not None:
            request._trace = pb_utils.InferenceTrace(*r.trace)
        return request

    def _attach_sender(self, request: pb_utils.InferenceRequest, r: WorkerRequest,
                       sender: Callable[[WorkerResponse | None, bool], None]) -> None:
        """A decoupled request's response sender (apart: its closure would cost ``_request``
        cells on every call)."""
        request._response_sender = pb_utils.InferenceResponseSender(
            lambda resp, final: sender(None if resp is None else self._response(r, resp), final),
            r.is_cancelled)
        request._is_cancelled = r.is_cancelled

    def _fail_all(self, n: int, message: str) -> list[WorkerResponse]:
        return [WorkerResponse(error=Internal(message)) for _ in range(n)]

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        n = len(requests)
        label = self._label
        if self._device is not None:
            cuda.use_device(self._device)  # once per thread
        try:
            pb_requests = list(map(self._request, requests))
        except Exception as e:  # noqa: BLE001
            log.exception("building requests for model '%s' failed", self.context.name)
            return self._fail_all(n, label + _describe(e))
        try:
            result = self.model.execute(pb_requests)
            if type(result) is not list and inspect.isawaitable(result):  # async def execute
                result = self._run_coroutine(result)
        except BaseException as e:  # noqa: BLE001 - user code
            if isinstance(e, KeyboardInterrupt):
                raise
            log.error("execute of Python model '%s' raised:\n%s", self.spec.name, traceback.format_exc())
            return self._fail_all(n, label + _describe(e))

        if self.decoupled:  # responses went (or will go) through each request's sender
            if result is not None:
                log.warning("decoupled model '%s' returned %s from execute(); it should return None",
                            self.spec.name, type(result).__name__)
            return [WorkerResponse() for _ in requests]
        if not isinstance(result, (list, tuple)):
            got = "None" if result is None else type(result).__name__
            return self._fail_all(
                n, label + f"execute() must return a list of {n} InferenceResponse "
                f"objects (one per request), got {got}")
        if len(result) != n:
            # Triton's wording, so clients matching on it keep working.
            return self._fail_all(
                n, label + "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{n}, and "
                f"InferenceResponse(s) size is:{len(result)}")
        return list(map(self._response, requests, result))

    def _response(self, req: WorkerRequest, resp: Any) -> WorkerResponse:
        if type(resp) is _InferenceResponse:  # not a subclass: its fields, not the accessors
            if resp._error is not None:
                return _answered(resp._error)
            tensors = resp._output_tensors
        elif isinstance(resp, pb_utils.InferenceResponse):
            if resp.has_error():
                return _answered(resp.error())
            tensors = resp.output_tensors()
        else:
            return WorkerResponse(error=Internal(
                f"model '{self.spec.name}' returned a {type(resp).__name__} where an "
                "InferenceResponse was expected"))
        wanted = req.requested_outputs or None  # a few names: a list lookup beats building a set
        outputs: dict[str, np.ndarray] = {}
        for t in tensors:
            if type(t) is not _Tensor and not isinstance(t, _Tensor):
                return WorkerResponse(error=Internal(
                    f"model '{self.spec.name}' returned a {type(t).__name__} among the output "
                    "tensors; expected pb_utils.Tensor"))
            name = t._name
            if wanted is not None and name not in wanted:
                continue
            if name in outputs:
                return WorkerResponse(error=Internal(
                    f"model '{self.spec.name}' returned output '{name}' more than once"))
            array = t._array
            # a host array of numbers goes as it is; strings and GPU tensors are converted
            outputs[name] = array if t._device_array is None and array.dtype.kind not in "US" else _output_array(t)
        params = getattr(resp, "_params", None)
        return WorkerResponse(outputs) if params is None else WorkerResponse(outputs, None, params)

    def finalize(self) -> None:
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            try:
                result = fin()
                if inspect.isawaitable(result):
                    self._run_coroutine(result)
            except BaseException as e:  # noqa: BLE001 - user code; never raised
                if isinstance(e, KeyboardInterrupt):
                    raise
                log.error("finalize of Python model '%s' raised:\n%s",
                          self.spec.name, traceback.format_exc())
        self._close_loop()
        loop, self._ready_loop = self._ready_loop, None
        if loop is not None and not loop.is_running():  # a check still running keeps its loop
            loop.close()


def _output_array(t: pb_utils.Tensor) -> np.ndarray:
    """The array to send: numpy ``U``/``S`` arrays become object arrays of ``bytes``; a
    GPU tensor goes as its CuPy array (copied where it is bound for)."""
    if t._device_array is not None:
        return t._device_array
    arr = t._array
    kind = arr.dtype.kind
    if kind == "U":
        out = np.empty(arr.shape, dtype=np.object_)
        flat = out.reshape(-1)
        for i, s in enumerate(arr.reshape(-1).tolist()):
            flat[i] = s.encode("utf-8")
        return out
    if kind == "S":
        out = np.empty(arr.shape, dtype=np.object_)
        flat = out.reshape(-1)
        for i, s in enumerate(arr.reshape(-1).tolist()):
            flat[i] = s
        return out
    return arr


__all__ = ["PythonBackend", "PythonModelInstance", "install_module_alias",
           "load_model_module", "load_model_class"]
