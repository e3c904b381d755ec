#!/usr/bin/env bash
# tools/device-batch.sh - the batched-decode device call (issue 13): builds what it needs
# (sm_90a, -j16, build dir ../build-gbatch so a warm machine keeps the objects), runs
# test-kernels-batch, test-batch (engine level, on the GPU) and test-kernels on the tiny checkpoint, then gptoss-bench --concurrency on
# the synthetic 20b with the batched GPU step (--decode-batch 64, GPTOSS_CUDA_DECODE_BATCH=1) and
# without batching (--decode-batch 1). Everything lands in $OUT.
# Usage: tools/device-batch.sh --deps DIR/.deps --tokenizer DIR/.tokenizer [--variants]
# --variants: instead of test-kernels, two more 64-stream runs (20 ms gather window, with and
# without the step graphs) with per-step timings (GPTOSS_DECODE_BATCH_TRACE).
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK="" VARIANTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --variants) VARIANTS=1; shift;;
    *) echo "device-batch: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-batch-out}"
mkdir -p "$OUT"
B=../build-gbatch
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
log "GPU: $(tail -1 "$OUT/gpu.txt")"
t0=$(date +%s)
dev_build $B "$OUT/build.log" test-kernels-batch test-kernels test-batch gptoss-bench gptoss-synth
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; fi
$B/gptoss-synth --preset tiny --seed 1 --out /tmp/tiny ${TOK:+--tokenizer-dir $TOK} > "$OUT/synth.log" 2>&1
export GPTOSS_TINY_MODEL=/tmp/tiny GPTOSS_SOURCE_DIR=$PWD
timeout 120 $B/test-kernels-batch > "$OUT/test-kernels-batch.log" 2>&1
log "test-kernels-batch rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-kernels-batch.log" | tr '\n' ' ')"
GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_CUDA_DECODE_BATCH=1 timeout 120 $B/test-batch > "$OUT/test-batch-gpu.log" 2>&1
log "test-batch on the GPU rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-batch-gpu.log" | tr '\n' ' ')"
if [ $VARIANTS -eq 0 ]; then
  timeout 120 $B/test-kernels > "$OUT/test-kernels.log" 2>&1
  log "test-kernels rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-kernels.log" | tr '\n' ' ')"
fi
BENCH="$B/gptoss-bench --synthetic 20b --concurrency 1,8,32,64 -p 512 -n 256"
GPTOSS_CUDA_DECODE_BATCH=1 timeout 120 $BENCH --decode-batch 64 > "$OUT/bench-batch64.txt" 2>&1
log "bench --decode-batch 64 (GPU batched step) rc=$?"
timeout 120 $BENCH --decode-batch 1 > "$OUT/bench-batch1.txt" 2>&1
log "bench --decode-batch 1 rc=$?"
if [ $VARIANTS -eq 1 ]; then  # the gather window and the step graphs, with per-step timings
  GPTOSS_CUDA_DECODE_BATCH=1 GPTOSS_DECODE_BATCH_GATHER_US=20000 GPTOSS_DECODE_BATCH_TRACE=1 timeout 90 $BENCH \
    --decode-batch 64 > "$OUT/bench-batch64-gather20ms.txt" 2>&1
  log "bench 64, gather window 20 ms, traced rc=$?"
  GPTOSS_CUDA_DECODE_BATCH=1 GPTOSS_DECODE_BATCH_GATHER_US=20000 GPTOSS_DECODE_BATCH_TRACE=1 \
    GPTOSS_DECODE_BATCH_GRAPH=0 timeout 60 $B/gptoss-bench --synthetic 20b --concurrency 64 -p 512 -n 256 \
    --decode-batch 64 > "$OUT/bench-batch64-gather20ms-nograph.txt" 2>&1
  log "bench 64, gather window 20 ms, no graphs, traced rc=$?"
fi
log "done"
