"""Sequence batching end to end: one real server, python sequence models
(``tests/models.py: SEQUENCE_PY``), tritonclient over HTTP, gRPC and the gRPC stream, and
perf_analyzer with --sequence-length. The model reports what the batcher gave it (control
values, correlation ID, instance and row), so each assertion pins what Triton's sequence
batcher does; the errors are Triton 2.51's, checked against it."""
from __future__ import annotations

import asyncio
import queue
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import sequence_model, write_model

pytestmark = pytest.mark.timeout(120)

OLDEST = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 2000 }"
IDLE_US = 300_000

# A decoupled sequence model: two responses per request (INPUT x 1, INPUT x 2), each
# carrying the correlation ID, then the final flag; a null request gets only the final flag.
DECOUPLED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            if pb_utils.get_input_tensor_by_name(r, "READY").as_numpy().reshape(-1)[0]:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().astype(np.int64)
                for k in (1, 2):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", (x * k).astype(np.int32)),
                                                            pb_utils.Tensor("CORRID_OUT", corrid)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# Calls seq_nobatch through BLS with the correlation ID and flags its request parameters name.
BLS_PY = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            p = json.loads(r.parameters())
            call = pb_utils.InferenceRequest(model_name="seq_nobatch",
                                             inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT")],
                                             requested_output_names=["OUTPUT"], correlation_id=p["sid"],
                                             flags=p["flags"])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]))
        return responses
"""
BLS_CONFIG = """
name: "seq_bls"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
DECOUPLED_CONFIG = """
name: "seq_decoupled"
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
sequence_batching {
  direct { }
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORRID_OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence")
    repo = root / "models"
    sequence_model(repo, "seq_direct")
    sequence_model(repo, "seq_oldest", strategy=OLDEST)
    sequence_model(repo, "seq_str", corrid_type="TYPE_STRING")
    sequence_model(repo, "seq_nobatch", max_batch_size=0)
    sequence_model(repo, "seq_idle", idle_us=IDLE_US)
    default_idle = sequence_model(repo, "seq_default_idle") / "config.pbtxt"
    default_idle.write_text(default_idle.read_text().replace("max_sequence_idle_microseconds: 5000000", ""))
    sequence_model(repo, "seq_two", max_batch_size=1, instances=2)
    sequence_model(repo, "seq_stats")
    sequence_model(repo, "seq_pa", max_batch_size=8, instances=2)
    write_model(repo, "seq_decoupled", config=DECOUPLED_CONFIG, model_py=DECOUPLED_PY)
    write_model(repo, "seq_bls", config=BLS_CONFIG, model_py=BLS_PY)
    server = ServerProcess(repo, root / "server.log").start()
    yield server
    server.stop_cleanly()


def _inputs(mod, value: int, batched: bool = True, rows: int = 1):
    shape = [rows, 1] if batched else [1]
    inp = mod.InferInput("INPUT", shape, "INT32")
    inp.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return [inp]


def _seen(result, batched: bool = True) -> dict:
    """What the model reported for one request."""
    where = result.as_numpy("WHERE").reshape(-1)[0].decode().split(":", 5)
    return {"total": int(result.as_numpy("OUTPUT").reshape(-1)[0]),
            "control": result.as_numpy("CONTROL").reshape(-1).tolist(),
            "corrid": result.as_numpy("CORRID_OUT").reshape(-1)[0].decode(),
            "instance": where[0], "row": int(where[1]), "batch": int(where[2]), "nulls": int(where[3]),
            "flags": int(where[4]), "correlation_id": where[5]}


def http_infer(srv, model, value, batched=True, **kw):
    client = httpclient.InferenceServerClient(srv.http_url)
    return _seen(client.infer(model, _inputs(httpclient, value, batched), **kw), batched)


def grpc_infer(srv, model, value, batched=True, **kw):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    return _seen(client.infer(model, _inputs(grpcclient, value, batched), **kw), batched)


def http_error(srv, model, value=1, rows=1, **kw) -> tuple[int, str]:
    client = httpclient.InferenceServerClient(srv.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, _inputs(httpclient, value, rows=rows), **kw)
    return int(e.value.status()), e.value.message()


def grpc_error(srv, model, value=1, rows=1, **kw) -> tuple[str, str]:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, _inputs(grpcclient, value, rows=rows), **kw)
    return e.value.status(), e.value.message()


def start_error(sid, model: str) -> str:
    return (f"inference request for sequence {sid} to model '{model}' must specify the START flag on the first "
            "request of the sequence")


def no_id_error(model: str) -> str:
    return f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"


# -- one sequence, each protocol -------------------------------------------------------------
@pytest.mark.parametrize("infer", [http_infer, grpc_infer], ids=["http", "grpc"])
def test_sequence_gets_controls_and_keeps_state(srv, infer):
    sid = 1000 if infer is http_infer else 2000
    first = infer(srv, "seq_direct", 5, sequence_id=sid, sequence_start=True)
    middle = infer(srv, "seq_direct", 6, sequence_id=sid)
    last = infer(srv, "seq_direct", 7, sequence_id=sid, sequence_end=True)
    # START is FP32 0/1, END BOOL, READY INT32 0/1 as configured; the state carries the sum
    assert [first["control"], middle["control"], last["control"]] == [[1, 0, 1], [0, 0, 1], [0, 1, 1]]
    assert [first["total"], middle["total"], last["total"]] == [5, 11, 18]
    assert {first["corrid"], middle["corrid"], last["corrid"]} == {str(sid)}
    # request.flags() and request.correlation_id() as Triton's python backend gives them
    assert [first["flags"], middle["flags"], last["flags"]] == [1, 0, 2]
    assert {first["correlation_id"], middle["correlation_id"], last["correlation_id"]} == {str(sid)}
    status, message = (http_error if infer is http_infer else grpc_error)(srv, "seq_direct", sequence_id=sid)
    assert status in (400, "StatusCode.INVALID_ARGUMENT") and message == start_error(sid, "seq_direct")


def test_sequence_without_batch_dimension(srv):
    first = http_infer(srv, "seq_nobatch", 2, batched=False, sequence_id=3000, sequence_start=True)
    last = http_infer(srv, "seq_nobatch", 3, batched=False, sequence_id=3000, sequence_end=True)
    assert (first["total"], last["total"], last["control"]) == (2, 5, [0, 1, 1])


def test_start_on_a_live_sequence_begins_it_again(srv):
    http_infer(srv, "seq_direct", 4, sequence_id=3100, sequence_start=True)
    again = http_infer(srv, "seq_direct", 1, sequence_id=3100, sequence_start=True)
    last = http_infer(srv, "seq_direct", 1, sequence_id=3100, sequence_end=True)
    assert (again["total"], again["control"], last["total"]) == (1, [1, 0, 1], 2)


def test_model_that_returns_no_state_keeps_the_last_one(srv):
    http_infer(srv, "seq_direct", 5, sequence_id=3200, sequence_start=True)
    skipped = http_infer(srv, "seq_direct", 100, sequence_id=3200, parameters={"keep_state": False})
    last = http_infer(srv, "seq_direct", 1, sequence_id=3200, sequence_end=True)
    assert (skipped["total"], last["total"]) == (105, 6)


def test_gRPC_stream_sequence_and_error_keeps_the_stream_open(srv):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        client.async_stream_infer("seq_direct", _inputs(grpcclient, 1), sequence_id=4000)
        _, error = replies.get(timeout=30)
        assert error is not None and error.message() == start_error(4000, "seq_direct")
        for i in range(1, 6):
            client.async_stream_infer("seq_direct", _inputs(grpcclient, i), sequence_id=4000,
                                      sequence_start=i == 1, sequence_end=i == 5)
        totals = []
        for _ in range(5):
            result, error = replies.get(timeout=30)
            assert error is None
            totals.append(_seen(result)["total"])
        assert totals == [1, 3, 6, 10, 15]  # in order, each on the state of the one before
    finally:
        client.stop_stream()


def test_decoupled_sequence_model_on_the_stream(srv):
    """A decoupled model's responses reach the stream; the null request of a batch (slot 0
    while only slot 1 has work) answers nowhere, and the stream goes on."""
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))

    def send(value, sid, **kw):
        client.async_stream_infer("seq_decoupled", _inputs(grpcclient, value), sequence_id=sid, **kw)
        got = []
        for _ in range(2):
            result, error = replies.get(timeout=30)
            assert error is None, error
            got.append((int(result.as_numpy("OUTPUT").reshape(-1)[0]),
                        int(result.as_numpy("CORRID_OUT").reshape(-1)[0])))
        return got

    try:
        assert send(3, 4501, sequence_start=True) == [(3, 4501), (6, 4501)]
        assert send(4, 4502, sequence_start=True) == [(4, 4502), (8, 4502)]  # slot 1: a null request in row 0
        assert send(5, 4502, sequence_end=True) == [(5, 4502), (10, 4502)]
        assert send(6, 4501, sequence_end=True) == [(6, 4501), (12, 4501)]
    finally:
        client.stop_stream()


def test_bls_call_into_a_sequence_model(srv):
    """pb_utils.InferenceRequest(correlation_id=..., flags=...) from a Python model runs in
    the sequence like any client request; a call without START is Triton's error."""
    client = httpclient.InferenceServerClient(srv.http_url)

    def call(value, flags, sid=3300):
        return client.infer("seq_bls", _inputs(httpclient, value, batched=False),
                            parameters={"sid": sid, "flags": flags})

    totals = [int(call(v, f).as_numpy("OUTPUT")[0]) for v, f in ((1, 1), (2, 0), (3, 2))]
    assert totals == [1, 3, 6]
    with pytest.raises(InferenceServerException) as e:
        call(1, 0)
    assert start_error(3300, "seq_nobatch") in e.value.message()


# -- slots, instances and strategies ---------------------------------------------------------
def test_direct_rows_are_slots_with_null_requests_between(srv):
    a = http_infer(srv, "seq_direct", 1, sequence_id=5001, sequence_start=True)
    b = http_infer(srv, "seq_direct", 1, sequence_id=5002, sequence_start=True)
    b_again = http_infer(srv, "seq_direct", 1, sequence_id=5002)
    a_end = http_infer(srv, "seq_direct", 1, sequence_id=5001, sequence_end=True)
    b_end = http_infer(srv, "seq_direct", 1, sequence_id=5002, sequence_end=True)
    # slot 0, then slot 1: a batch for slot 1 alone has a null request (READY false) in row 0
    assert (a["row"], a["batch"], a["nulls"]) == (0, 1, 0)
    assert (b_end["flags"], b_end["correlation_id"]) == (2, "5002")
    assert [(r["row"], r["batch"], r["nulls"]) for r in (b, b_again, b_end)] == [(1, 2, 1)] * 3
    assert (a_end["row"], a_end["batch"]) == (0, 1)


def test_oldest_batches_have_no_null_requests(srv):
    http_infer(srv, "seq_oldest", 1, sequence_id=5101, sequence_start=True)
    b = http_infer(srv, "seq_oldest", 2, sequence_id=5102, sequence_start=True)
    b_end = http_infer(srv, "seq_oldest", 3, sequence_id=5102, sequence_end=True)
    http_infer(srv, "seq_oldest", 1, sequence_id=5101, sequence_end=True)
    assert [(r["row"], r["batch"], r["nulls"], r["total"]) for r in (b, b_end)] == [(0, 1, 0, 2), (0, 1, 0, 5)]


@pytest.mark.parametrize("model", ["seq_two", "seq_oldest", "seq_direct"])
def test_concurrent_sequences_stay_on_their_instance_and_state(srv, model):
    """Sequences interleaved over gRPC (aio), several in each batch: every request of a
    sequence runs on the same instance (and, for direct, in the same row) and sees its own state."""
    base = {"seq_two": 6000, "seq_oldest": 6100, "seq_direct": 6200}[model]

    async def one(client, sid: int, length: int):
        seen = []
        for i in range(1, length + 1):
            result = await client.infer(model, _inputs(grpcclient, sid % 100 + i), sequence_id=sid,
                                        sequence_start=i == 1, sequence_end=i == length)
            seen.append(_seen(result))
        return seen

    async def run():
        async with aiogrpc.InferenceServerClient(srv.grpc_url) as client:
            return await asyncio.gather(*(one(client, base + k, 6 + k) for k in range(1, 7)))

    for k, seen in enumerate(asyncio.run(run()), start=1):
        sid, length = base + k, 6 + k
        assert {s["instance"] for s in seen} == {seen[0]["instance"]}
        if model != "seq_oldest":
            assert {s["row"] for s in seen} == {seen[0]["row"]}
        assert [s["total"] for s in seen] == [sum(sid % 100 + j for j in range(1, i + 1)) for i in range(1, length + 1)]
        assert {s["corrid"] for s in seen} == {str(sid)}
    if model == "seq_two":  # six sequences on two instances with one slot each: both were used
        assert len({s["instance"] for seen in asyncio.run(run()) for s in seen}) == 2


def test_idle_sequence_is_released(srv):
    http_infer(srv, "seq_idle", 1, sequence_id=7000, sequence_start=True)
    time.sleep(3 * IDLE_US / 1e6)
    assert http_error(srv, "seq_idle", sequence_id=7000) == (400, start_error(7000, "seq_idle"))
    fresh = http_infer(srv, "seq_idle", 2, sequence_id=7000, sequence_start=True, sequence_end=True)
    assert (fresh["total"], fresh["row"]) == (2, 0)  # a new sequence, with fresh state, in the freed slot


# -- string correlation IDs ------------------------------------------------------------------
def test_string_correlation_ids(srv):
    first = grpc_infer(srv, "seq_str", 2, sequence_id="user-7", sequence_start=True)
    last = http_infer(srv, "seq_str", 3, sequence_id="user-7", sequence_end=True)
    assert (first["corrid"], last["corrid"], last["total"]) == ("user-7", "user-7", 5)
    assert (first["correlation_id"], first["flags"], last["flags"]) == ("user-7", 1, 2)
    longest = http_infer(srv, "seq_str", 1, sequence_id="x" * 128, sequence_start=True, sequence_end=True)
    assert longest["corrid"] == "x" * 128
    too_long = "string correlation ID cannot be longer than 128 characters"
    assert http_error(srv, "seq_str", sequence_id="x" * 129, sequence_start=True) == (501, too_long)
    assert grpc_error(srv, "seq_str", sequence_id="x" * 129, sequence_start=True) == (
        "StatusCode.UNIMPLEMENTED", too_long)


def test_string_id_to_a_numeric_corrid_model_is_refused(srv):
    message = ("inference request to model 'seq_direct' has the string correlation ID 'abc', but the model's "
               "CORRID control input takes integers")
    assert http_error(srv, "seq_direct", sequence_id="abc", sequence_start=True) == (400, message)
    assert grpc_error(srv, "seq_direct", sequence_id="abc", sequence_start=True) == (
        "StatusCode.INVALID_ARGUMENT", message)


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"sequence_id": 0}, {"sequence_id": ""}], ids=["missing", "zero", "empty"])
def test_correlation_id_required(srv, kw):
    assert http_error(srv, "seq_direct", **kw) == (400, no_id_error("seq_direct"))
    assert grpc_error(srv, "seq_direct", **kw) == ("StatusCode.INVALID_ARGUMENT", no_id_error("seq_direct"))


def test_new_sequence_needs_start(srv):
    assert http_error(srv, "seq_direct", sequence_id=8000, sequence_end=True) == (400, start_error(8000, "seq_direct"))


def test_batch_of_two_is_refused(srv):
    message = ("inference request to model 'seq_direct' must specify batch-size 1 due to requirements of "
               "sequence batcher")
    assert http_error(srv, "seq_direct", rows=2, sequence_id=8100, sequence_start=True) == (400, message)
    assert grpc_error(srv, "seq_direct", rows=2, sequence_id=8100, sequence_start=True) == (
        "StatusCode.INVALID_ARGUMENT", message)


def test_control_and_state_inputs_are_not_the_clients(srv):
    client = httpclient.InferenceServerClient(srv.http_url)
    extra = httpclient.InferInput("INPUT_STATE", [1, 1], "INT32")
    extra.set_data_from_numpy(np.zeros((1, 1), np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("seq_direct", _inputs(httpclient, 1) + [extra], sequence_id=8200, sequence_start=True)
    assert e.value.status() == "400" and "unexpected input(s) ['INPUT_STATE']" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("seq_direct", _inputs(httpclient, 1), sequence_id=8200, sequence_start=True,
                     outputs=[httpclient.InferRequestedOutput("OUTPUT_STATE")])
    assert e.value.message() == ("[request id: <id_unknown>] unexpected inference output 'OUTPUT_STATE' "
                                 "for model 'seq_direct'")


UNABLE_ID = "Unable to parse 'sequence_id': attempt to access JSON non-string as string"


def unable_flag(key: str) -> str:
    return f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean"


@pytest.mark.parametrize("params, message", [
    ({"sequence_id": -5, "sequence_start": True}, UNABLE_ID),
    ({"sequence_id": True, "sequence_start": True}, UNABLE_ID),
    ({"sequence_id": 5.0, "sequence_start": True}, UNABLE_ID),
    ({"sequence_id": 2**64, "sequence_start": True}, UNABLE_ID),
    ({"sequence_id": None, "sequence_start": True}, UNABLE_ID),
    ({"sequence_id": 5, "sequence_start": 1}, unable_flag("sequence_start")),
    ({"sequence_id": 5, "sequence_start": "yes"}, unable_flag("sequence_start")),
    ({"sequence_id": 5, "sequence_start": None}, unable_flag("sequence_start")),
    ({"sequence_id": 5, "sequence_end": "x"}, unable_flag("sequence_end")),
    ({"sequence_id": 5, "sequence_end": 1}, unable_flag("sequence_end")),
    ({"sequence_end": "x", "sequence_start": 1}, unable_flag("sequence_end")),  # the first in the document
    ({"sequence_start": 1}, unable_flag("sequence_start")),  # before the correlation ID is missed
])
@pytest.mark.parametrize("model", ["seq_direct", "seq_bls"])  # a sequence model, and one without sequences
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])  # the general parser, the common shape
def test_malformed_sequence_parameters(srv, params, message, model, binary):
    """Triton's HTTP front-end reads the control parameters itself, for every model, and refuses
    a value of the wrong type with its JSON reader's words (as a 500, where every malformed
    request here is a 400, InvalidArgument)."""
    import json
    import urllib.error
    import urllib.request
    data = np.array([[1]] if model == "seq_direct" else [1], dtype=np.int32)
    tensor = {"name": "INPUT", "datatype": "INT32", "shape": list(data.shape)}
    if binary:
        tensor["parameters"] = {"binary_data_size": data.nbytes}
    else:
        tensor["data"] = data.reshape(-1).tolist()
    header = json.dumps({"inputs": [tensor], "parameters": params}).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))} \
        if binary else {"Content-Type": "application/json"}
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/{model}/infer",
                                 header + (data.tobytes() if binary else b""), headers)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert (e.value.code, json.loads(e.value.read())) == (400, {"error": message})


# -- the control parameters over gRPC, as raw messages ---------------------------------------
def raw_request(model: str = "seq_direct", request_id: str = "", **params) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest for one of the sequence models with ``params`` given as
    ``key=(field, value)``: each parameter's value in the field a client chose."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    shape = [1, 1] if model != "seq_bls" else [1]
    request.inputs.add(name="INPUT", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.full(shape, 3, dtype=np.int32).tobytes())
    for key, (kind, value) in params.items():
        setattr(request.parameters[key], kind, value)
    return request


def raw_seen(response: service_pb2.ModelInferResponse) -> dict:
    """What SEQUENCE_PY reported, from a raw response."""
    raw = {o.name: response.raw_output_contents[i] for i, o in enumerate(response.outputs)}
    where = raw["WHERE"][4:].decode().split(":", 5)
    return {"total": int(np.frombuffer(raw["OUTPUT"], np.int32)[0]), "corrid": raw["CORRID_OUT"][4:].decode(),
            "flags": int(where[4]), "correlation_id": where[5]}


def test_grpc_negative_int64_sequence_id_is_the_unsigned_id(srv):
    """A C++ client casts a correlation ID of 2**63 and above to int64: the same 64 bits are
    the unsigned ID, the one the model's CORRID input and request.correlation_id() get. The
    response echoes no parameter."""
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        first = stub.ModelInfer(raw_request(sequence_id=("int64_param", -1), sequence_start=("bool_param", True)))
        last = stub.ModelInfer(raw_request(sequence_id=("int64_param", -1), sequence_end=("bool_param", True)))
        # the same sequence as the unsigned ID over HTTP (the state carries on); 2**63 as -2**63
        both = http_infer(srv, "seq_direct", 1, sequence_id=2**63, sequence_start=True)
        half = stub.ModelInfer(raw_request(sequence_id=("int64_param", -2**63), sequence_end=("bool_param", True)))
    sid = str(2**64 - 1)
    assert [raw_seen(first), raw_seen(last)] == [{"total": 3, "corrid": sid, "flags": 1, "correlation_id": sid},
                                                 {"total": 6, "corrid": sid, "flags": 2, "correlation_id": sid}]
    assert not first.parameters and not last.parameters
    assert (both["correlation_id"], raw_seen(half)["correlation_id"], raw_seen(half)["total"]) == (
        str(2**63), str(2**63), 4)


@pytest.mark.parametrize("params, message", [
    ({"sequence_id": ("uint64_param", 77), "sequence_start": ("bool_param", True)},
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ({"sequence_id": ("bool_param", True), "sequence_start": ("bool_param", True)},
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ({"sequence_id": ("double_param", 5.0), "sequence_start": ("bool_param", True)},
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ({"sequence_id": ("int64_param", 5), "sequence_start": ("int64_param", 1)},
     "invalid value type for 'sequence_start' parameter, expected bool_param."),
    ({"sequence_id": ("int64_param", 5), "sequence_start": ("string_param", "true")},
     "invalid value type for 'sequence_start' parameter, expected bool_param."),
    ({"sequence_id": ("int64_param", 5), "sequence_end": ("string_param", "x")},
     "invalid value type for 'sequence_end' parameter, expected bool_param."),
    ({"sequence_id": ("int64_param", 5), "sequence_end": ("uint64_param", 1)},
     "invalid value type for 'sequence_end' parameter, expected bool_param."),
    ({"sequence_start": ("int64_param", 1)},  # before the correlation ID is missed
     "invalid value type for 'sequence_start' parameter, expected bool_param."),
])
@pytest.mark.parametrize("model", ["seq_direct", "seq_bls"])  # a sequence model, and one without sequences
def test_grpc_sequence_parameters_of_the_wrong_type(srv, params, message, model):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(raw_request(model, **params))
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_grpc_stream_error_names_its_request(srv):
    """An error on the stream carries the failing request's id in infer_response (present,
    and empty, for a request without one); the good replies around it are unchanged."""
    requests = [
        raw_request(request_id="good-1", sequence_id=("int64_param", 4600), sequence_start=("bool_param", True)),
        raw_request(request_id="no-start", sequence_id=("int64_param", 4601)),
        raw_request(request_id="bad-type", sequence_id=("int64_param", 4600), sequence_end=("int64_param", 1)),
        raw_request(model="no_such_model", request_id="no-model"),
        raw_request(sequence_id=("int64_param", 4602)),
        raw_request(request_id="good-2", sequence_id=("int64_param", 4600), sequence_end=("bool_param", True)),
    ]

    def send():  # one at a time, so the replies come in order
        for request in requests:
            yield request
            replied.get(timeout=30)

    replied: queue.Queue = queue.Queue()
    got = []
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for reply in stub.ModelStreamInfer(send(), timeout=60):
            got.append(reply)
            replied.put(None)
            if len(got) == len(requests):
                break
    errors = [(r.error_message, r.HasField("infer_response"), r.infer_response) for r in got]
    assert [(message, present, infer.id, infer.model_name, len(infer.parameters))
            for message, present, infer in errors[1:5]] == [
        (start_error(4601, "seq_direct"), True, "no-start", "", 0),
        ("invalid value type for 'sequence_end' parameter, expected bool_param.", True, "bad-type", "", 0),
        ("Request for unknown model: 'no_such_model' is not found", True, "no-model", "", 0),
        (start_error(4602, "seq_direct"), True, "", "", 0),
    ]
    assert [(r.error_message, r.infer_response.id, raw_seen(r.infer_response)["total"]) for r in (got[0], got[5])] \
        == [("", "good-1", 3), ("", "good-2", 6)]


# -- config ----------------------------------------------------------------------------------
def test_default_idle_time_is_shown(srv):
    """A config without max_sequence_idle_microseconds shows the 1 s it uses, over both APIs."""
    http_config = httpclient.InferenceServerClient(srv.http_url).get_model_config("seq_default_idle")
    grpc_config = grpcclient.InferenceServerClient(srv.grpc_url).get_model_config("seq_default_idle").config
    assert http_config["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000
    assert grpc_config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    idle = httpclient.InferenceServerClient(srv.http_url).get_model_config("seq_idle")
    assert idle["sequence_batching"]["max_sequence_idle_microseconds"] == IDLE_US  # a set one stays


# -- statistics and perf_analyzer ------------------------------------------------------------
def test_statistics_count_requests_not_null_rows(srv):
    http_infer(srv, "seq_stats", 1, sequence_id=9001, sequence_start=True)
    http_infer(srv, "seq_stats", 1, sequence_id=9002, sequence_start=True)
    http_infer(srv, "seq_stats", 1, sequence_id=9002, sequence_end=True)  # a batch of 2 rows: one null
    http_infer(srv, "seq_stats", 1, sequence_id=9001, sequence_end=True)
    stats = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("seq_stats")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (4, 4)
    assert stats["inference_stats"]["success"]["count"] == 4


def test_perf_analyzer_drives_sequences(srv, perf_analyzer):
    before = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("seq_pa")["model_stats"][0]
    for protocol, url in (("grpc", srv.grpc_url), ("http", srv.http_url)):
        args = ["-m", "seq_pa", "-u", url, "-i", protocol, "--sequence-length", "5", "--sequence-id-range", "100:200",
                "--concurrency-range", "4", "--measurement-interval", "800", "--max-trials", "4",
                "--stability-percentage", "1000"]
        proc = perf_analyzer.run(*args, timeout=90)
        assert proc.returncode == 0 and "Throughput" in proc.stdout, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    after = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("seq_pa")["model_stats"][0]
    assert after["inference_count"] > before["inference_count"]
    assert after["inference_stats"]["fail"]["count"] == 0


def test_rate_limited_sequence_model(tmp_path):
    """--rate-limit execution_count with two instances that need the one unit of a resource:
    the sequences on each instance still run in order, with their own state."""
    model_dir = sequence_model(tmp_path / "models", "seq_limited", max_batch_size=1, instances=2)
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "instance_group [ { count: 2 kind: KIND_CPU } ]",
        'instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]'))
    server = ServerProcess(tmp_path / "models", tmp_path / "server.log",
                           extra_args=["--rate-limit", "execution_count"]).start()
    try:
        totals = {7101: [], 7102: []}
        for i in range(1, 5):
            for sid in totals:
                seen = http_infer(server, "seq_limited", i, sequence_id=sid, sequence_start=i == 1, sequence_end=i == 4)
                totals[sid].append((seen["total"], seen["instance"]))
        for seen in totals.values():
            assert [t for t, _ in seen] == [1, 3, 6, 10] and len({inst for _, inst in seen}) == 1
        assert totals[7101][0][1] != totals[7102][0][1]  # one slot each: the two sequences on the two instances
    finally:
        server.stop_cleanly()
