#!/usr/bin/env bash
# tools/device-decode-v26.sh - issue 12's two prepared experiments (bench/NOTES.md "v26") in one
# call on an H200 or H100: copies the working tree as it is (base) and again with
# bench/v26-decode-l2-prefetch.patch and bench/v26-decode-attn-split.patch applied (new), builds
# gptoss-bench in both in parallel, then
#  (1) decode tg128 at depth 0 with GPTOSS_DECODE_L2 = 0..7 on new and base, alternating, two
#      rounds (20b); the best mode and 7 at depth 8192 and on 120b. Bits: 1 = the MoE gate_up GEMV
#      prefetches the next layer's QKV weights into L2 before its dependency wait, 2 = it
#      prefetches its expert's down weights, 4 = the MoE GEMVs load their weights L2 evict_first;
#  (2) decode at depths 2048 / 8192 / 32768 with GPTOSS_DECODE_ATTN_SPLIT = 128 (main's) / 256 /
#      512 / 1024 (the shortest decode attention split in keys), two rounds; 128 and the best at
#      130000;
#  (3) the new tree's tests of both: test-kernels-decode, and test-kernels' decode attention cases.
# Results in $OUT (bench-*.txt, test-*.txt, build logs); summary lines on stdout. The whole run
# takes ~20 minutes, so it goes in parts, one device call each (the trees and builds stay in
# build-v26/, kept between calls on a warm machine; a part builds what it lacks):
# PARTS="build l2" (~9 min), "split" (~6 min), "tests" (~5 min); default all three.
# Usage (repository root, GPU machine; carry .deps and .tokenizer):
#   [PARTS=...] tools/device-decode-v26.sh DEPS_DIR TOKENIZER_DIR
set -uo pipefail
DEPS="$1" TOK="$2"
OUT="${OUT:-/tmp/device-decode-v26-out}"
V=$PWD/build-v26
PARTS="${PARTS:-build l2 split tests}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -d $V/new ]; then
  mkdir -p $V/base $V/new
  for d in base new; do tar -c --exclude='./build*' --exclude='./.deps' --exclude='./.carry-*' . | tar -x -C $V/$d; done
  for p in bench/v26-decode-l2-prefetch.patch bench/v26-decode-attn-split.patch; do
    ( cd $V/new && patch -p1 -s < "$p" ) || { echo "$p does not apply"; rm -rf $V; exit 1; }
  done
fi
bld() {  # dir log targets...
  local d=$1 log=$2; shift 2
  ( cd "$d" && cmake -S . -B build-d -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu \
      -DGPTOSS_TOKENIZER_DIR=$TOK > "$log" 2>&1 && cmake --build build-d -j16 --target "$@" >> "$log" 2>&1 )
}
if [ ! -x $V/new/build-d/gptoss-bench ] || [ ! -x $V/base/build-d/gptoss-bench ]; then
  t0=$(date +%s)
  bld $V/base "$OUT/build-base.log" gptoss-bench & bld $V/new "$OUT/build-new.log" gptoss-bench; rc=$?; wait
  [ $rc -eq 0 ] || { grep -B2 -A10 -m3 error "$OUT/build-new.log" | head -40; exit 1; }
  [ -x $V/base/build-d/gptoss-bench ] || { tail -20 "$OUT/build-base.log"; exit 1; }
  echo "== built in $(( $(date +%s) - t0 )) s"
fi
NEW=$V/new/build-d/gptoss-bench BASE=$V/base/build-d/gptoss-bench
b() { timeout 150 "$@" 2>&1 | grep -E '^\| (tg|pp)' | awk -F'|' '{gsub(/ /, ""); printf "%s@%s %s; ", $2, $3, $4}'; }
part() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
if part l2; then
A="--no-gemm-probe -p 0 -n 128 -d 0 -r 3"
for r in 1 2; do
  echo "20b base r$r: $(b $BASE --synthetic 20b $A)"
  for m in 0 1 2 3 4 5 6 7; do echo "20b L2=$m r$r: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 20b $A)"; done
done | tee "$OUT/bench-l2-20b.txt"
best=$(awk '/L2=/ {split($2, a, "="); s[a[2]] += $5} END {m = -1; for (k in s) if (s[k] > m) {m = s[k]; bk = k}; print bk}' \
  "$OUT/bench-l2-20b.txt")
echo "== best L2 mode on 20b: $best"
{
  D="--no-gemm-probe -p 0 -n 128 -d 8192 -r 2"
  echo "20b base @8192: $(b $BASE --synthetic 20b $D)"
  for m in $best 7; do echo "20b L2=$m @8192: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 20b $D)"; done
  C="--no-gemm-probe -p 0 -n 64 -d 0 -r 2"
  echo "120b base: $(b $BASE --synthetic 120b $C)"
  for m in 0 $best 7; do echo "120b L2=$m: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 120b $C)"; done
} | tee "$OUT/bench-l2-more.txt"
fi
if part split; then
S="--no-gemm-probe -p 0 -n 64 -d 2048,8192,32768 -r 2"
for r in 1 2; do
  echo "20b base split r$r: $(b $BASE --synthetic 20b $S)"
  for k in 128 256 512 1024; do echo "20b split=$k r$r: $(GPTOSS_DECODE_ATTN_SPLIT=$k b $NEW --synthetic 20b $S)"; done
done | tee "$OUT/bench-split-20b.txt"
sbest=$(awk '/split=/ {split($2, a, "="); for (i = 4; i <= NF; i += 2) s[a[2]] += $(i + 1)} END {m = -1; for (k in s) if (s[k] > m) {m = s[k]; bk = k}; print bk}' \
  "$OUT/bench-split-20b.txt")
echo "== best split on 20b (sum over depths): $sbest"
{
  L="--no-gemm-probe -p 0 -n 32 -d 130000 -r 1"
  for k in 128 $sbest; do echo "20b split=$k @130000: $(GPTOSS_DECODE_ATTN_SPLIT=$k b $NEW --synthetic 20b $L)"; done
  echo "120b split=128 @8192: $(GPTOSS_DECODE_ATTN_SPLIT=128 b $NEW --synthetic 120b --no-gemm-probe -p 0 -n 64 -d 8192 -r 2)"
  echo "120b split=$sbest @8192: $(GPTOSS_DECODE_ATTN_SPLIT=$sbest b $NEW --synthetic 120b --no-gemm-probe -p 0 -n 64 -d 8192 -r 2)"
} | tee "$OUT/bench-split-more.txt"
fi
part tests || exit 0
( cd $V/new && cmake --build build-d -j16 --target test-kernels-decode test-kernels > "$OUT/build-tests.log" 2>&1 ) ||
  { tail -20 "$OUT/build-tests.log"; exit 1; }
timeout 120 $V/new/build-d/test-kernels-decode > "$OUT/test-decode.txt" 2>&1
echo "== test-kernels-decode (new) rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-decode.txt" | tr '\n' ' ')"
timeout 300 $V/new/build-d/test-kernels -tc='*decode attention*' > "$OUT/test-attn.txt" 2>&1
echo "== test-kernels decode attention (new) rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-attn.txt" | tr '\n' ' ')"
