"""The wire protocol between the front-end and a worker: every op and field, in one place.

A message is one *frame*: a fixed header, the freed blocks it carries, then a body whose
layout depends on the op. All integers are little-endian; strings are UTF-8 with an
explicit length (no terminator); nothing is padded or aligned. Frames travel as records
of the link's shared-memory rings (``ipc.link``, ``csrc/ring.h``); a frame with file
descriptors travels on the socket instead, its place in the ring kept by an empty record.

Header (``HEADER``, 20 bytes)::

    op      u8    an ``Op``
    flags   u8    0 (reserved)
    _       u16   0 (reserved)
    count   u32   records in the body (requests of INFER, responses of REPLY), else 0
    nfree   u32   FREE records right after the header
    id      u64   message id; a reply carries the id of the message it answers

FREE record (``FREE``, 20 bytes), ``nfree`` of them after the header of any frame the
front-end sends: an output block the worker may reuse::

    segment u32   offset u64   size u64

Ops and their bodies:

``INFER`` (front-end → worker) one batch for one instance::

    instance u32, key_len u16, key          the load key of the model version
    count × request:
        n_inputs u16, n_outputs u16, id_len u16 (at most MAX_ID), params_len u32, sequence u8,
        id, params, then by ``sequence``: SEQ_NUMERIC_ID: correlation ID u64; SEQ_STRING_ID:
        id_len u16 and the correlation ID (UTF-8); else nothing; then if TRACED: trace_id u64,
        context_len u16, context (UTF-8)
            params: a JSON object (the request's model parameters), empty for none
            sequence: 0, or a request of sequence batching: SEQ_NUMERIC_ID or SEQ_STRING_ID
                (exactly one), | SEQ_START, | SEQ_END (what a Python model's
                ``request.correlation_id()`` and ``request.flags()`` return); | TRACED for
                a traced request
            trace_id, context: the request's trace (a BLS call naming it with
                ``trace=request.trace()`` is traced as its child) and its W3C
                ``traceparent`` (OpenTelemetry mode; empty otherwise)
        n_inputs × TENSOR                   the request's inputs
        n_outputs × OUTPUT                  the outputs it asks for, in order

``TENSOR`` (26 bytes, then ``ndim`` × i64 dims, then the name)::

    dtype u8 (index in DATATYPES), ndim u8 (at most MAX_DIMS), place u8 (PLACE_ARENA |
    PLACE_REGION), _ u8, name_len u16, segment u32 (arena segment or client region id),
    offset u64, size u64; dims are i64 and never negative

``OUTPUT`` (23 bytes, then the name)::

    place u8 (PLACE_NONE: into the worker's arena; PLACE_REGION: into a client region),
    name_len u16, region u32, offset u64, size u64 (the room there)

``REPLY`` (worker → front-end) the batch ran::

    compute_input_ns u64, compute_infer_ns u64, compute_output_ns u64
    count × RESPONSE

``RESPONSE``: ``status u8, n u16``, then by status: ``OK``: ``n`` × TENSOR (outputs in
the worker's arena, or written into the client region named by the request);
``ERROR``: one ERROR record; ``DECOUPLED``: nothing (its responses come as STREAM);
``NONE``: nothing (a STREAM that only says "final"); ``PARAMS``: as OK, after the
response's parameters (``u32`` length, a JSON object; a Python model's
``InferenceResponse(parameters=...)``); ``ANSWERED``: as ERROR, an error response the model
returned (Triton's statistics count such a request a success, an execution that failed a
failure).

``ERROR`` record: ``code_len u16, message_len u32, code, message`` (an ``ErrorCode``).

``FAIL`` (worker → front-end) the message as a whole failed: one ERROR record.

``STREAM`` (worker → front-end) one response of a decoupled request:
``index u32, final u8``, then one RESPONSE.

``FREE`` (front-end → worker) only FREE records. ``PING``/``PONG``: empty; a PONG
answers a PING with its id.

``CONTROL`` (both ways) the rare ops: a JSON object whose ``op`` names it, a ``ControlOp``
(each member says who sends it; the reply to a control op is a CONTROL frame with the same
id, or a FAIL). File descriptors ride along
on the socket (``SCM_RIGHTS``), which is why fd-carrying ops are CONTROL frames and
always travel on the socket.

Neither side trusts the other: ``decode`` checks every length against the frame, every
enum value and every count, and raises ``ProtocolError`` (INTERNAL) naming the message id
when the header was legible, so the caller can fail exactly that message. Descriptors
are checked against the mapped segments by their user (``SegmentMap.view``).

``decode`` gives a TENSOR record as ``[name, datatype, shape, desc]``, ``desc`` where its
bytes are: a ``RegionDesc`` ``(region, offset, size)`` for PLACE_REGION, else an
``ArenaDesc``, the ``[segment, offset, size]`` list every arena block has; an OUTPUT record
into a client region as a ``RegionDesc`` in the request's ``shm_outputs``. The encoders take
the same. ``decode`` gives a REPLY's body as ``(responses, timing)``, positional for the front-end
that reads one per request: ``timing`` the three ints, ``responses`` one ``(status,
payload)`` per entry (``Status.OK``: the output records, ``Status.PARAMS``: ``(outputs,
parameters)``, ``Status.ERROR`` / ``ANSWERED``: the error record as a dict,
``Status.DECOUPLED``: None); ``encode_reply`` takes the worker's dicts (``{"outputs": ...[,
"parameters": {...}]}``, ``{"error": ...[, "answered": True]}``, ``{"decoupled": True}``). A
STREAM's body has ``parameters`` beside ``outputs`` where the response has any. Other bodies
are dicts.

The C implementation (``_protocol.pyx``) and its pure-Python twin (``protocol_py.py``)
have the same API and errors; ``_twins`` picks one.
"""
from __future__ import annotations

from .._twins import pick
from .protocol_py import (  # noqa: F401
    DATATYPES, HEADER_SIZE, MAX_DIMS, MAX_ID, PLACE_ARENA, PLACE_NONE, PLACE_REGION, SEQ_END, SEQ_NUMERIC_ID,
    SEQ_START, SEQ_STRING_ID, TRACED, ArenaDesc, ControlOp, Desc, Message, Op, ProtocolError, RegionDesc, Status,
    decode, encode_control, encode_fail, encode_free, encode_infer, encode_ping, encode_pong, encode_reply,
    encode_stream)

USING_EXTENSION = pick(globals(), "._protocol", "decode", "encode_control", "encode_fail", "encode_free",
                       "encode_infer", "encode_ping", "encode_pong", "encode_reply", "encode_stream")

__all__ = ["DATATYPES", "HEADER_SIZE", "MAX_DIMS", "MAX_ID", "ArenaDesc", "ControlOp", "Desc", "Message", "Op",
           "PLACE_ARENA", "PLACE_NONE", "PLACE_REGION", "ProtocolError", "RegionDesc", "Status", "decode",
           "encode_control", "encode_fail", "encode_free", "encode_infer", "encode_ping", "encode_pong",
           "encode_reply", "encode_stream", "USING_EXTENSION"]
