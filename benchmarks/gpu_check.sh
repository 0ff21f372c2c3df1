#!/usr/bin/env bash
# The checks to run the day a GPU machine is lent (issue 19), in <= 8 minutes, all
# results into one file:
#   1. a GPU smoke subset of the tests (those that need one device), and OpInfo's
#      comparison with CPU PyTorch for the ops models lean on (needs expecttest);
#   2. the sweep's GPU points against JAX on the same GPU (step ms, host ms, memory,
#      program size; benchmarks/sweep.py --grid gpu);
#   3. examples/train_gpt.py on the GPU in bfloat16 autocast: tokens/s and MFU
#      (benchmarks/gpt_throughput.py).
# Needs only the repository (Python 3.12, torch 2.11, JAX 0.11.x with CUDA; no network):
# torchspmd is imported from this checkout.
#
#   benchmarks/gpu_check.sh [--dry-run] [RESULTS_FILE]     (default gpu_check_results.txt)
#
# --dry-run: the same three sections at tiny sizes on CPU devices (the sweep: one point) (the test suite runs it
# so that this script cannot rot). A section that fails is reported and the next one runs;
# the exit status is the number of failed sections.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
DRY=0
OUT=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) OUT="$arg" ;;
  esac
done
OUT="${OUT:-$ROOT/gpu_check_results.txt}"
mkdir -p "$(dirname "$OUT")"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT"

if [ "$DRY" = 1 ]; then
  TESTS="${GPU_CHECK_TESTS:-tests/debug/test_program_size.py::test_program_size_counts_the_entry_and_leaves_fused_computations_out}"
  GPT_ARGS=(--mesh 1x1 --strategy dp --steps 4 --batch 2 --seq 8 --dim 16 --layers 1 --heads 2 --autocast bf16)
  SWEEP_ARGS=(--grid smoke --steps 2 --warmup 2 --no-lazy)
  export TORCHSPMD_CPU_DEVICES="${TORCHSPMD_CPU_DEVICES:-1}"
  LIMITS=(120 120 300 120)  # tests, opinfo, sweep, gpt
else
  # Tests that need no more devices than one GPU has (most of the suite builds 8-device
  # meshes, which the GPU machine's single device cannot hold); each compares with CPU.
  TESTS="${GPU_CHECK_TESTS:-tests/device/test_device.py tests/device/test_training.py tests/step/test_optimizers.py tests/device/test_activation_checkpoint.py tests/debug/test_program_size.py::test_compare_programs_puts_a_compiled_step_next_to_a_jax_function}"
  GPT_ARGS=(--mesh 1x1 --strategy dp --steps 40 --batch 32 --seq 256 --dim 768 --layers 12 --heads 12 --autocast bf16)
  SWEEP_ARGS=(--grid gpu --steps 20 --warmup 5)
  LIMITS=(80 70 190 90)  # tests, opinfo, sweep, gpt: 7.2 minutes at most
fi

# OpInfo entries of the ops models lean on (each compared with CPU PyTorch).
OPINFO_K="matmul or addmm or linear or softmax or layer_norm or gelu or cross_entropy or scaled_dot_product or conv2d or embedding or cumsum or sort or topk or var_mean or erf or tanh or where or index_put or scatter_add or gather or argmax or lgamma or remainder or max_pool2d"
[ "$DRY" = 1 ] && OPINFO_K="matmul and float32"

failed=0
section() {  # section NAME LIMIT_S COMMAND...
  local name="$1" limit="$2"; shift 2
  echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}

{
  echo "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) dry_run=$DRY host $(hostname)"
  "$PY" -c "import sys, torch, jax, torchspmd; print('python', sys.version.split()[0], '| torch', torch.__version__, '| jax', jax.__version__, '| devices', jax.devices())"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # shellcheck disable=SC2086  # TESTS is a list of test ids
  section tests "${LIMITS[0]}" "$PY" -m pytest -p no:cacheprovider -q $TESTS
  if "$PY" -c "import expecttest" 2>/dev/null; then
    section opinfo "${LIMITS[1]}" "$PY" -m pytest -p no:cacheprovider -q tests/test_opinfo.py -k "$OPINFO_K"
  else
    echo "== opinfo: not run (expecttest, which torch.testing's OpInfos import, is not installed)"
  fi
  section sweep "${LIMITS[2]}" "$PY" benchmarks/sweep.py "${SWEEP_ARGS[@]}" \
    --plot "${OUT%.*}_sweep.png" --json "${OUT%.*}_sweep.json"
  section gpt "${LIMITS[3]}" "$PY" benchmarks/gpt_throughput.py "${GPT_ARGS[@]}"
  echo "== gpu_check done: $failed section(s) failed"
  exit "$failed"
} 2>&1 | tee "$OUT"
exit "${PIPESTATUS[0]}"
