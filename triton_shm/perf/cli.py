"""``triton-shm perf`` flags, with perf_analyzer's names where it has them.

Exit status: 0 all requests succeeded; 1 a request failed, the server went away, or the
model could not be used; 2 bad flags; 130 interrupted (SIGINT/SIGTERM). Errors are one
line on stderr (set TRITON_SHM_PERF_DEBUG=1 for a traceback of unexpected ones).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import sys
import traceback

from . import PerfError, UsageError

DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
# What the 'perf' extra brings; the server's own install does not need them.
PERF_EXTRA_MODULES = ("tritonclient", "hpack")


def check_dependencies() -> None:
    missing = [m for m in PERF_EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the load generator needs {' and '.join(missing)}, not installed here: "
                         "pip install 'triton-shm[perf]'")


def positive_int(v: str) -> int:
    """An argparse type: a whole number >= 1 (the server's flags use it too)."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{v}'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{v}'")
    return n


def _positive_float(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{v}'") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{v}'")
    return x


def _percentile(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = -1
    if not 0 < x < 100:
        raise argparse.ArgumentTypeError(f"expected a percentile between 1 and 99, got '{v}'")
    return x


def parse_range(flag: str, text: str, integer: bool) -> list[float]:
    """perf_analyzer's ``start[:end[:step]]``."""
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 3 or any(not p.strip() for p in parts):
            raise ValueError
        nums = [int(p) if integer else float(p) for p in parts]
    except ValueError:
        kind = "integers" if integer else "numbers"
        raise UsageError(f"{flag} '{text}': expected start[:end[:step]] with positive {kind}") from None
    start = nums[0]
    end = nums[1] if len(nums) > 1 else start
    step = nums[2] if len(nums) > 2 else 1
    if start <= 0 or step <= 0:
        raise UsageError(f"{flag} '{text}': start and step must be positive")
    if end < start:
        raise UsageError(f"{flag} '{text}': end ({end:g}) is below start ({start:g})")
    values, i = [], 0
    while True:
        v = start + i * step
        if v > end + (0 if integer else 1e-9 * max(1.0, end)):
            break
        values.append(v)
        i += 1
        if len(values) > 10000:
            raise UsageError(f"{flag} '{text}': more than 10000 steps")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-shm perf",
        description="perf_analyzer-style load generator for any KServe V2 server (Triton, triton-shm).",
        epilog="Exit status: 0 ok, 1 request errors or server/model problems, 2 bad flags, 130 interrupted.")
    add = p.add_argument
    add("-m", dest="model", required=True, metavar="MODEL", help="model name")
    add("-x", dest="version", default="", metavar="VERSION", help="model version (default: the server's choice)")
    add("-u", dest="url", default=None, metavar="URL",
        help="server address host:port (default localhost:8001 for grpc, localhost:8000 for http)")
    add("-i", dest="protocol", default="grpc", type=str.lower, choices=["grpc", "http"],
        help="protocol (default grpc)")
    add("-b", dest="batch_size", type=positive_int, default=1, metavar="N",
        help="batch size of each request (default 1; the batch dimension is prepended when the model "
             "has max_batch_size > 0)")
    add("--concurrency-range", default=None, metavar="START:END:STEP",
        help="concurrency mode: keep N requests outstanding, for each N in the range (default 1)")
    add("--request-rate-range", default=None, metavar="START:END:STEP",
        help="request-rate mode: send requests at these rates (requests/sec)")
    add("--request-distribution", default="constant", type=str.lower, choices=["constant", "poisson"],
        help="request-rate mode: intervals between requests (default constant)")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2",
        help="shape of an input with dynamic dimensions, without the batch dimension (repeatable)")
    add("--input-data", default="random", metavar="zero|random|FILE.json",
        help="input values: zero, random (default), or a perf_analyzer JSON file ({\"data\": [{...}]})")
    add("--shared-memory", default="none", type=str.lower, choices=["none", "system", "cuda"],
        help="send inputs and receive outputs through shared memory (default none); cuda: buffers on "
             "this machine's CUDA device 0, registered as the server's GPU 0 (needs CuPy)")
    add("--output-shared-memory-size", type=positive_int, default=100 * 1024, metavar="BYTES",
        help="bytes per batch element of each output's shared-memory region where the model does not fix "
             "the output's size (dynamic dims, BYTES) (default 102400)")
    add("--measurement-interval", "-p", dest="interval_ms", type=_positive_float, default=5000.0, metavar="MS",
        help="length of one measurement window in milliseconds (default 5000)")
    add("--percentile", type=_percentile, default=None, metavar="P",
        help="use the P-th percentile latency (e.g. 95) for stability and reporting instead of the average")
    add("--stability-percentage", "-s", dest="stability_pct", type=_positive_float, default=10.0, metavar="PCT",
        help="the last 3 windows must agree within this percentage (default 10)")
    add("--max-trials", "-r", dest="max_trials", type=positive_int, default=10, metavar="N",
        help="most measurement windows per step (default 10)")
    add("-f", dest="csv", default=None, metavar="FILE.csv", help="write the results as perf_analyzer-like CSV")
    add("--streaming", action="store_true", help="send over one gRPC bidirectional stream (ModelStreamInfer)")
    add("--async", "-a", dest="async_", action="store_true",
        help="accepted for perf_analyzer compatibility; the generator is always asynchronous")
    add("--plot", default=None, metavar="FILE.png",
        help="plot throughput vs latency (needs matplotlib: pip install 'triton-shm[plot]')")
    return p


def options_from_args(ns: argparse.Namespace):
    from .load import Options
    if ns.concurrency_range and ns.request_rate_range:
        raise UsageError("--concurrency-range and --request-rate-range cannot be used together")
    if ns.request_rate_range:
        mode, values = "request_rate", parse_range("--request-rate-range", ns.request_rate_range, integer=False)
    else:
        mode, values = "concurrency", parse_range("--concurrency-range", ns.concurrency_range or "1", integer=True)
    if ns.streaming and ns.protocol != "grpc":
        raise UsageError("--streaming needs -i grpc")
    if ns.shared_memory == "cuda":  # CuPy and a CUDA device here, before any load
        from .cuda import check_available
        check_available()
    if ns.plot:
        from .report import check_plot_available
        check_plot_available()
    url = ns.url or f"localhost:{DEFAULT_PORTS[ns.protocol]}"
    if ns.protocol == "grpc":
        for scheme in ("grpc://", "http://"):
            if url.startswith(scheme):
                url = url[len(scheme):]
    if ns.input_data not in ("zero", "random") and not os.path.isfile(ns.input_data):
        raise UsageError(f"--input-data '{ns.input_data}': expected zero, random or an existing JSON file")
    return Options(model=ns.model, version=ns.version, url=url, protocol=ns.protocol, batch_size=ns.batch_size,
                   mode=mode, values=values, distribution=ns.request_distribution, shapes=ns.shape,
                   input_data=ns.input_data, shared_memory=ns.shared_memory,
                   output_shm_size=ns.output_shared_memory_size, interval_ms=ns.interval_ms,
                   percentile=ns.percentile, stability_pct=ns.stability_pct, max_trials=ns.max_trials,
                   streaming=ns.streaming)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    prog = "triton-shm perf"
    try:
        check_dependencies()
        opts = options_from_args(ns)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code

    from .load import run
    from .report import print_step, print_summary, write_csv, write_plot

    print(f"*** Measurement Settings ***\n  Model: {opts.model}  Protocol: {opts.protocol}  URL: {opts.url}\n"
          f"  Batch size: {opts.batch_size}  Measurement window: {opts.interval_ms:g} msec  "
          f"Stability: {opts.stability_pct:g}% over 3 windows, at most {opts.max_trials} windows\n"
          f"  {'Concurrency' if opts.mode == 'concurrency' else 'Request rate (' + opts.distribution + ')'}: "
          f"{', '.join(f'{v:g}' for v in opts.values)}"
          + (f"  Shared memory: {opts.shared_memory}" if opts.shared_memory != "none" else "")
          + ("  Streaming" if opts.streaming else "") + "\n", flush=True)

    loop = _new_loop()
    task = loop.create_task(run(opts, lambda r, has: print_step(r, has, opts.percentile)))
    interrupted = []

    def _interrupt(signame: str) -> None:
        interrupted.append(signame)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, _interrupt, sig.name)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        outcome = loop.run_until_complete(task)
    except asyncio.CancelledError:
        print(f"{prog}: interrupted ({interrupted[0] if interrupted else 'cancelled'}); "
              "shared-memory regions cleaned up", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except PerfError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - a clear line rather than a traceback
        if os.environ.get("TRITON_SHM_PERF_DEBUG"):
            traceback.print_exc()
        print(f"{prog}: error: unexpected {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:  # noqa: BLE001
            pass
        loop.close()

    print_summary(outcome.results, opts.percentile)
    if ns.csv:
        try:
            write_csv(ns.csv, outcome.results)
        except OSError as e:
            print(f"{prog}: error: cannot write {ns.csv}: {e}", file=sys.stderr)
            return 1
    if ns.plot:
        try:
            write_plot(ns.plot, outcome.results, opts.percentile)
        except Exception as e:  # noqa: BLE001
            print(f"{prog}: error: cannot write the plot {ns.plot}: {e}", file=sys.stderr)
            return 1
    if outcome.errors:
        print(f"{prog}: error: {outcome.errors} request(s) failed; first error: {outcome.first_error}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
