#!/usr/bin/env bash
# Every GPU check in one device call, within 8 minutes: preflight, a two-process CUDA IPC
# smoke test, a parallel build, the GPU tests (none may skip but those the machine cannot
# run: no TensorRT, no onnxruntime-gpu), the GPU benchmarks; everything under one folder.
#
#   bench/gpu/run.sh --fetch        here, with pip and a network: put the wheels the GPU
#                                   machine lacks into .whl/ (Python 3.12, manylinux x86-64);
#                                   fails if any cannot be fetched
#   bench/gpu/run.sh [RESULTS_DIR]  on the GPU machine (default: $OUT, else bench/gpu/results)
#
# The GPU machine has Python 3.12, CUDA 13, cupy-cuda13x, cuda-bindings, torch, numpy,
# aiohttp, uvloop, grpcio, protobuf, cython and a C compiler, and no network: the generated
# gRPC stubs travel with the tree (carry triton_shm/_proto) and the rest as wheels (.whl):
# the device run is `bench/gpu/run.sh` with carry [".whl", "triton_shm/_proto"]; results
# come back as the files of $OUT. It exits non-zero, naming the cause, on the first failed
# step. The CPU scaling run needs no GPU: bench/many_cores.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(httptools orjson ngh2 "tritonclient[http,grpc]" python-rapidjson geventhttpclient gevent greenlet
        zope.event zope.interface brotli certifi urllib3 hpack h2 hyperframe)
if [[ "${1:-}" == "--fetch" ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
    missing=()
    for w in "${WHEELS[@]}"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform any -d .whl "${w%%\[*}" || missing+=("$w")
    done
    ls -la .whl
    if (( ${#missing[@]} )); then echo "could not fetch: ${missing[*]}" >&2; exit 1; fi
    exit 0
fi

R="${1:-${OUT:-bench/gpu/results}}"
mkdir -p "$R"
PY="${PYTHON:-python3}"
fail() { echo "bench/gpu/run.sh: $*" | tee -a "$R/status.txt" >&2; exit 1; }

# 1. preflight, before anything is built: a GPU, CuPy and torch, or a clear stop
"$PY" -c "import cupy; n = cupy.cuda.runtime.getDeviceCount(); assert n > 0, 'no CUDA device is visible'" \
    > "$R/preflight.log" 2>&1 || fail "no usable GPU through CuPy: $(tail -n 1 "$R/preflight.log")"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" \
    >> "$R/preflight.log" 2>&1 || fail "PyTorch cannot use the GPU (its checks need it): $(tail -n 1 "$R/preflight.log")"

SITE=/tmp/triton-shm-site
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        > "$R/install.log" 2>&1 || fail "wheel install failed: see $R/install.log"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'PYEOF'
import importlib.metadata as md
import cupy
rt, drv = cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.runtime.driverGetVersion()
print(f"CUDA runtime {rt // 1000}.{rt % 1000 // 10}, driver API {drv // 1000}.{drv % 1000 // 10}, "
      f"devices {cupy.cuda.runtime.getDeviceCount()}")
import torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
for dist in ("cupy-cuda13x", "cupy-cuda12x", "numpy", "grpcio", "protobuf", "tritonclient", "cuda-bindings"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        pass
PYEOF
} > "$R/environment.txt" 2>&1 || fail "could not read the versions: see $R/environment.txt"

# 2. the platform: a handle made in one process, opened in another
timeout 30 "$PY" bench/gpu/ipc_smoke.py > "$R/ipc_smoke.log" 2>&1 \
    || fail "the platform cannot share GPU memory between processes (not a triton-shm bug): $(tail -n 3 "$R/ipc_smoke.log")"

# 3. the build, in parallel
timeout 120 "$PY" setup.py -q build_ext --inplace -j "$(nproc)" > "$R/build.log" 2>&1 \
    || fail "build_ext failed or ran past 120 s: see $R/build.log"

# 4. the GPU tests: a skip is a failure, but for what this machine cannot have
GPU_TESTS=(tests/test_gpu.py tests/test_gpu_inputs.py tests/test_cuda_shm.py tests/test_gpu_placement.py
           tests/test_tensorrt.py tests/test_onnx_cuda_plan.py tests/test_dlpack.py tests/test_pytorch.py)
timeout 180 "$PY" -m pytest "${GPU_TESTS[@]}" -v -rs -p no:cacheprovider > "$R/tests.log" 2>&1 \
    || fail "GPU tests failed or ran past 180 s: see $R/tests.log ($(tail -n 1 "$R/tests.log"))"
timeout 45 "$PY" -m pytest tests/test_perf.py -k cuda -v -rs -p no:cacheprovider >> "$R/tests.log" 2>&1 \
    || fail "perf's CUDA tests failed: see $R/tests.log"
# skips that only say what the machine lacks or has (TensorRT, onnxruntime-gpu, a missing-package message)
ALLOWED='is installed here|has the CUDA execution provider|onnxruntime is not installed|TensorRT'
unexpected=$(grep -E '^SKIPPED' "$R/tests.log" | grep -vE "$ALLOWED" || true)
[[ -z "$unexpected" ]] || fail "GPU tests skipped on a GPU machine:
$unexpected"
tail -n 3 "$R/tests.log"

# 5. the GPU benchmarks
timeout 90 "$PY" bench/gpu/cuda_shm.py --n 20 > "$R/bench.md" 2>&1 || fail "the benchmark failed: see $R/bench.md"
head -n 12 "$R/bench.md"
echo "ok" > "$R/status.txt"
