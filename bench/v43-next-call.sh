#!/usr/bin/env bash
# bench/v43-next-call.sh - the first GPU call prepared for the session after v43 (bench/NOTES.md
# "v43", "Prepared, not run"). Applies, against main at the v43 review mend or later:
#   bench/v43-topk-redux.patch    router top-K by redux.sync (default on; GPTOSS_ROUTER_TOPK_REDUX=0
#                                 for the butterfly; the same bits),
#   bench/v43-qkv-2slab.patch     QKV's GEMV at two slabs per CTA (GPTOSS_DECODE_BF16_SLABS=2; the
#                                 same bits; default off),
#   bench/v43-split-targets.patch the decode split rule's targets as a knob
#                                 (GPTOSS_DECODE_ATTN_TARGETS="LO,HI"; default 17,33 as main) and a
#                                 4-stage tensor-core split (GPTOSS_DECODE_ATTN_STAGES=4; the same bits);
# builds, runs `ctest -L gpu` and the new test cases, then tg128 at depths 0 and 8 192 for the three
# variants (three rounds, alternating), the 120b at 0, and the split targets over five depths (~450 s
# in all). From the repository root on the GPU machine with OUT set, after
# ../shared/device/carry-deps.sh and tools/fetch-tokenizer.sh (carry .deps and .tokenizer):
#   OUT=$OUT bash bench/v43-next-call.sh
set -uo pipefail
for p in topk-redux qkv-2slab split-targets; do git apply "bench/v43-$p.patch" || { echo "== bench/v43-$p.patch does not apply"; exit 1; }; done
. tools/device-lib.sh
E=$PWD/.deps; T=$PWD/.tokenizer
dev_start "$E" "$T"
SECONDS=0
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build ${SECONDS}s"
dev_ctest_gpu build-gpu "$OUT/ctest.txt"
for tc in 'test-kernels:*max-reduction*,*split lengths*,*longer shortest splits*' 'test-kernels-decode:*two slabs*'; do
  bin=${tc%%:*}; filt=${tc#*:}
  timeout 120 "./build-gpu/$bin" -tc="$filt" > "$OUT/$bin-new.txt" 2>&1
  echo "== $bin $filt rc=$? $(grep -E 'test cases|assertions' "$OUT/$bin-new.txt" | tr '\n' ' ')"
  grep -B2 -A12 -m2 'ERROR' "$OUT/$bin-new.txt" | head -40
done
echo "== tests ${SECONDS}s"
BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192 ROUNDS=3 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_ROUTER_TOPK_REDUX=0" "GPTOSS_DECODE_BF16_SLABS=2"
MODEL=120b BENCH=./build-gpu/gptoss-bench DEPTHS=0 ROUNDS=1 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_ROUTER_TOPK_REDUX=0" "GPTOSS_DECODE_BF16_SLABS=2"
BENCH=./build-gpu/gptoss-bench DEPTHS=8192,12288,16384,32768,65536 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_DECODE_ATTN_TARGETS=12,24" "GPTOSS_DECODE_ATTN_TARGETS=24,48" \
  "GPTOSS_DECODE_ATTN_STAGES=4 GPTOSS_DECODE_ATTN_TARGETS=16,33"
echo "== done ${SECONDS}s"
