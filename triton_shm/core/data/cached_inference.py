"""One request through the response cache: look it up, answer a hit, or run it and
store the answer. Statistics as Triton keeps them: a hit counts in ``success``,
``queue`` (arrival to lookup) and ``cache_hit`` (lookup and building the answer),
never in the compute phases, ``inference_count`` or ``execution_count``; a miss adds
its lookup and insertion time to ``cache_miss``."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Awaitable, Callable

from ...errors import Internal, InvalidArgument, Unavailable
from .region_io import read_region, write_region
from .response_cache import ResponseCache, from_cached, request_key, response_size, to_cached
from .types import InferRequest, InferResponse, OutputTensor

if TYPE_CHECKING:
    from ..models.validation import RequestPlan
    from ..models.version import ModelVersion
    from .shm_registry import Region


async def infer_cached(cache: ResponseCache, model: "ModelVersion", request: InferRequest, plan: "RequestPlan",
                       regions: dict[str, "Region"], arrived_ns: int,
                       run: Callable[[], Awaitable[InferResponse | None]]) -> InferResponse:
    """``run()`` executes the request when the cache has no answer for it."""
    lookup_start = time.monotonic_ns()

    def shm_input(name: str) -> bytes:
        ref = plan.shm_inputs[name]
        return read_region(regions[ref.region], ref.offset, ref.byte_size)

    key = request_key(model, request, plan, shm_input)
    tensors = cache.lookup(key)
    stats = model.stats
    if stats is None:
        raise Unavailable(f"model '{model.name}' version {model.version} is not loaded")
    if tensors is not None:
        response = from_cached(model, request, tensors, _shm_writer(plan, regions) if plan.shm_outputs else None)
        end = time.monotonic_ns()
        stats.record_cache_hit(end - arrived_ns, lookup_start - arrived_ns, end - lookup_start)
        return response
    miss_ns = time.monotonic_ns() - lookup_start
    try:
        answer = await run()
        if answer is None:  # cached requests are never a decoupled model's
            raise Internal(f"model '{model.name}' answered a cached request on a stream")
        response = answer
    except BaseException:
        stats.record_cache_miss(miss_ns)
        raise
    insert_start = time.monotonic_ns()
    try:
        if response_size(response) <= cache.capacity:  # never copy what cannot be kept
            cache.insert(key, to_cached(response, _shm_reader(plan, regions)))
    except InvalidArgument:
        pass  # the client's region shrank under us: answered, not cached
    stats.record_cache_miss(miss_ns + time.monotonic_ns() - insert_start)
    return response


def _shm_writer(plan: "RequestPlan", regions: dict[str, "Region"]) -> Callable[[str, bytes], bool]:
    def write(name: str, data: bytes) -> bool:
        ref = plan.shm_outputs.get(name)
        if ref is None:
            return False
        if len(data) > ref.byte_size:  # what a worker says when the model's output does not fit
            raise InvalidArgument(f"shared memory size specified with the request for output '{name}' "
                                  f"({ref.byte_size} bytes) should be at least {len(data)} bytes to hold the results")
        write_region(regions[ref.region], ref.offset, data)
        return True
    return write


def _shm_reader(plan: "RequestPlan", regions: dict[str, "Region"]) -> Callable[[OutputTensor], bytes]:
    def read(output: OutputTensor) -> bytes:
        ref = plan.shm_outputs[output.name]
        return read_region(regions[ref.region], ref.offset, output.shm_byte_size)
    return read
