"""Running batches on a model instance, inside the worker.

A batch arrives as one ``infer`` message listing its requests. For backends that take a
batch as one tensor (ONNX Runtime), a batch of several requests runs as one execution
(``joined.JoinedBatches``: their input rows joined, their outputs split back). Python
models get the list of requests, as Triton's python backend gives it, each request's
inputs decoded and its outputs encoded here.
"""
from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import traceback
from sys import getrefcount
from typing import Any

import numpy as np

from ..backends.base import Backend, ModelContext, ModelInstance, WorkerRequest, WorkerResponse
from ..core.data.datatypes import config_to_wire
from ..errors import Internal, InvalidArgument, NotFound, TritonShmError
from ..ipc.arena import Block
from ..ipc.protocol import RegionDesc
from . import assembler
from .cuda import DeviceSpan
from .host import Host
from .joined import JoinedBatches, device_span, uniform
from .memory import WorkerMemory
from .tensors import (
    Reshapes, decode_device_input, decode_input, encode_output, encode_output_into, write_device_output)

log = logging.getLogger("triton_shm.worker")
_clock = time.perf_counter_ns  # the compute timings of each batch


def _error(e: BaseException, model: str) -> dict[str, Any]:
    if isinstance(e, TritonShmError):
        return {"error": e.to_wire()}
    log.error("model '%s' failed:\n%s", model, traceback.format_exc())
    return {"error": Internal(f"model '{model}' failed: {type(e).__name__}: {e}").to_wire()}


class LoadedModel:
    """A model as its runners see it: what it outputs, how it batches, how it reads inputs."""

    def __init__(self, context: ModelContext, backend: Backend):
        self.context, self.backend = context, backend
        self.runners: list[InstanceRunner] = []
        self.output_types = {o["name"]: config_to_wire(o["data_type"]) for o in context.config.get("output", [])}
        # sequence batching's implicit state: outputs the front-end asks for beside the
        # client's, which a model may leave out (its state then stays as it was)
        states = (context.config.get("sequence_batching") or {}).get("state") or []
        self.state_outputs = {s["output_name"]: config_to_wire(s.get("data_type", "TYPE_INVALID")) for s in states
                              if s.get("output_name")}
        self.output_types.update(self.state_outputs)
        self.reshapes = Reshapes.from_config(context.config)
        # one model execution over the concatenated rows of a whole batch
        self.concat_batching = backend.concat_batching and int(context.config.get("max_batch_size", 0)) > 0
        self.decoupled = bool((context.config.get("model_transaction_policy") or {}).get("decoupled", False))
        if self.decoupled:
            self.concat_batching = False
        # inputs in a client's system shared memory are lent in place, not copied (a
        # decoupled model may read them after execute returns: it gets copies)
        self.inputs_in_place = backend.reads_inputs_in_place and not self.decoupled


class InstanceRunner:
    """A model instance and the thread that feeds it batches (unless the control thread
    runs the batch itself: ``Worker._run_inline``). It reads and writes tensors through
    ``memory`` and answers through ``host``; it never sees the worker."""

    def __init__(self, model: LoadedModel, instance: ModelInstance, name: str, memory: WorkerMemory, host: Host,
                 device_inputs: bool = False):
        self.model, self.instance, self.name = model, instance, name
        self.worker_name = host.name
        # bound methods and maps, looked up once: the per-batch path calls them directly
        self._reply, self._stream_body, self._reply_failed = host.reply, host.stream, host.reply_failed
        self._cancelled = host.cancelled
        self._is_cancelled = host.cancelled.__contains__  # bound once: a request's check is a partial of it
        self._arena, self._regions = memory.arena, memory.regions
        self._free = memory.arena.free_blocks  # one call per batch (a C loop when built)
        self._keep_held, self._view = memory.keep_held, memory.view
        self._arena_view, self._input_bytes = memory.inputs.view, memory.input_bytes
        # CUDA shared-memory inputs reach the instance on its GPU (``Backend.takes_device_inputs``)
        self.device_inputs = device_inputs
        self._joined = JoinedBatches(model, instance, memory, device_inputs)  # a batch run as one execution
        self.queue: queue.SimpleQueue[dict | None] = queue.SimpleQueue()
        self.solo = False      # the control thread may run its batches (set by the worker at load)
        self.lock = threading.Lock()  # held while a batch runs: executions never overlap
        self.dispatched = 0    # batches handed to it (by the ring's reader only)
        self.finished = 0      # batches run (under ``lock``): free when the two are equal
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name=f"instance-{name}", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.queue.put(None)
        deadline = time.monotonic() + timeout
        self.thread.join(timeout=timeout)
        got = self.lock.acquire(timeout=max(0.0, deadline - time.monotonic()))  # an inline batch ends
        self.stopped = True
        if got:
            self.lock.release()
        try:
            self.instance.finalize()
        except Exception:  # a model's finalize must not take the worker down
            log.exception("finalize of instance %s failed", self.name)

    def enqueue(self, msg: dict[str, Any]) -> None:
        """Queue a batch for the instance's thread (not ``Scheduler.submit``: the batch is formed)."""
        self.dispatched += 1
        self.queue.put(msg)

    def run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run one batch (on the instance's thread or the control thread): its reply's body,
        one entry per request, for the caller to send. For a decoupled model the entries
        only say the execution finished: responses travel as ``stream`` messages tagged
        with the message's id and the request's index. Counted finished as it returns: the
        next batch may run (executions never overlap) while this one's reply goes out."""
        with self.lock:
            try:
                model = self.model
                if self.stopped:  # unloaded since the batch was read
                    return {"error": NotFound(f"model '{model.context.name}' is not loaded in worker "
                                              f"'{self.worker_name}'").to_wire()}
                requests = msg["requests"]
                if model.concat_batching and len(requests) > 1 and uniform(requests):
                    try:
                        return self._joined.run(requests)
                    except Exception as e:  # noqa: BLE001 - the whole batch fails alike
                        err = _error(e, model.context.name)
                        return {"responses": [err] * len(requests), "timing": [0, 0, 0]}
                # copies of client shared-memory inputs, freed once the batch has run
                scratch: list[Block] | None = None if model.decoupled else []
                held: list[tuple[np.ndarray, list | Block]] = []  # inputs over memory reused after the batch
                try:
                    return self._run_each(requests, msg["id"], scratch, held)
                finally:  # after _run_each's frame is gone: only a model can still hold an input
                    for entry in held:
                        if getrefcount(entry[0]) > 2:  # more than the tuple and the argument
                            self._keep_held(held, scratch)
                            break
                    if scratch:
                        self._free(scratch)
            finally:
                if self._cancelled and not self.model.decoupled:  # answered: their clients' cancels are done with
                    for i in range(len(msg["requests"])):
                        self._cancelled.discard((msg["id"], i))
                self.finished += 1

    def execute(self, msg: dict[str, Any]) -> None:
        """Run one batch and send its reply."""
        self._reply(msg["id"], self.run(msg))

    def _run(self) -> None:
        """The instance's thread: it ends only when the instance stops, or when a reply
        cannot be sent (``reply_failed``: the worker then ends, unless the front-end has
        gone). Any other failure fails its batch, as on the control thread (``_serve``)."""
        while (msg := self.queue.get()) is not None:
            try:
                try:
                    self.execute(msg)
                except OSError:
                    raise
                except Exception as e:  # noqa: BLE001 - e.g. a reply that cannot be encoded
                    log.exception("batch %d of instance %s failed", msg["id"], self.name)
                    self._reply(msg["id"], {"error": Internal(f"worker error: {e}").to_wire()})
            except OSError as e:  # the reply could not be sent
                self._reply_failed(e)
                return

    # -- one batch -------------------------------------------------------------------------
    def _run_each(self, requests: list[dict[str, Any]], msg_id: int, scratch: list[Block] | None,
                  held: list[tuple[np.ndarray, list | Block]]) -> dict[str, Any]:
        """The requests of a batch as a list (Python models; any batch the assembler cannot join).
        ``held`` gets each input array over memory that is reused once the batch is
        answered, with that memory (``WorkerMemory.keep_held``)."""
        model = self.model
        t0 = _clock()
        decoded: list[WorkerRequest] = []
        live: list[int] = []  # the requests that decoded, in order
        results: list[dict[str, Any] | None] = [None] * len(requests)
        # per request, the client mappings its inputs were lent from (a model that only reads)
        lent: list[list] | None = [[] for _ in requests] if model.inputs_in_place else None
        for i, r in enumerate(requests):
            try:
                wr = self._decode(r, scratch, held, lent[i] if lent is not None else None)
                # the client may go away meanwhile: the model sees it in request.is_cancelled()
                wr.is_cancelled = functools.partial(self._is_cancelled, (msg_id, i))
                if model.decoupled:
                    wr.sender = functools.partial(self._stream, msg_id, i, r)
                decoded.append(wr)
                live.append(i)
            except Exception as e:  # noqa: BLE001 - a request that cannot be decoded fails alone
                results[i] = _error(e, model.context.name)
        t1 = _clock()
        responses: list[WorkerResponse] = []
        if live:
            try:
                responses = self.instance.execute(decoded)
                if len(responses) != len(decoded):
                    raise Internal(f"model '{model.context.name}' returned {len(responses)} responses for "
                                   f"{len(decoded)} requests")
            except Exception as e:  # noqa: BLE001 - whatever the model raised fails its requests
                err = _error(e, model.context.name)
                for i in live:
                    results[i] = err
                live = []
        t2 = _clock()
        for i, response in zip(live, responses):
            try:
                error = response.error
                if error is not None:
                    if getattr(error, "answered", False):  # the model's answer: not a failed execution
                        results[i] = {"error": error.to_wire(), "answered": True}
                        continue
                    raise error
                if model.decoupled:
                    results[i] = {"decoupled": True}
                    continue
                result: dict[str, Any] = {
                    "outputs": self._encode(requests[i], response.outputs, lent=lent[i] if lent else None)}
                if response.parameters:
                    result["parameters"] = response.parameters
                results[i] = result
            except Exception as e:  # noqa: BLE001 - a response that cannot be encoded fails its request
                results[i] = _error(e, model.context.name)
        t3 = _clock()
        return {"responses": results, "timing": [t1 - t0, t2 - t1, t3 - t2]}

    def _decode(self, r: dict[str, Any], scratch: list[Block] | None, held: list[tuple[np.ndarray, list | Block]],
                lent: list | None = None) -> WorkerRequest:
        inputs, datatypes = {}, {}
        reshapes = self.model.reshapes if self.model.reshapes.inputs else None
        arena_view, input_bytes = self._arena_view, self._input_bytes
        for name, datatype, shape, desc in r["inputs"]:
            if reshapes is not None:
                shape = reshapes.input_shape(name, shape)
            # an arena block is read in place; a client region's bytes go through input_bytes
            if type(desc) is not RegionDesc:
                inputs[name] = array = decode_input(datatype, shape, arena_view(desc))
                if datatype != "BYTES":  # a view of the front-end's block, which it reuses after the reply
                    held.append((array, desc))
            else:
                span = device_span(self._regions, desc) if self.device_inputs and datatype != "BYTES" else None
                if span is not None:  # stays on the GPU
                    inputs[name] = decode_device_input(datatype, shape, span, lent is not None)
                    datatypes[name] = datatype
                    continue
                copies = len(scratch) if scratch is not None else 0
                inputs[name] = array = decode_input(datatype, shape, input_bytes(desc, scratch, lent))
                if scratch is not None and len(scratch) > copies and datatype != "BYTES":
                    held.append((array, scratch[-1]))  # a view of our own block, reused after the batch
            datatypes[name] = datatype
        # the message is ours and the backends only read these lists: no copies
        request = WorkerRequest(r.get("request_id", ""), inputs, datatypes, r["outputs"], r.get("parameters") or {})
        if "sequence" in r:
            request.correlation_id, start, end = r["sequence"]
            request.flags = (1 if start else 0) | (2 if end else 0)
        if "trace" in r:
            request.trace = r["trace"]
        return request

    def _stream(self, msg_id: int, index: int, r: dict[str, Any], response: WorkerResponse | None,
                final: bool) -> None:
        """One response of a decoupled model's request, sent as it is produced."""
        body: dict[str, Any] = {"op": "stream", "id": msg_id, "index": index, "final": final}
        if final:
            self._cancelled.discard((msg_id, index))
        if response is not None:
            try:
                if response.error is not None:
                    raise response.error
                body["outputs"] = self._encode(r, response.outputs, partial=True)
                if response.parameters:
                    body["parameters"] = response.parameters
            except Exception as e:  # noqa: BLE001 - a stream response that cannot be encoded ends as an error
                body.update(_error(e, self.model.context.name))
        self._stream_body(body)

    def _encode(self, r: dict[str, Any], outputs: dict[str, Any], partial: bool = False,
                lent: list | None = None) -> list[list[Any]]:
        """``partial``: a decoupled response may carry only some of the requested outputs.
        ``lent``: the client mappings the request's inputs were read from in place; if a
        truncation poisoned one while the model or this encoding read it, the request fails."""
        model = self.model
        specs = model.output_types
        reshapes = model.reshapes if model.reshapes.outputs else None
        names = r["outputs"]
        if partial:
            names = [n for n in names if n in outputs]
        elif model.state_outputs:  # a model may leave its state out: it stays as it was
            names = [n for n in names if n in outputs or n not in model.state_outputs]
        for n in names:
            if n not in outputs:
                raise Internal(f"model '{model.context.name}' did not produce output(s) "
                               f"{[n for n in names if n not in outputs]}")
        in_shm = r.get("shm_outputs")
        arena = self._arena
        encoded: list[list[Any]] = []
        blocks: list[Block] = []
        try:
            for name in names:
                if in_shm and name in in_shm:  # straight into the client's region
                    rid, offset, size = in_shm[name]
                    target = self._regions.view(rid, offset, size)
                    if isinstance(target, DeviceSpan):
                        shape, written = write_device_output(target, name, specs[name], outputs[name])
                    else:
                        shape, written = encode_output_into(target, name, specs[name], outputs[name])
                    if reshapes is not None:
                        shape = reshapes.output_shape(name, shape)
                    encoded.append([name, specs[name], shape, RegionDesc((rid, offset, written))])
                    continue
                shape, block = encode_output(arena, name, specs[name], outputs[name])
                blocks.append(block)
                if reshapes is not None:
                    shape = reshapes.output_shape(name, shape)
                encoded.append([name, specs[name], shape, block.descriptor()])
            if lent and any(mapping.poisoned for mapping in lent):
                raise InvalidArgument(assembler.FAULT)
        except BaseException:
            self._free(blocks)
            raise
        return encoded
