"""The model repository: what models exist on disk, which versions are loaded, and
their state. Loading itself is delegated to the worker pool."""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InvalidArgument, NotFound, Unavailable
from . import config as mcfg
from .version import LOADING, READY, UNAVAILABLE, ModelVersion

log = logging.getLogger("triton_shm.repository")

NOT_REQUESTED = ""  # on disk, never asked to load (explicit mode)
UNLOADED = "unloaded"  # the reason of a model or version that was unloaded on purpose


@dataclass(eq=False)
class ModelEntry:
    """A model directory and its versions."""
    name: str
    model_dir: Path
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    state: str = LOADING   # used when the model failed before any version existed
    reason: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one load/unload at a time
    fingerprint: tuple = ()  # files as last loaded (poll mode reloads on change)

    def ready_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.ready]


def check_links_inside(model_dir: Path) -> None:
    """Refuse a model directory that is, or holds, a symbolic link leading outside the
    folder it was found in (its model repository): model files come from the repository,
    not from wherever a link points. Where a link leads is not said (it is the server's)."""
    boundary = os.path.realpath(model_dir.parent)

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == boundary or real.startswith(boundary + os.sep)

    if model_dir.is_symlink() and not inside(str(model_dir)):
        raise InvalidArgument(f"model '{model_dir.name}' is a symbolic link that leads outside the model "
                              f"repository ({EXTERNAL_LINKS_FLAG}=true allows it)")
    for root, dirs, files in os.walk(model_dir):
        for entry in dirs + files:
            path = os.path.join(root, entry)
            if os.path.islink(path) and not inside(path):
                rel = os.path.relpath(path, model_dir)
                raise InvalidArgument(f"'{rel}' in model '{model_dir.name}' is a symbolic link that leads outside "
                                      f"the model repository ({EXTERNAL_LINKS_FLAG}=true allows it)")


EXTERNAL_LINKS_FLAG = "--allow-external-model-links"


def version_dirs(model_dir: Path) -> list[int]:
    """Numeric version folders; anything else but ``configs/`` (--model-config-name) is
    ignored with a warning."""
    versions = []
    for child in model_dir.iterdir():
        if not child.is_dir() or child.name == mcfg.CONFIGS_DIR:
            continue
        if child.name.isdigit() and (child.name == "0" or not child.name.startswith("0")):
            versions.append(int(child.name))
        else:
            log.warning("ignoring '%s' in model '%s': version folders must be numbers",
                        child.name, model_dir.name)
    return sorted(versions)


def select_versions(config: mcfg.ModelConfig, available: list[int]) -> list[int]:
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        return [v for v in available if v in set(policy.specific.versions)]
    n = policy.latest.num_versions if which == "latest" else 1
    return available[-max(n, 1):] if available else []


class ModelRepository:
    def __init__(self, paths: list[Path], gpus: list[int] | None = None):
        self.paths = [Path(p) for p in paths]
        self.gpus = list(gpus or [])  # the GPU ids the server serves (--gpus), one worker each
        self.models: dict[str, ModelEntry] = {}

    # -- discovery -----------------------------------------------------------------------
    def scan(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for root in self.paths:
            if not root.is_dir():
                raise InvalidArgument(f"model repository '{root}' is not a directory")
            for child in sorted(root.iterdir()):
                if not child.is_dir() or child.name.startswith("."):
                    continue
                if child.name in found:
                    raise InvalidArgument(f"model '{child.name}' appears in more than one model "
                                          f"repository ({found[child.name].parent} and {root})")
                found[child.name] = child
        return found

    # -- lookup --------------------------------------------------------------------------
    def get(self, name: str, version: str = "", *, require_ready: bool = False) -> ModelVersion:
        entry = self.models.get(name)
        if entry is None or (entry.state == NOT_REQUESTED and not entry.versions):  # never loaded: as Triton
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            if not version.isdigit():
                raise InvalidArgument(f"invalid model version '{version}'")
            mv = entry.versions.get(int(version))
            if mv is not None and require_ready and mv.recovering:
                raise Unavailable(f"model '{name}' version {version} is not available: {mv.reason}")
            if mv is None or (require_ready and not mv.ready):
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
            return mv
        # ``entry.ready_versions()[-1]`` without sorting or a call of its own: every
        # request that names no version asks for it
        latest, latest_version = None, -1
        for v, mv in entry.versions.items():
            if v > latest_version and mv.state == READY:
                latest, latest_version = mv, v
        if latest is not None:
            return latest
        if require_ready:
            recovering = [v for _, v in sorted(entry.versions.items()) if v.recovering]
            if recovering:
                raise Unavailable(f"model '{name}' is not available: {recovering[-1].reason}")
            raise NotFound(f"Request for unknown model: '{name}' has no available versions")
        if entry.versions:
            return entry.versions[max(entry.versions)]
        raise NotFound(f"Request for unknown model: '{name}' has no available versions")

    def refresh(self) -> None:
        """Bring the never-loaded entries in line with the directories, as Triton's index
        reads the repository each time: a model added since start is listed (by name), one
        removed before it was ever loaded is no longer. A repository that cannot be read
        leaves the entries as they are."""
        try:
            found = self.scan()
        except (InvalidArgument, OSError) as e:
            log.warning("model repository index: %s", getattr(e, "message", e))
            return
        for name, path in found.items():
            self.entry(name, path)
        for name in [n for n, e in self.models.items()
                     if n not in found and e.state == NOT_REQUESTED and not e.versions]:
            del self.models[name]

    def entry(self, name: str, model_dir: Path) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            entry = self.models[name] = ModelEntry(name, model_dir, state=NOT_REQUESTED)
        return entry

    def versions_of(self, name: str) -> list[str]:
        entry = self.models.get(name)
        return [str(v.version) for v in entry.ready_versions()] if entry else []

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """Statistics of every ready version, of one model, or of one version."""
        if name:
            entry = self.models.get(name)
            versions = [mv for mv in entry.versions.values() if mv.stats] if entry else []
            if version:
                versions = [mv for mv in versions if str(mv.version) == version]
            if not versions:
                target = f"'{name}'" + (f" version {version}" if version else "")
                raise NotFound(f"requested model {target} is not available")
        else:
            versions = [mv for e in self.models.values() for mv in e.versions.values() if mv.stats and mv.ready]
        return [mv.stats.as_dict() for mv in sorted(versions, key=lambda m: (m.name, m.version)) if mv.stats]

    def all_ready(self) -> bool:
        """Every model that should be loaded has all its versions READY (strict
        readiness); models never asked for, or unloaded on purpose, do not count."""
        def settled(e: ModelEntry) -> bool:
            if e.state == NOT_REQUESTED or (e.state == UNAVAILABLE and e.reason == UNLOADED):
                return True
            return bool(e.versions) and all(v.ready for v in e.versions.values())
        return all(settled(e) for e in self.models.values())

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        for name in sorted(self.models):
            entry = self.models[name]
            if not entry.versions:
                if not ready_only:
                    row = {"name": name}
                    if entry.state != NOT_REQUESTED:  # never asked to load: name only, as Triton lists it
                        row.update(version="", state=entry.state)
                        if entry.reason:
                            row["reason"] = entry.reason
                    rows.append(row)
                continue
            for v, mv in sorted(entry.versions.items()):
                if ready_only and not mv.ready:
                    continue
                row = {"name": name, "version": str(v), "state": mv.state}
                if mv.reason:
                    row["reason"] = mv.reason
                rows.append(row)
        return rows

    def status_table(self) -> str:
        """Model/version/status table printed at start, as Triton prints it."""
        rows = [("Model", "Version", "Status")]
        for r in self.index():
            if "state" not in r:
                continue  # on disk, not asked to load
            status = r["state"] if r["state"] == READY else f"{r['state']}: {r.get('reason', '')}"
            rows.append((r["name"], r["version"], status))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        out = [line]
        for i, row in enumerate(rows):
            out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
            if i == 0:
                out.append(line)
        out.append(line)
        return "\n".join(out)
