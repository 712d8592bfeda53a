"""gRPC's layer over HTTP/2: the 5-byte message prefix, compression, timeouts, status.

Everything here is pure bookkeeping on bytes; HTTP/2 itself (frames, HPACK, flow
control) is the protocol engine's.
"""
from __future__ import annotations

import zlib

from ...._twins import pick
from .frames_py import whole_frames_end  # noqa: F401 - the connection imports it from here

pick(globals(), "._frames", "whole_frames_end")

# grpc status codes (the wire values of grpc-status).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14
STATUS_CODES: dict[str, int] = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}

ACCEPT_ENCODING = b"identity,deflate,gzip"
# zlib window bits: deflate is the zlib format (RFC 1950) in gRPC, gzip has its header.
_WBITS = {b"gzip": 31, b"deflate": 15}


class GrpcError(Exception):
    """Ends one call with a status; raised by framing and by the adapters."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def supported_encoding(name: bytes) -> bool:
    return name in _WBITS or name == b"identity"


def compress(data: bytes, encoding: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, _WBITS[encoding])
    return c.compress(data) + c.flush()


def decompress(data: bytes | memoryview, encoding: bytes, limit: int) -> bytes:
    """Inflate at most ``limit`` bytes: a small compressed message may claim to inflate
    to gigabytes, so the bound applies to the output, not to the input."""
    if encoding not in _WBITS:
        raise GrpcError(INTERNAL, "compressed message received without a supported grpc-encoding")
    d = zlib.decompressobj(_WBITS[encoding])
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise GrpcError(INTERNAL, f"failed to decompress the message: {e}") from None
    if len(out) > limit:
        raise GrpcError(RESOURCE_EXHAUSTED,
                        f"decompressed message larger than max ({limit} bytes)")
    if not d.eof:
        raise GrpcError(INTERNAL, "compressed message is truncated")
    return out


def prefix(length: int, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + length.to_bytes(4, "big")


_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float:
    """grpc-timeout (at most 8 digits and a unit) in seconds; ValueError if malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(digits) * unit


def encode_message_text(message: str) -> bytes:
    """grpc-message is percent-encoded UTF-8: printable ASCII other than '%' stays."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


class MessageReader:
    """Splits a stream's DATA into gRPC messages, refusing any over ``limit`` as soon
    as its prefix is seen (before its body is buffered). Bodies are views of the DATA
    payloads where they can be (a message in one payload is not copied at all), joined
    once when a message spans payloads."""

    __slots__ = ("limit", "encoding", "_head", "_parts", "_have", "_need", "_compressed")

    def __init__(self, limit: int, encoding: bytes):
        self.limit = limit
        self.encoding = encoding
        self._head = bytearray()  # a prefix split across payloads
        self._parts: list[bytes | memoryview] = []
        self._have = 0
        self._need = -1  # body length of the message being read; -1 while reading a prefix
        self._compressed = False

    @property
    def pending(self) -> bool:
        """True while a message has begun but not ended (a truncated one at end of stream)."""
        return bool(self._head) or self._need >= 0

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """Add one DATA payload; return the messages it completes."""
        pos, n = 0, len(data)
        if (self._need < 0 and not self._head and n > 5 and data[0] == 0
                and int.from_bytes(data[1:5], "big") == n - 5 <= self.limit):
            # The common case, a payload that is exactly one uncompressed message: the
            # loop below would return this same view.
            return [memoryview(data)[5:]]
        out: list[bytes | memoryview] = []
        view: memoryview | None = None
        while pos < n:
            if self._need < 0:
                if not self._head and n - pos >= 5:
                    head = data[pos:pos + 5]
                    pos += 5
                else:  # the prefix is split across payloads
                    take = min(5 - len(self._head), n - pos)
                    self._head += data[pos:pos + take]
                    pos += take
                    if len(self._head) < 5:
                        break
                    head, self._head = bytes(self._head), bytearray()
                if head[0] > 1:
                    raise GrpcError(INTERNAL, f"invalid gRPC message flag {head[0]}")
                self._compressed = head[0] == 1
                self._need = int.from_bytes(head[1:5], "big")
                if self._need > self.limit:
                    raise GrpcError(RESOURCE_EXHAUSTED,
                                    f"received message larger than max ({self._need} vs. {self.limit})")
            take = min(self._need - self._have, n - pos)
            if take:
                if pos == 0 and take == n:
                    self._parts.append(data)  # the whole payload
                else:
                    if view is None:
                        view = memoryview(data)
                    self._parts.append(view[pos:pos + take])
                self._have += take
                pos += take
            if self._have == self._need:
                parts = self._parts
                body = parts[0] if len(parts) == 1 else b"".join(parts) if parts else b""
                if self._compressed:
                    body = decompress(body, self.encoding, self.limit)
                out.append(body)
                self._parts, self._have, self._need = [], 0, -1
        return out


# HTTP/2 framing, as far as the receive path needs it to cut its input between frames.
FRAME_HEADER = 9  # 24-bit length, type, flags, stream id
DATA_FRAME = 0
PREFACE = 24  # the client's connection preface comes before its first frame


def frame_length(buf: memoryview, pos: int) -> int:
    """The payload length in the frame header at ``pos``."""
    return buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]

