"""CUDA in a worker, through CuPy imported on first use (CuPy for CUDA 12 or 13:
``cupy-cuda12x`` / ``cupy-cuda13x``; only the runtime calls both have are used).

A CUDA shared-memory region is a client's ``cudaIpcMemHandle_t``, opened once per worker
(``cudaIpcOpenMemHandle``, an ``IpcMapping``) and closed once the front-end has dropped
the region *and* no array lent from it lives (a model may keep an input past its request:
closing the mapping under it would make its next read an illegal address, which breaks the
worker's CUDA context for good). Inputs are read from it and outputs written into it with
device copies; a model that wants host data gets one device-to-host copy, one that takes
device inputs (``Backend.takes_device_inputs``) a CuPy array on its GPU.

Every copy here runs on the calling thread's own non-blocking stream (``copy_stream``) and
is finished when the function returns: a joined batch before ONNX Runtime or TensorRT
(each on a stream of its own) reads it, an output before the reply says it is in the
client's region. Only that stream is waited for, never the whole device, so instances and
models sharing a GPU do not wait for each other. An output a model produced on another
stream is ordered before the copy through DLPack's stream handshake (``_ready_on``).
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..errors import Internal, InvalidArgument, TritonShmError, Unsupported

CUPY_MISSING = "CUDA shared memory needs a GPU and CuPy (pip install 'triton-shm[gpu]')"
_DLPACK_DEVICE_TYPES = (2, 13)  # kDLCUDA, kDLCUDAManaged in DLDeviceType: what CuPy imports
_MEMCPY_HOST_TO_DEVICE, _MEMCPY_DEVICE_TO_HOST, _MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3


def cupy() -> Any:
    """The CuPy module, or a clear TritonShmError (never an ImportError trace)."""
    try:
        import cupy as cp
    except Exception as e:  # noqa: BLE001 - ImportError, or a CuPy that finds no CUDA library
        raise Unsupported(f"{CUPY_MISSING}: {type(e).__name__}: {e}") from None
    return cp


_current = threading.local()  # the device this thread made current (use_device)


def _driver() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise Unsupported(f"a KIND_GPU instance needs the CUDA driver (libcuda.so.1): {e}") from None


def use_device(ordinal: int) -> None:
    """Make GPU ``ordinal`` the calling thread's current device for every CUDA library in
    this process: its primary context is made current through the driver, and each CUDA
    runtime (PyTorch's, CuPy's) takes the thread's current context as its current device,
    so nothing is imported for it. Done once per thread."""
    if getattr(_current, "device", None) == ordinal:
        return
    driver = _driver()
    device, context = ctypes.c_int(0), ctypes.c_void_p(0)
    for name, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), ordinal)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
                       ("cuCtxSetCurrent", (context,))):
        rc = getattr(driver, name)(*args)
        if rc != 0:
            raise Unsupported(f"cannot make GPU {ordinal} current in this process: {name} failed "
                              f"(CUDA error {rc})")
    _current.device = ordinal


def _cuda_error(what: str, e: Exception) -> TritonShmError:
    return InvalidArgument(f"{what}: {e}")


def is_device_array(obj: Any) -> bool:
    """A CUDA tensor by the DLPack protocol (CuPy, torch on GPU, ...), without importing CuPy."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) in _DLPACK_DEVICE_TYPES
    except Exception:  # noqa: BLE001 - an object that is not a tensor after all
        return False


# A DLPack capsule holds a pointer to a DLManagedTensor ("dltensor", DLPack < 1.0) or a
# DLManagedTensorVersioned ("dltensor_versioned"); the DLTensor's ``device`` (two int32:
# type, id) follows its ``data`` pointer. Offsets of that DLTensor in each struct:
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_DLTENSOR_AT = {b"dltensor": 0, b"dltensor_versioned": 8 + 3 * _POINTER}  # version, ctx, deleter, flags
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def capsule_device(capsule: Any) -> tuple[int, int] | None:
    """The ``(device type, device id)`` of the tensor a DLPack capsule holds, read without
    consuming it; None for a capsule already consumed (renamed ``used_dltensor``) or one
    that is not DLPack's."""
    name = _capsule_name(capsule)
    at = _DLTENSOR_AT.get(name or b"")
    if at is None:
        return None
    address = _capsule_pointer(capsule, name)
    if not address:
        return None
    device = address + at + _POINTER
    return ctypes.c_int32.from_address(device).value, ctypes.c_int32.from_address(device + 4).value


def is_dlpack_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


_streams = threading.local()  # this thread's copy stream of each device: {device: Stream}


def copy_stream(device: int) -> Any:
    """The calling thread's non-blocking stream on ``device``, for the copies of this
    module. Non-blocking: it never waits for the legacy default stream, which other
    libraries' work may hold; each copy is ordered by hand (``_ready_on``) and waited
    for before the function that made it returns."""
    table = getattr(_streams, "by_device", None)
    if table is None:
        table = _streams.by_device = {}
    stream = table.get(device)
    if stream is None:
        cp = cupy()
        with cp.cuda.Device(device):
            stream = table[device] = cp.cuda.Stream(non_blocking=True)
    return stream


def _copy(cp: Any, stream: Any, dst: int, src: int, nbytes: int, kind: int) -> None:
    cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)


def _ready_on(cp: Any, array: Any, stream: Any) -> Any:
    """``array`` (any DLPack producer on the GPU) as a CuPy array whose producer's pending
    work ``stream`` waits for. Imported with DLPack's handshake, the producer orders its
    work before CuPy's current stream of the array's device (PyTorch records an event on
    its own current stream; a CuPy array is taken to be ready on it, as CuPy's
    ``__dlpack__`` assumes; a bare capsule was exported for the legacy default stream, the
    current one unless a model changed it); ``stream`` then waits for that stream."""
    src = array if isinstance(array, cp.ndarray) else cp.from_dlpack(array)
    with cp.cuda.Device(src.device.id):
        stream.wait_event(cp.cuda.get_current_stream().record())
    return src


class DeviceSpan:
    """``size`` bytes at device address ``ptr`` on CUDA ordinal ``device``; ``owner`` is
    what keeps that memory mapped (an ``IpcMapping``), held by every array lent over it."""

    __slots__ = ("ptr", "nbytes", "device", "owner")

    def __init__(self, ptr: int, size: int, device: int, owner: Any = None):
        self.ptr, self.nbytes, self.device, self.owner = ptr, size, device, owner

    def to_host(self) -> memoryview:
        out = bytearray(self.nbytes)
        if self.nbytes:
            cp = cupy()
            with cp.cuda.Device(self.device):
                stream = copy_stream(self.device)
                _copy(cp, stream, _host_address(memoryview(out)), self.ptr, self.nbytes, _MEMCPY_DEVICE_TO_HOST)
                stream.synchronize()
        return memoryview(out)

    def write_host(self, data: memoryview | bytes | bytearray) -> None:
        """Copy host bytes here; they are in device memory when this returns (a copy from
        pageable memory may otherwise return once staged, before it lands)."""
        data = memoryview(data).cast("B")
        if data.nbytes > self.nbytes:
            raise InvalidArgument(f"{data.nbytes} bytes do not fit a {self.nbytes}-byte CUDA shared-memory slice")
        if data.nbytes:
            cp = cupy()
            with cp.cuda.Device(self.device):
                stream = copy_stream(self.device)
                _copy(cp, stream, self.ptr, _host_address(data), data.nbytes, _MEMCPY_HOST_TO_DEVICE)
                stream.synchronize()

    def write_device(self, array: Any) -> int:
        """Copy a CUDA tensor here, device to device, after the work that produced it;
        returns the bytes written, which are in place when this returns."""
        cp = cupy()
        with cp.cuda.Device(self.device):
            stream = copy_stream(self.device)
            src = _ready_on(cp, array, stream)
            if not src.flags.c_contiguous:
                with stream:
                    src = cp.ascontiguousarray(src)
            if src.nbytes > self.nbytes:
                raise InvalidArgument(f"{src.nbytes} bytes do not fit a {self.nbytes}-byte CUDA shared-memory "
                                      "slice")
            if src.nbytes:
                _copy(cp, stream, self.ptr, src.data.ptr, src.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
            stream.synchronize()
        return int(src.nbytes)

    def as_array(self, dtype: Any, shape: list[int]) -> Any:
        """A CuPy array over this memory (no copy) for a model that takes GPU tensors; it
        holds the region's mapping open for as long as it lives."""
        cp = cupy()
        memory = cp.cuda.UnownedMemory(self.ptr, self.nbytes, self.owner, self.device)
        return cp.ndarray(tuple(shape), dtype=dtype, memptr=cp.cuda.MemoryPointer(memory, 0))

    def copy_array(self, dtype: Any, shape: list[int]) -> Any:
        """A CuPy array of its own holding this memory's bytes: one device-to-device copy,
        done when this returns, for a model that may write its inputs or keep them past
        the request."""
        cp = cupy()
        with cp.cuda.Device(self.device):
            out = cp.empty(tuple(shape), dtype=dtype)
            if self.nbytes:
                stream = copy_stream(self.device)
                _copy(cp, stream, out.data.ptr, self.ptr, self.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
                stream.synchronize()
        return out


def gather_device(pieces: list[DeviceSpan | memoryview], device: int) -> Any:
    """The pieces' bytes, in order, in one CuPy uint8 array on ``device``: device spans
    copied device to device, host bytes host to device (a batch whose rows lie in CUDA
    shared memory, joined for a GPU backend without passing through the host). The copies
    have finished when it returns: the backend reads the array on a stream of its own."""
    cp = cupy()
    with cp.cuda.Device(device):
        out = cp.empty(sum(p.nbytes for p in pieces), dtype=cp.uint8)
        stream = copy_stream(device)
        at = out.data.ptr
        for p in pieces:
            if not p.nbytes:
                continue
            if isinstance(p, DeviceSpan):
                _copy(cp, stream, at, p.ptr, p.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
            else:
                _copy(cp, stream, at, _host_address(p), p.nbytes, _MEMCPY_HOST_TO_DEVICE)
            at += p.nbytes
        stream.synchronize()
    return out


def _host_address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _close_ipc(ptr: int, device: int) -> None:
    try:
        cp = cupy()
        with cp.cuda.Device(device):
            cp.cuda.runtime.ipcCloseMemHandle(ptr)
    except Exception:  # noqa: BLE001 - the client's process may have freed it already
        pass


class IpcMapping:
    """One ``cudaIpcOpenMemHandle`` of a client's region in this worker, closed when the
    last holder lets go: the region while registered, and every array lent over it (a
    ``DeviceSpan``'s ``owner``). The driver counts the openings of one handle in a
    context, so a region registered again while an old array lives opens it again and
    each closing undoes one."""

    __slots__ = ("ptr", "device", "__weakref__")

    def __init__(self, ptr: int, device: int, close: Callable[[int, int], None] = _close_ipc):
        self.ptr, self.device = ptr, device
        # not at interpreter exit: the process's end unmaps everything, CuPy may be gone
        weakref.finalize(self, close, ptr, device).atexit = False

    @classmethod
    def open(cls, handle: bytes, device: int) -> IpcMapping:
        cp = cupy()
        try:
            with cp.cuda.Device(device):
                ptr = int(cp.cuda.runtime.ipcOpenMemHandle(handle))
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError: a stale handle, another GPU, the owner's process gone
            raise _cuda_error(f"failed to open CUDA IPC memory handle on device {device}", e) from None
        return cls(ptr, device)


class CudaRegion:
    """A client's CUDA IPC region, opened in this worker."""

    def __init__(self, mapping: IpcMapping, size: int):
        self.mapping: IpcMapping | None = mapping
        self.device, self.size = mapping.device, size

    @classmethod
    def open(cls, handle: bytes, device: int, size: int) -> CudaRegion:
        return cls(IpcMapping.open(handle, device), size)

    def view(self, offset: int, size: int) -> DeviceSpan:
        if offset < 0 or size < 0 or offset > self.size or size > self.size - offset:
            raise InvalidArgument("shared-memory slice lies outside its registered region")
        mapping = self.mapping
        if mapping is None:
            raise Internal("CUDA shared-memory region used after it was dropped")
        return DeviceSpan(mapping.ptr + offset, size, self.device, mapping)

    def close(self) -> None:
        """The region is unregistered: its mapping closes once no lent array holds it."""
        self.mapping = None


def as_cupy(array: Any) -> Any:
    """A CUDA tensor of any DLPack producer as a CuPy array (no copy)."""
    return cupy().from_dlpack(array)


def to_host_array(array: Any) -> np.ndarray:
    """A CUDA tensor copied to host memory (one device-to-host copy)."""
    return cupy().asnumpy(as_cupy(array))
