"""Model backends, run inside worker processes. ``get_backend(name)`` finds one by the
model config's backend name."""
from __future__ import annotations

from .base import Backend


def get_backend(name: str) -> type[Backend]:
    if name == "onnxruntime":
        from .onnxruntime import OnnxRuntimeBackend
        return OnnxRuntimeBackend
    if name == "tensorrt":
        from .tensorrt import TensorRTBackend
        return TensorRTBackend
    if name == "pytorch":
        from .pytorch import PyTorchBackend
        return PyTorchBackend
    if name == "python":
        from .python.backend import PythonBackend
        return PythonBackend
    from ..errors import InvalidArgument
    raise InvalidArgument(f"unsupported backend '{name}'")
