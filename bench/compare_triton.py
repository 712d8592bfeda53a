"""triton-shm vs the real Triton 2.51, driven by two load generators, in one run.

    python bench/compare_triton.py [--scenarios small,large,batching] [--rounds 2] [--interval-ms 3000]
                                   [--generators perf_analyzer,triton-shm-perf] [--protocols grpc,http]
                                   [--servers triton-shm,triton-shm-aiohttp,triton-shm-grpcio,triton-shm-2fe,triton]
                                   [--max-trials 5]

Both servers serve the same repository of python-backend models (the only kind the
reference Triton build runs) and are measured alternately, A B A B, so drift hits both
alike. Every case is driven by each selected load generator in turn (within one server,
the generators alternate too):
  perf_analyzer    the real perf_analyzer (tritonclient 2.50)
  triton-shm-perf  our own `python -m triton_shm.perf`, given the same perf_analyzer flags
For each generator it prints one table: medians of throughput and p50/p99 latency as the
generator reports them, plus each server's CPU-seconds per 1,000 inferences and peak RSS
(its whole process tree: Triton's stubs, our workers), and the ratios triton-shm / Triton.
These server-side figures are measured the same way whichever generator drives the load.
With --servers, triton-shm-aiohttp (--http-transport aiohttp: HTTP served by aiohttp alone)
and triton-shm-grpcio (--grpc-transport grpcio: gRPC on grpc.aio instead of our native
server) and triton-shm-2fe (--frontend-processes 2) are measured as well, each variant of
ours in its own rows against Triton.

The server-side time per request comes from each server's own statistics extension
(success ns / count over the run); so does the request count that CPU-seconds are divided by.

Both servers run with OPENBLAS_NUM_THREADS=1: on a 2-vCPU machine shared with the load
generator, numpy's OpenBLAS worker thread spin-waits between the batching model's matmuls
and burns ~65% of a core in either server's model process; both get the same setting.

Scenarios:
  small     add_sub, two FP32[16] inputs; gRPC and HTTP at concurrency 1 and 8
  large     identity, one FP32 tensor of 1 MiB and of 16 MiB; gRPC in-band and through
            system shared memory, at concurrency 1; and through system shared memory with
            the model declaring SHM_INPUTS_IN_PLACE (triton-shm lends it the input in place)
  large_http  the same identity model, 1 MiB and 16 MiB in-band over HTTP, at concurrency 1
  batching  a batch-friendly model (per-call overhead + one matmul per batch) at
            concurrency 16, dynamic batching off and on, over gRPC and HTTP
  gap       one instance of a 1 ms model, batching off, concurrency 16 over gRPC: at most
            1000/s, less by the time an instance idles between executions
  instances a model doing ~3 ms of pure-Python (GIL-holding) work per request, batching off,
            with instance_group count 1 and count 2, each over gRPC at concurrency 4: does
            count 2 scale? (Triton runs each instance in its own stub process; at most ~2x
            on two cores, less what the server and the load generator take of them)
  tracing   the small cases with tracing off, and on: each server restarted with
            --trace-config mode=opentelemetry, rate=1, level=TIMESTAMPS and
            opentelemetry,url= a local OTLP/HTTP sink run by this script (it answers 200 and
            discards what arrives: Triton 2.51 posts protobuf, triton-shm JSON); the batch
            span processor's settings are both servers' defaults. Besides the tables, the
            throughput and the CPU per inference with tracing on / off, per server.
  frontends add_sub with two instances (add_sub_2), gRPC and HTTP at concurrency 8: the
            small requests a server with --frontend-processes 2 serves in both processes
            (measure with --servers triton,triton-shm,triton-shm-2fe)
"""
from __future__ import annotations

import argparse
import csv
import http.server
import io
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reference import ensure_reference

ADD_SUB = ("""
    name: "add_sub"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                       pb_utils.Tensor("OUTPUT1", a - b)]))
            return out
    """)
IDENTITY = ("""
    name: "identity"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """, """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
    """)
# The same model, declaring that it never writes its input: triton-shm then lends it the
# input in the client's region instead of a copy (Triton ignores the parameter).
IDENTITY_IN_PLACE = (IDENTITY[0].replace('name: "identity"', 'name: "identity_in_place"') + """
    parameters: { key: "SHM_INPUTS_IN_PLACE" value: { string_value: "yes" } }
    """, IDENTITY[1])
# Batch-friendly: a fixed cost per execute call, then one matmul over all rows of all requests.
MATMUL_PY = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    W = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.002)  # per-call overhead (e.g. a kernel launch or a lock)
            xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
            y = np.concatenate(xs) @ W
            out, start = [], 0
            for x in xs:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y[start:start + len(x)])]))
                start += len(x)
            return out
    """


SLEEP_1MS = ("""
    name: "sleep_1ms"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    """, """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.001)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
                r, "INPUT0").as_numpy())]) for r in requests]
    """)


# ~3 ms of pure-Python CPU work per request, holding the GIL all along (no numpy, no sleep):
# CPU_WORK_LOOPS additions take ~2.9 ms on the 2-vCPU bench machine with the venv's Python 3.11.7
# (what our workers run) and ~2.5 ms with Debian's 3.11.2 (the libpython Triton's stub links),
# measured alone, median. Two copies: one instance and two instances (instance_group count).
CPU_WORK_LOOPS = 113_000
CPU_WORK_PY = f"""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    LOOPS = {CPU_WORK_LOOPS}

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                s = 0
                for i in range(LOOPS):
                    s += i
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x + np.float32(s % 2))]))  # s % 2 == 0: x back
            return out
    """


def cpu_work_config(name: str, count: int) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    instance_group [ {{ count: {count} kind: KIND_CPU }} ]
    """


def matmul_config(name: str, batching: bool) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 32
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] }} ]
    {"dynamic_batching { max_queue_delay_microseconds: 500 }" if batching else ""}
    """


@dataclass
class Case:
    label: str
    model: str
    args: list[str]   # load-generator arguments besides -m/-u/-i (perf_analyzer's flag names; triton_shm.perf
                      # takes the same ones)
    protocol: str = "grpc"
    tracing: bool = False  # the server runs with OpenTelemetry tracing at rate 1 (TRACING_ARGS)


SCENARIOS: dict[str, list[Case]] = {
    "small": [Case(f"add_sub FP32[16], {p}, concurrency {c}", "add_sub", ["--concurrency-range", str(c)], p)
              for p in ("grpc", "http") for c in (1, 8)],
    "large": [
        Case("identity 1 MiB, gRPC in-band, concurrency 1", "identity",
             ["--shape", "INPUT0:262144", "--concurrency-range", "1"]),
        Case("identity 1 MiB, gRPC system shm, concurrency 1", "identity",
             ["--shape", "INPUT0:262144", "--concurrency-range", "1", "--shared-memory", "system",
              "--output-shared-memory-size", str(1 << 20)]),
        Case("identity 16 MiB, gRPC in-band, concurrency 1", "identity",
             ["--shape", "INPUT0:4194304", "--concurrency-range", "1"]),
        Case("identity 16 MiB, gRPC system shm, concurrency 1", "identity",
             ["--shape", "INPUT0:4194304", "--concurrency-range", "1", "--shared-memory", "system",
              "--output-shared-memory-size", str(16 << 20)]),
        *(Case(f"identity {mib} MiB, gRPC system shm, input lent in place, concurrency 1", "identity_in_place",
               ["--shape", f"INPUT0:{mib << 18}", "--concurrency-range", "1", "--shared-memory", "system",
                "--output-shared-memory-size", str(mib << 20)]) for mib in (1, 16)),
    ],
    "large_http": [Case(f"identity {mib} MiB, HTTP in-band, concurrency 1", "identity",
                        ["--shape", f"INPUT0:{mib << 18}", "--concurrency-range", "1"], "http") for mib in (1, 16)],
    "batching": [Case(f"matmul 256x256, {name}, concurrency 16, dynamic batching {state}", model,
                      ["--concurrency-range", "16"], protocol)
                 for protocol, name in (("grpc", "gRPC"), ("http", "HTTP"))
                 for state, model in (("off", "matmul_nobatch"), ("on", "matmul_batch"))],
    # small requests to a model with two instances: what a second front-end process serves
    "frontends": [Case(f"add_sub FP32[16], 2 instances, {p}, concurrency 8", "add_sub_2",
                       ["--concurrency-range", "8"], p) for p in ("grpc", "http")],
    # one instance of a 1 ms model, no batching: the time between two executions shows
    "gap": [Case("sleep 1 ms, one instance, gRPC, concurrency 16", "sleep_1ms", ["--concurrency-range", "16"])],
    # ~3 ms of GIL-holding Python per request, one instance vs two: does count 2 scale?
    "instances": [Case(f"cpu_work 3 ms, instance count {n}, gRPC, concurrency 4", f"cpu_work_{n}",
                       ["--concurrency-range", "4"]) for n in (1, 2)],
    # the small cases without and with OpenTelemetry tracing of every request
    "tracing": [Case(f"add_sub FP32[16], {p}, concurrency {c}, tracing {state}", "add_sub",
                     ["--concurrency-range", str(c)], p, state == "on")
                for p in ("grpc", "http") for c in (1, 8) for state in ("off", "on")],
}


def tracing_args(sink_url: str) -> list[str]:
    """What both servers are started with for a ``tracing`` case (tritonserver's flags)."""
    return ["--trace-config", "mode=opentelemetry", "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"opentelemetry,url={sink_url}"]


class OtlpSink:
    """An OTLP/HTTP receiver on 127.0.0.1 that answers every POST 200 and discards it
    (counting posts and bytes, to show the spans arrive)."""

    def __init__(self) -> None:
        self.posts = self.bytes = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as exporters expect

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(size)
                sink.posts += 1
                sink.bytes += size
                json_body = "json" in (self.headers.get("Content-Type") or "")
                body = b"{}" if json_body else b""  # an empty ExportTraceServiceResponse either way
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if json_body else "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def build_repository(repo: Path) -> None:
    def write(name: str, config: str, code: str) -> None:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    write("add_sub", *ADD_SUB)
    write("add_sub_2", ADD_SUB[0].replace('name: "add_sub"', 'name: "add_sub_2"')
          + '    instance_group [ { count: 2 kind: KIND_CPU } ]\n', ADD_SUB[1])
    write("identity", *IDENTITY)
    write("identity_in_place", *IDENTITY_IN_PLACE)
    write("sleep_1ms", *SLEEP_1MS)
    write("matmul_nobatch", matmul_config("matmul_nobatch", False), MATMUL_PY)
    write("matmul_batch", matmul_config("matmul_batch", True), MATMUL_PY)
    for n in (1, 2):
        write(f"cpu_work_{n}", cpu_work_config(f"cpu_work_{n}", n), CPU_WORK_PY)


def free_port(span: int = 3) -> int:
    """A port P with P .. P+span-1 all free on every address (a server takes HTTP P, gRPC P+1, metrics P+2;
    Triton binds them on 0.0.0.0), drawn below the kernel's ephemeral range: the kernel's own pick was
    in it, so P+1 could be the local port of some client's connection and Triton failed to start with
    'Socket already in use' when the machine was busy."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    while True:
        port = rng.randrange(10000, max(low, 10000 + 2 * span) - span)
        try:
            for p in range(port, port + span):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", p))
            return port
        except OSError:
            continue


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children") if Path(f"/proc/{p}").exists() else []:
            todo += [int(c) for c in task.read_text().split()]
    return pids


def cpu_seconds(pids: list[int]) -> float:
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError):
            pass
    return total / tick


def peak_rss_mib(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


# Our server variants: name -> environment on top of ours.
# Our server variants: environment and extra flags of each.
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "triton-shm": ({}, []),
    "triton-shm-aiohttp": ({}, ["--http-transport", "aiohttp"]),
    "triton-shm-grpcio": ({}, ["--grpc-transport", "grpcio"]),  # gRPC on grpc.aio instead of native
    "triton-shm-2fe": ({}, ["--frontend-processes", "2"]),  # two front-end processes as one server
}


class Server:
    def __init__(self, kind: str, repo: Path, ref, log, extra_args: list[str] = ()):
        self.kind = kind
        for attempt in range(3):  # another process may take a port between free_port and the server's bind
            try:
                return self._start(repo, ref, log, extra_args)
            except RuntimeError as e:
                if attempt == 2 or "exited" not in str(e):
                    raise
                print(f"  {kind}: {e}; starting it again on other ports", file=sys.stderr, flush=True)

    def _start(self, repo: Path, ref, log, extra_args) -> None:
        kind, self.port = self.kind, free_port()
        if kind == "triton":
            cmd, env = ref.triton_cmd(repo, self.port)
            cmd += extra_args
        else:
            cmd = [sys.executable, "-m", "triton_shm", "--model-repository", str(repo), "--http-port", str(self.port),
                   "--grpc-port", str(self.port + 1), "--allow-metrics", "false", "--allow-client-shm", "true",
                   "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--drain-secs", "0"]
            variant_env, variant_args = VARIANTS[kind]
            cmd += [*variant_args, *extra_args]
            env = {**os.environ, **variant_env}
        # On this 2-vCPU machine, shared with the load generator, numpy's OpenBLAS worker thread
        # spin-waits between the batching model's matmuls and takes ~65% of a core in either
        # server's model process (Triton's stub, our worker). Both servers get the same setting.
        env = {**(os.environ if env is None else env), "OPENBLAS_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{kind} did not become ready")

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.port + 1}" if protocol == "grpc" else f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def success_ns(server: Server, model: str) -> tuple[int, int]:
    """(count, ns) of successful requests from the statistics extension (both servers have it)."""
    import json
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v2/models/{model}/stats", timeout=10) as r:
            success = json.load(r)["model_stats"][0]["inference_stats"]["success"]
    except urllib.error.HTTPError:  # a server without the statistics extension (a baseline)
        return 0, 0
    return int(success["count"]), int(success["ns"])


GENERATORS = {"perf_analyzer": "perf_analyzer 2.50", "triton-shm-perf": "triton-shm perf"}  # name: title


MAX_TRIALS = [5]  # perf_analyzer's --max-trials; --max-trials here raises it on a busy machine


def run_generator(ref, generator: str, url: str, case: Case, interval_ms: int) -> dict[str, str]:
    """Run one load generator once on `case` against `url`; return its CSV row (perf_analyzer's column names).
    This is the one way the benchmarks run perf_analyzer and `python -m triton_shm.perf`."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        flags = ["-m", case.model, "-u", url, "-i", case.protocol, "--measurement-interval", str(interval_ms),
                 "--stability-percentage", "50", "--max-trials", str(MAX_TRIALS[0]), "-f", f.name, *case.args]
        if generator == "perf_analyzer":
            out = subprocess.run([str(ref.perf_analyzer), *flags], env=ref.pa_env(), capture_output=True, text=True,
                                 timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"perf_analyzer failed on {url} ({case.label}): "
                                   f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
        elif generator == "triton-shm-perf":
            out = subprocess.run([sys.executable, "-m", "triton_shm.perf", *flags], capture_output=True, text=True,
                                 timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"triton-shm perf failed on {url} ({case.label}): {out.stderr[-2000:]}")
        else:
            raise ValueError(f"unknown load generator {generator!r} (known: {', '.join(GENERATORS)})")
        return next(csv.DictReader(io.StringIO(Path(f.name).read_text())))


def run_case(ref, server: Server, case: Case, interval_ms: int,
             generator: str = "perf_analyzer") -> dict[str, float]:
    pids = process_tree(server.proc.pid)
    count0, ns0 = success_ns(server, case.model)
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    row = run_generator(ref, generator, server.url(case.protocol), case, interval_ms)
    wall = time.monotonic() - t0
    cpu = cpu_seconds(process_tree(server.proc.pid)) - cpu0
    count1, ns1 = success_ns(server, case.model)
    throughput = float(row["Inferences/Second"])
    # CPU per request served during the run, counted by the server's statistics extension. Without
    # it, about throughput x wall time (the load is on for the whole run, warm-up and every trial,
    # but not during the generator's start-up: ~0.4 s of Python for triton_shm.perf, which would
    # overstate its requests by ~4% at 3 s windows).
    served = count1 - count0 if count1 > count0 else throughput * wall
    result = {"throughput": throughput, "p50_us": float(row["p50 latency"]), "p99_us": float(row["p99 latency"]),
              "server_us": (ns1 - ns0) / max(count1 - count0, 1) / 1000,
              "cpu_s_per_1k": 1000 * cpu / max(served, 1.0),
              "rss_mib": peak_rss_mib(process_tree(server.proc.pid))}
    if row.get("Client CPU %"):  # triton_shm.perf reports its own CPU use; perf_analyzer does not
        result["client_cpu_pct"] = float(row["Client CPU %"])
    return result


def table(cases: list[Case], med: dict, generator: str, ours: list[str]) -> str:
    lines = ["| case | triton-shm infer/s | Triton infer/s | ratio | triton-shm p50 µs | Triton p50 µs | "
             "triton-shm p99 µs | Triton p99 µs | server-side µs/request (ours / Triton) | "
             "CPU-s/1k inf (ours / Triton) | peak RSS MiB (ours / Triton) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for kind in ours:
            lines.append(_row(case, kind, med[(kind, generator, case.label)], med[("triton", generator, case.label)],
                              len(ours) > 1))
    return "\n".join(lines)


def _row(case: Case, kind: str, a: dict, b: dict, named: bool) -> str:
    label = f"{case.label} ({kind})" if named else case.label
    return (f"| {label} | {a['throughput']:.0f} | {b['throughput']:.0f} | {a['throughput'] / b['throughput']:.2f} "
            f"| {a['p50_us']:.0f} | {b['p50_us']:.0f} | {a['p99_us']:.0f} | {b['p99_us']:.0f} "
            f"| {a['server_us']:.0f} / {b['server_us']:.0f} "
            f"| {a['cpu_s_per_1k']:.2f} / {b['cpu_s_per_1k']:.2f} | {a['rss_mib']:.0f} / {b['rss_mib']:.0f} |")


def _ratios(cases: list[Case], med: dict, generators: list[str], ours: list[str], base: str, other: str,
            title: str, what: str, metric: str = "throughput") -> str:
    """``metric`` (throughput) of each case labelled ``other`` over its twin labelled ``base``
    (the same label otherwise), per generator, for each server: one table headed ``title``."""
    pairs = [(a, b) for a in cases for b in cases if base in a.label and b.label == a.label.replace(base, other)]
    if not pairs:
        return ""
    lines = [f"| load generator | case | {' | '.join(f'{k} {what}' for k in ours)} | Triton {what} |",
             "|---|---|" + "---|" * (len(ours) + 1)]
    for g in generators:
        for a, b in pairs:
            ratio = {k: med[(k, g, b.label)][metric] / med[(k, g, a.label)][metric] for k in (*ours, "triton")}
            lines.append(f"| {GENERATORS[g]} | {a.label.replace(', ' + base, '')} | "
                         + " | ".join(f"{ratio[k]:.2f}x" for k in (*ours, "triton")) + " |")
    return f"#### {title}\n\n" + "\n".join(lines)


def batching_gains(cases: list[Case], med: dict, generators: list[str], ours: list[str]) -> str:
    """Throughput with dynamic batching on / off, per protocol and generator, for each server."""
    return _ratios(cases, med, generators, ours, "dynamic batching off", "dynamic batching on",
                   "dynamic batching gain", "gain (on / off)")


def instance_scaling(cases: list[Case], med: dict, generators: list[str], ours: list[str]) -> str:
    """Throughput with instance_group count 2 / count 1, per generator, for each server."""
    return _ratios(cases, med, generators, ours, "instance count 1", "instance count 2", "instance scaling",
                   "scaling (count 2 / count 1)")


def tracing_cost(cases: list[Case], med: dict, generators: list[str], ours: list[str]) -> str:
    """Throughput and CPU per inference with tracing on / off, per case and generator, for each server."""
    tables = [_ratios(cases, med, generators, ours, "tracing off", "tracing on", "tracing cost: throughput",
                      "throughput (on / off)"),
              _ratios(cases, med, generators, ours, "tracing off", "tracing on", "tracing cost: CPU per inference",
                      "CPU-s/1k inf (on / off)", "cpu_s_per_1k")]
    return "\n\n".join(t for t in tables if t)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="small,large,batching")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--generators", default=",".join(GENERATORS),
                        help=f"load generators to drive every case with, in turn (from: {', '.join(GENERATORS)})")
    parser.add_argument("--max-trials", type=int, default=5,
                        help="measurement windows the generators may take to stabilize (default 5)")
    parser.add_argument("--protocols", default="grpc,http", help="only the cases over these protocols")
    parser.add_argument("--servers", default="triton-shm,triton",
                        help=f"servers to measure: triton and any of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    MAX_TRIALS[0] = args.max_trials
    protocols = args.protocols.split(",")
    cases = [c for s in args.scenarios.split(",") for c in SCENARIOS[s] if c.protocol in protocols]
    kinds = args.servers.split(",")
    ours = [k for k in kinds if k != "triton"]
    if "triton" not in kinds or not ours or any(k not in VARIANTS for k in ours):
        parser.error(f"--servers: triton and at least one of {', '.join(VARIANTS)}")
    generators = args.generators.split(",")
    for g in generators:
        if g not in GENERATORS:
            parser.error(f"--generators: unknown {g!r} (known: {', '.join(GENERATORS)})")
    ref = ensure_reference()
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    failures: list[str] = []  # runs that failed: named at the end, left out of the medians
    sink = OtlpSink() if any(c.tracing for c in cases) else None
    # the cases each server start serves: those without tracing, then those with it
    groups = [(t, [c for c in cases if c.tracing == t]) for t in (False, True)]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo)
        log = open(Path(tmp) / "servers.log", "wb")
        for _ in range(args.rounds):
            for kind in kinds:
                for traced, group in groups:
                    if not group:
                        continue
                    extra = tracing_args(sink.url) if traced and sink else []
                    server = Server(kind, repo, ref, log, extra)
                    try:
                        for case in group:
                            for gen in generators:
                                posts = sink.posts if sink else 0
                                try:
                                    r = run_case(ref, server, case, args.interval_ms, gen)
                                except RuntimeError as e:  # one failed run is reported, not the end of all
                                    died = server.proc.poll() is not None
                                    failures.append(f"{kind} {gen} {case.label}: "
                                                    f"{'the server died; ' if died else ''}{str(e)[-300:]}")
                                    print(f"  {kind:10s} {gen:15s} {case.label}: FAILED"
                                          f"{' (the server died: restarted)' if died else ''}",
                                          file=sys.stderr, flush=True)
                                    if died:
                                        server.stop()
                                        server = Server(kind, repo, ref, log, extra)
                                    continue
                                results.setdefault((kind, gen, case.label), []).append(r)
                                exported = f", {sink.posts - posts} OTLP posts" if sink and traced else ""
                                print(f"  {kind:10s} {gen:15s} {case.label}: {r['throughput']:.0f}/s "
                                      f"p50 {r['p50_us']:.0f} µs{exported}", file=sys.stderr, flush=True)
                    finally:
                        server.stop()
    if sink is not None:
        sink.close()
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    # a case with no run left on either side has no row
    cases = [c for c in cases if all((k, g, c.label) in med for k in kinds for g in generators)]
    print("\n\n".join(f"#### driven by {GENERATORS[g]}\n\n{table(cases, med, g, ours)}" for g in generators))
    gains = batching_gains(cases, med, generators, ours)
    if gains:
        print(f"\n{gains}")
    scaling = instance_scaling(cases, med, generators, ours)
    if scaling:
        print(f"\n{scaling}")
    cost = tracing_cost(cases, med, generators, ours)
    if cost:
        print(f"\n{cost}")
    if failures:
        print("\n#### failed runs (left out of the medians)\n\n" + "\n".join(f"- {f}" for f in failures))


if __name__ == "__main__":
    main()
