"""One version of a model as every layer sees it: its config, its tensors' specs, its
state, and the scheduler its requests go to once loaded. A leaf of ``core``: it imports
no scheduler, loader or validator, so each of those can import it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgument, Unavailable
from ..data.datatypes import config_to_wire, element_size
from ..observability.statistics import ModelStats
from . import config as mcfg

if TYPE_CHECKING:
    from ..scheduling.interface import Scheduler

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass(slots=True)
class TensorSpec:
    name: str
    datatype: str        # wire spelling, e.g. "FP32"
    dims: list[int]      # without the batch dimension
    optional: bool = False
    # Bytes of one tensor (one batch row with batching) when the datatype has a fixed size
    # and every dimension is known and non-zero; 0 otherwise. Lets validation check a
    # plain request's sizes with one comparison (validation.plain_plan).
    fixed_bytes: int = field(init=False, default=0)
    # An input's bit among its model's inputs (1 << its index, set by the ModelVersion):
    # validation tracks the inputs a request names in one int.
    bit: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        count = 1
        for d in self.dims:
            count *= d if d > 0 else 0
        try:
            self.fixed_bytes = count * element_size(self.datatype)  # BYTES: 0
        except InvalidArgument:  # not a datatype: every request takes validation.checked_plan, which says so
            self.fixed_bytes = 0


@dataclass(eq=False)
class ModelVersion:
    """One version of a model, and where its instances run once loaded."""
    name: str
    version: int
    model_dir: Path
    config: mcfg.ModelConfig
    state: str = LOADING
    reason: str = ""
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    outputs: dict[str, TensorSpec] = field(default_factory=dict)
    # (worker name, instance index) pairs, filled by the worker pool
    instances: list[tuple[str, int]] = field(default_factory=list)
    stats: ModelStats | None = None
    scheduler: "Scheduler | None" = None

    generation: int = 0   # distinguishes a reload from the version it replaces
    # (index, count): with several front-end processes, a partitioned model's instances this
    # process starts (ordinal k with k % count == index; cluster/share.py); (0, 1): all of them
    instance_slice: tuple[int, int] = (0, 1)
    # the front-end process that owns the model when that is another one (its requests are
    # forwarded there; cluster/share.py), else None
    owner: int | None = None
    # its worker died and is being restarted: requests get UNAVAILABLE (retryable), not NOT_FOUND
    recovering: bool = False
    # each output's classification labels (its label_filename's lines), read at load
    labels: dict[str, list[bytes]] = field(default_factory=dict)

    # Derived from the fields above, which are fixed once set (``config`` only changes
    # through set_config): plain attributes, because every request reads them.
    key: str = field(init=False)             # the name workers know this load by: a reload runs
                                             # beside the old one until it is ready
    version_name: str = field(init=False)    # the version as the protocols spell it
    max_batch_size: int = field(init=False)
    decoupled: bool = field(init=False)      # may send any number of responses per request
    caches_responses: bool = field(init=False)  # response_cache.enable
    required_inputs: int = field(init=False)     # inputs that are not optional
    required_mask: int = field(init=False)       # their TensorSpec.bit, or-ed
    output_names: tuple[str, ...] = field(init=False)  # in config order
    # validation.plain_plan's plans of requests that name no outputs, by batch size:
    # equal for every such request, and read-only, so made once
    plain_plans: dict[int, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.key = f"{self.name}/{self.version}#{self.generation}"
        self.version_name = str(self.version)
        self._derive_from_config()

    def _derive_from_config(self) -> None:
        config = self.config
        self.max_batch_size = config.max_batch_size
        self.decoupled = config.model_transaction_policy.decoupled
        self.caches_responses = config.response_cache.enable
        self.required_inputs = sum(not spec.optional for spec in self.inputs.values())
        self.required_mask = 0
        for i, spec in enumerate(self.inputs.values()):
            spec.bit = 1 << i
            if not spec.optional:
                self.required_mask |= spec.bit
        self.output_names = tuple(self.outputs)
        self.plain_plans = {}

    def queue(self) -> "Scheduler":
        """Where this version's requests go (it has one once loaded)."""
        if self.scheduler is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not loaded")
        return self.scheduler

    @property
    def ready(self) -> bool:
        return self.state == READY

    def set_config(self, config: mcfg.ModelConfig) -> None:
        """Set the config (fixed from here on) and what requests read of it."""
        self.config = config
        self.inputs = {t.name: TensorSpec(t.name, config_to_wire(mcfg.data_type_name(t.data_type)),
                                          list(t.dims), t.optional) for t in config.input}
        self.outputs = {t.name: TensorSpec(t.name, config_to_wire(mcfg.data_type_name(t.data_type)),
                                           list(t.dims)) for t in config.output}
        self._derive_from_config()

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []

        def tensors(specs: dict[str, TensorSpec]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": batch + t.dims} for t in specs.values()]

        return {"name": self.name, "versions": versions,
                "platform": self.config.platform or self.config.backend,
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}
