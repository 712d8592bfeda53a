"""gRPC front-end against a real server process, through tritonclient.grpc (sync and aio)
and through the raw generated stubs (typed ``contents``, malformed raw contents)."""
from __future__ import annotations

import asyncio
import json
import queue
import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .conftest import build_core_repository
from .harness import ServerProcess
from .models import ECHO_CONFIG, ECHO_PY, write_model
from .helpers import assert_serving

pytestmark = pytest.mark.timeout(120)

MAX_MESSAGE = 2**31 - 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_server")
    repo = build_core_repository(root / "models")
    write_model(repo, "echo", config=ECHO_CONFIG, model_py=ECHO_PY)
    srv = ServerProcess(repo, root / "server.log").start()
    yield srv
    srv.stop_cleanly()


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)])
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 0.5, dtype=np.float32)


def add_sub_inputs(a=A, b=B, mod=grpcclient):
    inputs = [mod.InferInput("INPUT0", list(a.shape), "FP32"), mod.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def tensor(name, datatype, shape):
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape))


def expect_status(fn, code, *fragments):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    assert e.value.code() == code, (e.value.code(), e.value.details())
    for fragment in fragments:
        assert fragment in e.value.details(), (fragment, e.value.details())
    return e.value.details()


# --------------------------------------------------------------------------- health, metadata
def test_live_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert md.name == "triton"
    assert md.version
    assert "binary_tensor_data" in md.extensions
    assert "statistics" in md.extensions
    assert "system_shared_memory" not in md.extensions


def test_model_metadata(client):
    md = client.get_model_metadata("add_sub")
    assert md.name == "add_sub"
    assert list(md.versions) == ["1"]
    assert md.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [
        ("OUTPUT0", "FP32", [-1, 16]), ("OUTPUT1", "FP32", [-1, 16])]
    md = client.get_model_metadata("identity_bytes")
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("INPUT0", "BYTES", [-1])]
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("add_sub", "4")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_model_config(client):
    cfg = client.get_model_config("add_sub").config
    assert cfg.name == "add_sub"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in cfg.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [(t.name, list(t.dims)) for t in cfg.output] == [("OUTPUT0", [16]), ("OUTPUT1", [16])]
    from tritonclient.grpc import model_config_pb2
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32
    (group,) = cfg.instance_group  # the default: one group, one instance (on CPU here: no GPU)
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and group.count == 1
    assert cfg.version_policy.latest.num_versions == 1
    cfg_json = client.get_model_config("add_sub", as_json=True)["config"]
    assert cfg_json["max_batch_size"] == 8
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_model_ready(client):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "4")
    assert not client.is_model_ready("nope")


def test_repository_index(client):
    index = client.get_model_repository_index()
    rows = {m.name: m for m in index.models}
    assert rows["add_sub"].version == "1"
    assert rows["add_sub"].state == "READY"
    assert "echo" in rows and "identity_bf16" in rows


def test_health_check_service(server):
    # grpc.health.v1.Health/Check: empty request -> HealthCheckResponse{status: SERVING (1)}
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"") == b"\x08\x01"


# --------------------------------------------------------------------------- inference
def test_infer_raw(client):
    a = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b), request_id="req-1")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    resp = result.get_response()
    assert resp.id == "req-1"
    assert resp.model_name == "add_sub" and resp.model_version == "1"
    assert [list(o.shape) for o in resp.outputs] == [[4, 16], [4, 16]]
    assert len(resp.raw_output_contents) == 2


def test_infer_explicit_version(client):
    result = client.infer("add_sub", add_sub_inputs(), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_requested_outputs_subset(client):
    result = client.infer("add_sub", add_sub_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_parameters_reach_the_model(client):
    inp = grpcclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = client.infer("echo", [inp], request_id="id-9",
                          parameters={"custom_s": "hi", "custom_i": -7, "custom_b": False, "custom_d": 2.5})
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params["custom_s"] == "hi"
    assert params["custom_i"] == -7
    assert params["custom_b"] is False
    assert params["custom_d"] == 2.5
    assert json.loads(result.as_numpy("REQUESTED")[0]) == sorted(["PARAMS", "REQUESTED", "REQUEST_ID"])
    assert result.as_numpy("REQUEST_ID")[0] == b"id-9"
    assert result.get_response().id == "id-9"
    result = client.infer("echo", [inp], outputs=[grpcclient.InferRequestedOutput("PARAMS"),
                                                  grpcclient.InferRequestedOutput("REQUEST_ID")])
    assert [o.name for o in result.get_response().outputs] == ["PARAMS", "REQUEST_ID"]
    assert json.loads(result.as_numpy("PARAMS")[0]) == {}  # this request had no parameters


@pytest.mark.parametrize("datatype", ["BOOL", "UINT16", "UINT32", "INT8", "INT64", "FP16", "FP64", "BF16", "BYTES"])
def test_identity_datatypes(client, datatype):
    if datatype == "BYTES":
        data = np.array([b"a", b"", "\u00e9".encode(), b"\x00\xff"], dtype=np.object_)
    elif datatype == "BOOL":
        data = np.array([True, False, True])
    elif datatype == "BF16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        data = np.array([1.0, -2.0, 0.5], dtype=ml_dtypes.bfloat16)
    else:
        data = np.arange(5).astype(np.dtype(datatype.lower().replace("fp", "float")))
    inp = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [inp])
    out = result.as_numpy("OUTPUT0")
    assert list(result.get_response().outputs[0].shape) == list(data.shape)
    np.testing.assert_array_equal(out.astype(np.float32) if datatype == "BF16" else out,
                                  data.astype(np.float32) if datatype == "BF16" else data)


def test_aio_infer(server):
    async def run():
        c = aiogrpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert await c.is_server_live()
            assert await c.is_model_ready("add_sub")
            md = await c.get_model_metadata("add_sub")
            assert list(md.inputs[0].shape) == [-1, 16]
            a = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
            results = await asyncio.gather(*(
                c.infer("add_sub", add_sub_inputs(a * i, a, aiogrpcclient), request_id=f"r{i}")
                for i in range(8)))
            for i, r in enumerate(results):
                assert r.get_response().id == f"r{i}"
                np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a * i + a, rtol=1e-6)
            with pytest.raises(InferenceServerException) as e:
                await c.infer("nope", add_sub_inputs(mod=aiogrpcclient))
            assert e.value.status() == "StatusCode.NOT_FOUND"
        finally:
            await c.close()
    asyncio.run(run())


@pytest.mark.parametrize("empty_final", [True, False], ids=["empty_final_asked", "not_asked"])
def test_stream_non_decoupled_response_is_final(server, empty_final):
    """A non-decoupled model's one stream response is flagged final, asked or not, so a
    client reading up to the final response stops there."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        c.async_stream_infer("add_sub", add_sub_inputs(), request_id="s1",
                             enable_empty_final_response=empty_final)
        result, error = results.get(timeout=10)
        with pytest.raises(queue.Empty):  # one response only: no empty final one after it
            results.get(timeout=0.5)
    finally:
        c.stop_stream()
        c.close()
    assert error is None, error
    response = result.get_response()
    assert response.id == "s1"
    assert dict(response.parameters) == {"triton_final_response": service_pb2.InferParameter(bool_param=True)}
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), A + B)


def test_batch_size_mismatch_names_both_inputs(client):
    inputs = add_sub_inputs(A, np.full((2, 16), 0.5, dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == (
        "[request id: <id_unknown>] input 'INPUT1' batch size does not match other inputs for 'add_sub': "
        "input 'INPUT0' has batch size 1, input 'INPUT1' has batch size 2")


_BATCH_NOTE = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
               "prepended to each input shape. If you want to specify the full shape including the batch dim "
               "in your input dims config, try setting max_batch_size to zero. See the model configuration "
               "docs for more info on max_batch_size.")


def test_batched_shape_error_message(client):
    inp = grpcclient.InferInput("INPUT0", [1, 5], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 5), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [inp, add_sub_inputs()[1]])
    assert e.value.message() == (
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected "
        f"[-1,16], got [1,5]. {_BATCH_NOTE}")


def test_large_tensor(client):
    n = 5 * 2**20  # 20 MiB of FP32: past grpc's 4 MiB default in both directions
    data = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", [n], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer("identity_fp32", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


# --------------------------------------------------------------------------- typed contents
def test_typed_contents_fp32(stub):
    req = service_pb2.ModelInferRequest(model_name="add_sub", id="typed")
    for name, arr in (("INPUT0", A), ("INPUT1", B)):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(arr.ravel().tolist())
    resp = stub.ModelInfer(req)
    assert resp.id == "typed"
    outs = {o.name: np.frombuffer(raw, dtype="<f4") for o, raw in zip(resp.outputs, resp.raw_output_contents)}
    np.testing.assert_array_equal(outs["OUTPUT0"], (A + B).ravel())
    np.testing.assert_array_equal(outs["OUTPUT1"], (A - B).ravel())


@pytest.mark.parametrize("datatype,field,values,dtype", [
    ("INT32", "int_contents", [1, -2, 2**31 - 1, -(2**31)], "<i4"),
    ("INT8", "int_contents", [1, -2, 127, -128], "<i1"),
    ("INT16", "int_contents", [1, -2, 32767], "<i2"),
    ("UINT8", "uint_contents", [0, 7, 255], "<u1"),
    ("UINT32", "uint_contents", [0, 7, 2**32 - 1], "<u4"),
    ("INT64", "int64_contents", [2**62, -5], "<i8"),
    ("UINT64", "uint64_contents", [2**64 - 1, 3], "<u8"),
    ("FP64", "fp64_contents", [1.5, -0.25], "<f8"),
    ("BOOL", "bool_contents", [True, False, True], "?"),
])
def test_typed_contents_numeric(stub, datatype, field, values, dtype):
    req = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
    t = req.inputs.add(name="INPUT0", datatype=datatype, shape=[len(values)])
    getattr(t.contents, field).extend(values)
    resp = stub.ModelInfer(req)
    assert list(resp.outputs[0].shape) == [len(values)]
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], dtype=dtype),
                                  np.array(values, dtype=dtype))


def test_typed_contents_bytes(stub):
    values = [b"hello", b"", b"\x00\xff\x01", "\u00e9t\u00e9".encode()]
    req = service_pb2.ModelInferRequest(model_name="identity_bytes")
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[len(values)])
    t.contents.bytes_contents.extend(values)
    resp = stub.ModelInfer(req)
    raw = resp.raw_output_contents[0]
    expected = b"".join(struct.pack("<I", len(v)) + v for v in values)
    assert raw == expected


def test_typed_contents_errors(server, stub, client):
    # field that does not match the datatype
    req = service_pb2.ModelInferRequest(model_name="identity_int32")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0")
    # too few values for the shape
    req = service_pb2.ModelInferRequest(model_name="identity_int32")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[3]).contents.int_contents.extend([1, 2])
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0")
    # too few strings
    req = service_pb2.ModelInferRequest(model_name="identity_bytes")
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[3]).contents.bytes_contents.extend([b"a"])
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0")
    # FP16 cannot travel in contents
    req = service_pb2.ModelInferRequest(model_name="identity_fp16")
    req.inputs.add(name="INPUT0", datatype="FP16", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0")
    # two content fields at once
    req = service_pb2.ModelInferRequest(model_name="identity_int32")
    t = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    t.contents.int_contents.append(1)
    t.contents.int64_contents.append(1)
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0")
    # raw and contents together
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend([0.0] * 16)
    req.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.extend([A.tobytes(), B.tobytes()])
    expect_status(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT)
    assert_serving(server)


# --------------------------------------------------------------------------- bad input
def _raw_request(model="add_sub", version="", inputs=None, raws=None, outputs=()):
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    if inputs is None:
        inputs = [("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16])]
    for name, datatype, shape in inputs:
        req.inputs.add(name=name, datatype=datatype, shape=shape)
    if raws is None:
        raws = [A.tobytes(), B.tobytes()]
    req.raw_input_contents.extend(raws)
    for name in outputs:
        req.outputs.add(name=name)
    return req


F = np.zeros(16, np.float32).tobytes()

BAD_REQUESTS = [
    ("unknown-model", _raw_request(model="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
    ("unknown-version", _raw_request(version="4"), grpc.StatusCode.NOT_FOUND, "version 4"),
    ("missing-input", _raw_request(inputs=[("INPUT0", "FP32", [1, 16])], raws=[F]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT1"),
    ("extra-input", _raw_request(inputs=[("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16]),
                                         ("INPUT2", "FP32", [1, 16])], raws=[F, F, F]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT2"),
    ("duplicate-input", _raw_request(inputs=[("INPUT0", "FP32", [1, 16]), ("INPUT0", "FP32", [1, 16]),
                                             ("INPUT1", "FP32", [1, 16])], raws=[F, F, F]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("wrong-datatype", _raw_request(inputs=[("INPUT0", "FP32", [1, 16]), ("INPUT1", "INT32", [1, 16])]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT1"),
    ("unknown-datatype", _raw_request(inputs=[("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP8", [1, 16])]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT1"),
    ("bad-shape", _raw_request(inputs=[("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 15])],
                               raws=[F, F[:60]]), grpc.StatusCode.INVALID_ARGUMENT, "unexpected shape"),
    ("batch-too-big", _raw_request(inputs=[("INPUT0", "FP32", [9, 16]), ("INPUT1", "FP32", [9, 16])],
                                   raws=[F * 9, F * 9]), grpc.StatusCode.INVALID_ARGUMENT, "batch-size must be <= 8"),
    ("zero-batch", _raw_request(inputs=[("INPUT0", "FP32", [0, 16]), ("INPUT1", "FP32", [0, 16])],
                                raws=[b"", b""]), grpc.StatusCode.INVALID_ARGUMENT, "batch"),
    ("negative-dim", _raw_request(inputs=[("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [1, 16])]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("byte-size-mismatch", _raw_request(raws=[F, F[:60]]), grpc.StatusCode.INVALID_ARGUMENT, "INPUT1"),
    ("raw-count-too-few", _raw_request(raws=[F]), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
    ("raw-count-too-many", _raw_request(raws=[F, F, F]), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
    ("no-data", _raw_request(raws=[]), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("unknown-output", _raw_request(outputs=["NOPE"]), grpc.StatusCode.INVALID_ARGUMENT, "NOPE"),
    ("duplicate-output", _raw_request(outputs=["OUTPUT0", "OUTPUT0"]), grpc.StatusCode.INVALID_ARGUMENT, "OUTPUT0"),
    ("huge-shape", _raw_request(model="identity_fp32", inputs=[("INPUT0", "FP32", [2**62])], raws=[F]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("huge-shape-int64max", _raw_request(model="identity_uint8", inputs=[("INPUT0", "UINT8", [2**63 - 1])],
                                         raws=[b"\0"]), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("huge-shape-bytes", _raw_request(model="identity_bytes", inputs=[("INPUT0", "BYTES", [10**12])],
                                      raws=[struct.pack("<I", 1) + b"a"]), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    ("bytes-past-buffer", _raw_request(model="identity_bytes", inputs=[("INPUT0", "BYTES", [1])],
                                       raws=[struct.pack("<I", 100) + b"abc"]),
     grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    # Triton answers NOT_FOUND ("Request for unknown model"); this server refuses a name that
    # could leave the repository before looking it up
    ("bad-model-name", _raw_request(model="../add_sub"), grpc.StatusCode.INVALID_ARGUMENT,
     "invalid model name '../add_sub'"),
]


@pytest.mark.parametrize("req,code,fragment", [pytest.param(*c[1:], id=c[0]) for c in BAD_REQUESTS])
def test_bad_request(server, stub, client, req, code, fragment):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=30)
    assert e.value.code() == code, (e.value.code(), e.value.details())
    details = e.value.details()
    assert details and details.strip()
    if fragment:
        assert fragment in details, (fragment, details)
    assert_serving(server)


def _input(name, arr):
    inp = grpcclient.InferInput(name, list(arr.shape), {np.float64: "FP64", np.float32: "FP32"}[arr.dtype.type])
    inp.set_data_from_numpy(arr)
    return inp


def test_client_errors(server, client):
    """The same failures through tritonclient, which surfaces them as InferenceServerException."""
    nine = np.ones((9, 16), np.float32)
    cases = [
        (lambda: client.infer("nope", add_sub_inputs()), "StatusCode.NOT_FOUND"),
        (lambda: client.infer("add_sub", add_sub_inputs(), model_version="4"), "StatusCode.NOT_FOUND"),
        (lambda: client.infer("add_sub", add_sub_inputs()[:1]), "StatusCode.INVALID_ARGUMENT"),
        (lambda: client.infer("add_sub", add_sub_inputs(nine, nine)), "StatusCode.INVALID_ARGUMENT"),
        (lambda: client.infer("add_sub", add_sub_inputs(np.ones((1, 15), np.float32), np.ones((1, 15), np.float32))),
         "StatusCode.INVALID_ARGUMENT"),
        (lambda: client.infer("add_sub", [_input("INPUT0", A.astype(np.float64)), _input("INPUT1", B)]),
         "StatusCode.INVALID_ARGUMENT"),
        (lambda: client.infer("add_sub", add_sub_inputs(),
                              outputs=[grpcclient.InferRequestedOutput("NOPE")]), "StatusCode.INVALID_ARGUMENT"),
    ]
    for fn, status in cases:
        with pytest.raises(InferenceServerException) as e:
            fn()
        assert e.value.status() == status, (e.value.status(), e.value.message())
        assert e.value.message()
    assert_serving(server)


# --------------------------------------------------------------------------- known server bugs
def test_reserved_parameters_not_forwarded_to_model(client):
    inp = grpcclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = client.infer("echo", [inp], parameters={"key1": "value1"}, priority=1)
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"key1": "value1"}


def test_classification(client):
    """The top classes of an ONNX model's output (tests/test_classification.py has the rest)."""
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    result = client.infer("add_sub", add_sub_inputs(), outputs=outputs)
    out = result.get_response().outputs[0]
    assert out.datatype == "BYTES" and list(out.shape) == [1, 2]
    assert result.as_numpy("OUTPUT0").tolist() == [[b"15.500000:15", b"14.500000:14"]]
