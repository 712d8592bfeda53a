"""``triton-shm tune``: its flags, its progress line, and reaching the server (starting its own,
or checking the one ``--url`` names); the session itself is :mod:`.session`.

Exit status: 0 a config was chosen and written; 1 nothing could be chosen (no candidate meets
the budget, the model does not load, the server went away) or the server could not be used;
2 bad flags; 130 interrupted. The CSV and the report are written in every case where
something was measured.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from . import TuneError, UsageError

DEFAULT_CONCURRENCY = "1,2,4,8,16"


def _positive(kind: type):
    def parse(v: str):
        try:
            x = kind(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got '{v}'") from None
        if not x > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got '{v}'")
        return x
    return parse


def _concurrency_list(v: str) -> list[int]:
    try:
        values = sorted({int(x) for x in v.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive integers, got '{v}'")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-shm tune",
        description="Find the best config of one model on this machine: instance count, KIND_CPU/KIND_GPU, "
                    "max_batch_size, dynamic batching and its queue delay, preferred batch size, and for Python "
                    "models PROCESS_PER_INSTANCE, each where it applies. Candidates are loaded through the "
                    "model-control API with a config override and measured with the 'perf' engine over a "
                    "concurrency sweep; the search climbs from a sensible start (every candidate when the space "
                    "is small) and stops within --time-budget-s. Writes OUTPUT/config.pbtxt (the model's "
                    "config with only the tuned fields changed), OUTPUT/report.html and OUTPUT/measurements.csv; "
                    "the repository is never written to.",
        epilog="Exit status: 0 a config was chosen; 1 nothing could be chosen (no candidate meets the budget, the "
               "model fails to load, the server went away); 2 bad flags; 130 interrupted.")
    add = p.add_argument
    add("--model-repository", required=True, metavar="DIR", help="the model repository holding the model")
    add("--model", required=True, metavar="NAME", help="the model to tune")
    add("--latency-budget-ms", type=_positive(float), default=None, metavar="MS",
        help="p99 latency a chosen point must stay within (default: none)")
    add("--objective", choices=["throughput", "latency"], default="throughput",
        help="throughput: the most inferences/s within the budget (default); latency: the lowest p99")
    add("--time-budget-s", type=_positive(float), default=600.0, metavar="S",
        help="stop starting new candidates when the next would end after S seconds (default 600)")
    add("--concurrency", type=_concurrency_list, default=_concurrency_list(DEFAULT_CONCURRENCY), metavar="LIST",
        help=f"the concurrency sweep of every candidate, comma-separated (default {DEFAULT_CONCURRENCY})")
    add("--output", default=None, metavar="DIR",
        help="where config.pbtxt, report.html and measurements.csv go (default ./tune-NAME); never the "
             "model's own directory")
    add("--url", default=None, metavar="HOST:PORT",
        help="tune a running triton-shm or Triton through its HTTP endpoint instead of starting a server; "
             "the model is left loaded (with the config it had) or unloaded, as it was found")
    add("--grpc-url", default=None, metavar="HOST:PORT",
        help="with --url: the server's gRPC endpoint for the load (default: the HTTP port + 1, Triton's layout)")
    add("--protocol", choices=["grpc", "http"], default="grpc", help="what the load is sent over (default grpc)")
    add("--max-instances", type=_positive(int), default=None, metavar="N",
        help="most instances to try (default: this machine's cores; a KIND_GPU count is per GPU, as in Triton)")
    add("--max-batch-size", type=_positive(int), default=None, metavar="N",
        help="largest max_batch_size to try, for a model that batches (default: the model's own)")
    add("--measurement-interval-ms", type=_positive(float), default=1000.0, metavar="MS",
        help="one measurement window of the perf engine (default 1000)")
    add("--stability-percentage", type=_positive(float), default=10.0, metavar="PCT",
        help="three windows in a row must agree within PCT (default 10)")
    add("--max-trials", type=_positive(int), default=6, metavar="N",
        help="most windows per concurrency step (default 6)")
    add("--server-arg", action="append", default=[], metavar="ARG",
        help="an argument for the server tune starts (repeatable), e.g. --server-arg=--gpus=none")
    add("--verbose", action="store_true", help="print the perf engine's window lines too")
    return p


# ------------------------------------------------------------------------------- progress

class Progress:
    """One live line on a terminal ('candidate k of n, elapsed, best so far'); whole lines otherwise."""

    def __init__(self, verbose: bool):
        self.tty = sys.stderr.isatty()
        self.verbose = verbose
        self._width = 0

    def line(self, text: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            sys.stderr.write("\r" + text + " " * pad)
            sys.stderr.flush()
            self._width = len(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def say(self, text: str) -> None:
        """A message of its own (keeps the live line below it)."""
        if self.tty and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            self._width = 0
        print(text, file=sys.stderr, flush=True)

    def engine(self, text: str) -> None:
        """The perf engine's lines: its windows and stability warnings with --verbose (tune counts
        the unstable steps itself), its errors always."""
        if self.verbose or text.startswith("error") or (text.startswith("warning") and "stable" not in text):
            self.say("  " + text)

    def done(self) -> None:
        if self.tty and self._width:
            sys.stderr.write("\n")
            self._width = 0


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    prog = "triton-shm tune"
    progress = Progress(ns.verbose)

    def _terminate(_signum: int, _frame: Any) -> None:  # stop as on Ctrl-C: the server stopped or put back
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        return _tune(ns, progress)
    except KeyboardInterrupt:
        progress.done()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except TuneError as e:
        progress.done()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code


def _check_paths(ns: argparse.Namespace) -> tuple[Path, Path, Path]:
    repo = Path(ns.model_repository)
    if not repo.is_dir():
        raise UsageError(f"--model-repository '{repo}' is not a directory")
    model_dir = repo / ns.model
    if not ns.model or "/" in ns.model or ns.model in (".", "..") or not model_dir.is_dir():
        raise UsageError(f"unknown model '{ns.model}': no directory '{model_dir}' in the repository")
    out = Path(ns.output or f"tune-{ns.model}")
    if out.resolve() == model_dir.resolve() or model_dir.resolve() in out.resolve().parents:
        raise UsageError(f"--output '{out}' is inside the model's directory; tune never writes to the repository")
    out.mkdir(parents=True, exist_ok=True)
    return repo, model_dir, out


def _tune(ns: argparse.Namespace, progress: Progress) -> int:
    from ..perf.cli import check_dependencies
    from ..perf import UsageError as PerfUsage
    try:
        check_dependencies()
    except PerfUsage as e:
        raise UsageError(str(e)) from None
    from .session import Run, run_session
    run = Run(ns, progress)
    repo, model_dir, out = _check_paths(ns)
    from .control import Control, OwnServer, ProcessTree, listening_pid
    server: OwnServer | None = None
    if ns.url:
        http_url = ns.url.removeprefix("http://")
        host, _, port = http_url.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--url is HOST:PORT, not '{ns.url}'")
        grpc_url = ns.grpc_url or f"{host}:{int(port) + 1}"
        control = Control(http_url)
        if not control.live():
            raise TuneError(f"the server at {http_url} does not answer (is it running, and is --url right?)")
        pid = listening_pid(host, int(port))  # a server on this machine: its CPU and memory too
        tree = ProcessTree(pid) if pid is not None else None
    else:
        if ns.grpc_url:
            raise UsageError("--grpc-url needs --url")
        progress.say(f"starting a server over {repo} (explicit model control); its log: {out / 'server.log'}")
        server = OwnServer(repo, out / "server.log", ns.server_arg).start()
        http_url, grpc_url = server.http_url, server.grpc_url
        control = Control(http_url)
        tree = ProcessTree(server.proc.pid) if server.proc else None
    try:
        return run_session(run, control, server, tree, model_dir, out, http_url, grpc_url)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
