"""Process orchestration: workers, model loading, protocol servers, graceful shutdown."""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys

from .cluster.processes import place_from_environment, watch_parent
from .cluster.role import Role, role_for
from .options import ServerOptions
from .core.models.manager import ModelManager
from .core.scheduling.rate_limiter import RateLimiter
from .core.models.repository import ModelRepository
from .core.data.response_cache import ResponseCache
from .core.service import InferenceService
from .core.observability.log_settings import install_logging
from .core.data.shm_registry import SharedMemoryRegistry
from .core.observability.tracing import Tracer
from .errors import TritonShmError
from .frontend.metrics import MetricsConfig, start_metrics
from .frontend.header_forward import forwarder
from .frontend.security import Security
from .devices import parse_gpus
from .supervisor.pool import WorkerPool

log = logging.getLogger("triton_shm.server")


async def serve(options: ServerOptions) -> int:
    """Start the server, serve until a stop signal, stop. One sequence whatever the number
    of front-end processes: ``role`` is this process's part in it (cluster/role.py)."""
    role = role_for(place_from_environment(options.frontend_processes), options)
    gpus = parse_gpus(options.gpus)
    pool = WorkerPool(gpus, options.log_verbose)
    repository = ModelRepository(options.model_repositories, gpus=gpus)
    metrics_config = MetricsConfig.parse(options.metrics_config)
    cache = ResponseCache(options.cache_size) if options.cache_size is not None else None
    limiter = RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None
    models = ModelManager(repository, pool, mode=options.model_control_mode, poll_secs=options.repository_poll_secs,
                          load_threads=options.model_load_thread_count,
                          latency_summaries=options.allow_metrics and metrics_config.summary_latencies,
                          latency_histograms=options.allow_metrics and metrics_config.histogram_latencies,
                          auto_complete=options.auto_complete_config, config_name=options.model_config_name,
                          external_links=options.allow_external_model_links, limiter=limiter,
                          share=role.share, forwarding=role.forwarding)
    service = InferenceService(models, SharedMemoryRegistry(options.allow_client_shm, gpus),
                               strict_readiness=options.strict_readiness, server_id=options.server_id, cache=cache)
    service.tracer = Tracer.from_config(options.trace_config)
    role.join(service, models)
    security = Security.from_options(options)  # unusable files or values: exit 1 before anything starts
    shutdown = ShutdownSignals()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_stop_signal, shutdown, role, sig)
    loop.add_signal_handler(signal.SIGHUP, _on_reload_signal, security, role)
    watch_parent(role.place, lambda: shutdown.received(signal.SIGINT))  # process 0 is gone: stop now

    runners = []
    try:
        await role.start()
        await pool.start()
        await models.start(role.startup_models())
        failed = await role.loaded(models.failed_models())
        if role.leads:
            print(repository.status_table(), flush=True)
        role.bind_ports()
        if failed and options.exit_on_error and role.leads:
            log.error("failed to load all models (start with --exit-on-error=false to serve the others): %s",
                      "; ".join(failed))
            return 1
        if options.allow_metrics and role.leads:  # first, so it answers once HTTP reports ready
            address = options.metrics_address or options.http_address
            runners.append(("Metrics", await start_metrics(
                repository, address, options.metrics_port, cpu=options.allow_cpu_metrics,
                gpu=options.allow_gpu_metrics, interval_ms=options.metrics_interval_ms, gpus=gpus,
                config=metrics_config, ssl=security.context("metrics"),
                restrictions=security.http_restrictions, cache=cache, peer_snapshots=role.peer_snapshots)))
            log.info("Started Metrics Service at %s:%d", address, options.metrics_port)
        listeners = role.place.listeners
        if options.allow_grpc:  # before HTTP, as tritonserver: HTTP ready means both answer
            from .frontend.grpc.server import start_grpc
            from .frontend.transports import default_grpc_transport
            transport = options.grpc_transport or default_grpc_transport()
            runners.append(("gRPC", await start_grpc(service, options.grpc_address, options.grpc_port,
                                                     keepalive=grpc_keepalive(options), transport=transport,
                                                     restrictions=security.grpc_restrictions,
                                                     header_forward=forwarder(options.grpc_header_forward_pattern),
                                                     tls=security.tls.get("grpc"), sock=listeners.get("grpc"))))
            log.info("Started GRPCInferenceService at %s:%d (%s)", options.grpc_address, options.grpc_port,
                     transport)
        if options.allow_http:
            from .frontend.http.app import default_http_transport, start_http
            http_transport = options.http_transport or default_http_transport()
            runners.append(("HTTP", await start_http(service, options.http_address, options.http_port,
                                                     transport=http_transport,
                                                     max_input_size=options.http_max_input_size,
                                                     shutdown_timeout=options.exit_timeout_secs,
                                                     header_timeout=options.http_header_timeout_secs,
                                                     idle_timeout=options.http_idle_timeout_secs,
                                                     restrictions=security.http_restrictions,
                                                     header_forward=forwarder(options.http_header_forward_pattern),
                                                     ssl=security.context("http"), sock=listeners.get("http"))))
            log.info("Started HTTPService at %s:%d (%s)", options.http_address, options.http_port, http_transport)
        await shutdown.drain(service, options.drain_secs)
        log.info("shutting down: finishing in-flight requests (up to %ds)", options.exit_timeout_secs)
    finally:
        service.draining = True
        pool.begin_shutdown()
        deadline = loop.time() + options.exit_timeout_secs
        await _stop_frontends(runners, options.exit_timeout_secs)
        await role.frontends_stopped(timeout=max(deadline - loop.time(), 1.0))
        service.accepting = False  # after the front-ends: what they took in was served
        try:  # in-flight requests are done or timed out: unload models (finalize runs)
            await asyncio.wait_for(models.stop(), timeout=max(deadline - loop.time(), 1.0))
        except asyncio.TimeoutError:
            log.warning("models did not unload within --exit-timeout-secs; stopping workers")
        await pool.stop(timeout=max(deadline - loop.time(), 1.0))  # then workers are killed
        service.shm.close()
        await role.stop_others(timeout=max(deadline - loop.time(), 1.0))
        await service.tracer.close()  # after the other processes: they pass their last traces here
        await role.close()
    return 0


def _on_reload_signal(security: Security, role: Role) -> None:
    security.reload()
    role.signal(signal.SIGHUP)  # every front-end process serves the renewed TLS files


def _on_stop_signal(shutdown: "ShutdownSignals", role: Role, sig: int) -> None:
    shutdown.received(sig)
    role.signal(sig)  # the other front-end processes drain (or stop) alike


class ShutdownSignals:
    """SIGTERM starts the drain; SIGINT, or a second signal, ends it (or skips it) at once."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.now = asyncio.Event()

    def received(self, sig: int) -> None:
        if self.first.is_set() or sig != signal.SIGTERM:
            self.now.set()
        self.first.set()

    async def drain(self, service: InferenceService, seconds: float) -> None:
        """Wait for the first signal, then report not ready while serving on for ``seconds``:
        load balancers take the server out of rotation before it stops accepting."""
        await self.first.wait()
        if seconds <= 0 or self.now.is_set():
            return
        service.draining = True
        log.info("draining for %g s: not ready, still serving (signal again to stop now)", seconds)
        try:
            await asyncio.wait_for(self.now.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass


def grpc_keepalive(options: ServerOptions):
    """The gRPC connection settings of the command line."""
    from .frontend.grpc.server import Keepalive
    return Keepalive(
        time_ms=options.grpc_keepalive_time, timeout_ms=options.grpc_keepalive_timeout,
        permit_without_calls=options.grpc_keepalive_permit_without_calls,
        max_pings_without_data=options.grpc_http2_max_pings_without_data,
        min_recv_ping_interval_without_data_ms=options.grpc_http2_min_recv_ping_interval_without_data,
        max_ping_strikes=options.grpc_http2_max_ping_strikes,
        max_connection_age_ms=options.grpc_max_connection_age,
        max_connection_age_grace_ms=options.grpc_max_connection_age_grace,
        max_connection_idle_ms=options.grpc_max_connection_idle)


async def _stop_frontends(runners, timeout: float) -> None:
    async def stop_one(kind, runner):
        if kind == "gRPC":
            await runner.stop(grace=timeout)
        else:  # aiohttp runners: HTTP, Metrics
            await runner.cleanup()
    await asyncio.gather(*(stop_one(k, r) for k, r in runners), return_exceptions=True)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_large_buffers() -> bool:
    """Let glibc serve large in-band tensors (up to 64 MiB) from the heap and keep that memory.

    By default a 16 MiB request body is a fresh mmap that free() returns to the kernel, so every
    such request page-faults its 4096 pages in again (about half its front-end CPU). With a fixed
    mmap threshold above that size and a trim threshold above the threshold, freed buffers stay in
    the heap for the next request; the cost is that resident memory stays at its high-water mark.
    Off with TRITON_SHM_MALLOC_DEFAULTS=1, or when the user set glibc's own MALLOC_* variables;
    only glibc has mallopt, so elsewhere this does nothing. Returns whether it applied."""
    if os.environ.get("TRITON_SHM_MALLOC_DEFAULTS") == "1" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Older glibc caps the threshold at 32 MiB; take the largest it accepts.
    if not (mallopt(_M_MMAP_THRESHOLD, 64 << 20) or mallopt(_M_MMAP_THRESHOLD, 32 << 20)):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, 128 << 20))


def run(options: ServerOptions) -> int:
    keep_large_buffers()
    try:
        install_logging(info=options.log_info, warning=options.log_warning, error=options.log_error,
                        verbose=options.log_verbose, log_format=options.log_format, log_file=options.log_file)
    except OSError as e:
        print(f"error: cannot open --log-file '{options.log_file}': {e.strerror}", file=sys.stderr)
        return 1
    for warning in options.startup_warnings:  # compatibility flags that do nothing here
        log.warning("%s", warning)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(serve(options))
    except (TritonShmError, ValueError, OSError) as e:
        log.error("error: %s", getattr(e, "message", e))
        return 1
