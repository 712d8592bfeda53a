"""One tuning session against a server (tune's own or a running one): what the server has is
noted, the default is measured, candidates are searched and measured within the time budget, the
best is chosen and written, and the server is put back as it was."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import TuneError
from .choose import Verdict, clearly_better, verdict

if TYPE_CHECKING:
    from .cli import Progress


@dataclass
class Run:
    """One invocation: its flags, its progress line, and what it measured and concluded."""

    ns: argparse.Namespace
    progress: Progress
    candidates: list = field(default_factory=list)
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)  # the time budget counts the server's start


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _machine(cores: int, gpus: int) -> str:
    return f"{platform.node()}, {cores} CPU core(s), {gpus} GPU(s), Python {platform.python_version()}"


def _gpus(ns: argparse.Namespace, served: dict[str, Any]) -> int:
    """GPUs the candidates may use: none when the server tune starts is told --gpus none; for a
    running server, this machine's when it runs here, else one if the model already uses one."""
    from ..devices import visible_gpu_count
    if ns.url is None:
        args = " ".join(ns.server_arg).replace("=", " ").split()
        if "--gpus" in args and args.index("--gpus") + 1 < len(args) and args[args.index("--gpus") + 1] == "none":
            return 0
        return visible_gpu_count()
    if ns.url.rpartition(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
        return visible_gpu_count()
    return int(any(g.get("kind") == "KIND_GPU" for g in served.get("instance_group") or []))


def run_session(run: Run, control, server, tree, model_dir: Path, out: Path, http_url: str, grpc_url: str) -> int:
    from .control import ServerGone
    from .measure import PerfError, Settings, measure
    from .report import Candidate, write_csv, write_html
    from .search import Search
    from .space import Space, apply, knobs_of
    ns, progress = run.ns, run.progress
    model = ns.model
    t_start = run.started

    # what the server has now, to put back at the end
    state = control.model_state(model)
    if ns.url and state is None:
        raise TuneError(f"unknown model '{model}': the server at {http_url} does not list it in its repository")
    was_loaded = state == "READY"
    original: dict[str, Any] | None = control.config(model) if was_loaded else None
    if not was_loaded:
        try:
            control.load(model)
        except ServerGone:
            raise
        except TuneError as e:
            raise TuneError(f"model '{model}' does not load with its own config: {e}") from None
    restored = [False]

    def restore() -> None:
        if restored[0] or server is not None:
            return
        restored[0] = True
        try:
            if was_loaded:
                control.load(model, original)
            else:
                control.unload(model)
        except TuneError as e:
            progress.say(f"warning: could not put model '{model}' back as it was: {e}")

    try:
        served = control.config(model)
        if served.get("platform") == "ensemble":
            raise TuneError(f"model '{model}' is an ensemble: it has no instances or batching of its own to tune; "
                            "tune its composing models")
        if original is None:
            original = served
        base = knobs_of(served)
        cores, gpus = _cores(), _gpus(ns, served)
        max_instances = ns.max_instances or cores
        space = Space.for_model(served, cores=max_instances, gpus=gpus, max_batch_size_cap=ns.max_batch_size)
        score_cache: dict[Any, Any] = {}

        def score(k):
            v = score_cache.get(k)
            return v.key if v is not None else None

        search = Search(space, base, score)
        settings = Settings(model=model, url=grpc_url if ns.protocol == "grpc" else http_url, protocol=ns.protocol,
                            concurrency=ns.concurrency, interval_ms=ns.measurement_interval_ms,
                            stability_pct=ns.stability_percentage, max_trials=ns.max_trials)
        dims = ", ".join(f"{n} {'/'.join(str(v) for v in vals)}" for n, vals in space.dims.items())
        progress.say(f"tuning '{model}': {space.size()} configs in the space ({dims}); {search.strategy}; "
                     f"concurrency {','.join(map(str, ns.concurrency))}; time budget {ns.time_budget_s:g} s")
        best: list[Any] = [None]
        durations: list[float] = []

        def show(k: int, n: int, what: str) -> None:
            b = best[0]
            best_txt = (f"best so far {b.name} {run.verdicts[b.index].text}" if b is not None else "no best yet")
            progress.line(f"[tune] candidate {k} of {n}  {time.monotonic() - t_start:5.0f}s  {what}  | {best_txt}")

        def consider(c: Candidate) -> None:
            v = verdict(c.points, ns.objective, ns.latency_budget_ms) if c.status == "ok" else None
            if v is None:
                return
            run.verdicts[c.index] = v
            score_cache[c.knobs] = v
            b = best[0]
            if b is None or v.key > run.verdicts[b.index].key:
                best[0] = c

        def measure_candidate(c: Candidate, load: bool) -> None:
            t0 = time.monotonic()
            run.candidates.append(c)
            n = max(len(run.candidates), search.planned() + 1)
            show(c.index + 1, n, f"loading {c.knobs.label()}" if load else f"measuring {c.knobs.label()}")
            try:
                if load:
                    try:
                        control.load(model, apply(served, c.knobs))
                    except ServerGone as e:
                        c.status = f"server went away: {e}"
                        raise
                    except TuneError as e:
                        c.status = f"load failed: {e}"
                        progress.say(f"candidate {c.name} ({c.knobs.label()}) did not load: {e}")
                        return
                    show(c.index + 1, n, f"measuring {c.knobs.label()}")
                try:
                    c.points = []
                    measure(settings, tree, progress.engine, c.points.append)
                    c.status = "ok"
                    failed = sum(p.errors for p in c.points)
                    if failed:  # its points with errors do not count (verdict)
                        progress.say(f"candidate {c.name} ({c.knobs.label()}): {failed} request(s) failed")
                    unstable = [str(p.concurrency) for p in c.points if not p.stable]
                    if unstable:
                        progress.say(f"candidate {c.name} ({c.knobs.label()}): concurrency {','.join(unstable)} not "
                                     f"stable within {ns.max_trials} windows (±{ns.stability_percentage:g}%); "
                                     "its last 3 windows are used")
                except PerfError as e:
                    if server is not None and not server.alive() or not control.live():
                        c.status = f"server went away: {e}"
                        raise ServerGone(f"the server went away while measuring candidate {c.name} "
                                         f"({c.knobs.label()}): {e}") from None
                    c.status = f"measure failed: {e}"
                    progress.say(f"candidate {c.name} ({c.knobs.label()}) could not be measured: {e}")
            finally:
                c.seconds = time.monotonic() - t0
                durations.append(c.seconds)
                consider(c)
                write_csv(out / "measurements.csv", run.candidates, ns.latency_budget_ms)

        aborted: str | None = None
        try:
            default = Candidate(0, base)
            measure_candidate(default, load=False)
            if default.status != "ok":
                hint = (f" (the gRPC endpoint {grpc_url} is a guess from --url: give --grpc-url, or --protocol http)"
                        if ns.url and not ns.grpc_url and ns.protocol == "grpc" else "")
                raise TuneError(f"the model's own config could not be measured: {default.status}{hint}")
            score_cache[base] = run.verdicts.get(0)
            while True:
                k = search.next()
                if k is None:
                    break
                if k == base:
                    continue  # the default, measured already
                elapsed = time.monotonic() - t_start
                estimate = max(durations[-3:]) if durations else 0.0
                if elapsed + estimate > ns.time_budget_s:
                    run.messages.append(f"stopped at the time budget ({ns.time_budget_s:g} s) after "
                                        f"{len(run.candidates)} candidates")
                    break
                measure_candidate(Candidate(len(run.candidates), k), load=True)
            if not run.messages:
                run.messages.append(f"search finished ({search.strategy}) after {len(run.candidates)} candidates")
        except ServerGone as e:
            aborted = str(e)
        progress.done()

        chosen = best[0]
        v_chosen = run.verdicts.get(chosen.index) if chosen is not None else None
        v_default = run.verdicts.get(0)
        if chosen is not None and chosen.index != 0 and v_chosen is not None and v_default is not None \
                and v_default.feasible and not clearly_better(v_chosen, v_default, ns.objective,
                                                              ns.stability_percentage):
            summary_note = (f"kept the model's own config: the best candidate ({chosen.name}, {v_chosen.text}) "
                            f"is within the measurement noise ({ns.stability_percentage:g}%) of it")
            run.messages.append(summary_note)
            chosen, v_chosen = run.candidates[0], v_default
        summary = list(run.messages)
        rc = 0
        if aborted:
            summary.append(f"aborted: {aborted}")
            rc = 1
        if v_chosen is None or not v_chosen.feasible:
            closest = f" (the lowest p99 measured: {v_chosen.point.p99_ms:.2f} ms, {chosen.name})" if v_chosen else ""
            what = (f"no candidate meets the p99 latency budget of {ns.latency_budget_ms:g} ms{closest}"
                    if ns.latency_budget_ms is not None and v_chosen is not None else "no candidate could be measured")
            summary.append(f"nothing chosen: {what}")
            chosen = None
            rc = 1
        else:
            summary.append(f"chosen {chosen.name}: {chosen.knobs.label()}: {v_chosen.text}")
            if v_default is not None and v_default.feasible:
                gain = v_chosen.point.throughput / v_default.point.throughput if v_default.point.throughput else 0
                summary.append(f"default: {base.label()}: {v_default.text} (gain x{gain:.2f})")
            else:
                summary.append(f"default: {base.label()}: "
                               + (v_default.text if v_default else "could not be measured"))
        write_csv(out / "measurements.csv", run.candidates, ns.latency_budget_ms)
        write_html(out / "report.html", model=model, candidates=run.candidates, chosen=chosen,
                   budget_ms=ns.latency_budget_ms, objective=ns.objective, summary=summary,
                   machine=_machine(_cores(), gpus), score_text={i: v.text for i, v in run.verdicts.items()})
        if chosen is not None and v_chosen is not None:
            _write_config(model_dir, out, served, base, chosen, v_chosen, v_default, ns)
        _write_summary(out / "summary.json", run, chosen, v_chosen, v_default, time.monotonic() - t_start, rc)
        for line in summary:
            progress.say(line)
        progress.say(f"wrote {out / 'measurements.csv'}, {out / 'report.html'}"
                     + (f", {out / 'config.pbtxt'}" if chosen is not None else ""))
        return rc
    finally:
        restore()


def _write_summary(path: Path, run: Run, chosen, v_chosen: Verdict | None, v_default: Verdict | None,
                   seconds: float, rc: int) -> None:
    """The outcome in a form scripts read (bench/tune.py does)."""
    def point(v: Verdict | None) -> dict[str, Any] | None:
        if v is None:
            return None
        p = v.point
        return {"feasible": v.feasible, "concurrency": p.concurrency, "throughput": p.throughput,
                "p50_ms": p.p50_ms, "p99_ms": p.p99_ms, "cpu_ms_per_infer": p.cpu_ms_per_inf, "rss_mib": p.rss_mib}
    default = run.candidates[0] if run.candidates else None
    data = {"model": run.ns.model, "exit_status": rc, "seconds": round(seconds, 1),
            "candidates": len(run.candidates), "messages": run.messages,
            "default": {"config": default.knobs.label() if default else None, "best": point(v_default)},
            "chosen": {"candidate": chosen.name, "config": chosen.knobs.label(), "best": point(v_chosen)}
            if chosen is not None else None}
    path.write_text(json.dumps(data, indent=2) + "\n")


def _write_config(model_dir: Path, out: Path, served: dict[str, Any], base, chosen, v_chosen, v_default,
                  ns: argparse.Namespace) -> None:
    from ..core.models.config import config_path
    from .configfile import changes, tuned_text
    from .space import apply
    user_path = config_path(model_dir)
    user_text = user_path.read_text() if user_path.is_file() else ""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    budget = f"p99 budget {ns.latency_budget_ms:g} ms" if ns.latency_budget_ms is not None else "no latency budget"
    comment = [f"triton-shm tune, {when}: objective {ns.objective}, {budget}, concurrency "
               f"{','.join(map(str, ns.concurrency))}, on {_machine(_cores(), 0).split(',', 1)[1].strip()}"]
    diff = changes(base, chosen.knobs)
    comment += [f"changed {d}" for d in diff] or ["nothing changed: the model's own config was the best measured"]
    comment.append(f"chosen: {v_chosen.text}")
    if v_default is not None:
        comment.append(f"its own config: {v_default.text}")
    text = tuned_text(user_text, apply(served, chosen.knobs), base, chosen.knobs, comment)
    (out / "config.pbtxt").write_text(text)

