#!/usr/bin/env bash
# tools/device-router16.sh - one GPU call for the batched step's router at 16 warps
# (GPTOSS_DECODE_BATCH_ROUTER_WARPS=16, cuda/batch_decode.cu router_warps; bench/NOTES.md "v38"
# Next): builds the tree, runs `ctest -L gpu` (the default, 4 warps) and stops on a failure, then
# test-kernels' router cases (router_batch at 16 warps against router_decode, token by token) and
# test-kernels-batch (batch invariance of whole steps) with the switch on, then gptoss-bench on the
# synthetic 20b with the switch off and on, alternating: 64 streams × 1 024 tokens, 8 × 512 and
# the per-op profile at 64 streams (~5 minutes on an H200). Raw lines go to $OUT/router16.txt.
# Usage (repository root, GPU machine): tools/device-router16.sh DEPS_DIR TOKENIZER_DIR
set -uo pipefail
DEPS="$1" TOK="$2"
OUT="${OUT:-/tmp/device-router16-out}"
mkdir -p "$OUT"
. tools/device-lib.sh
export DEPS TOK
echo "== tree $(dev_tree_hash)"
dev_build build-gpu "$OUT/build.log" || { grep -B2 -A10 -m3 error "$OUT/build.log" | head -40; exit 1; }
./build-gpu/gptoss-synth --preset tiny --seed 1 --out "$PWD/build-gpu/models/tiny" --tokenizer-dir "$TOK" > /dev/null 2>&1
export GPTOSS_TINY_MODEL="$PWD/build-gpu/models/tiny"
timeout 240 ctest --test-dir build-gpu -L gpu --output-on-failure -j2 > "$OUT/ctest.txt" 2>&1
trc=$?
echo "== ctest -L gpu rc=$trc: $(grep -E 'tests passed|tests failed' "$OUT/ctest.txt")"
[ $trc -eq 0 ] || { grep -B5 -A30 -m2 -E 'FAILED|ERROR' "$OUT/ctest.txt" | head -80; exit 1; }
echo "== router cases: $(timeout 120 ./build-gpu/test-kernels -tc='router*' 2>&1 | grep -E '^\[doctest\] (test cases|assertions)' | tr '\n' ' ')"
echo "== test-kernels-batch at 16: $(GPTOSS_DECODE_BATCH_ROUTER_WARPS=16 timeout 200 ./build-gpu/test-kernels-batch 2>&1 \
    | grep -E '^\[doctest\] (test cases|assertions)' | tr '\n' ' ')"
S="--synthetic 20b --no-gemm-probe"
batch() {  # warps, streams, tokens
  GPTOSS_DECODE_BATCH_ROUTER_WARPS=$1 timeout 240 ./build-gpu/gptoss-bench $S --decode-batch 64 -p 512 -n "$3" \
      --concurrency "$2" 2>&1 | grep -E '^\| +[0-9]+ \|' | awk -F'|' '{gsub(/ /,""); printf "n=%s decode=%s; ", $2, $6}'
}
profile() {
  GPTOSS_DECODE_BATCH_ROUTER_WARPS=$1 GPTOSS_DECODE_BATCH_PROFILE=1 timeout 240 ./build-gpu/gptoss-bench $S \
      --decode-batch 64 -p 512 -n 256 --concurrency 64 2>&1 | grep "PROFILE) n=64," | tail -1 \
      | grep -o -E 'rmsnorm \+ router \+ route [0-9.]*'
}
for r in 1 2; do
  for w in 4 16; do
    echo "== warps $w r$r: $(batch $w 64 1024) $(batch $w 8 512) | $(profile $w)" | tee -a "$OUT/router16.txt"
  done
done
