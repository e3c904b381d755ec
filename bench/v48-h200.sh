#!/usr/bin/env bash
# bench/v48-h200.sh - an H200 call for bench/NOTES.md "v48": (1) v47's spread GEMVs (removed from
# the tree; bench/v47-spread-and-parts.patch applied for this part only) against the defaults on the
# GPU they were designed from, tg128 at depth 0, two rounds alternating; (2) the tree as it is: a
# clean build of everything and `ctest -L gpu`.
# Usage (repository root, GPU machine): OUT=... bash bench/v48-h200.sh DEPS TOK
set -uo pipefail
. tools/device-lib.sh
DEV_T0=$(date +%s)  # the clock covers the spread part too
nvidia-smi --query-gpu=name --format=csv,noheader
git apply bench/v47-spread-and-parts.patch || exit 1
OUT=$OUT/spread BUDGET=200 PHASES=ab bash bench/v47-call.sh "$1" "$2" "" "GPTOSS_DECODE_SPREAD=24,4,1 GPTOSS_DECODE_SPREAD_DOWN=0" \
  "GPTOSS_DECODE_SPREAD=24,4,1" "GPTOSS_DECODE_SPREAD=12,4,2" | grep "=="
git apply -R bench/v47-spread-and-parts.patch || exit 1
echo "== spread part done at $(dev_elapsed)s"
dev_clean_start "$1" "$2"
dev_clean_check
echo "== tg128: $(timeout 60 ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe -p 0 -n 128 -d 0,8192 -r 3 2>&1 | grep -E '^\| tg' | tr '\n' ' ')"
echo "== end at $(dev_elapsed)s"
