"""The C extensions or their pure-Python twins: one switch, read once, and one way to pick.

Every C piece (``_name.pyx``) has a twin (``name_py.py``) with the same API and errors. The
module the package imports (the selector) binds the twin's names, then calls :func:`pick`,
which puts the extension's over them when it is built and ``TRITON_SHM_NO_EXTENSIONS`` is
unset or ``0``. With ``TRITON_SHM_NO_EXTENSIONS=1`` every selector keeps its twin: the
suite's second run serves the same server (same transports, same paths) through the twins.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Callable

NO_EXTENSIONS: bool = os.environ.get("TRITON_SHM_NO_EXTENSIONS", "") not in ("", "0")

__all__ = ["NO_EXTENSIONS", "pick"]


def pick(namespace: dict[str, Any], extension: str, *names: str,
         usable: Callable[[ModuleType], bool] | None = None) -> bool:
    """Rebind ``names`` in ``namespace`` (a selector's ``globals()``) to the extension's.

    ``extension`` is relative to the selector's package (``"._codec"``). Returns whether the
    extension serves: False under ``TRITON_SHM_NO_EXTENSIONS=1``, when it is not built,
    when it was built against another layout of a C type it cimports (Cython's import check
    raises ValueError), or when ``usable(module)`` says no; the twin's names then stay.
    """
    if NO_EXTENSIONS:
        return False
    try:
        module = importlib.import_module(extension, namespace["__package__"])
    except (ImportError, ValueError):
        return False
    if usable is not None and not usable(module):
        return False
    for name in names:
        namespace[name] = getattr(module, name)
    return True
