"""The BYTES codec: the C extension and its pure-Python twin must agree, on good and bad input."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from triton_shm.core import codec_py
from triton_shm.errors import InvalidArgument

try:
    from triton_shm.core import _codec
except ImportError:  # not built
    _codec = None

IMPLEMENTATIONS = [pytest.param(codec_py, id="python"),
                   pytest.param(_codec, id="c", marks=pytest.mark.skipif(_codec is None, reason="extension not built"))]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    return request.param


def test_roundtrip_empty_and_non_ascii(impl):
    values = np.array([b"", "héllo wörld".encode(), b"\x00\xff", "日本".encode()], dtype=np.object_)
    data = impl.serialize_bytes(values)
    assert data[:4] == b"\x00\x00\x00\x00"
    out = impl.deserialize_bytes(data, 4)
    assert out.dtype == np.object_ and list(out) == list(values)


def test_serialize_accepts_str_and_nd_arrays(impl):
    data = impl.serialize_bytes(np.array([["a", "bc"], ["", "d"]], dtype=np.object_))
    assert list(impl.deserialize_bytes(data, 4)) == [b"a", b"bc", b"", b"d"]


def test_both_implementations_write_identical_bytes():
    if _codec is None:
        pytest.skip("extension not built")
    values = np.array([b"x" * n for n in range(50)], dtype=np.object_)
    assert _codec.serialize_bytes(values) == codec_py.serialize_bytes(values)


@pytest.mark.parametrize("data,count,needle", [
    (struct.pack("<I", 10) + b"abc", 1, "declares more bytes"),     # length runs past the buffer
    (struct.pack("<I", 1) + b"a" + b"\x01", 1, "trailing"),          # garbage after the last element
    (struct.pack("<I", 1) + b"a", 2, "fewer than the 2 elements"),   # too few elements
    (b"\x01\x00", 1, "fewer than the 1 elements"),                   # truncated length prefix
    (struct.pack("<I", 0xFFFFFFFF), 1, "declares more bytes"),       # huge length, no overflow
])
def test_malformed_buffers_are_rejected(impl, data, count, needle):
    with pytest.raises(InvalidArgument, match=needle):
        impl.validate_bytes(data, count)
    with pytest.raises(InvalidArgument, match=needle):
        impl.deserialize_bytes(data, count)


def test_memoryview_input(impl):
    data = bytearray(impl.serialize_bytes(np.array([b"ab", b"c"], dtype=np.object_)))
    assert list(impl.deserialize_bytes(memoryview(data), 2)) == [b"ab", b"c"]
