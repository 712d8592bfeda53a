"""Pure-Python twin of ``_protocol``: the frames of ``protocol`` (documented there) with
``struct``. Same API, same results, same errors."""
from __future__ import annotations

import enum
import struct
from operator import itemgetter
from typing import Any, NamedTuple, Sequence, Union

import orjson

from ..errors import Internal, InvalidArgument


class Op(enum.IntEnum):
    INFER = 1
    REPLY = 2
    FAIL = 3
    STREAM = 4
    FREE = 5
    PING = 6
    PONG = 7
    CONTROL = 8


class Status(enum.IntEnum):
    OK = 0
    ERROR = 1
    DECOUPLED = 2
    NONE = 3
    PARAMS = 4    # OK, with the response's parameters
    ANSWERED = 5  # ERROR, which the model answered with (statistics count the request a success)


PLACE_NONE = PLACE_ARENA = 0
PLACE_REGION = 1
MAX_DIMS = 64
MAX_ID = 0xFFFF  # bytes of a request id (its length is a u16)
_ID_TOO_LONG = f"request id is longer than {MAX_ID} bytes"
# The ``sequence`` byte of an INFER request: sequence batching's bits (0 for any other
# request), and TRACED for a traced request (its trace follows: see ``protocol``).
SEQ_START, SEQ_END, SEQ_NUMERIC_ID, SEQ_STRING_ID = 1, 2, 4, 8
SEQ_BITS = 0xF
TRACED = 16
# The datatype codes of TENSOR records: index in this tuple. Append only.
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES")
_DTYPE_CODE = {name: i for i, name in enumerate(DATATYPES)}

_HEADER = struct.Struct("<BBHIIQ")
_FREE = struct.Struct("<IQQ")
_INFER = struct.Struct("<IH")
_REQUEST = struct.Struct("<HHHIB")
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_TENSOR = struct.Struct("<BBBBHIQQ")
_OUTPUT = struct.Struct("<BHIQQ")
_TIMING = struct.Struct("<QQQ")
_RESPONSE = struct.Struct("<BH")
_ERROR = struct.Struct("<HI")
_STREAM = struct.Struct("<IB")
_U32 = struct.Struct("<I")
HEADER_SIZE = _HEADER.size
_VALID_OPS = frozenset(int(op) for op in Op)


class RegionDesc(tuple):
    """Where a tensor's bytes lie in a client's shared-memory region: ``(region, offset,
    size)``, ``region`` the id the front-end gave it. A tensor in an arena is described by
    a plain ``[segment, offset, size]`` list instead (``ArenaDesc``, what ``Block.descriptor``
    gives): the common case stays the cheapest to build and to check (``type(desc) is
    RegionDesc``, one pointer compare), and the type alone says where the bytes are."""
    __slots__ = ()
    region = property(itemgetter(0))
    offset = property(itemgetter(1))
    size = property(itemgetter(2))

    def __repr__(self) -> str:
        return f"RegionDesc{tuple.__repr__(self)}"


ArenaDesc = list  # [segment, offset, size]: a block of an arena (``ipc.arena``)
Desc = Union[list, RegionDesc]  # a tensor descriptor: where its bytes are


class ControlOp(str, enum.Enum):
    """The ``op`` of a CONTROL frame (see ``protocol``): who sends it and what it says."""
    SEGMENT = "segment"              # both ways: the sender's new arena segment, its fd attached
    DROP = "drop"                    # both ways: that segment is gone
    REGION = "region"                # to the worker: a client system region, its fd attached
    CUDA_REGION = "cuda_region"      # to the worker: a client CUDA region by IPC handle (answered once open)
    REGION_DROP = "region_drop"      # to the worker: a client region unregistered
    CANCEL = "cancel"                # to the worker: a request of a batch was cancelled
    BLS_REPLY = "bls_reply"          # to the worker: the answer to a model's BLS request
    IS_READY = "is_ready"            # to the worker: a model instance's own readiness (answered)
    AUTO_COMPLETE = "auto_complete"  # to the worker: a model's auto-completed config (answered)
    LOAD = "load"                    # to the worker: load a model version (answered)
    UNLOAD = "unload"                # to the worker: unload one (answered)
    HELLO = "hello"                  # to the front-end: the worker is up
    REPLY = "reply"                  # to the front-end: the answer to a control op
    BLS = "bls"                      # to the front-end: a model's inference request (BLS)
    BLS_CANCEL = "bls_cancel"        # to the front-end: the model gave up on that request
    KEEP_INPUTS = "keep_inputs"      # to the front-end: input blocks a model holds past its reply
    RELEASE_INPUTS = "release_inputs"  # to the front-end: kept inputs it has let go


class ProtocolError(Internal):
    """A frame that breaks the protocol; ``msg_id`` is its id when the header was legible."""

    def __init__(self, message: str, msg_id: int | None = None):
        super().__init__(message)
        self.msg_id = msg_id


class Message(NamedTuple):
    op: int
    id: int
    frees: list[tuple[int, int, int]]
    body: Any


# -- encoding --------------------------------------------------------------------------------
def _utf8(s: str) -> bytes:
    return s.encode("utf-8")


def _start(op: int, msg_id: int, count: int, frees: Sequence[Sequence[int]]) -> bytearray:
    out = bytearray(_HEADER.pack(op, 0, 0, count, len(frees), msg_id))
    for seg, offset, size in frees:
        out += _FREE.pack(seg, offset, size)
    return out


def _tensor(out: bytearray, name: str, datatype: str, shape: Sequence[int], place: int, seg: int, offset: int,
            size: int) -> None:
    b = _utf8(name)
    if len(shape) > MAX_DIMS:
        raise Internal(f"tensor '{name}' has more than {MAX_DIMS} dimensions")
    out += _TENSOR.pack(_DTYPE_CODE[datatype], len(shape), place, 0, len(b), seg, offset, size)
    out += struct.pack(f"<{len(shape)}q", *shape)
    out += b


def _error(out: bytearray, error: dict) -> None:
    code, message = _utf8(str(error.get("code", "INTERNAL"))), _utf8(str(error.get("message", "")))
    out += _ERROR.pack(len(code), len(message))
    out += code
    out += message


def _desc(desc: Desc) -> tuple[int, int, int, int]:
    """(place, segment, offset, size) of an ``ArenaDesc`` or a ``RegionDesc``."""
    if type(desc) is RegionDesc:
        return PLACE_REGION, desc[0], desc[1], desc[2]
    return PLACE_ARENA, desc[0], desc[1], desc[2]


def _response(out: bytearray, response: dict | None) -> None:
    if response is None:
        out += _RESPONSE.pack(Status.NONE, 0)
    elif "error" in response:
        out += _RESPONSE.pack(Status.ANSWERED if response.get("answered") else Status.ERROR, 0)
        _error(out, response["error"])
    elif "outputs" in response:
        outputs = response["outputs"]
        parameters = response.get("parameters")
        if parameters:
            out += _RESPONSE.pack(Status.PARAMS, len(outputs))
            pb = orjson.dumps(parameters)
            out += _U32.pack(len(pb))
            out += pb
        else:
            out += _RESPONSE.pack(Status.OK, len(outputs))
        for name, datatype, shape, desc in outputs:
            _tensor(out, name, datatype, shape, *_desc(desc))
    else:
        out += _RESPONSE.pack(Status.DECOUPLED if response.get("decoupled") else Status.NONE, 0)


def encode_infer(msg_id: int, key: str, instance: int, requests: Sequence[tuple],
                 frees: Sequence[Sequence[int]] = ()) -> bytearray:
    """``requests``: ``(request_id, parameters, inputs, outputs[, sequence[, trace]])`` each,
    with inputs as ``(name, datatype, shape, place, segment, offset, size)``, outputs as
    ``(name, place, region, offset, size)`` or just the name (``PLACE_NONE``), ``sequence``
    None or ``(correlation ID (int or str), start, end)`` and ``trace`` None or ``(trace id,
    context)``."""
    out = _start(Op.INFER, msg_id, len(requests), frees)
    kb = _utf8(key)
    out += _INFER.pack(instance, len(kb))
    out += kb
    for request in requests:
        request_id, parameters, inputs, outputs = request[:4]
        sequence = request[4] if len(request) > 4 else None
        trace = request[5] if len(request) > 5 else None
        rb = _utf8(request_id)
        if len(rb) > MAX_ID:
            raise InvalidArgument(_ID_TOO_LONG)
        pb = orjson.dumps(parameters) if parameters else b""
        seq = 0
        if sequence is not None:
            corrid, start, end = sequence
            seq = (SEQ_STRING_ID if isinstance(corrid, str) else SEQ_NUMERIC_ID) | (SEQ_START if start else 0) \
                | (SEQ_END if end else 0)
        if trace is not None:
            seq |= TRACED
        out += _REQUEST.pack(len(inputs), len(outputs), len(rb), len(pb), seq)
        out += rb
        out += pb
        if seq & SEQ_NUMERIC_ID:
            out += _U64.pack(corrid)
        elif seq & SEQ_STRING_ID:
            cb = _utf8(corrid)
            out += _U16.pack(len(cb))
            out += cb
        if trace is not None:
            trace_id, context = trace
            tb = _utf8(context)
            out += _U64.pack(trace_id)
            out += _U16.pack(len(tb))
            out += tb
        for t in inputs:
            _tensor(out, *t)
        for o in outputs:
            if type(o) is str:  # the common case: into the worker's arena
                nb = _utf8(o)
                out += _OUTPUT.pack(PLACE_NONE, len(nb), 0, 0, 0)
            else:
                name, place, region, offset, size = o
                nb = _utf8(name)
                out += _OUTPUT.pack(place, len(nb), region, offset, size)
            out += nb
    return out


def encode_reply(msg_id: int, responses: Sequence[dict], timing: Sequence[int]) -> bytearray:
    out = _start(Op.REPLY, msg_id, len(responses), ())
    out += _TIMING.pack(*timing)
    for r in responses:
        _response(out, r)
    return out


def encode_stream(msg_id: int, index: int, final: bool, response: dict | None) -> bytearray:
    out = _start(Op.STREAM, msg_id, 1, ())
    out += _STREAM.pack(index, 1 if final else 0)
    _response(out, response)
    return out


def encode_fail(msg_id: int, error: dict) -> bytearray:
    out = _start(Op.FAIL, msg_id, 0, ())
    _error(out, error)
    return out


def encode_control(msg_id: int, message: dict, frees: Sequence[Sequence[int]] = ()) -> bytearray:
    out = _start(Op.CONTROL, msg_id, 0, frees)
    out += orjson.dumps(message)
    return out


def encode_free(frees: Sequence[Sequence[int]]) -> bytearray:
    return _start(Op.FREE, 0, 0, frees)


def encode_ping(msg_id: int, frees: Sequence[Sequence[int]] = ()) -> bytearray:
    return _start(Op.PING, msg_id, 0, frees)


def encode_pong(msg_id: int) -> bytearray:
    return _start(Op.PONG, msg_id, 0, ())


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    __slots__ = ("buf", "pos", "msg_id")

    def __init__(self, buf: memoryview, pos: int, msg_id: int):
        self.buf, self.pos, self.msg_id = buf, pos, msg_id

    def fail(self, what: str) -> ProtocolError:
        return ProtocolError(f"malformed message from peer: {what}", self.msg_id)

    def unpack(self, s: struct.Struct) -> tuple:
        if self.pos + s.size > len(self.buf):
            raise self.fail("truncated record")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise self.fail("truncated record")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def text(self, n: int) -> str:
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid UTF-8") from None

    def json(self, n: int) -> Any:
        try:
            return orjson.loads(self.take(n))
        except orjson.JSONDecodeError:
            raise self.fail("invalid JSON") from None

    def tensor(self) -> list:
        dtype, ndim, place, _, name_len, seg, offset, size = self.unpack(_TENSOR)
        if dtype >= len(DATATYPES) or ndim > MAX_DIMS or place > PLACE_REGION:
            raise self.fail("bad tensor record")
        if self.pos + 8 * ndim > len(self.buf):
            raise self.fail("truncated record")
        shape = list(struct.unpack_from(f"<{ndim}q", self.buf, self.pos)) if ndim else []
        self.pos += 8 * ndim
        if any(d < 0 for d in shape):
            raise self.fail("negative dimension")
        name = self.text(name_len)
        desc = RegionDesc((seg, offset, size)) if place == PLACE_REGION else [seg, offset, size]
        return [name, DATATYPES[dtype], shape, desc]

    def error(self) -> dict:
        code_len, message_len = self.unpack(_ERROR)
        return {"code": self.text(code_len), "message": self.text(message_len)}

    def response(self) -> tuple[Status, Any]:
        """``(status, payload)``: the output records (OK), ``(outputs, parameters)`` (PARAMS),
        the error record (ERROR, ANSWERED), else None."""
        status, n = self.unpack(_RESPONSE)
        if status == Status.OK:
            return Status.OK, [self.tensor() for _ in range(n)]
        if status == Status.PARAMS:
            (size,) = self.unpack(_U32)
            parameters = self.json(size)
            if not isinstance(parameters, dict):
                raise self.fail("response parameters are not an object")
            return Status.PARAMS, ([self.tensor() for _ in range(n)], parameters)
        if n:
            raise self.fail("response without outputs has an output count")
        if status == Status.ERROR:
            return Status.ERROR, self.error()
        if status == Status.ANSWERED:
            return Status.ANSWERED, self.error()
        if status == Status.DECOUPLED:
            return Status.DECOUPLED, None
        if status == Status.NONE:
            return Status.NONE, None
        raise self.fail(f"unknown response status {status}")

    def request(self) -> dict:
        n_inputs, n_outputs, id_len, params_len, seq = self.unpack(_REQUEST)
        if seq & ~(SEQ_BITS | TRACED) or (seq & SEQ_BITS and bool(seq & SEQ_NUMERIC_ID) == bool(seq & SEQ_STRING_ID)):
            raise self.fail("bad sequence flags")
        request_id = self.text(id_len)
        params = self.json(params_len) if params_len else {}
        if not isinstance(params, dict):
            raise self.fail("parameters are not an object")
        corrid: int | str = 0
        if seq & SEQ_NUMERIC_ID:
            (corrid,) = self.unpack(_U64)
        elif seq & SEQ_STRING_ID:
            corrid = self.text(self.unpack(_U16)[0])
        trace = None
        if seq & TRACED:
            (trace_id,) = self.unpack(_U64)
            trace = [trace_id, self.text(self.unpack(_U16)[0])]
        inputs = [self.tensor() for _ in range(n_inputs)]
        outputs, shm_outputs = [], {}
        for _ in range(n_outputs):
            place, name_len, region, offset, size = self.unpack(_OUTPUT)
            name = self.text(name_len)
            if place == PLACE_REGION:
                shm_outputs[name] = RegionDesc((region, offset, size))
            elif place != PLACE_NONE:
                raise self.fail("bad output record")
            outputs.append(name)
        request: dict[str, Any] = {"request_id": request_id, "inputs": inputs, "outputs": outputs,
                                   "shm_outputs": shm_outputs, "parameters": params}
        if seq & SEQ_BITS:
            request["sequence"] = [corrid, bool(seq & SEQ_START), bool(seq & SEQ_END)]
        if trace is not None:
            request["trace"] = trace
        return request


def decode(data: bytes | bytearray | memoryview) -> Message:
    """One frame from the other process, fully checked (see ``protocol``)."""
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    if len(buf) < HEADER_SIZE:
        raise ProtocolError("malformed message from peer: truncated header")
    op, flags, reserved, count, nfree, msg_id = _HEADER.unpack_from(buf, 0)
    r = _Reader(buf, HEADER_SIZE, msg_id)
    if op not in _VALID_OPS:
        raise r.fail(f"unknown op {op}")
    if flags or reserved:
        raise r.fail("reserved header bits set")
    if nfree * _FREE.size > len(buf) - HEADER_SIZE:
        raise r.fail("truncated record")
    frees = [_FREE.unpack_from(buf, HEADER_SIZE + i * _FREE.size) for i in range(nfree)]
    r.pos += nfree * _FREE.size
    body: Any = None
    if op == Op.INFER:
        instance, key_len = r.unpack(_INFER)
        key = r.text(key_len)
        body = {"model": key, "instance": instance, "requests": [r.request() for _ in range(count)]}
    elif op == Op.REPLY:
        timing = r.unpack(_TIMING)
        responses = [r.response() for _ in range(count)]
        body = (responses, timing)
        if any(status is Status.NONE for status, _ in responses):
            raise r.fail("reply entry without a status")
    elif op == Op.STREAM:
        index, final = r.unpack(_STREAM)
        body = {"index": index, "final": bool(final)}
        status, payload = r.response()
        if status is Status.OK:
            body["outputs"] = payload
        elif status is Status.PARAMS:
            body["outputs"], body["parameters"] = payload
        elif status is Status.ERROR or status is Status.ANSWERED:
            body["error"] = payload
        elif status is Status.DECOUPLED:
            body["decoupled"] = True
    elif op == Op.FAIL:
        body = {"error": r.error()}
    elif op == Op.CONTROL:
        body = r.json(len(buf) - r.pos)
        if not isinstance(body, dict) or not isinstance(body.get("op"), str):
            raise r.fail("control message is not an object with an op")
    if r.pos != len(buf):
        raise r.fail("trailing bytes")
    return Message(Op(op), msg_id, frees, body)
