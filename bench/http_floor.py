"""The floor HTTP puts under triton-shm's infer route: do-nothing servers (uvloop) answering
every infer with a prepared response, driven by the real perf_analyzer over HTTP like the
servers in compare_triton.py.

    python bench/http_floor.py [--concurrency 1,8,16] [--interval-ms 2000]

  aiohttp  an aiohttp web application with the infer route (the web layer triton-shm had)
  lean     triton-shm's lean connection (frontend/http/lean.py: llhttp parsing, request
           queue, response framing) answering from the infer route itself; the metadata
           calls perf_analyzer makes first cross the bridge to aiohttp, as in the server

Whatever triton-shm's HTTP infer path does per request comes on top of its row. A second
table prices what the lean server adds to every other route: GET /v2/health/ready on one
keep-alive connection from a plain Python client, served by aiohttp directly or through
the lean connection's bridge.
"""
from __future__ import annotations

import argparse
import csv
import http.client
import io
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from compare_triton import cpu_seconds, free_port, process_tree
from reference import ensure_reference

SERVER = r'''
import asyncio, sys
import orjson, uvloop
from aiohttp import web

TENSORS = [{"name": n, "datatype": "FP32", "shape": [16]} for n in ("INPUT0", "INPUT1")]
OUTPUTS = [{"name": n, "datatype": "FP32", "shape": [16]} for n in ("OUTPUT0", "OUTPUT1")]
HEADER = orjson.dumps({"model_name": "floor", "model_version": "1",
                       "outputs": [{**o, "parameters": {"binary_data_size": 64}} for o in OUTPUTS]})
BODY = HEADER + bytes(128)
HEADERS = {"Inference-Header-Content-Length": str(len(HEADER))}
count = 0

async def infer(request):
    global count
    await request.read()
    count += 1
    return web.Response(body=BODY, content_type="application/octet-stream", headers=HEADERS)

def json(doc):
    async def handler(request):
        return web.json_response(doc)
    return handler

async def counter(request):
    return web.json_response(count)

async def main(mode, port):
    middlewares = []
    if mode == "lean":
        from triton_shm.frontend.http.bridge import completion_middleware
        middlewares = [completion_middleware]
    app = web.Application(middlewares=middlewares)
    app.router.add_routes([
        web.get("/v2", json({"name": "floor", "version": "0", "extensions": []})),
        web.get("/v2/health/ready", json({})),
        web.get("/v2/models/floor", json({"name": "floor", "versions": ["1"], "platform": "python",
                                          "inputs": TENSORS, "outputs": OUTPUTS})),
        web.get("/v2/models/floor/config", json({
            "name": "floor", "backend": "python", "max_batch_size": 0,
            "input": [{"name": t["name"], "data_type": "TYPE_FP32", "dims": [16]} for t in TENSORS],
            "output": [{"name": t["name"], "data_type": "TYPE_FP32", "dims": [16]} for t in OUTPUTS]})),
        web.post("/v2/models/floor/infer", infer),
        web.get("/count", counter),
    ])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if mode == "aiohttp":
        await web.TCPSite(runner, "127.0.0.1", port).start()
    else:
        from triton_shm.frontend.http.infer import BINARY_TYPE
        from triton_shm.frontend.http.lean import LeanConnection
        from triton_shm.frontend.http.lean_server import LeanContext

        class Floor(LeanConnection):
            async def _infer(self, msg):
                global count
                count += 1
                self._respond(msg, 200, BINARY_TYPE, BODY, HEADERS)
                self.request_done(msg.keep_alive)

        ctx = LeanContext(None, 1 << 26, runner.server, 30.0, 75.0)
        await asyncio.get_running_loop().create_server(lambda: Floor(ctx), "127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()

uvloop.install()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
'''


def served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=10) as r:
        return int(r.read())


def control_row(mode: str, port: int, pid: int, n: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    cpu0 = cpu_seconds(process_tree(pid))
    for _ in range(n):
        conn.request("GET", "/v2/health/ready")
        conn.getresponse().read()
    conn.close()
    return f"| {mode} | {n} | {1e6 * (cpu_seconds(process_tree(pid)) - cpu0) / n:.0f} |"


def measure(ref, mode: str, concurrencies: list[str], interval_ms: int, control_n: int) -> tuple[list[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(port)], stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the do-nothing {mode} server did not start")
        control = control_row(mode, port, proc.pid, control_n)
        for c in concurrencies:
            with tempfile.NamedTemporaryFile(suffix=".csv") as f:
                n0, cpu0 = served(port), cpu_seconds(process_tree(proc.pid))
                out = subprocess.run([str(ref.perf_analyzer), "-m", "floor", "-u", f"127.0.0.1:{port}", "-i", "http",
                                      "--concurrency-range", c, "--measurement-interval", str(interval_ms),
                                      "--stability-percentage", "50", "--max-trials", "5", "-f", f.name],
                                     env=ref.pa_env(), capture_output=True, text=True, timeout=300)
                cpu, n = cpu_seconds(process_tree(proc.pid)) - cpu0, served(port) - n0
                if out.returncode != 0:
                    raise RuntimeError(f"perf_analyzer failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
                row = next(csv.DictReader(io.StringIO(Path(f.name).read_text())))
            rows.append(f"| {mode} | {c} | {float(row['Inferences/Second']):.0f} | {float(row['p50 latency']):.0f} "
                        f"| {float(row['p99 latency']):.0f} | {1e6 * cpu / max(n, 1):.0f} |")
    finally:
        proc.terminate()
        proc.wait(30)
    return rows, control


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8,16")
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--modes", default="aiohttp,lean")
    parser.add_argument("--control-requests", type=int, default=5000)
    args = parser.parse_args()
    ref = ensure_reference()
    print("| do-nothing HTTP server, perf_analyzer HTTP, 2 x FP32[16] | concurrency | infer/s | p50 µs | p99 µs "
          "| server CPU-µs / request |")
    print("|---|---|---|---|---|---|")
    controls = []
    for mode in args.modes.split(","):
        rows, control = measure(ref, mode, args.concurrency.split(","), args.interval_ms, args.control_requests)
        print("\n".join(rows), flush=True)
        controls.append(control)
    print("\n| GET /v2/health/ready, one keep-alive connection | requests | server CPU-µs / request |\n|---|---|---|")
    print("\n".join(controls))


if __name__ == "__main__":
    main()
