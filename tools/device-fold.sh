#!/usr/bin/env bash
# tools/device-fold.sh - one GPU-machine call for the folded MoE combine + RMSNorm (issue 12,
# cuda/decode_fold.h): its kernel test and the decode GEMV tests, gptoss-bench A/B runs with
# GPTOSS_DECODE_FOLD_NORM off / 1 / 2 alternating (20b twice each, 120b once each), per-op
# profiles, then test-kernels' whole-backend decode tests with the fold on (tail 2). Binaries come prebuilt
# (sm_90a) in BIN; results land in $OUT.
# Usage (from the repository root on the GPU machine): tools/device-fold.sh BIN DEPS_LIBDIR
set -uo pipefail
bin=$1
export LD_LIBRARY_PATH=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT="${OUT:-/tmp/device-fold-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$S"

T="$OUT/tests.txt"
{
  echo "== test-kernels-fold"; timeout 60 "$bin/test-kernels-fold"; echo "rc=$?"
  echo "== test-kernels-decode"; timeout 60 "$bin/test-kernels-decode"; echo "rc=$?"
} > "$T" 2>&1
grep -E "^== |^\[doctest\] (test cases|assertions)|^rc=|ERROR" "$T" | head -40 | tee -a "$S"

B="$OUT/bench.txt"
a20="--synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3"
a120="--synthetic 120b --no-gemm-probe -p 512 -n 64 -d 0 -r 2"
run() {  # label, env assignments, bench args
  echo "== $1 [$2]" >> "$B"
  env $2 timeout 60 "$bin/gptoss-bench" $3 >> "$B" 2>&1
  echo "rc=$?" >> "$B"
  grep -E "^== |^\| tg|rc=[1-9]" "$B" | tail -2 | tee -a "$S"
}
# GPTOSS_DECODE_FOLD_NORM: 0 off, 1 the shared-memory tail, 2 the tail without shared memory.
run "20b off" "GPTOSS_DECODE_FOLD_NORM=0" "$a20"
run "20b fold 1" "GPTOSS_DECODE_FOLD_NORM=1" "$a20"
run "20b fold 2" "GPTOSS_DECODE_FOLD_NORM=2" "$a20"
run "20b off" "GPTOSS_DECODE_FOLD_NORM=0" "$a20"
run "20b fold 2" "GPTOSS_DECODE_FOLD_NORM=2" "$a20"
run "20b fold 1" "GPTOSS_DECODE_FOLD_NORM=1" "$a20"
run "120b off" "GPTOSS_DECODE_FOLD_NORM=0" "$a120"
run "120b fold 2" "GPTOSS_DECODE_FOLD_NORM=2" "$a120"
run "120b fold 1" "GPTOSS_DECODE_FOLD_NORM=1" "$a120"
run "20b off, per-op profile" "GPTOSS_DECODE_FOLD_NORM=0" "--synthetic 20b --no-gemm-probe -p 16 -n 32 -d 0 -r 1 --profile"
run "20b fold 2, per-op profile" "GPTOSS_DECODE_FOLD_NORM=2" "--synthetic 20b --no-gemm-probe -p 16 -n 32 -d 0 -r 1 --profile"

"$bin/gptoss-synth" --preset tiny --seed 1 --out /tmp/tiny > /dev/null 2>&1
{
  echo "== test-kernels (whole-backend decode tests), GPTOSS_DECODE_FOLD_NORM=2"
  GPTOSS_DECODE_FOLD_NORM=2 GPTOSS_TINY_MODEL=/tmp/tiny timeout 80 "$bin/test-kernels" \
    -tc='*CUDA backend matches*,*reused == fresh*,*decode past 2048*,*greedy sampling on the GPU*,*sliding snapshot*,*gptoss_generate on the GPU*,*transformers goldens*'
  echo "rc=$?"
} >> "$T" 2>&1
grep -E "^== test-kernels \(|^\[doctest\] (test cases|assertions)|^rc=" "$T" | tail -4 | tee -a "$S"
