"""Instructions per small request below the protocol layer: the front-end's core alone.

    python bench/core_share.py [--requests 300] [--warmup 100]

Runs, under ``valgrind --tool=callgrind``, a process that is the front-end without its
protocol servers (the same repository, model manager, service and worker pool that
``server.serve`` builds) and calls ``InferenceService.infer`` directly with the request the
HTTP and gRPC codecs make for the python ``add_sub`` model (two FP32[16] inputs, in-band),
one at a time. Counters are zeroed after ``--warmup`` requests and dumped after
``--requests`` more. Beside ``bench/instructions.py`` (the whole front-end, same model and
requests) this gives the share of a request's front-end work that is not the protocol's:
what a process that only schedules (docs/design/frontend-processes.md) would still do per
request. The worker is not traced. Slow under valgrind: a few minutes.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_triton import build_repository  # noqa: E402  (the same add_sub as the side-by-side runs)
from instructions import total_ir  # noqa: E402


async def drive(repo: Path, warmup: int, requests: int, out_dir: Path) -> float:
    import numpy as np

    from triton_shm.core.models.manager import ModelManager
    from triton_shm.core.models.repository import ModelRepository
    from triton_shm.core.service import InferenceService
    from triton_shm.core.data.shm_registry import SharedMemoryRegistry
    from triton_shm.core.data.types import InferRequest, InputTensor
    from triton_shm.supervisor.pool import WorkerPool

    pool = WorkerPool([], 0)
    repository = ModelRepository([str(repo)], gpus=[])
    models = ModelManager(repository, pool, mode="explicit", poll_secs=0)
    service = InferenceService(models, SharedMemoryRegistry(True, []))
    await pool.start()
    try:
        await models.start(["add_sub"])
        data = np.ones(16, np.float32).tobytes()

        async def one() -> None:
            request = InferRequest("add_sub", "", "", {}, [InputTensor("INPUT0", "FP32", [16], data, {}),
                                                          InputTensor("INPUT1", "FP32", [16], data, {})], [])
            response = await service.infer(request)
            response.release()

        for _ in range(warmup):
            await one()
        await control("-z", out_dir)
        for _ in range(requests):
            await one()
        return await control("-d", out_dir) / requests
    finally:
        await models.stop()
        await pool.stop(timeout=10)


async def control(flag: str, out_dir: Path) -> int:
    """Ask callgrind to zero (``-z``) or dump (``-d``, returning the instructions since the
    zeroing) this process's counters. callgrind reads the request while the process runs, so
    the event loop keeps turning while a thread waits for ``callgrind_control``."""
    before = set(out_dir.glob("cg.*"))
    done = threading.Event()
    threading.Thread(target=lambda: (subprocess.run(["callgrind_control", flag, str(os.getpid())],
                                                    check=True, capture_output=True), done.set()),
                     daemon=True).start()
    while not done.is_set():
        await asyncio.sleep(0.01)
    if flag != "-d":
        return 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [p for p in set(out_dir.glob("cg.*")) - before if p.stat().st_size]
        if new:
            await asyncio.sleep(0.5)  # let callgrind finish writing
            return total_ir(new[0])
        await asyncio.sleep(0.2)
    raise RuntimeError("callgrind did not dump")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the run under valgrind
    parser.add_argument("--repo", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        per_request = asyncio.run(drive(args.repo, args.warmup, args.requests, args.out))
        print(f"core (service.infer and below), instructions per request: {per_request:,.0f}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        repo, out = Path(tmp) / "models", Path(tmp) / "cg"
        out.mkdir()
        build_repository(repo)
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--trace-children=no",
                   sys.executable, __file__, "--inner", "--repo", str(repo), "--out", str(out),
                   "--requests", str(args.requests), "--warmup", str(args.warmup)]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
