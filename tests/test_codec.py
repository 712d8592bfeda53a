"""The BYTES codec: the C extension and its pure-Python twin must agree, on good and bad input."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from triton_shm.core.data import codec_py
from triton_shm.errors import InvalidArgument

from .helpers import twin_params

try:
    from triton_shm.core.data import _codec
except ImportError:  # not built
    _codec = None

IMPLEMENTATIONS = twin_params(codec_py, _codec)


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


@pytest.mark.parametrize("values", [[], [b""], [b"ab", b"", "日本".encode()], [b"x" * 300] * 7])
def test_count_bytes_counts_what_serialize_wrote(impl, values):
    data = impl.serialize_bytes(np.array(values, dtype=np.object_))
    assert impl.count_bytes(data) == len(values)
    assert list(impl.deserialize_bytes(data, impl.count_bytes(data))) == values


@pytest.mark.parametrize("data,needle", [
    (struct.pack("<I", 1) + b"a" + b"\x01\x00", "ends in a partial length prefix after 1 elements"),
    (struct.pack("<I", 5) + b"abc", "BYTES element 0 declares more bytes than the 3 that remain"),
    (struct.pack("<I", 0xFFFFFFFF), "BYTES element 0 declares more bytes than the 0 that remain"),
])
def test_count_bytes_refuses_what_does_not_fill_the_buffer(impl, data, needle):
    with pytest.raises(InvalidArgument, match=needle):
        impl.count_bytes(data)


def test_python_backend_helpers_use_the_codec_and_match_tritonclient():
    """pb_utils.serialize_byte_tensor / deserialize_bytes_tensor, as models call them."""
    from tritonclient.utils import serialize_byte_tensor as client_serialize

    from triton_shm.backends.python import triton_python_backend_utils as pb_utils
    values = np.array([[b"", "héllo".encode()], [b"\x00\xff", b"z" * 70]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded == client_serialize(values).item()
    assert pb_utils.serialize_byte_tensor(values.astype(np.bytes_)) == encoded  # an 'S' array alike
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == list(values.reshape(-1))
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    with pytest.raises(
        pb_utils.TritonModelException,
        match="^truncated BYTES tensor: BYTES element 3 declares more bytes than the 69 that remain",
    ):
        pb_utils.deserialize_bytes_tensor(encoded[:-1])
