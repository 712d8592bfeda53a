"""The classification extension end to end: outputs asked for with ``class_count`` (HTTP
``parameters.classification``, gRPC ``parameters["classification"]``) come back as their top
N classes, BYTES ``"value:index[:label]"``, with the labels of the output's label file.

``observe`` runs every case against a server; tests/golden/triton-2.51-classification.json is
what it saw from the real Triton 2.51 (CPU build, the same Python models), made with
``python -m tests.test_classification HTTP_PORT GRPC_PORT`` against it; the test below
compares triton-shm's answers with it byte for byte (the outputs, their datatypes, shapes
and bytes, and the status and message of every refusal).
"""
from __future__ import annotations

import base64
import http.client
import json
import queue
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_shm._proto import model_config_pb2 as mc
from triton_shm.core.data import codec
from triton_shm.core.data.classification import classify, load_labels
from triton_shm.core.data.types import OutputTensor
from triton_shm.errors import InvalidArgument, Unsupported

from .classification_models import build_classification_repository
from .harness import ServerProcess
from .models import python_identity, write_model

pytestmark = pytest.mark.timeout(180)

GOLDEN = Path(__file__).resolve().parent / "golden" / "triton-2.51-classification.json"

ROWS = np.array([[0.1, 0.5, 0.2, 0.9, 0.05, 0.3],
                 [0.7, 0.7, 0.1, 0.0, 0.25, 0.7]], dtype=np.float32)  # row 2: ties keep index order

# (model, input, output, class count)
CASES: list[tuple[str, np.ndarray, str, int]] = [
    ("cls_batched", ROWS, "PROB", 3),
    ("cls_batched", ROWS[:1], "PROB", 3),
    ("cls_batched", ROWS, "PROB", 10),  # more than there are: all six
    ("cls_batched", ROWS, "DPROB", 2),
    ("cls_batched", ROWS, "IPROB", 4),
    ("cls_batched", ROWS, "UPROB", 6),
    ("cls_batched", ROWS, "HPROB", 2),  # refused: FP16 is not ranked
    ("cls_flat", ROWS.reshape(2, 6)[:, :3].copy(), "PROB", 4),  # not batched: [2,3] ranked as one
    ("cls_any", np.array([1e-7, -3.5, 12345.678, 2.5], dtype=np.float32), "PROB", 3),
]


# --------------------------------------------------------------------------- observing
def _http_case(port: int, model: str, x: np.ndarray, output: str, count: int, binary: bool) -> dict[str, Any]:
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": output, "parameters": {"classification": count, "binary_data": binary}}],
    }).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", header + x.tobytes(),
                     {"Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        status, length, body = resp.status, resp.headers.get("Inference-Header-Content-Length"), resp.read()
    finally:
        conn.close()
    if status != 200:
        return {"status": status, "error": json.loads(body)["error"]}
    doc = json.loads(body[:int(length)] if length else body)
    out = doc["outputs"][0]
    seen: dict[str, Any] = {"status": status, "name": out["name"], "datatype": out["datatype"], "shape": out["shape"]}
    if binary:
        seen["size"] = out["parameters"]["binary_data_size"]
        seen["data"] = base64.b64encode(body[int(length):]).decode()
    else:
        seen["data"] = out["data"]
    return seen


def _grpc_case(url: str, model: str, x: np.ndarray, output: str, count: int) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            result = client.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput(output, class_count=count)])
        except InferenceServerException as e:
            return {"status": e.status(), "error": e.message()}
    finally:
        client.close()
    response = result.get_response()
    out = response.outputs[0]
    return {"status": "OK", "name": out.name, "datatype": out.datatype, "shape": list(out.shape),
            "data": base64.b64encode(response.raw_output_contents[0]).decode()}


def observe(http_port: int, grpc_port: int) -> list[dict[str, Any]]:
    """Every case over HTTP (binary and JSON output) and gRPC, as comparable values."""
    seen = []
    for model, x, output, count in CASES:
        case = f"{model} {list(x.shape)} {output} {count}"
        seen.append({"case": case, "http": _http_case(http_port, model, x, output, count, True),
                     "http_json": _http_case(http_port, model, x, output, count, False),
                     "grpc": _grpc_case(f"127.0.0.1:{grpc_port}", model, x, output, count)})
    return seen


# --------------------------------------------------------------------------- end to end
# A decoupled model: two responses per request, INPUT0 then its negation.
STREAM_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("PROB", x)]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("PROB", -x)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("classification")
    repo = build_classification_repository(root / "models")
    write_model(repo, "cls_stream", model_py=STREAM_PY, config="""
        name: "cls_stream"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
        output [ { name: "PROB" data_type: TYPE_FP32 dims: [ 3 ] } ]
        """)
    # an ensemble: ENS_PROB takes the labels of cls_batched's PROB, ENS_IPROB has its own
    ens = write_model(repo, "cls_ens", config="""
        name: "cls_ens"
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 6 ] } ]
        output [ { name: "ENS_PROB" data_type: TYPE_FP32 dims: [ 6 ] },
                 { name: "ENS_IPROB" data_type: TYPE_INT32 dims: [ 6 ] label_filename: "ens.txt" } ]
        ensemble_scheduling { step [ { model_name: "cls_batched" model_version: -1
            input_map { key: "INPUT0" value: "INPUT0" }
            output_map { key: "PROB" value: "ENS_PROB" } output_map { key: "IPROB" value: "ENS_IPROB" } } ] }
        """)
    (ens / "ens.txt").write_text("zero\none\ntwo\nthree\n")
    python_identity(repo, "cls_cached", "FP32")
    with open(repo / "cls_cached" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    srv = ServerProcess(repo, root / "server.log",
                        extra_args=["--allow-client-shm=true", "--cache-config", "local,size=1048576"]).start()
    yield srv
    srv.stop_cleanly()


def test_answers_as_triton_2_51_does(server):
    golden = json.loads(GOLDEN.read_text())
    ours = observe(server.http_port, server.grpc_port)
    assert [c["case"] for c in ours] == [c["case"] for c in golden]
    for mine, theirs in zip(ours, golden):
        for proto in ("http", "http_json", "grpc"):
            if "error" in theirs[proto]:  # the same status; Triton's words are in ours
                assert mine[proto]["status"] == theirs[proto]["status"], (mine["case"], proto, mine[proto])
                assert theirs[proto]["error"] in mine[proto]["error"], (mine["case"], proto, mine[proto])
            else:
                assert mine[proto] == theirs[proto], (mine["case"], proto)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bytes_output_is_refused(server, proto):
    """Triton 2.71's answer (2.51 divides by BYTES' zero element size and dies of SIGFPE)."""
    seen = _http_case(server.http_port, "cls_batched", ROWS, "STR", 2, True) if proto == "http" else \
        _grpc_case(server.grpc_url, "cls_batched", ROWS, "STR", 2)
    assert seen == {"status": 400 if proto == "http" else "StatusCode.INVALID_ARGUMENT",
                    "error": "class result not available for output due to unsupported type 'BYTES'"}


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_tritonclient_class_count(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    url = server.http_url if proto == "http" else server.grpc_url
    client = mod.InferenceServerClient(url)
    try:
        inp = mod.InferInput("INPUT0", [2, 6], "FP32")
        inp.set_data_from_numpy(ROWS)
        result = client.infer("cls_batched", [inp], outputs=[mod.InferRequestedOutput("PROB", class_count=3)])
        top = result.as_numpy("PROB")
        assert top.shape == (2, 3)
        assert top.tolist() == [[b"0.900000:3:bird\r", b"0.500000:1:dog", b"0.300000:5"],
                                [b"0.700000:0:cat", b"0.700000:1:dog", b"0.700000:5"]]
        # the quickstart's image_client reads it this way
        value, index, *label = top[0][0].decode().split(":")
        assert (float(value), int(index)) == (0.9, 3)
        meta = client.get_server_metadata()
        assert "classification" in (meta["extensions"] if proto == "http" else meta.extensions)
    finally:
        client.close()


def test_classification_with_the_response_cache(server):
    """The cache keeps the model's output; each answer, a hit too, is classified from it."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT0", [3], "FP32")
        inp.set_data_from_numpy(np.array([0.5, 2.5, 1.0], dtype=np.float32))
        for count, expected in ((2, [b"2.500000:1", b"1.000000:2"]), (2, [b"2.500000:1", b"1.000000:2"]),
                                (1, [b"2.500000:1"])):
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", class_count=count)]
            assert client.infer("cls_cached", [inp], outputs=outputs).as_numpy("OUTPUT0").tolist() == expected
        plain = client.infer("cls_cached", [inp]).as_numpy("OUTPUT0").tolist()
        assert plain == [0.5, 2.5, 1.0]
        stats = client.get_inference_statistics("cls_cached")["model_stats"][0]["inference_stats"]
        assert int(stats["cache_hit"]["count"]) >= 1, stats
    finally:
        client.close()


def test_ensemble_outputs_take_their_labels(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 6], "FP32")
        inp.set_data_from_numpy(ROWS[:1])
        outputs = [grpcclient.InferRequestedOutput("ENS_PROB", class_count=2),
                   grpcclient.InferRequestedOutput("ENS_IPROB", class_count=2)]
        result = client.infer("cls_ens", [inp], outputs=outputs)
        assert result.as_numpy("ENS_PROB").tolist() == [[b"0.900000:3:bird\r", b"0.500000:1:dog"]]
        assert result.as_numpy("ENS_IPROB").tolist() == [[b"90:3:three", b"50:1:one"]]
    finally:
        client.close()


def test_decoupled_responses_are_classified(server):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inp = grpcclient.InferInput("INPUT0", [3], "FP32")
        inp.set_data_from_numpy(np.array([0.25, 0.75, 0.5], dtype=np.float32))
        client.async_stream_infer("cls_stream", [inp], outputs=[grpcclient.InferRequestedOutput("PROB", class_count=2)])
        got = []
        for _ in range(2):
            result, error = results.get(timeout=60)
            assert error is None, error
            got.append(result.as_numpy("PROB").tolist())
        assert got == [[b"0.750000:1", b"0.500000:2"], [b"-0.250000:0", b"-0.500000:2"]]
    finally:
        client.stop_stream()
        client.close()


def test_class_count_is_bounded(server):
    """Triton ranks at most a million elements per row (refused, not sorted)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        for n, ok in ((1_000_000, True), (1_000_001, False)):
            x = np.zeros(n, dtype=np.float32)
            x[7] = 1.0
            inp = httpclient.InferInput("INPUT0", [n], "FP32")
            inp.set_data_from_numpy(x)
            outputs = [httpclient.InferRequestedOutput("PROB", class_count=1)]
            if ok:
                assert client.infer("cls_any", [inp], outputs=outputs).as_numpy("PROB").tolist() == [b"1.000000:7"]
            else:
                with pytest.raises(InferenceServerException) as e:
                    client.infer("cls_any", [inp], outputs=outputs)
                assert e.value.status() == "400" and "classification output tensor too large" in e.value.message()
    finally:
        client.close()


@pytest.mark.parametrize("value", [-1, True, "3", 2.5])
def test_bad_class_count_is_refused(server, value):
    """Triton 2.51's words, with 400 where it answers 500."""
    seen = _http_case_params(server.http_port, {"classification": value})
    assert seen["status"] == 400, seen
    assert seen["error"].startswith("Unable to set 'classification': attempt to access JSON non-unsigned-integer "
                                    "as unsigned-integer"), seen


@pytest.mark.parametrize("kind,value,message", [
    ("int64_param", 0, "invalid value for 'classification' parameter, expected >= 0"),
    ("int64_param", -2, "invalid value for 'classification' parameter, expected >= 0"),
    ("uint64_param", 2, "invalid value type for 'classification' parameter, expected int64_param"),
    ("string_param", "2", "invalid value type for 'classification' parameter, expected int64_param"),
    ("bool_param", True, "invalid value type for 'classification' parameter, expected int64_param"),
])
def test_grpc_bad_class_count_is_refused(server, kind, value, message):
    """Triton's gRPC front-end: an int64_param above 0, else INVALID_ARGUMENT in its words."""
    request = service_pb2.ModelInferRequest(model_name="cls_batched", raw_input_contents=[ROWS[:1].tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 6])
    setattr(request.outputs.add(name="PROB").parameters["classification"], kind, value)
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_class_count_zero_is_the_plain_output(server):
    """As Triton's HTTP front-end reads it: 0 asks for no classes."""
    conn_doc = _http_case_params(server.http_port, {"classification": 0, "binary_data": False})
    assert conn_doc["status"] == 200 and conn_doc["datatype"] == "FP32", conn_doc


def _http_case_params(port: int, params: dict) -> dict[str, Any]:
    x = ROWS[:1]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 6], "data": x.ravel().tolist()}],
                       "outputs": [{"name": "PROB", "parameters": params}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v2/models/cls_batched/infer", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, doc = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    if status != 200:
        return {"status": status, "error": doc["error"]}
    return {"status": status, "datatype": doc["outputs"][0]["datatype"]}


def test_shared_memory_output_with_classification_is_refused(server):
    """Triton: the classes are made from the output, so it can not go to a region (tritonclient
    refuses it itself: the requests are built by hand)."""
    params = {"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 24}
    assert _http_case_params(server.http_port, params) == {
        "status": 400, "error": "Output can't set both 'shared_memory_region' and 'classification'"}
    request = service_pb2.ModelInferRequest(model_name="cls_batched", raw_input_contents=[ROWS[:1].tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 6])
    out = request.outputs.add(name="PROB")
    out.parameters["classification"].int64_param = 2
    out.parameters["shared_memory_region"].string_param = "r"
    out.parameters["shared_memory_byte_size"].int64_param = 24
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "can't set both 'shared_memory_region' and 'classification'" in e.value.details()


# --------------------------------------------------------------------------- units
def test_labels_come_from_the_model_directory(tmp_path):
    (tmp_path / "labels.txt").write_bytes(b"a\nb\n\nc")
    config = mc.ModelConfig(output=[mc.ModelOutput(name="P", label_filename="labels.txt"), mc.ModelOutput(name="Q")])
    assert load_labels(config, tmp_path, "m") == {"P": [b"a", b"b", b"", b"c"]}


def test_label_file_outside_the_model_directory_fails_the_load(tmp_path):
    (tmp_path / "outside.txt").write_text("x\n")
    (tmp_path / "m").mkdir()
    config = mc.ModelConfig(output=[mc.ModelOutput(name="P", label_filename="../outside.txt")])
    with pytest.raises(Unsupported, match="is outside model directory"):
        load_labels(config, tmp_path / "m", "m")
    config = mc.ModelConfig(output=[mc.ModelOutput(name="P", label_filename="missing.txt")])
    with pytest.raises(InvalidArgument, match="failed to open text file for read"):
        load_labels(config, tmp_path / "m", "m")


def test_ranking_is_stable_and_formats_as_cpp():
    values = np.array([3, 7, 7, -2, 7], dtype=np.int64)
    out = classify(OutputTensor("P", "INT64", [5], values.tobytes()), 4, False, [b"z"])
    assert out.datatype == "BYTES" and out.shape == [4]
    assert codec.deserialize_bytes(out.data, 4).tolist() == [b"7:1", b"7:2", b"7:4", b"3:0:z"]
    big = np.zeros(40, dtype=np.float32)  # past the small sizes where std::sort is stable too
    out = classify(OutputTensor("P", "FP32", [2, 20], big.tobytes()), 2, True, None)
    assert out.shape == [2, 2]
    assert codec.deserialize_bytes(out.data, 4).tolist() == [b"0.000000:0", b"0.000000:1"] * 2


if __name__ == "__main__":  # capture the golden file from a running server: HTTP_PORT GRPC_PORT
    json.dump(observe(int(sys.argv[1]), int(sys.argv[2])), sys.stdout, indent=1)
    print()
