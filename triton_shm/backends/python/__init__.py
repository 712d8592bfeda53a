"""Python backend: runs ``model.py`` files written for Triton's python backend unchanged.

``install_module_alias()`` makes ``import triton_python_backend_utils as pb_utils`` resolve
to :mod:`triton_shm.backends.python.triton_python_backend_utils`; the backend calls it
before importing any model, and a worker may call it earlier.
"""
from __future__ import annotations

import sys
from types import ModuleType

from . import triton_python_backend_utils as pb_utils

MODULE_ALIAS = "triton_python_backend_utils"


def install_module_alias() -> ModuleType:
    """Register pb_utils in ``sys.modules`` as ``triton_python_backend_utils`` (kept if
    something already registered that name) and return the registered module."""
    return sys.modules.setdefault(MODULE_ALIAS, pb_utils)


__all__ = ["install_module_alias", "pb_utils", "MODULE_ALIAS"]
