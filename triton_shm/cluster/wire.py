"""Frames between front-end processes, and the inference types in them: the schema of the
peer link (``cluster.peers``), as ``ipc.protocol`` is the worker link's.

A frame is a JSON header (orjson) and zero or more raw byte buffers, laid out as
``<u32 header_len><u32 n_buffers><u64 len>*n_buffers``, the header, then the buffers. No
pickle: a peer can only send data. Tensor bytes travel as buffers, never in the JSON. The
peer is another process of the same server (trusted) but its frames are checked
(verified): a frame that breaks the layout or the limits raises ``FrameError``.

The header's fields (``Field``) and kinds (``Kind``) are below, with a function that
writes and one that reads each kind of frame: the caller sends ``call``, ``infer`` and
``cancel``; the owner answers ``reply``, ``item`` and ``refused``.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Iterator, Sequence

import orjson

from ..core.data.types import Buffer, InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from ..core.observability.tracing import Handover
from ..errors import Internal, TritonShmError

MAX_HEADER = 16 << 20        # bytes of a frame's JSON header
MAX_BUFFERS = 1 << 16        # buffers in one frame (a request's inputs, a response's outputs)
MAX_FRAME = 1 << 36          # bytes of a whole frame: far above any request the protocols accept
SMALL_FRAME = 64 << 10       # a frame up to this is joined into one piece (one copy, cheaper than a list)
_PREFIX = struct.Struct("<II")
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # a backend's shape may hold numpy integers

Frame = tuple[dict[str, Any], list[Buffer]]


class FrameError(ValueError):
    """A peer sent bytes that are not a frame (the connection can not be read further)."""


def _nbytes(buffer: Buffer) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def encode_frame(header: dict[str, Any], buffers: Sequence[Buffer] = ()) -> list[Buffer]:
    """The pieces of one frame, for ``transport.writelines``: a small frame is one piece, a
    large one keeps its buffers as they are (no copy of big tensors here). Raises
    FrameError for a frame beyond what a peer accepts, TypeError for a header JSON can not
    carry."""
    head = orjson.dumps(header, option=_JSON_OPTIONS)
    sizes = [_nbytes(b) for b in buffers]
    if len(head) > MAX_HEADER or len(sizes) > MAX_BUFFERS or sum(sizes) > MAX_FRAME:  # the peer would refuse it
        raise FrameError(f"a frame of a {len(head)}-byte header and {len(sizes)} buffers of {sum(sizes)} bytes "
                         f"exceeds the peer limits ({MAX_HEADER}, {MAX_BUFFERS}, {MAX_FRAME})")
    prefix = _PREFIX.pack(len(head), len(sizes)) + (struct.pack(f"<{len(sizes)}Q", *sizes) if sizes else b"")
    if sum(sizes) <= SMALL_FRAME:
        return [b"".join((prefix, head, *buffers))]
    return [prefix + head, *buffers]


class FrameDecoder:
    """Frames out of a byte stream, fed the chunks ``data_received`` gets (bytes: they are
    kept, not copied). Buffers are memoryviews of the received bytes or of a big frame's
    own storage, never written again, so they stay valid as long as they are held."""

    # a frame with more than this still to come gathers its chunks and joins them once
    # (one copy per byte, memory as it arrives: a size declared, not sent, costs nothing)
    # instead of joining the pending bytes to each chunk
    BIG = 256 << 10

    def __init__(self) -> None:
        self._pending = b""                 # the start of a frame not complete yet
        self._chunks: list[Buffer] = []     # a big frame's header and buffers as they came
        self._missing = 0                   # ... and how many bytes of it are still to come
        self._layout: tuple[int, list[int]] = (0, [])

    def feed(self, data: Buffer) -> Iterator[Frame]:
        if self._missing:
            if len(data) < self._missing:
                self._chunks.append(data)
                self._missing -= len(data)
                return
            view = memoryview(data)
            self._chunks.append(view[:self._missing])
            data = view[self._missing:]
            self._missing = 0
            storage, self._chunks = b"".join(self._chunks), []
            yield _frame(memoryview(storage), 0, *self._layout)
        if self._pending:
            data = self._pending + data
            self._pending = b""
        view = memoryview(data)
        end = len(view)
        at = 0
        while end - at >= 8:
            header_len, count = _PREFIX.unpack_from(view, at)
            if header_len > MAX_HEADER:
                raise FrameError(f"peer frame header of {header_len} bytes exceeds the limit of {MAX_HEADER}")
            if count > MAX_BUFFERS:
                raise FrameError(f"peer frame of {count} buffers exceeds the limit of {MAX_BUFFERS}")
            body = at + 8 + 8 * count
            if body > end:
                break
            sizes = list(struct.unpack_from(f"<{count}Q", view, at + 8)) if count else []
            total = header_len + sum(sizes)
            if total > MAX_FRAME:
                raise FrameError(f"peer frame of {total} bytes exceeds the limit of {MAX_FRAME}")
            if body + total > end:
                if body + total - end > self.BIG:
                    self._chunks = [view[body:]]
                    self._missing = body + total - end
                    self._layout = (header_len, sizes)
                    return
                break
            yield _frame(view, body, header_len, sizes)
            at = body + total
        if at < end:
            self._pending = bytes(view[at:])


def _frame(view: memoryview, at: int, header_len: int, sizes: list[int]) -> Frame:
    try:
        header = orjson.loads(view[at:at + header_len])
    except orjson.JSONDecodeError as e:
        raise FrameError(f"peer frame header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise FrameError(f"peer frame header is a {type(header).__name__}, not an object")
    at += header_len
    buffers: list[Buffer] = []
    for size in sizes:
        buffers.append(view[at:at + size])
        at += size
    return header, buffers


# Requests and responses: the header's fields by short keys, each tensor's bytes as the
# buffer whose index the tensor names (-1: no data).

def request_to_wire(request: InferRequest) -> tuple[dict[str, Any], list[Buffer]]:
    """The request's header fields and its input buffers, as they are (no copy): the
    caller keeps them alive and unchanged until the request is answered."""
    buffers: list[Buffer] = []
    inputs = []
    for tensor in request.inputs:
        data = tensor.data
        if data is None:
            index = -1
        else:
            index = len(buffers)
            buffers.append(data)
        inputs.append((tensor.name, tensor.datatype, tensor.shape, _json_parameters(tensor.parameters), index))
    header = {"m": request.model_name, "v": request.model_version, "id": request.id,
              "p": _json_parameters(request.parameters), "in": inputs,
              "out": [(o.name, _json_parameters(o.parameters)) for o in request.outputs]}
    return header, buffers


def request_from_wire(header: dict[str, Any], buffers: Sequence[Buffer]) -> InferRequest:
    """The request ``request_to_wire`` described; a header that does not describe one
    raises FrameError."""
    try:
        inputs = [InputTensor(str(name), str(datatype), [int(d) for d in shape], _buffer(buffers, index),
                              _parameters(parameters))
                  for name, datatype, shape, parameters, index in header["in"]]
        outputs = [RequestedOutput(str(name), _parameters(parameters)) for name, parameters in header["out"]]
        return InferRequest(str(header["m"]), str(header["v"]), str(header["id"]), _parameters(header["p"]),
                            inputs, outputs)
    except (KeyError, TypeError, ValueError) as e:
        raise FrameError(f"peer frame does not describe an inference request: {e!r}") from None


def handover_to_wire(handover: Handover) -> dict[str, Any]:
    wire: dict[str, Any] = {"s": handover.start_ns, "lf": handover.log_frequency, "p": handover.parent_id}
    if handover.otel is not None:
        wire["o"] = list(handover.otel)
    return wire


def handover_from_wire(wire: Any) -> Handover:
    """The ``Handover`` ``handover_to_wire`` described; anything else raises FrameError."""
    try:
        otel = wire.get("o")
        if otel is not None and not (isinstance(otel, list) and len(otel) == 2
                                     and all(isinstance(v, str) for v in otel)):
            raise ValueError(f"otel context {otel!r}")
        return Handover(int(wire["s"]), int(wire["lf"]), int(wire["p"]),
                        None if otel is None else (otel[0], otel[1]))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise FrameError(f"peer frame has a bad trace handover: {e!r}") from None


def response_to_wire(response: InferResponse) -> tuple[dict[str, Any], list[Buffer]]:
    """The response's header fields and its output bytes, copied where they are views
    (a worker's arena, freed by ``release()``): the caller may release it at once."""
    buffers: list[Buffer] = []
    outputs = []
    for tensor in response.outputs:
        data = tensor.data
        if _nbytes(data):
            index = len(buffers)
            buffers.append(data if type(data) is bytes else bytes(data))
        else:
            index = -1
        outputs.append((tensor.name, tensor.datatype, tensor.shape, _json_parameters(tensor.parameters),
                        tensor.in_shared_memory, tensor.shm_byte_size, index))
    header = {"m": response.model_name, "v": response.model_version, "id": response.id,
              "p": _json_parameters(response.parameters), "out": outputs}
    return header, buffers


def response_from_wire(header: dict[str, Any], buffers: Sequence[Buffer]) -> InferResponse:
    """The response ``response_to_wire`` described (its ``release()`` has nothing to free:
    the bytes are the frame's); a header that does not describe one raises FrameError."""
    try:
        outputs = [OutputTensor(str(name), str(datatype), [int(d) for d in shape], _buffer(buffers, index) or b"",
                                _parameters(parameters), bool(in_shm), int(shm_size))
                   for name, datatype, shape, parameters, in_shm, shm_size, index in header["out"]]
        return InferResponse(str(header["m"]), str(header["v"]), str(header["id"]), _parameters(header["p"]),
                             outputs)
    except (KeyError, TypeError, ValueError) as e:
        raise FrameError(f"peer frame does not describe an inference response: {e!r}") from None


def _buffer(buffers: Sequence[Buffer], index: Any) -> Buffer | None:
    if index == -1:
        return None
    if type(index) is not int or not 0 <= index < len(buffers):
        raise ValueError(f"buffer index {index!r} of a frame with {len(buffers)} buffers")
    return buffers[index]


def _json_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` as JSON carries them: a float that is not finite (JSON has no NaN or
    infinity; orjson would write null) goes as ``{"float": "inf"}``."""
    for value in parameters.values():
        if type(value) is float and not math.isfinite(value):
            return {k: {"float": repr(v)} if type(v) is float and not math.isfinite(v) else v
                    for k, v in parameters.items()}
    return parameters


def _parameters(parameters: Any) -> dict[str, Any]:
    """The parameters ``_json_parameters`` wrote, their values checked."""
    if not isinstance(parameters, dict):
        raise TypeError(f"parameters are a {type(parameters).__name__}, not an object")
    for key, value in parameters.items():
        if isinstance(value, dict) and isinstance(value.get("float"), str):  # NaN or an infinity
            parameters[key] = float(value["float"])
        elif not isinstance(value, (bool, int, float, str)):
            raise TypeError(f"parameter value {value!r} is not a bool, int, float or string")
    return parameters


# -- the peer link's frames --------------------------------------------------------------

class Field:
    """A frame header's fields, by their keys on the wire."""
    KIND = "k"      # which frame: a ``Kind``
    ID = "i"        # the request it belongs to: a counter per connection, the caller's
    OP = "op"       # call: the operation, run by the owner's handler for it
    BODY = "b"      # call, reply: a JSON object
    ERROR = "e"     # reply, item, refused: a TritonShmError's ``to_wire``
    FINAL = "f"     # item, refused: the request's last frame
    RESPONSE = "r"  # item: ``response_to_wire``'s header (its outputs are the frame's buffers)
    TRACE = "t"     # infer: the caller's trace ``Handover``, when it sampled the request
    # an infer frame also holds ``request_to_wire``'s fields (its inputs are the buffers)


class Kind:
    """A frame's kind (``Field.KIND``)."""
    CALL = "call"        # to the owner: a control op (OP, BODY)
    INFER = "infer"      # to the owner: a request to serve (the request's fields, TRACE)
    CANCEL = "cancel"    # to the owner: the caller went away
    REPLY = "reply"      # back: a call's answer (BODY or ERROR)
    ITEM = "item"        # back: one of a request's responses (FINAL; RESPONSE or ERROR or neither)
    REFUSED = "refused"  # back: the request failed before it ran (ERROR)


Item = InferResponse | TritonShmError | None  # what an ``item`` frame carries


def frame_id(header: dict[str, Any]) -> int:
    rid = header.get(Field.ID)
    if type(rid) is not int:
        raise FrameError(f"a peer frame's request id is {rid!r}, not an integer")
    return rid


def call_frame(rid: int, op: str, body: dict[str, Any]) -> dict[str, Any]:
    return {Field.KIND: Kind.CALL, Field.ID: rid, Field.OP: op, Field.BODY: body}


def read_call(header: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    op, body = header.get(Field.OP), header.get(Field.BODY)
    if not isinstance(op, str) or not isinstance(body, dict):
        raise FrameError("a peer call needs an op (string) and a body (object)")
    return op, body


def infer_frame(rid: int, request: InferRequest, handover: Handover | None
                ) -> tuple[dict[str, Any], list[Buffer]]:
    header, buffers = request_to_wire(request)
    header[Field.KIND], header[Field.ID] = Kind.INFER, rid
    if handover is not None:
        header[Field.TRACE] = handover_to_wire(handover)
    return header, buffers


def read_infer(header: dict[str, Any], buffers: Sequence[Buffer]) -> tuple[InferRequest, Handover | None]:
    request = request_from_wire(header, buffers)
    return request, handover_from_wire(header[Field.TRACE]) if Field.TRACE in header else None


def cancel_frame(rid: int) -> dict[str, Any]:
    return {Field.KIND: Kind.CANCEL, Field.ID: rid}


def reply_frame(rid: int, body: dict[str, Any]) -> dict[str, Any]:
    return {Field.KIND: Kind.REPLY, Field.ID: rid, Field.BODY: body}


def read_reply(header: dict[str, Any]) -> dict[str, Any] | TritonShmError:
    body = error_from_wire(header[Field.ERROR]) if Field.ERROR in header else header.get(Field.BODY)
    if not isinstance(body, (dict, TritonShmError)):
        raise FrameError(f"a reply's body is a {type(body).__name__}, not an object")
    return body


def item_frame(rid: int, item: Item, final: bool) -> tuple[dict[str, Any], list[Buffer]]:
    """An ``item`` frame; a response's bytes are copied out (``response_to_wire``), and it
    is released whatever happens."""
    if item is None:
        return {Field.KIND: Kind.ITEM, Field.ID: rid, Field.FINAL: final}, []
    if isinstance(item, TritonShmError):
        return {Field.KIND: Kind.ITEM, Field.ID: rid, Field.FINAL: final, Field.ERROR: error_to_wire(item)}, []
    try:
        header, buffers = response_to_wire(item)
    finally:
        item.release()  # the bytes are copied out of its arena
    return {Field.KIND: Kind.ITEM, Field.ID: rid, Field.FINAL: final, Field.RESPONSE: header}, buffers


def read_item(header: dict[str, Any], buffers: Sequence[Buffer]) -> tuple[Item, bool]:
    """An ``item`` frame's response (or error, or neither) and whether it is the last."""
    final = header.get(Field.FINAL) is True
    if Field.RESPONSE in header:
        return response_from_wire(header[Field.RESPONSE], buffers), final
    if Field.ERROR in header:
        return error_from_wire(header[Field.ERROR]), final
    return None, final


def error_frame(kind: str, rid: int, error: Exception) -> dict[str, Any]:
    """The last frame of a request (``Kind.REPLY``, ``ITEM`` or ``REFUSED``): ``error``
    (INTERNAL unless it is a TritonShmError)."""
    if not isinstance(error, TritonShmError):
        error = Internal(str(error))
    return {Field.KIND: kind, Field.ID: rid, Field.FINAL: True, Field.ERROR: error_to_wire(error)}


def read_refused(header: dict[str, Any]) -> TritonShmError:
    return error_from_wire(header.get(Field.ERROR))


def error_to_wire(error: TritonShmError) -> dict[str, Any]:
    wire = error.to_wire()
    if not wire["message"].isascii():  # a model's text may hold lone surrogates, which UTF-8 (JSON) can not
        wire["message"] = wire["message"].encode("utf-8", "replace").decode("utf-8")
    return wire


def error_from_wire(wire: Any) -> TritonShmError:
    if not isinstance(wire, dict):
        raise FrameError(f"a peer error is a {type(wire).__name__}, not an object")
    try:
        return TritonShmError.from_wire(wire)
    except ValueError as e:  # an unknown code
        raise FrameError(f"a peer error does not carry a known code: {e}") from None
