"""Which front-end process serves which model, and which of its instances.

With ``--frontend-processes N`` every process loads every model, and a model is served in
one of two ways (docs/design/frontend-processes.md):

- **partitioned**: each process starts and drives its share of the instances (instance
  ordinal ``k`` belongs to process ``k mod N``) in its own workers, so a request is served
  wherever it arrives, at today's cost. For models that keep no state shared between
  requests (no batcher, no sequences, no response cache, no rate limiter), with at least N
  instances, whose instances are processes of their own or threads of the CPU worker.
- **owned**: one process (``owner``) starts every instance and schedules every request;
  the others hold the model's config (metadata, validation) and forward its requests to
  the owner. A dynamic-batching queue, a sequence's slot or the cache stays one state.

The decision reads only the model's config and N, so every process takes the same one.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._proto import model_config_pb2 as mc


@dataclass(frozen=True)
class FrontendShare:
    """This process's place among the front-end processes: ``index`` of ``count``."""
    index: int = 0
    count: int = 1

    @property
    def alone(self) -> bool:
        return self.count == 1

    def owner_of(self, name: str, config: "mc.ModelConfig", rate_limited: bool = False) -> int | None:
        """The process that owns model ``name``, or None when every process serves its
        share of the instances. ``rate_limited``: the server runs a rate limiter (its
        resources are one budget, so every model under it belongs to process 0)."""
        if self.alone:
            return None
        if rate_limited and any(g.HasField("rate_limiter") for g in config.instance_group):
            return 0
        if keeps_shared_state(config) or instance_count(config) < self.count:
            return zlib.crc32(name.encode()) % self.count  # spread: each owner is a different core
        return None

    def instance_slice(self) -> tuple[int, int]:
        """(index, count): a partitioned model's instances this process starts are those
        whose ordinal ``k`` has ``k % count == index``."""
        return self.index, self.count


def keeps_shared_state(config: "mc.ModelConfig") -> bool:
    """Whether the model's requests share a state one process must hold (a batching queue,
    sequence slots, the response cache), or its instances are threads of a GPU worker:
    partitioned, each process's GPU worker would open a CUDA context and load the model on
    the device. Instances in processes of their own, or threads of the CPU worker (each
    process has its own), are split as they are."""
    from ..supervisor.pool import instance_kind, runs_in_own_process
    on_gpu_worker = any(instance_kind(g) != "KIND_CPU" and not runs_in_own_process(config, instance_kind(g))
                        for g in config.instance_group)
    return (config.HasField("dynamic_batching") or config.HasField("sequence_batching")
            or config.response_cache.enable or on_gpu_worker)


def instance_count(config: "mc.ModelConfig") -> int:
    """How many instances the config asks for (a KIND_GPU group: count per listed GPU)."""
    from ..supervisor.pool import instance_kind
    return sum(g.count * (len(g.gpus) if instance_kind(g) == "KIND_GPU" and g.gpus else 1)
               for g in config.instance_group)
