"""Every V2 datatype round-trips exactly through a real server, over every wire form.

Python identity models (``server`` fixture, ``identity_<dtype>``) are driven with
tritonclient over HTTP binary, HTTP JSON and gRPC raw contents; ONNX identity models
(one per datatype ORT can run) over gRPC; and the BYTES codec is exercised once more
against a server started with ``TRITON_SHM_NO_EXTENSIONS=1`` (the pure-Python twin).
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .conftest import ALL_DATATYPES
from .harness import ServerProcess
from .models import onnx_identity, python_identity

BF16 = ml_dtypes.bfloat16

_INT_TYPES = {"UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
              "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64}
_FLOAT_TYPES = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}

# BYTES elements: empty, non-ASCII (é, 日本), embedded NUL, and a long one.
TEXT_VALUES = [b"", "é".encode(), "日本".encode(), b"a\x00b", b"\x00", b"plain", b"x" * 1000, b""]
# Only the binary forms can carry bytes that are not UTF-8.
BINARY_ONLY_VALUES = [b"\xff\xfe\x00\x80"]


def sample(datatype: str, *, special: bool = True) -> np.ndarray:
    """Values that probe the edges of ``datatype``. ``special`` adds NaN/inf for floats
    (only the binary forms can carry them)."""
    if datatype == "BOOL":
        return np.array([True, False, False, True, True], dtype=bool)
    if datatype in _INT_TYPES:
        t = _INT_TYPES[datatype]
        info = np.iinfo(t)
        return np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1, 42], dtype=t)
    if datatype in _FLOAT_TYPES:
        t = _FLOAT_TYPES[datatype]
        info = np.finfo(t)
        values = [0.0, -0.0, 1.5, -2.25, float(info.max), float(info.min), float(info.tiny), float(info.eps)]
        if special:
            values += [float("nan"), float("inf"), float("-inf")]
        return np.array(values, dtype=t)
    if datatype == "BF16":
        # All exactly representable in bfloat16 (8 significant bits).
        values = [0.0, -0.0, 1.0, -2.5, 3.140625, 65280.0, 2.0 ** -126, -(2.0 ** 100)]
        if special:
            values += [float("nan"), float("inf"), float("-inf")]
        return np.array(values, dtype=BF16)
    if datatype == "BYTES":
        values = TEXT_VALUES + (BINARY_ONLY_VALUES if special else [])
        arr = np.empty(len(values), dtype=np.object_)
        arr[:] = values
        return arr
    raise AssertionError(datatype)


def assert_exact(got: np.ndarray, want: np.ndarray, datatype: str) -> None:
    """Element-for-element equality; floats compared bit for bit (NaN, -0.0 included)."""
    assert got is not None, "output missing from the response"
    assert list(got.shape) == list(want.shape)
    if datatype == "BYTES":
        # JSON outputs come back as str (tritonclient does not encode them); compare as UTF-8.
        norm = lambda x: x.encode("utf-8") if isinstance(x, str) else bytes(x)  # noqa: E731
        assert [norm(x) for x in got.reshape(-1)] == [norm(x) for x in want.reshape(-1)]
    elif datatype in ("FP16", "BF16", "FP32", "FP64"):
        width = {"FP16": np.uint16, "BF16": np.uint16, "FP32": np.uint32, "FP64": np.uint64}[datatype]
        assert got.dtype.itemsize == want.dtype.itemsize
        np.testing.assert_array_equal(np.ascontiguousarray(got).view(width), want.view(width))
    else:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)


def _http_infer(url: str, model: str, data: np.ndarray, datatype: str, binary: bool):
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
        inp.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        return client.infer(model, [inp], outputs=[out]).as_numpy("OUTPUT0")
    finally:
        client.close()


def _grpc_infer(url: str, model: str, data: np.ndarray, datatype: str):
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


def _post_json(url: str, path: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{url}{path}", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


# --------------------------------------------------------------------------- python identity models

@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_python_identity_http_binary(server, datatype):
    data = sample(datatype)
    assert_exact(_http_infer(server.http_url, f"identity_{datatype.lower()}", data, datatype, True),
                 data, datatype)


@pytest.mark.parametrize("datatype", [d for d in ALL_DATATYPES if d not in ("FP16", "BF16")])
def test_python_identity_http_json(server, datatype):
    data = sample(datatype, special=False)  # JSON has no NaN/inf and carries text only
    assert_exact(_http_infer(server.http_url, f"identity_{datatype.lower()}", data, datatype, False),
                 data, datatype)


@pytest.mark.parametrize("data", [
    [1.5, 2**64 - 1],      # a float among huge ints
    [-1, 2**64 - 1],       # negative
    [2**64],               # past the range
], ids=["float", "negative", "too_big"])
def test_uint64_json_rejects_non_uint64(server, data):
    status, body = _post_json(server.http_url, "/v2/models/identity_uint64/infer", {
        "inputs": [{"name": "INPUT0", "datatype": "UINT64", "shape": [len(data)], "data": data}]})
    assert status == 400, body
    assert "INPUT0" in body["error"], body


@pytest.mark.parametrize("datatype,data", [
    ("INT32", [True, 5]), ("UINT64", [True, 2**64 - 1]), ("FP32", [False, 1.5]), ("INT8", [1, False]),
])
def test_json_bool_in_numeric_tensor_rejected(server, datatype, data):
    status, body = _post_json(server.http_url, f"/v2/models/identity_{datatype.lower()}/infer", {
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [len(data)], "data": data}]})
    assert status == 400, body


@pytest.mark.parametrize("datatype,data", [("INT32", [True, False]), ("INT32", [1.5, 2]), ("BOOL", [1, 0])])
def test_json_type_mismatch_rejected(server, datatype, data):
    status, body = _post_json(server.http_url, f"/v2/models/identity_{datatype.lower()}/infer", {
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [len(data)], "data": data}]})
    assert status == 400, body
    assert "INPUT0" in body["error"], body


def test_uint64_json_below_int64_max(server):
    """The part of the UINT64 range numpy infers as integers does work over JSON."""
    data = np.array([0, 1, 2**63 - 1, 12345], dtype=np.uint64)
    assert_exact(_http_infer(server.http_url, "identity_uint64", data, "UINT64", False), data, "UINT64")


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_input_is_rejected(server, datatype):
    status, body = _post_json(server.http_url, f"/v2/models/identity_{datatype.lower()}/infer", {
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [2], "data": [1.0, 2.0]}]})
    assert status == 400, body
    assert body == {"error": f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                             "format for input INPUT0"}, body
    # The server keeps serving the model afterwards.
    data = sample(datatype)
    assert_exact(_http_infer(server.http_url, f"identity_{datatype.lower()}", data, datatype, True),
                 data, datatype)


def _binary_input_json_output(url: str, model: str, data: np.ndarray, datatype: str,
                              outputs: list | None) -> tuple[int, dict]:
    """A binary input; the output in JSON, asked for (``outputs``) or by default (None)."""
    raw = data.tobytes()
    doc: dict = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": list(data.shape),
                             "parameters": {"binary_data_size": len(raw)}}]}
    if outputs is not None:
        doc["outputs"] = outputs
    header = json.dumps(doc).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=header + raw, method="POST",
                                 headers={"Inference-Header-Content-Length": str(len(header))})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.parametrize("outputs", [
    [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    [{"name": "OUTPUT0"}],
    None,
], ids=["binary_data_false", "listed_without_binary_data", "not_listed"])
@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_output_is_rejected(server, datatype, outputs):
    """FP16/BF16 outputs can not be sent as JSON: 400, naming the binary data format."""
    data = sample(datatype, special=False)
    model = f"identity_{datatype.lower()}"
    status, body = _binary_input_json_output(server.http_url, model, data.view(np.uint16), datatype, outputs)
    assert status == 400, body
    assert body == {"error": f"sending {datatype} data via JSON is not supported. Please use the binary data "
                             "format for output"}, body
    # as binary the same output comes back exactly
    assert_exact(_http_infer(server.http_url, model, data, datatype, True), data, datatype)


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_python_identity_grpc_raw(server, datatype):
    data = sample(datatype)
    assert_exact(_grpc_infer(server.grpc_url, f"identity_{datatype.lower()}", data, datatype), data, datatype)


@pytest.mark.parametrize("datatype", ["BYTES", "FP32"])
def test_empty_tensor_roundtrip(server, datatype):
    data = np.empty([0], dtype=np.object_ if datatype == "BYTES" else np.float32)
    got = _grpc_infer(server.grpc_url, f"identity_{datatype.lower()}", data, datatype)
    assert list(got.shape) == [0]
    got = _http_infer(server.http_url, f"identity_{datatype.lower()}", data, datatype, True)
    assert list(got.shape) == [0]


def test_bytes_json_output_of_non_utf8_is_lossless_latin1(server):
    """Binary BYTES in, JSON out: bytes that are not UTF-8 still come back one code point
    per byte (the server's documented latin-1 fallback), never a 500."""
    data = np.array([b"\xff\xfe", "é".encode()], dtype=np.object_)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT0", [2], "BYTES")
        inp.set_data_from_numpy(data, binary_data=True)
        result = client.infer("identity_bytes", [inp],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    finally:
        client.close()
    assert result.get_output("OUTPUT0")["data"] == ["\xff\xfe", "é"]


# --------------------------------------------------------------------------- ONNX identity models

# ORT's Identity kernel covers these; BF16 is left out because the server's onnxruntime
# backend refuses BF16 inputs (numpy has no bfloat16 dtype to feed ORT with) -- checked
# separately by test_onnx_bf16_gives_clear_error.
ONNX_DATATYPES = [d for d in ALL_DATATYPES if d != "BF16"]


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx_types")
    repo = root / "models"
    for dt in [*ONNX_DATATYPES, "BF16"]:
        # No config.pbtxt: auto-complete makes it batchable with max_batch_size 4.
        onnx_identity(repo / f"onnx_identity_{dt.lower()}" / "1" / "model.onnx", dt)
    srv = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error=false"]).start(wait_ready=False)
    yield srv
    srv.stop_cleanly()


@pytest.mark.parametrize("datatype", ONNX_DATATYPES)
def test_onnx_identity_grpc(onnx_server, datatype):
    data = sample(datatype, special=datatype != "BYTES")  # ORT strings are UTF-8 text
    batch = data.reshape(1, -1)
    assert_exact(_grpc_infer(onnx_server.grpc_url, f"onnx_identity_{datatype.lower()}", batch, datatype),
                 batch, datatype)


def test_onnx_bf16_gives_clear_error(onnx_server):
    data = sample("BF16").reshape(1, -1)
    with pytest.raises(InferenceServerException) as e:
        _grpc_infer(onnx_server.grpc_url, "onnx_identity_bf16", data, "BF16")
    assert "BF16" in str(e.value)
    # the model stays loaded and other models keep working
    ok = sample("FP32").reshape(1, -1)
    assert_exact(_grpc_infer(onnx_server.grpc_url, "onnx_identity_fp32", ok, "FP32"), ok, "FP32")


# --------------------------------------------------------------------------- pure-Python codec twin

@pytest.fixture(scope="module")
def server_noext(tmp_path_factory):
    root = tmp_path_factory.mktemp("noext")
    repo = root / "models"
    for dt in ("BYTES", "INT32"):
        python_identity(repo, f"identity_{dt.lower()}", dt)
    srv = ServerProcess(repo, root / "server.log", env={"TRITON_SHM_NO_EXTENSIONS": "1"}).start()
    yield srv
    srv.stop_cleanly()


@pytest.mark.parametrize("datatype", ["BYTES", "INT32"])
@pytest.mark.parametrize("wire", ["http_binary", "http_json", "grpc"])
def test_noext_roundtrip(server_noext, datatype, wire):
    model = f"identity_{datatype.lower()}"
    if wire == "grpc":
        data = sample(datatype)
        got = _grpc_infer(server_noext.grpc_url, model, data, datatype)
    else:
        binary = wire == "http_binary"
        data = sample(datatype, special=binary)
        got = _http_infer(server_noext.http_url, model, data, datatype, binary)
    assert_exact(got, data, datatype)


def test_noext_malformed_bytes_rejected(server_noext):
    """The pure-Python validator rejects a BYTES element that runs past the buffer."""
    import http.client
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": 7}}]}).encode()
    body = header + b"\x10\x00\x00\x00abc"  # declares 16 bytes, holds 3
    conn = http.client.HTTPConnection(server_noext.http_url, timeout=30)
    try:
        conn.request("POST", "/v2/models/identity_bytes/infer", body=body,
                     headers={"Inference-Header-Content-Length": str(len(header)),
                              "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        payload = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 400, payload
    assert "INPUT0" in payload["error"]
