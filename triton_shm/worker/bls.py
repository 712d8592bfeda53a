"""BLS: Python models calling other models (``pb_utils.InferenceRequest.exec``).

The call goes to the front-end as a control op on the worker's link and through the
server's own scheduler, so batching applies and any loaded model can be reached.
Tensor bytes never travel in the messages: the request's inputs are written into this
worker's output arena (which the front-end maps), and the front-end writes each
response's outputs into its input arena for this worker. Outputs are copied out before
their blocks are handed back (``release_inputs``).
"""
from __future__ import annotations

import itertools
import json
import queue
import threading
from typing import Any, Iterator

import numpy as np

from ..backends.python import triton_python_backend_utils as pb_utils
from ..ipc.protocol import ControlOp
from .host import Host
from .memory import WorkerMemory
from .tensors import decode_input, encode_output

_PB_CODES = {
    "UNKNOWN": pb_utils.TritonError.UNKNOWN, "INTERNAL": pb_utils.TritonError.INTERNAL,
    "NOT_FOUND": pb_utils.TritonError.NOT_FOUND, "INVALID_ARG": pb_utils.TritonError.INVALID_ARG,
    "UNAVAILABLE": pb_utils.TritonError.UNAVAILABLE, "UNSUPPORTED": pb_utils.TritonError.UNSUPPORTED,
    "ALREADY_EXISTS": pb_utils.TritonError.ALREADY_EXISTS, "CANCELLED": pb_utils.TritonError.CANCELLED,
}


class BlsClient:
    """Writes a call's inputs into ``memory``'s output arena, sends the call through
    ``host`` and waits for ``deliver``; ``host.need_reader`` makes sure someone reads the
    ring meanwhile (the caller may be running on the ring's reader: ``Worker._run_inline``)."""

    def __init__(self, memory: WorkerMemory, host: Host):
        self.memory, self._send, self._need_reader = memory, host.send, host.need_reader
        self._ids = itertools.count(1)
        self._waiters: dict[int, queue.SimpleQueue] = {}
        self._lock = threading.Lock()

    # called on the control thread
    def deliver(self, msg: dict[str, Any]) -> None:
        waiter = self._waiters.get(msg.get("bid", 0))
        if waiter is not None:
            waiter.put(msg)

    def fail_all(self, message: str) -> None:
        for waiter in list(self._waiters.values()):
            waiter.put({"error": {"code": "UNAVAILABLE", "message": message}, "final": True})

    # called on model threads
    def infer(self, request: "pb_utils.InferenceRequest", decoupled: bool,
              timeout: float | None) -> "ResponseIterator":
        """The call's responses; ``cancel()`` on them cancels the call (Triton's
        ``response_iterator.cancel()``)."""
        bid = next(self._ids)
        return ResponseIterator(self._call(bid, request, timeout),
                                lambda: self._send({"op": ControlOp.BLS_CANCEL, "bid": bid}, None))

    def _call(self, bid: int, request: "pb_utils.InferenceRequest",
              timeout: float | None) -> Iterator["pb_utils.InferenceResponse"]:
        waiter: queue.SimpleQueue = queue.SimpleQueue()
        blocks = []
        try:
            inputs = []
            for t in request.inputs():
                datatype = pb_utils._ENUM_TO_WIRE[t.triton_dtype()]
                shape, block = encode_output(self.memory.arena, t.name(), datatype,
                                             t.as_numpy() if t.is_cpu() else t.device_array())
                blocks.append(block)
                inputs.append([t.name(), datatype, shape, block.descriptor()])
            version = request._model_version
            parameters = json.loads(request.parameters())
            if request.correlation_id():  # a call into a sequence model: its sequence parameters
                flags = request.flags()
                parameters.update(sequence_id=request.correlation_id(),
                                  sequence_start=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                                  sequence_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END))
            self._waiters[bid] = waiter
            call = {"op": ControlOp.BLS, "bid": bid, "model": request.model_name(),
                    "version": str(version) if version and version > 0 else "", "request_id": request.request_id(),
                    "inputs": inputs, "outputs": list(request._requested_output_names), "parameters": parameters}
            if request._trace._trace_id:  # trace=request.trace() of a traced request: a child of its trace
                call["trace"] = request._trace._trace_id
            self._send(call, None)
            self._need_reader()  # the caller may be running on the ring's reader
            while True:
                try:
                    msg = waiter.get(timeout=timeout)
                except queue.Empty:
                    yield pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"BLS request to model '{request.model_name()}' timed out", pb_utils.TritonError.UNAVAILABLE))
                    return
                response = self._response(msg)
                if response is not None:
                    yield response
                if msg.get("final", True):
                    return
        finally:
            self._waiters.pop(bid, None)
            for b in blocks:
                self.memory.arena.free(b.segment.id, b.offset, b.size)

    def _response(self, msg: dict[str, Any]) -> "pb_utils.InferenceResponse | None":
        if "error" in msg:
            err = msg["error"]
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                str(err.get("message", "")), _PB_CODES.get(err.get("code"), pb_utils.TritonError.INTERNAL)))
        outputs = msg.get("outputs")
        if outputs is None:
            return None
        tensors, staged = [], []
        try:
            for name, datatype, shape, desc in outputs:
                staged.append(desc)
                array = decode_input(datatype, shape, self.memory.inputs.view(desc))  # staged in our input arena
                array = array.copy() if array.dtype != np.object_ else array  # the block goes back below
                code = pb_utils._WIRE_TO_ENUM[datatype]
                tensors.append(pb_utils.Tensor(name, array, code if datatype in ("BF16", "BYTES") else None))
        finally:
            self._send({"op": ControlOp.RELEASE_INPUTS, "blocks": staged}, None)
        response = pb_utils.InferenceResponse(tensors)
        parameters = msg.get("parameters")
        if parameters:  # parameters() is their compact JSON, as Triton gives a BLS response's
            response._params, response._parameters = parameters, pb_utils._compact_json(parameters)
        return response


class ResponseIterator:
    """The responses of a BLS call (``exec(decoupled=True)``), as they come. ``cancel()``
    asks the server to cancel the call: the called model sees ``request.is_cancelled()``;
    the responses it still sends (typically a CANCELLED error) end the iteration as usual."""

    def __init__(self, responses: Iterator["pb_utils.InferenceResponse"], cancel):
        self._responses, self._cancel = responses, cancel
        self._done = False

    def __iter__(self) -> "ResponseIterator":
        return self

    def __next__(self) -> "pb_utils.InferenceResponse":
        try:
            return next(self._responses)
        except StopIteration:
            self._done = True
            raise

    def cancel(self) -> None:
        if not self._done:
            self._cancel()
