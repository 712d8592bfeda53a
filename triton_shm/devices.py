"""GPU discovery without importing any CUDA Python package (CPU-only machines never do),
and the GPU a worker process sees. Used by the server (--gpus), the supervisor (a worker's
CUDA_VISIBLE_DEVICES) and perf; nothing in here runs in a worker."""
from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping


def visible_gpu_count() -> int:
    """Number of CUDA devices the driver reports; 0 when there is no driver or device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def parse_gpus(spec: str | None) -> list[int]:
    """``--gpus 0,1`` → [0, 1]; ``None`` → every visible GPU; ``""``/``none`` → no GPU."""
    if spec is None:
        return list(range(visible_gpu_count()))
    spec = spec.strip()
    if spec.lower() in ("", "none"):
        return []
    try:
        ids = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--gpus expects a comma-separated list of GPU ids, got '{spec}'") from None
    available = visible_gpu_count()
    bad = [i for i in ids if i < 0 or i >= available]
    if bad:
        raise ValueError(f"--gpus names GPU(s) {bad}, but {available} GPU(s) are visible")
    return ids


def visible_device(gpu: int, parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the worker of GPU ``gpu`` (an ordinal among the
    devices the server sees): the server's own list, if it has one, names the device."""
    if parent_visible:
        names = [n.strip() for n in parent_visible.split(",") if n.strip()]
        if 0 <= gpu < len(names):
            return names[gpu]
    return str(gpu)


def worker_environment(parent: Mapping[str, str], only_gpu: int | None) -> dict[str, str]:
    """A worker process's environment: the server's, and for a worker that sees one GPU
    (``only_gpu``, an ordinal among the server's devices) ``CUDA_VISIBLE_DEVICES`` naming it."""
    env = dict(parent)
    if only_gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_device(only_gpu, parent.get("CUDA_VISIBLE_DEVICES"))
    return env
