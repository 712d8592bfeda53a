"""Process orchestration: workers, model loading, protocol servers, graceful shutdown."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .cli import ServerOptions
from .core.repository import ModelRepository
from .core.service import InferenceService
from .core.shm_registry import SharedMemoryRegistry
from .errors import TritonShmError
from .worker.devices import parse_gpus
from .worker.pool import WorkerPool

log = logging.getLogger("triton_shm.server")


async def serve(options: ServerOptions) -> int:
    gpus = parse_gpus(options.gpus)
    pool = WorkerPool(gpus, options.log_verbose)
    repository = ModelRepository(options.model_repositories, gpu_count=len(gpus))
    service = InferenceService(repository, pool, SharedMemoryRegistry(options.allow_client_shm, gpus))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    await pool.start()
    runners = []
    try:
        await repository.load_all(pool)
        print(repository.status_table(), flush=True)
        if options.allow_http:
            from .frontend.http.app import start_http
            runners.append(("HTTP", await start_http(service, options.http_address, options.http_port,
                                                     max_input_size=options.http_max_input_size,
                                                     shutdown_timeout=options.exit_timeout_secs)))
            log.info("Started HTTPService at %s:%d", options.http_address, options.http_port)
        if options.allow_grpc:
            from .frontend.grpc.server import start_grpc
            runners.append(("gRPC", await start_grpc(service, options.grpc_address, options.grpc_port)))
            log.info("Started GRPCInferenceService at %s:%d", options.grpc_address, options.grpc_port)
        if options.allow_metrics:
            log.warning("metrics are not available in this build; --metrics-port %d is not bound",
                        options.metrics_port)
        await stop.wait()
        log.info("shutting down: finishing in-flight requests (up to %ds)", options.exit_timeout_secs)
    finally:
        service.accepting = False
        pool.begin_shutdown()
        deadline = loop.time() + options.exit_timeout_secs
        await _stop_frontends(runners, options.exit_timeout_secs)
        await pool.stop(timeout=max(deadline - loop.time(), 1.0))  # then workers are killed
        service.shm.close()
    return 0


async def _stop_frontends(runners, timeout: float) -> None:
    async def stop_one(kind, runner):
        if kind == "HTTP":
            await runner.cleanup()
        else:
            await runner.stop(grace=timeout)
    await asyncio.gather(*(stop_one(k, r) for k, r in runners), return_exceptions=True)


def run(options: ServerOptions) -> int:
    logging.basicConfig(level=logging.DEBUG if options.log_verbose else logging.INFO,
                        format="%(asctime)s %(levelname).1s %(name)s] %(message)s", stream=sys.stderr)
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
