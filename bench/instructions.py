"""Instructions executed per small request, in the front-end and in the worker (callgrind).

    python bench/instructions.py [--protocol http|grpc] [--requests 500] [--warmup 100]
                                 [--model add_sub|identity --elements N] [--streaming]

CPU time per request on a shared 2-vCPU machine moves by ±30 % from run to run (other
processes, wake-up placement, the hypervisor); the instructions a process executes for
the same requests do not. This starts the real server under ``valgrind --tool=callgrind
--trace-children=yes`` on the python ``add_sub`` model (two FP32[16] inputs), sends
``--warmup`` requests with tritonclient, zeroes the counters of the front-end and the
model's instance process, sends
``--requests`` more one at a time, dumps the counters and prints instructions per request
for each process. ``--model identity --elements 4194304`` sends one FP32 tensor of that
many elements (16 MiB) in-band through the ``identity`` model instead; ``--streaming``
(gRPC) sends them over one ModelStreamInfer stream, one in flight. Spinning shows up
little here (a pause loop executes few instructions per microsecond): compare CPU time for
that. Slow (the server runs ~50× slower under valgrind): a few minutes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from compare_triton import build_repository  # noqa: E402  (the same add_sub as the side-by-side runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def total_ir(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def dump(pid: int, out_dir: Path, label: str) -> int:
    """Dump ``pid``'s counters and return the instructions since the last zeroing."""
    before = set(out_dir.glob(f"cg.{pid}*"))
    subprocess.run(["callgrind_control", "-d", label, str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [p for p in set(out_dir.glob(f"cg.{pid}*")) - before if p.stat().st_size]
        if new:
            time.sleep(0.5)  # let callgrind finish writing
            return total_ir(new[0])
        time.sleep(0.2)
    raise RuntimeError(f"callgrind did not dump process {pid}")


def send(protocol: str, port: int, n: int, model: str = "add_sub", elements: int = 16,
         streaming: bool = False) -> None:
    if protocol == "http":
        import tritonclient.http as client
        cl = client.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
    else:
        import tritonclient.grpc as client
        cl = client.InferenceServerClient(f"127.0.0.1:{port + 1}")
    a = np.ones(elements, np.float32)
    names = ["INPUT0", "INPUT1"] if model == "add_sub" else ["INPUT0"]
    inputs = [client.InferInput(name, [elements], "FP32") for name in names]
    for i in inputs:
        i.set_data_from_numpy(a, **({"binary_data": True} if protocol == "http" else {}))
    if streaming:  # one ModelStreamInfer stream, one request in flight at a time (perf_analyzer --streaming)
        import queue
        replies: queue.Queue = queue.Queue()
        cl.start_stream(lambda result, error: replies.put(error))
        try:
            for _ in range(n):
                cl.async_stream_infer(model, inputs)
                if (error := replies.get(timeout=120)) is not None:
                    raise RuntimeError(f"stream request failed: {error}")
        finally:
            cl.stop_stream()
        return
    for _ in range(n):
        result = cl.infer(model, inputs)
        if model == "identity" and result.as_numpy("OUTPUT0").shape != (elements,):
            raise RuntimeError("identity returned a wrong shape")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--streaming", action="store_true",
                        help="gRPC only: the requests over one ModelStreamInfer stream")
    parser.add_argument("--model", choices=["add_sub", "identity"], default="add_sub")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements per input tensor")
    parser.add_argument("--keep", type=Path, help="copy the callgrind files here (for callgrind_annotate)")
    parser.add_argument("--idle-seconds", type=float, default=0,
                        help="also count what each process executes while idle for this long (timers, polling)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="triton-shm-ir-") as tmp:
        tmp_path = Path(tmp)
        repo = tmp_path / "repo"
        build_repository(repo)
        port = free_port()
        cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--collect-atstart=yes",
               f"--callgrind-out-file={tmp_path}/cg.%p",
               sys.executable, "-m", "triton_shm", "--model-repository", str(repo),
               "--http-port", str(port), "--grpc-port", str(port + 1), "--allow-metrics", "false",
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]
        help_text = subprocess.run([sys.executable, "-m", "triton_shm", "--help"],
                                   capture_output=True, text=True).stdout
        if "--drain-secs" in help_text:  # stop at once (older trees, measured for a before/after, lack it)
            cmd += ["--drain-secs", "0"]
        # A fixed hash seed: with a random one, dict and set layouts (and so the counts) move by
        # about 1 % from run to run of the same tree.
        env = {"PYTHONHASHSEED": "0", **os.environ, "OPENBLAS_NUM_THREADS": "1"}
        log = open(tmp_path / "server.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 600
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/ready", timeout=5):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the server did not come up under valgrind:\n"
                                           + (tmp_path / "server.log").read_text()[-3000:]) from None
                    time.sleep(1)
            send(args.protocol, port, args.warmup, args.model, args.elements, args.streaming)
            pids = {"front-end": proc.pid}
            # The model's instance runs in a process of its own (its --name is <instance>@<model>/...),
            # beside the shared worker and the other models' instance processes.
            workers = [pid for pid in children(proc.pid) if f"@{args.model}/".encode() in cmdline(pid)]
            if len(workers) != 1:
                raise RuntimeError(f"expected one instance process of {args.model}, found {workers}")
            pids["worker"] = workers[0]
            for pid in pids.values():
                subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
            send(args.protocol, port, args.requests, args.model, args.elements, args.streaming)
            mode = " streaming" if args.streaming else ""
            print(f"instructions per request, {args.protocol}{mode}, {args.model} FP32[{args.elements}], "
                  f"{args.requests} sequential requests (after {args.warmup})")
            for name, pid in pids.items():
                ir = dump(pid, tmp_path, "measured")
                print(f"  {name:10s} {ir / args.requests:12,.0f}")
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for f in tmp_path.glob("cg.*"):
                    shutil.copy(f, args.keep / f.name)
            if args.idle_seconds:
                for pid in pids.values():
                    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
                time.sleep(args.idle_seconds)
                print(f"instructions per second idle, over {args.idle_seconds:g} s")
                for name, pid in pids.items():
                    ir = dump(pid, tmp_path, "idle")
                    print(f"  {name:10s} {ir / args.idle_seconds:12,.0f}")
        finally:
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


if __name__ == "__main__":
    main()
