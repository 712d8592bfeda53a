"""Run the real Model Analyzer against triton-shm: ``model-analyzer profile
--triton-launch-mode=remote`` with our HTTP and gRPC endpoints and our metrics URL, on a small
batch-friendly Python model, and check that it runs through and writes its reports.

    make model-analyzer            # installs Model Analyzer into .venv-ma, then runs this
    python tools/model_analyzer.py --model-analyzer .venv-ma/bin/model-analyzer [--keep DIR]

What Model Analyzer calls, all of which must work against triton-shm: the health, metadata,
model-config and repository (load with a config override, unload) APIs over gRPC, the metrics
endpoint (it scrapes nv_gpu_*, nv_cpu_utilization and nv_cpu_memory_used_bytes), and the
real ``perf_analyzer`` binary (found as tests/perf_analyzer.py installs it; put on PATH by a
wrapper that records each command line in the work directory's perf_analyzer_calls.txt).
``--gpu-configs`` leaves out ``cpu_only``: Model Analyzer then generates KIND_GPU variants, which
a server without a GPU refuses at load with a clear error, and it goes on with the others.
Exit status 0 when the profile ran through and the reports and the results CSV exist.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "batchy"
CONFIG = """
name: "batchy"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL_PY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.005)  # a fixed cost per execute: batching pays
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perf_analyzer_wrapper(bin_dir: Path, calls: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.perf_analyzer import ensure_perf_analyzer
    pa = ensure_perf_analyzer()
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "perf_analyzer"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "perf_analyzer $*" >> '{calls}'
        LD_LIBRARY_PATH='{pa.lib_dir}' exec '{pa.exe}' "$@"
        """))
    wrapper.chmod(0o755)


def wait_ready(http: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"triton-shm exited with {proc.returncode} at start")
        try:
            with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("triton-shm did not become ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-analyzer", default=str(ROOT / ".venv-ma" / "bin" / "model-analyzer"),
                    help="the model-analyzer executable (default .venv-ma/bin/model-analyzer)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (default: a temp dir)")
    ap.add_argument("--gpu-configs", action="store_true",
                    help="let Model Analyzer generate KIND_GPU variants too (no cpu_only)")
    ap.add_argument("--max-concurrency", type=int, default=4, help="run_config_search_max_concurrency (default 4)")
    ap.add_argument("--max-instances", type=int, default=2, help="run_config_search_max_instance_count (default 2)")
    ap.add_argument("--max-batch-size", type=int, default=8,
                    help="run_config_search_max_model_batch_size (default 8)")
    ap.add_argument("--client-protocol", choices=["grpc", "http"], default="grpc",
                    help="what Model Analyzer and perf_analyzer talk to the server over (default grpc)")
    ap.add_argument("--timeout", type=float, default=900)
    ns = ap.parse_args()
    if not Path(ns.model_analyzer).exists() and not shutil.which(ns.model_analyzer):
        raise SystemExit(f"no Model Analyzer at {ns.model_analyzer}: make model-analyzer installs it")
    work = Path(ns.keep) if ns.keep else Path(tempfile.mkdtemp(prefix="triton-shm-ma-"))
    if work.exists():
        shutil.rmtree(work)
    (work / "repo" / MODEL / "1").mkdir(parents=True)
    (work / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
    (work / "repo" / MODEL / "1" / "model.py").write_text(MODEL_PY)
    calls = work / "perf_analyzer_calls.txt"
    perf_analyzer_wrapper(work / "bin", calls)

    http, grpc, metrics = free_port(), free_port(), free_port()
    log = open(work / "triton-shm.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "triton_shm", "--model-repository", str(work / "repo"), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--model-control-mode", "explicit",
         "--load-model", MODEL], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_ready(f"127.0.0.1:{http}", server)
        model_yaml = f" {MODEL}\n" if ns.gpu_configs else f"\n  {MODEL}:\n    cpu_only: true\n"
        (work / "ma.yaml").write_text(
            f"model_repository: {work / 'repo'}\n"
            f"profile_models:{model_yaml}"
            "triton_launch_mode: remote\n"
            f"triton_http_endpoint: 127.0.0.1:{http}\n"
            f"triton_grpc_endpoint: 127.0.0.1:{grpc}\n"
            f"triton_metrics_url: http://127.0.0.1:{metrics}/metrics\n"
            f"output_model_repository_path: {work / 'ma_output_repo'}\n"
            "override_output_model_repository: true\n"
            f"export_path: {work / 'export'}\n"
            f"checkpoint_directory: {work / 'checkpoints'}\n"
            f"run_config_search_max_concurrency: {ns.max_concurrency}\n"
            f"run_config_search_max_instance_count: {ns.max_instances}\n"
            f"run_config_search_max_model_batch_size: {ns.max_batch_size}\n"
            "collect_cpu_metrics: true\n"
            f"client_protocol: {ns.client_protocol}\n"
            "perf_analyzer_timeout: 120\n")
        env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [ns.model_analyzer, "profile", "-f", str(work / "ma.yaml")]
        print("running:", " ".join(cmd), f"(config: {work / 'ma.yaml'})", flush=True)
        t0 = time.monotonic()
        with open(work / "model_analyzer.log", "w") as out:
            ma = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, timeout=ns.timeout)
        took = time.monotonic() - t0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    text = (work / "model_analyzer.log").read_text()
    results = work / "export" / "results" / "metrics-model-inference.csv"
    summary = work / "export" / "reports" / "summaries" / MODEL
    problems = []
    if ma.returncode != 0:
        problems.append(f"model-analyzer exited with {ma.returncode}")
    if not results.is_file():
        problems.append(f"no {results}")
    if not summary.is_dir() or not any(summary.iterdir()):
        problems.append(f"no summary report in {summary}")
    rows = list(csv.DictReader(open(results))) if results.is_file() else []
    configs = sorted({r.get("Model Config Path", "") for r in rows})
    if len(configs) < (1 if ns.gpu_configs else 2):  # without a GPU, its KIND_GPU variants are refused
        problems.append(f"results for {len(configs)} config(s) only: {configs}")
    print(f"Model Analyzer took {took:.0f} s; {len(rows)} measurement(s) of {len(configs)} config(s): "
          f"{', '.join(configs)}")
    print(f"perf_analyzer calls: {sum(1 for _ in open(calls)) if calls.exists() else 0} ({calls})")
    failed = [line for line in text.splitlines() if "load failed" in line]
    if failed:
        print(f"{len(failed)} variant(s) refused at load, e.g.: {failed[0].strip()}")
    print(f"reports: {work / 'export' / 'reports'}; log: {work / 'model_analyzer.log'}")
    if problems:
        tail = "\n".join(text.splitlines()[-30:])
        print("FAILED: " + "; ".join(problems) + "\n--- last lines of the log ---\n" + tail)
        return 1
    print("OK: Model Analyzer profiled triton-shm in remote mode and wrote its reports")
    if not ns.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
