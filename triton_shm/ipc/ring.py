"""Shared-memory SPSC ring (``csrc/ring.h``) and the per-frame half of ``link.Link``
(``LinkCore``): the C extension when built, else its pure-Python twin
(``TRITON_SHM_NO_EXTENSIONS=1`` forces the twin)."""
from __future__ import annotations

import os

from .ring_py import HEADER, ON_SOCKET, PEER_CHECK_NS, LinkCore, RingCorrupt, Ring  # noqa: F401

USING_EXTENSION = False
if os.environ.get("TRITON_SHM_NO_EXTENSIONS", "") in ("", "0"):
    try:
        from ._ring import LinkCore, Ring  # type: ignore  # noqa: F811
        USING_EXTENSION = True
    except ImportError:  # not built: the pure-Python twin serves
        pass

__all__ = ["HEADER", "LinkCore", "ON_SOCKET", "PEER_CHECK_NS", "Ring", "RingCorrupt", "USING_EXTENSION"]
