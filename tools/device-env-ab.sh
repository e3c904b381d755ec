#!/usr/bin/env bash
# tools/device-env-ab.sh - one GPU call that checks and times environment switches of one build
# against each other (e.g. "" against GPTOSS_DECODE_BATCH_ROUTER_WARPS=16): builds the working tree
# with tools/device-lib.sh's dev_build, runs `ctest -L gpu` (the defaults) and stops on a failure,
# runs test-kernels-batch (whole batched steps: batch invariance, CPU comparison) under each
# non-empty variant, then gptoss-bench on the synthetic 20b, the variants alternating, two rounds:
# 64 streams × 1 024 tokens and 8 × 512 (the decode tok/s column), and the batched step's per-op
# profile at 64 streams (~2 minutes per variant on an H200). A variant is one argument of
# space-separated NAME=VALUE pairs; "" is the defaults. Raw lines go to $OUT/env-ab.txt.
# Usage (repository root, GPU machine): tools/device-env-ab.sh DEPS_DIR TOKENIZER_DIR VARIANT...
set -uo pipefail
OUT="${OUT:-/tmp/device-env-ab-out}"
. tools/device-lib.sh
dev_start "$1" "$2"
shift 2
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
dev_ctest_gpu build-gpu "$OUT/ctest.txt" || exit 1
export GPTOSS_TINY_MODEL="$PWD/build-gpu/models/tiny"
for v in "$@"; do
  [ -n "$v" ] || continue
  echo "== test-kernels-batch with $v: $(env $v timeout 200 ./build-gpu/test-kernels-batch 2>&1 \
      | grep -E '^\[doctest\] (test cases|assertions)' | tr '\n' ' ')"
done
S="--synthetic 20b --no-gemm-probe --decode-batch 64 -p 512"
batch() {  # variant, streams, tokens
  env $1 timeout 240 ./build-gpu/gptoss-bench $S -n "$3" --concurrency "$2" 2>&1 | grep -E '^\| +[0-9]+ \|' \
    | awk -F'|' '{gsub(/ /,""); printf "n=%s decode=%s; ", $2, $6}'
}
profile() {
  env $1 GPTOSS_DECODE_BATCH_PROFILE=1 timeout 240 ./build-gpu/gptoss-bench $S -n 256 --concurrency 64 2>&1 \
    | grep "PROFILE) n=64," | tail -1 | sed 's/.*ms per step: //'
}
for r in 1 2; do
  for v in "$@"; do
    echo "== [${v:-defaults}] r$r: $(batch "$v" 64 1024) $(batch "$v" 8 512) | $(profile "$v")" | tee -a "$OUT/env-ab.txt"
  done
done
