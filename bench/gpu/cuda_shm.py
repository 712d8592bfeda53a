"""GPU benchmarks (a CUDA device and CuPy needed; bench/gpu/run.sh runs this):

1. 16 MiB and 64 MiB through a GPU Python model (CuPy, y = 2x, KIND_GPU), median ms per
   request over HTTP at concurrency 1: in-band, system shared memory, CUDA shared memory
   with Triton's default FORCE_CPU_ONLY_INPUT_TENSORS "yes" (the input goes to the host
   and back), CUDA shared memory with "no" (the input stays on the GPU: one device copy
   in, one out), against one device-to-device copy of that size; the two ratios the GPU
   work is held to (CUDA shm under 2 ms at 64 MiB, at least 5x system shm at 16 MiB).
2. A GPU python model (CuPy, y = 2x) at batch 1 through triton-shm vs the same computation
   in-process (the limit).

    python bench/gpu/cuda_shm.py [--n 20]

Prints markdown tables.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.harness import ServerProcess  # noqa: E402
from tests.models import write_model  # noqa: E402
from tests.test_gpu import DeviceBuffer, _missing, cupy_double_model  # noqa: E402
from tests.test_gpu_inputs import CUPY_WHERE_PY  # noqa: E402

# the same model twice: inputs on the host (Triton's default) and left on the GPU
DOUBLE_CONFIG = """
    name: "{name}"
    backend: "python"
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
             {{ name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }} ]
    instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 0 ] }} ]
    parameters: {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "{force_cpu}" }} }}
    """
HOST_MODEL, DEVICE_MODEL = "double_host_inputs", "double_device_inputs"


def _timed(fn, n: int) -> float:
    """Median seconds of ``fn()`` over ``n`` runs after two warm-ups."""
    fn()
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def transfer_table(url: str, n: int) -> None:
    import cupy as cp
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    cl = httpclient.InferenceServerClient(url, network_timeout=300, connection_timeout=300)
    columns = {"inband": "in-band", "system": "system shm", "cuda_host": "CUDA shm, inputs on the host",
               "cuda": "CUDA shm, inputs on the GPU", "memcpy": "one device-to-device copy"}
    print("| size | " + " | ".join(columns.values()) + " | CUDA shm ÷ system shm |")
    print("| --- " * (len(columns) + 2) + "|")
    for mib in (16, 64):
        nbytes = mib << 20
        values = np.ones(nbytes // 4, np.float32)
        want = values * 2
        results = {}
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)

        inp = httpclient.InferInput("INPUT0", [values.size], "FP32")
        inp.set_data_from_numpy(values, binary_data=True)
        results["inband"] = _timed(lambda inp=inp, out=out: cl.infer(DEVICE_MODEL, [inp], outputs=[out]), n)

        key = f"/bench_gpu_{mib}"
        sin = shm.create_shared_memory_region(f"sin{mib}", key + "_in", nbytes)
        sout = shm.create_shared_memory_region(f"sout{mib}", key + "_out", nbytes)
        shm.set_shared_memory_region(sin, [values])
        cl.register_system_shared_memory(f"sin{mib}", key + "_in", nbytes)
        cl.register_system_shared_memory(f"sout{mib}", key + "_out", nbytes)
        sinp = httpclient.InferInput("INPUT0", [values.size], "FP32")
        sinp.set_shared_memory(f"sin{mib}", nbytes)
        sout_r = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        sout_r.set_shared_memory(f"sout{mib}", nbytes)
        results["system"] = _timed(
            lambda sinp=sinp, sout_r=sout_r: cl.infer(DEVICE_MODEL, [sinp], outputs=[sout_r]), n)
        got = shm.get_contents_as_numpy(sout, np.float32, [values.size])
        assert np.array_equal(got, want), "system shared-memory output is wrong"
        cl.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(sin)
        shm.destroy_shared_memory_region(sout)

        # whole allocations (cupy.cuda.Memory), not memory-pool blocks: an IPC handle names an
        # allocation and the server maps it from its start
        buf_in, buf_out = DeviceBuffer(nbytes), DeviceBuffer(nbytes)
        buf_in.put(values)
        dev_in, dev_out = buf_in.array.view(cp.float32), buf_out.array.view(cp.float32)
        for name, buf in ((f"cin{mib}", buf_in), (f"cout{mib}", buf_out)):
            cl.register_cuda_shared_memory(name, buf.raw_handle, 0, nbytes)
        cinp = httpclient.InferInput("INPUT0", [values.size], "FP32")
        cinp.set_shared_memory(f"cin{mib}", nbytes)
        cout_r = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        cout_r.set_shared_memory(f"cout{mib}", nbytes)
        for key_, model in (("cuda_host", HOST_MODEL), ("cuda", DEVICE_MODEL)):
            dev_out.fill(0)
            results[key_] = _timed(
                lambda cinp=cinp, cout_r=cout_r, model=model: cl.infer(model, [cinp], outputs=[cout_r]), n)
            assert bool((dev_out == dev_in * 2).all()), f"CUDA shared-memory output of {model} is wrong"
        cl.unregister_cuda_shared_memory()

        scratch = cp.empty_like(dev_in)

        def memcpy(scratch=scratch, dev_in=dev_in) -> None:
            scratch[...] = dev_in
            cp.cuda.Device().synchronize()
        results["memcpy"] = _timed(memcpy, n)

        cells = [f"{results[k] * 1e3:.2f} ms" for k in columns]
        ratio = results["system"] / results["cuda"]
        print(f"| {mib} MiB | " + " | ".join(cells) + f" | {ratio:.1f}x faster |", flush=True)
    cl.close()


def python_model_table(url: str, n: int) -> None:
    import cupy as cp
    import tritonclient.http as httpclient

    cl = httpclient.InferenceServerClient(url)
    x = np.arange(1024, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [x.size], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    server = _timed(lambda: cl.infer("cupy_double", [inp]), n * 10)

    def in_process() -> None:
        cp.asnumpy(cp.asarray(x) * 2)
    limit = _timed(in_process, n * 10)
    print("\n| GPU python model, batch 1, 1024 FP32 | median latency |")
    print("| --- | --- |")
    print(f"| through triton-shm (HTTP) | {server * 1e6:.0f} µs |")
    print(f"| in-process, no server (the limit) | {limit * 1e6:.0f} µs |", flush=True)
    cl.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    if _missing():
        raise SystemExit(f"bench/gpu/cuda_shm.py needs a GPU: {_missing()}")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name, force_cpu in ((HOST_MODEL, "yes"), (DEVICE_MODEL, "no")):
            write_model(repo, name, config=DOUBLE_CONFIG.format(name=name, force_cpu=force_cpu),
                        model_py=CUPY_WHERE_PY)
        cupy_double_model(repo)
        srv = ServerProcess(repo, Path(tmp) / "server.log",
                            extra_args=["--allow-client-shm=true", "--gpus", "0",
                                        "--http-max-input-size", str(256 << 20)]).start()
        try:
            transfer_table(srv.http_url, args.n)
            python_model_table(srv.http_url, args.n)
        finally:
            srv.stop()
            print("\n<details><summary>server log tail</summary>\n\n```\n" + srv.log()[-3000:] + "\n```\n</details>")


if __name__ == "__main__":
    main()
