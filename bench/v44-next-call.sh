#!/usr/bin/env bash
# bench/v44-next-call.sh - the first GPU call prepared for the session after v44 (bench/NOTES.md
# "v44", "Prepared"). Applies, against main at 16d1d65 or later:
#   bench/v44-stages34.patch   3 and 4 K/V sub-blocks in flight per warp in the lone query's
#                              tensor-core split (GPTOSS_DECODE_ATTN_STAGES=3|4; the same bits; its
#                              test: stages 1-4 bit-identical against cpu::attention),
#   bench/v44-attn-timing.patch the phase stamps (GPTOSS_ATTN_TIMING_POS; inert without it);
# builds, runs test-kernels' stage case, then the phase stamps at 8 192 for 2 / 3 / 4 stages (does the
# split phase, ~6.3 us per CTA at 2 stages, shrink, and does the QKV grid end later?), then tg128 for
# the three at five depths (two rounds, alternating). ~250 s. From the repository root on the GPU
# machine with OUT set, after ../shared/device/carry-deps.sh and tools/fetch-tokenizer.sh (carry .deps
# and .tokenizer):
#   OUT=$OUT bash bench/v44-next-call.sh
set -uo pipefail
for p in stages34 attn-timing; do git apply "bench/v44-$p.patch" || { echo "== bench/v44-$p.patch does not apply"; exit 1; }; done
. tools/device-lib.sh
E=$PWD/.deps; T=$PWD/.tokenizer
dev_start "$E" "$T"
SECONDS=0
dev_build build-gpu "$OUT/build.log" gptoss-bench test-kernels || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build ${SECONDS}s"
timeout 150 ./build-gpu/test-kernels -tc='*longer shortest*' > "$OUT/tk.txt" 2>&1
echo "== test-kernels stages rc=$? $(grep -E 'test cases|assertions' "$OUT/tk.txt" | tr '\n' ' ')"
grep -B2 -A12 -m2 'ERROR' "$OUT/tk.txt" | head -40
for st in 2 3 4; do
  GPTOSS_DECODE_ATTN_STAGES=$st GPTOSS_ATTN_TIMING_POS=8256 GPTOSS_ATTN_TIMING_OUT="$OUT/t8192-s$st.txt" timeout 100 \
    ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe -p 0 -n 128 -d 8192 -r 1 2>&1 | grep '^| tg'
  echo "== stages $st, depth 8192"; python3 bench/v42-attn-timing/summarize.py "$OUT/t8192-s$st.txt"
  gzip -f "$OUT/t8192-s$st.txt"
done
echo "== timing ${SECONDS}s"
BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192,12288,16384,32768 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_DECODE_ATTN_STAGES=3" "GPTOSS_DECODE_ATTN_STAGES=4"
echo "== done ${SECONDS}s"
