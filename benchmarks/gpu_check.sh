#!/usr/bin/env bash
# Level 4 on a CUDA GPU (written for an H200): kernel tests, then accuracy and speed.
#
#   benchmarks/gpu_check.sh [RESULTS_DIR]      (default: gpu_results/)
#
# 1. pytest tests/test_level4_kernels.py --device cuda: fp32, fp16 and bf16 against
#    float64, low precision held to at most 2x PyTorch SDPA's own error (log: tests.log);
# 2. python -m levels.level4_triton_kernel.gpu_bench: the autotuned kernels' accuracy
#    at large sizes, then TFLOP/s of level 4 against SDPA's flash / efficient / cudnn /
#    math backends (gpu_check.txt with date and device, gpu_check.json).
#
# Finishes in under 8 minutes: each step has a hard time limit, and the bench skips
# (and records as skipped) whatever its budget does not reach. Nothing else in the
# project depends on this script. Exit status: 0 if the tests and accuracy checks
# passed, 1 otherwise, 2 without CUDA.
set -uo pipefail

TOTAL_S=465          # the whole script: under 8 minutes, with 15 s to spare
TESTS_S=210          # hard limit for the pytest step (most of it is compiling kernels)
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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    > "$RESULTS/device.txt" 2>&1 || true
echo "gpu_check: $(cat "$RESULTS/device.txt"), results in $RESULTS"

timeout "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider tests/test_level4_kernels.py \
    --device cuda 2>&1 | tee "$RESULTS/tests.log"
tests_rc=${PIPESTATUS[0]}
echo "gpu_check: tests exit status $tests_rc"

left=$(( TOTAL_S - ($(date +%s) - start) ))
# The bench stops starting new cases 45 s before its hard limit; one case
# (first-call autotuning of three kernels) fits in that margin.
timeout "$left" "$PY" -m levels.level4_triton_kernel.gpu_bench \
    --out "$RESULTS" --budget-s $(( left - 45 )) 2>&1 | tee "$RESULTS/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "gpu_check: bench exit status $bench_rc, $(( $(date +%s) - start )) s in all"

[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
