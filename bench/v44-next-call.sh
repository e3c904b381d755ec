#!/usr/bin/env bash
# bench/v44-next-call.sh - the first GPU call(s) prepared for the session after v44 (bench/NOTES.md
# "v44", "Prepared"). RAN 2026-12-05 (bench/NOTES.md "v46"; raw lines bench/h200-v46-calls.txt):
# phases tests, gap, ab and lone; the four patches lost (dropped, kept as the record), the pipelined
# loop and batch invariance off measured. Kept as the record of those calls. Applies, in this order, against main at 0049cd5 or later:
#   bench/v44-stages34.patch     3 and 4 K/V sub-blocks in flight per warp in the lone query's
#                                tensor-core split (GPTOSS_DECODE_ATTN_STAGES=3|4; the same bits; its
#                                test: stages 1-4 bit-identical against cpu::attention),
#   bench/v44-attn-timing.patch  the phase stamps (GPTOSS_ATTN_TIMING_POS; inert without it),
#   bench/v44-q-bulk.patch       the split CTA's q rows (and the new key / value) by bulk copies after
#                                the dependency wait instead of plain loads (GPTOSS_DECODE_ATTN_Q_BULK=1;
#                                the same bits; its test: the fused-RoPE case with it on),
#   bench/v44-late-trigger.patch the O projection may launch only after each attention CTA's split
#                                state, not right after its wait, so O's early weight requests do not
#                                queue beside the K/V (GPTOSS_DECODE_ATTN_LATE_TRIGGER=1; the same bits);
# then PHASES (default "tests stamps ab"): tests = full build, `ctest -L gpu` (also v44's 16d1d65, a
# test refactor not yet run on a GPU) and test-kernels' stage and fused-RoPE cases; stamps = the
# phase stamps at 8 192 and 32 768 for the defaults and each switch (does a CTA's split, ~6.3 us at
# 8 192, shrink? does q arrive sooner than 0.9 / 2.4 us? does the QKV grid end later?); ab = tg128 of
# the five at depths 0 / 8 192 / 16 384 / 32 768, two rounds alternating. All three: ~480 s; if a
# call is short, run PHASES="tests stamps" then PHASES=ab (a warm machine keeps build-gpu).
# lone (v45, not in the default; ~90 s): batch invariance on / off (gptoss_model_params.batch_invariant)
# alternating, two rounds, `--concurrency 1,2,8 -p 512 -n 256 --decode-batch 8`: does one stream on
# a batching model reach the decode graph's rate with it off (tg128 @ 0 of the ab phase: 717-726),
# and are 2 / 8 streams unchanged? (test-batch-gpu in the tests phase runs the new exactness case.)
# gap (v45, not in the default; ~120 s): tg128 at depths 0 / 8 192 with --decode-gap, two rounds, and
# the 120b at 0: tg128 (since v46 the pipelined loop) against "tg128 plain" (the old loop) and "tg128
# nosync" (no sampling between steps) in one process each (bench/NOTES.md "v45", "v46").
# pipe (v46, not in the default; ~60 s): the pipelined decode loop (gptoss-decode-pipeline.cpp, the
# default on one GPU) against GPTOSS_DECODE_PIPELINE=0, tg128 at 0 / 8 192 alternating, two rounds;
# then the 120b at depth 0 the same way. (The tests phase runs test-kernels-pipeline: the same tokens
# and logits as the plain loop.) gap now also prints a "tg128 plain" row beside tg128.
# Suggested: PHASES="tests stamps" first, then PHASES="ab pipe lone gap" on the warm machine.
# From the repository root on the GPU machine with OUT set, after ../shared/device/carry-deps.sh and
# tools/fetch-tokenizer.sh (carry .deps and .tokenizer):
#   OUT=$OUT [PHASES="..."] bash bench/v44-next-call.sh
set -uo pipefail
PHASES=${PHASES:-tests stamps ab}
for p in stages34 attn-timing q-bulk late-trigger; do
  git apply "bench/v44-$p.patch" || { echo "== bench/v44-$p.patch does not apply"; exit 1; }
done
. tools/device-lib.sh
E=$PWD/.deps; T=$PWD/.tokenizer
dev_start "$E" "$T"
SECONDS=0
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build ${SECONDS}s"
VARIANTS=("GPTOSS_DECODE_ATTN_STAGES=2" "GPTOSS_DECODE_ATTN_STAGES=3" "GPTOSS_DECODE_ATTN_STAGES=4"
          "GPTOSS_DECODE_ATTN_Q_BULK=1" "GPTOSS_DECODE_ATTN_LATE_TRIGGER=1")
if [[ " $PHASES " == *" tests "* ]]; then
  dev_ctest_gpu build-gpu "$OUT/ctest.txt"
  timeout 150 ./build-gpu/test-kernels -tc='*longer shortest*,*fused RoPE*' > "$OUT/tk.txt" 2>&1
  echo "== test-kernels stages, fused RoPE rc=$? $(grep -E 'test cases|assertions' "$OUT/tk.txt" | tr '\n' ' ')"
  grep -B2 -A12 -m2 'ERROR' "$OUT/tk.txt" | head -40
  # v46: the decode feed kernel (and the pinned, mapped slot it writes) under memcheck.
  GPTOSS_TINY_MODEL=$PWD/build-gpu/models/tiny timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 \
    ./build-gpu/test-kernels-pipeline > "$OUT/memcheck-pipeline.txt" 2>&1
  echo "== memcheck test-kernels-pipeline rc=$? $(grep -E 'ERROR SUMMARY|test cases' "$OUT/memcheck-pipeline.txt" | tr '\n' ' ')"
  echo "== tests ${SECONDS}s"
fi
if [[ " $PHASES " == *" stamps "* ]]; then
  for d in 8192 32768; do
    for v in "${VARIANTS[@]}"; do
      f="$OUT/t$d-$(echo "${v##*_}" | tr 'A-Z=' 'a-z-').txt"
      env $v GPTOSS_ATTN_TIMING_POS=$((d + 64)) GPTOSS_ATTN_TIMING_OUT="$f" timeout 100 \
        ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe -p 0 -n 128 -d $d -r 1 2>&1 | grep '^| tg'
      echo "== $v, depth $d"; python3 bench/v42-attn-timing/summarize.py "$f"
      gzip -f "$f"
    done
  done
  echo "== stamps ${SECONDS}s"
fi
if [[ " $PHASES " == *" ab "* ]]; then
  BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192,16384,32768 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
    "${VARIANTS[@]:1}"
fi
if [[ " $PHASES " == *" lone "* ]]; then
  for r in 1 2; do
    for inv in on off; do
      echo "== lone: batch invariance $inv, round $r"
      timeout 150 ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe --concurrency 1,2,8 -p 512 -n 256 \
        --decode-batch 8 --batch-invariant $inv 2>&1 | grep -E '^\| +[0-9]+ \||max_decode_batch'
    done
  done
  echo "== lone ${SECONDS}s"
fi
if [[ " $PHASES " == *" pipe "* ]]; then
  BENCH=./build-gpu/gptoss-bench DEPTHS=0,8192 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
    "GPTOSS_DECODE_PIPELINE=0"
  MODEL=120b BENCH=./build-gpu/gptoss-bench DEPTHS=0 ROUNDS=2 bash tools/device-decode-env.sh "$E" "$T" "" \
    "GPTOSS_DECODE_PIPELINE=0"
  echo "== pipe ${SECONDS}s"
fi
if [[ " $PHASES " == *" gap "* ]]; then
  # tg128 (the pipelined loop), "tg128 plain" (the old loop) and "tg128 nosync" in one process each.
  for r in 1 2; do
    echo "== gap: 20b, round $r"
    timeout 150 ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe -p 0 -n 128 -d 0,8192 -r 3 --decode-gap \
      2>&1 | tee "$OUT/gap-20b-r$r.txt" | grep -E '^\| tg'
  done
  echo "== gap: 120b"
  timeout 200 ./build-gpu/gptoss-bench --synthetic 120b --no-gemm-probe -p 0 -n 128 -d 0 -r 3 --decode-gap 2>&1 |
    tee "$OUT/gap-120b.txt" | grep -E '^\| tg'
  echo "== gap ${SECONDS}s"
fi
echo "== done ${SECONDS}s"
