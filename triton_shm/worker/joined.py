"""A batch whose requests run as one model execution (backends that take a batch as one
tensor, ``Backend.concat_batching``: ONNX Runtime, TensorRT, PyTorch): each input's rows
are joined into one buffer by the batch assembler (on the GPU when some lie in CUDA shared
memory), the model runs once, and each output is split back into per-request blocks of
the output arena or the client's shared-memory slices. ``InstanceRunner`` uses it for any
batch of more than one request that ``uniform`` accepts."""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.base import ModelInstance, WorkerRequest
from ..core.data import codec
from ..core.data.datatypes import element_size, from_numpy, numpy_dtype
from ..errors import Internal, InvalidArgument
from ..ipc.arena import Block
from ..ipc.protocol import Desc, RegionDesc
from . import assembler
from .assembler_py import RegionSpan
from .cuda import DeviceSpan, as_cupy, gather_device, is_device_array
from .memory import WorkerMemory
from .regions import RegionMap
from .tensors import decode_input, encode_output, encode_output_into, wire_bytes

if TYPE_CHECKING:
    from .execution import LoadedModel

_clock = time.perf_counter_ns  # the compute timings of each batch


def device_span(regions: RegionMap, desc: Desc) -> DeviceSpan | None:
    """Where an input lies in a client's CUDA shared-memory region, its span there."""
    if type(desc) is not RegionDesc:
        return None
    return regions.device_view(int(desc[0]), int(desc[1]), int(desc[2]))


class JoinedBatches:
    """Runs batches of ``model`` on ``instance`` as one execution each, reading and writing
    tensors through ``memory``."""

    def __init__(self, model: "LoadedModel", instance: ModelInstance, memory: WorkerMemory, device_inputs: bool):
        self.model, self.instance, self.device_inputs = model, instance, device_inputs
        self._arena, self._regions = memory.arena, memory.regions
        self._free = memory.arena.free_blocks
        self._view = memory.view

    def run(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """Run ``requests`` (``uniform``) as one execution: the reply's body."""
        t0 = _clock()
        rows = [r["inputs"][0][2][0] for r in requests]
        total = sum(rows)
        inputs, datatypes = {}, {}
        for k, (name, datatype, shape, _) in enumerate(requests[0]["inputs"]):
            descs = [r["inputs"][k][3] for r in requests]
            model_shape = self.model.reshapes.input_shape(name, [total, *shape[1:]])
            datatypes[name] = datatype
            if self.device_inputs and datatype != "BYTES":
                joined = self._gather_on_device(descs)
                if joined is not None:
                    inputs[name] = joined.view(numpy_dtype(datatype)).reshape(model_shape)
                    continue
            views = [self._view(desc) for desc in descs]
            buf = np.empty(sum(v.nbytes for v in views), dtype=np.uint8)
            assembler.gather(buf, views)  # BYTES too: encoded tensors concatenate
            inputs[name] = decode_input(datatype, model_shape, buf.data)
        merged = WorkerRequest(id=requests[0].get("request_id", ""), inputs=inputs, datatypes=datatypes,
                               requested_outputs=list(requests[0]["outputs"]),
                               parameters=requests[0].get("parameters") or {})
        t1 = _clock()
        (response,) = self.instance.execute([merged])
        t2 = _clock()
        if response.error is not None:
            err = {"error": response.error.to_wire()}
            return {"responses": [err] * len(requests), "timing": [t1 - t0, t2 - t1, 0]}
        results: list[dict[str, Any]] = [{"outputs": []} for _ in requests]
        blocks: list[Block] = []
        try:
            for name in requests[0]["outputs"]:
                self._scatter_output(name, response.outputs.get(name), requests, rows, results, blocks)
        except BaseException:
            self._free(blocks)
            raise
        t3 = _clock()
        return {"responses": results, "timing": [t1 - t0, t2 - t1, t3 - t2]}

    def _gather_on_device(self, descs: list[Desc]) -> Any:
        """The rows of one input, joined on the GPU when any of them lies in CUDA shared
        memory (the others copied up once); None when all are on the host."""
        spans = [device_span(self._regions, desc) for desc in descs]
        if not any(spans):
            return None
        pieces: list[DeviceSpan | memoryview] = []
        for desc, span in zip(descs, spans):
            if span is not None:
                pieces.append(span)
                continue
            view = self._view(desc)
            if not isinstance(view, memoryview):  # a system region under the twin: read it out once
                host = np.empty(view.nbytes, dtype=np.uint8)
                assembler.gather(host, [view])
                view = host.data
            pieces.append(view)
        return gather_device(pieces, next(s for s in spans if s is not None).device)

    def _scatter_output(self, name: str, array, requests, rows, results, blocks: list[Block]) -> None:
        datatype = self.model.output_types[name]
        if array is None:
            raise Internal(f"model '{self.model.context.name}' did not produce output '{name}'")
        refs = [(r.get("shm_outputs") or {}).get(name) for r in requests]
        regions = self._regions
        if datatype not in ("BYTES", "BF16") and is_device_array(array) and any(
                ref is not None and regions.device_view(*ref) is not None for ref in refs):
            return self._scatter_on_device(name, datatype, as_cupy(array), refs, rows, results, blocks)
        shape, data = wire_bytes(name, datatype, array)
        if not shape or shape[0] != sum(rows):
            raise Internal(f"output '{name}' has batch dimension {shape[:1]}, expected {sum(rows)}")
        per_row = math.prod(shape[1:])
        row_shape = self.model.reshapes.output_shape(name, shape)[1:]  # as the responses carry it
        if datatype == "BYTES":
            sizes = codec.split_bytes(data, [n * per_row for n in rows])
        else:
            sizes = [n * per_row * element_size(datatype) for n in rows]
        targets = []
        staged: list[tuple[DeviceSpan, memoryview]] = []
        for ref, n, size, result in zip(refs, rows, sizes, results):
            if ref is not None:
                rid, offset, _ = ref
                target = self._shm_output(name, ref, size)
                if isinstance(target, DeviceSpan):  # staged on the host, then one copy to the device
                    staged.append((target, memoryview(bytearray(size))))
                    target = staged[-1][1]
                targets.append(target)
                result["outputs"].append([name, datatype, [n, *row_shape], RegionDesc((rid, offset, size))])
            else:
                block = self._arena.alloc(size)
                blocks.append(block)
                targets.append(block.view)
                result["outputs"].append([name, datatype, [n, *row_shape], block.descriptor()])
        assembler.scatter(data, targets)
        for span, host in staged:
            span.write_host(host)

    def _scatter_on_device(self, name: str, datatype: str, array: Any, refs: list, rows: list[int],
                           results: list[dict[str, Any]], blocks: list[Block]) -> None:
        """A batch's output on the GPU, split there: a request's rows bound for CUDA shared
        memory go device to device, the others to the host once each."""
        got = from_numpy(array.dtype)
        if got != datatype:
            raise InvalidArgument(f"output '{name}' of type {got} does not match the config's {datatype}")
        shape = list(array.shape)
        if not shape or shape[0] != sum(rows):
            raise Internal(f"output '{name}' has batch dimension {shape[:1]}, expected {sum(rows)}")
        row_shape = self.model.reshapes.output_shape(name, shape)[1:]
        start = 0
        for ref, n, result in zip(refs, rows, results):
            part, start = array[start:start + n], start + n
            if ref is not None:
                target = self._shm_output(name, ref, int(part.nbytes))
                if isinstance(target, DeviceSpan):
                    written = target.write_device(part)
                else:
                    written = encode_output_into(target, name, datatype, part)[1]
                result["outputs"].append([name, datatype, [n, *row_shape], RegionDesc((ref[0], ref[1], written))])
            else:
                _, block = encode_output(self._arena, name, datatype, part)
                blocks.append(block)
                result["outputs"].append([name, datatype, [n, *row_shape], block.descriptor()])

    def _shm_output(self, name: str, ref: list, size: int) -> memoryview | RegionSpan | DeviceSpan:
        """The first ``size`` bytes of a request's shared-memory output slice ``[region, offset, limit]``."""
        rid, offset, limit = ref
        if size > limit:
            raise InvalidArgument(f"shared memory size specified with the request for output '{name}' "
                                  f"({limit} bytes) should be at least {size} bytes to hold the results")
        return self._regions.view(rid, offset, size)


def uniform(requests: list[dict[str, Any]]) -> bool:
    """Requests can be concatenated: same inputs in the same order with the same
    per-row shape, the same requested outputs, and a batch dimension."""
    first = requests[0]
    sig = [(n, dt, shape[1:]) for n, dt, shape, _ in first["inputs"]]
    if not sig or any(len(shape) == 0 for _, _, shape, _ in first["inputs"]):
        return False
    for r in requests[1:]:
        if r["outputs"] != first["outputs"]:
            return False
        if [(n, dt, shape[1:]) for n, dt, shape, _ in r["inputs"]] != sig:
            return False
        if len({shape[0] for _, _, shape, _ in r["inputs"]}) != 1:
            return False
    return True
