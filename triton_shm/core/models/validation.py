"""Checks every request against its model's config before any memory is reserved for it.

Messages follow Triton's wording where clients are known to match on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ...errors import InvalidArgument
from ..data import codec
from ..data.classification import requested_count
from ..data.datatypes import element_size
from ..data.types import SHM_PARAMETERS, InferRequest, request_id_prefix
from .version import ModelVersion

MAX_TENSOR_BYTES = 1 << 40  # no shape may describe more than this (checked before any allocation)


@dataclass(slots=True)
class ShmRef:
    """A tensor's place in a client shared-memory region (offset relative to the region)."""
    region: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class RequestPlan:
    """What validation learned: the outputs to produce, the batch size, and which
    tensors live in client shared memory. Read-only once made (plain requests' plans
    share the empty NOTHING)."""
    outputs: list[str]
    batch_size: int
    shm_inputs: Mapping[str, ShmRef] = field(default_factory=dict)
    shm_outputs: Mapping[str, ShmRef] = field(default_factory=dict)
    # sequence batching: state outputs (name -> datatype) the model may return beside the
    # requested ones; the scheduler keeps them, the client never sees them
    state_outputs: Mapping[str, str] = field(default_factory=dict)
    sequence: tuple | None = None   # sequence batching: (correlation ID, start, end), for the model
    # outputs asked for as their top N classes (core/data/classification.py), by name
    classification: Mapping[str, int] = field(default_factory=dict)


def _shm_ref(params: dict, what: str, rid: str) -> ShmRef | None:
    if not any(k in params for k in SHM_PARAMETERS):
        return None
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if region is None or size is None:
        raise InvalidArgument(f"{rid}{what}: 'shared_memory_region' and 'shared_memory_byte_size' must be "
                              "given together")
    if not isinstance(region, str):
        raise InvalidArgument(f"{rid}{what}: 'shared_memory_region' must be a string")
    for label, v in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidArgument(f"{rid}{what}: '{label}' must be a non-negative integer")
    return ShmRef(region, offset, size)


def _element_count(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
        if count > MAX_TENSOR_BYTES:
            return MAX_TENSOR_BYTES + 1
    return count


def format_shape(shape: list[int]) -> str:
    """A shape as messages print it: ``[-1,16]``, ``[-1]``, ``[]``."""
    return f"[{','.join(map(str, shape))}]"


def _shape_matches(got: list[int], dims: list[int]) -> bool:
    return len(got) == len(dims) and all(d == -1 or d == g for g, d in zip(got, dims))


# The empty mapping plain requests' plans share (read-only, so sharing it is safe).
NOTHING: Mapping = MappingProxyType({})
_SHM_KEYS = frozenset(SHM_PARAMETERS)
_NOT_PLAIN_OUTPUT_KEYS = _SHM_KEYS | {"classification"}


def plain_plan(model: ModelVersion, request: InferRequest) -> RequestPlan | None:
    """The plan of a plain request, or None for any other (checked_plan decides those).

    Plain: unique known input names covering every required one, each input with the
    model's datatype, in-band data of exactly the size its shape gives, a shape equal to
    the config's dims (after a batch dimension within max_batch_size, the same for every
    input) where those dims are all known and the datatype has a fixed size
    (``TensorSpec.fixed_bytes``), no shared memory, unique known outputs without
    classification. For such a request every check of ``validate_request`` passes and
    its plan is this one, so skipping them changes nothing; anything else returns None
    without raising, and ``checked_plan`` runs every check and words the error. Unique
    names covering the required ones: no input's bit twice, every required bit.
    Plans are read-only: a request that names no outputs gets its model's shared one."""
    specs, max_batch = model.inputs, model.max_batch_size
    batch_size = seen = 0  # seen: the TensorSpec.bit of every input named so far
    for inp in request.inputs:
        spec = specs.get(inp.name)
        data = inp.data
        if (spec is None or data is None or inp.datatype != spec.datatype or not spec.fixed_bytes
                or seen & spec.bit or (inp.parameters and not _SHM_KEYS.isdisjoint(inp.parameters))):
            return None
        nbytes = data.nbytes if type(data) is memoryview else len(data)
        shape = inp.shape
        if max_batch:
            b = shape[0] if shape else 0
            if (not 0 < b <= max_batch or (batch_size and b != batch_size) or shape[1:] != spec.dims
                    or nbytes != b * spec.fixed_bytes):
                return None
            batch_size = b
        elif shape != spec.dims or nbytes != spec.fixed_bytes:
            return None
        if nbytes > MAX_TENSOR_BYTES:  # its element count is capped in checked_plan's message
            return None
        seen |= spec.bit
    required = model.required_mask
    if seen & required != required:
        return None
    if not request.outputs:  # every output: the same plan for every such request of this batch size
        plan = model.plain_plans.get(batch_size)
        if plan is None:
            plan = model.plain_plans[batch_size] = RequestPlan(list(model.output_names), batch_size, NOTHING,
                                                               NOTHING, NOTHING, None, NOTHING)
        return plan
    outputs: list[str] = []
    for out in request.outputs:
        if (out.name not in model.outputs or out.name in outputs
                or (out.parameters and not _NOT_PLAIN_OUTPUT_KEYS.isdisjoint(out.parameters))):
            return None
        outputs.append(out.name)
    return RequestPlan(outputs, batch_size, NOTHING, NOTHING, NOTHING, None, NOTHING)


def validate_request(model: ModelVersion, request: InferRequest) -> RequestPlan:
    """The request's plan; raises what is wrong with it (the first problem found)."""
    return plain_plan(model, request) or checked_plan(model, request)


def checked_plan(model: ModelVersion, request: InferRequest) -> RequestPlan:
    """Every check, in order: what ``validate_request`` does for a request that is not plain."""
    rid, name = request_id_prefix(request.id), model.name
    seen: set[str] = set()
    for inp in request.inputs:
        if inp.name in seen:
            raise InvalidArgument(f"{rid}input '{inp.name}' already exists in request")
        seen.add(inp.name)
    required = [n for n, spec in model.inputs.items() if not spec.optional]
    unknown = [n for n in seen if n not in model.inputs]
    missing = [n for n in required if n not in seen]
    if unknown or missing:
        got = ",".join(f"'{i.name}'" for i in request.inputs)
        raise InvalidArgument(
            f"{rid}expected {len(required)} inputs but got {len(request.inputs)} inputs for model "
            f"'{name}'. Got input(s) [{got}], but missing required input(s) "
            f"[{','.join(repr(m) for m in missing)}]"
            + (f" and unexpected input(s) [{','.join(repr(u) for u in unknown)}]" if unknown else "")
            + ". Please provide all required input(s).")

    batch_size, batch_input = 0, ""  # the batch size and the first input that set it
    max_batch = model.max_batch_size
    shm_inputs: dict[str, ShmRef] = {}
    shm_outputs: dict[str, ShmRef] = {}
    for inp in request.inputs:
        spec = model.inputs[inp.name]
        if inp.datatype != spec.datatype:
            raise InvalidArgument(f"{rid}inference input '{inp.name}' data-type is '{inp.datatype}', "
                                  f"but model '{name}' expects '{spec.datatype}'")
        shape = inp.shape
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"{rid}input '{inp.name}' has a negative dimension in shape {format_shape(shape)}")
        if max_batch > 0:
            if not shape:
                raise InvalidArgument(f"{rid}input '{inp.name}' for model '{name}' needs a batch "
                                      "dimension (the model's max_batch_size is non-zero)")
            b = shape[0]
            if batch_size and b != batch_size:
                raise InvalidArgument(f"{rid}input '{inp.name}' batch size does not match other inputs for "
                                      f"'{name}': input '{batch_input}' has batch size {batch_size}, input "
                                      f"'{inp.name}' has batch size {b}")
            if b < 1:
                raise InvalidArgument(f"{rid}inference request batch-size must be >= 1 for '{name}'")
            if b > max_batch:
                raise InvalidArgument(f"{rid}inference request batch-size must be <= {max_batch} for '{name}'")
            batch_size, batch_input = b, batch_input or inp.name
            if not _shape_matches(shape[1:], spec.dims):
                raise InvalidArgument(
                    f"{rid}unexpected shape for input '{inp.name}' for model '{name}'. Expected "
                    f"{format_shape([-1, *spec.dims])}, got {format_shape(shape)}. NOTE: Setting a non-zero "
                    "max_batch_size in the model config requires a batch dimension to be prepended to each "
                    "input shape. If you want to specify the full shape including the batch dim in your input "
                    "dims config, try setting max_batch_size to zero. See the model configuration docs for "
                    "more info on max_batch_size.")
        elif not _shape_matches(shape, spec.dims):
            raise InvalidArgument(
                f"{rid}unexpected shape for input '{inp.name}' for model '{name}'. Expected "
                f"{format_shape(spec.dims)}, got {format_shape(shape)}")

        ref = _shm_ref(inp.parameters, f"input '{inp.name}'", rid)
        if ref is not None:
            if inp.data is not None:
                raise InvalidArgument(f"{rid}input '{inp.name}' has both data and a shared-memory region")
            shm_inputs[inp.name] = ref
            nbytes = ref.byte_size
        elif inp.data is None:
            raise InvalidArgument(f"{rid}input '{inp.name}' for model '{name}' has no data")
        else:
            nbytes = len(inp.data) if not isinstance(inp.data, memoryview) else inp.data.nbytes
        count = _element_count(shape)
        size = element_size(inp.datatype)
        if size:
            expected = count * size
            if expected != nbytes:  # a shape past the cap was counted only up to it: say so
                shown = f"more than {MAX_TENSOR_BYTES}" if count > MAX_TENSOR_BYTES else expected
                raise InvalidArgument(f"{rid}input byte size mismatch for input '{inp.name}' for model "
                                      f"'{name}'. Expected {shown}, got {nbytes}")
        elif ref is None:  # BYTES in shared memory are walked by the worker that maps them
            if count * 4 > nbytes:  # every element needs at least its 4-byte length prefix
                raise InvalidArgument(f"{rid}expected {count} string elements for inference input "
                                      f"'{inp.name}' for model '{name}', but the data holds fewer")
            try:
                codec.validate_bytes(inp.data, count)
            except InvalidArgument as e:
                raise InvalidArgument(f"{rid}input '{inp.name}' for model '{name}': {e.message}") from None

    outputs: list[str] = []
    classes: dict[str, int] = {}
    for out in request.outputs:
        if out.name not in model.outputs:
            raise InvalidArgument(f"{rid}unexpected inference output '{out.name}' for model '{name}'")
        if out.name in outputs:
            raise InvalidArgument(f"{rid}output '{out.name}' already exists in request")
        ref = _shm_ref(out.parameters, f"output '{out.name}'", rid)
        if "classification" in out.parameters:
            if ref is not None:  # the classes are made from the output: it can not go to the region
                raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
            count = requested_count(out.parameters, out.name)
            if count:
                classes[out.name] = count
        if ref is not None:
            shm_outputs[out.name] = ref
        outputs.append(out.name)
    if not outputs:
        outputs = list(model.outputs)
    return RequestPlan(outputs=outputs, batch_size=batch_size, shm_inputs=shm_inputs, shm_outputs=shm_outputs,
                       classification=classes or NOTHING)
