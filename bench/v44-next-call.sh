#!/usr/bin/env bash
# bench/v44-next-call.sh - the first GPU call prepared for the session after v44 (bench/NOTES.md
# "v44", "Prepared"). Applies, against main at 16d1d65 or later:
#   bench/v44-stages34.patch   3 and 4 K/V sub-blocks in flight per warp in the lone query's
#                              tensor-core split (GPTOSS_DECODE_ATTN_STAGES=3|4; the same bits; its
#                              test: stages 1-4 bit-identical against cpu::attention),
#   bench/v44-attn-timing.patch the phase stamps (GPTOSS_ATTN_TIMING_POS; inert without it),
#   bench/v44-q-bulk.patch     the split CTA's q rows (and the new key / value) by bulk copies after
#                              the dependency wait instead of plain loads queued behind the K/V
#                              requests (GPTOSS_DECODE_ATTN_Q_BULK=1; the same bits; its test: the
#                              fused-RoPE case with it on); applies on top of the two above;
# builds, runs `ctest -L gpu` and test-kernels' stage and fused-RoPE cases, then the phase stamps at 8 192 and 32 768 for
# 2 / 3 / 4 stages and q by bulk copies (does the split phase, ~6.3 us per CTA at 2 stages, shrink;
# does the QKV grid end later; does q arrive sooner than 0.9 / 2.4 us?), then tg128 for the four at
# five depths (two rounds, alternating). ~400 s. From the repository root on the GPU
# machine with OUT set, after ../shared/device/carry-deps.sh and tools/fetch-tokenizer.sh (carry .deps
# and .tokenizer):
#   OUT=$OUT bash bench/v44-next-call.sh
set -uo pipefail
for p in stages34 attn-timing q-bulk; do git apply "bench/v44-$p.patch" || { echo "== bench/v44-$p.patch does not apply"; exit 1; }; done
. tools/device-lib.sh
E=$PWD/.deps; T=$PWD/.tokenizer
dev_start "$E" "$T"
SECONDS=0
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build ${SECONDS}s"
dev_ctest_gpu build-gpu "$OUT/ctest.txt"  # (also v44's 16d1d65: test-kernels-batch's refactored case, not yet run on a GPU)
timeout 150 ./build-gpu/test-kernels -tc='*longer shortest*,*fused RoPE*' > "$OUT/tk.txt" 2>&1
echo "== test-kernels stages, fused RoPE rc=$? $(grep -E 'test cases|assertions' "$OUT/tk.txt" | tr '\n' ' ')"
grep -B2 -A12 -m2 'ERROR' "$OUT/tk.txt" | head -40
for d in 8192 32768; do
  for v in "GPTOSS_DECODE_ATTN_STAGES=2" "GPTOSS_DECODE_ATTN_STAGES=3" "GPTOSS_DECODE_ATTN_STAGES=4" "GPTOSS_DECODE_ATTN_Q_BULK=1"; do
    f="$OUT/t$d-$(echo "${v##*_}" | tr 'A-Z=' 'a-z-').txt"
    env $v GPTOSS_ATTN_TIMING_POS=$((d + 64)) GPTOSS_ATTN_TIMING_OUT="$f" timeout 100 \
      ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe -p 0 -n 128 -d $d -r 1 2>&1 | grep '^| tg'
    echo "== $v, depth $d"; python3 bench/v42-attn-timing/summarize.py "$f"
    gzip -f "$f"
  done
done
echo "== timing ${SECONDS}s"
BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192,12288,16384,32768 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
  "GPTOSS_DECODE_ATTN_STAGES=3" "GPTOSS_DECODE_ATTN_STAGES=4" "GPTOSS_DECODE_ATTN_Q_BULK=1"
echo "== done ${SECONDS}s"
