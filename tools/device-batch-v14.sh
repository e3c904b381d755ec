#!/usr/bin/env bash
# tools/device-batch-v14.sh - the batched-decode device call of round v14 (issue 13; bench/NOTES.md
# "v14 batched decode"): builds (sm_90a, -j16, ../build-gbatch) the batched sampler's, the batched
# step's and the engine's tests and gptoss-bench, runs the tests on the tiny checkpoint, then
# `gptoss-bench --synthetic 20b --concurrency 1,8,64 -p 512 -n 256 --decode-batch 64` in one call:
#   before  GPTOSS_DECODE_BATCH_SAMPLE=0 GPTOSS_DECODE_BATCH_MOE_NB=1 (v13's step)
#   after   GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_MOE_NB=2 (sampling in the step, expert
#           tiles of 16 pairs)
# and the per-op profile at 64 streams (sampling in the step) for MOE_NB 1 and 2, which also
# splits the gain between the two. Everything lands in $OUT.
# V14_CALL=2 (call 2) instead: the batcher without the O(N²) wake-ups (against
# GPTOSS_DECODE_BATCH_WAKE_ALL=1, twice), sampling in the step with the three-launch sampler, a
# traced and a profiled run at 64 streams.
# Usage: [V14_CALL=2] tools/device-batch-v14.sh --deps DIR/.deps --tokenizer DIR/.tokenizer [--quick]
# --quick: tests and the "after" bench only (call 1).
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK="" QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --quick) QUICK=1; shift;;
    *) echo "device-batch-v14: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-batch-out}"
mkdir -p "$OUT"
B=../build-gbatch
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
log "GPU: $(tail -1 "$OUT/gpu.txt")"
t0=$(date +%s)
dev_build $B "$OUT/build.log" test-kernels-sample-batch test-kernels-batch test-kernels test-batch \
  gptoss-bench gptoss-synth
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; fi
$B/gptoss-synth --preset tiny --seed 1 --out /tmp/tiny ${TOK:+--tokenizer-dir $TOK} > "$OUT/synth.log" 2>&1
export GPTOSS_TINY_MODEL=/tmp/tiny GPTOSS_SOURCE_DIR=$PWD
summ() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr '\n' ' '; }
timeout 90 $B/test-kernels-sample-batch > "$OUT/test-kernels-sample-batch.log" 2>&1
log "test-kernels-sample-batch rc=$? $(summ "$OUT/test-kernels-sample-batch.log")"
timeout 90 $B/test-kernels-batch > "$OUT/test-kernels-batch.log" 2>&1
log "test-kernels-batch (MoE nb 2) rc=$? $(summ "$OUT/test-kernels-batch.log")"
GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_DECODE_BATCH_SAMPLE=1 timeout 90 $B/test-batch > "$OUT/test-batch-gpu.log" 2>&1
log "test-batch on the GPU, sampling in the step rc=$? $(summ "$OUT/test-batch-gpu.log")"
GPTOSS_TEST_QUICK=1 timeout 90 $B/test-kernels -tc='*gemm*,*MXFP4*,*MoE*,*sample*,*sampling*,*argmax*' > "$OUT/test-kernels.log" 2>&1
log "test-kernels (gemm, MoE, sampling cases) rc=$? $(summ "$OUT/test-kernels.log")"
BENCH="$B/gptoss-bench --synthetic 20b --no-gemm-probe --concurrency 1,8,64 -p 512 -n 256 --decode-batch 64"
bench() {  # name, env...
  local name=$1; shift
  env "$@" timeout 100 $BENCH > "$OUT/bench-$name.txt" 2>&1
  log "bench $name ($*) rc=$? $(grep -E '^\| +(1|8|64) ' "$OUT/bench-$name.txt" | awk -F'|' '{printf "%s:%s(%s) ", $2, $6, $10}')"
}
if [ "${V14_CALL:-1}" = 1 ]; then  # call 1: sampling in the step (one CTA per row) and MoE tiles of 16
  bench after GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_MOE_NB=2
  [ $QUICK -eq 1 ] && { log "done"; exit 0; }
  bench before GPTOSS_DECODE_BATCH_SAMPLE=0 GPTOSS_DECODE_BATCH_MOE_NB=1
  for nb in 1 2; do
    GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_MOE_NB=$nb GPTOSS_DECODE_BATCH_PROFILE=1 timeout 60 \
      $B/gptoss-bench --synthetic 20b --no-gemm-probe --concurrency 64 -p 512 -n 64 --decode-batch 64 \
      > "$OUT/profile64-moenb$nb.txt" 2>&1
    log "profile 64 MOE_NB=$nb rc=$? $(grep -E 'profile.* n=64,' "$OUT/profile64-moenb$nb.txt" | cut -c1-400)"
  done
else  # call 2: the batcher's wake-ups, the three-launch sampler, no logits copies for sampled rows
  bench v13wake GPTOSS_DECODE_BATCH_WAKE_ALL=1 GPTOSS_DECODE_BATCH_SAMPLE=0
  bench nowake GPTOSS_DECODE_BATCH_SAMPLE=0
  bench sample GPTOSS_DECODE_BATCH_SAMPLE=1
  bench v13wake-again GPTOSS_DECODE_BATCH_WAKE_ALL=1 GPTOSS_DECODE_BATCH_SAMPLE=0
  GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_TRACE=1 timeout 60 $B/gptoss-bench --synthetic 20b --no-gemm-probe \
    --concurrency 64 -p 512 -n 256 --decode-batch 64 > "$OUT/trace64-sample.txt" 2>&1
  log "trace 64 sample rc=$? $(grep -oE 'n=64: [0-9]+ x [0-9.]+ ms' "$OUT/trace64-sample.txt")"
  GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_PROFILE=1 timeout 60 $B/gptoss-bench --synthetic 20b --no-gemm-probe \
    --concurrency 8,64 -p 512 -n 64 --decode-batch 64 > "$OUT/profile-sample.txt" 2>&1
  log "profile sample rc=$? $(grep -E 'profile.* n=(1|8|64),' "$OUT/profile-sample.txt" | grep -oE 'n=[0-9]+, [0-9]+ steps|batched sample [0-9.]+' | tr '\n' ' ')"
fi
log "done"
