"""Faults and time: kill -9 of a worker under load, and a soak.

    nice python bench/faults.py kill [--concurrency 16] [--seconds 20] [--perf-analyzer]
    nice python bench/faults.py soak [--concurrency 32] [--seconds 600]

``kill``: closed-loop gRPC clients (``--concurrency`` threads, each one request at a time, so
at most that many are in flight) drive ``add_sub`` (ONNX, the CPU worker); half-way the
worker gets SIGKILL. Every request's outcome is recorded: the ones that fail must all be
UNAVAILABLE (those in flight on the worker name the signal; those sent while it restarts
say it is restarting), and it reports the time from the kill until the model is ready again
and until the first success. With ``--perf-analyzer`` the load is the real perf_analyzer
(gRPC, ``--concurrency-range``): it stops at the first failed request of each of its
threads, so what it reports is each thread's one error, all checked to be UNAVAILABLE's.

``soak``: ``--concurrency`` clients split over four kinds (HTTP and gRPC, in-band tensors and
system shared memory for inputs and outputs), each its own process, for ``--seconds``.
The resident memory of the front-end and of every worker is sampled after a warm-up and
then every few seconds; at the end it reports each process's RSS against the warm-up
sample (flat: within +-5 %), and the open fds of every server process and the objects in
/dev/shm before and after (leaks: none). Every answer is checked against the expected
tensor. Exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.harness import ServerProcess, children  # noqa: E402
from tests.models import add_sub_onnx_model  # noqa: E402

MODEL = "add_sub"
RSS_TOLERANCE = 0.05


def start_server(root: Path, extra: list[str] = ()) -> ServerProcess:
    repo = root / "models"
    add_sub_onnx_model(repo)
    return ServerProcess(repo, root / "server.log", extra_args=["--allow-client-shm=true", *extra]).start()


def vectors() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    return a, np.full((1, 16), 2.0, dtype=np.float32)


# --------------------------------------------------------------------------- kill -9

def kill_worker(srv: ServerProcess) -> tuple[float, float]:
    """kill -9 the server's worker: the moment (monotonic) and the seconds until its
    model is ready again."""
    import tritonclient.grpc as grpcclient

    (worker,) = children(srv.proc.pid)
    killed_at = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    probe = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        time.sleep(0.05)
        while not probe.is_model_ready(MODEL):
            time.sleep(0.01)
        return killed_at, time.monotonic() - killed_at
    finally:
        probe.close()


def kill_under_perf_analyzer(args) -> int:
    import subprocess

    from tests.perf_analyzer import ensure_perf_analyzer
    pa = ensure_perf_analyzer()
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp))
        try:
            proc = subprocess.Popen([str(pa.exe), "-m", MODEL, "-u", srv.grpc_url, "-i", "grpc",
                                     "--concurrency-range", str(args.concurrency), "--measurement-interval", "2000"],
                                    env=pa.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(args.seconds / 2)
            killed_at, ready_after = kill_worker(srv)
            out, _ = proc.communicate(timeout=120)
        finally:
            srv.stop()
    errors = [line.split("had error: ", 1)[1] for line in out.splitlines() if "had error: " in line]
    kinds = Counter("signal 9" if "signal 9" in e else "restarting" if "restarting" in e else e[:80] for e in errors)
    print(f"perf_analyzer at concurrency {args.concurrency}: exit {proc.returncode}, {len(errors)} thread errors")
    for what, n in sorted(kinds.items()):
        print(f"  {n:>4}  {what}")
    print(f"model ready again {ready_after * 1000:.0f} ms after the kill")
    good = 0 < len(errors) <= args.concurrency and set(kinds) <= {"signal 9", "restarting"}
    print("PASS" if good else "FAIL")
    return 0 if good else 1


def kill(args) -> int:
    if args.perf_analyzer:
        return kill_under_perf_analyzer(args)
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp))
        try:
            a, b = vectors()
            outcomes: list[tuple[float, str, str]] = []  # (time sent, status, message)
            lock = threading.Lock()
            stop = threading.Event()

            def client() -> None:
                c = grpcclient.InferenceServerClient(srv.grpc_url)
                inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                          grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        r = c.infer(MODEL, inputs)
                        ok = np.array_equal(r.as_numpy("OUTPUT0"), a + b)
                        result = ("OK", "") if ok else ("WRONG", "wrong answer")
                    except InferenceServerException as e:
                        result = (str(e.status()), e.message())
                    with lock:
                        outcomes.append((sent, *result))
                c.close()

            threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
            for t in threads:
                t.start()
            time.sleep(args.seconds / 2)
            killed_at, ready_after = kill_worker(srv)
            time.sleep(args.seconds / 2)
            stop.set()
            for t in threads:
                t.join()
        finally:
            srv.stop()
    after = [o for o in outcomes if o[0] >= killed_at]
    failures = [o for o in outcomes if o[1] != "OK"]
    kinds = Counter(("sent before the kill" if t < killed_at else "sent while it restarts", s,
                     "signal 9" if "signal 9" in m else "restarting" if "restarting" in m else m[:80])
                    for t, s, m in failures)
    first_ok = next((t for t, s, _ in after if s == "OK"), None)
    print(f"requests: {len(outcomes)}, failed: {len(failures)} (concurrency {args.concurrency})")
    for (when, status, what), n in sorted(kinds.items()):
        print(f"  {n:>6}  {when:<22}  {status}  {what}")
    print(f"model ready again {ready_after * 1000:.0f} ms after the kill; first success sent "
          f"{(first_ok - killed_at) * 1000:.0f} ms after it" if first_ok else "no success after the kill")
    in_flight = sum(n for (when, _, _), n in kinds.items() if when == "sent before the kill")
    good = (all(s == "StatusCode.UNAVAILABLE" for _, s, _ in failures) and in_flight <= args.concurrency
            and first_ok is not None)
    print("PASS" if good else "FAIL")
    return 0 if good else 1


# --------------------------------------------------------------------------- soak

def _soak_client(kind: str, url: str, threads: int, seconds: float, counts) -> None:
    """One process: ``threads`` closed-loop clients of one kind; adds (ok, failed) to ``counts``."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    proto, place = kind.split("-")
    module = httpclient if proto == "http" else grpcclient
    a, b = vectors()
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    tally = [0, 0]
    errors: list[str] = []

    def run(i: int) -> None:
        client = module.InferenceServerClient(url)
        regions = []
        inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        if place == "shm":
            tag = f"soak_{proto}_{os.getpid()}_{i}"
            for name, data in (("in0", a), ("in1", b), ("out0", None), ("out1", None)):
                h = shm.create_shared_memory_region(f"{tag}_{name}", f"/{tag}_{name}", 64)
                if data is not None:
                    shm.set_shared_memory_region(h, [data])
                client.register_system_shared_memory(f"{tag}_{name}", f"/{tag}_{name}", 64)
                regions.append(h)
            inputs[0].set_shared_memory(f"{tag}_in0", 64)
            inputs[1].set_shared_memory(f"{tag}_in1", 64)
            outputs[0].set_shared_memory(f"{tag}_out0", 64)
            outputs[1].set_shared_memory(f"{tag}_out1", 64)
        else:
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
        ok = failed = 0
        while time.monotonic() < deadline:
            try:
                r = client.infer(MODEL, inputs, outputs=outputs)
                if place == "shm":
                    got = shm.get_contents_as_numpy(regions[2], np.float32, [1, 16])
                else:
                    got = r.as_numpy("OUTPUT0")
                if np.array_equal(got, a + b):
                    ok += 1
                else:
                    failed += 1
                    errors.append(f"wrong answer {got.reshape(-1)[:4]}")
            except Exception as e:  # noqa: BLE001 - counted, and the soak fails
                failed += 1
                errors.append(f"{type(e).__name__}: {e}"[:300])
        if place == "shm":  # by name: a bare unregister would take the other clients' regions too
            for name in ("in0", "in1", "out0", "out1"):
                client.unregister_system_shared_memory(f"{tag}_{name}")
            for h in regions:
                shm.destroy_shared_memory_region(h)
        client.close()
        with lock:
            tally[0] += ok
            tally[1] += failed

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    counts.put((kind, *tally, sorted(set(errors))[:3]))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> Counter:
    """What a process has open, by kind (memfd segments, sockets, /dev/shm objects, files)."""
    kinds: Counter = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":")[0] + ":" if ":" in target and not target.startswith("/") else target] += 1
    return kinds


def shm_objects() -> set[str]:
    return set(os.listdir("/dev/shm"))


def soak(args) -> int:
    kinds = ["http-inband", "grpc-inband", "http-shm", "grpc-shm"]
    per_kind = max(args.concurrency // len(kinds), 1)
    ctx = mp.get_context("spawn")
    counts = ctx.Queue()  # before the /dev/shm snapshot: its semaphore is ours, not the server's
    with tempfile.TemporaryDirectory() as tmp:
        shm_before = shm_objects()
        srv = start_server(Path(tmp))
        try:
            pids = {"front-end": srv.proc.pid, **{f"worker {p}": p for p in children(srv.proc.pid)}}
            fds_before = {name: fds(pid) for name, pid in pids.items()}
            clients = [ctx.Process(target=_soak_client,
                                   args=(k, srv.http_url if k.startswith("http") else srv.grpc_url,
                                         per_kind, args.seconds, counts)) for k in kinds]
            for p in clients:
                p.start()
            time.sleep(min(args.warmup, args.seconds / 4))
            # after the warm-up: arenas have grown to what this load needs and clients hold their regions
            baseline = {name: rss_kib(pid) for name, pid in pids.items()}
            fds_during = {name: fds(pid) for name, pid in pids.items()}
            samples: dict[str, list[int]] = {name: [] for name in pids}
            while any(p.is_alive() for p in clients):
                for name, pid in pids.items():
                    samples[name].append(rss_kib(pid))
                time.sleep(args.sample_secs)
            for p in clients:
                p.join()
            totals = [counts.get() for _ in clients]
            time.sleep(1.0)  # let the last FREE records and unregisters settle
            fds_after = {name: fds(pid) for name, pid in pids.items()}
            unchanged_pids = sorted(children(srv.proc.pid)) == sorted(p for n, p in pids.items() if n != "front-end")
        finally:
            srv.stop()
        shm_after = shm_objects()
    good = unchanged_pids
    print(f"soak: {args.seconds:.0f} s, concurrency {per_kind * len(kinds)} ({per_kind} per kind: {', '.join(kinds)})")
    for kind, ok, failed, errors in sorted(totals):
        print(f"  {kind:<12} {ok:>9} ok {failed:>6} failed" + "".join(f"\n      {e}" for e in errors))
        good &= failed == 0 and ok > 0
    for name in pids:
        base, last, peak = baseline[name], samples[name][-1], max(samples[name])
        drift = (last - base) / base
        flat = abs(drift) <= RSS_TOLERANCE and (peak - base) / base <= RSS_TOLERANCE
        good &= flat
        print(f"  RSS {name:<16} warm {base / 1024:7.1f} MiB  end {last / 1024:7.1f} MiB ({drift:+.1%})  "
              f"peak {peak / 1024:7.1f} MiB  {'flat' if flat else 'NOT FLAT'}")
        # leaked: a client region still open after every client unregistered, or any other
        # kind of fd that grew after the warm-up (arena segments may grow during it)
        after, during = fds_after[name], fds_during[name]
        leaked = {k: n for k, n in after.items() if (k.startswith("/dev/shm/") and n) or
                  (not k.startswith("/dev/shm/") and n > during.get(k, 0))}
        good &= not leaked
        print(f"  fds {name:<16} before {sum(fds_before[name].values())}  warm {sum(during.values())}  "
              f"after {sum(after.values())}" + (f"  LEAKED {leaked}" if leaked else "  none leaked"))
        grew = {k: n - fds_before[name].get(k, 0) for k, n in after.items() if n > fds_before[name].get(k, 0)}
        if grew:  # kept from the warm-up on: arena segments, connections still open
            print(f"      more than before the load: {grew}")
    leaked_shm = sorted(shm_after - shm_before)
    good &= not leaked_shm
    print(f"  /dev/shm objects before {len(shm_before)}  after {len(shm_after)}"
          + (f"  left behind: {leaked_shm[:5]}" if leaked_shm else ""))
    if not unchanged_pids:
        print("  a worker was restarted during the soak")
    print("PASS" if good else "FAIL")
    return 0 if good else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kill", help="kill -9 of the worker under load")
    k.add_argument("--concurrency", type=int, default=16)
    k.add_argument("--seconds", type=float, default=20.0, help="load duration; the kill is half-way")
    k.add_argument("--perf-analyzer", action="store_true", help="drive the load with the real perf_analyzer")
    s = sub.add_parser("soak", help="RSS, fds and shm objects over a long run")
    s.add_argument("--concurrency", type=int, default=32)
    s.add_argument("--seconds", type=float, default=600.0)
    s.add_argument("--warmup", type=float, default=30.0, help="seconds before the RSS baseline is taken")
    s.add_argument("--sample-secs", type=float, default=5.0)
    args = parser.parse_args(argv)
    return kill(args) if args.what == "kill" else soak(args)


if __name__ == "__main__":
    sys.exit(main())
