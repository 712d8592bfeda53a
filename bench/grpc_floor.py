"""The ceiling Python gRPC puts on a front-end: a do-nothing grpc.aio server (uvloop, the
same generated stubs as triton-shm) that answers every ModelInfer with a prepared response,
driven by the real perf_analyzer like the servers in compare_triton.py.

    python bench/grpc_floor.py [--concurrency 1,16] [--interval-ms 3000]

Whatever triton-shm's gRPC front-end does per request comes on top of this.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_triton import cpu_seconds, free_port, process_tree
from reference import ensure_reference

SERVER = r'''
import asyncio, sys
import grpc, numpy as np, uvloop
from triton_shm._proto import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pbg
from triton_shm._proto import model_config_pb2 as mc

RESPONSE = pb.ModelInferResponse(model_name="floor", model_version="1")
out = RESPONSE.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 256])
RESPONSE.raw_output_contents.append(np.zeros(256, np.float32).tobytes())
TENSOR = [pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[-1, 256]) for n in ("INPUT0",)]

class Floor(pbg.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context): return RESPONSE
    async def ServerLive(self, r, c): return pb.ServerLiveResponse(live=True)
    async def ServerReady(self, r, c): return pb.ServerReadyResponse(ready=True)
    async def ModelReady(self, r, c): return pb.ModelReadyResponse(ready=True)
    async def ServerMetadata(self, r, c): return pb.ServerMetadataResponse(name="floor", version="0")
    async def ModelStatistics(self, r, c): return pb.ModelStatisticsResponse()
    async def ModelMetadata(self, r, c):
        return pb.ModelMetadataResponse(name="floor", versions=["1"], platform="python", inputs=TENSOR,
            outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", datatype="FP32", shape=[-1, 256])])
    async def ModelConfig(self, r, c):
        config = mc.ModelConfig(name="floor", max_batch_size=32)
        config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[256])
        config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[256])
        return pb.ModelConfigResponse(config=config)

async def main(port):
    server = grpc.aio.server()
    pbg.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

uvloop.install()
asyncio.run(main(int(sys.argv[1])))
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    ref = ensure_reference()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the do-nothing gRPC server did not start")
        print("| do-nothing grpc.aio server, perf_analyzer gRPC | infer/s | p50 µs | server CPU-s/1k requests |")
        print("|---|---|---|---|")
        for c in args.concurrency.split(","):
            with tempfile.NamedTemporaryFile(suffix=".csv") as f:
                cpu0, t0 = cpu_seconds(process_tree(proc.pid)), time.monotonic()
                out = subprocess.run([str(ref.perf_analyzer), "-m", "floor", "-u", f"127.0.0.1:{port}", "-i", "grpc",
                                      "--concurrency-range", c, "--measurement-interval", str(args.interval_ms),
                                      "-f", f.name], env=ref.pa_env(), capture_output=True, text=True, timeout=300)
                wall, cpu = time.monotonic() - t0, cpu_seconds(process_tree(proc.pid)) - cpu0
                if out.returncode != 0:
                    raise RuntimeError(f"perf_analyzer failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
                row = next(csv.DictReader(io.StringIO(Path(f.name).read_text())))
            throughput = float(row["Inferences/Second"])
            print(f"| concurrency {c} | {throughput:.0f} | {float(row['p50 latency']):.0f} "
                  f"| {1000 * cpu / max(throughput * wall, 1.0):.2f} |")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
