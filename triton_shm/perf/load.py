"""Load generation: concurrency mode and request-rate mode (constant or Poisson arrivals),
async on one event loop, optionally over one gRPC stream, with system or CUDA shared memory."""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import PerfError, UsageError
from .client import ConnectionLost, InferError, make_client
from .inputs import build_input_sets, model_spec, output_region_size, parse_shape_flags
from .measure import (STABILITY_WINDOWS, Recorder, Result, ServerSnapshot, Window, is_stable, summarize,
                      window_metric)


# Where the engine's progress lines go: stderr, unless a caller (``triton-shm tune``, which
# shows one live line of its own) routes them elsewhere with :func:`progress_to`.
_progress_sink: Callable[[str], None] | None = None


def progress(msg: str) -> None:
    if _progress_sink is not None:
        _progress_sink(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Send the engine's progress lines to ``sink`` while the block runs."""
    global _progress_sink
    previous, _progress_sink = _progress_sink, sink
    try:
        yield
    finally:
        _progress_sink = previous


@dataclass
class Options:
    model: str
    version: str = ""
    url: str = ""
    protocol: str = "grpc"
    batch_size: int = 1
    mode: str = "concurrency"                 # or "request_rate"
    values: list[float] = field(default_factory=lambda: [1])
    distribution: str = "constant"
    shapes: list[str] = field(default_factory=list)
    input_data: str = "random"
    shared_memory: str = "none"
    output_shm_size: int = 100 * 1024
    interval_ms: float = 5000.0
    percentile: float | None = None
    stability_pct: float = 10.0
    max_trials: int = 10
    streaming: bool = False


# ------------------------------------------------------------------------------- shared memory

_LIVE_REGIONS: "set[_Regions]" = set()


@atexit.register
def _destroy_leftovers() -> None:
    for r in list(_LIVE_REGIONS):
        r.destroy_all()


class _Regions:
    """Shared-memory regions this process created and registered, of one kind; the
    subclasses make, fill, register and free them. ``destroy_all`` runs synchronously so
    that it also works after the event loop is gone (Ctrl-C)."""

    kind = ""

    def __init__(self) -> None:
        self._tag = f"{os.getpid()}_{secrets.token_hex(4)}"
        self._count = itertools.count()
        self.handles: list[Any] = []
        self.registered: list[str] = []
        _LIVE_REGIONS.add(self)

    def _name(self, label: str) -> tuple[int, str]:
        n = next(self._count)
        return n, f"perf_{self._tag}_{n}_{label}"

    def create(self, label: str, size: int) -> tuple[str, str, Any]:
        """(region name, what registers it: a key or an IPC handle, the local handle)."""
        raise NotImplementedError

    def write(self, handle: Any, data: bytes) -> None:
        raise NotImplementedError

    async def _register(self, client: Any, name: str, key: str, size: int) -> None:
        raise NotImplementedError

    async def _unregister(self, client: Any, name: str) -> None:
        raise NotImplementedError

    def _destroy(self, handle: Any) -> None:
        raise NotImplementedError

    async def register(self, client: Any, name: str, key: str, size: int) -> None:
        await self._register(client, name, key, max(size, 1))
        self.registered.append(name)

    async def unregister_all(self, client: Any, server_gone: bool = False) -> None:
        """Best effort on the way out; one warning line if the server did not answer."""
        failed, first = 0, None
        while self.registered:
            name = self.registered.pop()
            if server_gone and failed:
                failed += 1
                continue
            try:
                await asyncio.wait_for(self._unregister(client, name), 5)
            except (Exception, asyncio.TimeoutError) as e:  # noqa: BLE001
                failed, first = failed + 1, first or str(e) or type(e).__name__
        if failed:
            progress(f"warning: could not unregister {failed} {self.kind} shared-memory region(s) on the "
                     f"server (first: {first}); the local regions are removed")

    def destroy_all(self) -> None:
        while self.handles:
            h = self.handles.pop()
            try:
                self._destroy(h)
            except Exception:  # noqa: BLE001
                pass


class SharedMemoryRegions(_Regions):
    """System shared memory: POSIX objects under /dev/shm."""

    kind = "system"

    def __init__(self) -> None:
        import tritonclient.utils.shared_memory as shm
        self._shm = shm
        super().__init__()

    def create(self, label: str, size: int) -> tuple[str, str, Any]:
        n, name = self._name(label)
        key = f"/triton_shm_perf_{self._tag}_{n}"
        handle = self._shm.create_shared_memory_region(name, key, max(size, 1))
        self.handles.append(handle)
        return name, key, handle

    def write(self, handle: Any, data: bytes) -> None:
        import numpy as np
        if data:
            self._shm.set_shared_memory_region(handle, [np.frombuffer(data, dtype=np.uint8)])

    async def _register(self, client: Any, name: str, key: str, size: int) -> None:
        await client.register_system_shm(name, key, size)

    async def _unregister(self, client: Any, name: str) -> None:
        await client.unregister_system_shm(name)

    def _destroy(self, handle: Any) -> None:
        self._shm.destroy_shared_memory_region(handle)


class CudaSharedMemoryRegions(_Regions):
    """CUDA shared memory: one cudaMalloc per region on device 0 (:mod:`.cuda`), registered
    by its IPC handle as the server's GPU 0, freed after it is unregistered."""

    kind = "CUDA"

    def create(self, label: str, size: int) -> tuple[str, str, Any]:
        from .cuda import DeviceBuffer
        _, name = self._name(label)
        buffer = DeviceBuffer(size)
        self.handles.append(buffer)
        return name, buffer.raw_handle, buffer

    def write(self, handle: Any, data: bytes) -> None:
        handle.write(data)

    async def _register(self, client: Any, name: str, key: str, size: int) -> None:
        from .cuda import DEVICE
        await client.register_cuda_shm(name, key, DEVICE, size)

    async def _unregister(self, client: Any, name: str) -> None:
        await client.unregister_cuda_shm(name)

    def _destroy(self, handle: Any) -> None:
        handle.free()


# ------------------------------------------------------------------------------- one step

class _Fatal:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.error: PerfError | None = None

    def set(self, e: PerfError) -> None:
        if self.error is None:
            self.error = e
        self.event.set()


async def _drain(tasks: set[asyncio.Task], timeout: float) -> None:
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2)


async def run_step(opts: Options, client: Any, prepared: list[Any], stats: Callable | None,
                   value: float) -> Result:
    """Drive one load level until stable (or --max-trials windows) and merge the last windows."""
    rec, fatal, stop = Recorder(), _Fatal(), asyncio.Event()
    label = f"[{'concurrency' if opts.mode == 'concurrency' else 'request rate'} {value:g}]"
    stream = client.open_stream() if opts.streaming else None
    send = stream.infer if stream is not None else client.infer
    reqs = itertools.cycle(prepared)
    clock = time.perf_counter_ns

    async def one() -> None:
        req = next(reqs)
        t0 = clock()
        try:
            await send(req)
        except InferError as e:
            rec.error(str(e))
            return
        except PerfError as e:
            fatal.set(e)
            return
        rec.ok(clock() - t0)

    tasks: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()
    sent_box = [0]

    if opts.mode == "concurrency":
        async def worker() -> None:
            while not stop.is_set() and not fatal.event.is_set():
                await one()
                sent_box[0] += 1

        for _ in range(int(value)):
            t = loop.create_task(worker())
            tasks.add(t)
    else:
        rate = float(value)
        poisson = opts.distribution == "poisson"
        rng = random.Random(0)

        async def scheduler() -> None:
            next_t = time.perf_counter()
            while not stop.is_set() and not fatal.event.is_set():
                now = time.perf_counter()
                while next_t <= now:
                    t = loop.create_task(one())
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    sent_box[0] += 1
                    next_t += rng.expovariate(rate) if poisson else 1.0 / rate
                await asyncio.sleep(max(0.0, next_t - time.perf_counter()))

        sched = loop.create_task(scheduler())

    windows: list[Window] = []
    stable = False
    interval = opts.interval_ms / 1000.0
    try:
        snap0 = ServerSnapshot.from_stats(await stats(), opts.model) if stats else None
        rec.take()
        cpu0, t0, sent0 = time.process_time(), time.perf_counter(), sent_box[0]
        for trial in range(1, opts.max_trials + 1):
            try:
                await asyncio.wait_for(fatal.event.wait(), interval)
            except asyncio.TimeoutError:
                pass
            if fatal.error is not None:
                raise fatal.error
            t1, cpu1 = time.perf_counter(), time.process_time()
            lat, errs = rec.take()
            sent1 = sent_box[0]
            snap1 = ServerSnapshot.from_stats(await stats(), opts.model) if stats else None
            delta = (snap1 - snap0) if snap1 is not None and snap0 is not None else None
            w = Window(t1 - t0, lat, errs, cpu1 - cpu0, delta)
            w.sent = sent1 - sent0
            windows.append(w)
            ips, latency = window_metric(w, opts.percentile)
            which = f"p{opts.percentile:g}" if opts.percentile is not None else "avg"
            progress(f"{label} window {trial}/{opts.max_trials}: {ips * opts.batch_size:.1f} infer/sec, "
                     f"{which} latency {latency / 1000:.0f} usec, {w.requests} requests"
                     + (f", {errs} errors" if errs else ""))
            t0, cpu0, snap0, sent0 = t1, cpu1, snap1, sent1
            if is_stable(windows, opts.stability_pct, opts.percentile):
                stable = True
                break
    finally:
        stop.set()
        if opts.mode != "concurrency":
            sched.cancel()
            await asyncio.gather(sched, return_exceptions=True)
        await _drain(set(tasks), timeout=max(5.0, 2 * interval))
        if stream is not None:
            await stream.close()
    last = windows[-STABILITY_WINDOWS:]
    if not stable:
        progress(f"warning: {label} failed to obtain a stable measurement within {opts.max_trials} "
                 f"windows (±{opts.stability_pct:g}%); reporting the last {len(last)}. "
                 "Try a larger --measurement-interval or --stability-percentage.")
    res = summarize(last, mode=opts.mode, value=value, batch_size=opts.batch_size, pct=opts.percentile,
                    stable=stable)
    res.errors = sum(w.errors for w in windows)
    dur = sum(w.duration_s for w in last)
    res.send_rate = sum(w.sent for w in last) / dur if dur > 0 else 0.0
    res.first_error = rec.first_error
    return res


# ------------------------------------------------------------------------------- whole run

@dataclass
class RunOutcome:
    results: list[Result]
    errors: int
    first_error: str | None
    has_server_stats: bool


async def run(opts: Options, on_result: Callable[[Result, bool], None]) -> RunOutcome:
    client = make_client(opts.protocol, opts.url)
    regions: _Regions | None = None
    server_gone = False
    try:
        try:
            live = await client.server_live()
        except PerfError as e:
            raise PerfError(f"cannot reach the server at {opts.url} over {opts.protocol.upper()} "
                            f"(is it running, and is -u/-i right?): {str(e).split(': ', 1)[-1]}") from None
        if not live:
            raise PerfError(f"the server at {opts.url} is not live")
        server_md = await client.server_metadata()
        extensions = set(server_md.get("extensions", []) or [])
        has_stats = "statistics" in extensions
        metadata = await client.model_metadata(opts.model, opts.version)
        try:
            config = await client.model_config(opts.model, opts.version)
        except PerfError as e:
            progress(f"warning: no model configuration ({e}); using the metadata alone")
            config = None
        spec = model_spec(metadata, config, opts.version)
        if spec.max_batch_size == 0 and opts.batch_size > 1:
            raise UsageError(f"-b {opts.batch_size}: model '{opts.model}' does not support batching "
                             "(max_batch_size 0); use -b 1")
        if spec.max_batch_size > 0 and opts.batch_size > spec.max_batch_size:
            raise UsageError(f"-b {opts.batch_size} exceeds model '{opts.model}' max_batch_size "
                             f"{spec.max_batch_size}")
        sets = build_input_sets(spec, parse_shape_flags(opts.shapes), opts.input_data, opts.batch_size)

        if opts.shared_memory in ("system", "cuda"):
            extension = f"{opts.shared_memory}_shared_memory"
            if extension not in extensions:
                where = " on a machine with a GPU and CuPy" if opts.shared_memory == "cuda" else ""
                raise PerfError(f"the server at {opts.url} does not offer the {extension} extension "
                                f"(start triton-shm with --allow-client-shm=true{where})")
            regions = SharedMemoryRegions() if opts.shared_memory == "system" else CudaSharedMemoryRegions()
            outputs = []
            for o in spec.outputs:  # every in-flight request writes its output at the start of the same region
                size = output_region_size(o, opts.batch_size, opts.output_shm_size)
                name, key, _ = regions.create(f"out_{o.name}", size)
                await regions.register(client, name, key, size)
                outputs.append((o.name, name, size))
            prepared = []
            for tensors in sets:
                in_regions = []
                for t in tensors:
                    name, key, handle = regions.create(f"in_{t.name}", len(t.data))
                    regions.write(handle, t.data)
                    await regions.register(client, name, key, len(t.data))
                    in_regions.append((name, len(t.data)))
                prepared.append(client.prepare(opts.model, opts.version, tensors, in_regions, outputs))
        else:
            prepared = [client.prepare(opts.model, opts.version, t, None, None) for t in sets]

        stats = (lambda: client.statistics(opts.model, opts.version)) if has_stats else None
        if not has_stats:
            progress("note: the server does not list the 'statistics' extension; no server-side split")
        results, errors, first_error = [], 0, None
        for value in opts.values:
            res = await run_step(opts, client, prepared, stats, value)
            results.append(res)
            errors += res.errors
            first_error = first_error or res.first_error
            on_result(res, has_stats)
            if res.requests == 0 and res.errors:
                progress(f"error: every request failed at this step; stopping (first error: {first_error})")
                break
        return RunOutcome(results, errors, first_error, has_stats)
    except ConnectionLost:
        server_gone = True
        raise
    finally:
        if regions is not None:
            try:
                await asyncio.shield(regions.unregister_all(client, server_gone))
            except BaseException:  # noqa: BLE001
                pass
            regions.destroy_all()
        await client.close()


__all__ = ["Options", "run", "run_step", "SharedMemoryRegions", "CudaSharedMemoryRegions", "ConnectionLost",
           "progress", "progress_to"]
