"""``GET /metrics`` on the metrics port, and the task that samples CPU/GPU readings."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from aiohttp import web

from ..http.app import serve_app
from .collect import MetricsCollector
from .config import MetricsConfig
from .exposition import CONTENT_TYPE

if TYPE_CHECKING:
    from ...core.repository import ModelRepository

log = logging.getLogger("triton_shm.metrics")

__all__ = ["CONTENT_TYPE", "create_metrics_app", "start_metrics"]


async def _sample_forever(collector: MetricsCollector, interval_s: float) -> None:
    while True:
        try:
            await asyncio.to_thread(collector.sample)
        except Exception:  # noqa: BLE001 - a bad reading must not stop the sampler
            log.exception("metrics sampling failed")
        await asyncio.sleep(interval_s)


def create_metrics_app(collector: MetricsCollector, interval_ms: float = 2000) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=collector.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def sampler(_app: web.Application) -> AsyncIterator[None]:
        task = None
        if collector.samples_system:
            collector.sample()  # first readings before the port answers
            task = asyncio.get_running_loop().create_task(
                _sample_forever(collector, max(interval_ms, 1.0) / 1000.0))
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        collector.close()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(sampler)
    return app


async def start_metrics(repository: "ModelRepository", host: str, port: int, *, cpu: bool = True,
                        gpu: bool = True, interval_ms: float = 2000, gpus: list[int] | None = None,
                        config: MetricsConfig = MetricsConfig()) -> web.AppRunner:
    """Serve ``GET /metrics`` on ``host:port``; stop it with ``await runner.cleanup()``
    (which also stops the sampler)."""
    collector = MetricsCollector(repository, cpu=cpu, gpu=gpu, gpus=gpus, config=config)
    return await serve_app(create_metrics_app(collector, interval_ms), host, port, shutdown_timeout=1.0)
