"""Model lifecycle: loading, reloading and unloading models and versions, in the model
control modes ``none``, ``poll`` and ``explicit``.

Loads run off the request path (other models keep answering) and a model's loads and
unloads are serialized by its lock. A reload loads the new versions beside the old ones
(workers know each load by its own key) and swaps them in once every one is READY; the
replaced versions drain their queues before their instances are freed, so no in-flight
request fails because of a reload. A failed reload leaves the old versions serving.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import os
import posixpath
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ...errors import Internal, InvalidArgument, TritonShmError, Unavailable
from ..data.classification import ensemble_labels, load_labels
from ..data.response_cache import check_cache_config
from ..observability.histogram import check_model_metrics, histogram_buckets
from ..observability.statistics import ModelStats
from ..scheduling.dynamic import DynamicScheduler, check_batching_config
from ..scheduling.ensemble import EnsembleScheduler, composing_models, ensemble_dependents, validate_ensemble
from ..scheduling.rate_limiter import Claim, RateLimiter, claim_for
from ..scheduling.sequence import SequenceScheduler, check_sequence_config
from . import config as mcfg
from .repository import (NOT_REQUESTED, UNLOADED, ModelEntry, ModelRepository, check_links_inside, select_versions,
                         version_dirs)
from .version import LOADING, READY, UNAVAILABLE, UNLOADING, ModelVersion

if TYPE_CHECKING:
    from ...cluster.share import FrontendShare
    from ...supervisor.pool import WorkerPool
    from ..scheduling.interface import Scheduler

log = logging.getLogger("triton_shm.models")

MODES = ("none", "poll", "explicit")
FILE_PREFIX = "file:"
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits for one path component and a whole path


def fingerprint(model_dir: Path) -> tuple:
    """What poll mode compares: every file's path, size and modification time."""
    items = []
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for f in sorted(files):
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            items.append((os.path.relpath(os.path.join(root, f), model_dir), st.st_size, st.st_mtime_ns))
    return tuple(items)


def override_paths(files: dict[str, bytes]) -> dict[PurePosixPath, bytes]:
    """The file-override paths laid out as Triton lays them out: under the model's private
    directory, an absolute one too (``file:/tmp/x`` is ``tmp/x`` there), normalized
    (``1/../2/x`` is ``2/x``); a path that leaves the directory, names the directory itself,
    holds NUL or an over-long component, or is both a file and the folder of another
    (``file:1`` beside ``file:1/model.py``) is the client's error (InvalidArgument), with
    Triton's wording. A later name for the same path replaces the earlier, as in Triton."""
    out: dict[PurePosixPath, bytes] = {}
    for rel, data in files.items():
        name = f"{FILE_PREFIX}{rel}"
        if "\x00" in rel:
            raise InvalidArgument(f"Invalid file parameter {name!r}: a path can not hold NUL")
        normalized = posixpath.normpath("/model/" + rel.lstrip("/"))
        if not normalized.startswith("/model/"):
            where = "names the model directory itself" if normalized == "/model" else "must stay within model directory"
            raise InvalidArgument(f"Invalid file parameter '{name}' {where}")
        path = PurePosixPath(normalized[len("/model/"):])
        if any(len(part.encode(errors="surrogatepass")) > NAME_MAX for part in path.parts) \
                or len(rel.encode(errors="surrogatepass")) > PATH_MAX:
            raise InvalidArgument(f"file override path '{rel[:64]}...' is too long")
        out[path] = data
    for path in out:
        for parent in path.parents:
            if parent in out:
                raise InvalidArgument(f"Invalid file parameter '{FILE_PREFIX}{path}', directory has been created "
                                      f"as a file ('{FILE_PREFIX}{parent}')")
    return out


def write_override_files(name: str, files: dict[str, bytes]) -> Path:
    """A private model directory holding only the given files (``"1/model.onnx"`` → bytes),
    laid out by ``override_paths``: nothing lands outside it. Everything is checked before
    the directory exists, and a failure removes it and names no server path."""
    check_name_length(name)
    paths = override_paths(files)
    root = Path(tempfile.mkdtemp(prefix="triton_shm_model_"))
    try:
        model_dir = (root / name).resolve()
        model_dir.mkdir()
        for rel, data in paths.items():
            target = (model_dir / rel).resolve()
            if model_dir not in target.parents:
                raise InvalidArgument(f"invalid file override path '{rel}'")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    except OSError as e:
        shutil.rmtree(root, ignore_errors=True)
        raise InvalidArgument(f"cannot write the file overrides of model '{name}': "
                              f"{os.strerror(e.errno) if e.errno else type(e).__name__}") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return model_dir


class PollFailed(Internal):
    """A model that cannot be read from the repository: no directory of that name, a config
    that cannot be read or parsed, a config override that is not a config of that model.
    As Triton, the caller is told only that (INTERNAL), the log says why,
    and the model's entry is left as it was: a model never loaded stays listed by name only,
    a loaded one keeps serving."""

    def __init__(self, name: str):
        super().__init__(f"failed to load '{name}', failed to poll from model repository")


def check_name_length(name: str) -> None:
    """A model name is a directory name: at most NAME_MAX bytes."""
    if len(name.encode(errors="surrogatepass")) > NAME_MAX:
        raise InvalidArgument(f"model name '{name[:32]}...' is longer than {NAME_MAX} bytes")


class ModelManager:
    def __init__(self, repository: ModelRepository, pool: "WorkerPool", *, mode: str = "none",
                 poll_secs: float = 15.0, load_threads: int = 4, latency_summaries: bool = False,
                 latency_histograms: bool = False,
                 auto_complete: bool = True, config_name: str = "", limiter: RateLimiter | None = None,
                 external_links: bool = False, share: "FrontendShare | None" = None,
                 forwarding: "Callable[[ModelVersion, int], Scheduler] | None" = None):
        if mode not in MODES:
            raise ValueError(f"--model-control-mode must be one of {', '.join(MODES)}, got '{mode}'")
        self.repository, self.pool, self.mode = repository, pool, mode
        self.poll_secs = poll_secs
        self.latency_summaries = latency_summaries  # keep per-request latencies for metric summaries
        self.latency_histograms = latency_histograms  # count first-response times in metric histograms
        # complete configs from the model files (off: --disable-auto-complete-config)
        self.auto_complete = auto_complete
        self.config_name = config_name      # --model-config-name: configs/<name>.pbtxt before config.pbtxt
        self.limiter = limiter              # --rate-limit execution_count (None: off)
        self.external_links = external_links  # --allow-external-model-links: follow links out of the repository
        # --frontend-processes: this process's share of the models, and the scheduler of a
        # model another process owns (cluster/share.py, cluster/forwarding.py)
        if (share is None) != (forwarding is None):
            raise ValueError("a share of the models needs the forwarding of the others, and only it does")
        self.share, self.forwarding = share, forwarding
        # the other front-end processes re-scan after this one's poll (several processes only)
        self.after_poll: Callable[[], Awaitable[None]] | None = None
        self.polls = True  # this process watches the repository in poll mode (only one of several does)
        self._load_slots = asyncio.Semaphore(max(load_threads, 1))
        self._generations = itertools.count(1)
        self._poll_task: asyncio.Task | None = None
        self._pending_changes: dict[str, tuple] = {}
        self._temp_dirs: dict[str, Path] = {}
        # Models loaded only because an ensemble needed them: unloading that ensemble with
        # unload_dependents takes them too, once no other ensemble uses them.
        self._implicit: set[str] = set()
        # Models whose last load failed before it began (PollFailed), with why: they are not
        # in the index (but by name), yet count as failed at start (--exit-on-error).
        self._poll_failures: dict[str, str] = {}
        pool.on_worker_down, pool.on_worker_back = self._worker_down, self._worker_back

    # -- workers that die and come back ----------------------------------------------------
    def _worker_down(self, worker: str) -> None:
        """Its instances leave their schedulers. A model that still has an instance running
        elsewhere (another instance process) stays READY, as Triton's does while a stub
        restarts; one left with none cannot serve until it is back and loaded again."""
        reason = f"{self.pool.workers[worker].what} is restarting"
        for mv in self.pool.placed_on(worker):
            scheduler = mv.scheduler
            if scheduler is not None:
                for instance in self.pool.instances_on(worker, mv):
                    scheduler.instance_down(instance, reason)
            if mv.state == READY and not (self.pool.is_instance_process(worker) and self.pool.any_host_alive(mv)):
                mv.state, mv.reason = LOADING, reason
                mv.recovering = True

    async def _worker_back(self, worker: str) -> None:
        """A restarted worker loads again what it hosted; its instances serve again."""
        for mv in self.pool.placed_on(worker):
            try:
                await self.pool.load_on(worker, mv)
            except TritonShmError as e:
                if worker not in self.pool.workers or not self.pool.workers[worker].alive:
                    return  # died again (its next restart loads it) or its model was unloaded
                mv.state, mv.reason = UNAVAILABLE, f"reload after worker restart failed: {e.message}"
                mv.recovering = False
                continue
            scheduler = mv.scheduler
            if scheduler is not None:
                for instance in self.pool.instances_on(worker, mv):
                    scheduler.instance_up(instance)
            if mv.state == LOADING and self.pool.hosts_alive(mv):
                mv.state, mv.reason, mv.recovering = READY, "", False

    # -- start-up and shutdown -----------------------------------------------------------
    async def start(self, load_models: list[str]) -> None:
        """Load what the mode asks for at start; in poll mode, start watching."""
        found = self.repository.scan()
        for name, path in found.items():
            self.repository.entry(name, path)
        if self.mode == "explicit":
            names = list(found) if "*" in load_models else list(dict.fromkeys(load_models))  # each once
        else:
            names = list(found)
        # Ensembles check their composing models, so those load first.
        ensembles = {n for n in names if n in found and _is_ensemble(found[n], self.config_name)}
        await asyncio.gather(*(self._load_reporting(n) for n in names if n not in ensembles))
        await asyncio.gather(*(self._load_reporting(n) for n in ensembles))
        if self.mode == "poll" and self.polls:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll())

    async def _load_reporting(self, name: str) -> None:
        try:
            await self.load(name)
        except PollFailed:  # logged, and kept in _poll_failures (seen by --exit-on-error)
            pass
        except TritonShmError as e:  # recorded in the index (and so seen by --exit-on-error)
            entry = self.repository.models.get(name)
            if entry is None:  # it never got as far as an entry, e.g. no such model
                log.error("failed to load '%s': %s", name, e.message)
                self.repository.models[name] = ModelEntry(name, Path(), state=UNAVAILABLE, reason=e.message)

    async def stop(self) -> None:
        """Stop polling, then unload every model once its in-flight requests are done."""
        if self._poll_task is not None:
            self._poll_task.cancel()
        await asyncio.gather(*(self.unload(name) for name in list(self.repository.models)),
                             return_exceptions=True)
        for root in self._temp_dirs.values():
            shutil.rmtree(root.parent, ignore_errors=True)

    # -- the API -------------------------------------------------------------------------
    def check_api_allowed(self) -> None:
        if self.mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None,
                   *, for_ensemble: bool = False) -> None:
        """Load or reload ``name``; raises with the reason when any chosen version fails.
        ``for_ensemble``: loaded as an ensemble's composing model, not on its own request."""
        mcfg.validate_model_name(name)
        check_name_length(name)
        if for_ensemble:
            self._implicit.add(name)
        elif not self.repository.versions_of(name):  # a loaded model keeps how it came in
            self._implicit.discard(name)
        if files:  # the client's overrides: one that can not be laid out is its error (400), logged as Triton does
            try:
                if config_json is None:
                    raise InvalidArgument("Load parameter 'config' must be specified for model file override")
                model_dir = write_override_files(name, files)
            except InvalidArgument as e:
                log.error("Poll failed for model directory '%s': %s", name, e.message)
                raise InvalidArgument(f"failed to load '{name}': {e.message}") from None
        else:
            try:
                found = self.repository.scan().get(name)  # raises for a name in several repositories
            except InvalidArgument as e:
                raise self._poll_failed(name, e.message) from None
            if found is None:
                raise self._poll_failed(name, f"no model directory '{name}' in the model repository")
            model_dir = found
        entry = self.repository.entry(name, model_dir)
        if config_json is None and _is_ensemble(model_dir, self.config_name):
            # Loading an ensemble loads its composing models that are not loaded yet.
            for step_model in composing_models(mcfg.read_config(model_dir, self.config_name)):
                if step_model != name and not self.repository.versions_of(step_model):
                    try:
                        await self.load(step_model, for_ensemble=True)
                    except TritonShmError as e:
                        reason = f"composing model '{step_model}' is not available: {e.message}"
                        if not entry.ready_versions():
                            entry.state, entry.reason = UNAVAILABLE, reason
                        log.error("failed to load ensemble '%s': %s", name, reason)
                        raise InvalidArgument(f"failed to load ensemble '{name}': {reason}") from None
        async with entry.lock, self._load_slots:
            loaded = False
            try:
                await self._load_locked(entry, model_dir, config_json)
                loaded = True
            finally:
                self._settle_temp_dir(name, model_dir if files else None, loaded)

    def _poll_failed(self, name: str, detail: str) -> PollFailed:
        """The error of a model that cannot be read from the repository, logged with why."""
        log.error("Poll failed for model directory '%s': %s", name, detail)
        self._poll_failures[name] = detail
        return PollFailed(name)

    def _settle_temp_dir(self, name: str, new_dir: Path | None, loaded: bool) -> None:
        """Keep a file-override directory while its model serves from it; remove the
        one it replaced, or the new one when the load failed."""
        if not loaded:
            if new_dir is not None:
                shutil.rmtree(new_dir.parent, ignore_errors=True)
            return
        old = self._temp_dirs.pop(name, None)
        if new_dir is not None:
            self._temp_dirs[name] = new_dir
        if old is not None and old != new_dir:
            shutil.rmtree(old.parent, ignore_errors=True)

    async def _load_locked(self, entry: ModelEntry, model_dir: Path, config_json: str | None) -> None:
        name = entry.name
        snapshot = fingerprint(model_dir)
        try:
            if not self.external_links:
                check_links_inside(model_dir)
            try:
                base = self._poll_config(name, model_dir, config_json)
            except TritonShmError as e:
                entry.fingerprint = snapshot  # poll mode retries only once the files change
                raise self._poll_failed(name, e.message) from None
            self._check_override(name, model_dir, base, config_json)
            mcfg.fill_defaults(base, name, mcfg.backend_of(base, model_dir), self.repository.gpus)
            chosen = select_versions(base, version_dirs(model_dir))
            if not chosen:
                raise InvalidArgument(f"model '{name}' has no version folder to load")
        except PollFailed:
            raise
        except TritonShmError as e:
            if not entry.ready_versions():
                entry.state, entry.reason = UNAVAILABLE, e.message
            entry.fingerprint = snapshot  # poll mode retries only once the files change
            log.error("failed to load '%s': %s", name, e.message)
            raise
        generation = next(self._generations)
        fresh = {v: ModelVersion(name, v, model_dir, base, generation=generation) for v in chosen}
        if not entry.versions:
            entry.versions.update(fresh)  # first load: show LOADING in the index
        await asyncio.gather(*(self._load_version(mv, base) for mv in fresh.values()))
        failed = [mv for mv in fresh.values() if not mv.ready]
        if failed:
            for mv in fresh.values():
                if mv.ready:
                    await self._retire(mv)
            entry.fingerprint = snapshot  # poll mode retries only once the files change
            reason = "; ".join(f"version {mv.version}: {mv.reason}" for mv in failed)
            if any(v.ready for v in entry.versions.values() if v not in fresh.values()):
                entry.reason = reason  # a failed reload leaves the old versions serving
            else:
                entry.versions = {mv.version: mv for mv in fresh.values()}
                entry.state, entry.reason = UNAVAILABLE, reason
            raise InvalidArgument(f"load failed for model '{name}': {reason}")
        old = entry.versions
        entry.versions = dict(fresh)
        entry.model_dir, entry.state, entry.reason, entry.fingerprint = model_dir, READY, "", snapshot
        self._poll_failures.pop(name, None)
        await asyncio.gather(*(self._retire(mv) for mv in old.values() if mv not in fresh.values()))

    def _poll_config(self, name: str, model_dir: Path, config_json: str | None) -> mcfg.ModelConfig:
        """The config as read from the repository (or as the override gives it), before its
        defaults; raises what Triton's repository poll fails on (a PollFailed to the
        caller): a config that cannot be read or parsed, one naming another model, a
        negative max_batch_size, or no way to tell the backend. What fails later (an unknown
        backend, a GPU instance without a GPU) fails the load of the versions instead."""
        if config_json is None:
            base = self._read_config(name, model_dir)
        else:
            import orjson
            try:
                data = orjson.loads(config_json)
            except orjson.JSONDecodeError as e:
                raise InvalidArgument(f"failed to parse the 'config' parameter of model '{name}': {e}") from None
            if not isinstance(data, dict):
                raise InvalidArgument(f"the 'config' parameter of model '{name}' must be a JSON object")
            base = mcfg.config_from_json(data, f"config override of model '{name}'")
            if base.name and base.name != name:
                raise InvalidArgument(f"the config override names model '{base.name}', not '{name}'")
        if base.name and base.name != name:
            raise InvalidArgument(f"model name in config.pbtxt ('{base.name}') does not match the "
                                  f"directory name '{name}'")
        if base.max_batch_size < 0:
            raise InvalidArgument(f"'max_batch_size' must be non-negative value for {name}")
        if not (base.platform or base.backend):
            mcfg.backend_of(base, model_dir)  # from the model file present, or it raises
        return base

    def _check_override(self, name: str, model_dir: Path, base: mcfg.ModelConfig, config_json: str | None) -> None:
        """A config override keeps the platform and backend of the config on disk (a load
        failure, not a poll failure: the override itself is a valid config)."""
        if config_json is None or not mcfg.config_path(model_dir, self.config_name).is_file():
            return
        try:
            on_disk = mcfg.read_config(model_dir, self.config_name)
        except TritonShmError:
            return  # the override replaces a config that cannot be read
        for field_name in ("platform", "backend"):
            ours, theirs = getattr(base, field_name), getattr(on_disk, field_name)
            if ours and theirs and ours != theirs:
                raise InvalidArgument(f"the config override changes the {field_name} of model '{name}' "
                                      f"from '{theirs}' to '{ours}'")

    def _read_config(self, name: str, model_dir: Path) -> mcfg.ModelConfig:
        path = mcfg.config_path(model_dir, self.config_name)
        if not self.auto_complete and not path.is_file():
            raise InvalidArgument(f"model '{name}' has no {path.name} ({path}): a config file is required "
                                  "when config auto-complete is disabled (--disable-auto-complete-config)")
        return mcfg.read_config(model_dir, self.config_name)

    async def _complete(self, mv: ModelVersion, base: mcfg.ModelConfig) -> mcfg.ModelConfig:
        """The backend fills in what the config leaves out, unless auto-complete is off."""
        if not self.auto_complete:
            config = mcfg.ModelConfig()
            config.CopyFrom(base)
            return config
        completed = await self.pool.auto_complete(mv, mcfg.config_to_json(base))
        return mcfg.config_from_json(completed, f"auto-completed config of model '{mv.name}'")

    def _check_io(self, config: mcfg.ModelConfig) -> None:
        try:
            mcfg.check_io(config)
        except InvalidArgument as e:
            if self.auto_complete:
                raise
            raise InvalidArgument(f"{e.message} (config auto-complete is disabled)") from None

    async def _load_version(self, mv: ModelVersion, base: mcfg.ModelConfig) -> None:
        """Load one version; its state and reason say how it went."""
        ensemble = base.platform == mcfg.ENSEMBLE
        try:
            if ensemble:  # runs in the front-end: check the DAG against the loaded models
                config = base
                mcfg.check_io(config)
                validate_ensemble(config, self.repository)
            else:
                config = await self._complete(mv, base)
                self._check_io(config)
                check_batching_config(config)
                check_sequence_config(config, mv.model_dir)
            check_cache_config(config)
            check_model_metrics(config)
            mv.labels = load_labels(config, mv.model_dir, mv.name)
            if ensemble:
                ensemble_labels(mv.labels, config, self.repository)
            mv.set_config(config)
            mv.stats = ModelStats(mv.name, str(mv.version))
            if self.latency_summaries:
                mv.stats.enable_summaries()
            if self.latency_histograms:
                mv.stats.enable_histograms(histogram_buckets(config), decoupled=mv.decoupled)
            owner = None if ensemble or self.share is None else \
                self.share.owner_of(mv.name, config, rate_limited=self.limiter is not None)
            if ensemble:
                mv.scheduler = EnsembleScheduler(mv, self.repository, mv.stats)
            elif owner is not None and self.share is not None and owner != self.share.index:
                assert self.forwarding is not None  # given with the share (__init__)
                mv.owner, mv.caches_responses = owner, False  # the owner caches its responses
                mv.scheduler = self.forwarding(mv, owner)
            else:
                if owner is None and self.share is not None:
                    mv.instance_slice = self.share.instance_slice()
                claims = self._claims(mv)
                try:
                    await self.pool.load(mv)
                except BaseException:
                    if claims and self.limiter is not None:
                        self.limiter.unregister(claims)
                    raise
                scheduler = SequenceScheduler if config.HasField("sequence_batching") else DynamicScheduler
                mv.scheduler = scheduler(mv, self.pool, mv.stats, limiter=self.limiter if claims else None,
                                         claims=claims)
            mv.state, mv.reason = READY, ""
            log.info("successfully loaded '%s' version %d", mv.name, mv.version)
        except TritonShmError as e:
            mv.state, mv.reason = UNAVAILABLE, e.message
            log.error("failed to load '%s' version %d: %s", mv.name, mv.version, e.message)

    def _claims(self, mv: ModelVersion) -> list[Claim]:
        """The rate limiter's claims of ``mv``'s instances, registered (raises when one
        needs more of a resource than exists); none when the model or server has no limits."""
        if self.limiter is None or not any(g.HasField("rate_limiter") for g in mv.config.instance_group):
            return []
        claims = [claim_for(group, instance, device) for instance, group, device in self.pool.placements(mv)]
        self.limiter.register(claims)
        return claims

    async def _retire(self, mv: ModelVersion) -> None:
        """Stop taking requests, let queued and running ones finish, free the instances."""
        was_ready = mv.ready
        mv.state, mv.reason = UNLOADING, ""
        if mv.scheduler is not None:
            await mv.scheduler.drain()
            claims = getattr(mv.scheduler, "claims", None)
            if claims and self.limiter is not None:
                self.limiter.unregister(claims.values())
        if was_ready or mv.instances:
            try:
                await self.pool.unload(mv)
            except TritonShmError as e:
                log.warning("unloading '%s' version %d: %s", mv.name, mv.version, e.message)
        mv.state, mv.reason = UNAVAILABLE, UNLOADED
        log.info("successfully unloaded '%s' version %d", mv.name, mv.version)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """With ``unload_dependents`` the ensembles that use ``name`` go first, and the
        composing models an ensemble brought in go after it."""
        mcfg.validate_model_name(name)
        if unload_dependents:
            for ensemble in ensemble_dependents(self.repository, name):
                await self.unload(ensemble)
        entry = self.repository.models.get(name)
        if entry is None:
            return  # as Triton: unloading an unknown model succeeds
        steps = _composing_models_of(entry)
        await self._unload_entry(entry)
        self._implicit.discard(name)
        if unload_dependents:
            for step_model in steps:
                if step_model in self._implicit and not ensemble_dependents(self.repository, step_model):
                    await self.unload(step_model, unload_dependents=True)

    async def _unload_entry(self, entry: ModelEntry) -> None:
        name = entry.name
        async with entry.lock:
            await asyncio.gather(*(self._retire(mv) for mv in entry.versions.values()
                                   if mv.state in (READY, LOADING)))
            if entry.state != NOT_REQUESTED:
                entry.state, entry.reason = UNAVAILABLE, UNLOADED
            entry.fingerprint = ()
            self._settle_temp_dir(name, None, loaded=True)

    # -- poll mode -----------------------------------------------------------------------
    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_secs)
            try:
                await self.poll_once()
                if self.after_poll is not None:
                    await self.after_poll()
            except Exception:  # keep polling whatever one pass met
                log.exception("model repository poll failed")

    async def poll_once(self) -> None:
        """Apply what changed on disk. A model counts as changed only once its files
        have stayed the same for one whole poll interval, so a half-copied model is
        never loaded."""
        found = await asyncio.to_thread(self.repository.scan)
        current = {name: await asyncio.to_thread(fingerprint, path) for name, path in found.items()}
        tasks = []
        for name, fp in current.items():
            entry = self.repository.entry(name, found[name])
            if fp == entry.fingerprint:
                self._pending_changes.pop(name, None)
                continue
            if self._pending_changes.get(name) != fp:
                self._pending_changes[name] = fp  # changed since last poll: wait one more interval
                continue
            del self._pending_changes[name]
            log.info("model '%s' changed on disk; loading it", name)
            tasks.append(self._load_reporting(name))
        for name, entry in list(self.repository.models.items()):
            if name not in current and entry.versions and any(v.ready for v in entry.versions.values()):
                log.info("model '%s' was removed from the repository; unloading it", name)
                tasks.append(self.unload(name))
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- several front-end processes: one outcome per model ------------------------------
    def owned_states(self) -> dict[str, Any]:
        """The state of every model this process runs itself (not only forwards)."""
        states = {}
        for name, entry in self.repository.models.items():
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
        for name, entry in list(self.repository.models.items()):
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
                await self.unload(name)
                entry.state, entry.reason = UNAVAILABLE, reasons
                for mv in versions:
                    mv.state, mv.reason = UNAVAILABLE, reasons
                continue
            entry.state, entry.reason = settled["state"], settled["reason"]
            for mv in versions:
                state = settled["versions"].get(str(mv.version))
                if state is not None:
                    mv.state, mv.reason = state

    # -- reporting -----------------------------------------------------------------------
    def failed_models(self) -> list[str]:
        failed = [f"{e.name}: {e.reason or '; '.join(v.reason for v in e.versions.values() if not v.ready)}"
                  for e in self.repository.models.values()
                  if e.state != NOT_REQUESTED and not all(v.ready for v in e.versions.values()) or
                  (e.state == UNAVAILABLE and not e.versions)]
        return failed + [f"{name}: {detail}" for name, detail in self._poll_failures.items()]


def _all_ready(entry: ModelEntry) -> bool:
    """Every version the model chose is serving (a failed one makes the model failed)."""
    return bool(entry.versions) and all(mv.ready for mv in entry.versions.values())


def _composing_models_of(entry: ModelEntry) -> list[str]:
    """Every model a loaded version of the ensemble ``entry`` uses as a step (none for
    other models)."""
    names: dict[str, None] = {}
    for mv in entry.versions.values():
        if mv.state in (READY, LOADING) and mv.config.platform == mcfg.ENSEMBLE:
            names.update(dict.fromkeys(composing_models(mv.config)))
    return [n for n in names if n != entry.name]


def _is_ensemble(model_dir: Path, config_name: str = "") -> bool:
    try:
        return mcfg.read_config(model_dir, config_name).platform == mcfg.ENSEMBLE
    except TritonShmError:
        return False


def decode_load_parameters(parameters: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """``config`` (a JSON string) and ``file:<path>`` contents (base64 text or raw bytes)."""
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidArgument("the 'config' parameter must be a JSON string")
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith(FILE_PREFIX):
            continue
        path = key[len(FILE_PREFIX):]
        if isinstance(value, (bytes, bytearray)):
            files[path] = bytes(value)
        elif isinstance(value, str):
            try:
                files[path] = base64.b64decode(value, validate=True)
            except ValueError:
                raise InvalidArgument(f"parameter '{key}' must be base64-encoded file content") from None
        else:
            raise InvalidArgument(f"parameter '{key}' must be file content")
    return config, files
