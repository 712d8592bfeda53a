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
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import TYPE_CHECKING, Any

from ..core.models.version import UNAVAILABLE
from ..errors import NotFound, TritonShmError, Unavailable

if TYPE_CHECKING:
    from ..core.models.repository import ModelEntry
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
    def others(self) -> list[int]:
        return [i for i in range(self.share.count) if i != self.share.index]

    def handlers(self) -> dict[str, Handler]:
        return {
            "model_control": self._model_control, "apply_load": self._apply_load,
            "apply_unload": self._apply_unload, "poll": self._poll, "owned_states": self._owned_states,
            "adopt_states": self._adopt_states, "startup_done": self._startup_done,
            "start_serving": self._start_serving, "current_state": self._current_state,
            "register_system_shm": self._register_system_shm, "register_cuda_shm": self._register_cuda_shm,
            "unregister_shm": self._unregister_shm, "drop_idle_shm": self._drop_idle_shm,
            "trace_update": self._trace_update,
            "log_update": self._log_update, "statistics": self._statistics,
            "metrics_snapshots": self._metrics_snapshots, "frontends_stopped": self._frontends_stopped,
            "trace_docs": self._trace_docs, "model_ready": self._model_ready,
        }

    # -- calls to the other processes ------------------------------------------------------
    async def everywhere(self, op: str, body: dict[str, Any]) -> list[dict[str, Any]]:
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
            handler = self._apply_load if op == "apply_load" else self._apply_unload
            results = await asyncio.gather(handler(body), self.everywhere(op, body), return_exceptions=True)
            await self.sync_states()
            if op == "apply_load" and not isinstance(results[0], BaseException):
                self.api_loads[body["name"]] = body
            elif op == "apply_unload":
                self.api_loads.pop(body["name"], None)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return {}

    async def _apply_load(self, body: dict[str, Any]) -> dict[str, Any]:
        files = {k: base64.b64decode(v) for k, v in (body.get("files") or {}).items()}
        await self.service.models.load(body["name"], body.get("config"), files)
        return {}

    async def _apply_unload(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.service.models.unload(body["name"], bool(body.get("dependents")))
        return {}

    async def after_poll(self) -> None:
        """Process 0, after its own poll: the others apply the same changes, then settle."""
        await self.everywhere("poll", {})
        await self.sync_states()

    async def _poll(self, _body: dict[str, Any]) -> dict[str, Any]:
        await self.service.models.poll_once()
        return {}

    # -- the owners' states, copied where a model is only forwarded -------------------------
    def owned_states(self) -> dict[str, Any]:
        """The state of every model this process runs itself (not only forwards)."""
        states = {}
        for name, entry in self.service.repository.models.items():
            versions = list(entry.versions.values())
            if versions and all(mv.owner is None for mv in versions):
                states[name] = {"state": entry.state, "reason": entry.reason, "ready": _all_ready(entry),
                                "versions": {str(mv.version): [mv.state, mv.reason] for mv in versions}}
        return states

    async def adopt_states(self, states: dict[str, Any]) -> None:
        """Models this process forwards take their owner's state (a load that failed there
        is UNAVAILABLE here too, with its reason). A partitioned model that failed in
        another process fails here too: its instances here are unloaded, so no process
        serves a model the server reports unavailable."""
        for name, entry in list(self.service.repository.models.items()):
            settled = states.get(name)
            versions = list(entry.versions.values())
            if settled is None or not versions:
                continue
            if any(mv.owner is None for mv in versions):  # run here: partitioned
                if settled["ready"] or not _all_ready(entry):
                    continue
                reasons = "; ".join(reason for _, reason in settled["versions"].values() if reason) or settled["reason"]
                log.error("model '%s' failed to load in another front-end process; unloading it here: %s",
                          name, reasons)
                await self.service.models.unload(name)
                entry.state, entry.reason = UNAVAILABLE, reasons
                for mv in versions:
                    mv.state, mv.reason = UNAVAILABLE, reasons
                continue
            entry.state, entry.reason = settled["state"], settled["reason"]
            for mv in versions:
                state = settled["versions"].get(str(mv.version))
                if state is not None:
                    mv.state, mv.reason = state

    async def sync_states(self) -> dict[str, Any]:
        """Process 0: gather the states of the models each process runs and have every
        process adopt them. A model several processes run (partitioned) takes the first
        failure among them: the server loads a model whole or not at all."""
        replies = [reply["states"] for reply in await self.everywhere("owned_states", {})]
        states: dict[str, Any] = {}
        for reply in [self.owned_states(), *replies]:
            for name, state in reply.items():
                known = states.get(name)
                if known is None or (known["ready"] and not state["ready"]):
                    states[name] = state
        await self.adopt_states(states)
        await self.everywhere("adopt_states", {"states": states})
        return states

    async def _owned_states(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"states": self.owned_states()}

    async def _adopt_states(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.adopt_states(body["states"])
        return {}

    # -- start-up ---------------------------------------------------------------------------
    async def startup(self) -> list[str]:
        """Process 0, once its own models are loaded: wait for the others', settle the
        states, let every process serve; returns every process's failed models."""
        replies = await asyncio.gather(*(self.peers.call(i, "startup_done", {}) for i in self.others))
        self.peers.connect_timeout = FAST_CONNECT_S
        await self.sync_states()
        await asyncio.gather(*(self.peers.call(i, "start_serving", {}) for i in self.others))
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
        """Process 0: what a restarted process needs to be the same server again."""
        service = self.service
        loaded = [self.api_loads.get(name) or {"name": name}
                  for name, entry in service.repository.models.items() if entry.ready_versions()]
        return {"loaded": loaded,
                "system_shm": service.shm.status("system", awaiting=False) if service.shm.enabled else [],
                "cuda_shm": service.shm.cuda_registrations() if service.shm.enabled else [],
                "log": service.log_settings.to_dict(), "trace": service.tracer.api_changes()}

    async def rejoin(self) -> None:
        """A restarted process: take the server's current state from process 0. In explicit
        mode it loads what the server has loaded now (with the API's config overrides), not
        the start-up models; in the other modes it loaded the repository as every process did.
        Then the system and CUDA shared-memory regions, the log settings and the trace
        settings the API changed."""
        state = await self.peers.call(0, "current_state", {})
        if self.service.models.mode == "explicit":
            await asyncio.gather(*(self._reload(body) for body in state["loaded"]))
        for register, regions in ((self._register_system_shm, state["system_shm"]),
                                  (self._register_cuda_shm, state["cuda_shm"])):
            for region in regions:  # as the broadcast of a registration carries it
                try:
                    await register(region)
                except TritonShmError as e:
                    log.error("registering shared memory region '%s' again: %s", region["name"], e.message)
        log_state = {k: v for k, v in state["log"].items() if k != "log_file"}
        self.service.log_settings.update(log_state)
        for model, changes in state["trace"]:
            self.service.tracer.update(model, changes)
        self._serve_forwarded()

    async def _reload(self, body: dict[str, Any]) -> None:
        try:
            await self._apply_load(body)
        except TritonShmError as e:
            log.error("loading '%s' as the server has it: %s", body["name"], e.message)

    # -- shared memory, settings ----------------------------------------------------------
    async def _register_system_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        self.service.shm.register_system(body["name"], body["key"], body["offset"], body["byte_size"])
        return {}

    async def _register_cuda_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.service.open_cuda_shm(body["name"], base64.b64decode(body["raw_handle"]), body["device_id"],
                                         body["byte_size"])
        return {}

    async def _unregister_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        """``defer``: mark the regions awaiting and answer those in use here (the caller
        removes the rest with ``drop_idle_shm``); else remove them (an undone registration)."""
        in_use = self.service.shm.unregister(body["kind"], body["name"], defer_all=bool(body.get("defer")))
        return {"in_use": in_use}

    async def _drop_idle_shm(self, body: dict[str, Any]) -> dict[str, Any]:
        self.service.shm.drop_idle(body["kind"], body["name"], set(body["keep"]))
        return {}

    async def _trace_update(self, body: dict[str, Any]) -> dict[str, Any]:
        self.service.tracer.update(body["model"], body["changes"])
        return {}

    async def _log_update(self, body: dict[str, Any]) -> dict[str, Any]:
        self.service.log_settings.update(body["changes"])
        return {}

    def share_trace_file(self, restarted: bool) -> None:
        """One trace file for the server: process 0 writes it, the others pass it their
        finished traces. Trace ids stay unique across processes (process ``i`` numbers
        ``i + 1 + k N``) and across a restart (which starts ``k`` at the time in ms)."""
        writer = None if self.share.index == 0 else PeerTraceFile(self.peers, asyncio.get_running_loop())
        k = time.time_ns() // 1_000_000 if restarted else 0
        self.service.tracer.share_file(self.share.index + 1 + k * self.share.count, self.share.count, writer)

    async def _trace_docs(self, body: dict[str, Any]) -> dict[str, Any]:
        self.service.tracer.write_from_peer(bool(body["indexed"]), [doc.encode() for doc in body["docs"]])
        return {}

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

    async def _model_ready(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            mv = self.service.repository.get(body["name"], str(body["version"]))
        except TritonShmError:
            return {"ready": False, "defined": True}
        return {"ready": mv.ready and await self.service.local_model_ready(mv),
                "defined": self.service.workers.readiness.defined(mv)}

    # -- statistics ---------------------------------------------------------------------------
    async def statistics(self, local: list[dict[str, Any]], name: str, version: str) -> list[dict[str, Any]]:
        from ..core.observability.statistics import merge_statistics
        replies = await self.everywhere("statistics", {"name": name, "version": version})
        return merge_statistics(local, [r["model_stats"] for r in replies])

    async def _statistics(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"model_stats": self.service.repository.statistics(body["name"], body["version"])}
        except NotFound:
            return {"model_stats": []}

    async def metrics_snapshots(self) -> list[dict[str, Any]]:
        return [r["snapshots"] for r in await self.everywhere("metrics_snapshots", {})]

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
            await asyncio.gather(*(tell(i) for i in self.others))
            if wait:
                await self._all_stopped.wait()
        try:
            await asyncio.wait_for(tell_then_wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("front-end processes %s did not stop their front-ends in time; unloading models",
                        sorted(set(self.others) - self._stopped))

    async def _frontends_stopped(self, body: dict[str, Any]) -> dict[str, Any]:
        self._stopped_at(int(body["index"]))
        return {}

    def _stopped_at(self, peer: int) -> None:
        self._stopped.add(peer)
        if self._stopped.issuperset(self.others):
            self._all_stopped.set()


def _all_ready(entry: "ModelEntry") -> bool:
    """Every version the model chose is serving (a failed one makes the model failed)."""
    return bool(entry.versions) and all(mv.ready for mv in entry.versions.values())


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
