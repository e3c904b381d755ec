#!/usr/bin/env bash
# tools/device-batch-v16.sh - the batched-decode device call of round v16 (issue 13; bench/NOTES.md
# "v16 batched decode"): builds (sm_90a, -j16, ../build-gbatch) the persistent batched MoE's, the
# batched step's, the batched sampler's and the engine's tests and gptoss-bench, runs the tests on
# the tiny checkpoint (test-kernels-batch with the persistent MoE off and on), then in one call:
#   `gptoss-bench --synthetic 20b --no-gemm-probe --concurrency 1,8,64 -p 512 -n 256 --decode-batch 64`
#   with GPTOSS_DECODE_BATCH_MOE_PERSIST=0 / 1 / 0 / 1 (A/B/A/B),
#   the per-op profile at 64 streams (-n 64) for 0, 1 and 1 with 2 or 3 CTAs per SM,
#   64 streams with -n 1024 (steady state vs the ramp) for 0 and 1, and one traced run (1) that
#   times the prompt chunks inside steps.
# V16_CALL=2 (call 2) instead: tests with the bulk-copy MoE (GPTOSS_DECODE_BATCH_MOE_PERSIST=2) and the
# per-layer projections at 1 / 2 column tiles (GPTOSS_DECODE_BATCH_PROJ_NB), their per-op profiles
# at 8 and 64 streams, the bench A/B against PERSIST=0, "new" = the defaults of the tree as it ran
# (PERSIST=2 from 24 tokens, QKV/O/router at nb 2 above 8 tokens; reverted after the call: the
# defaults are main's again, so "new" now equals base), and the -n 1024 runs (plain and traced). Outputs: summary.txt, tests.txt, benches.txt,
# profiles.txt (few files: the device call returns only so many).
# Usage: [V16_CALL=2] tools/device-batch-v16.sh --deps DIR/.deps --tokenizer DIR/.tokenizer
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    *) echo "device-batch-v16: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-batch-out}"
mkdir -p "$OUT"
B=../build-gbatch
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
log "GPU: $(tail -1 "$OUT/gpu.txt")"
t0=$(date +%s)
dev_build $B "$OUT/build.log" test-kernels-moe-batch test-kernels-sample-batch test-kernels-batch \
  test-batch gptoss-bench gptoss-synth
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; fi
$B/gptoss-synth --preset tiny --seed 1 --out /tmp/tiny ${TOK:+--tokenizer-dir $TOK} > "$OUT/synth.log" 2>&1
export GPTOSS_TINY_MODEL=/tmp/tiny GPTOSS_SOURCE_DIR=$PWD
summ() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr '\n' ' '; }
T=/tmp/v16logs; mkdir -p $T
# Call 1 ran before the defaults changed: its runs name PERSIST themselves, and these were its defaults.
[ "${V16_CALL:-1}" = 1 ] && export GPTOSS_DECODE_BATCH_PROJ_NB=0 GPTOSS_DECODE_BATCH_MOE_MIN=1
test_run() {  # name, env..., -- binary args...
  local name=$1; shift
  env "$@" > "$T/$name.log" 2>&1
  log "$name rc=$? $(summ "$T/$name.log")"
  cat "$T/$name.log" >> "$OUT/tests.txt"
}
test_run test-kernels-moe-batch timeout 60 $B/test-kernels-moe-batch
grep -q "test-kernels-moe-batch rc=124" "$OUT/summary.txt" && { log "the MoE kernel test hung: stopping"; exit 1; }
if [ "${V16_CALL:-1}" = 1 ]; then
  test_run test-kernels-batch-persist0 GPTOSS_DECODE_BATCH_MOE_PERSIST=0 timeout 90 $B/test-kernels-batch
  test_run test-kernels-batch-persist1 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 timeout 90 $B/test-kernels-batch
  test_run test-batch-gpu-persist1 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_TEST_BATCH_DEVICE=0 \
    GPTOSS_DECODE_BATCH_SAMPLE=1 timeout 90 $B/test-batch
else
  test_run test-kernels-batch-defaults timeout 90 $B/test-kernels-batch
  test_run test-kernels-batch-persist2-min1-projnb1 GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_MIN=1 \
    GPTOSS_DECODE_BATCH_PROJ_NB=1 timeout 90 $B/test-kernels-batch
  test_run test-kernels-batch-persist1-min3 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_DECODE_BATCH_MOE_MIN=3 \
    timeout 90 $B/test-kernels-batch
  test_run test-batch-gpu-defaults GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_DECODE_BATCH_SAMPLE=1 timeout 90 $B/test-batch
fi
test_run test-kernels-sample-batch timeout 90 $B/test-kernels-sample-batch
BENCH="$B/gptoss-bench --synthetic 20b --no-gemm-probe --decode-batch 64 -p 512"
bench() {  # name, args, env...
  local name=$1 args=$2; shift 2
  env "$@" timeout 120 $BENCH $args > "$T/bench-$name.txt" 2>&1
  log "bench $name ($* $args) rc=$? $(grep -E '^\| +(1|8|64) ' "$T/bench-$name.txt" | awk -F'|' '{printf "%s:%s(%s) ", $2, $6, $10}') $(grep -oE 'n=(62|63|64): [0-9]+ x [0-9.]+ ms' "$T/bench-$name.txt" | tr '\n' ' ')"
  { echo "### bench $name: env $* args $args"; cat "$T/bench-$name.txt"; } >> "$OUT/benches.txt"
}
profile() {  # name, env...
  local name=$1; shift
  env "$@" GPTOSS_DECODE_BATCH_PROFILE=1 timeout 60 $BENCH --concurrency 8,64 -n 64 > "$T/profile-$name.txt" 2>&1
  log "profile 64 $name ($*) rc=$? $(grep -E 'profile.* n=64,' "$T/profile-$name.txt" | cut -c1-600)"
  { echo "### profile $name: env $*"; cat "$T/profile-$name.txt"; } >> "$OUT/profiles.txt"
}
C="--concurrency 1,8,64 -n 256"
if [ "${V16_CALL:-1}" = 1 ]; then
  bench base-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  bench persist-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=1
  bench base-b "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  bench persist-b "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=1
  profile base GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  profile persist GPTOSS_DECODE_BATCH_MOE_PERSIST=1
  profile persist-ctas2 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_DECODE_BATCH_MOE_CTAS=2
  profile persist-ctas3 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_DECODE_BATCH_MOE_CTAS=3
  bench base-n1024 "--concurrency 64 -n 1024" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  bench persist-n1024 "--concurrency 64 -n 1024" GPTOSS_DECODE_BATCH_MOE_PERSIST=1
  bench persist-n1024-trace "--concurrency 64 -n 1024" GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_DECODE_BATCH_TRACE=1
else  # call 2: the bulk-copy MoE (mode 2) and the per-layer projections' column tiles
  V14="GPTOSS_DECODE_BATCH_MOE_PERSIST=0 GPTOSS_DECODE_BATCH_PROJ_NB=0"  # main's step before this round
  profile base $V14
  profile p1 GPTOSS_DECODE_BATCH_MOE_PERSIST=1 GPTOSS_DECODE_BATCH_MOE_MIN=1 GPTOSS_DECODE_BATCH_PROJ_NB=0
  profile p2 GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_MIN=1 GPTOSS_DECODE_BATCH_PROJ_NB=0
  profile p2-proj1 GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_MIN=1 GPTOSS_DECODE_BATCH_PROJ_NB=1
  profile p2-ctas3 GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_CTAS=3
  profile p2-ctas2 GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_CTAS=2
  profile new
  bench base-a "$C" $V14
  bench p2-all-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_MOE_MIN=1 GPTOSS_DECODE_BATCH_PROJ_NB=2
  bench p2-proj1-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=2 GPTOSS_DECODE_BATCH_PROJ_NB=1
  bench p1-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=1
  bench new-a "$C"
  bench base-b "$C" $V14
  bench new-b "$C"
  bench base-n1024 "--concurrency 64 -n 1024" $V14
  bench new-n1024 "--concurrency 64 -n 1024"
  bench new-n1024-trace "--concurrency 64 -n 1024" GPTOSS_DECODE_BATCH_TRACE=1
  grep -E "GPTOSS_DECODE_BATCH_TRACE" "$T/bench-new-n1024-trace.txt" | cut -c1-3000 >> "$OUT/summary.txt"
fi
log "done"
