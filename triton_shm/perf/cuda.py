"""Client CUDA buffers for ``--shared-memory cuda``, as perf_analyzer makes them: one
``cudaMalloc`` per input and output on CUDA device 0, exported with ``cudaIpcGetMemHandle``
and registered as the server's GPU 0 (perf_analyzer has no flag for the device either).

CuPy is imported on first use; ``check_available`` turns a missing CuPy, a machine without
a CUDA device or a CuPy that cannot reach one into one usage-error line before any load.
"""
from __future__ import annotations

import base64
import importlib.util
from typing import Any

import numpy as np

from ..devices import visible_gpu_count
from . import UsageError

DEVICE = 0
CUPY_MISSING = ("--shared-memory cuda needs CuPy, which is not installed here "
                "(pip install 'triton-shm[gpu]', or cupy-cuda12x / cupy-cuda13x)")
NO_DEVICE = "--shared-memory cuda needs a CUDA device, and none is visible here"
_MEMCPY_HOST_TO_DEVICE = 1


def _find_cupy() -> bool:
    try:
        return importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return False


def cupy() -> Any:
    """The CuPy module once it reaches device 0, or a UsageError line."""
    if not _find_cupy():
        raise UsageError(CUPY_MISSING)
    if visible_gpu_count() == 0:
        raise UsageError(NO_DEVICE)
    try:
        import cupy as cp
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - ImportError, or a CuPy that finds no CUDA library or driver
        raise UsageError(f"--shared-memory cuda: CuPy cannot use a CUDA device here: "
                         f"{type(e).__name__}: {str(e).strip()}") from None
    if count <= DEVICE:
        raise UsageError(NO_DEVICE)
    return cp


def check_available() -> None:
    cupy()


class DeviceBuffer:
    """``size`` bytes of its own ``cudaMalloc`` on device 0 (not a block of CuPy's pool:
    an IPC handle names a whole allocation, which the server maps from its start), with
    its IPC handle in base64 as tritonclient passes it."""

    def __init__(self, size: int):
        cp = self._cp = cupy()
        self.size = max(size, 1)
        with cp.cuda.Device(DEVICE):
            self.memory = cp.cuda.Memory(self.size)
            self.raw_handle = base64.b64encode(cp.cuda.runtime.ipcGetMemHandle(self.memory.ptr)).decode()

    def write(self, data: bytes) -> None:
        """Copy ``data`` to the start of the buffer (once, before the load)."""
        if not data:
            return
        host = np.frombuffer(data, dtype=np.uint8)
        cp = self._cp
        with cp.cuda.Device(DEVICE):
            cp.cuda.runtime.memcpy(self.memory.ptr, host.ctypes.data, host.nbytes, _MEMCPY_HOST_TO_DEVICE)
            cp.cuda.Device(DEVICE).synchronize()

    def free(self) -> None:
        self.memory = None  # CuPy's Memory frees its allocation when the last reference goes
