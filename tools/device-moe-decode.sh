#!/usr/bin/env bash
# tools/device-moe-decode.sh - one GPU-machine call for the persistent MoE decode kernel (issue
# 12, cuda/moe_decode.cu): its kernel test and the decode GEMV tests, the whole-backend decode
# tests of test-kernels with the kernel switched on, then gptoss-bench A/B runs with
# GPTOSS_DECODE_MOE off and on alternating (20b twice each, 120b once each) plus the variants
# given as extra arguments (each a space-separated list of environment assignments, run on 20b
# with the kernel on). Binaries come prebuilt (sm_90a) in BIN; results land in $OUT.
# Usage (from the repository root on the GPU machine):
#   tools/device-moe-decode.sh BIN DEPS_LIBDIR [VARIANT...]
set -uo pipefail
bin=$1
export LD_LIBRARY_PATH=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
shift 2
OUT="${OUT:-/tmp/device-moe-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$S"

T="$OUT/tests.txt"
{
  echo "== test-kernels-moe-decode"; timeout 120 "$bin/test-kernels-moe-decode"; echo "rc=$?"
  echo "== test-kernels-decode"; timeout 120 "$bin/test-kernels-decode"; echo "rc=$?"
  "$bin/gptoss-synth" --preset tiny --seed 1 --out /tmp/tiny > /dev/null 2>&1
  echo "== test-kernels (whole-backend decode tests), GPTOSS_DECODE_MOE=1"
  GPTOSS_DECODE_MOE=1 GPTOSS_TINY_MODEL=/tmp/tiny timeout 200 "$bin/test-kernels" \
    -tc='*CUDA backend matches*,*reused == fresh*,*decode past 2048*,*greedy sampling on the GPU*,*sliding snapshot*,*gptoss_generate on the GPU*,*transformers goldens*,*grouped MoE*,*router_decode*'
  echo "rc=$?"
} > "$T" 2>&1
grep -E "^== |^\[doctest\] (test cases|assertions)|^rc=" "$T" | tee -a "$S"

B="$OUT/bench.txt"
a20="--synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3"
a120="--synthetic 120b --no-gemm-probe -p 512 -n 64 -d 0 -r 2"
run() {  # label, env assignments ("-" = none), bench args
  echo "== $1 [$2]" >> "$B"
  if [ "$2" = "-" ]; then timeout 150 "$bin/gptoss-bench" $3 >> "$B" 2>&1
  else env $2 timeout 150 "$bin/gptoss-bench" $3 >> "$B" 2>&1; fi
  echo "rc=$?" >> "$B"
}
run "20b off" "GPTOSS_DECODE_MOE=0" "$a20"
run "20b on" "GPTOSS_DECODE_MOE=1" "$a20"
run "20b off" "GPTOSS_DECODE_MOE=0" "$a20"
run "20b on" "GPTOSS_DECODE_MOE=1" "$a20"
for v in "$@"; do run "20b variant" "GPTOSS_DECODE_MOE=1 $v" "$a20"; done
run "120b off" "GPTOSS_DECODE_MOE=0" "$a120"
run "120b on" "GPTOSS_DECODE_MOE=1" "$a120"
run "20b off, per-op profile" "GPTOSS_DECODE_MOE=0" "--synthetic 20b --no-gemm-probe -p 16 -n 32 -d 0 -r 1 --profile"
run "20b on, per-op profile" "GPTOSS_DECODE_MOE=1" "--synthetic 20b --no-gemm-probe -p 16 -n 32 -d 0 -r 1 --profile"
grep -E "^== |^\| tg|rc=[1-9]|rror" "$B" | tee -a "$S"
