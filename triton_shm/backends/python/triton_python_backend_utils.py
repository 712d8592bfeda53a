"""``triton_python_backend_utils`` for triton-shm: the ``pb_utils`` module that models
written for Triton's python backend import as::

    import triton_python_backend_utils as pb_utils

The worker registers this module in ``sys.modules`` under that name (see
:func:`triton_shm.backends.python.install_module_alias`) before it imports a model, so
such models run unchanged. The API follows Triton's python backend (the pure-Python
helpers of ``triton_python_backend_utils.py`` plus the classes its C++ stub binds:
``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError``,
``TritonModelException``, ``Logger``); this is an independent implementation.

Differences from Triton, by design or not yet done:

* Inputs live in CPU memory (``is_cpu()`` is True), as with Triton's default
  ``FORCE_CPU_ONLY_INPUT_TENSORS: "yes"``. With ``"no"``, an input of a KIND_GPU instance
  that lies in a client's CUDA shared memory arrives on the GPU (``is_cpu()`` False;
  ``to_dlpack()`` / ``__dlpack__`` hand it to torch or CuPy without a copy): one device
  copy of its own, or the region itself for a model that declares
  ``SHM_INPUTS_IN_PLACE``. Other inputs arrive on the host. ``from_dlpack`` of a CUDA
  tensor (a capsule, or an object with ``__dlpack__``: CuPy, torch, any producer) keeps
  it on the GPU (``is_cpu()`` False, CuPy needed): an output bound for CUDA shared memory
  is copied device to device, otherwise to the host once.
* BF16 has no numpy type: BF16 tensors hold their raw ``uint16`` words (``as_numpy``
  returns ``uint16``; ``triton_dtype()`` still says BF16). ``triton_string_to_numpy``
  has no ``TYPE_BF16`` entry, as in Triton.
* ``MetricFamily`` / ``Metric`` keep their values in-process; they are not exported on
  the metrics endpoint yet.
"""
from __future__ import annotations

import enum
import json
import logging
import threading
from typing import Any, Callable, Iterable

import numpy as np

from ...core.data.codec import count_bytes, deserialize_bytes, serialize_bytes
from ...errors import InvalidArgument, TritonShmError
from ...worker import cuda as _cuda

# --------------------------------------------------------------------------- constants

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# TRITONSERVER_DataType enum values, as Triton's ``triton_dtype()`` reports them.
TYPE_INVALID, TYPE_BOOL, TYPE_UINT8, TYPE_UINT16, TYPE_UINT32, TYPE_UINT64 = 0, 1, 2, 3, 4, 5
TYPE_INT8, TYPE_INT16, TYPE_INT32, TYPE_INT64 = 6, 7, 8, 9
TYPE_FP16, TYPE_FP32, TYPE_FP64, TYPE_BYTES, TYPE_BF16 = 10, 11, 12, 13, 14

# V2 wire datatype name <-> TRITONSERVER_DataType value.
_WIRE_TO_ENUM: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5,
    "INT8": 6, "INT16": 7, "INT32": 8, "INT64": 9,
    "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_ENUM_TO_WIRE: dict[int, str] = {v: k for k, v in _WIRE_TO_ENUM.items()}

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_ENUM_TO_NUMPY: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64,
    6: np.int8, 7: np.int16, 8: np.int32, 9: np.int64,
    10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
_NUMPY_TO_ENUM: dict[np.dtype, int] = {np.dtype(t): v for v, t in _ENUM_TO_NUMPY.items() if v != TYPE_BYTES}


def triton_string_to_numpy(triton_type_string: str):
    """``"TYPE_FP32"`` -> ``np.float32``; ``"TYPE_STRING"`` -> ``np.object_``.
    ``TYPE_BF16`` has no numpy type and raises ``KeyError``, as in Triton."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int):
    """TRITONSERVER_DataType value -> numpy type (None when there is none, e.g. BF16)."""
    return _ENUM_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type) -> int | None:
    """numpy dtype or type -> TRITONSERVER_DataType value (None when unsupported)."""
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in "OS":
        return TYPE_BYTES
    if dt.kind == "U":
        return None
    return _NUMPY_TO_ENUM.get(dt.newbyteorder("="))  # dict lookup: this runs for every tensor


def serialize_byte_tensor(input_tensor: np.ndarray):
    """Serialize a BYTES tensor (object or ``S`` array) into the length-prefixed wire
    form, row-major. Returns ``()`` for an empty tensor and None for other dtypes,
    like Triton's helper."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        return serialize_bytes(input_tensor)
    return None


def deserialize_bytes_tensor(encoded_tensor) -> np.ndarray:
    """Decode length-prefixed BYTES data into a 1-D object array of ``bytes``."""
    try:
        return deserialize_bytes(encoded_tensor, count_bytes(encoded_tensor))
    except InvalidArgument as e:
        raise TritonModelException(f"truncated BYTES tensor: {e.message}") from None


# --------------------------------------------------------------------------- errors

class TritonError(Exception):
    """An error carried by an :class:`InferenceResponse` (``error=``). Triton's class is
    not an exception; this one is, so ``raise pb_utils.TritonError(...)`` also works."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str = "", code: int = INTERNAL):
        super().__init__(message)
        self._message = "" if message is None else str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by pb_utils (and by models) to fail the request(s) being executed."""

    def __init__(self, message: str = ""):
        super().__init__(message)
        self._message = "" if message is None else str(message)

    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


# --------------------------------------------------------------------------- tensors

class _CapsuleHolder:
    """Gives a bare DLPack capsule the ``__dlpack__`` protocol that numpy's and CuPy's
    ``from_dlpack`` want, with the device its tensor really lies on."""

    def __init__(self, capsule):
        device = _cuda.capsule_device(capsule)
        if device is None:
            raise TritonModelException("a DLPack capsule can be consumed only once")
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        if self._capsule is None:
            raise TritonModelException("a DLPack capsule can be consumed only once")
        capsule, self._capsule = self._capsule, None
        return capsule

    def __dlpack_device__(self):
        return self._device


def _bf16_words(obj) -> np.ndarray | None:
    """uint16 words of a bfloat16 tensor that numpy cannot import (torch, ml_dtypes)."""
    dtype = getattr(obj, "dtype", None)
    if dtype is None or "bfloat16" not in str(dtype):
        return None
    if isinstance(obj, np.ndarray):  # ml_dtypes.bfloat16
        return obj.view(np.uint16)
    try:  # torch.Tensor
        import torch
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    except Exception:  # noqa: BLE001
        return None


class Tensor:
    """A named tensor: request input, response output. Data is a numpy array."""

    _device_array: Any  # the CuPy array of a tensor on the GPU, else None

    def __init__(self, name: str, numpy_array, triton_dtype: int | None = None):
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a string")
        if triton_dtype is None and type(numpy_array) is np.ndarray:
            # the common case, a host array of a native number dtype: its enum is one lookup
            # and the checks below would change nothing (those dtypes are neither U nor V)
            known = _NUMPY_TO_ENUM.get(numpy_array.dtype)
            if known:
                self._name, self._array, self._triton_dtype, self._device_array = name, numpy_array, known, None
                return
        if not isinstance(numpy_array, np.ndarray):
            words = _bf16_words(numpy_array)
            if words is not None:
                numpy_array, triton_dtype = words, TYPE_BF16
            else:
                numpy_array = np.asarray(numpy_array)
        elif numpy_array.dtype.kind == "V" and numpy_array.dtype.name == "bfloat16":  # ml_dtypes
            numpy_array, triton_dtype = numpy_array.view(np.uint16), TYPE_BF16
        if triton_dtype is None:
            dtype = numpy_array.dtype
            if dtype.kind == "U":
                triton_dtype = TYPE_BYTES
            else:  # a native dtype is a key as it is; others go through the byte-order normalisation
                triton_dtype = _NUMPY_TO_ENUM.get(dtype) or numpy_to_triton_type(dtype)
            if triton_dtype is None:
                raise TritonModelException(
                    f"Tensor '{name}': numpy dtype '{numpy_array.dtype}' is not supported by "
                    "the Python backend")
        elif triton_dtype != TYPE_BF16 and triton_dtype != TYPE_BYTES:
            npt = triton_to_numpy_type(triton_dtype)
            if npt is None:
                raise TritonModelException(f"Tensor '{name}': invalid triton_dtype {triton_dtype}")
            if numpy_array.dtype != np.dtype(npt):
                numpy_array = numpy_array.view(npt)
        self._name = name
        self._array = numpy_array
        self._triton_dtype = int(triton_dtype)
        self._device_array = None

    @classmethod
    def _on_gpu(cls, name: str, device_array) -> "Tensor":
        triton_dtype = numpy_to_triton_type(device_array.dtype)
        if triton_dtype is None:
            raise TritonModelException(f"Tensor '{name}': dtype '{device_array.dtype}' is not supported by "
                                       "the Python backend")
        t = cls(name, np.empty(0, dtype=device_array.dtype), triton_dtype)
        t._device_array = device_array
        return t

    def device_array(self):
        """The CuPy array of a GPU tensor (None on the CPU); not part of Triton's API."""
        return self._device_array

    # Triton's accessors ------------------------------------------------------------
    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device_array is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def triton_dtype(self) -> int:
        return self._triton_dtype

    def shape(self) -> list[int]:
        return list((self._array if self._device_array is None else self._device_array).shape)

    def is_cpu(self) -> bool:
        return self._device_array is None

    def to_dlpack(self):
        """A DLPack capsule over the data, on the host or the GPU where the tensor lies (no
        copy). BYTES tensors cannot be exported."""
        if self._triton_dtype == TYPE_BYTES:
            raise TritonModelException("TYPE_BYTES tensors cannot be converted to DLPack.")
        if self._device_array is not None:
            return self._device_array.__dlpack__()
        arr = self._array
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return arr.__dlpack__()

    def __dlpack__(self, *args, **kwargs):
        if self._triton_dtype == TYPE_BYTES:
            raise TritonModelException("TYPE_BYTES tensors cannot be converted to DLPack.")
        if self._device_array is not None:
            return self._device_array.__dlpack__(*args, **kwargs)
        return np.ascontiguousarray(self._array).__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        if self._device_array is not None:
            return self._device_array.__dlpack_device__()
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor) -> "Tensor":
        """Tensor from a DLPack capsule or any object with ``__dlpack__``; a CUDA tensor
        stays on the GPU (a capsule's device is read from the tensor it holds)."""
        obj = dlpack_tensor
        if _cuda.is_dlpack_capsule(obj):
            obj = _CapsuleHolder(obj)
        if _cuda.is_device_array(obj):
            try:
                return Tensor._on_gpu(name, _cuda.as_cupy(obj))
            except TritonShmError as e:  # no CuPy: a clear message, not an ImportError
                raise TritonModelException(f"Tensor '{name}' is on the GPU: {e.message}") from None
        try:
            array = np.from_dlpack(obj)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            words = _bf16_words(dlpack_tensor)
            if words is not None:
                return Tensor(name, words, TYPE_BF16)
            raise TritonModelException(
                f"Tensor '{name}': cannot import DLPack tensor ({e}); only CPU tensors of "
                "numeric types are supported") from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        dt = _ENUM_TO_WIRE.get(self._triton_dtype, str(self._triton_dtype))
        where = "" if self._device_array is None else ", device=GPU"
        return f"Tensor(name={self._name!r}, datatype={dt}, shape={self.shape()}{where})"


# --------------------------------------------------------------------------- requests

def _compact_json(value) -> str:
    # Triton serializes request parameters without spaces: {"p1":"x","p2":3}
    return json.dumps(value, separators=(",", ":"))


def _parameters_json(parameters) -> str:
    """Parameters as the JSON string ``parameters()`` returns; serialized when given, so a
    value JSON cannot hold fails there, as in Triton. Most have none: no encoder run."""
    if parameters is None or (isinstance(parameters, dict) and not parameters):
        return "{}"
    return parameters if isinstance(parameters, str) else _compact_json(parameters)


class InferenceTrace:
    """The trace of a request (``request.trace()``). Passed as ``trace=`` to a BLS
    InferenceRequest, it makes the call a child of this trace, as in Triton: the called
    model's spans (OpenTelemetry) or trace (``parent_id``) come under the caller's."""

    __slots__ = ("_trace_id", "_context")

    def __init__(self, trace_id: int = 0, context: str = ""):
        self._trace_id, self._context = trace_id, context

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The OpenTelemetry context as JSON (``{"traceparent": "00-..."}``); None when the
        request is not traced in OpenTelemetry mode."""
        return json.dumps({"traceparent": self._context}) if self._context else None

    def __repr__(self) -> str:
        return f"InferenceTrace(trace_id={self._trace_id})"


_NO_TRACE = InferenceTrace()


class InferenceRequest:
    """A request handed to ``TritonPythonModel.execute``.

    Built by a model with ``model_name``, ``inputs`` and ``requested_output_names``, it is
    a BLS request: ``exec()`` / ``await async_exec()`` run it on another model.
    """

    def __init__(self, request_id: str = "", correlation_id: int | str = 0,
                 inputs: Iterable[Tensor] | None = None,
                 requested_output_names: Iterable[str] | None = None,
                 model_name: str = "", model_version: int = -1, flags: int = 0,
                 timeout: int = 0, preferred_memory=None, trace=None,
                 parameters: dict | str | None = None):
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested_output_names = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._response_sender: InferenceResponseSender | None = None
        self._is_cancelled: Callable[[], bool] | None = None  # set by the server for the requests it hands
        self._trace = trace if isinstance(trace, InferenceTrace) else _NO_TRACE

    @classmethod
    def _of(cls, request_id: str, correlation_id: int | str, inputs: list[Tensor], requested: list[str],
            model_name: str, model_version: int, flags: int, parameters_json: str) -> "InferenceRequest":
        """A request the worker built for ``execute``: fresh lists, parameters already JSON."""
        r = cls.__new__(cls)
        r._request_id, r._correlation_id, r._inputs, r._requested_output_names = \
            request_id, correlation_id, inputs, requested
        r._model_name, r._model_version, r._flags, r._timeout = model_name, model_version, flags, 0
        r._parameters, r._release_flags = parameters_json, TRITONSERVER_REQUEST_RELEASE_ALL
        r._response_sender = r._is_cancelled = None
        r._trace = _NO_TRACE
        return r

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as in Triton."""
        return self._parameters

    def requested_output_names(self) -> set[str]:
        """The outputs to compute: a ``set``, as in Triton. Every output of the model
        when the client named none."""
        return set(self._requested_output_names)

    def model_name(self) -> str:  # not part of Triton's execute-side API; harmless
        return self._model_name

    def is_cancelled(self) -> bool:
        """True once the client has gone away."""
        return bool(self._is_cancelled and self._is_cancelled())

    def trace(self) -> InferenceTrace:
        """This request's trace: pass it as ``trace=`` to a BLS request to trace that call
        as its child (an untraced request's trace makes no child)."""
        return self._trace

    def set_release_flags(self, flags: int) -> None:
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not "
                "supported by triton-shm yet")
        self._release_flags = flags

    def get_response_sender(self) -> "InferenceResponseSender":
        if self._response_sender is None:
            raise TritonModelException(
                "get_response_sender() is only for decoupled models (model_transaction_policy "
                "{ decoupled: true }); return a list of InferenceResponse from execute()")
        return self._response_sender

    def exec(self, decoupled: bool = False, timeout: float | None = None):
        """BLS: run this request on ``model_name`` through the server. Returns an
        InferenceResponse, or with ``decoupled=True`` an iterator of them."""
        if _bls_client is None:
            raise TritonModelException("BLS is only available inside the server's worker processes")
        if not self._model_name:
            raise TritonModelException("a BLS InferenceRequest needs a model_name")
        responses = _bls_client.infer(self, decoupled, timeout)
        if decoupled:
            return responses
        result = None
        for response in responses:
            result = result or response
        return result or InferenceResponse(error=TritonError("no response", TritonError.INTERNAL))

    def async_exec(self, decoupled: bool = False, timeout: float | None = None):
        """Awaitable form of :meth:`exec` for ``async def execute``. ``decoupled=True``
        gives the responses' iterator (``cancel()`` included), iterated as in Triton."""
        import asyncio
        loop = asyncio.get_running_loop()
        if decoupled:
            done = loop.create_future()
            done.set_result(self.exec(True, timeout))
            return done
        return loop.run_in_executor(None, self.exec, False, timeout)

    def __repr__(self) -> str:
        return (f"InferenceRequest(request_id={self._request_id!r}, "
                f"inputs={[t.name() for t in self._inputs]})")


_bls_client = None  # set by the worker process (triton_shm.worker.bls.BlsClient)


def _set_bls_client(client) -> None:
    global _bls_client
    _bls_client = client


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model: zero or more
    ``send(response)`` calls, from any thread, then one with
    ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (with or without a response)."""

    def __init__(self, deliver, is_cancelled=None):
        self._deliver = deliver  # deliver(InferenceResponse | None, final: bool)
        self._is_cancelled = is_cancelled
        self._lock = threading.Lock()
        self._closed = False

    def send(self, response: "InferenceResponse | None" = None, flags: int = 0) -> None:
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() takes an InferenceResponse")
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException("send() needs a response unless flags has TRITONSERVER_RESPONSE_COMPLETE_FINAL")
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._closed = final
            self._deliver(response, final)

    def is_cancelled(self) -> bool:
        """True once the client has gone away (e.g. closed its stream)."""
        return bool(self._is_cancelled and self._is_cancelled())


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _response_parameters(parameters) -> dict | None:
    """A response's parameters checked as Triton's python backend checks them: a dict of
    str keys and bool, int or str values (an int within int64, as the protocols carry it)."""
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        if isinstance(value, int) and not isinstance(value, bool) and not _INT64[0] <= value <= _INT64[1]:
            raise TritonModelException(f"parameter '{key}' is out of the int64 range")
    return dict(parameters) or None


class InferenceResponse:
    """The response to one request: output tensors, or an error; optional ``parameters``
    (``{"name": bool | int | str}``) reach the client with it. ``parameters()`` is their
    JSON, as in Triton."""

    def __init__(self, output_tensors: list[Tensor] | None = None,
                 error: TritonError | None = None, parameters: dict | str | None = None):
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors)
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._params = _response_parameters(parameters)  # what the worker sends: None when empty
        self._parameters = json.dumps(self._params) if self._params else "{}"

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def get_input_tensor_by_name(inference_request, name: str) -> Tensor | None:
    if type(inference_request) is InferenceRequest:  # the server's own: its fields, not the accessors
        for t in inference_request._inputs:
            if (t._name if type(t) is Tensor else t.name()) == name:
                return t
        return None
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for props in model_config.get("input", []) or []:
        if props.get("name") == name:
            return props
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for props in model_config.get("output", []) or []:
        if props.get("name") == name:
            return props
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


# --------------------------------------------------------------------------- logging

_model_logger = logging.getLogger("triton_shm.model")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_PY_LEVEL = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
             LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}


class Logger:
    """Model-side logging; messages go to the Python logger ``triton_shm.model``."""

    @staticmethod
    def log(message, level: LogLevel = LogLevel.INFO) -> None:
        _model_logger.log(_PY_LEVEL.get(LogLevel(level), logging.INFO), "%s", message)

    @classmethod
    def log_info(cls, message) -> None:
        _model_logger.info("%s", message)

    @classmethod
    def log_warn(cls, message) -> None:
        _model_logger.warning("%s", message)

    @classmethod
    def log_error(cls, message) -> None:
        _model_logger.error("%s", message)

    @classmethod
    def log_verbose(cls, message) -> None:
        _model_logger.debug("%s", message)


# --------------------------------------------------------------------------- metrics

class MetricFamily:
    """Custom metrics API. Values are kept in-process; not exported yet."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int):
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"invalid metric kind {kind}")
        self._name, self._description, self._kind = name, description, kind

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> "Metric":
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if self._kind == self.HISTOGRAM and buckets is None:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        if self._kind != self.HISTOGRAM and buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        return Metric(self, labels or {}, buckets)


class Metric:
    def __init__(self, family: MetricFamily, labels: dict, buckets: list | None):
        self._family, self._labels = family, dict(labels)
        self._buckets = list(buckets) if buckets is not None else None
        self._value = 0.0
        self._observations: list[float] = []

    def increment(self, value: float) -> None:
        if self._family._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("Failed to increment metric value: counter cannot decrease")
        self._value += value

    def set(self, value: float) -> None:
        if self._family._kind != MetricFamily.GAUGE:
            raise TritonModelException("Failed to set metric value: only gauges can be set")
        self._value = float(value)

    def observe(self, value: float) -> None:
        if self._family._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to observe metric value: not a histogram")
        self._observations.append(float(value))
        self._value += value

    def value(self) -> float:
        return self._value


# --------------------------------------------------------------------------- auto-complete

class ModelConfig:
    """The model config handed to ``auto_complete_config``. Only max_batch_size, inputs,
    outputs, dynamic batching and the transaction policy can be changed, as in Triton."""

    def __init__(self, model_config: dict | str):
        cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
        cfg.setdefault("name", "")
        cfg.setdefault("max_batch_size", 0)
        cfg.setdefault("input", [])
        cfg.setdefault("output", [])
        self._model_config = cfg

    def as_dict(self) -> dict:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def max_batch_size(self) -> int:
        return int(self._model_config.get("max_batch_size", 0) or 0)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0) or 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def _add_io(self, kind: str, io: dict, valid: tuple[str, ...]) -> None:
        if not isinstance(io, dict):
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name()}' must be a dict")
        label = f"{kind} '{io.get('name', '')}'" if "name" in io else kind
        for prop in io:
            if prop not in valid:
                allowed = ", ".join(f"'{p}'" for p in valid)
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{self._name()}' "
                    f"contains property other than {allowed}.")
        for prop in ("name", "data_type", "dims"):
            if prop not in io:
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{self._name()}' "
                    f"is missing '{prop}' property.")
        key = "input" if kind == "input" else "output"
        existing = self._model_config.setdefault(key, [])
        for cur in existing:
            if cur.get("name") != io["name"]:
                continue
            cur_type = cur.get("data_type", "TYPE_INVALID")
            if cur_type != "TYPE_INVALID" and cur_type != io["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{cur_type} for {kind} '{io['name']}', model provides {io['data_type']}")
            cur_dims = [int(d) for d in cur.get("dims", []) or []]
            if cur_dims and cur_dims != [int(d) for d in io["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{io['name']}': the model expects dims "
                    f"{list(io['dims'])} but the model configuration specifies dims {cur_dims}")
            if ("optional" in cur and "optional" in io
                    and bool(cur["optional"]) != bool(io["optional"])):
                raise ValueError(
                    f"model '{self._name()}', tensor '{io['name']}': the model expects optional "
                    f"{io['optional']} but the model configuration specifies optional "
                    f"{cur['optional']}")
            cur["data_type"] = io["data_type"]
            cur["dims"] = list(io["dims"])
            if "optional" in io:
                cur["optional"] = io["optional"]
            return
        existing.append(dict(io))

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add_io("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add_io("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != new:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = new


__all__ = [
    "Tensor", "InferenceRequest", "InferenceTrace", "InferenceResponse", "InferenceResponseSender", "TritonError",
    "TritonModelException",
    "Logger", "LogLevel", "MetricFamily", "Metric", "ModelConfig",
    "get_input_tensor_by_name", "get_output_tensor_by_name", "get_input_config_by_name",
    "get_output_config_by_name", "using_decoupled_model_transaction_policy",
    "triton_string_to_numpy", "triton_to_numpy_type", "numpy_to_triton_type",
    "serialize_byte_tensor", "deserialize_bytes_tensor", "TRITON_STRING_TO_NUMPY",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]
