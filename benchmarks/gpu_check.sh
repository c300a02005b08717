#!/usr/bin/env bash
# The ladder on a CUDA GPU (written for an H200), in one run of under 8 minutes:
#
#   bash benchmarks/gpu_check.sh [RESULTS_DIR]      (default: gpu_results/)
#
# 1. the test suite on CUDA: `pytest --device cuda` (every level's float16 and bfloat16
#    cases under the 2x-PyTorch-error rule, level 4's kernels at odd sizes with the
#    autotuned tiles), log in tests.log;
# 2. `ladder bench --device cuda`: every scenario, with SDPA's flash / efficient / cudnn /
#    math backends as peers, TFLOP/s from the shared formulas against the measured bf16
#    matmul peak, generation tokens/s; bench.json, bench.png and bench.txt;
# 3. device.txt: the GPU, driver, torch and triton versions and the date.
#
# The harness and the tests are the project's own, the same as on a CPU; this script only
# runs them, each step under a hard time limit. Exit status: 0 if both passed, 1 if one
# failed, 2 without CUDA. Nothing in the project depends on this script.
set -uo pipefail

TOTAL_S=465          # the whole script: under 8 minutes, with 15 s to spare
TESTS_S=210          # the test step (much of it compiles kernels)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="$(mkdir -p "${1:-gpu_results}" && cd "${1:-gpu_results}" && pwd)"
cd "$ROOT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
start=$(date +%s)

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device visible to $PY; nothing to do" >&2
    exit 2
fi
{
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
} > "$RESULTS/device.txt" 2>&1
echo "gpu_check: $(tr '\n' ' ' < "$RESULTS/device.txt"), results in $RESULTS"

timeout "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider --device cuda 2>&1 | tee "$RESULTS/tests.log"
tests_rc=${PIPESTATUS[0]}
echo "gpu_check: tests exit status $tests_rc"

left=$(( TOTAL_S - ($(date +%s) - start) ))
timeout "$left" "$PY" -m benchmarks.cli bench --device cuda --no-progress \
    --json "$RESULTS/bench.json" --plot "$RESULTS/bench.png" 2>&1 | tee "$RESULTS/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "gpu_check: bench exit status $bench_rc, $(( $(date +%s) - start )) s in all"

[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
