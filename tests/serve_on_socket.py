"""A front-end on a listening socket it inherited: ``python serve_on_socket.py FD PROTOCOL NAME``.

Serves HTTP (``http-lean`` or ``http-aiohttp``) or gRPC (``grpc-native``) on descriptor FD
with an empty model repository, reports ``NAME`` as its server id (so a client can tell which
process answered), prints ``serving`` once it accepts and stops cleanly on SIGTERM.
"""
from __future__ import annotations

import asyncio
import signal
import socket
import sys
import tempfile
from pathlib import Path

from triton_shm.core.data.shm_registry import SharedMemoryRegistry
from triton_shm.core.models.manager import ModelManager
from triton_shm.core.models.repository import ModelRepository
from triton_shm.core.service import InferenceService
from triton_shm.supervisor.pool import WorkerPool


async def serve(fd: int, protocol: str, name: str, repository: Path) -> None:
    models = ModelManager(ModelRepository([repository]), WorkerPool([]), mode="explicit")
    service = InferenceService(models, SharedMemoryRegistry(False, []), server_id=name)
    sock = socket.socket(fileno=fd)
    host, port = sock.getsockname()[:2]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if protocol.startswith("http-"):
        from triton_shm.frontend.http.app import start_http
        server = await start_http(service, host, port, transport=protocol[5:], sock=sock, shutdown_timeout=5.0)
        print("serving", flush=True)
        await stop.wait()
        await server.cleanup()
    else:
        from triton_shm.frontend.grpc.server import start_grpc
        server = await start_grpc(service, host, port, transport=protocol[5:], sock=sock)
        print("serving", flush=True)
        await stop.wait()
        await server.stop(grace=5.0)


def main() -> None:
    fd, protocol, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    try:
        import uvloop  # as the server runs
        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as repository:
        asyncio.run(serve(fd, protocol, name, Path(repository)))
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
