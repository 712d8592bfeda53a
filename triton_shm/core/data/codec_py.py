"""BYTES tensor codec, pure Python. Twin of the C extension ``_codec``.

A BYTES tensor is encoded as its elements in row-major order, each a little-endian
uint32 length followed by that many bytes. Used when the extension is not built or
``TRITON_SHM_NO_EXTENSIONS=1``; the tests run both.
"""
from __future__ import annotations

import struct

import numpy as np

from ...errors import InvalidArgument

_LEN = struct.Struct("<I")


def _scan(buf: memoryview, count: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(buf)
    for _ in range(count):
        if end - pos < 4:
            raise InvalidArgument(
                f"BYTES tensor holds fewer than the {count} elements its shape needs "
                f"(data ends after {len(spans)} elements)")
        (n,) = _LEN.unpack_from(buf, pos)
        pos += 4
        if n > end - pos:
            raise InvalidArgument(
                f"BYTES element {len(spans)} declares more bytes than the {end - pos} that remain in the buffer")
        spans.append((pos, n))
        pos += n
    if pos != end:
        raise InvalidArgument(
            f"BYTES tensor has {end - pos} unexpected trailing bytes after its {count} elements")
    return spans


def validate_bytes(buf, count: int) -> None:
    """Check that ``buf`` holds exactly ``count`` well-formed elements."""
    _scan(memoryview(buf).cast("B"), count)


def deserialize_bytes(buf, count: int) -> np.ndarray:
    """Decode ``count`` elements into a 1-D object array of ``bytes``."""
    view = memoryview(buf).cast("B")
    out = np.empty(count, dtype=np.object_)
    for i, (pos, n) in enumerate(_scan(view, count)):
        out[i] = bytes(view[pos:pos + n])
    return out


def count_bytes(buf) -> int:
    """The number of elements ``buf`` holds, when they fill it exactly."""
    view = memoryview(buf).cast("B")
    pos, end, count = 0, len(view), 0
    while pos < end:
        if end - pos < 4:
            raise InvalidArgument(f"BYTES tensor ends in a partial length prefix after {count} elements")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if n > end - pos:
            raise InvalidArgument(
                f"BYTES element {count} declares more bytes than the {end - pos} that remain in the buffer")
        pos += n
        count += 1
    return count


def _as_bytes(item) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(array) -> bytes:
    """Encode an array of bytes/str (any shape, row-major) into the wire form."""
    items = [_as_bytes(x) for x in np.asarray(array, dtype=np.object_).reshape(-1)]
    parts = bytearray()
    for item in items:
        parts += _LEN.pack(len(item))
        parts += item
    return bytes(parts)


def split_bytes(buf, counts: list[int]) -> list[int]:
    """Byte sizes of consecutive groups of ``counts`` elements of an encoded BYTES tensor."""
    view = memoryview(buf).cast("B")
    spans = _scan(view, sum(counts))
    sizes, first, start = [], 0, 0
    for n in counts:
        end = spans[first + n - 1][0] + spans[first + n - 1][1] if n else start
        sizes.append(end - start)
        first += n
        start = end
    return sizes
