"""The ceiling a gRPC transport puts on a front-end: a do-nothing server (uvloop, the same
generated messages as triton-shm) that parses every ModelInfer and answers it with a prepared
response, on each transport triton-shm can serve (grpc.aio, and the native server on
libnghttp2), driven by the real perf_analyzer like the servers in compare_triton.py.

    python bench/grpc_floor.py [--concurrency 1,16] [--interval-ms 3000] [--transports grpcio,native]

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

def native_methods():
    from triton_shm.frontend.grpc.rpc import Method
    floor = Floor()
    out = []
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if m.name in Floor.__dict__:
            out.append(Method(f"/inference.GRPCInferenceService/{m.name}",
                              lambda r, f=getattr(floor, m.name): f(r, None),
                              deserialize=getattr(pb, m.input_type.name).FromString))
    return out

async def main(port, transport):
    if transport == "native":
        from triton_shm.frontend.grpc.native.server import NativeServer
        server = NativeServer(native_methods(), max_message_bytes=2**31 - 1)
        await server.start("127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()
    server = grpc.aio.server()
    pbg.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

uvloop.install()
asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
'''


def measure(transport: str, concurrency: list[str], interval_ms: int, ref) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), transport], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the do-nothing {transport} gRPC server did not start")
        for c in concurrency:
            with tempfile.NamedTemporaryFile(suffix=".csv") as f:
                cpu0, t0 = cpu_seconds(process_tree(proc.pid)), time.monotonic()
                out = subprocess.run([str(ref.perf_analyzer), "-m", "floor", "-u", f"127.0.0.1:{port}", "-i", "grpc",
                                      "--concurrency-range", c, "--measurement-interval", str(interval_ms),
                                      "--stability-percentage", "50", "--max-trials", "5",
                                      "-f", f.name], env=ref.pa_env(), capture_output=True, text=True, timeout=300)
                wall, cpu = time.monotonic() - t0, cpu_seconds(process_tree(proc.pid)) - cpu0
                if out.returncode != 0:
                    raise RuntimeError(f"perf_analyzer failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
                row = next(csv.DictReader(io.StringIO(Path(f.name).read_text())))
            throughput = float(row["Inferences/Second"])
            print(f"| {transport} | {c} | {throughput:.0f} | {float(row['p50 latency']):.0f} "
                  f"| {float(row['p99 latency']):.0f} | {1000 * cpu / max(throughput * wall, 1.0):.3f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--transports", default="grpcio,native")
    args = parser.parse_args()
    ref = ensure_reference()
    print("| do-nothing server, perf_analyzer gRPC | concurrency | infer/s | p50 µs | p99 µs "
          "| server CPU-ms per request |")
    print("|---|---|---|---|---|---|")
    for transport in args.transports.split(","):
        measure(transport, args.concurrency.split(","), args.interval_ms, ref)


if __name__ == "__main__":
    main()
