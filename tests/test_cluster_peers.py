"""The links between front-end processes (triton_shm/cluster): frames, control calls and
forwarded inference over real Unix sockets, two or three ``Peers`` in one event loop. The
owner's service is a small echo service (a stand-in for InferenceService.infer_stream);
the servers' end-to-end behaviour is tested with real server processes elsewhere."""
from __future__ import annotations

import asyncio
import math
import socket
import struct
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np
import orjson
import pytest
import uvloop

from triton_shm.cluster.forwarding import ForwardingScheduler
from triton_shm.cluster.peers import Peers
from triton_shm.cluster.wire import (MAX_FRAME, MAX_HEADER, FrameDecoder, FrameError, encode_frame, handover_from_wire,
                                     handover_to_wire, request_from_wire, request_to_wire, response_from_wire,
                                     response_to_wire)
from triton_shm.core.observability.tracing import Handover
from triton_shm.core.data.types import (InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput,
                                        ResponseStream)
from triton_shm.errors import (AlreadyExists, Internal, InvalidArgument, NotFound, TritonShmError, Unavailable,
                               Unsupported)

FP32 = np.arange(6, dtype=np.float32).tobytes()
BYTES = b"".join(struct.pack("<I", len(s)) + s for s in (b"abc", b"", b"\xff\x00"))
PARAMETERS = {"flag": True, "off": False, "count": 3, "ratio": 1.0, "neg": -7, "big": 2**64 - 1, "text": "1",
              "inf": float("inf"), "ninf": float("-inf")}


def scenario(fn):
    """Run an async test body in a fresh event loop, asyncio's and uvloop's (the server's),
    with a short socket directory (a Unix socket's path is at most 107 bytes)."""
    @pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
    def run(runner):
        with tempfile.TemporaryDirectory(prefix="peers-") as directory:
            runner(asyncio.wait_for(fn(Path(directory)), 30))
    run.__name__ = fn.__name__
    return run


def roundtrip(header: dict[str, Any], buffers: list, chunk: int | None = None) -> list[tuple[dict, list]]:
    data = b"".join(bytes(piece) for piece in encode_frame(header, buffers))
    decoder = FrameDecoder()
    step = chunk or len(data)
    return [frame for at in range(0, len(data), step) for frame in decoder.feed(data[at:at + step])]


# -- wire ---------------------------------------------------------------------------------

def a_request() -> InferRequest:
    return InferRequest("echo", "2", "req-1", dict(PARAMETERS),
                        [InputTensor("F", "FP32", [2, 3], memoryview(FP32), {"shared_memory_offset": 0,
                                                                             "nan": float("nan")}),
                         InputTensor("S", "BYTES", [3], BYTES),
                         InputTensor("UNSET", "INT8", [0]),
                         InputTensor("EMPTY", "INT8", [0], b"")],
                        [RequestedOutput("OUT", {"binary_data": True, "classification": 2})])


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_request_round_trip_keeps_types_and_bytes(chunk):
    request = a_request()
    [(header, buffers)] = roundtrip(*request_to_wire(request), chunk=chunk)
    back = request_from_wire(header, buffers)
    assert (back.model_name, back.model_version, back.id) == ("echo", "2", "req-1")
    assert back.parameters == PARAMETERS
    assert {k: type(v) for k, v in back.parameters.items()} == {k: type(v) for k, v in PARAMETERS.items()}
    assert math.isnan(back.inputs[0].parameters.pop("nan"))  # JSON has no NaN: carried all the same
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in back.inputs] == [
        ("F", "FP32", [2, 3], {"shared_memory_offset": 0}), ("S", "BYTES", [3], {}), ("UNSET", "INT8", [0], {}),
        ("EMPTY", "INT8", [0], {})]
    f, s, unset, empty = (t.data for t in back.inputs)
    assert bytes(f) == FP32 and bytes(s) == BYTES and unset is None and bytes(empty) == b""  # type: ignore[arg-type]
    assert [(o.name, o.parameters) for o in back.outputs] == [("OUT", {"binary_data": True, "classification": 2})]
    assert type(back.outputs[0].parameters["binary_data"]) is bool


def test_response_round_trip_copies_views_and_keeps_shm_flags():
    arena = bytearray(FP32)
    response = InferResponse("echo", "1", "r", {"sequence_end": True, "score": 0.5},
                             [OutputTensor("F", "FP32", [6], memoryview(arena), {"p": 1}),
                              OutputTensor("SHM", "FP32", [16], b"", {}, True, 64),
                              OutputTensor("S", "BYTES", [3], BYTES)])
    header, buffers = response_to_wire(response)
    arena[:] = bytes(len(arena))  # what release() may do to a worker's arena: the frame copied it first
    [(header, buffers)] = roundtrip(header, buffers)
    back = response_from_wire(header, buffers)
    assert (back.model_name, back.model_version, back.id, back.parameters) == (
        "echo", "1", "r", {"sequence_end": True, "score": 0.5})
    assert [(t.name, t.datatype, t.shape, bytes(t.data), t.parameters, t.in_shared_memory, t.shm_byte_size)
            for t in back.outputs] == [("F", "FP32", [6], FP32, {"p": 1}, False, 0),
                                       ("SHM", "FP32", [16], b"", {}, True, 64),
                                       ("S", "BYTES", [3], BYTES, {}, False, 0)]
    back.release()  # nothing to free: the bytes are the frame's


def test_decoder_frames_back_to_back_split_and_big():
    big = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8).tobytes()
    stream = b"".join(bytes(p) for frame in ([{"n": 1}, []], [{"n": 2}, [b"ab", b""]], [{"n": 3}, [big, b"z"]],
                                             [{"n": 4}, [b"tail"]])
                      for p in encode_frame(*frame))
    for chunk in (len(stream), 65536, 100_003):
        decoder = FrameDecoder()
        frames = [f for at in range(0, len(stream), chunk) for f in decoder.feed(stream[at:at + chunk])]
        assert [h["n"] for h, _ in frames] == [1, 2, 3, 4]
        assert [[bytes(b) for b in bufs] for _, bufs in frames] == [[], [b"ab", b""], [big, b"z"], [b"tail"]]


def test_encode_frame_keeps_big_buffers_uncopied():
    big = memoryview(bytearray(1 << 20))
    pieces = encode_frame({"k": 1}, [b"x", big])
    assert pieces[-1] is big and len(pieces) == 3
    assert len(encode_frame({"k": 1}, [b"x", b"y"])) == 1  # small: one piece, one write


@pytest.mark.parametrize("garbage, fragment", [
    (struct.pack("<II", MAX_HEADER + 1, 0), "header of"),
    (struct.pack("<II", 4, 1 << 20), "buffers exceeds"),
    (struct.pack("<IIQ", 2, 1, MAX_FRAME), "exceeds the limit"),
    (struct.pack("<IIQ", 2, 1, 2**64 - 1), "exceeds the limit"),
    (struct.pack("<II", 3, 0) + b"{x}", "not JSON"),
    (struct.pack("<II", 2, 0) + b"[]", "not an object"),
])
def test_decoder_rejects_garbage_clearly(garbage, fragment):
    with pytest.raises(FrameError, match=fragment):
        list(FrameDecoder().feed(garbage))


def test_a_size_declared_and_not_sent_costs_nothing():
    decoder = FrameDecoder()  # 60 GiB announced: memory is taken as bytes arrive, not as declared
    assert list(decoder.feed(struct.pack("<IIQ", 2, 1, MAX_FRAME - 2**32) + b"{}" + b"x" * 1000)) == []


def test_trace_handover_round_trip():
    for handover in (Handover(123, 3, 7), Handover(5, 0, 0, ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"))):
        assert handover_from_wire(orjson.loads(orjson.dumps(handover_to_wire(handover)))) == handover


@pytest.mark.parametrize("wire", [None, [], {}, {"s": 1, "lf": 0}, {"s": "x", "lf": 0, "p": 0},
                                  {"s": 1, "lf": 0, "p": 0, "o": ["only one"]}, {"s": 1, "lf": 0, "p": 0, "o": [1, 2]}])
def test_a_bad_trace_handover_is_a_frame_error(wire):
    with pytest.raises(FrameError, match="trace handover"):
        handover_from_wire(wire)


@pytest.mark.parametrize("header", [{}, {"m": "x", "v": "", "id": "", "p": {}, "in": [["a", "FP32", [1], {}, 5]],
                                         "out": []},
                                    {"m": "x", "v": "", "id": "", "p": {"a": [1]}, "in": [], "out": []},
                                    {"m": "x", "v": "", "id": "", "p": {}, "in": [["a"]], "out": []}])
def test_request_from_wire_rejects_a_bad_header(header):
    with pytest.raises(FrameError, match="inference request"):
        request_from_wire(header, [])


# -- the owner's service: echoes -----------------------------------------------------------

class EchoService:
    """What ``Peers`` needs of an InferenceService: ``infer_stream``. The model name says
    what to do; every served request is recorded, and a cancelled one too."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []
        self.released: list[str] = []

    def respond(self, request: InferRequest, tag: str = "") -> InferResponse:
        outputs = [OutputTensor(f"OUT_{t.name}", t.datatype, t.shape, memoryview(bytearray(t.data or b"")))
                   for t in request.inputs]

        def release() -> None:  # the arena's block is reused: the bytes sent must be a copy
            for out in outputs:
                out.data[:] = bytes(len(out.data))  # type: ignore[index]
            self.released.append(request.id + tag)
        return InferResponse(request.model_name, "1", request.id + tag, {"echoed": True}, outputs, release)

    async def infer_stream(self, request: InferRequest, sample: bool = True, parent: object = None
                           ) -> AsyncIterator[tuple[InferResponse | TritonShmError | None, bool]]:
        assert sample is False  # a forwarded request was sampled by the process it reached
        self.running[request.id] = event = asyncio.Event()
        event.set()
        try:
            model = request.model_name
            if model == "refuse":
                raise InvalidArgument("inference request for unknown input 'X'")
            if model == "crash":
                raise RuntimeError("the service broke")
            if model == "hang":
                await asyncio.Future()
            if model == "echo":
                yield self.respond(request), True
                return
            yield self.respond(request, "-0"), False  # decoupled
            if model == "hang_stream":
                await asyncio.Future()
            yield InvalidArgument("a bad one in the middle"), False
            yield self.respond(request, "-2"), False
            yield None, True
        except asyncio.CancelledError:
            self.cancelled.append(request.id)
            raise

    async def started(self, rid: str) -> None:
        while rid not in self.running:
            await asyncio.sleep(0.005)

    async def sees_cancel(self, rid: str) -> None:
        while rid not in self.cancelled:
            await asyncio.sleep(0.005)


def echo_handler(index: int):
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return {"from": index, **body}
    return echo


def raising(error: Exception):
    async def handler(body: dict[str, Any]) -> dict[str, Any]:
        raise error
    return handler


async def start_peers(directory: Path, count: int, handlers: dict[int, dict] | None = None,
                      **kwargs: Any) -> tuple[list[Peers], list[EchoService]]:
    peers = [Peers(i, count, directory, **kwargs) for i in range(count)]
    services = [EchoService() for _ in range(count)]
    for i, p in enumerate(peers):
        await p.start({"echo": echo_handler(i), **(handlers or {}).get(i, {})}, services[i])  # type: ignore[arg-type]
    return peers, services


async def close_all(peers: list[Peers]) -> None:
    for p in peers:
        await p.close()


def infer_request(model: str, rid: str) -> InferRequest:
    return InferRequest(model, "", rid, {"n": 1}, [InputTensor("IN", "FP32", [6], FP32),
                                                   InputTensor("S", "BYTES", [3], BYTES)])


async def drain_stream(stream: ResponseStream) -> list[tuple[Any, bool]]:
    items = []
    while True:
        item, final = await stream.queue.get()
        items.append((item, final))
        if final:
            return items


# -- control calls ---------------------------------------------------------------------------

@scenario
async def test_call_and_broadcast(directory: Path):
    peers, _ = await start_peers(directory, 3)
    try:
        assert await peers[0].call(2, "echo", {"x": [1, "a"]}) == {"from": 2, "x": [1, "a"]}
        assert await peers[2].call(0, "echo", {}) == {"from": 0}
        assert await peers[1].broadcast("echo", {"y": 1}) == [{"from": 0, "y": 1}, {"from": 2, "y": 1}]
        calls = await asyncio.gather(*(peers[0].call(1, "echo", {"n": n}) for n in range(50)))
        assert [c["n"] for c in calls] == list(range(50))  # one connection, answers matched by id
    finally:
        await close_all(peers)


@scenario
async def test_handler_errors_keep_their_class(directory: Path):
    finished = []

    async def slow_fail(body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        finished.append(2)
        raise AlreadyExists("later, and second in process order")

    async def not_a_dict(body: dict[str, Any]) -> dict[str, Any]:
        return [1]  # type: ignore[return-value]

    handlers = {1: {"fail": raising(NotFound("model 'm' is not found")), "crash": raising(KeyError("boom")),
                    "surrogate": raising(InvalidArgument("bad \udc80 text")), "list": not_a_dict},
                2: {"fail": slow_fail}}
    peers, _ = await start_peers(directory, 3, handlers)
    try:
        with pytest.raises(NotFound, match="model 'm' is not found"):
            await peers[0].call(1, "fail", {})
        with pytest.raises(Internal, match="boom"):
            await peers[0].call(1, "crash", {})
        with pytest.raises(Unsupported, match="unknown peer operation 'nope'"):
            await peers[0].call(1, "nope", {})
        with pytest.raises(InvalidArgument, match=r"bad \? text"):  # JSON can not carry a lone surrogate
            await peers[0].call(1, "surrogate", {})
        with pytest.raises(Internal, match="not a dict"):
            await peers[0].call(1, "list", {})
        with pytest.raises(Internal, match="can not be encoded"):
            await peers[0].call(1, "echo", {"x": object()})
        with pytest.raises(Internal, match="exceeds the peer limits"):
            await peers[0].call(1, "echo", {"x": "y" * MAX_HEADER})
        with pytest.raises(NotFound):  # the first error in process order, once all have answered
            await peers[0].broadcast("fail", {})
        assert finished == [2]
        assert await peers[0].call(1, "echo", {}) == {"from": 1}  # the link goes on
    finally:
        await close_all(peers)


@scenario
async def test_garbage_is_refused_without_harm_to_the_listener(directory: Path):
    peers, _ = await start_peers(directory, 2)
    try:
        for garbage in (b"\xff" * 64, struct.pack("<II", 2, 0) + b"[]",
                        struct.pack("<II", 2, 0) + b"{}",  # no kind, no id
                        b"".join(encode_frame({"k": "infer", "i": 1, "m": 5}))):
            reader, writer = await asyncio.open_unix_connection(str(peers[1].path_of(1)))
            writer.write(garbage)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed on us
            writer.close()
        assert await peers[0].call(1, "echo", {"still": True}) == {"from": 1, "still": True}
    finally:
        await close_all(peers)


@scenario
async def test_an_owner_that_answers_garbage_fails_what_is_pending(directory: Path):
    async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for header, _ in decoder.feed(data):
                answer = {"k": "reply", "i": header["i"], "b": [1]} if header["op"] == "list" else {"k": 7}
                writer.write(b"".join(encode_frame(answer)))

    caller = Peers(0, 2, directory)
    server = await asyncio.start_unix_server(owner, str(caller.path_of(1)))
    try:
        for op in ("list", "kind"):
            with pytest.raises(Unavailable, match="front-end process 1 broke the peer protocol"):
                await caller.call(1, op, {})
    finally:
        server.close()
        await caller.close()


# -- forwarded inference -----------------------------------------------------------------------

@scenario
async def test_forward_returns_the_owners_response(directory: Path):
    peers, services = await start_peers(directory, 2)
    try:
        response = await peers[0].forward(1, infer_request("echo", "a"))
        assert isinstance(response, InferResponse)
        assert (response.id, response.parameters) == ("a", {"echoed": True})
        assert [(t.name, bytes(t.data)) for t in response.outputs] == [("OUT_IN", FP32), ("OUT_S", BYTES)]
        response.release()
        assert services[1].released == ["a"]  # the owner released its response once sent
        big = np.random.default_rng(1).random(600_000, dtype=np.float32)  # 2.4 MB each way, a typed view
        request = InferRequest("echo", "", "big", {}, [InputTensor("IN", "FP32", [600_000], memoryview(big))])
        response = await peers[0].forward(1, request)
        assert response is not None and bytes(response.outputs[0].data) == big.tobytes()
        many = await asyncio.gather(*(peers[0].forward(1, infer_request("echo", str(n))) for n in range(30)))
        assert [r.id for r in many if r is not None] == [str(n) for n in range(30)]
        huge = InferRequest("echo", "", "huge", {"note": "y" * MAX_HEADER}, [])  # a client's fault: 400
        with pytest.raises(InvalidArgument, match="too large to pass to front-end process 1"):
            await peers[0].forward(1, huge)
    finally:
        await close_all(peers)


@scenario
async def test_forward_decoupled_streams_every_item_in_order(directory: Path):
    peers, _ = await start_peers(directory, 2)
    try:
        scheduler = ForwardingScheduler(peers[0], 1, "stream")
        stream = ResponseStream(asyncio.Queue())
        assert await scheduler.submit(infer_request("stream", "s"), None, {}, None, stream) is None  # type: ignore
        assert stream.cancel is not None
        items = await drain_stream(stream)
        assert scheduler.inflight_count() == 0  # in flight until its final item
        assert [(type(item).__name__, final) for item, final in items] == [
            ("InferResponse", False), ("InvalidArgument", False), ("InferResponse", False), ("NoneType", True)]
        assert items[1][0].message == "a bad one in the middle"
        assert [r.id for r, _ in items if isinstance(r, InferResponse)] == ["s-0", "s-2"]
        assert bytes(items[0][0].outputs[0].data) == FP32
    finally:
        await close_all(peers)


@scenario
async def test_forward_refused_before_running_raises(directory: Path):
    peers, _ = await start_peers(directory, 2)
    try:
        for stream in (None, ResponseStream(asyncio.Queue())):
            with pytest.raises(InvalidArgument, match="unknown input 'X'"):
                await peers[0].forward(1, infer_request("refuse", "r"), stream)
            with pytest.raises(Internal, match="the service broke"):
                await peers[0].forward(1, infer_request("crash", "c"), stream)
            assert stream is None or stream.queue.empty()
    finally:
        await close_all(peers)


@scenario
async def test_cancel_reaches_the_owners_task(directory: Path):
    peers, services = await start_peers(directory, 2)
    try:
        scheduler = ForwardingScheduler(peers[0], 1, "hang")
        caller = asyncio.ensure_future(scheduler.submit(infer_request("hang", "h"), None, {}))  # type: ignore[arg-type]
        await services[1].started("h")
        assert scheduler.inflight_count() == 1
        caller.cancel()
        await services[1].sees_cancel("h")
        assert scheduler.inflight_count() == 0

        stream = ResponseStream(asyncio.Queue())  # decoupled: cancelled once it runs, through the stream
        assert await peers[0].forward(1, infer_request("hang_stream", "d"), stream) is None
        first, final = await stream.queue.get()
        assert isinstance(first, InferResponse) and not final
        assert stream.cancel is not None
        stream.cancel()
        await services[1].sees_cancel("d")
        assert await peers[0].call(1, "echo", {}) == {"from": 1}
    finally:
        await close_all(peers)


@scenario
async def test_peer_that_dies_fails_pending_and_is_reached_again_once_restarted(directory: Path):
    peers, services = await start_peers(directory, 2)
    try:
        plain = asyncio.ensure_future(peers[0].forward(1, infer_request("hang", "p")))
        stream = ResponseStream(asyncio.Queue())
        assert await peers[0].forward(1, infer_request("hang_stream", "s"), stream) is None
        await services[1].started("p")
        await peers[1].close()  # the owner exits
        with pytest.raises(Unavailable, match="front-end process 1 exited"):
            await plain
        items = await drain_stream(stream)
        assert isinstance(items[-1][0], Unavailable) and items[-1][1]
        assert sorted(services[1].cancelled) == ["p", "s"]  # its serving tasks were cancelled
        with pytest.raises(Unavailable, match="not reachable"):
            peers[0].connect_timeout = 0.2
            await peers[0].call(1, "echo", {})
        peers[1] = Peers(1, 2, directory)  # restarted, on the same path
        await peers[1].start({"echo": echo_handler(11)}, EchoService())  # type: ignore[arg-type]
        assert await peers[0].call(1, "echo", {}) == {"from": 11}
        response = await peers[0].forward(1, infer_request("echo", "again"))
        assert response is not None and response.id == "again"
    finally:
        await close_all(peers)


@scenario
async def test_connect_waits_for_a_peer_that_starts_late(directory: Path):
    early = Peers(0, 2, directory, connect_timeout=10)
    late = Peers(1, 2, directory)
    await early.start({}, EchoService())  # type: ignore[arg-type]
    try:
        call = asyncio.ensure_future(early.call(1, "echo", {"n": 1}))
        forward = asyncio.ensure_future(early.forward(1, infer_request("echo", "f")))
        await asyncio.sleep(0.3)
        assert not call.done() and not forward.done()
        stale = socket.socket(socket.AF_UNIX)  # a stale socket file of a previous run
        stale.bind(str(late.path_of(1)))
        stale.close()
        await asyncio.sleep(0.1)
        await late.start({"echo": echo_handler(1)}, EchoService())  # type: ignore[arg-type]
        assert await call == {"from": 1, "n": 1}
        assert (await forward).id == "f"  # type: ignore[union-attr]
    finally:
        await close_all([early, late])
    assert not early.path_of(0).exists() and not late.path_of(1).exists()


@scenario
async def test_forwarding_scheduler_drain(directory: Path):
    peers, services = await start_peers(directory, 2)
    try:
        scheduler = ForwardingScheduler(peers[0], 1, "m")
        slow = asyncio.ensure_future(scheduler.submit(infer_request("hang", "x"), None, {}))  # type: ignore[arg-type]
        done = await scheduler.submit(infer_request("echo", "y"), None, {})  # type: ignore[arg-type]
        assert done is not None and done.id == "y"
        await services[1].started("x")
        drain = asyncio.ensure_future(scheduler.drain())
        await asyncio.sleep(0.05)
        assert not drain.done() and scheduler.inflight_count() == 1
        with pytest.raises(Unavailable, match="model 'm' is unloading"):
            scheduler.submit(infer_request("echo", "z"), None, {})  # type: ignore[arg-type]
        slow.cancel()
        await asyncio.wait_for(drain, 5)
        assert scheduler.inflight_count() == 0
    finally:
        await close_all(peers)
