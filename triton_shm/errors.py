"""One error hierarchy for the whole server.

Every layer raises a :class:`TritonShmError` subclass; each protocol adapter maps the
error code once (``HTTP_STATUS`` / ``GRPC_STATUS``), the way Triton maps its
``TRITONSERVER_Error`` codes.
"""
from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# Triton's HttpCodeFromError.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
}

# Names of grpc.StatusCode members (kept as strings so this module does not import grpc).
GRPC_STATUS: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN: "UNKNOWN",
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.INVALID_ARG: "INVALID_ARGUMENT",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.CANCELLED: "CANCELLED",
}


class TritonShmError(Exception):
    code: ErrorCode = ErrorCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def to_wire(self) -> dict:
        """Form used to carry the error between processes."""
        return {"code": self.code.value, "message": self.message}

    @staticmethod
    def from_wire(d: dict) -> "TritonShmError":
        cls = _BY_CODE.get(ErrorCode(d.get("code", "UNKNOWN")), TritonShmError)
        return cls(str(d.get("message", "")))


class InvalidArgument(TritonShmError):
    code = ErrorCode.INVALID_ARG


class NotFound(TritonShmError):
    code = ErrorCode.NOT_FOUND


class Unavailable(TritonShmError):
    code = ErrorCode.UNAVAILABLE


class Internal(TritonShmError):
    code = ErrorCode.INTERNAL


class Unsupported(TritonShmError):
    code = ErrorCode.UNSUPPORTED


class AlreadyExists(TritonShmError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(TritonShmError):
    code = ErrorCode.CANCELLED


_BY_CODE: dict[ErrorCode, type[TritonShmError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, Unavailable, Internal, Unsupported, AlreadyExists, Cancelled)
}
_BY_CODE[ErrorCode.UNKNOWN] = TritonShmError
