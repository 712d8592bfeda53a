"""Dynamic batching, instance groups, queue policies and the statistics extension,
against one real server process (``tests/harness.ServerProcess``) over a repository
built here, plus unit tests of the batch assembler (C extension and Python twin).

The Python models report, per request, what the scheduler did: how many requests and
rows shared their execution, when it started and ended, and on which thread. They can
sleep (config parameter ``SLEEP_S``, request parameter ``sleep_ms``) to keep an instance
busy, and fail one request (request parameter ``fail``).
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttp_client
from tritonclient.utils import InferenceServerException

from .harness import ServerProcess
from .models import onnx_add_sub, onnx_identity, write_model

pytestmark = pytest.mark.timeout(120)

# -- the repository -----------------------------------------------------------------------

RECORDER_PY = """
import json
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = cfg.get("parameters") or {}
        value = params.get("SLEEP_S") or {}
        value = value.get("string_value") if isinstance(value, dict) else value
        self.sleep = float(value or 0)
        self.max_rows = int(cfg.get("max_batch_size", 0) or 0)
        # which instance ran a batch (its own process, or a thread of the shared worker)
        self.instance = zlib.crc32(args["model_instance_name"].encode())

    def execute(self, requests):
        start = time.time()
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        rows = [a.shape[0] for a in arrays]
        total = sum(rows)
        if self.max_rows and total > self.max_rows:
            raise pb_utils.TritonModelException(
                f"batch of {total} rows exceeds max_batch_size {self.max_rows}")
        params = []
        for r in requests:
            p = r.parameters()
            params.append(json.loads(p) if isinstance(p, str) and p else (p or {}))
        if any(p.get("raise") for p in params):
            raise pb_utils.TritonModelException("raising as asked")
        extra = max(float(p.get("sleep_ms", 0)) for p in params) / 1000.0
        if self.sleep + extra:
            time.sleep(self.sleep + extra)
        end = time.time()
        responses = []
        for a, n, p in zip(arrays, rows, params):
            if p.get("fail"):
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("failing as asked")))
                continue
            col = lambda v, dt: np.full((n, 1), v, dtype=dt)  # noqa: E731
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a.copy()),
                pb_utils.Tensor("NREQ", col(len(requests), np.int32)),
                pb_utils.Tensor("ROWS", col(total, np.int32)),
                pb_utils.Tensor("START", col(start, np.float64)),
                pb_utils.Tensor("END", col(end, np.float64)),
                pb_utils.Tensor("INSTANCE", col(self.instance, np.int64)),
            ]))
        return responses
"""


def recorder(repo: Path, name: str, *, max_batch_size: int = 8, batching: str | None = None,
             count: int = 1, sleep_s: float = 0.0) -> None:
    """A recording Python model; ``batching`` is the body of ``dynamic_batching { }``
    (None: no dynamic batching)."""
    db = f"dynamic_batching {{ {batching} }}" if batching is not None else ""
    write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
        output [
          {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }},
          {{ name: "NREQ" data_type: TYPE_INT32 dims: [ 1 ] }},
          {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }},
          {{ name: "START" data_type: TYPE_FP64 dims: [ 1 ] }},
          {{ name: "END" data_type: TYPE_FP64 dims: [ 1 ] }},
          {{ name: "INSTANCE" data_type: TYPE_INT64 dims: [ 1 ] }}
        ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        parameters {{ key: "SLEEP_S" value: {{ string_value: "{sleep_s}" }} }}
        {db}
        """, model_py=RECORDER_PY)


def onnx_model(repo: Path, name: str, build, inputs: list[tuple[str, str, str]],
               outputs: list[tuple[str, str, str]], batching: str = "max_queue_delay_microseconds: 200000",
               max_batch_size: int = 8) -> None:
    build(repo / name / "1" / "model.onnx")
    io = lambda ts: ",".join(  # noqa: E731
        f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in ts)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {io(inputs)} ]\noutput [ {io(outputs)} ]\n"
        f"dynamic_batching {{ {batching} }}\n")


# Models whose config must not load, and the words their reason must contain.
INVALID = {
    "bad_preferred": ("max_batch_size: 8", "preferred_batch_size: [ 16 ]", "preferred batch size"),
    "bad_default_level": ("max_batch_size: 8", "priority_levels: 2 default_priority_level: 3",
                          "default_priority_level"),
    "bad_no_batch_dim": ("max_batch_size: 0", "max_queue_delay_microseconds: 100", "max_batch_size"),
    "bad_queue_policy_level": (
        "max_batch_size: 8",
        "priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 5 value: { max_queue_size: 1 } }", "priority_queue_policy"),
}
# Configs that cannot even be parsed (a negative uint64): the model fails the repository poll,
# as in Triton, and stays listed by name only, with no state; the reason is in the log.
UNPARSABLE = {
    "bad_negative_delay": ("max_batch_size: 8", "max_queue_delay_microseconds: -1", ""),
}


def build_repository(repo: Path) -> Path:
    recorder(repo, "batch", batching="max_queue_delay_microseconds: 300000")
    recorder(repo, "batch_http", batching="max_queue_delay_microseconds: 300000")
    recorder(repo, "nobatch")
    recorder(repo, "preferred", batching="preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 600000",
             sleep_s=0.3)
    recorder(repo, "maxrows", max_batch_size=4, batching="max_queue_delay_microseconds: 200000")
    recorder(repo, "ordered", max_batch_size=1, count=2,
             batching="preserve_ordering: true max_queue_delay_microseconds: 0")
    recorder(repo, "par1", sleep_s=0.25, count=1)
    recorder(repo, "par2", sleep_s=0.25, count=2)
    recorder(repo, "prio", max_batch_size=1, sleep_s=0.15,
             batching="priority_levels: 2 default_priority_level: 2")
    recorder(repo, "qfull", max_batch_size=1, sleep_s=0.6,
             batching="default_queue_policy { max_queue_size: 1 }")
    recorder(repo, "qtimeout", max_batch_size=1, sleep_s=0.6,
             batching="default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 "
                      "allow_timeout_override: true }")
    recorder(repo, "qdelay", max_batch_size=1, sleep_s=0.3,
             batching="default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 50000 "
                      "allow_timeout_override: true }")
    recorder(repo, "stats", batching="max_queue_delay_microseconds: 150000")
    recorder(repo, "pa_batch", batching="max_queue_delay_microseconds: 5000", sleep_s=0.005)
    onnx_model(repo, "onnx_add", lambda p: onnx_add_sub(p, dims=("batch", 4)),
               [("INPUT0", "TYPE_FP32", "[ 4 ]"), ("INPUT1", "TYPE_FP32", "[ 4 ]")],
               [("OUTPUT0", "TYPE_FP32", "[ 4 ]"), ("OUTPUT1", "TYPE_FP32", "[ 4 ]")])
    onnx_model(repo, "onnx_bytes", lambda p: onnx_identity(p, "BYTES"),
               [("INPUT0", "TYPE_STRING", "[ -1 ]")], [("OUTPUT0", "TYPE_STRING", "[ -1 ]")])
    onnx_model(repo, "onnx_fp32", lambda p: onnx_identity(p, "FP32"),
               [("INPUT0", "TYPE_FP32", "[ -1 ]")], [("OUTPUT0", "TYPE_FP32", "[ -1 ]")])
    for name, (mbs, body, _) in {**INVALID, **UNPARSABLE}.items():
        write_model(repo, name, config=f"""
            name: "{name}"
            backend: "python"
            max_batch_size: {mbs.split()[-1]}
            input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
            output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
            dynamic_batching {{ {body} }}
            """, model_py=RECORDER_PY)
    return repo


class Server:
    def __init__(self, proc: ServerProcess):
        self.proc = proc
        self.http = f"http://{proc.http_url}"

    def get(self, path: str) -> tuple[int, dict]:
        return self.request("GET", path)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.http + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def stats(self, model: str) -> dict:
        status, body = self.get(f"/v2/models/{model}/stats")
        assert status == 200, body
        (entry,) = body["model_stats"]
        return entry

    def index(self) -> dict[str, dict]:
        status, rows = self.request("POST", "/v2/repository/index", {})
        assert status == 200, rows
        return {r["name"]: r for r in rows}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    root = tmp_path_factory.mktemp("batching")
    repo = build_repository(root / "models")
    proc = ServerProcess(repo, root / "server.log", extra_args=["--exit-on-error", "false"]).start(
        wait_ready=False)  # some models must fail to load
    srv = Server(proc)
    expected = {p.name for p in repo.iterdir()}
    deadline = time.monotonic() + 90
    while True:
        index = srv.index()
        if set(index) >= expected and all(
                r.get("state") in ("READY", "UNAVAILABLE") for n, r in index.items() if n not in UNPARSABLE):
            break
        assert time.monotonic() < deadline, f"models did not settle: {index}\n{proc.log()[-3000:]}"
        time.sleep(0.1)
    yield srv
    proc.stop_cleanly()


# -- client helpers -----------------------------------------------------------------------

OUTS = ("OUTPUT0", "NREQ", "ROWS", "START", "END", "INSTANCE")


def rows_of(tag: int, n: int) -> np.ndarray:
    """``n`` rows that name the request they belong to."""
    return np.array([[tag, r] for r in range(n)], dtype=np.float32)


async def ginfer(client, model: str, data: np.ndarray, **kwargs) -> dict[str, np.ndarray]:
    inp = aiogrpc.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    result = await client.infer(model, [inp], **kwargs)
    out = {n: result.as_numpy(n) for n in OUTS}
    out["done"] = time.time()
    return out


async def hinfer(client, model: str, data: np.ndarray, **kwargs) -> dict[str, np.ndarray]:
    inp = aiohttp_client.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data, binary_data=True)
    result = await client.infer(model, [inp], **kwargs)
    out = {n: result.as_numpy(n) for n in OUTS}
    out["done"] = time.time()
    return out


def run(coro_fn, server: Server, kind: str = "grpc"):
    async def main():
        if kind == "grpc":
            client = aiogrpc.InferenceServerClient(server.proc.grpc_url)
        else:
            client = aiohttp_client.InferenceServerClient(server.proc.http_url, conn_limit=64)
        try:
            return await coro_fn(client)
        finally:
            await client.close()
    return asyncio.run(main())


def check_own_rows(results, datas) -> None:
    for res, data in zip(results, datas):
        np.testing.assert_array_equal(res["OUTPUT0"], data)
        for name in ("NREQ", "ROWS", "START", "END", "INSTANCE"):
            assert res[name].shape == (data.shape[0], 1)


# -- dynamic batching ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_concurrent_requests_form_one_batch_and_get_their_own_rows(server, kind):
    model = "batch" if kind == "grpc" else "batch_http"
    sizes = [1, 2, 3, 2]  # 8 rows = max_batch_size
    datas = [rows_of(100 + i, n) for i, n in enumerate(sizes)]
    infer = ginfer if kind == "grpc" else hinfer
    before = server.stats(model)

    async def go(client):
        return await asyncio.gather(*(infer(client, model, d) for d in datas))
    results = run(go, server, kind)
    check_own_rows(results, datas)
    nreq = [int(r["NREQ"][0, 0]) for r in results]
    assert max(nreq) > 1, f"requests were not batched: {nreq}"
    assert all(int(r["ROWS"].max()) <= 8 for r in results)
    after = server.stats(model)
    executions = after["execution_count"] - before["execution_count"]
    assert executions < len(datas)
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert any(b["batch_size"] > 1 for b in after["batch_stats"]), after["batch_stats"]
    # requests that shared an execution saw the same start time
    by_start: dict[float, list[int]] = {}
    for i, r in enumerate(results):
        by_start.setdefault(float(r["START"][0, 0]), []).append(i)
    for members in by_start.values():
        assert all(nreq[i] == len(members) for i in members)
        assert all(int(results[i]["ROWS"][0, 0]) == sum(sizes[j] for j in members) for i in members)


def test_without_dynamic_batching_one_request_per_execution(server):
    datas = [rows_of(i, 1 + i % 3) for i in range(6)]
    before = server.stats("nobatch")

    async def go(client):
        return await asyncio.gather(*(ginfer(client, "nobatch", d) for d in datas))
    results = run(go, server)
    check_own_rows(results, datas)
    assert all(int(r["NREQ"][0, 0]) == 1 for r in results)
    after = server.stats("nobatch")
    assert after["execution_count"] - before["execution_count"] == len(datas)
    assert after["inference_count"] - before["inference_count"] == sum(d.shape[0] for d in datas)


def test_max_batch_size_never_exceeded(server):
    sizes = [3, 2, 4, 1, 3, 1, 2, 4, 1, 2]  # 23 rows against max_batch_size 4
    datas = [rows_of(200 + i, n) for i, n in enumerate(sizes)]

    async def go(client):
        return await asyncio.gather(*(ginfer(client, "maxrows", d) for d in datas))
    results = run(go, server)
    check_own_rows(results, datas)
    assert all(int(r["ROWS"][0, 0]) <= 4 for r in results)
    assert max(int(r["NREQ"][0, 0]) for r in results) > 1
    sizes_seen = {b["batch_size"] for b in server.stats("maxrows")["batch_stats"]}
    assert max(sizes_seen) <= 4


def test_preferred_batch_size_with_a_full_queue(server):
    """Eight single-row requests queue while the only instance is busy; preferred_batch_size
    [4] should shape the next batches (4 + 4), not one max_batch_size batch of 8.
    (Real Triton 2.51 formed 5 + 3 here -- its open payload grows while the instance is
    busy -- but never one 8-row batch.)"""
    async def go(client):
        busy = [asyncio.ensure_future(ginfer(client, "preferred", rows_of(i, 1))) for i in range(4)]
        await asyncio.sleep(0.1)
        later = [asyncio.ensure_future(ginfer(client, "preferred", rows_of(10 + i, 1))) for i in range(8)]
        return await asyncio.gather(*busy), await asyncio.gather(*later)
    busy, later = run(go, server)
    rows = [int(r["ROWS"][0, 0]) for r in later]
    assert rows == [4] * 8, rows


def test_onnx_concatenation_fp32_mixed_batch_sizes(server):
    sizes = [1, 3, 2, 1, 1]
    rng = np.random.default_rng(1)
    pairs = [(rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32))
             for n in sizes]
    before = server.stats("onnx_add")

    async def one(client, a, b):
        ins = [aiogrpc.InferInput("INPUT0", list(a.shape), "FP32"), aiogrpc.InferInput("INPUT1", list(b.shape), "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        r = await client.infer("onnx_add", ins)
        return r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")

    async def go(client):
        return await asyncio.gather(*(one(client, a, b) for a, b in pairs))
    results = run(go, server)
    for (a, b), (add, sub) in zip(pairs, results):
        np.testing.assert_allclose(add, a + b, rtol=1e-6)
        np.testing.assert_allclose(sub, a - b, rtol=1e-6)
    after = server.stats("onnx_add")
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert after["execution_count"] - before["execution_count"] < len(sizes)
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


def _bytes_array(rows: list[list[bytes]]) -> np.ndarray:
    arr = np.empty((len(rows), len(rows[0])), dtype=np.object_)
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            arr[i, j] = v
    return arr


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_onnx_concatenation_bytes(server, kind):
    """Same width: one concatenated execution; strings incl. empty and non-ASCII."""
    datas = [
        _bytes_array([[b"", "h\u00e9llo \u2713".encode()]]),
        _bytes_array([[b"a", b""], ["\u65e5\u672c".encode(), b"zz" * 40]]),
        _bytes_array([[b"", b""], [b"x", b"y"], ["\U0001f600".encode(), b"end"]]),
    ]
    before = server.stats("onnx_bytes")
    mod = aiogrpc if kind == "grpc" else aiohttp_client

    async def one(client, data):
        inp = mod.InferInput("INPUT0", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data) if kind == "grpc" else inp.set_data_from_numpy(data, binary_data=True)
        return (await client.infer("onnx_bytes", [inp])).as_numpy("OUTPUT0")

    async def go(client):
        return await asyncio.gather(*(one(client, d) for d in datas))
    results = run(go, server, kind)
    for data, out in zip(datas, results):
        assert out.shape == data.shape
        assert out.tolist() == data.tolist()
    after = server.stats("onnx_bytes")
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] < 3


@pytest.mark.parametrize("model,dtype", [("onnx_fp32", "FP32"), ("onnx_bytes", "BYTES")])
def test_onnx_variable_dims_in_one_window(server, model, dtype):
    """Requests whose non-batch dims differ share a window and still get their rows."""
    widths = [1, 3, 2, 3, 5]
    if dtype == "FP32":
        datas = [np.arange(i * 100, i * 100 + 2 * w, dtype=np.float32).reshape(2, w) for i, w in enumerate(widths)]
    else:
        datas = [_bytes_array([[f"r{i}c{j}\u00fc".encode() for j in range(w)]]) for i, w in enumerate(widths)]

    async def one(client, data):
        inp = aiogrpc.InferInput("INPUT0", list(data.shape), dtype)
        inp.set_data_from_numpy(data)
        return (await client.infer(model, [inp])).as_numpy("OUTPUT0")

    async def go(client):
        return await asyncio.gather(*(one(client, d) for d in datas))
    for data, out in zip(datas, run(go, server)):
        assert out.shape == data.shape
        assert out.tolist() == data.tolist()


# -- ordering, instances, priorities --------------------------------------------------------

def test_preserve_ordering_with_two_instances(server):
    """Request 0 sleeps long on one instance while 1..3 finish quickly on the other;
    responses still complete in arrival order."""
    sleeps = [400, 0, 150, 0]

    async def go(client):
        tasks = []
        for i, ms in enumerate(sleeps):
            tasks.append(asyncio.ensure_future(
                ginfer(client, "ordered", rows_of(i, 1), parameters={"sleep_ms": ms})))
            await asyncio.sleep(0.03)  # a defined arrival order
        return await asyncio.gather(*tasks)
    results = run(go, server)
    check_own_rows(results, [rows_of(i, 1) for i in range(len(sleeps))])
    done = [r["done"] for r in results]
    ends = [float(r["END"][0, 0]) for r in results]
    assert ends[1] < ends[0], "the test did not make a later request finish first in the model"
    # every later response was held until request 0 was answered ...
    assert all(d >= ends[0] for d in done[1:]), (ends, done)
    # ... and they complete in arrival order (responses released in one go travel on separate
    # streams, so allow a few ms of client-side jitter between them)
    assert all(done[j] >= done[i] - 0.01 for i in range(len(done)) for j in range(i + 1, len(done))), done
    assert len({int(r["INSTANCE"][0, 0]) for r in results}) == 2


def test_instance_group_count_runs_in_parallel(server):
    async def four(client, model):
        return await asyncio.gather(*(ginfer(client, model, rows_of(i, 1)) for i in range(4)))

    async def go(client):
        return await four(client, "par1"), await four(client, "par2")
    r1, r2 = run(go, server)
    spans = sorted((float(r["START"][0, 0]), float(r["END"][0, 0])) for r in r2)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), f"no overlap: {spans}"
    assert len({int(r["INSTANCE"][0, 0]) for r in r2}) == 2
    # one instance runs one batch at a time (on its thread or the worker's control thread)
    spans1 = sorted((float(r["START"][0, 0]), float(r["END"][0, 0])) for r in r1)
    assert all(b[0] >= a[1] for a, b in zip(spans1, spans1[1:])), f"overlap: {spans1}"


def test_priority_level_one_served_first(server):
    """The wiring end to end (tests/test_scheduler.py decides priorities in every detail)."""
    infer, kind = ginfer, "grpc"

    async def go(client):
        busy = asyncio.ensure_future(infer(client, "prio", rows_of(0, 1)))
        await asyncio.sleep(0.05)
        low = []
        for i in (1, 2):
            low.append(asyncio.ensure_future(infer(client, "prio", rows_of(i, 1), priority=2)))
            await asyncio.sleep(0.02)
        high = asyncio.ensure_future(infer(client, "prio", rows_of(3, 1), priority=1))
        return await busy, *await asyncio.gather(*low), await high
    busy, low1, low2, high = run(go, server, kind)
    start = lambda r: float(r["START"][0, 0])  # noqa: E731
    assert start(busy) < start(high) < start(low1) < start(low2)


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_priority_out_of_range_is_invalid(server, kind):
    infer = ginfer if kind == "grpc" else hinfer

    async def go(client):
        with pytest.raises(InferenceServerException) as e:
            await infer(client, "prio", rows_of(0, 1), priority=3)
        return e.value
    err = run(go, server, kind)
    assert "priority" in str(err.message())
    assert ("INVALID_ARGUMENT" in str(err.status())) if kind == "grpc" else (str(err.status()) == "400")


# -- queue policies -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_full_queue_rejects_at_once(server, kind):
    infer = ginfer if kind == "grpc" else hinfer

    async def rejected(client, i):
        try:
            await infer(client, "qfull", rows_of(i, 1))
        except InferenceServerException as e:
            return e
        return None

    async def go(client):
        busy = asyncio.ensure_future(infer(client, "qfull", rows_of(0, 1)))
        await asyncio.sleep(0.15)  # executing: the queue is empty
        queued = asyncio.ensure_future(infer(client, "qfull", rows_of(1, 1)))
        await asyncio.sleep(0.05)  # the queue holds 1 = max_queue_size
        extra = await asyncio.gather(*(rejected(client, i) for i in range(2, 5)))
        return await busy, await queued, extra
    busy, queued, extra = run(go, server, kind)
    check_own_rows([busy, queued], [rows_of(0, 1), rows_of(1, 1)])
    for err in extra:
        assert isinstance(err, InferenceServerException), "a request beyond max_queue_size was accepted"
        assert err.message() == "Exceeds maximum queue size for model 'qfull'"
        assert str(err.status()) == ("StatusCode.UNAVAILABLE" if kind == "grpc" else "503")


def test_queue_timeout_reject(server):
    async def go(client):
        busy = asyncio.ensure_future(ginfer(client, "qtimeout", rows_of(0, 1)))
        await asyncio.sleep(0.1)
        with pytest.raises(InferenceServerException) as e:
            await ginfer(client, "qtimeout", rows_of(1, 1))
        await busy
        return e.value
    err = run(go, server)
    assert err.message() == "Request timeout expired"
    assert str(err.status()) == "StatusCode.UNAVAILABLE"


def test_queue_timeout_override(server):
    async def go(client):
        busy = asyncio.ensure_future(ginfer(client, "qtimeout", rows_of(0, 1)))
        await asyncio.sleep(0.1)
        ok = await ginfer(client, "qtimeout", rows_of(1, 1), timeout=3_000_000)  # 3 s, allowed
        await busy
        return ok
    ok = run(go, server)
    np.testing.assert_array_equal(ok["OUTPUT0"], rows_of(1, 1))


def test_queue_timeout_override_over_http(server):
    async def go(client):
        busy = asyncio.ensure_future(hinfer(client, "qtimeout", rows_of(0, 1)))
        await asyncio.sleep(0.1)
        ok = asyncio.ensure_future(hinfer(client, "qtimeout", rows_of(1, 1), timeout=3_000_000))
        await asyncio.sleep(0.02)
        with pytest.raises(InferenceServerException) as e:  # queued behind both: 50 ms expire
            await hinfer(client, "qtimeout", rows_of(2, 1), timeout=50_000)
        await busy
        return await ok, e.value
    ok, err = run(go, server, "http")
    np.testing.assert_array_equal(ok["OUTPUT0"], rows_of(1, 1))
    assert err.message() == "Request timeout expired" and str(err.status()) == "503"


def test_queue_timeout_delay_runs_an_expired_request_after_the_others(server):
    """DELAY: a request whose 50 ms expire in the queue is not failed but goes behind one
    that arrived after it without a deadline (timeout 0). Were the timeout ignored, it would
    run first; were it REJECT, it would fail."""
    async def go(client):
        busy = asyncio.ensure_future(ginfer(client, "qdelay", rows_of(0, 1)))
        await asyncio.sleep(0.05)
        expires = asyncio.ensure_future(ginfer(client, "qdelay", rows_of(1, 1)))
        await asyncio.sleep(0.02)
        patient = asyncio.ensure_future(ginfer(client, "qdelay", rows_of(2, 1), timeout=0))
        return await busy, await expires, await patient
    busy, expires, patient = run(go, server)
    check_own_rows([busy, expires, patient], [rows_of(0, 1), rows_of(1, 1), rows_of(2, 1)])
    start = lambda r: float(r["START"][0, 0])  # noqa: E731
    assert start(busy) < start(patient) < start(expires)


# -- statistics ---------------------------------------------------------------------------

def _ints(d):
    """gRPC JSON renders 64-bit integers as strings; make both sides alike."""
    if isinstance(d, dict):
        return {k: _ints(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_ints(v) for v in d]
    if isinstance(d, str) and d.isdigit():
        return int(d)
    return d


def test_statistics_exact_counts(server):
    st = server.stats("stats")
    assert st["inference_count"] == 0 and st["execution_count"] == 0 and st["batch_stats"] == []
    assert set(st["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                          "compute_output", "cache_hit", "cache_miss"}

    async def go(client):
        for i, n in enumerate((1, 2, 3)):  # one at a time: three executions of 1, 2, 3 rows
            await ginfer(client, "stats", rows_of(i, n))
        return await asyncio.gather(*(ginfer(client, "stats", rows_of(10 + i, 1)) for i in range(4)))
    t0 = int(time.time() * 1000)
    together = run(go, server)
    assert {int(r["NREQ"][0, 0]) for r in together} == {4}

    st = server.stats("stats")
    assert st["name"] == "stats" and st["version"] == "1"
    assert st["inference_count"] == 1 + 2 + 3 + 4
    assert st["execution_count"] == 4
    sizes = {b["batch_size"]: b for b in st["batch_stats"]}
    assert set(sizes) == {1, 2, 3, 4}, sizes
    for size in (1, 2, 3, 4):
        for phase in ("compute_input", "compute_infer", "compute_output"):
            assert sizes[size][phase]["count"] == 1, (size, phase, sizes[size])
            assert sizes[size][phase]["ns"] > 0, (size, phase, sizes[size])
    inf = st["inference_stats"]
    assert inf["success"]["count"] == 3 + 4
    assert inf["fail"] == {"count": 0, "ns": 0}
    for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[phase]["ns"] > 0, phase
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[phase]["count"] == inf["success"]["count"], phase
    assert inf["cache_hit"] == {"count": 0, "ns": 0} and inf["cache_miss"] == {"count": 0, "ns": 0}
    assert t0 - 1000 <= st["last_inference"] <= int(time.time() * 1000) + 1000
    # the queue time of the lone requests includes most of the 150 ms delay
    assert inf["queue"]["ns"] >= 3 * 100_000_000


def _fail_once(server: Server, model: str, param: str) -> tuple[dict, dict, InferenceServerException]:
    before = server.stats(model)

    async def go(client):
        with pytest.raises(InferenceServerException) as e:
            await ginfer(client, model, rows_of(0, 2), parameters={param: 1})
        return e.value
    err = run(go, server)
    return before, server.stats(model), err


def test_statistics_model_exception_is_a_failure(server):
    """A model that raises fails the request: inference_stats.fail counts it; it adds
    nothing to inference_count or success (as Triton 2.51 does)."""
    before, after, err = _fail_once(server, "batch", "raise")
    assert "raising as asked" in err.message() and "INTERNAL" in str(err.status())
    assert after["inference_count"] == before["inference_count"]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["inference_stats"]["fail"]["ns"] > before["inference_stats"]["fail"]["ns"]


def test_statistics_failed_execution_counts_as_execution(server):
    """A batch the model ran and failed is an execution (execution_count, batch_stats), as
    Triton 2.51 counts it."""
    before, after, _ = _fail_once(server, "batch_http", "raise")
    assert after["execution_count"] == before["execution_count"] + 1
    count = lambda st: sum(b["compute_infer"]["count"] for b in st["batch_stats"] if b["batch_size"] == 2)  # noqa: E731
    assert count(after) == count(before) + 1


def _same_stats(g: dict, h: dict) -> None:
    """One model's gRPC statistics (JSON, zero fields omitted) equal its HTTP ones."""
    assert (g["name"], str(g["version"])) == (h["name"], h["version"])
    for key in ("last_inference", "inference_count", "execution_count"):
        assert g.get(key, 0) == h[key], key
    for phase, d in h["inference_stats"].items():
        assert {"count": 0, "ns": 0, **g.get("inference_stats", {}).get(phase, {})} == d, phase
    gb = g.get("batch_stats", [])
    assert [b["batch_size"] for b in gb] == [b["batch_size"] for b in h["batch_stats"]]
    for x, y in zip(gb, h["batch_stats"]):
        for phase in ("compute_input", "compute_infer", "compute_output"):
            assert {"count": 0, "ns": 0, **x.get(phase, {})} == y[phase], phase


def test_statistics_endpoints(server):
    status, body = server.get("/v2/models/stats")
    assert status == 200
    names = {(m["name"], m["version"]) for m in body["model_stats"]}
    assert {("batch", "1"), ("stats", "1"), ("onnx_add", "1"), ("prio", "1")} <= names
    assert not any(n.startswith("bad_") for n, _ in names)
    status, body = server.get("/v2/models/nobatch/versions/1/stats")
    assert status == 200 and [(m["name"], m["version"]) for m in body["model_stats"]] == [("nobatch", "1")]
    for path in ("/v2/models/no_such_model/stats", "/v2/models/nobatch/versions/7/stats"):
        status, body = server.get(path)
        assert status == 404 and "error" in body, (path, status, body)

    grpc = grpcclient.InferenceServerClient(server.proc.grpc_url)
    try:
        for model in ("stats", "nobatch"):
            (g,) = _ints(grpc.get_inference_statistics(model, as_json=True))["model_stats"]
            _same_stats(g, server.stats(model))
        (g,) = _ints(grpc.get_inference_statistics("nobatch", "1", as_json=True))["model_stats"]
        assert g["version"] == 1  # "1" on the wire, made an int by _ints
        every = _ints(grpc.get_inference_statistics("", as_json=True))["model_stats"]
        assert len(every) == len(server.get("/v2/models/stats")[1]["model_stats"])
        for model, version in (("no_such_model", ""), ("nobatch", "7")):
            with pytest.raises(InferenceServerException) as e:
                grpc.get_inference_statistics(model, version)
            assert "NOT_FOUND" in str(e.value.status())
    finally:
        grpc.close()
    http = httpclient.InferenceServerClient(server.proc.http_url)
    try:
        got = http.get_inference_statistics("nobatch", "1")
        assert got["model_stats"][0]["name"] == "nobatch"
    finally:
        http.close()


# -- invalid configs ----------------------------------------------------------------------

def test_invalid_batching_configs_fail_to_load(server):
    index = server.index()
    log = server.proc.log()
    for name, (_, _, words) in INVALID.items():
        row = index[name]
        assert row["state"] == "UNAVAILABLE", row
        assert row.get("reason"), row
        if words:
            assert words in row["reason"], row
            assert words in log
        assert name in log
        status, _ = server.get(f"/v2/models/{name}/ready")
        assert status != 200
    for name in UNPARSABLE:
        assert index[name] == {"name": name}, index[name]
        assert name in log
        status, _ = server.get(f"/v2/models/{name}/ready")
        assert status != 200
    assert index["batch"]["state"] == "READY"
    status, _ = server.get("/v2/models/batch/ready")
    assert status == 200
    status, _ = server.get("/v2/health/ready")
    assert status != 200  # strict readiness: some models are not ready

    async def go(client):
        return await ginfer(client, "nobatch", rows_of(1, 1))
    np.testing.assert_array_equal(run(go, server)["OUTPUT0"], rows_of(1, 1))


# -- perf_analyzer ------------------------------------------------------------------------

def test_perf_analyzer_concurrency_batches(server, perf_analyzer):
    before = server.stats("pa_batch")
    proc = perf_analyzer.run("-m", "pa_batch", "-u", server.proc.grpc_url, "-i", "grpc", "--concurrency-range", "8",
                             "--measurement-interval", "800", "--max-trials", "4", "--stability-percentage", "1000",
                             timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = server.stats("pa_batch")
    assert after["inference_count"] > before["inference_count"]
    assert after["execution_count"] < after["inference_count"]
    assert any(b["batch_size"] > 1 for b in after["batch_stats"]), after["batch_stats"]


# -- batch assembler ----------------------------------------------------------------------

def _implementations():
    from triton_shm.worker import assembler_py
    impls = [pytest.param(assembler_py, id="py")]
    try:
        from triton_shm.worker import _assembler
        impls.append(pytest.param(_assembler, id="c"))
    except ImportError:
        impls.append(pytest.param(None, id="c", marks=pytest.mark.skip(reason="C assembler not built")))
    return impls


@pytest.fixture(params=_implementations())
def asm(request):
    return request.param


def test_assembler_gather_scatter_roundtrip(asm):
    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (5, 0, 17, 1, 64)]
    dst = np.full(sum(p.nbytes for p in parts) + 3, 0xAA, dtype=np.uint8)  # room to spare
    assert asm.gather(dst, [p.tobytes() for p in parts[:2]] + parts[2:]) == sum(p.nbytes for p in parts)
    np.testing.assert_array_equal(dst[:-3], np.concatenate(parts))
    assert (dst[-3:] == 0xAA).all()
    outs = [np.zeros(p.nbytes, dtype=np.uint8) for p in parts]
    assert asm.scatter(dst, outs) == dst.nbytes - 3
    for p, o in zip(parts, outs):
        np.testing.assert_array_equal(p, o)


def test_assembler_multibyte_and_multidim_views(asm):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(8, dtype=np.float64).reshape(2, 2, 2)
    dst = bytearray(a.nbytes + b.nbytes)
    asm.gather(dst, [a, memoryview(b)])
    assert bytes(dst) == a.tobytes() + b.tobytes()
    a2, b2 = np.zeros_like(a), np.zeros_like(b)
    asm.scatter(memoryview(bytes(dst)), [a2, b2])  # read-only source is fine
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)


def test_assembler_size_errors(asm):
    from triton_shm.errors import Internal
    with pytest.raises(Internal, match="do not fit"):
        asm.gather(bytearray(3), [b"ab", b"cd"])
    with pytest.raises(Internal, match="need 5 bytes"):
        asm.scatter(b"abcd", [bytearray(2), bytearray(3)])
    with pytest.raises(Internal):
        asm.gather(bytearray(0), [b"x"])


def test_assembler_empty_buffers(asm):
    assert asm.gather(bytearray(0), []) == 0
    assert asm.gather(bytearray(0), [b"", b""]) == 0
    assert asm.gather(bytearray(4), []) == 0
    assert asm.scatter(b"", []) == 0
    assert asm.scatter(b"", [bytearray(0), bytearray(0)]) == 0
    assert asm.scatter(b"abc", []) == 0
    out = bytearray(0)
    assert asm.scatter(b"abc", [out]) == 0 and out == b""


def test_assembler_twins_agree():
    from triton_shm.worker import assembler_py
    try:
        from triton_shm.worker import _assembler
    except ImportError:
        pytest.skip("C assembler not built")
    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes = rng.integers(0, 300, rng.integers(0, 8))
        parts = [rng.integers(0, 256, int(n), dtype=np.uint8) for n in sizes]
        spare = int(rng.integers(0, 5))
        d_py, d_c = bytearray(int(sizes.sum()) + spare), bytearray(int(sizes.sum()) + spare)
        assert assembler_py.gather(d_py, parts) == _assembler.gather(d_c, parts)
        assert d_py == d_c
        o_py = [bytearray(int(n)) for n in sizes]
        o_c = [bytearray(int(n)) for n in sizes]
        assert assembler_py.scatter(d_py, o_py) == _assembler.scatter(d_c, o_c)
        assert o_py == o_c == [bytearray(p.tobytes()) for p in parts]


def test_assembler_twin_reads_and_writes_client_regions_through_the_file(tmp_path):
    """What the C guard does for a client region truncated under a copy, the twin does by
    never mapping it: preadv reads short, pwrite is refused after a size check. A 400 for the
    request, never a SIGBUS for the worker."""
    from triton_shm.errors import InvalidArgument
    from triton_shm.worker.assembler_py import RegionSpan, copy, gather, scatter
    path = tmp_path / "region"
    path.write_bytes(bytes(range(64)))
    fd = os.open(path, os.O_RDWR)
    try:
        span = RegionSpan(fd, 16, 8, 64)
        out = bytearray(8)
        assert copy(out, span) == 8 and out == bytes(range(16, 24))
        assert copy(span, b"ABCDEFGH") == 8 and path.read_bytes()[16:24] == b"ABCDEFGH"
        gathered = bytearray(12)
        assert gather(gathered, [b"xyzw", span]) == 12 and gathered == b"xyzwABCDEFGH"
        assert scatter(b"12345678", [span]) == 8 and path.read_bytes()[16:24] == b"12345678"
        os.ftruncate(fd, 20)  # the client shrinks its region after the worker checked its size
        for call in (lambda: copy(bytearray(8), span), lambda: gather(bytearray(8), [span]),
                     lambda: copy(span, b"ABCDEFGH"), lambda: scatter(b"12345678", [span])):
            with pytest.raises(InvalidArgument, match="^a client's shared-memory region shrank while it was "
                                                      "being read or written$"):
                call()
        assert os.fstat(fd).st_size == 20  # a refused write does not grow it back
    finally:
        os.close(fd)
