"""Restricted APIs: ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

Each flag is ``<group>[,<group>...]:<header>=<value>``: a request to an API of one of the
groups must carry ``<header>`` with exactly ``<value>`` (over gRPC as the metadata key
``triton-grpc-protocol-<header>``). Header names match case-insensitively, values
exactly and in constant time; the first occurrence of the header is the one compared.
The value may also be read from a file (``<header>=@/path``, re-read on SIGHUP) or an
environment variable (``<header>=env:NAME``), so it does not show in ``ps``.
Which route or RPC belongs to which group: ``frontend/http/api_groups.py`` and
``frontend/grpc/servicer.py`` (``GROUPS``).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
          "statistics", "trace", "logging")
# Beyond tritonserver, --http-restricted-api also takes "metrics": every request to the metrics port.
HTTP_GROUPS = (*GROUPS, "metrics")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

FILE_PREFIX = "@"
ENV_PREFIX = "env:"


class RestrictionError(ValueError):
    """A restricted-API flag that cannot be served (the server exits 1 at start)."""


class Restriction:
    """One header and the value it must have. ``key`` is the header as given (it is what
    the refusal names); ``name`` is what requests are matched on; ``source`` is the value as
    written on the command line: the value itself, ``@file`` or ``env:NAME``."""

    def __init__(self, key: str, source: str):
        self.key = key
        self.source = source
        self.value = self.read_value()

    def __repr__(self) -> str:  # never the value
        return f"Restriction(key={self.key!r})"

    @property
    def value(self) -> bytes:
        return self._value

    @value.setter
    def value(self, value: bytes) -> None:
        self._value = value
        self._digest = hashlib.sha256(value).digest()

    @property
    def name(self) -> str:
        return self.key.lower()

    def read_value(self) -> bytes:
        source = self.source
        if source.startswith(FILE_PREFIX):
            path = Path(source[len(FILE_PREFIX):])
            try:
                value = path.read_bytes().rstrip(b"\r\n")
            except OSError as e:
                raise RestrictionError(f"cannot read the value of header '{self.key}' from '{path}': "
                                       f"{e.strerror}") from None
            where = f"file '{path}'"
        elif source.startswith(ENV_PREFIX):
            var = source[len(ENV_PREFIX):]
            if var not in os.environ:
                raise RestrictionError(f"the value of header '{self.key}' names the environment variable "
                                       f"'{var}', which is not set")
            value, where = os.environ[var].encode(), f"environment variable '{var}'"
        else:
            return source.encode()
        if not value:
            raise RestrictionError(f"the value of header '{self.key}' from {where} is empty")
        if b"\n" in value or b"\r" in value:
            raise RestrictionError(f"the value of header '{self.key}' from {where} spans several lines")
        return value

    def admits(self, given: bytes | None) -> bool:
        # Digests of equal length compared with compare_digest: the time taken depends neither
        # on how much of the value matched nor on its length.
        return given is not None and hmac.compare_digest(hashlib.sha256(given).digest(), self._digest)


class Restrictions:
    """The restricted groups of one protocol. ``refusal(group, lookup)`` is the one check
    every route of that protocol makes; ``lookup(name)`` gives the first value of the
    header ``name`` (lower case) in the request, or None."""

    def __init__(self, by_group: dict[str, Restriction], *, grpc: bool = False):
        self.by_group = by_group
        self.grpc = grpc

    def __bool__(self) -> bool:
        return bool(self.by_group)

    def header(self, restriction: Restriction) -> str:
        """The header (gRPC: metadata key) a request must carry, lower case."""
        return GRPC_HEADER_PREFIX + restriction.name if self.grpc else restriction.name

    def refusal(self, group: str | None, lookup: Callable[[str], bytes | None]) -> str | None:
        """None when the request may go on, else the message it is refused with."""
        restriction = self.by_group.get(group) if group is not None else None
        if restriction is None or restriction.admits(lookup(self.header(restriction))):
            return None
        if self.grpc:
            return f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}{restriction.key}'"
        return f"This API is restricted, expecting header '{restriction.key}'"

    def reload(self) -> None:
        """Re-read the values that come from files (SIGHUP); one that cannot be read keeps its value."""
        for restriction in {id(r): r for r in self.by_group.values()}.values():
            if restriction.source.startswith(FILE_PREFIX):
                try:
                    restriction.value = restriction.read_value()
                except RestrictionError as e:
                    log.error("%s; keeping the previous value", e)


def parse_restrictions(items: list[str], flag: str, *, grpc: bool = False) -> Restrictions:
    """The restrictions of every ``flag`` given; raises :class:`RestrictionError` with the
    message tritonserver gives for the same mistake."""
    noun, known = ("protocol", GROUPS) if grpc else ("api", HTTP_GROUPS)
    by_group: dict[str, Restriction] = {}
    for item in items:
        groups, colon, setting = item.partition(":")
        key, equals, source = setting.partition("=")
        if not (colon and equals and groups and key and source):
            raise RestrictionError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {item}")
        restriction = Restriction(key, source)
        for group in groups.split(","):
            if group not in known:
                raise RestrictionError(f"unknown restricted {noun} '{group}'")
            if group in by_group:
                raise RestrictionError(f"restricted {noun} '{group}' can not be specified in multiple config groups")
            by_group[group] = restriction
    return Restrictions(by_group, grpc=grpc)

