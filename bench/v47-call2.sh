#!/usr/bin/env bash
# (Needs bench/v47-spread-and-parts.patch applied since v48, which removed those kernels from the tree.)
# bench/v47-call2.sh - one H200 call for bench/NOTES.md "v47" (issue 13): the batched MoE's K parts
# (GPTOSS_DECODE_BATCH_MOE_PARTS, moe_spread_batch.cu for steps of <= 8 tokens). Builds, runs the
# parts tests (test-kernels-moe-batch: the two kernels bit for bit; test-batch-gpu-parts: a session's
# tokens alone == batched; memcheck of the spread cases), then alternating, parts off / on:
# (a) a lone stream and 2 / 8 streams on a batching model, batch invariance on (the default):
#     gptoss-bench --synthetic 20b --no-gemm-probe --concurrency 1,2,8 -p 512 -n 256 --decode-batch 8
# (b) 64 streams: --decode-batch 64 -p 512 -n 1024 --concurrency 64 (what parts cost moe_batch_gemm).
# Usage (repository root, GPU machine): OUT=... bash bench/v47-call2.sh DEPS TOK
# Environment: PARTS (4), ROUNDS (2), BUDGET (seconds after which no new bench run starts, 540).
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
dev_build build-gpu "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-moe-batch test-batch ||
  { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build done at $(dev_elapsed)s"
dev_ctest_gpu build-gpu "$OUT/ctest.txt" '^(test-kernels-moe-batch|test-batch-gpu-parts|test-batch-gpu)$'
grep -E "Test +#|spread runs" "$OUT/ctest.txt" | head -12
timeout 150 compute-sanitizer --tool memcheck ./build-gpu/test-kernels-moe-batch -tc='moe_spread*' > "$OUT/memcheck.txt" 2>&1
echo "== memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt" | head -1) ($(dev_elapsed)s)"
conc() {  # env, args -> the bench's concurrency rows
  env $1 timeout 150 ./build-gpu/gptoss-bench --synthetic 20b --no-gemm-probe $2 2>&1 | grep -E "^\| *(conc|[0-9])" | head -8
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in "" "GPTOSS_DECODE_BATCH_MOE_PARTS=${PARTS:-4}"; do
    for args in "--concurrency 1,2,8 -p 512 -n 256 --decode-batch 8" "--decode-batch 64 -p 512 -n 1024 --concurrency 64"; do
      [ "$(dev_elapsed)" -lt "${BUDGET:-540}" ] || { echo "== budget reached at $(dev_elapsed)s"; break 3; }
      echo "== [${v:-parts off}] $args r$r ($(dev_elapsed)s)" | tee -a "$OUT/conc.txt"
      conc "$v" "$args" | tee -a "$OUT/conc.txt"
    done
  done
done
echo "== end at $(dev_elapsed)s"
