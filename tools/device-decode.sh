#!/usr/bin/env bash
# tools/device-decode.sh - decode A/B runs on the GPU machine (issue 12), all in one lease so
# the variants share a device: each VARIANT argument is a space-separated list of environment
# assignments read by cuda/gemm_decode.cu (GPTOSS_DECODE_BF16 / _FP4 / _ROUTE_READY;
# "-" = the defaults), run through `BENCH ARGS` (a gptoss-bench binary and its arguments); the
# tg rows of each run are printed under a "== VARIANT" line.
# Usage: tools/device-decode.sh BENCH "ARGS" VARIANT...
#   e.g. tools/device-decode.sh b/gptoss-bench "--synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3" \
#        "-" "GPTOSS_DECODE_BF16=16,4,1"
set -uo pipefail
bench=$1
args=$2
shift 2
for v in "$@"; do
  echo "== $v"
  if [ "$v" = "-" ]; then
    "$bench" $args 2>&1 | grep -E "^\| tg|error|fail"
  else
    env $v "$bench" $args 2>&1 | grep -E "^\| tg|error|fail"
  fi
done
