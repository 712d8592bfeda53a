"""CUDA in a worker, through CuPy imported on first use (CuPy for CUDA 12 or 13:
``cupy-cuda12x`` / ``cupy-cuda13x``; only the runtime calls both have are used).

A CUDA shared-memory region is a client's ``cudaIpcMemHandle_t``, opened once per worker
(``cudaIpcOpenMemHandle``) and closed when the front-end drops it (no request uses it
any more). Inputs are read from it and outputs written into it with device copies; a
model that wants host data gets one device-to-host copy, one that takes device inputs
(``Backend.takes_device_inputs``) a CuPy array on its GPU.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..errors import InvalidArgument, TritonShmError, Unsupported

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


class DeviceSpan:
    """``size`` bytes at device address ``ptr`` on CUDA ordinal ``device``."""

    def __init__(self, ptr: int, size: int, device: int):
        self.ptr, self.nbytes, self.device = ptr, size, device

    def to_host(self) -> memoryview:
        cp = cupy()
        out = bytearray(self.nbytes)
        if self.nbytes:
            host = memoryview(out)
            with cp.cuda.Device(self.device):
                addr = _host_address(host)
                cp.cuda.runtime.memcpy(addr, self.ptr, self.nbytes, _MEMCPY_DEVICE_TO_HOST)
        return memoryview(out)

    def write_host(self, data: memoryview | bytes | bytearray) -> None:
        data = memoryview(data).cast("B")
        if data.nbytes > self.nbytes:
            raise InvalidArgument(f"{data.nbytes} bytes do not fit a {self.nbytes}-byte CUDA shared-memory slice")
        if data.nbytes:
            cp = cupy()
            with cp.cuda.Device(self.device):
                cp.cuda.runtime.memcpy(self.ptr, _host_address(data), data.nbytes, _MEMCPY_HOST_TO_DEVICE)

    def write_device(self, array: Any) -> int:
        """Copy a CUDA tensor here, device to device; returns the bytes written."""
        cp = cupy()
        with cp.cuda.Device(self.device):
            src = cp.ascontiguousarray(cp.from_dlpack(array))
            if src.nbytes > self.nbytes:
                raise InvalidArgument(f"{src.nbytes} bytes do not fit a {self.nbytes}-byte CUDA shared-memory "
                                      "slice")
            cp.cuda.runtime.memcpy(self.ptr, src.data.ptr, src.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
            cp.cuda.Device(self.device).synchronize()
        return int(src.nbytes)

    def as_array(self, dtype: Any, shape: list[int], owner: Any = None) -> Any:
        """A CuPy array over this memory (no copy) for a model that takes GPU tensors."""
        cp = cupy()
        memory = cp.cuda.UnownedMemory(self.ptr, self.nbytes, owner, self.device)
        return cp.ndarray(tuple(shape), dtype=dtype, memptr=cp.cuda.MemoryPointer(memory, 0))

    def copy_array(self, dtype: Any, shape: list[int]) -> Any:
        """A CuPy array of its own holding this memory's bytes: one device-to-device copy,
        for a model that may write its inputs or keep them past the request."""
        cp = cupy()
        with cp.cuda.Device(self.device):
            out = cp.empty(tuple(shape), dtype=dtype)
            if self.nbytes:
                cp.cuda.runtime.memcpy(out.data.ptr, self.ptr, self.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
        return out


def gather_device(pieces: list[DeviceSpan | memoryview], device: int) -> Any:
    """The pieces' bytes, in order, in one CuPy uint8 array on ``device``: device spans
    copied device to device, host bytes host to device (a batch whose rows lie in CUDA
    shared memory, joined for a GPU backend without passing through the host)."""
    cp = cupy()
    with cp.cuda.Device(device):
        out = cp.empty(sum(p.nbytes for p in pieces), dtype=cp.uint8)
        at = out.data.ptr
        for p in pieces:
            if not p.nbytes:
                continue
            if isinstance(p, DeviceSpan):
                cp.cuda.runtime.memcpy(at, p.ptr, p.nbytes, _MEMCPY_DEVICE_TO_DEVICE)
            else:
                cp.cuda.runtime.memcpy(at, _host_address(p), p.nbytes, _MEMCPY_HOST_TO_DEVICE)
            at += p.nbytes
    return out


def _host_address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class CudaRegion:
    """A client's CUDA IPC region, opened in this worker."""

    def __init__(self, handle: bytes, device: int, size: int):
        cp = cupy()
        self.device, self.size = device, size
        try:
            with cp.cuda.Device(device):
                self.ptr = int(cp.cuda.runtime.ipcOpenMemHandle(handle))
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError: a stale handle, another GPU, the owner's process gone
            raise _cuda_error(f"failed to open CUDA IPC memory handle on device {device}", e) from None

    def view(self, offset: int, size: int) -> DeviceSpan:
        if offset < 0 or size < 0 or offset > self.size or size > self.size - offset:
            raise InvalidArgument("shared-memory slice lies outside its registered region")
        return DeviceSpan(self.ptr + offset, size, self.device)

    def close(self) -> None:
        if self.ptr:
            try:
                cp = cupy()
                with cp.cuda.Device(self.device):
                    cp.cuda.runtime.ipcCloseMemHandle(self.ptr)
            except Exception:  # noqa: BLE001 - the client's process may have freed it already
                pass
            self.ptr = 0


def as_cupy(array: Any) -> Any:
    """A CUDA tensor of any DLPack producer as a CuPy array (no copy)."""
    return cupy().from_dlpack(array)


def to_host_array(array: Any) -> np.ndarray:
    """A CUDA tensor copied to host memory (one device-to-host copy)."""
    return cupy().asnumpy(as_cupy(array))
