#!/usr/bin/env bash
# The front-end's CPU scaling on a many-core machine (no GPU needed): --frontend-processes
# 1, 2, 4, 8, small requests from several load generators (bench/frontend_scaling.py).
#
#   bench/many_cores.sh [RESULTS_DIR]     default: $OUT, else bench/results
set -uo pipefail
cd "$(dirname "$0")/.."
R="${1:-${OUT:-bench/results}}"
mkdir -p "$R"
PY="${PYTHON:-python3}"
timeout 300 "$PY" bench/frontend_scaling.py --processes 1,2,4,8 --clients 4 --concurrency 16 \
    > "$R/frontends.md" 2>&1 || { echo "frontend scaling failed: see $R/frontends.md" >&2; exit 1; }
cat "$R/frontends.md"
