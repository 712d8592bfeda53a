"""HTTP/REST front-end against a real server process, through tritonclient and raw HTTP.

The module builds its own repository: the core models of conftest plus ``echo``, a Python
model that returns what it was handed (request parameters, requested output names and
the request id) so the tests can see what reaches a model.
"""
from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import struct
import time
import zlib
import urllib.parse

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from .conftest import build_core_repository
from .harness import ServerProcess
from .models import ECHO_CONFIG, ECHO_PY, write_model
from .helpers import assert_serving

pytestmark = pytest.mark.timeout(120)

def build_repository(repo):
    build_core_repository(repo)
    write_model(repo, "echo", config=ECHO_CONFIG, model_py=ECHO_PY)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_server")
    srv = ServerProcess(build_repository(root / "models"), root / "server.log").start()
    yield srv
    srv.stop_cleanly()


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=60.0)
    yield c
    c.close()


# --------------------------------------------------------------------------- helpers
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 0.5, dtype=np.float32)


def raw(server, method, path, body=None, headers=None, timeout=30):
    """One HTTP exchange on a fresh connection: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def post_json(server, path, doc, headers=None):
    body = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    return raw(server, "POST", path, body, {"Content-Type": "application/json", **(headers or {})})


def binary_request(inputs, outputs=None, parameters=None, request_id=None):
    """inputs: (name, datatype, shape, bytes | json list). Bytes go binary, lists as JSON."""
    doc = {"inputs": []}
    blobs = []
    for name, datatype, shape, data in inputs:
        entry = {"name": name, "datatype": datatype, "shape": list(shape)}
        if isinstance(data, (bytes, bytearray)):
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(bytes(data))
        else:
            entry["data"] = data
        doc["inputs"].append(entry)
    if outputs is not None:
        doc["outputs"] = outputs
    if parameters is not None:
        doc["parameters"] = parameters
    if request_id is not None:
        doc["id"] = request_id
    header = json.dumps(doc).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                       "Content-Type": "application/octet-stream"}


def split_binary_response(headers, body):
    length = headers.get("Inference-Header-Content-Length")
    if length is None:
        return json.loads(body), b""
    n = int(length)
    return json.loads(body[:n]), body[n:]


def assert_error(status, headers, body, expected_status, *fragments):
    assert status == expected_status, (status, body[:2000])
    assert headers.get("Content-Type", "").startswith("application/json"), headers.get("Content-Type")
    doc = json.loads(body)
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    message = doc["error"]
    assert isinstance(message, str) and message.strip(), doc
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def add_sub_inputs(a=A, b=B, binary=(True, True)):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
              httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary[0])
    inputs[1].set_data_from_numpy(b, binary_data=binary[1])
    return inputs


def fp32_bytes(shape):
    return np.ones(shape, dtype=np.float32).tobytes()


# --------------------------------------------------------------------------- health, metadata
def test_health_live_and_ready(server, client):
    assert client.is_server_live()
    assert client.is_server_ready()
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = raw(server, "GET", path)
        assert status == 200 and body == b""


def test_server_metadata(server, client):
    md = client.get_server_metadata()
    assert md["name"] == "triton"
    assert isinstance(md["version"], str) and md["version"]
    extensions = md["extensions"]
    assert "binary_tensor_data" in extensions
    assert "statistics" in extensions  # perf_analyzer reads server-side stats when listed
    assert "system_shared_memory" not in extensions
    assert "cuda_shared_memory" not in extensions
    status, headers, body = raw(server, "GET", "/v2")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == md


def test_model_metadata(client):
    md = client.get_model_metadata("add_sub")
    assert md["name"] == "add_sub"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                            {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                             {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]}]
    assert client.get_model_metadata("add_sub", "1") == md
    # no batch dimension without max_batch_size
    ident = client.get_model_metadata("identity_bytes")
    assert ident["platform"] == "python"
    assert ident["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]


def test_model_metadata_unknown(server, client):
    with pytest.raises(InferenceServerException, match="nope"):
        client.get_model_metadata("nope")
    assert_error(*raw(server, "GET", "/v2/models/nope"), 404, "unknown model")
    assert_error(*raw(server, "GET", "/v2/models/add_sub/versions/4"), 404, "version 4")
    assert_error(*raw(server, "GET", "/v2/models/nope/config"), 404, "unknown model")


def test_model_config_json(server, client):
    cfg = client.get_model_config("add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 8
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    for tensor in cfg["input"] + cfg["output"]:
        assert tensor["data_type"] == "TYPE_FP32"
        assert tensor["dims"] == [16]
        assert all(type(d) is int for d in tensor["dims"]), tensor["dims"]  # numbers, not "16"
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["instance_group"][0]["count"] >= 1
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    # the raw body has numbers, not strings, for int64 fields
    status, _, body = raw(server, "GET", "/v2/models/add_sub/config")
    assert status == 200
    assert b'"dims":[16]' in body.replace(b" ", b"")


def test_model_ready(server, client):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "4")
    assert not client.is_model_ready("nope")
    status, _, _ = raw(server, "GET", "/v2/models/add_sub/ready")
    assert status == 200
    status, headers, body = raw(server, "GET", "/v2/models/nope/ready")
    assert assert_error(status, headers, body, 400) == "Model version not ready"  # Triton 2.51's answer


def test_repository_index(server, client):
    index = client.get_model_repository_index()
    rows = {r["name"]: r for r in index}
    assert rows["add_sub"]["version"] == "1"
    assert rows["add_sub"]["state"] == "READY"
    assert "identity_bf16" in rows and "echo" in rows
    status, _, body = post_json(server, "/v2/repository/index", {"ready": True})
    assert status == 200
    assert {r["name"] for r in json.loads(body)} == set(rows)
    assert_error(*post_json(server, "/v2/repository/index", b"{nope"), 400)


# --------------------------------------------------------------------------- inference
@pytest.mark.parametrize("binary", [(True, True), (False, False), (True, False), (False, True)],
                         ids=["binary", "json", "mixed-bj", "mixed-jb"])
def test_infer_inputs(client, binary):
    a = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b, binary))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert result.as_numpy("OUTPUT0").shape == (3, 16)
    assert result.get_response()["model_name"] == "add_sub"
    assert result.get_response()["model_version"] == "1"


def test_infer_output_encodings(client):
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = client.infer("add_sub", add_sub_inputs(), outputs=outputs)
    resp = {o["name"]: o for o in result.get_response()["outputs"]}
    assert resp["OUTPUT0"]["parameters"]["binary_data_size"] == 64
    assert "data" not in resp["OUTPUT0"]
    assert resp["OUTPUT1"]["data"] == (A - B).ravel().tolist()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_infer_all_json_response_is_plain_json(server):
    status, headers, body = post_json(server, "/v2/models/add_sub/infer", {
        "id": "r-42",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": A.tolist()},  # nested
                   {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": B.ravel().tolist()}]})
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert "Inference-Header-Content-Length" not in headers
    doc = json.loads(body)
    assert doc["id"] == "r-42"
    assert doc["model_name"] == "add_sub" and doc["model_version"] == "1"
    outs = {o["name"]: o for o in doc["outputs"]}
    assert outs["OUTPUT0"]["shape"] == [1, 16] and outs["OUTPUT0"]["datatype"] == "FP32"
    assert outs["OUTPUT0"]["data"] == (A + B).ravel().tolist()


def test_infer_raw_binary_response(server):
    body, headers = binary_request(
        [("INPUT0", "FP32", [1, 16], A.tobytes()), ("INPUT1", "FP32", [1, 16], B.tobytes())],
        parameters={"binary_data_output": True})
    status, rheaders, rbody = raw(server, "POST", "/v2/models/add_sub/versions/1/infer", body, headers)
    assert status == 200
    assert rheaders["Content-Type"] == "application/octet-stream"
    doc, blob = split_binary_response(rheaders, rbody)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [64, 64] and len(blob) == 128
    got = {o["name"]: np.frombuffer(blob[64 * i:64 * (i + 1)], dtype="<f4")
           for i, o in enumerate(doc["outputs"])}
    np.testing.assert_array_equal(got["OUTPUT0"], (A + B).ravel())
    np.testing.assert_array_equal(got["OUTPUT1"], (A - B).ravel())


def test_requested_output_subset(client):
    result = client.infer("add_sub", add_sub_inputs(), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_request_id_echoed(client):
    result = client.infer("add_sub", add_sub_inputs(), request_id="my-request-7")
    assert result.get_response()["id"] == "my-request-7"
    result = client.infer("add_sub", add_sub_inputs())
    assert "id" not in result.get_response()  # no id asked, none answered (as Triton)


def test_parameters_and_outputs_reach_the_model(client):
    inp = httpclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], dtype=np.int32))
    outputs = [httpclient.InferRequestedOutput("PARAMS", binary_data=False),
               httpclient.InferRequestedOutput("REQUESTED", binary_data=False),
               httpclient.InferRequestedOutput("REQUEST_ID", binary_data=False)]
    result = client.infer("echo", [inp], outputs=outputs, request_id="abc",
                          parameters={"custom_s": "hello", "custom_i": 12, "custom_b": True})
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params["custom_s"] == "hello" and params["custom_i"] == 12 and params["custom_b"] is True
    assert json.loads(result.as_numpy("REQUESTED")[0]) == sorted(["PARAMS", "REQUEST_ID", "REQUESTED"])
    assert result.as_numpy("REQUEST_ID")[0] == "abc"  # a JSON string: tritonclient gives str

    # a subset: the model is told which outputs were asked for, and only those come back
    result = client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("REQUESTED")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["REQUESTED"]
    assert json.loads(result.as_numpy("REQUESTED")[0]) == ["REQUESTED"]


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "UINT64", "INT8", "INT16", "INT64", "FP64", "FP16", "BYTES"])
def test_identity_datatypes_binary(client, datatype):
    if datatype == "BYTES":
        data = np.array([b"a", b"", "\u00e9".encode(), b"\x00\xff"], dtype=np.object_)
    elif datatype == "BOOL":
        data = np.array([True, False, True])
    else:
        data = np.arange(5).astype(np.dtype(datatype.lower().replace("fp", "float")))
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=True)
    result = client.infer(f"identity_{datatype.lower()}", [inp])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == data.shape
    np.testing.assert_array_equal(out, data)


def test_bytes_json_roundtrip(client):
    data = np.array([b"hello", b"", "w\u00f6rld".encode()], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=False)
    result = client.infer(
        "identity_bytes", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    assert result.get_response()["outputs"][0]["data"] == ["hello", "", "w\u00f6rld"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client, algorithm):
    a = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, a, (False, True)),
                          request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))


def test_raw_gzip_request(server):
    body, headers = binary_request(
        [("INPUT0", "FP32", [1, 16], A.tobytes()), ("INPUT1", "FP32", [1, 16], B.ravel().tolist())])
    # Inference-Header-Content-Length refers to the uncompressed body
    status, rheaders, rbody = raw(server, "POST", "/v2/models/add_sub/infer", gzip.compress(body),
                                  {**headers, "Content-Encoding": "gzip"})
    assert status == 200, rbody
    doc, _ = split_binary_response(rheaders, rbody)
    outs = {o["name"]: o for o in doc["outputs"]}
    assert outs["OUTPUT0"]["data"] == (A + B).ravel().tolist()


def test_aio_client_infer(server):
    async def run():
        c = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            assert await c.is_server_live()
            assert await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            a = np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)
            results = await asyncio.gather(*(
                c.infer("add_sub", add_sub_inputs(a * i, a), request_id=str(i)) for i in range(8)))
            for i, r in enumerate(results):
                assert r.get_response()["id"] == str(i)
                np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a * i + a, rtol=1e-6)
                np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a * i - a, rtol=1e-6, atol=1e-6)
            r = await c.infer("add_sub", add_sub_inputs(), outputs=[aiohttpclient.InferRequestedOutput("OUTPUT0")],
                              response_compression_algorithm="gzip")
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
            with pytest.raises(InferenceServerException, match="unknown model"):
                await c.infer("nope", add_sub_inputs())
        finally:
            await c.close()
    asyncio.run(run())


def test_aio_client_metadata(server):
    async def run():
        c = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            md = await c.get_server_metadata()
            assert "binary_tensor_data" in md["extensions"]
            md = await c.get_model_metadata("add_sub")
            assert md["inputs"][0]["shape"] == [-1, 16]
            cfg = await c.get_model_config("add_sub")
            assert cfg["max_batch_size"] == 8
            index = await c.get_model_repository_index()
            assert "add_sub" in {r["name"] for r in index}
        finally:
            await c.close()
    asyncio.run(run())


def test_metadata_not_compressed_for_accept_encoding(server):
    """Triton compresses only inference responses; clients that do not inflate (tritonclient
    aio) rely on that."""
    status, headers, body = raw(server, "GET", "/v2/models/add_sub", headers={"Accept-Encoding": "gzip, deflate"})
    assert status == 200
    assert headers.get("Content-Encoding") is None
    assert json.loads(body)["name"] == "add_sub"


def test_client_errors_surface_as_exceptions(client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(np.ones((9, 16), np.float32), np.ones((9, 16), np.float32)))
    assert "batch-size must be <= 8" in str(e.value)
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(), model_version="4")
    assert e.value.status() == "404"


# --------------------------------------------------------------------------- bad input
def _good(name, shape=(1, 16)):
    return (name, "FP32", list(shape), fp32_bytes(shape))


def _bad_cases():
    """(id, path, body, headers, status, fragments)."""
    ok = "/v2/models/add_sub/infer"
    cases = []

    def case(id_, body_headers, status, *fragments, path=ok):
        body, headers = body_headers if isinstance(body_headers, tuple) else (body_headers, {})
        cases.append(pytest.param(path, body, headers, status, fragments, id=id_))

    case("malformed-json", b'{"inputs": [', 400, "JSON")
    case("json-not-object", b'[1, 2]', 400)
    case("unknown-model", binary_request([_good("INPUT0"), _good("INPUT1")]), 404, "nope",
         path="/v2/models/nope/infer")
    case("unknown-version", binary_request([_good("INPUT0"), _good("INPUT1")]), 404, "version 4",
         path="/v2/models/add_sub/versions/4/infer")
    case("missing-input", binary_request([_good("INPUT0")]), 400, "INPUT1")
    case("extra-input", binary_request([_good("INPUT0"), _good("INPUT1"), _good("INPUT2")]), 400, "INPUT2")
    case("wrong-datatype", binary_request([_good("INPUT0"), ("INPUT1", "INT32", [1, 16], fp32_bytes((1, 16)))]),
         400, "INPUT1", "FP32")
    case("unknown-datatype", binary_request([_good("INPUT0"), ("INPUT1", "FP8", [1, 16], fp32_bytes((1, 16)))]),
         400, "INPUT1")
    case("shape-mismatch", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 15], fp32_bytes((1, 15)))]),
         400, "unexpected shape", "INPUT1")
    case("rank-mismatch", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1], fp32_bytes((1,)))]),
         400, "unexpected shape", "INPUT1")
    case("batch-dim-missing", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [16], fp32_bytes((16,)))]),
         400, "batch")
    case("byte-size-mismatch", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 16], b"\0" * 60)]),
         400, "INPUT1", "60")
    case("batch-too-big", binary_request([_good("INPUT0", (9, 16)), _good("INPUT1", (9, 16))]),
         400, "batch-size must be <= 8")
    case("batch-mismatch", binary_request([_good("INPUT0", (2, 16)), _good("INPUT1", (3, 16))]), 400)
    case("negative-dim", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [-1, 16], fp32_bytes((1, 16)))]),
         400, "INPUT1")
    case("zero-batch", binary_request([("INPUT0", "FP32", [0, 16], b""), ("INPUT1", "FP32", [0, 16], b"")]),
         400)
    case("non-int-dim", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 16.5], fp32_bytes((1, 16)))]),
         400, "INPUT1")
    case("json-data-count-mismatch", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 16], [1.0] * 15)]),
         400, "INPUT1")
    case("json-data-wrong-type", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 16], ["x"] * 16)]),
         400, "INPUT1")
    case("json-data-ragged", binary_request([_good("INPUT0"), ("INPUT1", "FP32", [1, 16], [[1.0] * 8, [1.0] * 7])]),
         400, "INPUT1")
    body, headers = binary_request([_good("INPUT0"), _good("INPUT1")])
    case("header-length-beyond-body", (body, {**headers, "Inference-Header-Content-Length": str(len(body) + 1)}),
         400, "header")
    case("header-length-negative", (body, {**headers, "Inference-Header-Content-Length": "-3"}), 400)
    case("header-length-not-a-number", (body, {**headers, "Inference-Header-Content-Length": "abc"}), 400)
    case("header-length-cuts-json", (body, {**headers, "Inference-Header-Content-Length": "10"}), 400)
    case("binary-data-size-sum-too-small", (body + b"\0" * 8, headers), 400, "additional")
    case("binary-data-size-sum-too-big", (body[:-8], headers), 400, "INPUT1")
    negative_size = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": -64}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}).encode()
    case("binary-data-size-negative",
         (negative_size + fp32_bytes((1, 16)), {"Inference-Header-Content-Length": str(len(negative_size))}), 400)
    both = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64},
         "data": [0.0] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}).encode()
    case("data-and-binary-data-size", (both + fp32_bytes((1, 16)), {"Inference-Header-Content-Length": str(len(both))}),
         400, "data")
    case("no-data", json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}).encode(), 400)
    case("bytes-element-past-buffer",
         binary_request([("INPUT0", "BYTES", [2], struct.pack("<I", 1) + b"a" + struct.pack("<I", 100) + b"abc")]),
         400, "INPUT0", path="/v2/models/identity_bytes/infer")
    case("bytes-too-few-elements",
         binary_request([("INPUT0", "BYTES", [3], struct.pack("<I", 1) + b"a")]),
         400, "INPUT0", path="/v2/models/identity_bytes/infer")
    case("bytes-trailing-garbage",
         binary_request([("INPUT0", "BYTES", [1], struct.pack("<I", 1) + b"a" + b"zz")]),
         400, "INPUT0", path="/v2/models/identity_bytes/infer")
    case("fp16-json", binary_request([("INPUT0", "FP16", [2], [1.0, 2.0])]), 400, "FP16",
         path="/v2/models/identity_fp16/infer")
    case("bf16-json", binary_request([("INPUT0", "BF16", [2], [1.0, 2.0])]), 400, "BF16",
         path="/v2/models/identity_bf16/infer")
    case("int-out-of-range-json", binary_request([("INPUT0", "INT8", [2], [1, 300])]), 400, "INPUT0",
         path="/v2/models/identity_int8/infer")
    case("bool-for-int-json", binary_request([("INPUT0", "INT32", [2], [True, False])]), 400, "INPUT0",
         path="/v2/models/identity_int32/infer")
    case("duplicate-input", binary_request([_good("INPUT0"), _good("INPUT1"), _good("INPUT0")]), 400, "INPUT0")
    case("unknown-output", binary_request([_good("INPUT0"), _good("INPUT1")], outputs=[{"name": "NOPE"}]),
         400, "NOPE")
    case("duplicate-output", binary_request([_good("INPUT0"), _good("INPUT1")],
                                            outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), 400, "OUTPUT0")
    case("binary-data-output-not-bool", binary_request([_good("INPUT0"), _good("INPUT1")],
                                                       parameters={"binary_data_output": "yes"}), 400)
    case("parameter-object-value", binary_request([_good("INPUT0"), _good("INPUT1")],
                                                  parameters={"x": {"y": 1}}), 400, "x")
    case("id-not-string", binary_request([_good("INPUT0"), _good("INPUT1")], request_id=5), 400, "id")
    case("inputs-missing", json.dumps({"outputs": []}).encode(), 400, "inputs")
    return cases


@pytest.mark.parametrize("path,body,headers,status,fragments", _bad_cases())
def test_bad_infer_request(server, path, body, headers, status, fragments):
    assert_error(*raw(server, "POST", path, body, headers), status, *fragments)
    assert_serving(server)


@pytest.mark.parametrize("path,shape,data", [
    ("/v2/models/identity_fp32/infer", [10**12], fp32_bytes((1,))),
    ("/v2/models/identity_fp32/infer", [2**62], fp32_bytes((1,))),
    ("/v2/models/identity_uint8/infer", [2**63 - 1], b"\0"),
    ("/v2/models/identity_bytes/infer", [10**12], struct.pack("<I", 1) + b"a"),
    ("/v2/models/add_sub/infer", [1, 10**12], fp32_bytes((1,))),
], ids=["fp32-1e12", "fp32-2^62", "uint8-int64max", "bytes-1e12", "add_sub-1x1e12"])
def test_huge_declared_shape_is_rejected_fast(server, path, shape, data):
    datatype = {"identity_fp32": "FP32", "identity_uint8": "UINT8", "identity_bytes": "BYTES",
                "add_sub": "FP32"}[path.split("/")[3]]
    inputs = [("INPUT0", datatype, shape, data)]
    if "add_sub" in path:
        inputs.append(("INPUT1", "FP32", shape, data))
    body, headers = binary_request(inputs)
    start = time.monotonic()
    assert_error(*raw(server, "POST", path, body, headers), 400, "INPUT")
    assert time.monotonic() - start < 5
    # JSON data with the same declared shape
    json_inputs = [(n, d, s, [1] if d != "BYTES" else ["a"]) for n, d, s, _ in inputs]
    body, headers = binary_request(json_inputs)
    start = time.monotonic()
    assert_error(*raw(server, "POST", path, body, headers), 400)
    assert time.monotonic() - start < 5
    assert_serving(server)


def test_shape_beyond_int64_is_rejected(server):
    body, headers = binary_request([("INPUT0", "FP32", [2**64], fp32_bytes((1,)))])
    assert_error(*raw(server, "POST", "/v2/models/identity_fp32/infer", body, headers), 400)
    assert_serving(server)


@pytest.mark.parametrize("where", ["unknown-member", "data", "bytes-data", "parameters", "shape", "top-level"])
def test_deeply_nested_json(server, where):
    deep = 0
    for _ in range(200):
        deep = [deep]
    ok_input = {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}
    path = "/v2/models/identity_fp32/infer"
    if where == "unknown-member":
        doc = {"inputs": [ok_input], "extra": deep}
    elif where == "data":
        doc = {"inputs": [{**ok_input, "data": deep}]}
    elif where == "bytes-data":
        path = "/v2/models/identity_bytes/infer"
        s = "a"
        for _ in range(200):
            s = [s]
        doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": s}]}
    elif where == "parameters":
        doc = {"inputs": [ok_input], "parameters": {"p": deep}}
    elif where == "shape":
        doc = {"inputs": [{**ok_input, "shape": deep}]}
    else:  # far past any recursion limit of the parser
        doc = None
    body = json.dumps(doc).encode() if doc is not None else b"[" * 100_000 + b"]" * 100_000
    assert_error(*post_json(server, path, body), 400)
    assert_serving(server)


def test_unknown_route(server):
    status, headers, body = raw(server, "GET", "/v2/nothing/here")
    assert_error(status, headers, body, 404)
    assert json.loads(body) == {"error": "Not Found"}
    status, headers, body = raw(server, "POST", "/v2/models/add_sub/versions/abc/infer", b"{}")
    assert_error(status, headers, body, 404)


def test_wrong_method(server):
    status, headers, body = raw(server, "GET", "/v2/models/add_sub/infer")
    assert_error(status, headers, body, 405)
    assert json.loads(body) == {"error": "Method Not Allowed"}
    assert "POST" in headers.get("Allow", "")
    status, headers, body = raw(server, "POST", "/v2/health/live", b"")
    assert_error(status, headers, body, 405)
    assert_serving(server)


@pytest.mark.parametrize("path", [
    "/v2/models/%2E%2E/infer",
    "/v2/models/..%2Fadd_sub/infer",
    "/v2/models/%2E%2E%2F%2E%2E%2Fetc/infer",
    "/v2/models/add_sub%2F..%2F..%2Fadd_sub/infer",
    "/v2/models/a..b/infer",
    "/v2/models/%2E%2E/config",
    "/v2/models/..%2F..%2Fetc/config",
])
def test_dotdot_model_name(server, path):
    body, headers = binary_request([_good("INPUT0"), _good("INPUT1")])
    method = "POST" if path.endswith("infer") else "GET"
    status, rheaders, rbody = raw(server, method, path, body if method == "POST" else None, headers)
    name = urllib.parse.unquote(path.split("/")[3])
    if method == "POST" and name != "a..b":  # refused before any lookup (Triton 2.51: 404, unknown model)
        assert_error(status, rheaders, rbody, 400, f"invalid model name '{name}'")
    else:  # as Triton 2.51 ("a..b" is a name: it leaves nothing)
        assert_error(status, rheaders, rbody, 404, f"Request for unknown model: '{name}' is not found")
    assert_serving(server)


def test_gzip_bomb_is_capped(server):
    # Decompresses to far more than the 64 MiB default limit; must be refused, not inflated.
    bomb = zlib.compress(b"\0" * (80 * 2**20), 9)
    assert len(bomb) < 200_000
    body, headers = binary_request([_good("INPUT0"), _good("INPUT1")])
    status, rheaders, rbody = raw(server, "POST", "/v2/models/add_sub/infer", bomb,
                                  {**headers, "Content-Encoding": "deflate"})
    # beyond Triton 2.51, which inflates all 80 MiB: refused once inflation passes the limit
    assert_error(status, rheaders, rbody, 400, "decompressed request body exceeds the limit of 67108864 bytes")
    status, rheaders, rbody = raw(server, "POST", "/v2/models/add_sub/infer", b"\x1f\x8bnot gzip at all",
                                  {**headers, "Content-Encoding": "gzip"})
    assert_error(status, rheaders, rbody, 400)
    assert_serving(server)


# --------------------------------------------------------------------------- body limit
@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_small")
    repo = root / "models"
    from .models import python_identity
    python_identity(repo, "identity_fp32", "FP32")
    srv = ServerProcess(repo, root / "server.log", extra_args=["--http-max-input-size", "1000000"]).start()
    yield srv
    srv.stop_cleanly()


def _identity_body(n):
    return binary_request([("INPUT0", "FP32", [n], fp32_bytes((n,)))])


def test_body_over_max_input_size(small_server):
    body, headers = _identity_body(200_000)  # 800 kB: under the limit
    status, _, rbody = raw(small_server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert status == 200, rbody
    body, headers = _identity_body(400_000)  # 1.6 MB: over
    try:
        status, rheaders, rbody = raw(small_server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    except (ConnectionResetError, BrokenPipeError) as e:  # pragma: no cover - diagnostic
        pytest.fail(f"server dropped the connection instead of answering 413: {e!r}")
    assert_error(status, rheaders, rbody, 413)
    # compressed below the wire limit but inflating past it
    body, headers = _identity_body(400_000)
    status, rheaders, rbody = raw(small_server, "POST", "/v2/models/identity_fp32/infer", gzip.compress(body),
                                  {**headers, "Content-Encoding": "gzip"})
    assert_error(status, rheaders, rbody, 400, "decompressed request body exceeds the limit of 1000000 bytes")
    # still serving
    body, headers = _identity_body(16)
    status, _, rbody = raw(small_server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert status == 200, rbody


# --------------------------------------------------------------------------- known server bugs
def test_uint64_json_above_int64_max(server):
    values = [2**64 - 1, 0, 2**63]
    body, headers = binary_request([("INPUT0", "UINT64", [3], values)], outputs=[{"name": "OUTPUT0"}])
    status, _, rbody = raw(server, "POST", "/v2/models/identity_uint64/infer", body, headers)
    assert status == 200, rbody
    assert json.loads(rbody)["outputs"][0]["data"] == values


def test_reserved_parameters_not_forwarded_to_model(client):
    inp = httpclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], dtype=np.int32))
    result = client.infer("echo", [inp], parameters={"key1": "value1"}, priority=1)  # no outputs listed
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"key1": "value1"}


def test_classification(server):
    """The top classes of an ONNX model's output (tests/test_classification.py has the rest)."""
    body, headers = binary_request([_good("INPUT0"), _good("INPUT1")],
                                   outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}])
    status, rheaders, rbody = raw(server, "POST", "/v2/models/add_sub/infer", body, headers)
    assert status == 200, rbody
    out = json.loads(rbody)["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 2], out
    assert len(out["data"]) == 2 and all(":" in c for c in out["data"]), out
