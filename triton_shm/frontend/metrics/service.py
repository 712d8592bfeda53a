"""``GET /metrics`` on the metrics port, and the task that samples CPU/GPU readings."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from aiohttp import web

from ..http.api_groups import restriction_middleware
from ..http.app import AiohttpServer, serve_app
from .collect import MetricsCollector, PeerSnapshots
from .config import MetricsConfig
from .exposition import CONTENT_TYPE

if TYPE_CHECKING:
    from ssl import SSLContext

    from ...core.models.repository import ModelRepository
    from ...core.data.response_cache import ResponseCache
    from ..restricted import Restrictions

log = logging.getLogger("triton_shm.metrics")

__all__ = ["CONTENT_TYPE", "create_metrics_app", "start_metrics"]


async def _sample_forever(collector: MetricsCollector, interval_s: float) -> None:
    while True:
        try:
            await asyncio.to_thread(collector.sample)
        except Exception:  # noqa: BLE001 - a bad reading must not stop the sampler
            log.exception("metrics sampling failed")
        await asyncio.sleep(interval_s)


def create_metrics_app(collector: MetricsCollector, interval_ms: float = 2000,
                       restrictions: "Restrictions | None" = None) -> web.Application:
    """``restrictions``: --http-restricted-api, whose "metrics" group guards this port."""
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=(await collector.render_async()).encode(), headers={"Content-Type": CONTENT_TYPE})

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

    checks = [restriction_middleware(restrictions, lambda _path: "metrics")] if restrictions else []
    app = web.Application(middlewares=checks)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(sampler)
    return app


async def start_metrics(repository: "ModelRepository", host: str, port: int, *, cpu: bool = True,
                        gpu: bool = True, interval_ms: float = 2000, gpus: list[int] | None = None,
                        config: MetricsConfig = MetricsConfig(), ssl: "SSLContext | None" = None,
                        restrictions: "Restrictions | None" = None,
                        cache: "ResponseCache | None" = None,
                        peer_snapshots: PeerSnapshots | None = None) -> AiohttpServer:
    """Serve ``GET /metrics`` on ``host:port`` (HTTPS with ``ssl``); stop it with
    ``await server.cleanup()`` (which also stops the sampler). ``peer_snapshots``: the other
    front-end processes' statistics, summed into the page (see :mod:`.collect`)."""
    collector = MetricsCollector(repository, cpu=cpu, gpu=gpu, gpus=gpus, config=config, cache=cache,
                                 peer_snapshots=peer_snapshots)
    return await serve_app(create_metrics_app(collector, interval_ms, restrictions), host, port, ssl=ssl,
                           shutdown_timeout=1.0)
