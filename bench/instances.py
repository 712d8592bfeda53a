"""What a Python model's instances cost, triton-shm beside the real Triton 2.51, in one run.

    python bench/instances.py [--counts 1,2,8] [--rounds 3]

Each instance of a Python model runs in a process of its own on both servers (Triton's
stubs, our instance processes). For the add_sub Python model with ``count`` N, in explicit
model-control mode, the servers alternate (A B A B) and each reports:
  load     the load call until it returns (every instance initialized, READY), median
  RSS      the resident memory of the model's instance processes, per instance, after a
           request has run on each (Triton: its stub processes; ours: the processes
           named after the instances); and, for ours, the same model with
           PROCESS_PER_INSTANCE "no" (instances as threads of the shared worker): what
           the shared worker grew by, per instance
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

from compare_triton import ADD_SUB, free_port, process_tree
from reference import ensure_reference

RSS_FIELD = "VmRSS:"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(RSS_FIELD):
            return int(line.split()[1])
    return 0


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def write_model(repo: Path, name: str, count: int, shared: bool = False) -> None:
    config, code = ADD_SUB
    config = textwrap.dedent(config).replace('name: "add_sub"', f'name: "{name}"')
    config += f"\ninstance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    if shared:
        config += 'parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } }\n'
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def infer_each_instance(port: int, model: str, count: int) -> None:
    """Requests enough to have run on every instance (each one's first execution imports)."""
    body = json.dumps({"inputs": [{"name": n, "shape": [16], "datatype": "FP32", "data": [1.0] * 16}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    for _ in range(4 * count):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()


def wait_live(port: int) -> None:
    for _ in range(900):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


class Server:
    def __init__(self, kind: str, repo: Path, ref, log) -> None:
        self.kind, self.port = kind, free_port()
        args = ["--model-control-mode", "explicit"]
        if kind == "triton":
            cmd, env = ref.triton_cmd(repo, self.port)
            cmd += args
        else:
            cmd = [sys.executable, "-m", "triton_shm", "--model-repository", str(repo), "--http-port",
                   str(self.port), "--grpc-port", str(self.port + 1), "--allow-metrics", "false", *args]
            env = None
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_live(self.port)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/v2/repository/models/{path}"

    def instance_pids(self, model: str) -> list[int]:
        pids = process_tree(self.proc.pid)
        if self.kind == "triton":
            return [p for p in pids if "triton_python_backend_stub" in cmdline(p) and f"/{model}/" in cmdline(p)]
        return [p for p in pids if f"@{model}/" in cmdline(p)]

    def shared_worker(self) -> int:
        (pid,) = [p for p in process_tree(self.proc.pid) if " --name cpu " in cmdline(p) + " "]
        return pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def measure(server: Server, name: str, count: int) -> tuple[float, float]:
    """(seconds the load call took, KiB of RSS per instance process)."""
    t0 = time.perf_counter()
    post(server.url(f"{name}/load"))
    load_s = time.perf_counter() - t0
    infer_each_instance(server.port, name, count)
    pids = server.instance_pids(name)
    if len(pids) != count:
        raise RuntimeError(f"{server.kind}: {len(pids)} instance processes of {name}, expected {count}")
    rss = sum(rss_kib(p) for p in pids) / count
    post(server.url(f"{name}/unload"))
    time.sleep(0.5)
    return load_s, rss


def measure_shared(server: Server, name: str, count: int) -> float:
    """KiB per instance that the shared worker grows by, instances as its threads."""
    before = rss_kib(server.shared_worker())
    post(server.url(f"{name}/load"))
    infer_each_instance(server.port, name, count)
    grown = rss_kib(server.shared_worker()) - before
    post(server.url(f"{name}/unload"))
    return grown / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="1,2,8")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    ref = ensure_reference()
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    shared: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "servers.log", "w")
        for rnd in range(args.rounds):
            for kind in ("triton-shm", "triton"):
                # a fresh repository per round and server: each load is a first load
                repo = Path(tmp) / f"models-{kind}-{rnd}"
                for count in counts:
                    write_model(repo, f"add_sub_x{count}", count)
                    write_model(repo, f"add_sub_threads_x{count}", count, shared=True)
                server = Server(kind, repo, ref, log)
                try:
                    for count in counts:
                        results.setdefault((kind, count), []).append(measure(server, f"add_sub_x{count}", count))
                        if kind == "triton-shm":
                            shared.setdefault(count, []).append(
                                measure_shared(server, f"add_sub_threads_x{count}", count))
                finally:
                    server.stop()
        log.close()
    print(f"add_sub (Python), explicit load call until READY and RSS per instance; medians of {args.rounds} "
          "rounds, servers alternating\n")
    print("| count | triton-shm load | Triton load | triton-shm RSS / instance process | "
          "Triton RSS / stub | triton-shm threads (PROCESS_PER_INSTANCE no): shared worker growth / instance |")
    print("|---|---|---|---|---|---|")
    for count in counts:
        ours, theirs = results[("triton-shm", count)], results[("triton", count)]
        print(f"| {count} | {statistics.median(s for s, _ in ours) * 1000:.0f} ms | "
              f"{statistics.median(s for s, _ in theirs) * 1000:.0f} ms | "
              f"{statistics.median(r for _, r in ours) / 1024:.1f} MiB | "
              f"{statistics.median(r for _, r in theirs) / 1024:.1f} MiB | "
              f"{statistics.median(shared[count]) / 1024:.1f} MiB |")


if __name__ == "__main__":
    main()
