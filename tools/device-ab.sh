#!/usr/bin/env bash
# tools/device-ab.sh - one GPU call that checks a kernel change and times it against a base: builds
# the working tree (new) and BASE_DIR (base: e.g. `git archive REV | tar -x -C BASE_DIR`) in
# parallel with tools/device-lib.sh's dev_build; runs `ctest -L gpu` on new (stops on a failure:
# timing a wrong kernel is no use); then gptoss-bench on the synthetic 20b, base and new
# alternating: two rounds of tg128 at depths 0 and 8 192 and of 64 streams × 1 024 tokens, one of
# issue 13's form at 8 and 64 streams (256 tokens) and of the batched step's per-op profile at 64
# streams (~9 minutes in all on an H200; bench/NOTES.md "v37" planned it for the SASS-only changes
# of that session). Raw lines go to $OUT/ab.txt.
# Usage (repository root, GPU machine): tools/device-ab.sh DEPS_DIR TOKENIZER_DIR BASE_DIR
set -uo pipefail
DEPS="$1" TOK="$2" BASE_DIR="$3"
OUT="${OUT:-/tmp/device-ab-out}"
mkdir -p "$OUT"
. tools/device-lib.sh
export DEPS TOK
echo "== tree $(dev_tree_hash) (tools/device-lib.sh dev_tree_hash), base $(cd "$BASE_DIR" && dev_tree_hash)"
targets=(gptoss-bench gptoss-synth)
(cd "$BASE_DIR" && dev_build build-ab "$OUT/build-base.log" "${targets[@]}") &
dev_build build-gpu "$OUT/build-new.log"; rc=$?; wait
[ $rc -eq 0 ] || { dev_build_errors "$OUT/build-new.log"; exit 1; }
[ -x "$BASE_DIR/build-ab/gptoss-bench" ] || { tail -20 "$OUT/build-base.log"; exit 1; }
echo "== built"
dev_ctest_gpu build-gpu "$OUT/ctest.txt" || exit 1
NEW=./build-gpu/gptoss-bench BASE="$BASE_DIR/build-ab/gptoss-bench"
S="--synthetic 20b --no-gemm-probe"
tg() { timeout 120 "$1" $S -p 0 -n 128 -d 0,8192 -r 3 2>&1 | grep "tg128 @" | tr '\n' ';'; }
batch() {  # bench, streams, tokens
  timeout 240 "$1" $S --decode-batch 64 -p 512 -n "$3" --concurrency "$2" 2>&1 | grep -E '^\| +[0-9]+ \|' \
    | awk -F'|' '{gsub(/ /,""); printf "n=%s agg=%s decode=%s; ", $2, $5, $6}'
}
profile() {
  GPTOSS_DECODE_BATCH_PROFILE=1 timeout 240 "$1" $S --decode-batch 64 -p 512 -n 256 --concurrency 64 2>&1 \
    | grep "PROFILE) n=64," | tail -1
}
for r in 1 2; do
  for v in base new; do
    bin=$BASE; [ $v = new ] && bin=$NEW
    { echo "== $v r$r tg128: $(tg $bin)"
      echo "== $v r$r 64x1024: $(batch $bin 64 1024)"
      if [ $r -eq 1 ]; then
        echo "== $v r$r issue form 8x256 / 64x256: $(batch $bin 8 256) $(batch $bin 64 256)"
        echo "== $v r$r profile: $(profile $bin)"
      fi; } | tee -a "$OUT/ab.txt"
  done
done
