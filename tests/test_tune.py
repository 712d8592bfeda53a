"""``triton-shm tune`` end to end, against real server processes: the proof (a batch-friendly
model served poorly gets a config that serves at least twice as much at concurrency 16 within
the budget, measured side by side with the perf engine), tuning a running server through
--url and leaving it as it was, and the bad inputs (unknown model, a budget nothing meets,
candidates that fail to load, a server that dies)."""
from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from triton_shm.core.models.config import parse_pbtxt

from .harness import ServerProcess
from .models import write_model

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent
BUDGET_MS = 250

# A fixed 20 ms per execute whatever the batch: batching's gain is structural (x8 at batch 8),
# so "at least x2" holds by a wide margin even on a loaded 2-core machine.
SLEEPY_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if FAIL_ABOVE_ONE_INSTANCE and config["instance_group"][0]["count"] > 1:
            raise RuntimeError("this model runs one instance only")

    def execute(self, requests):
        time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

POOR_CONFIG = """
# served poorly on purpose: one instance, no dynamic batching
name: "{name}"
backend: "python"
max_batch_size: 8  # the model takes up to 8 per execute
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "unrelated" value {{ string_value: "kept" }} }}
"""

FAST = ["--measurement-interval-ms", "300", "--max-trials", "4", "--stability-percentage", "25"]


def sleepy(repo: Path, name: str = "sleepy", fail_above_one: bool = False) -> Path:
    return write_model(repo, name, config=POOR_CONFIG.format(name=name),
                       model_py=SLEEPY_PY.replace("FAIL_ABOVE_ONE_INSTANCE", str(fail_above_one)))


def tune(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triton_shm", "tune", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def perf_c16(server: ServerProcess, model: str, out: Path) -> dict[str, str]:
    p = subprocess.run([sys.executable, "-m", "triton_shm.perf", "-m", model, "-u", server.grpc_url,
                        "--concurrency-range", "16", "--measurement-interval", "800", "--max-trials", "6",
                        "--stability-percentage", "25", "-f", str(out)],
                       capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return read_csv(out)[0]


def http(server_url: str, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{server_url}{path}", data=data, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else None


def test_tune_doubles_throughput_at_concurrency_16(tmp_path):
    repo = tmp_path / "models"
    model_dir = sleepy(repo)
    before = digest(repo)
    out = tmp_path / "out"
    p = tune("--model-repository", str(repo), "--model", "sleepy", "--output", str(out),
             "--latency-budget-ms", str(BUDGET_MS), "--concurrency", "16", "--time-budget-s", "25",
             "--server-arg=--gpus=none", *FAST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert digest(repo) == before                                   # the user's files are untouched
    assert "chosen" in p.stderr and "[tune] candidate 1 of" in p.stderr
    text = (out / "config.pbtxt").read_text()
    # only the tuned fields changed: the rest of the file (its comments too) is as written
    for line in ('# served poorly on purpose: one instance, no dynamic batching', 'name: "sleepy"',
                 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                 'parameters { key: "unrelated" value { string_value: "kept" } }'):
        assert line in text, text
    assert "# triton-shm tune" in text and "chosen:" in text
    tuned = parse_pbtxt(text)
    original = parse_pbtxt((model_dir / "config.pbtxt").read_text())
    for f in ("name", "backend", "input", "output"):
        assert getattr(tuned, f) == getattr(original, f)
    assert tuned.parameters["unrelated"].string_value == "kept"
    rows = read_csv(out / "measurements.csv")
    assert rows[0]["candidate"] == "default" and len({r["candidate"] for r in rows}) >= 2
    assert all(r["concurrency"] == "16" for r in rows if r["status"] == "ok")
    assert float(rows[0]["server_cpu_ms_per_infer"]) > 0 and float(rows[0]["server_rss_mib"]) > 10
    report = (out / "report.html").read_text()
    assert "<svg" in report and "budget 250 ms" in report and "default" in report and "chosen" in report

    # side by side: the model as it was, and a copy with the tuned config, on one server
    shutil.copytree(model_dir, repo / "sleepy_tuned")
    (repo / "sleepy_tuned" / "config.pbtxt").write_text(text.replace('name: "sleepy"', 'name: "sleepy_tuned"'))
    srv = ServerProcess(repo, tmp_path / "side.log").start()
    try:
        srv.wait_repository_loaded()
        old = perf_c16(srv, "sleepy", tmp_path / "old.csv")
        new = perf_c16(srv, "sleepy_tuned", tmp_path / "new.csv")
    finally:
        srv.stop()
    print(f"concurrency 16: {old['Inferences/Second']}/s (p99 {old['p99 latency']} us) as written, "
          f"{new['Inferences/Second']}/s (p99 {new['p99 latency']} us) as tuned")
    assert float(new["Inferences/Second"]) >= 2 * float(old["Inferences/Second"]), (old, new)
    assert float(new["p99 latency"]) / 1000 <= BUDGET_MS, new


def test_tune_running_server_leaves_it_as_found(tmp_path):
    repo = tmp_path / "models"
    sleepy(repo)
    sleepy(repo, "idle")                     # in the repository, not loaded: tune loads it, then unloads it
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "sleepy"]).start()
    try:
        config_before = http(srv.http_url, "GET", "/v2/models/sleepy/config")
        for model in ("sleepy", "idle"):
            out = tmp_path / f"out_{model}"
            p = tune("--model-repository", str(repo), "--model", model, "--url", srv.http_url,
                     "--grpc-url", srv.grpc_url, "--output", str(out), "--concurrency", "4",
                     "--time-budget-s", "6", *FAST)
            assert p.returncode == 0, p.stdout + p.stderr
            assert (out / "config.pbtxt").is_file() and (out / "report.html").is_file()
            rows = read_csv(out / "measurements.csv")
            assert len(rows) >= 2
            # a server on this machine: its CPU per inference and memory are measured too
            assert float(rows[0]["server_cpu_ms_per_infer"]) > 0 and float(rows[0]["server_rss_mib"]) > 10
        states = {m["name"]: m.get("state") for m in http(srv.http_url, "POST", "/v2/repository/index", {})}
        assert states["sleepy"] == "READY" and states["idle"] != "READY", states
        assert http(srv.http_url, "GET", "/v2/models/sleepy/config") == config_before
    finally:
        srv.stop()


def test_unknown_model_and_bad_flags(tmp_path):
    repo = tmp_path / "models"
    sleepy(repo)
    p = tune("--model-repository", str(repo), "--model", "nope", "--output", str(tmp_path / "o"))
    assert p.returncode == 2 and "unknown model 'nope'" in p.stderr and "Traceback" not in p.stderr
    p = tune("--model-repository", str(repo), "--model", "sleepy", "--output", str(repo / "sleepy"))
    assert p.returncode == 2 and "never writes to the repository" in p.stderr
    p = tune("--model-repository", str(repo), "--model", "sleepy", "--concurrency", "0,x")
    assert p.returncode == 2 and "--concurrency" in p.stderr
    p = tune("--model-repository", str(repo), "--model", "sleepy", "--url", "127.0.0.1:1",
             "--output", str(tmp_path / "o"))
    assert p.returncode == 1 and "does not answer" in p.stderr and "Traceback" not in p.stderr
    write_model(repo, "broken", config=POOR_CONFIG.format(name="broken"), model_py="""
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("this model cannot start")
        """)
    p = tune("--model-repository", str(repo), "--model", "broken", "--output", str(tmp_path / "b"),
             "--server-arg=--gpus=none", "--time-budget-s", "10")
    assert p.returncode == 1 and "model 'broken' does not load with its own config" in p.stderr, p.stderr
    assert "this model cannot start" in p.stderr and "Traceback" not in p.stderr


def test_budget_nothing_meets_and_candidates_that_fail_to_load(tmp_path):
    """A 1 ms budget against a 20 ms model: exit 1, nothing written but what was measured. The
    model refuses a second instance: those candidates are recorded as load failures and the
    search goes on."""
    repo = tmp_path / "models"
    sleepy(repo, fail_above_one=True)
    out = tmp_path / "out"
    p = tune("--model-repository", str(repo), "--model", "sleepy", "--output", str(out),
             "--latency-budget-ms", "1", "--concurrency", "2", "--time-budget-s", "12",
             "--server-arg=--gpus=none", *FAST)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no candidate meets the p99 latency budget of 1 ms" in p.stderr and "Traceback" not in p.stderr
    assert not (out / "config.pbtxt").exists()
    rows = read_csv(out / "measurements.csv")
    assert rows[0]["candidate"] == "default" and float(rows[0]["p99_ms"]) > 1
    failed = [r for r in rows if r["status"].startswith("load failed")]
    assert failed and all(r["instances"] == "2" for r in failed), rows
    assert "did not load" in p.stderr
    assert (out / "report.html").is_file()


def test_server_dies_mid_run(tmp_path):
    repo = tmp_path / "models"
    sleepy(repo)
    srv = ServerProcess(repo, tmp_path / "server.log",
                        extra_args=["--model-control-mode", "explicit", "--load-model", "sleepy"]).start()
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "triton_shm", "tune", "--model-repository", str(repo),
                             "--model", "sleepy", "--url", srv.http_url, "--grpc-url", srv.grpc_url,
                             "--output", str(out),
                             "--concurrency", "2", "--time-budget-s", "120", *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the default is measured: its rows are in the CSV
            csv_path = out / "measurements.csv"
            if csv_path.is_file() and any(r["candidate"] == "default" for r in read_csv(csv_path)):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            raise AssertionError("tune measured nothing in 90 s")
        srv.proc.kill()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.stop()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and ("went away" in err or "does not answer" in err), err
    assert any(r["candidate"] == "default" for r in read_csv(out / "measurements.csv"))
    assert (out / "report.html").is_file()
