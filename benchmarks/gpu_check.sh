#!/usr/bin/env bash
# The ladder on a CUDA GPU (written for an H200), in one run of under 8 minutes:
#
#   bash benchmarks/gpu_check.sh [--dry-run] [RESULTS_DIR]      (default: gpu_results/)
#
# 1. the compile check: every level-4 kernel compiled for this GPU's target (sm_80 or sm_90)
#    as CI does it without a GPU (`ladder check`), on this machine's cores; compile_check.txt, compile_check.json;
# 2. the test suite on CUDA: `pytest --device cuda` (every level's float16 and bfloat16
#    cases under the 2x-PyTorch-error rule, level 4's kernels at odd sizes with the
#    autotuned tiles, pruned by shared memory), log in tests.log;
# 3. real-model prompt and decode at levels 3 and 4 (`ladder bench --scenario real-model`:
#    float32, bfloat16 and float16 weights, and level 3's int8), checked against level 1's
#    float64 logits of the same file; decode.txt, decode.json. It needs SmolLM2 in the
#    ladder's cache on the GPU machine (`ladder pull`, or LADDER_CACHE pointing at a copy);
#    without it the scenario reports itself unsupported, with that command;
# 4. flash-decoding against plain decode: `ladder bench --scenario decode` at level 4,
#    with its unsplit kernel (level4:no-split) and SDPA's backends as peers; splits.txt,
#    splits.json;
# 5. `ladder bench --device cuda`: every scenario, with SDPA's flash / efficient / cudnn /
#    math backends as peers, TFLOP/s from the shared formulas against the measured bf16
#    matmul peak, generation tokens/s; bench.json, bench.png and bench.txt;
# 6. device.txt: the GPU, its compute capability and shared memory per block, the driver,
#    torch and triton versions and the date.
#
# The harness and the tests are the project's own, the same as on a CPU; this script only
# runs them, each step under a hard time limit. Exit status: 0 if every step passed, 1 if
# one failed, 2 without CUDA. Nothing in the project depends on this script.
#
# --dry-run (or GPU_CHECK_DRY_RUN=1) runs everything but the launches, on any machine:
# each step's arguments are parsed by its own command and its modules imported, the
# output paths are created, the compile check builds every job's compile inputs
# (--plan-only) and pytest collects the suite; no kernel is compiled or run. CI runs it
# (tests/test_level4_compile.py), so the first session with a GPU only has to run the
# script and commit the results.
set -uo pipefail

DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
if [ "${1:-}" = "--dry-run" ]; then
    DRY_RUN=1
    shift
fi

TOTAL_S=465          # the whole script: under 8 minutes, with 15 s to spare
COMPILE_S=60         # step 1: this GPU's target, ~6 core-minutes cold, on 16 cores
TESTS_S=170          # step 2 (much of it compiles kernels)
DECODE_S=60          # step 3: the file's dequantizing, the float64 truth, level 4's autotuning
SPLIT_S=30           # step 4
# step 5 gets what is left
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="$(mkdir -p "${1:-gpu_results}" && cd "${1:-gpu_results}" && pwd)"
cd "$ROOT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
start=$(date +%s)
failed=0

# run_step NAME SECONDS LOG COMMAND...: COMMAND under a hard time limit, its output in LOG too.
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local shown="$*"
    [ "${2:-}" = "-c" ] && shown="$1 -c \"\$DRY_LADDER\" ${*:4}"  # not the script itself
    echo "gpu_check: $name (at most $limit s): $shown"
    timeout "$limit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "gpu_check: $name exit status $rc"
    [ "$rc" -eq 0 ] || failed=1
}

# "$PY" -c "$DRY_LADDER" ARGS...: `ladder ARGS` parsed by the command's own parser, its module
# imported and its output paths checked (their folders created), without running it.
DRY_LADDER=$(cat <<'PY'
import importlib
import sys

from ladder.cli import build_parser, check_output_path

args = build_parser().parse_args(sys.argv[1:])
module, _, name = args.run.partition(":")
getattr(importlib.import_module(module), name)
for flag in ("json", "plot"):
    check_output_path(getattr(args, flag, None), f"--{flag}")
print("gpu_check: dry run: ladder", " ".join(sys.argv[1:]), "parses, imports, can write its files")
PY
)

if [ "$DRY_RUN" = 1 ]; then
    echo "gpu_check: dry run: every step but the launches, results in $RESULTS"
    {
        echo "dry run on $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ): no device used"
        "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
    } > "$RESULTS/device.txt" 2>&1
else
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "gpu_check: no CUDA device visible to $PY; nothing to do (--dry-run runs the rest)" >&2
        exit 2
    fi
    {
        date -u +"date %Y-%m-%dT%H:%M:%SZ"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
        # The compile check's limits (ladder/check/matrix.py's TARGETS) against the device's own.
        "$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"compute capability {p.major}.{p.minor}, shared memory per block (opt-in) {p.shared_memory_per_block_optin} bytes, {p.multi_processor_count} SMs")'
    } > "$RESULTS/device.txt" 2>&1
    echo "gpu_check: $(tr '\n' ' ' < "$RESULTS/device.txt"), results in $RESULTS"
fi

# 1. The compile check: CPU work, the same as CI's (tests/test_level4_compile.py -m extended),
# here for this GPU's own target (sm_80 for 8.x, sm_90 for 9.x; both for another GPU).
if [ "$DRY_RUN" = 1 ]; then
    compile_args=(--plan-only)
else
    compile_args=(--json "$RESULTS/compile_check.json")
    target=$("$PY" -c 'import levels, torch; from levels.level4_triton_kernel.tiles import shared_memory_target; print(shared_memory_target(torch.cuda.get_device_capability(0)) or "")')
    [ -n "$target" ] && compile_args+=(--target "$target")
fi
run_step "compile check" "$COMPILE_S" "$RESULTS/compile_check.txt" \
    "$PY" -m ladder check "${compile_args[@]}"

# 2. The test suite on CUDA (dry run: collected, on the CPU).
if [ "$DRY_RUN" = 1 ]; then
    run_step "tests" "$TESTS_S" "$RESULTS/tests.log" \
        "$PY" -m pytest -q -p no:cacheprovider --collect-only
else
    run_step "tests" "$TESTS_S" "$RESULTS/tests.log" \
        "$PY" -m pytest -q -p no:cacheprovider --device cuda
fi

# 3. Real-model prompt and decode at levels 3 and 4, every weight format: decode.txt, decode.json.
decode=(bench --device cuda --scenario real-model --levels 3,4 --no-peers --no-progress
    --json "$RESULTS/decode.json")
# 4. Flash-decoding against plain decode, level 4 and its peers: splits.txt, splits.json.
splits=(bench --device cuda --scenario decode --levels 4 --no-progress --json "$RESULTS/splits.json")
if [ "$DRY_RUN" = 1 ]; then
    run_step "real-model decode" 60 "$RESULTS/decode.txt" "$PY" -c "$DRY_LADDER" "${decode[@]}"
    run_step "flash-decoding" 60 "$RESULTS/splits.txt" "$PY" -c "$DRY_LADDER" "${splits[@]}"
else
    run_step "real-model decode" "$DECODE_S" "$RESULTS/decode.txt" "$PY" -m ladder "${decode[@]}"
    run_step "flash-decoding" "$SPLIT_S" "$RESULTS/splits.txt" "$PY" -m ladder "${splits[@]}"
fi

# 5. The benchmark, with what is left of the budget.
bench=(bench --device cuda --no-progress --json "$RESULTS/bench.json" --plot "$RESULTS/bench.png")
if [ "$DRY_RUN" = 1 ]; then
    run_step "bench" 60 "$RESULTS/bench.txt" "$PY" -c "$DRY_LADDER" "${bench[@]}"
else
    left=$(( TOTAL_S - ($(date +%s) - start) ))
    run_step "bench" "$left" "$RESULTS/bench.txt" "$PY" -m ladder "${bench[@]}"
fi

echo "gpu_check: $(( $(date +%s) - start )) s in all, $([ "$failed" -eq 0 ] && echo "every step passed" || echo "a step failed")"
[ "$failed" -eq 0 ]
