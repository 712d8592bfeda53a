"""Every parser that reads untrusted bytes, as a fuzz target: ``target(data: bytes)`` runs
the parser and raises ``Finding`` when it misbehaves (an exception other than the error
it is allowed to raise, or two twin implementations that disagree). The bounded run in
tests/test_fuzz.py (hypothesis) and the long run in bench/fuzz.py share these, and the
valid ``SEEDS`` each mutation starts from.
"""
from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Callable

from google.protobuf.message import DecodeError

from triton_shm._proto import grpc_service_pb2 as pb
from triton_shm.cluster import wire
from triton_shm.core.data import codec_py
from triton_shm.core.data.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from triton_shm.core.models import config as mcfg
from triton_shm.errors import TritonShmError
from triton_shm.frontend.grpc.codec import parse_infer_request
from triton_shm.frontend.http.codec import decode_infer_request
from triton_shm.ipc import protocol_py

try:
    from triton_shm.core.data import _codec
except ImportError:
    _codec = None
try:
    from triton_shm.ipc import _protocol
except ImportError:
    _protocol = None


class Finding(AssertionError):
    """A parser misbehaved on an input (the input is in the message, as hex)."""


def _finding(name: str, data: bytes, what: str) -> Finding:
    return Finding(f"{name}: {what} on input {data[:512].hex()}{'...' if len(data) > 512 else ''}")


def _allowed(name: str, data: bytes, fn: Callable[[], object], errors: tuple[type, ...]) -> object:
    try:
        return fn()
    except errors as e:
        return e
    except RecursionError:
        raise _finding(name, data, "RecursionError") from None
    except Exception as e:  # noqa: BLE001 - anything else is what we look for
        raise _finding(name, data, f"{type(e).__name__}: {e}") from e


# --------------------------------------------------------------------------- HTTP

def http_infer(data: bytes) -> object:
    """A request body, the first 4 bytes read as Inference-Header-Content-Length (or none)."""
    if len(data) < 4:
        return None
    (raw,) = struct.unpack_from("<i", data)
    body = data[4:]
    header_length = None if raw < 0 else raw % (len(body) + 2)
    return _allowed("http_infer", data, lambda: decode_infer_request("m", "", body, header_length), (TritonShmError,))


# --------------------------------------------------------------------------- gRPC

_MESSAGES = [pb.ModelInferRequest, pb.RepositoryModelLoadRequest, pb.SystemSharedMemoryRegisterRequest,
             pb.ModelConfigRequest, pb.ModelStatisticsRequest, pb.TraceSettingRequest, pb.LogSettingsRequest]


def grpc_infer(data: bytes) -> object:
    return _allowed("grpc_infer", data, lambda: parse_infer_request(data), (TritonShmError, DecodeError))


def grpc_messages(data: bytes) -> object:
    """The other requests: protobuf decoding alone (the first byte picks the message)."""
    if not data:
        return None
    message = _MESSAGES[data[0] % len(_MESSAGES)]
    return _allowed("grpc_messages", data, lambda: message.FromString(data[1:]), (DecodeError,))


# --------------------------------------------------------------------------- BYTES tensors

def _bytes_outcome(module, buf: bytes, count: int):
    try:
        return ("ok", [bytes(x) for x in module.deserialize_bytes(buf, count)],
                module.split_bytes(buf, [count // 2, count - count // 2]))
    except TritonShmError as e:
        return ("error", type(e).__name__, e.message)


def bytes_tensor(data: bytes) -> object:
    """The C codec and its pure-Python twin: the same elements, or the same error."""
    if not data:
        return None
    count, buf = data[0] % 8, data[1:]
    python = _allowed("bytes_tensor", data, lambda: _bytes_outcome(codec_py, buf, count), ())
    if _codec is not None:
        native = _allowed("bytes_tensor", data, lambda: _bytes_outcome(_codec, buf, count), ())
        if native != python:
            raise _finding("bytes_tensor", data, f"the twins disagree: C {native!r}, Python {python!r}")
    return python


# --------------------------------------------------------------------------- model configs

def config_pbtxt(data: bytes) -> object:
    """config.pbtxt text through parsing and the checks a load applies."""
    text = data.decode("utf-8", errors="replace")

    def load() -> mcfg.ModelConfig:
        config = mcfg.parse_pbtxt(text)
        if not (config.backend or config.platform):  # else the model's files would say
            config.backend = "python"
        mcfg.fill_defaults(config, config.name or "m", mcfg.backend_of(config, Path("/nonexistent")), [])
        mcfg.check_io(config)
        return config
    return _allowed("config_pbtxt", data, load, (TritonShmError,))


def config_json(data: bytes) -> object:
    """A load request's JSON ``config`` parameter."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    return _allowed("config_json", data, lambda: mcfg.config_from_json(doc), (TritonShmError,))


# --------------------------------------------------------------------------- worker protocol

def _frame_outcome(module, data: bytes):
    try:
        m = module.decode(data)
        return ("ok", int(m.op), m.id, [tuple(f) for f in m.frees], m.body)
    except module.ProtocolError as e:
        return ("error", str(e))


def worker_frames(data: bytes) -> object:
    """Frames either side may receive: the Cython decoder and its twin agree, and raise
    nothing but ProtocolError."""
    python = _allowed("worker_frames", data, lambda: _frame_outcome(protocol_py, data), ())
    if _protocol is not None:
        native = _allowed("worker_frames", data, lambda: _frame_outcome(_protocol, data), ())
        if native != python:
            raise _finding("worker_frames", data, f"the twins disagree: Cython {native!r}, Python {python!r}")
    return python


def peer_frames(data: bytes) -> object:
    """What a front-end process reads from a peer (fed in two chunks): frames and the
    request or response each describes; nothing but FrameError."""
    def parse() -> list[object]:
        decoder, cut, parsed = wire.FrameDecoder(), len(data) // 3, []
        for chunk in (data[:cut], data[cut:]):
            for header, buffers in decoder.feed(chunk):
                if header.get("k") == "infer":
                    parsed.append(wire.request_from_wire(header, buffers))
                else:
                    parsed.append(wire.response_from_wire(header.get("r"), buffers))  # type: ignore[arg-type]
        return parsed
    return _allowed("peer_frames", data, parse, (wire.FrameError,))


# --------------------------------------------------------------------------- seeds

def _seeds() -> dict[str, list[bytes]]:
    http_json = json.dumps({"id": "r1", "parameters": {"binary_data_output": True},
                            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2],
                                        "data": [[1.0, 2.0], [3.0, 4.0]]},
                                       {"name": "T", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]},
                                       {"name": "S", "datatype": "INT32", "shape": [1],
                                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}],
                            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [3],
                                     "parameters": {"binary_data_size": 3}}]}).encode()
    infer = pb.ModelInferRequest(model_name="m", model_version="1", id="x")
    infer.parameters["sequence_id"].int64_param = 3
    t = infer.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    t.parameters["binary_data_size"].int64_param = 8
    infer.outputs.add(name="OUTPUT0")
    infer.raw_input_contents.append(b"\x00" * 8)
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="T", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hey")
    typed.inputs.add(name="I", datatype="INT32", shape=[2]).contents.int_contents.extend([1, -2])
    big = pb.ModelInferRequest(model_name="m")
    big.inputs.add(name="INPUT0", datatype="UINT8", shape=[70000])
    big.raw_input_contents.append(bytes(70000))  # past the size where raw inputs are split off as views
    load = pb.RepositoryModelLoadRequest(model_name="m")
    load.parameters["config"].string_param = '{"backend": "python"}'
    load.parameters["file:1/model.py"].bytes_param = b"pass"
    pbtxt = (b'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
             b'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
             b'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]\n'
             b'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
             b'dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100 }\n'
             b'parameters { key: "k" value: { string_value: "v" } }\n')
    m = protocol_py
    inputs = [("INPUT0", "FP32", [1, 16], 0, 3, 128, 64), ("TEXT", "BYTES", [2], 1, 7, 0, 12)]
    outputs = [("OUTPUT0", 0, 0, 0, 0), ("OUTPUT1", 1, 9, 64, 4096)]
    responses = [{"outputs": [["OUTPUT0", "FP32", [1, 16], [4, 0, 64]],
                              ["OUTPUT1", "BYTES", [2], protocol_py.RegionDesc((9, 64, 20))]]},
                 {"error": {"code": "INVALID_ARG", "message": "bad"}}, {"decoupled": True}]
    frames = [bytes(f) for f in (
        m.encode_infer(7, "add_sub/1#3", 2, [("req-1", {"p": 1}, inputs, outputs), ("", {}, inputs[:1], [])],
                       [(1, 64, 128)]),
        m.encode_reply(8, responses, (1, 2, 3)), m.encode_stream(9, 4, True, None),
        m.encode_stream(9, 5, False, responses[0]), m.encode_fail(10, {"code": "INTERNAL", "message": "boom"}),
        m.encode_free([(1, 0, 64)]), m.encode_ping(11), m.encode_pong(11),
        m.encode_control(12, {"op": "load", "config": {"a": [1, 2]}}, [(3, 64, 64)]))]
    request = InferRequest("m", "1", "r", {"n": 1, "x": float("inf")},
                           [InputTensor("A", "FP32", [2], bytes(8), {"p": True}), InputTensor("B", "INT8", [0])],
                           [RequestedOutput("O", {"binary_data": True})])
    response = InferResponse("m", "1", "r", {}, [OutputTensor("O", "BYTES", [1], b"\x01\x00\x00\x00z"),
                                                 OutputTensor("S", "FP32", [4], b"", {}, True, 16)])
    fields, buffers = wire.request_to_wire(request)
    peer = [b"".join(wire.encode_frame({"k": "infer", "i": 1, **fields}, buffers))]
    fields, buffers = wire.response_to_wire(response)
    peer.append(b"".join(wire.encode_frame({"k": "item", "i": 1, "f": True, "r": fields}, buffers)))
    return {
        "http_infer": [struct.pack("<i", -1) + http_json, struct.pack("<i", len(header)) + header + b"abc"],
        "grpc_infer": [infer.SerializeToString(), typed.SerializeToString(), big.SerializeToString()],
        "grpc_messages": [bytes([0]) + infer.SerializeToString(), bytes([1]) + load.SerializeToString()],
        "bytes_tensor": [bytes([3]) + codec_py.serialize_bytes([b"a", b"", b"xyz"]), bytes([0])],
        "config_pbtxt": [pbtxt],
        "config_json": [json.dumps(mcfg.config_to_json(mcfg.parse_pbtxt(pbtxt.decode()))).encode(),
                        base64.b64decode(b"eyJiYWNrZW5kIjogInB5dGhvbiJ9")],
        "worker_frames": frames,
        "peer_frames": peer,
    }


TARGETS: dict[str, Callable[[bytes], None]] = {
    "http_infer": http_infer, "grpc_infer": grpc_infer, "grpc_messages": grpc_messages,
    "bytes_tensor": bytes_tensor, "config_pbtxt": config_pbtxt, "config_json": config_json,
    "worker_frames": worker_frames, "peer_frames": peer_frames,
}
SEEDS = _seeds()


# --------------------------------------------------------------------------- mutation

_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80",
                b"[", b"{", b'"', b"\\", b"-1", b"1e308", b"\xc3\x28", b"\x0a\xff\xff\xff\xff\x0f"]


def mutate(data: bytes, rng) -> bytes:
    """One to four random edits of ``data`` (``rng``: a ``random.Random``): bit flips, byte
    overwrites, insertions of interesting values, deletions, truncation, duplicated spans,
    or the tail of another position spliced in."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        pos = rng.randint(0, len(out))
        if kind == 0 and out:
            i = min(pos, len(out) - 1)
            out[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif kind == 2:
            out[pos:pos] = rng.choice(_INTERESTING)
        elif kind == 3:
            del out[pos:pos + rng.randint(1, 16)]
        elif kind == 4:
            del out[pos:]
        elif kind == 5:
            span = out[pos:pos + rng.randint(1, 64)]
            out[pos:pos] = span * rng.randint(1, 8)
        else:
            other = rng.randint(0, len(out))
            out[pos:] = out[other:other + rng.randint(0, 256)] + out[pos:]
    return bytes(out)
