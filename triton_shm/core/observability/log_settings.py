"""Log settings (Triton's logging extension) and how they drive Python logging.

Triton's switches are independent: ``log_info``, ``log_warning`` and ``log_error`` turn
one severity each on or off, ``log_verbose_level`` > 0 adds verbose (DEBUG) lines, and
``log_format`` is ``default`` (``I1130 05:29:52.670849 1367 name] message``) or
``ISO8601`` (``2026-11-30T05:29:52Z I 1367 name] message``). They are set at start-up
from the command line and may be changed at runtime over HTTP/gRPC, except the log
file: a file path is never accepted from the network (CVE-2024-0087).

Runtime changes apply to this process (the front-end); model workers keep the verbose
level they were started with.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

from ...errors import InvalidArgument, Unsupported

LOG_FORMATS = ("default", "ISO8601")
_BOOL_KEYS = ("log_info", "log_warning", "log_error")


class TritonFormatter(logging.Formatter):
    """Triton's line prefixes; the logger name stands in for Triton's ``file:line``."""

    def __init__(self, iso8601: bool = False):
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname[:1]
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            prefix = f"{stamp} {level} {record.process} {record.name}]"
        else:
            t = time.localtime(record.created)
            micros = int((record.created % 1) * 1_000_000)
            prefix = f"{level}{time.strftime('%m%d %H:%M:%S', t)}.{micros:06d} {record.process} {record.name}]"
        text = f"{prefix} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


class LogSettings(logging.Filter):
    """The current settings; also the filter on the server's log handler."""

    def __init__(self, *, info: bool = True, warning: bool = True, error: bool = True, verbose: int = 0,
                 log_format: str = "default", log_file: str = ""):
        super().__init__()
        if log_format not in LOG_FORMATS:
            raise InvalidArgument(f"invalid argument for log_format, got: {log_format}")
        self.info, self.warning, self.error, self.verbose = info, warning, error, verbose
        self.fmt = log_format
        self.file = log_file
        self.handler: logging.Handler | None = None

    # -- logging.Filter ------------------------------------------------------------------
    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0

    # -- applying ------------------------------------------------------------------------
    def install(self) -> None:
        """Route the root logger to stderr (or ``log_file``) with these settings."""
        if self.file:
            handler: logging.Handler = logging.FileHandler(self.file, encoding="utf-8")
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(self)
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        self.handler = handler
        self.apply()

    def apply(self) -> None:
        logging.getLogger().setLevel(logging.DEBUG if self.verbose > 0 else logging.INFO)
        if self.handler is not None:
            self.handler.setFormatter(TritonFormatter(self.fmt == "ISO8601"))

    # -- the logging extension -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"log_file": self.file, "log_info": self.info, "log_warning": self.warning,
                "log_error": self.error, "log_verbose_level": self.verbose, "log_format": self.fmt}

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (a null value leaves a setting as it is); all or nothing."""
        if changes.get("log_file") is not None:
            raise Unsupported("log file location can not be updated through network protocol")
        new: dict[str, Any] = {}
        for key in _BOOL_KEYS:
            value = changes.get(key)
            if value is not None:
                if not isinstance(value, bool):
                    raise InvalidArgument(f"'{key}' must be a boolean, got: {value!r}")
                new[key] = value
        verbose = changes.get("log_verbose_level")
        if verbose is not None:
            if isinstance(verbose, bool) or not isinstance(verbose, int) or not 0 <= verbose < 2**32:
                raise InvalidArgument(f"'log_verbose_level' must be an unsigned integer, got: {verbose!r}")
            new["log_verbose_level"] = verbose
        fmt = changes.get("log_format")
        if fmt is not None:
            if fmt not in LOG_FORMATS:
                raise InvalidArgument(f"invalid argument for log_format, got: {fmt}")
            new["log_format"] = fmt
        self.info = new.get("log_info", self.info)
        self.warning = new.get("log_warning", self.warning)
        self.error = new.get("log_error", self.error)
        self.verbose = new.get("log_verbose_level", self.verbose)
        self.fmt = new.get("log_format", self.fmt)
        self.apply()
        if new:
            logging.getLogger(__name__).info("log settings updated: %s", new)
        return self.to_dict()


# Logging is process-wide (the root logger), so is the settings object that drives it.
_current: LogSettings | None = None


def install_logging(*, info: bool = True, warning: bool = True, error: bool = True, verbose: int = 0,
                    log_format: str = "default", log_file: str = "") -> LogSettings:
    """Configure the process's logging from start-up flags; :func:`current` returns it after."""
    global _current
    settings = LogSettings(info=info, warning=warning, error=error, verbose=verbose, log_format=log_format,
                           log_file=log_file)
    settings.install()
    _current = settings
    return settings


def current() -> LogSettings:
    """The installed settings (a detached default object when logging was not installed)."""
    return _current if _current is not None else LogSettings()
