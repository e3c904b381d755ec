#!/usr/bin/env bash
# tools/device-speculate.sh - the device call that decides the batched step's speculative next
# forward (GPTOSS_DECODE_BATCH_SPECULATE, cuda/batch_decode.h; issue 13): test-batch on the GPU
# with in-step sampling from one row (so every step speculates; its "reused after a short batched
# generation" case is the one a wrong K/V-past-the-end handling fails), test-kernels-sample-batch,
# then gptoss-bench at 64 and 8 streams with speculation off and on, alternated, one build.
# Usage: OUT=... tools/device-speculate.sh --deps DIR/.deps --tokenizer DIR/.tokenizer
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    *) echo "device-speculate: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-speculate-out}"
mkdir -p "$OUT"
B=build-speculate
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
t0=$(date +%s)
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-batch test-kernels-sample-batch || { tail -30 "$OUT/build.log"; exit 1; }
log "built in $(( $(date +%s) - t0 )) s"
mkdir -p $B/models
./$B/gptoss-synth --preset tiny --seed 1 --out "$PWD/$B/models/tiny" ${TOK:+--tokenizer-dir "$TOK"} > /dev/null 2>&1
export GPTOSS_TINY_MODEL=$PWD/$B/models/tiny
GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_DECODE_BATCH_SAMPLE=1 GPTOSS_DECODE_BATCH_SPECULATE=1 GPTOSS_DECODE_BATCH_TRACE=1 \
  timeout 120 ./$B/test-batch > "$OUT/test-batch-gpu.log" 2>&1
log "test-batch on the GPU (speculating) rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-batch-gpu.log" | tr '\n' ' ') $(grep -m1 'speculative' "$OUT/test-batch-gpu.log")"
GPTOSS_DECODE_BATCH_SPECULATE=1 timeout 60 ./$B/test-kernels-sample-batch > "$OUT/sample-batch.log" 2>&1
log "test-kernels-sample-batch (speculating) rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/sample-batch.log" | tr '\n' ' ')"
row() { grep -E '^\| +[0-9]+ \|' | awk -F'|' '{gsub(/ /,""); printf "[%s: agg %s dec %s stream %s ttft50 %s batch %s] ", $2, $5, $6, $7, $8, $10}'; }
A="--synthetic 20b --no-gemm-probe --decode-batch 64 -p 512"
for r in 1 2; do
  for sp in 0 1; do
    log "64 streams -n 1024, speculate=$sp, round $r: $(GPTOSS_DECODE_BATCH_SPECULATE=$sp timeout 60 ./$B/gptoss-bench $A -n 1024 --concurrency 64 2>&1 | row)"
    log "8 streams -n 512, speculate=$sp, round $r: $(GPTOSS_DECODE_BATCH_SPECULATE=$sp timeout 60 ./$B/gptoss-bench $A -n 512 --concurrency 8 2>&1 | row)"
  done
done
