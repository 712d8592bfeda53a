#!/usr/bin/env bash
# Every GPU check in one run: build the extensions, run the GPU tests and the CPU side of
# the GPU work, run the GPU benchmarks, and write everything under one folder.
#
#   bench/gpu/run.sh --fetch        here, with pip and a network: put the wheels the GPU
#                                   machine lacks into .whl/ (Python 3.12, manylinux x86-64)
#   bench/gpu/run.sh [RESULTS_DIR]  on the GPU machine (default: $OUT, else bench/gpu/results)
#
# The GPU machine has Python 3.12, CUDA 13, cupy-cuda13x, cuda-bindings, torch, numpy,
# aiohttp, uvloop, grpcio, protobuf, cython and a C compiler, and no network: the generated
# gRPC stubs travel with the tree (carry triton_shm/_proto) and the rest as wheels (.whl):
# the device run is `bench/gpu/run.sh` with carry [".whl", "triton_shm/_proto"]; results
# come back as the files of $OUT (environment, build, install, tests and bench logs).
set -uo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(httptools orjson ngh2 "tritonclient[http,grpc]" python-rapidjson geventhttpclient gevent greenlet
        zope.event zope.interface brotli certifi urllib3 hpack h2 hyperframe)
if [[ "${1:-}" == "--fetch" ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
    for w in "${WHEELS[@]}"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform any -d .whl "${w%%\[*}" || echo "could not fetch $w" >&2
    done
    ls -la .whl
    exit 0
fi

R="${1:-${OUT:-bench/gpu/results}}"
mkdir -p "$R"
PY="${PYTHON:-python3}"
SITE=/tmp/triton-shm-site
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        > "$R/install.log" 2>&1 || { echo "wheel install failed: see $R/install.log"; }
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
    nvidia-smi || true
    "$PY" -c "import cupy, numpy; print('cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), 'devices', cupy.cuda.runtime.getDeviceCount(), 'numpy', numpy.__version__)"
    "$PY" -c "import tritonclient, google.protobuf as p; print('tritonclient ok; protobuf', p.__version__)"
} > "$R/environment.txt" 2>&1

"$PY" setup.py -q build_ext --inplace > "$R/build.log" 2>&1 || echo "build_ext failed: see $R/build.log (the pure-Python twins are used)"

status=0
# every test that has a GPU case, and the CPU side of the GPU work (the torch and DLPack
# idioms, protobuf as that machine has it)
GPU_TESTS=(tests/test_gpu.py tests/test_gpu_inputs.py tests/test_cuda_shm.py tests/test_gpu_placement.py
           tests/test_tensorrt.py tests/test_onnx_cuda_plan.py tests/test_dlpack.py tests/test_pytorch.py)
timeout 300 "$PY" -m pytest "${GPU_TESTS[@]}" -v -rs -p no:cacheprovider > "$R/tests.log" 2>&1 || status=$?
timeout 120 "$PY" -m pytest tests/test_perf.py -k cuda -v -rs -p no:cacheprovider >> "$R/tests.log" 2>&1 || status=$?
tail -n 25 "$R/tests.log"

timeout 180 "$PY" bench/gpu/cuda_shm.py --n 20 > "$R/bench.md" 2>&1 || echo "bench failed: see $R/bench.md"
head -n 30 "$R/bench.md"
# --frontend-processes 1, 2, 4, 8 on the machine's cores: small requests from several load generators
timeout 240 "$PY" bench/frontend_scaling.py --processes 1,2,4,8 --clients 4 --concurrency 16 \
    > "$R/frontends.md" 2>&1 || echo "frontend scaling failed: see $R/frontends.md"
tail -n 8 "$R/frontends.md"
exit $status
