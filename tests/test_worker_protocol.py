"""The front-end ⇄ worker wire protocol: both implementations, frame by frame, and a
worker that breaks it."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import time

import pytest

from triton_shm.ipc import protocol_py
from triton_shm.ipc.protocol_py import Op, ProtocolError, RegionDesc, Status

try:
    from triton_shm.ipc import _protocol
except ImportError:  # extensions not built
    _protocol = None

IMPLS = [pytest.param(protocol_py, id="python"),
         pytest.param(_protocol, id="cython", marks=pytest.mark.skipif(_protocol is None, reason="not built"))]

INPUTS = [("INPUT0", "FP32", [1, 16], 0, 3, 128, 64), ("TEXT", "BYTES", [2], 1, 7, 0, 12),
          ("SCALAR", "INT64", [], 0, 3, 192, 8)]
OUTPUTS = [("OUTPUT0", 0, 0, 0, 0), ("OUTPUT1", 1, 9, 64, 4096)]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
REQUESTS = [("req-1", {"p": 1, "s": "x"}, INPUTS, OUTPUTS), ("", {}, INPUTS[:1], OUTPUTS[:1]),
            ("seq", {}, INPUTS[:1], OUTPUTS[:1], (2**64 - 1, True, False)),  # sequence batching requests
            ("", {}, [], [], ("user-ü", False, True)),
            ("t", {}, INPUTS[:1], OUTPUTS[:1], None, (2**64 - 1, TRACEPARENT)),
            ("", {}, [], [], (9, True, True), (3, ""))]  # traced requests, one of a sequence
RESPONSES = [{"outputs": [["OUTPUT0", "FP32", [1, 16], [4, 0, 64]],
                          ["OUTPUT1", "BYTES", [2], RegionDesc((9, 64, 20))]]},
             {"error": {"code": "INVALID_ARG", "message": "bad ünïcode"}},
             {"decoupled": True},
             # a Python model's response parameters, and an error response it returned (ANSWERED)
             {"outputs": [["OUTPUT0", "FP32", [1], [4, 64, 4]]], "parameters": {"b": True, "i": -5, "s": "ü"}},
             {"error": {"code": "CANCELLED", "message": "gone"}, "answered": True}]


def frames(m) -> list[bytes]:
    """One frame of every op."""
    return [bytes(f) for f in (
        m.encode_infer(7, "add_sub/1#3", 2, REQUESTS, [(1, 64, 128), (2, 0, 8)]),
        m.encode_reply(8, RESPONSES, (1, 2, 3)),
        m.encode_stream(9, 4, True, None),
        m.encode_stream(9, 5, False, RESPONSES[0]),
        m.encode_fail(10, {"code": "INTERNAL", "message": "boom"}),
        m.encode_free([(1, 0, 64)]),
        m.encode_ping(11),
        m.encode_pong(11),
        m.encode_control(12, {"op": "load", "config": {"a": [1, 2]}}, [(3, 64, 64)]),
    )]


@pytest.mark.skipif(_protocol is None, reason="not built")
def test_both_implementations_write_the_same_bytes():
    assert frames(protocol_py) == frames(_protocol)


@pytest.mark.parametrize("m", IMPLS)
def test_an_output_given_by_name_alone_goes_to_the_worker_arena(m):
    named = m.encode_infer(1, "m", 0, [("", {}, INPUTS, ["OUTPUT0", OUTPUTS[1]])])
    assert bytes(named) == bytes(m.encode_infer(1, "m", 0, [("", {}, INPUTS, OUTPUTS)]))
    assert m.decode(named).body["requests"][0]["outputs"] == ["OUTPUT0", "OUTPUT1"]


def _same_slot_names() -> tuple[str, str]:
    """Two names of equal length whose FNV-1a hashes share the low 8 bits (the C decoder's
    name-table slot)."""
    def slot(name: str) -> int:
        h = 2166136261
        for byte in name.encode():
            h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
        return h & 255
    seen: dict[int, str] = {}
    for i in range(1000):
        name = f"OUT{i:03d}"
        if slot(name) in seen:
            return seen[slot(name)], name
        seen[slot(name)] = name
    raise AssertionError("no two names share a slot")


@pytest.mark.parametrize("m", IMPLS)
def test_recurring_and_colliding_names_decode_to_their_own_text(m):
    a, b = _same_slot_names()
    names = [a, b, a, "ÄÖ", "ÄÖ", "x" * 65, "x" * 65, "", a.lower()]
    for _ in range(2):  # the second pass finds names decoded before
        frame = m.encode_infer(1, "m", 0, [("", {}, [], names)])
        assert m.decode(frame).body["requests"][0]["outputs"] == names
        frame = m.encode_infer(1, "m", 0, [("", {}, [], [b, a])])
        assert m.decode(frame).body["requests"][0]["outputs"] == [b, a]


@pytest.mark.parametrize("m", IMPLS)
def test_every_op_round_trips(m):
    infer, reply, final, stream, fail, free, ping, pong, control = (m.decode(f) for f in frames(m))
    assert (infer.op, infer.id, infer.frees) == (Op.INFER, 7, [(1, 64, 128), (2, 0, 8)])
    assert infer.body["model"] == "add_sub/1#3" and infer.body["instance"] == 2
    first, second, numeric, string, traced, traced_seq = infer.body["requests"]
    assert first == {"request_id": "req-1", "parameters": {"p": 1, "s": "x"},
                     "inputs": [["INPUT0", "FP32", [1, 16], [3, 128, 64]],
                                ["TEXT", "BYTES", [2], RegionDesc((7, 0, 12))], ["SCALAR", "INT64", [], [3, 192, 8]]],
                     "outputs": ["OUTPUT0", "OUTPUT1"], "shm_outputs": {"OUTPUT1": RegionDesc((9, 64, 4096))}}
    assert second["parameters"] == {} and second["outputs"] == ["OUTPUT0"] and "sequence" not in second
    assert numeric["sequence"] == [2**64 - 1, True, False] and numeric["outputs"] == ["OUTPUT0"]
    assert string["sequence"] == ["user-ü", False, True] and string["inputs"] == []
    assert "trace" not in first and "trace" not in string and "sequence" not in traced
    assert traced["trace"] == [2**64 - 1, TRACEPARENT]
    assert traced_seq["trace"] == [3, ""] and traced_seq["sequence"] == [9, True, True]
    assert reply.op == Op.REPLY and reply.body == ([(Status.OK, RESPONSES[0]["outputs"]),
                                                    (Status.ERROR, RESPONSES[1]["error"]),
                                                    (Status.DECOUPLED, None),
                                                    (Status.PARAMS, (RESPONSES[3]["outputs"],
                                                                     RESPONSES[3]["parameters"])),
                                                    (Status.ANSWERED, RESPONSES[4]["error"])], (1, 2, 3))
    assert final.body == {"index": 4, "final": True}
    assert stream.body == {"index": 5, "final": False, **RESPONSES[0]}
    assert fail.op == Op.FAIL and fail.body == {"error": {"code": "INTERNAL", "message": "boom"}}
    assert (free.op, free.frees, ping.op, ping.id, pong.op) == (Op.FREE, [(1, 0, 64)], Op.PING, 11, Op.PONG)
    assert control.body == {"op": "load", "config": {"a": [1, 2]}} and control.frees == [(3, 64, 64)]


@pytest.mark.parametrize("m", IMPLS)
def test_a_descriptor_says_by_its_type_where_the_bytes_are(m):
    """An arena block decodes to a plain [segment, offset, size] list, a client region to a
    RegionDesc; each encodes back to its own place."""
    request = m.decode(m.encode_infer(1, "m", 0, REQUESTS[:1])).body["requests"][0]
    arena, region, _ = (t[3] for t in request["inputs"])
    assert type(arena) is list and arena == [3, 128, 64]
    assert type(region) is RegionDesc and (region.region, region.offset, region.size) == (7, 0, 12)
    assert type(request["shm_outputs"]["OUTPUT1"]) is RegionDesc
    outputs = m.decode(m.encode_stream(1, 0, False, RESPONSES[0])).body["outputs"]
    assert [type(o[3]) for o in outputs] == [list, RegionDesc] and outputs == RESPONSES[0]["outputs"]
    # the same numbers in a plain list name an arena block, not the region
    arena_only = {"outputs": [["OUTPUT1", "BYTES", [2], [9, 64, 20]]]}
    assert type(m.decode(m.encode_stream(1, 0, False, arena_only)).body["outputs"][0][3]) is list


@pytest.mark.parametrize("m", IMPLS)
def test_a_streamed_response_keeps_its_parameters_and_a_stream_error_its_words(m):
    assert m.decode(m.encode_stream(3, 1, False, RESPONSES[3])).body == {"index": 1, "final": False, **RESPONSES[3]}
    assert m.decode(m.encode_stream(3, 1, True, RESPONSES[4])).body == {
        "index": 1, "final": True, "error": RESPONSES[4]["error"]}


@pytest.mark.parametrize("m", IMPLS)
def test_a_request_id_too_long_for_its_field_is_the_client_s_error(m):
    from triton_shm.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="request id is longer than 65535 bytes"):
        m.encode_infer(1, "m", 0, [("x" * 65536, {}, [], [])])


def _errors(m, data: bytes) -> tuple[str, int | None]:
    with pytest.raises(ProtocolError) as info:
        m.decode(data)
    return info.value.message, info.value.msg_id


def _corruptions() -> list[bytes]:
    """Frames that break the protocol in every way a peer can."""
    good = frames(protocol_py)
    reply = good[1]
    bad = [f[:n] for f in good for n in range(len(f)) if n != len(f)]  # every truncation
    bad += [f + b"\0" for f in good]                                   # trailing bytes
    bad.append(bytes([99]) + reply[1:])                                # unknown op
    bad.append(reply[:1] + b"\1" + reply[2:])                          # reserved bits
    t = protocol_py.HEADER_SIZE + 24 + 3                               # first TENSOR of the reply
    bad.append(reply[:t] + bytes([200]) + reply[t + 1:])               # unknown datatype
    bad.append(reply[:t + 1] + bytes([65]) + reply[t + 2:])            # too many dimensions
    bad.append(reply[:t + 2] + bytes([5]) + reply[t + 3:])             # unknown place
    d = t + 26                                                         # its first dimension
    bad.append(reply[:d] + struct.pack("<q", -1) + reply[d + 8:])      # negative dimension
    bad.append(reply[:protocol_py.HEADER_SIZE + 24] + bytes([9]) + reply[protocol_py.HEADER_SIZE + 25:])  # status
    bad.append(reply[:4] + struct.pack("<I", 1000) + reply[8:])        # more responses than the frame holds
    bad.append(reply[:8] + struct.pack("<I", 1 << 30) + reply[12:])    # more frees than the frame holds
    bad.append(bytes(protocol_py.encode_control(1, {"op": "x"}))[:-1] + b"\xff")  # invalid JSON
    bad.append(bytes(protocol_py._start(Op.CONTROL, 1, 0, ())) + b"[1]")  # JSON that is no control op
    seq = bytes(protocol_py.encode_infer(1, "m", 0, [("", {}, [], [], (5, True, False))]))
    s = protocol_py.HEADER_SIZE + 6 + 1 + 10                           # its request's sequence byte
    bad.append(seq[:s] + bytes([0x20 | seq[s]]) + seq[s + 1:])         # unknown sequence flag
    bad.append(seq[:s] + bytes([0x10 | seq[s]]) + seq[s + 1:])         # TRACED without its trace
    bad.append(seq[:s] + bytes([0x0C]) + seq[s + 1:])                  # numeric and string ID at once
    bad.append(seq[:s] + bytes([0x01]) + seq[s + 1:-8])                # START without an ID
    return bad


@pytest.mark.parametrize("m", IMPLS)
def test_every_corruption_is_refused_with_the_message_id(m):
    for data in _corruptions():
        message, msg_id = _errors(m, data)
        assert message.startswith("malformed message from peer")
        assert msg_id == (None if len(data) < protocol_py.HEADER_SIZE else struct.unpack_from("<Q", data, 12)[0])


@pytest.mark.skipif(_protocol is None, reason="not built")
def test_both_decoders_agree_on_every_corruption():
    for data in _corruptions():
        assert _errors(protocol_py, data) == _errors(_protocol, data)


# -- the shared-memory ring ---------------------------------------------------------------------
from triton_shm.ipc import ring_py  # noqa: E402
from triton_shm.ipc.link import Link  # noqa: E402

try:
    from triton_shm.ipc import _ring
except ImportError:
    _ring = None

RINGS = [pytest.param(ring_py.Ring, id="python"),
         pytest.param(_ring and _ring.Ring, id="cython", marks=pytest.mark.skipif(_ring is None, reason="not built"))]


def _pair(Ring, capacity=256):
    buf = bytearray(ring_py.HEADER + capacity)
    return buf, Ring(buf, capacity), Ring(buf, capacity)


@pytest.mark.parametrize("Ring", RINGS)
def test_ring_keeps_order_across_the_wrap_and_refuses_when_full(Ring):
    buf, tx, rx = _pair(Ring)
    assert tx.max_record == 120
    sent = []
    for i in range(200):  # many wraps of a 256-byte ring
        record = bytes([i % 251]) * (i % 50)
        assert tx.push(record, i & 1) >= 0
        sent.append((record, i & 1))
        if i % 3 == 2:
            while (got := rx.pop()) is not None:
                assert got == sent.pop(0)
    while (got := rx.pop()) is not None:
        assert got == sent.pop(0)
    assert sent == [] and rx.pop() is None
    assert tx.room() == 256
    while tx.push(b"x" * 40) >= 0:
        pass
    assert tx.room() < 48
    assert tx.push(b"x" * 121) == -1  # larger than a record may be
    assert rx.pop() == (b"x" * 40, 0)
    assert tx.push(b"y" * 40) >= 0  # room again once the consumer moved on


@pytest.mark.parametrize("Ring", RINGS)
def test_ring_wakes_a_sleeping_consumer_only(Ring):
    buf, tx, rx = _pair(Ring)
    assert rx.prepare_sleep()  # empty: it may sleep
    assert tx.push(b"a") == 1  # so the producer must wake it
    assert not rx.prepare_sleep()  # a record is there: drain instead
    if Ring is not ring_py.Ring:  # the twin always asks for a wake (no fences in Python)
        assert tx.push(b"b") == 0  # awake: no wake-up
    assert rx.pop() == (b"a", 0)


@pytest.mark.parametrize("Ring", RINGS)
def test_ring_refuses_positions_and_lengths_past_its_end(Ring):
    for head_tail, first in [((0, 1 << 40), None), ((0, 4), None), ((0, 16), struct.pack("<II", 200, 0)),
                             ((0, 16), struct.pack("<II", 100, 0)), ((0, 16), struct.pack("<II", 0xFFFFFFFF, 0))]:
        buf, tx, rx = _pair(Ring)
        struct.pack_into("<Q", buf, 64, head_tail[1])  # a producer that scribbled on its tail
        if first is not None:
            buf[ring_py.HEADER:ring_py.HEADER + 8] = first
        with pytest.raises(ring_py.RingCorrupt):
            rx.pop()


# The producer runs in another process, as a worker does: the two really run at once.
# It pushes numbered records and checks that the consumer's head never goes back.
RING_PRODUCER = r"""
import mmap, struct, sys, time
from triton_shm.ipc import ring_py
try:
    from triton_shm.ipc import _ring
except ImportError:
    _ring = None
fd, capacity, count, impl = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
buf = mmap.mmap(fd, ring_py.HEADER + capacity)
tx = (ring_py.Ring if impl == "python" else _ring.Ring)(buf, capacity)
deadline, last = time.monotonic() + 60, 0
for i in range(count):
    while tx.push(struct.pack("<Q", i) * (1 + i % 7)) < 0:
        if time.monotonic() > deadline:
            sys.exit("the consumer stopped draining")
    head = struct.unpack_from("<Q", buf, 0)[0]
    if head < last:
        sys.exit(f"the consumer's head went back from {last} to {head}")
    last = head
"""


@pytest.mark.parametrize("Ring", RINGS)
def test_ring_positions_are_never_seen_half_written(Ring):
    """The consumer reads the producer's tail while it is being stored (and the other way
    round). A store that clears the word before it writes the value (``struct.pack_into``)
    shows the peer a position of 0: a ring "past its end" that stopped the worker."""
    capacity, count = 1 << 14, 200_000
    fd = os.memfd_create("ring_race")
    os.ftruncate(fd, ring_py.HEADER + capacity)
    buf = mmap.mmap(fd, ring_py.HEADER + capacity)
    rx = Ring(buf, capacity)
    impl = "python" if Ring is ring_py.Ring else "cython"
    proc = subprocess.Popen([sys.executable, "-c", RING_PRODUCER, str(fd), str(capacity), str(count), impl],
                            pass_fds=[fd], stderr=subprocess.PIPE, text=True)
    os.close(fd)
    try:
        deadline = time.monotonic() + 60
        for i in range(count):
            while (got := rx.pop()) is None:  # a tight loop: it reads the tail as often as it can
                assert time.monotonic() < deadline and proc.poll() in (None, 0), proc.stderr.read()
            assert got == (struct.pack("<Q", i) * (1 + i % 7), 0)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def _asleep(link: Link) -> bool:
    """The worker side of ``link`` (its peer) sleeps on its ring's sleeping word."""
    return struct.unpack_from("<I", link._maps[0], 128)[0] == 1


def test_the_worker_side_sleeps_on_its_ring_and_wakes_for_a_push_a_kick_and_the_close():
    """The worker's ``wait`` sleeps on the futex of its ring (no eventfd): a frame in the
    ring wakes it, so does a frame with fds on the socket (its ring record follows),
    another of its threads (``kick``), and the front-end's ``close`` (it then reports the
    front-end gone)."""
    import queue
    import threading
    ours, theirs, fds = Link.create()
    peer = Link.attach(theirs, fds)
    assert ours.tx_wake == -1 and peer.rx_wake == -1  # the direction to the worker has no eventfd
    results: queue.Queue = queue.Queue()
    go = threading.Semaphore(0)

    def worker_side() -> None:
        while go.acquire() and (woke := peer.wait(0)) is not None:
            results.put((woke, peer.recv()))
            if not woke:
                return

    thread = threading.Thread(target=worker_side, daemon=True)
    thread.start()

    def wake(action) -> tuple[bool, object]:
        go.release()
        deadline = time.monotonic() + 30
        while not _asleep(ours):
            assert time.monotonic() < deadline, "the worker side never went to sleep"
            time.sleep(0.001)
        action()
        return results.get(timeout=30)

    try:
        assert wake(lambda: ours.send(b"frame")) == (True, (b"frame", []))
        r, w = os.pipe()
        try:
            woke, (frame, got_fds) = wake(lambda: ours.send(b"with fds", [r]))
            assert (woke, frame, len(got_fds)) == (True, b"with fds", 1)
            os.close(got_fds[0])
        finally:
            os.close(r)
            os.close(w)
        assert wake(peer.kick) == (True, None)
        assert wake(ours.close) == (False, None)
    finally:
        ours.close()
        thread.join(30)
        peer.close()
    assert not thread.is_alive()


def _spawn_worker() -> tuple[Link, subprocess.Popen]:
    link, theirs, fds = Link.create()
    proc = subprocess.Popen([sys.executable, "-m", "triton_shm.worker", "--fd", str(theirs.fileno()),
                             "--name", "cpu", "--link", ",".join(map(str, fds))],
                            pass_fds=[theirs.fileno(), *fds], stderr=subprocess.PIPE, text=True)
    theirs.close()
    for fd in fds:
        os.close(fd)
    deadline = time.monotonic() + 60
    while (got := link.recv()) is None:  # its hello: it serves its ring
        assert time.monotonic() < deadline and proc.poll() is None, "the worker never said hello"
        time.sleep(0.01)
    assert protocol_py.decode(got[0]).body["op"] == "hello"
    return link, proc


def test_a_worker_whose_ring_breaks_says_so_and_exits_nonzero():
    """Only the front-end's end-of-file is a clean stop (code 0); a worker that leaves
    its loop for any other reason logs why and exits non-zero, so the front-end's
    "exited with code ..." points at the worker."""
    link, proc = _spawn_worker()
    try:
        struct.pack_into("<Q", link._maps[0], 64, 1 << 40)  # our tail to it, past its ring's end
        link.wake_peer()
        assert proc.wait(60) == 1
        assert "its link to the front-end broke: ring index past its end" in proc.stderr.read()
    finally:
        proc.kill()
        link.close()
        proc.wait()

    link, proc = _spawn_worker()
    try:
        link.close()  # the front-end goes: end-of-file
        assert proc.wait(60) == 0
        assert "stops" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_whose_front_end_dies_without_closing_the_link_leaves():
    """A front-end killed outright wakes nobody: the sleeping worker finds the end-of-file
    when its sleep times out (``PEER_CHECK_NS``) and stops as after a close."""
    link, proc = _spawn_worker()
    try:
        link.sock.close()  # as the kernel closes a dead process's socket: no futex wake
        assert proc.wait(60) == 0
        assert "stops" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        link.close()


# -- a worker that breaks the protocol, against a running server --------------------------------
# The model below is the fault hook: only these tests load it. It finds its worker (gc) and
# replaces the worker's next reply with a broken one, or breaks the worker's ring, or stops
# the worker from reading.
HOSTILE_PY = """
import gc
import json
import os
import struct
import time

import triton_python_backend_utils as pb_utils
from triton_shm.ipc import protocol
from triton_shm.worker.process import Worker


def _worker():
    return next(o for o in gc.get_objects() if isinstance(o, Worker))


def _break_next_reply(worker, fault):
    send = worker.send_frame

    def send_frame(frame, fds=None):
        msg = protocol.decode(frame)
        if msg.op != protocol.Op.REPLY:
            return send(frame, fds)
        del worker.send_frame  # once
        responses, timing = msg.body
        # the decoder's (status, payload) entries back into the dicts encode_reply takes
        responses = [{"outputs": payload} if status == protocol.Status.OK else {"error": payload}
                     if status == protocol.Status.ERROR else {"decoupled": True} for status, payload in responses]
        if fault == "out_of_range":
            seg, offset, size = responses[0]["outputs"][0][3]
            responses[0]["outputs"][0][3] = [seg, 1 << 40, size]
        elif fault == "wrong_count":
            responses[0]["outputs"].append(list(responses[0]["outputs"][0]))
        elif fault == "missing_output":
            responses[0]["outputs"] = []
        frame = bytearray(protocol.encode_reply(msg.id, responses, timing))
        if fault == "unknown_op":
            frame[0] = 99
        elif fault == "truncated":
            frame = frame[:-3]
        send(bytes(frame), fds)

    worker.send_frame = send_frame


class TritonPythonModel:
    def execute(self, requests):
        fault = json.loads(requests[0].parameters() or "{}").get("fault")
        worker = _worker()
        if fault == "ring_past_end":  # scribble on our tail of the ring to the front-end, and wake it
            worker.send_frame = lambda *args, **kwargs: None  # no later push may repair the tail
            struct.pack_into("<Q", worker.link._maps[0], 64, 1 << 50)
            os.eventfd_write(worker.link.tx_wake, 1)
        elif fault == "stop_reading":
            worker._dispatch = lambda msg, fds: time.sleep(3600)
        elif fault == "slow":
            time.sleep(1.0)
        elif fault == "ring_stays_full":  # the reply to this batch finds no room, ever (the wait cut short)
            import triton_shm.worker.process as process

            def full(*args, **kwargs):
                raise BlockingIOError("ring full")
            process.RING_FULL_WAIT = 0.2
            worker.link.send = full
        elif fault == "unencodable":  # an error whose text UTF-8 cannot carry: its reply cannot be made
            raise pb_utils.TritonModelException("undecodable name: \\udcff")
        elif fault == "bogus_keeps":  # keeps and releases of input blocks that are not the worker's to name
            worker.send({"op": "keep_inputs", "blocks": [[999, 0, 64], "junk", [1, 2], None]})
            worker.send({"op": "release_inputs", "blocks": [[999, 0, 64], [0, 0, 0], "junk"]})
            worker.send({"op": "keep_inputs", "blocks": 7})
            worker.send({"op": "keep_inputs", "blocks": [[7, 64 * k, 64] for k in range(70000)]})
        elif fault:
            _break_next_reply(worker, fault)  # the reply to this very batch
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""


def _hostile_repo(root, count: int = 1):
    """The hostile model's instances are threads of the shared CPU worker: one instance runs
    on its control thread, two on threads of their own (an instance process, which hosts
    one, is the first case; its handle checks it the same way)."""
    from .models import in_shared_worker, write_model
    in_shared_worker(write_model(root, "hostile", model_py=HOSTILE_PY, config=f"""
        name: "hostile"
        backend: "python"
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """))
    return root


def _infer(srv, fault=None, timeout_us=None):
    import numpy as np
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
    try:
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        data = np.arange(4, dtype=np.float32)
        inp.set_data_from_numpy(data)
        params = {"fault": fault} if fault else {}
        if timeout_us:
            params["timeout"] = timeout_us
        result = client.infer("hostile", [inp], parameters=params or None)
        assert list(result.as_numpy("OUTPUT0")) == list(data)
        return result
    finally:
        client.close()


def _fails(srv, fault, status, needle, **kw):
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException) as e:
        _infer(srv, fault, **kw)
    assert e.value.status() == status, (e.value.status(), e.value.message())
    assert needle in e.value.message(), e.value.message()


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    from .harness import ServerProcess
    root = tmp_path_factory.mktemp("hostile")
    srv = ServerProcess(_hostile_repo(root / "models"), root / "server.log").start()
    yield srv
    srv.stop_cleanly()


@pytest.fixture
def own_hostile_server(tmp_path):
    from .harness import ServerProcess
    srv = ServerProcess(_hostile_repo(tmp_path / "models"), tmp_path / "server.log")
    yield srv
    if srv.proc is not None and srv.proc.poll() is None:
        srv.stop()


def _worker_pid(srv) -> int:
    from .harness import children
    (pid,) = children(srv.proc.pid)
    return pid


@pytest.mark.parametrize("fault, needle", [
    ("unknown_op", "unknown op 99"),
    ("truncated", "truncated record"),
    ("out_of_range", "out of bounds"),
    ("wrong_count", "where ['OUTPUT0'] were asked"),
    ("missing_output", "where ['OUTPUT0'] were asked"),
])
def test_a_malformed_reply_fails_its_request_with_internal_and_loses_nothing(hostile_server, fault, needle):
    pid = _worker_pid(hostile_server)
    _fails(hostile_server, fault, "500", needle)
    for _ in range(3):  # the instance was not lost, nothing waits
        _infer(hostile_server)
    assert _worker_pid(hostile_server) == pid  # a legible frame answers for itself: no restart


@pytest.mark.parametrize("count", [1, 2])  # one instance runs on the control thread, two on their own
def test_a_reply_that_cannot_be_encoded_fails_its_batch_and_the_instance_goes_on(tmp_path, count):
    """A batch whose reply cannot be encoded (a model's error text with a lone surrogate)
    fails INTERNAL; the instance (on the control thread or its own) serves the next ones,
    where its thread used to end on the exception and its batches waited forever."""
    from .harness import ServerProcess
    srv = ServerProcess(_hostile_repo(tmp_path / "models", count), tmp_path / "server.log").start()
    try:
        pid = _worker_pid(srv)
        for _ in range(2):  # with two instances, each gets one
            _fails(srv, "unencodable", "500", "worker error")
        for _ in range(6):
            _infer(srv)
        assert _worker_pid(srv) == pid
    finally:
        srv.stop_cleanly()


def test_keeps_and_releases_of_blocks_a_worker_was_never_lent_change_nothing(hostile_server):
    """The front-end keeps a block past its batch only if the worker names one of that
    batch's blocks, frees only blocks it kept or lent, and bounds what it holds announced."""
    pid = _worker_pid(hostile_server)
    _infer(hostile_server, "bogus_keeps")
    for _ in range(20):  # every block of these requests is freed and serves again
        _infer(hostile_server)
    assert _worker_pid(hostile_server) == pid
    log = hostile_server.log()
    assert "keeps more input blocks than are in flight" in log
    assert "malformed 'keep_inputs' message" in log


def _recovers(srv, old_pid: int) -> None:
    from .test_lifecycle import wait_for
    import tritonclient.http as httpclient
    from .harness import children
    wait_for(lambda: children(srv.proc.pid) and children(srv.proc.pid) != [old_pid], 30, "a new worker")
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        wait_for(lambda: client.is_model_ready("hostile"), 30, "the model to be ready again")
    finally:
        client.close()
    _infer(srv)


def test_a_ring_index_past_its_end_restarts_the_worker(own_hostile_server):
    srv = own_hostile_server.start()
    pid = _worker_pid(srv)
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException) as e:
        _infer(srv, "ring_past_end")
    assert e.value.status() == "503", e.value.message()
    assert "worker 'cpu' broke the worker protocol" in e.value.message(), e.value.message()
    assert "ring index past its end" in srv.log()
    _recovers(srv, pid)
    srv.stop_cleanly()


@pytest.mark.parametrize("count", [1, 2])  # one instance runs on the control thread, two on their own
def test_a_reply_that_cannot_be_sent_restarts_the_worker_instead_of_hanging(tmp_path, count):
    """The ring to the front-end stays full past RING_FULL_WAIT while the front-end lives:
    the worker leaves, so the request fails UNAVAILABLE and a new worker serves, instead of
    the instance (or its thread) ending quietly and the request waiting forever."""
    from .harness import ServerProcess
    srv = ServerProcess(_hostile_repo(tmp_path / "models", count), tmp_path / "server.log").start()
    try:
        pid = _worker_pid(srv)
        _fails(srv, "ring_stays_full", "503", "worker 'cpu'")
        assert "a reply could not be sent to the front-end" in srv.log()
        _recovers(srv, pid)
    finally:
        srv.stop_cleanly()


def test_a_worker_that_stops_reading_fails_requests_by_their_timeout(own_hostile_server):
    import concurrent.futures
    import os
    import signal
    import time

    from .harness import rss_kib
    srv = own_hostile_server.start()
    pid = _worker_pid(srv)
    _infer(srv, "stop_reading")  # answered; the worker reads nothing after it
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:  # more than the instance's slots
        errors = list(pool.map(lambda _: _catch(srv, 500_000), range(12)))
    assert time.monotonic() - t0 < 20
    assert all(e is not None and "timeout" in e.message().lower() for e in errors), errors
    rss = rss_kib(srv.proc.pid)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _catch(srv, 100_000), range(200)))
    assert rss_kib(srv.proc.pid) < rss + 20_000  # bounded: frames wait in a fixed ring, requests time out
    os.kill(pid, signal.SIGKILL)  # a stuck worker can only be restarted
    _recovers(srv, pid)
    srv.stop_cleanly()


def _catch(srv, timeout_us):
    from tritonclient.utils import InferenceServerException
    try:
        _infer(srv, timeout_us=timeout_us)
    except InferenceServerException as e:
        return e
    return None


def test_a_worker_killed_mid_batch_with_frames_both_ways_fails_them_and_recovers(own_hostile_server):
    import concurrent.futures
    import os
    import signal
    import time
    srv = own_hostile_server.start()
    pid = _worker_pid(srv)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        # one runs (1 s), one is held in the worker, the rest wait in the front-end
        slow = [pool.submit(_catch_fault, srv, "slow") for _ in range(4)]
        quick = [pool.submit(_catch, srv, None) for _ in range(2)]
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        errors = [f.result(timeout=30) for f in slow + quick]
    failed = [e for e in errors if e is not None]
    assert failed, "nothing was in flight when the worker died"
    for e in failed:
        assert e.status() == "503" and "worker 'cpu'" in e.message(), (e.status(), e.message())
    _recovers(srv, pid)
    srv.stop_cleanly()


def _catch_fault(srv, fault):
    from tritonclient.utils import InferenceServerException
    try:
        _infer(srv, fault)
    except InferenceServerException as e:
        return e
    return None


def test_a_reply_the_pool_cannot_read_fails_its_batch_with_internal():
    """Past the decoder (which checks every frame), a reply the pool still cannot read, a
    fault of ours, fails its batch with INTERNAL instead of leaving its requests waiting.
    The worker handle records the reply callback instead of sending the frame."""
    from types import SimpleNamespace

    from triton_shm.core.data.types import BatchRequest, InferRequest
    from triton_shm.core.models.validation import RequestPlan
    from triton_shm.errors import Internal
    from triton_shm.ipc.arena import Arena
    from triton_shm.supervisor.pool import WorkerPool

    pool = WorkerPool([])
    worker = pool.workers["cpu"]
    worker.alive, worker.arena = True, Arena(1 << 20)
    callbacks = []
    worker.request = lambda encode, args, on_reply, **kw: callbacks.append(on_reply)
    answered = []
    batch = [BatchRequest(InferRequest("m"), RequestPlan(outputs=[], batch_size=1), {}, None)]
    pool.start_batch(SimpleNamespace(name="m", key="m/1#0", decoupled=False), ("cpu", 0), batch,
                     lambda results, timing: answered.append((results, timing)))
    (on_reply,) = callbacks
    on_reply(([(Status.ERROR, "not an error record")], (1, 2, 3)))
    ((results, timing),) = answered
    assert timing is None and len(results) == 1 and isinstance(results[0], Internal)
    assert results[0].message.startswith("reading worker 'cpu's reply failed: AttributeError")


def test_a_decoupled_batch_failed_in_its_reply_ends_its_stream():
    """A decoupled request that fails before it responds (an ERROR entry in the batch's
    REPLY) gets the error on its stream, and the batch's stream entry in the worker handle
    ends with it: nothing stays registered for a batch that will send nothing more."""
    import queue
    from types import SimpleNamespace

    from triton_shm.core.data.types import BatchRequest, InferRequest
    from triton_shm.core.models.validation import RequestPlan
    from triton_shm.errors import InvalidArgument
    from triton_shm.ipc.arena import Arena
    from triton_shm.supervisor.pool import WorkerPool

    pool = WorkerPool([])
    worker = pool.workers["cpu"]
    worker.alive, worker.arena = True, Arena(1 << 20)
    sent, ended = [], []
    worker.request = lambda encode, args, on_reply, **kw: sent.append((on_reply, kw))
    worker.end_stream = ended.append
    stream = SimpleNamespace(queue=queue.Queue(), cancel=None)
    batch = [BatchRequest(InferRequest("m"), RequestPlan(outputs=[], batch_size=1), {}, stream)]
    pool.start_batch(SimpleNamespace(name="m", key="m/1#0", decoupled=True, stats=None), ("cpu", 0), batch,
                     lambda results, timing: None)
    ((on_reply, kw),) = sent
    on_reply(([(Status.ERROR, InvalidArgument("bad input").to_wire())], (1, 2, 3)))
    item, final = stream.queue.get_nowait()
    assert final and isinstance(item, InvalidArgument) and item.message == "bad input"
    assert ended == [kw["msg_id"]]


def test_the_worker_dispatches_every_control_op_the_front_end_sends():
    """``_control`` is a table lookup: one handler per op the front-end sends, an unknown op
    a clear error."""
    from triton_shm.errors import InvalidArgument
    from triton_shm.ipc.protocol import ControlOp
    from triton_shm.worker.process import Worker
    worker = object.__new__(Worker)  # the table needs no link
    worker._controls = worker._control_table()
    to_worker = {ControlOp.SEGMENT, ControlOp.DROP, ControlOp.REGION, ControlOp.CUDA_REGION, ControlOp.REGION_DROP,
                 ControlOp.CANCEL, ControlOp.BLS_REPLY, ControlOp.IS_READY, ControlOp.AUTO_COMPLETE, ControlOp.LOAD,
                 ControlOp.UNLOAD}
    assert set(worker._controls) == {op.value for op in to_worker}
    worker.cancelled = set()
    worker._control({"op": "cancel", "batch": 7, "index": 2}, [])
    assert worker.cancelled == {(7, 2)}
    with pytest.raises(InvalidArgument, match="^unknown control message 'hello'$"):
        worker._control({"op": "hello"}, [])
