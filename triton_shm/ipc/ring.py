"""Shared-memory SPSC ring (``csrc/ring.h``) and the per-frame half of ``link.Link``
(``LinkCore``): the C extension when built, else its pure-Python twin (``_twins``)."""
from __future__ import annotations

from .._twins import pick
from .ring_py import HEADER, ON_SOCKET, PEER_CHECK_NS, LinkCore, RingCorrupt, Ring  # noqa: F401

__all__ = ["HEADER", "LinkCore", "ON_SOCKET", "PEER_CHECK_NS", "Ring", "RingCorrupt", "USING_EXTENSION"]

USING_EXTENSION = pick(globals(), "._ring", "LinkCore", "Ring")
