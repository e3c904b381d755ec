#!/usr/bin/env bash
# bench/v48-final.sh - the closing H100 call of bench/NOTES.md "v48": a clean build of the whole
# tree (v47's spread kernels removed), `ctest -L gpu`, then issue 12's deep-context rows on the H100
# (tg at 131 072 tokens of context, 20b and 120b), and the decode switches tuned on the H200 timed
# on the H100 (tg128 at depth 0, two rounds alternating): a device-dependent default if one wins.
# Usage (repository root, GPU machine): OUT=... [LIGHT=1] bash bench/v48-final.sh DEPS TOK
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
# LIGHT=1: only what the revert touched (a short call): the engine, the whole-backend kernel test and
# the tests of the reverted files.
T=() R=""
[ "${LIGHT:-0}" = 1 ] && T=(gptoss-bench gptoss-synth test-kernels test-kernels-decode test-kernels-moe-batch test-batch) &&
  R='^(test-kernels|test-kernels-decode|test-kernels-moe-batch|test-batch-gpu)$'
dev_clean_check "$R" "${T[@]}"
tg() {  # MODEL DEPTH TOKENS REPEATS [NAME=VALUE...] -> gptoss-bench's tg row (or its error)
  local m=$1 d=$2 n=$3 r=$4
  shift 4
  env "$@" timeout 150 ./build-gpu/gptoss-bench --synthetic "$m" --no-gemm-probe -p 0 -n "$n" -d "$d" -r "$r" 2>&1 |
    grep -E '^\| tg|rror'
}
for r in 1 2; do
  for v in "" GPTOSS_DECODE_ROUTER_WARPS=8 GPTOSS_DECODE_FP4=4,6,1 GPTOSS_DECODE_BF16=16,4,0 GPTOSS_DECODE_ROUTER_CLUSTER=0; do
    [ "$(dev_elapsed)" -lt 540 ] || break 2
    echo "== [${v:-defaults}] r$r: $(tg 20b 0 128 3 $v)"
  done
done
for pr in all all,lm_head; do  # the probe's new lm_head entry: the boundaries measured (59f9c8e)
  echo "== probe $pr: $(tg 20b 0 128 3 GPTOSS_DECODE_PROBE=$pr)"
done
MODELS="20b 120b"; [ "${LIGHT:-0}" = 1 ] && MODELS=20b
for m in $MODELS; do
  echo "== $m @131072: $(tg $m 131072 64 1) ($(dev_elapsed)s)"
done
echo "== end at $(dev_elapsed)s"
