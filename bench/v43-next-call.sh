#!/usr/bin/env bash
# bench/v43-next-call.sh - the first GPU call prepared for the session after v43 (bench/NOTES.md
# "v43", "prepared"): applies bench/v43-topk-redux.patch (router top-K by redux.sync, default on,
# GPTOSS_ROUTER_TOPK_REDUX=0 for the butterfly; the same bits) and bench/v43-qkv-2slab.patch (QKV's
# GEMV at two slabs per CTA, GPTOSS_DECODE_BF16_SLABS=2; the same bits; default off), builds, runs
# `ctest -L gpu` and the two new test cases, then tg128 at depths 0 and 8 192 for the three variants,
# alternating, and the 120b at 0. Run from the repository root on the GPU machine with OUT set, after
# ../shared/device/carry-deps.sh and tools/fetch-tokenizer.sh (carry .deps and .tokenizer):
#   OUT=$OUT bash bench/v43-next-call.sh
set -uo pipefail
git apply bench/v43-topk-redux.patch && git apply bench/v43-qkv-2slab.patch || { echo "== patches do not apply"; exit 1; }
. tools/device-lib.sh
E=$PWD/.deps; T=$PWD/.tokenizer
dev_start "$E" "$T"
SECONDS=0
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build ${SECONDS}s"
dev_ctest_gpu build-gpu "$OUT/ctest.txt"
for tc in 'test-kernels:*max-reduction*' 'test-kernels-decode:*two slabs*'; do
  bin=${tc%%:*}; filt=${tc#*:}
  timeout 120 "./build-gpu/$bin" -tc="$filt" > "$OUT/$bin-new.txt" 2>&1
  echo "== $bin $filt rc=$? $(grep -E 'test cases|assertions' "$OUT/$bin-new.txt" | tr '\n' ' ')"
  grep -B2 -A12 -m2 'ERROR' "$OUT/$bin-new.txt" | head -40
done
echo "== tests ${SECONDS}s"
BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192 ROUNDS=3 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_ROUTER_TOPK_REDUX=0" "GPTOSS_DECODE_BF16_SLABS=2"
MODEL=120b BENCH=./build-gpu/gptoss-bench DEPTHS=0 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_ROUTER_TOPK_REDUX=0" "GPTOSS_DECODE_BF16_SLABS=2"
echo "== done ${SECONDS}s"
