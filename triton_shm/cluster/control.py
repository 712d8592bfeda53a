"""The control plane of several front-end processes: what makes them one server.

Every process holds the whole server's state, and what changes it goes everywhere before
the client is answered:

- model control (load, unload; a poll's changes) goes to process 0, which applies it in
  every process at once and answers when all have; then the owners' outcome is copied
  into the processes that only forward a model (``sync_states``), so readiness, the index
  and the metadata agree wherever a client asks;
- a shared-memory registration (or unregistration) is made where it arrives, then in every
  other process; trace and log settings likewise;
- statistics and the metrics page sum every process's counters;
- at shutdown no process unloads its models before every process's front-ends have
  stopped (``frontends_stopped``): until then another may still forward requests to it.

A process that cannot be reached (it died and is being started again) is skipped: when it
comes back it takes the current state from process 0 (``current_state``).

``Cluster`` is the replicated ``core/replication.py: Replicas``: the core's ops (its
``appliers``) travel as they are, and a peer's call reaches the same applier; what is
here is the transport, model control through process 0, start-up and shutdown.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import TYPE_CHECKING, Any

from ..errors import TritonShmError, Unavailable

if TYPE_CHECKING:
    from ..core.models.version import ModelVersion
    from ..core.service import InferenceService
    from .peers import Handler, Peers
    from .share import FrontendShare

log = logging.getLogger("triton_shm.frontends")

FAST_CONNECT_S = 2.0  # after start-up: a peer that does not answer by then is down (skipped)
PEER_WRITE_S = 60.0  # a batch of traces handed to process 0 (the writer thread waits for it)


class Cluster:
    def __init__(self, share: "FrontendShare", peers: "Peers", service: "InferenceService"):
        self.share, self.peers, self.service = share, peers, service
        self._control_lock = asyncio.Lock()  # process 0: one model-control change at a time
        # process 0: the loads the API asked for (name -> parameters), replayed by a restarted process
        self.api_loads: dict[str, dict[str, Any]] = {}
        self.loaded = asyncio.Event()   # this process has loaded its start-up models
        self.serving = asyncio.Event()  # process 0 said every process has: start serving
        self._stopped: set[int] = set()  # processes whose front-ends have stopped (shutdown)
        self._all_stopped = asyncio.Event()
        # model versions (keys) another process owns that define no is_ready(): never asked again
        self._no_own_readiness: set[str] = set()

    @property
    def peer_indexes(self) -> list[int]:
        """Every other process's index."""
        return [i for i in range(self.share.count) if i != self.share.index]

    def handlers(self) -> dict[str, Handler]:
        """What a peer may ask: the core's ops, and the cluster's own."""
        return {
            **self.service.appliers,
            "model_control": self._model_control, "startup_done": self._startup_done,
            "start_serving": self._start_serving, "current_state": self._current_state,
            "metrics_snapshots": self._metrics_snapshots, "frontends_stopped": self._frontends_stopped,
        }

    # -- calls to the other processes ------------------------------------------------------
    async def others(self, op: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``op`` in every other process; one that cannot be reached is skipped (it takes
        the state from process 0 when it starts again); raises the first other error."""
        return await self.peers.broadcast(op, body, skip_unavailable=True)

    # -- model control: through process 0 -----------------------------------------------
    async def load(self, name: str, config: str | None, files: dict[str, bytes]) -> None:
        body = {"op": "load", "name": name, "config": config,
                "files": {k: base64.b64encode(v).decode() for k, v in files.items()}}
        await self._to_process_0(body)

    async def unload(self, name: str, dependents: bool) -> None:
        await self._to_process_0({"op": "unload", "name": name, "dependents": dependents})

    async def _to_process_0(self, body: dict[str, Any]) -> None:
        if self.share.index == 0:
            await self._model_control(body)
        else:
            await self.peers.call(0, "model_control", body)

    async def _model_control(self, body: dict[str, Any]) -> dict[str, Any]:
        """Process 0: apply a load or unload in every process at once, then settle the
        forwarding processes' states; answer with the first error."""
        op = "apply_load" if body["op"] == "load" else "apply_unload"
        async with self._control_lock:
            results = await asyncio.gather(self.service.apply_here(op, body), self.others(op, body),
                                           return_exceptions=True)
            await self.sync_states()
            if op == "apply_load" and not isinstance(results[0], BaseException):
                self.api_loads[body["name"]] = body
            elif op == "apply_unload":
                self.api_loads.pop(body["name"], None)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return {}

    async def after_poll(self) -> None:
        """Process 0, after its own poll: the others apply the same changes, then settle.
        Not before every process has loaded its start-up models (``startup``): settled
        while another still loads, a partitioned model would fail there."""
        await self.serving.wait()
        await self.others("poll", {})
        await self.sync_states()

    # -- the owners' states, copied where a model is only forwarded -------------------------
    async def sync_states(self) -> dict[str, Any]:
        """Process 0: gather the states of the models each process runs and have every
        process adopt them. A model several processes run (partitioned) takes the first
        failure among them: the server loads a model whole or not at all."""
        replies = [reply["states"] for reply in await self.others("owned_states", {})]
        states: dict[str, Any] = {}
        for reply in [(await self.service.apply_here("owned_states", {}))["states"], *replies]:
            for name, state in reply.items():
                known = states.get(name)
                if known is None or (known["ready"] and not state["ready"]):
                    states[name] = state
        await self.service.apply("adopt_states", {"states": states})
        return states

    # -- start-up ---------------------------------------------------------------------------
    async def startup(self) -> list[str]:
        """Process 0, once its own models are loaded: wait for the others', settle the
        states, let every process serve; returns every process's failed models."""
        replies = await asyncio.gather(*(self.peers.call(i, "startup_done", {}) for i in self.peer_indexes))
        self.peers.connect_timeout = FAST_CONNECT_S
        await self.sync_states()
        await asyncio.gather(*(self.peers.call(i, "start_serving", {}) for i in self.peer_indexes))
        self._serve_forwarded()
        failed = self.service.models.failed_models()
        return failed + [f for r in replies for f in r["failed"] if f not in failed]

    async def _startup_done(self, _body: dict[str, Any]) -> dict[str, Any]:
        await self.loaded.wait()
        return {"failed": self.service.models.failed_models()}

    async def _start_serving(self, _body: dict[str, Any]) -> dict[str, Any]:
        self._serve_forwarded()
        return {}

    def _serve_forwarded(self) -> None:
        """Every model is loaded here: serve the requests other processes forward."""
        self.peers.connect_timeout = FAST_CONNECT_S
        self.peers.service = self.service
        self.serving.set()

    async def _current_state(self, _body: dict[str, Any]) -> dict[str, Any]:
        """Process 0: what a restarted process needs to be the same server again (the
        loads with the API's config overrides, for explicit mode)."""
        state = self.service.current_state()
        state["loaded"] = [self.api_loads.get(name) or {"name": name} for name in state.pop("ready")]
        return state

    async def rejoin(self) -> None:
        """A restarted process: take the server's current state from process 0. In explicit
        mode it loads what the server has loaded now (with the API's config overrides), not
        the start-up models; in the other modes it loaded the repository as every process did.
        Then the system and CUDA shared-memory regions, the log settings and the trace
        settings the API changed."""
        state = await self.peers.call(0, "current_state", {})
        if self.service.models.mode == "explicit":
            await asyncio.gather(*(self._reload(body) for body in state["loaded"]))
        for op, regions in (("register_system_shm", state["system_shm"]), ("register_cuda_shm", state["cuda_shm"])):
            for region in regions:  # as the broadcast of a registration carries it
                try:
                    await self.service.apply_here(op, region)
                except TritonShmError as e:
                    log.error("registering shared memory region '%s' again: %s", region["name"], e.message)
        log_state = {k: v for k, v in state["log"].items() if k != "log_file"}
        await self.service.apply_here("log_update", {"changes": log_state})
        for model, changes in state["trace"]:
            await self.service.apply_here("trace_update", {"model": model, "changes": changes})
        self._serve_forwarded()

    async def _reload(self, body: dict[str, Any]) -> None:
        try:
            await self.service.apply_here("apply_load", body)
        except TritonShmError as e:
            log.error("loading '%s' as the server has it: %s", body["name"], e.message)

    def share_trace_file(self, restarted: bool) -> None:
        """One trace file for the server: process 0 writes it, the others pass it their
        finished traces. Trace ids stay unique across processes (process ``i`` numbers
        ``i + 1 + k N``) and across a restart (which starts ``k`` at the time in ms)."""
        writer = None if self.share.index == 0 else PeerTraceFile(self.peers, asyncio.get_running_loop())
        k = time.time_ns() // 1_000_000 if restarted else 0
        self.service.tracer.share_file(self.share.index + 1 + k * self.share.count, self.share.count, writer)

    # -- a model's own readiness (is_ready()) --------------------------------------------
    async def model_ready(self, mv: "ModelVersion", everywhere: bool = False) -> bool:
        """``mv``'s instances in its owner, or (``everywhere``) in every other process, say
        they are ready; a process that cannot answer counts as not ready."""
        if mv.key in self._no_own_readiness:
            return True
        body = {"name": mv.name, "version": mv.version}
        try:
            if everywhere:
                replies = await self.peers.broadcast("model_ready", body)
            else:
                assert mv.owner is not None
                replies = [await self.peers.call(mv.owner, "model_ready", body)]
        except TritonShmError as e:
            log.debug("model '%s' version %d is not ready: %s", mv.name, mv.version, e.message)
            return False
        if not everywhere and not replies[0]["defined"]:
            self._no_own_readiness.add(mv.key)
        return all(r["ready"] for r in replies)

    # -- statistics ---------------------------------------------------------------------------
    async def metrics_snapshots(self) -> list[dict[str, Any]]:
        return [r["snapshots"] for r in await self.others("metrics_snapshots", {})]

    async def _metrics_snapshots(self, _body: dict[str, Any]) -> dict[str, Any]:
        from ..frontend.metrics.collect import local_snapshots
        return {"snapshots": local_snapshots(self.service.repository, self.service.cache)}

    # -- shutdown ------------------------------------------------------------------------------
    async def frontends_stopped(self, timeout: float, wait: bool = True) -> None:
        """This process's front-ends have stopped and answered what they took in: tell the
        others, then (``wait``: it served) wait up to ``timeout`` until each has said the
        same. Until then a process keeps its models loaded, since another may still forward
        requests to it. A process that cannot be reached, or whose link breaks meanwhile,
        forwards nothing more, so it is not waited for."""
        self.peers.on_lost = self._stopped_at

        async def tell(peer: int) -> None:
            try:
                await self.peers.call(peer, "frontends_stopped", {"index": self.share.index})
            except Unavailable:
                self._stopped_at(peer)
            except TritonShmError as e:  # shutdown goes on whatever a peer answers
                log.warning("front-end process %d was not told this one stopped: %s", peer, e.message)

        async def tell_then_wait() -> None:
            await asyncio.gather(*(tell(i) for i in self.peer_indexes))
            if wait:
                await self._all_stopped.wait()
        try:
            await asyncio.wait_for(tell_then_wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("front-end processes %s did not stop their front-ends in time; unloading models",
                        sorted(set(self.peer_indexes) - self._stopped))

    async def _frontends_stopped(self, body: dict[str, Any]) -> dict[str, Any]:
        self._stopped_at(int(body["index"]))
        return {}

    def _stopped_at(self, peer: int) -> None:
        self._stopped.add(peer)
        if self._stopped.issuperset(self.peer_indexes):
            self._all_stopped.set()


class PeerTraceFile:
    """A front-end process's trace file, other than process 0's: the finished traces go to
    process 0, which writes them to the one file. Called in the tracer's writer thread."""

    def __init__(self, peers: "Peers", loop: asyncio.AbstractEventLoop):
        self.peers, self.loop = peers, loop

    def _send(self, indexed: bool, docs: list[bytes]) -> None:
        body = {"indexed": indexed, "docs": [doc.decode() for doc in docs]}
        asyncio.run_coroutine_threadsafe(self.peers.call(0, "trace_docs", body), self.loop).result(PEER_WRITE_S)

    def append(self, docs: list[bytes]) -> None:
        self._send(False, docs)

    def write_indexed(self, docs: list[bytes]) -> None:
        self._send(True, docs)

    def close(self) -> None:
        pass  # process 0 finishes the file
