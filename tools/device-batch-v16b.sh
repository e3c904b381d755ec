#!/usr/bin/env bash
# tools/device-batch-v16b.sh - the batched-decode device call of round 4 (issue 13; bench/NOTES.md
# "v16 batched decode", round 4): mode 3 of the persistent MoE (activations staged in shared memory
# once per tile segment, GPTOSS_DECODE_BATCH_MOE_PERSIST=3) tested and benched against main's step
# in one call: builds (sm_90a, -j16, ../build-gbatch) the MoE kernel test, the batched step's and the
# engine's tests and gptoss-bench; runs test-kernels-moe-batch (modes 1-3 == gemm() bit for bit),
# test-kernels-batch and test-batch (GPU, sampling in the step) with mode 3; the per-op profile at
# 64 streams (-n 64) for mode 0 and 3; `gptoss-bench --synthetic 20b --no-gemm-probe --concurrency
# 1,8,64 -p 512 -n 256 --decode-batch 64` with mode 0 / 3 (A/B, a second A/B at the end); ncu (clocks left
# alone) of one MoE launch mid-run at 64 streams in mode 3 and mode 1, where counters can be read.
# V16B_CALL=2 (call 2): mode 3 with 8 weight chunks in flight per warp (GPTOSS_DECODE_BATCH_MOE_DEPTH=8),
# from 32 tokens, tests, A/B at 8 and 64 streams, ncu metrics (stall reasons, bytes) of both depths
# and mode 1. Outputs: summary.txt, tests.txt, benches.txt, profiles.txt, ncu.txt.
# Usage: tools/device-batch-v16b.sh --deps DIR/.deps --tokenizer DIR/.tokenizer
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    *) echo "device-batch-v16b: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-batch-out}"
mkdir -p "$OUT"
B=../build-gbatch
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
log "GPU: $(tail -1 "$OUT/gpu.txt")"
t0=$(date +%s)
dev_build $B "$OUT/build.log" test-kernels-moe-batch test-kernels-batch test-batch gptoss-bench gptoss-synth
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; fi
$B/gptoss-synth --preset tiny --seed 1 --out /tmp/tiny ${TOK:+--tokenizer-dir $TOK} > "$OUT/synth.log" 2>&1
export GPTOSS_TINY_MODEL=/tmp/tiny GPTOSS_SOURCE_DIR=$PWD
summ() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr '\n' ' '; }
T=/tmp/v16logs; mkdir -p $T
test_run() {  # name, env..., -- binary args...
  local name=$1; shift
  env "$@" > "$T/$name.log" 2>&1
  log "$name rc=$? $(summ "$T/$name.log")"
  cat "$T/$name.log" >> "$OUT/tests.txt"
}
if [ "${V16B_CALL:-1}" = 2 ]; then  # call 2: mode 3 with 8 chunks in flight per warp, from 32 tokens
  test_run test-kernels-moe-batch-depth8 GPTOSS_DECODE_BATCH_MOE_DEPTH=8 timeout 60 $B/test-kernels-moe-batch
  grep -q "rc=124" "$OUT/summary.txt" && { log "the MoE kernel test hung: stopping"; exit 1; }
  test_run test-kernels-batch-persist3-depth8 GPTOSS_DECODE_BATCH_MOE_PERSIST=3 GPTOSS_DECODE_BATCH_MOE_DEPTH=8 \
    timeout 90 $B/test-kernels-batch
  test_run test-batch-gpu-persist3-depth8 GPTOSS_DECODE_BATCH_MOE_PERSIST=3 GPTOSS_DECODE_BATCH_MOE_DEPTH=8 \
    GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_DECODE_BATCH_SAMPLE=1 timeout 90 $B/test-batch
  BENCH="$B/gptoss-bench --synthetic 20b --no-gemm-probe --decode-batch 64 -p 512"
  bench() {  # name, args, env...
    local name=$1 args=$2; shift 2
    env "$@" timeout 120 $BENCH $args > "$T/bench-$name.txt" 2>&1
    log "bench $name ($* $args) rc=$? $(grep -E '^\| +(1|8|64) ' "$T/bench-$name.txt" | awk -F'|' '{printf "%s:%s(%s) ", $2, $6, $10}')"
    { echo "### bench $name: env $* args $args"; cat "$T/bench-$name.txt"; } >> "$OUT/benches.txt"
  }
  profile() {  # name, env...
    local name=$1; shift
    env "$@" GPTOSS_DECODE_BATCH_PROFILE=1 timeout 60 $BENCH --concurrency 8,64 -n 64 > "$T/profile-$name.txt" 2>&1
    log "profile 64 $name ($*) rc=$? $(grep -E 'profile.* n=64,' "$T/profile-$name.txt" | cut -c1-600)"
    { echo "### profile $name: env $*"; cat "$T/profile-$name.txt"; } >> "$OUT/profiles.txt"
  }
  C="--concurrency 8,64 -n 256"
  D4="GPTOSS_DECODE_BATCH_MOE_PERSIST=3 GPTOSS_DECODE_BATCH_MOE_MIN=32"
  D8="$D4 GPTOSS_DECODE_BATCH_MOE_DEPTH=8"
  profile p3d8 $D8
  bench base-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  bench p3d8-a "$C" $D8
  bench p3d4-a "$C" $D4
  bench base-b "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
  bench p3d8-b "$C" $D8
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__t_bytes.sum,sm__inst_executed.sum"
  M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  for v in d8 d4 p1; do
    case $v in d8) E="$D8" k=moe_batch_smem_kernel;; d4) E="$D4" k=moe_batch_smem_kernel;;
      p1) E="GPTOSS_DECODE_BATCH_MOE_PERSIST=1" k=moe_batch_kernel;; esac
    env $E timeout 60 $NCU --clock-control none -k regex:$k --launch-skip 3000 --launch-count 2 --metrics "$M" \
      $BENCH --concurrency 64 -n 64 > "$T/ncu-$v.txt" 2>&1
    log "ncu $v rc=$?"
    { echo "### ncu $v ($E)"; grep -E "moe_batch|gpu__|dram__|lts__|l1tex__|sm__|smsp__" "$T/ncu-$v.txt" | grep -vE " 0$| 0\.0+$"; } >> "$OUT/ncu.txt"
  done
  log "done"
  exit 0
fi
test_run test-kernels-moe-batch timeout 60 $B/test-kernels-moe-batch
grep -q "test-kernels-moe-batch rc=124" "$OUT/summary.txt" && { log "the MoE kernel test hung: stopping"; exit 1; }
test_run test-kernels-batch-persist3 GPTOSS_DECODE_BATCH_MOE_PERSIST=3 timeout 90 $B/test-kernels-batch
test_run test-batch-gpu-persist3 GPTOSS_DECODE_BATCH_MOE_PERSIST=3 GPTOSS_TEST_BATCH_DEVICE=0 GPTOSS_DECODE_BATCH_SAMPLE=1 \
  timeout 90 $B/test-batch
BENCH="$B/gptoss-bench --synthetic 20b --no-gemm-probe --decode-batch 64 -p 512"
bench() {  # name, args, env...
  local name=$1 args=$2; shift 2
  env "$@" timeout 120 $BENCH $args > "$T/bench-$name.txt" 2>&1
  log "bench $name ($* $args) rc=$? $(grep -E '^\| +(1|8|64) ' "$T/bench-$name.txt" | awk -F'|' '{printf "%s:%s(%s) ", $2, $6, $10}')"
  { echo "### bench $name: env $* args $args"; cat "$T/bench-$name.txt"; } >> "$OUT/benches.txt"
}
profile() {  # name, env...
  local name=$1; shift
  env "$@" GPTOSS_DECODE_BATCH_PROFILE=1 timeout 60 $BENCH --concurrency 8,64 -n 64 > "$T/profile-$name.txt" 2>&1
  log "profile 64 $name ($*) rc=$? $(grep -E 'profile.* n=64,' "$T/profile-$name.txt" | cut -c1-600)"
  { echo "### profile $name: env $*"; cat "$T/profile-$name.txt"; } >> "$OUT/profiles.txt"
}
C="--concurrency 1,8,64 -n 256"
bench base-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
bench p3-a "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=3
profile base GPTOSS_DECODE_BATCH_MOE_PERSIST=0
profile p3 GPTOSS_DECODE_BATCH_MOE_PERSIST=3
# ncu of one MoE launch mid-run at 64 streams (mode 3, then mode 1 = gemm()'s per-item work), if counters read here.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in 3 1; do
  k=$([ $m = 3 ] && echo moe_batch_smem_kernel || echo moe_batch_kernel)
  GPTOSS_DECODE_BATCH_MOE_PERSIST=$m timeout 100 $NCU --clock-control none -k regex:$k --launch-skip 3000 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats $BENCH --concurrency 64 -n 64 > "$T/ncu-p$m.txt" 2>&1
  log "ncu p$m rc=$? $(grep -cE 'Duration' "$T/ncu-p$m.txt") launches"
  { echo "### ncu mode $m"; grep -v '^\[' "$T/ncu-p$m.txt" | grep -vE '^ *$' | tail -200; } >> "$OUT/ncu.txt"
done
bench base-b "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=0
bench p3-b "$C" GPTOSS_DECODE_BATCH_MOE_PERSIST=3
log "done"
