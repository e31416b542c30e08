#!/usr/bin/env bash
# One device call: install carried wheels, run the GPU tests, then the kernel benchmark.
# Usage (on the GPU host, repo root): bash tools/bench/gpu_session.sh "<pytest args>" "<bench args>"
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XG_CACHE_DIR=/tmp/xgcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if [ -n "$1" ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" $1 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [ -n "$2" ]; then
  python3 tools/bench/bench_kernels.py --json "$OUT/bench_kernels.json" $2 2>&1 | tee "$OUT/bench.log"
fi
