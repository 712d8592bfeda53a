"""The response cache (``--cache-config local,size=N``, ``response_cache { enable: true }``).

Identical requests to a model with the cache on are answered from memory. The key is a
digest of everything that can change the answer: the model and version, every input's
name, datatype, shape and bytes (in request order), the outputs asked for with the
parameters that change them (not the wire encoding, ``binary_data``, nor where a
shared-memory output is to be written), and the parameters the model sees. Only
successful responses are stored, as protocol-neutral tensors, so a hit is served to
HTTP and gRPC alike and carries the new request's id.

Memory is bounded: entries are evicted least recently used first; a response larger
than the whole cache is answered and not stored. All of it runs on the event loop.
"""
from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from ...errors import InvalidArgument
from .types import SHM_PARAMETERS, Buffer, InferRequest, InferResponse, InputTensor, OutputTensor

if TYPE_CHECKING:
    from ..models.validation import RequestPlan
    from ..models.version import ModelVersion

KEY_BYTES = 32
# Output parameters that say how or where an answer is delivered, not what it is.
_DELIVERY_PARAMETERS = frozenset({"binary_data", *SHM_PARAMETERS})


@dataclass(frozen=True, slots=True)
class CachedTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


def entry_size(tensors: Iterable[CachedTensor]) -> int:
    """What an entry counts against the cache size: its key, and per tensor its name,
    datatype, 8 bytes per dimension and its data."""
    return KEY_BYTES + sum(len(t.name.encode()) + len(t.datatype) + 8 * len(t.shape) + len(t.data)
                           for t in tensors)


def response_size(response: InferResponse) -> int:
    """What ``response`` would count against the cache, before anything is copied."""
    return KEY_BYTES + sum(len(o.name.encode()) + len(o.datatype) + 8 * len(o.shape)
                           + (o.shm_byte_size if o.in_shared_memory else memoryview(o.data).nbytes)
                           for o in response.outputs)


class ResponseCache:
    """A bounded LRU map from request keys to responses, with Triton's cache counters."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError("the cache size must not be negative")
        self.capacity = capacity
        self.used = 0
        self._entries: collections.OrderedDict[bytes, tuple[tuple[CachedTensor, ...], int]] = \
            collections.OrderedDict()
        self.lookups = self.hits = self.misses = self.evictions = 0
        self.lookup_ns = self.insertion_ns = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def utilization(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    def counters(self) -> dict[str, int]:
        """What the metrics page shows of it, to be summed with the other front-end
        processes' caches (``CacheTotals``)."""
        return {"capacity": self.capacity, "used": self.used, "entries": self.entries, "lookups": self.lookups,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "lookup_ns": self.lookup_ns, "insertion_ns": self.insertion_ns}

    def lookup(self, key: bytes) -> tuple[CachedTensor, ...] | None:
        start = time.monotonic_ns()
        entry = self._entries.get(key)
        self.lookups += 1
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
            self._entries.move_to_end(key)
        self.lookup_ns += time.monotonic_ns() - start
        return entry[0] if entry is not None else None

    def insert(self, key: bytes, tensors: tuple[CachedTensor, ...]) -> bool:
        """Store ``tensors`` under ``key``, evicting the least recently used entries to
        make room; False (nothing stored) when they are larger than the whole cache."""
        start = time.monotonic_ns()
        try:
            size = entry_size(tensors)
            if size > self.capacity:
                return False
            old = self._entries.pop(key, None)
            if old is not None:  # two identical requests missed at once: keep the newer
                self.used -= old[1]
            while self.used + size > self.capacity:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.used -= evicted
                self.evictions += 1
            self._entries[key] = (tensors, size)
            self.used += size
            return True
        finally:
            self.insertion_ns += time.monotonic_ns() - start


# -- keys ------------------------------------------------------------------------------------
def _answer_parameters(params: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k not in _DELIVERY_PARAMETERS))


def _input_data(inp: InputTensor, plan: "RequestPlan", input_bytes: Callable[[str], Buffer]) -> Buffer:
    if inp.name in plan.shm_inputs or inp.data is None:  # validation found its region
        return input_bytes(inp.name)
    return inp.data


def request_key(model: "ModelVersion", request: InferRequest, plan: "RequestPlan",
                input_bytes: Callable[[str], Buffer]) -> bytes:
    """The cache key of a validated request. ``input_bytes(name)`` gives an input's
    bytes (read from the client's region for a shared-memory input).

    Everything but the tensor bytes goes into one header, the ``repr`` of a tuple of
    strings and numbers (unambiguous: strings are quoted, and ``1``, ``1.0``, ``True``
    and ``"1"`` all differ); each input's byte count is in it, so the bytes that follow
    it, back to back, cannot be split another way."""
    datas = [memoryview(_input_data(inp, plan, input_bytes)).cast("B") for inp in request.inputs]
    requested = {o.name: o.parameters for o in request.outputs}
    header = (model.name, model.version,
              tuple((inp.name, inp.datatype, tuple(inp.shape), d.nbytes) for inp, d in zip(request.inputs, datas)),
              tuple((name, _answer_parameters(requested.get(name, {}))) for name in plan.outputs),
              _answer_parameters(request.model_parameters()))
    h = hashlib.blake2b(repr(header).encode(), digest_size=KEY_BYTES)
    for d in datas:
        h.update(d)
    return h.digest()


# -- responses -------------------------------------------------------------------------------
def to_cached(response: InferResponse, shm_output: Callable[[OutputTensor], bytes]) -> tuple[CachedTensor, ...]:
    """A response's tensors as the cache keeps them (a copy: the response's own buffers
    go back to the worker). ``shm_output(tensor)`` reads one that the worker wrote into
    the client's region."""
    return tuple(CachedTensor(o.name, o.datatype, tuple(o.shape),
                              shm_output(o) if o.in_shared_memory else bytes(o.data)) for o in response.outputs)


def from_cached(model: "ModelVersion", request: InferRequest, tensors: tuple[CachedTensor, ...],
                write_shm: Callable[[str, bytes], bool] | None = None) -> InferResponse:
    """The answer to ``request`` from a cache entry, with the new request's id.
    ``write_shm(name, data)``, given when the request names shared-memory outputs,
    writes an output into the client's region where it asks for that, and says whether
    it did. Other outputs are served from the entry itself (its bytes are immutable)."""
    outputs = []
    for t in tensors:
        if write_shm is not None and write_shm(t.name, t.data):
            outputs.append(OutputTensor(t.name, t.datatype, list(t.shape), b"", in_shared_memory=True,
                                        shm_byte_size=len(t.data)))
        else:
            outputs.append(OutputTensor(t.name, t.datatype, list(t.shape), memoryview(t.data)))
    return InferResponse(model_name=model.name, model_version=str(model.version), id=request.id, outputs=outputs)


def parse_cache_config(settings: list[str], byte_size: int | None) -> int | None:
    """The local cache's size from ``--cache-config`` settings (``local,size=N``) or the
    older ``--response-cache-byte-size``; None when neither is given."""
    if settings and byte_size is not None:
        raise ValueError("Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                         "Please provide one or the other.")
    if byte_size is not None:
        if byte_size < 0:
            raise ValueError(f"--response-cache-byte-size must not be negative, got {byte_size}")
        return byte_size
    if not settings:
        return None
    size = None
    for item in settings:
        name, _, setting = item.partition(",")
        key, _, value = setting.partition("=")
        name, key, value = name.strip(), key.strip(), value.strip()
        if not name or not key or not value:
            raise ValueError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {item}")
        if name != "local":
            raise ValueError(f"--cache-config {item}: cache '{name}' is not available (only 'local' is built in)")
        if key != "size":
            raise ValueError(f"--cache-config {item}: the local cache has no setting '{key}' (it takes size)")
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"--cache-config {item}: size must be a whole number of bytes") from None
        if size < 0:
            raise ValueError(f"--cache-config {item}: size must not be negative")
    if size is None:
        raise ValueError("--cache-config: the local cache needs size=<bytes>")
    return size


def check_cache_config(config) -> None:
    """Reasons a model's response_cache setting cannot load."""
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        raise InvalidArgument(f"Response Cache does not currently support model {config.name} with 'decoupled' "
                              "transaction policy. Please disable the response cache.")
