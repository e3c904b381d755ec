#!/usr/bin/env bash
# tools/device-l2-prefetch.sh - issue 12's L2 prefetch experiment (bench/v26-decode-l2-prefetch.patch,
# bench/NOTES.md "v26") in one call on an H200 or H100: copies the working tree as it is (base),
# applies the patch to a second copy (new), builds gptoss-bench in both in parallel, then runs
# decode tg128 with GPTOSS_DECODE_L2 = 0..7 on new and base, alternating, two rounds (20b),
# the best mode and 7 at depth 8192 and on 120b, and test-kernels-decode of new (the prefetch
# must leave every bit alone). Bits of GPTOSS_DECODE_L2: 1 = the MoE gate_up GEMV prefetches the
# next layer's QKV weights into L2, 2 = it prefetches its expert's down weights, 4 = the MoE GEMVs
# load their weights L2 evict_first. Results in $OUT (bench-*.txt, test-decode.txt, build logs).
# Usage (repository root, GPU machine; carry .deps and .tokenizer):
#   tools/device-l2-prefetch.sh DEPS_DIR TOKENIZER_DIR
set -uo pipefail
DEPS="$1" TOK="$2"
OUT="${OUT:-/tmp/device-l2-prefetch-out}"
mkdir -p "$OUT" /tmp/l2/base /tmp/l2/new
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for d in base new; do tar -c --exclude='./build*' --exclude='./.deps' --exclude='./.carry-*' . | tar -x -C /tmp/l2/$d; done
( cd /tmp/l2/new && patch -p1 -s < bench/v26-decode-l2-prefetch.patch ) || { echo "the patch does not apply"; exit 1; }
bld() {  # dir log targets...
  local d=$1 log=$2; shift 2
  ( cd "$d" && cmake -S . -B build-d -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu \
      -DGPTOSS_TOKENIZER_DIR=$TOK > "$log" 2>&1 && cmake --build build-d -j16 --target "$@" >> "$log" 2>&1 )
}
t0=$(date +%s)
bld /tmp/l2/base "$OUT/build-base.log" gptoss-bench & bld /tmp/l2/new "$OUT/build-new.log" gptoss-bench; rc=$?; wait
[ $rc -eq 0 ] || { grep -B2 -A10 -m3 error "$OUT/build-new.log" | head -40; exit 1; }
[ -x /tmp/l2/base/build-d/gptoss-bench ] || { tail -20 "$OUT/build-base.log"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
NEW=/tmp/l2/new/build-d/gptoss-bench BASE=/tmp/l2/base/build-d/gptoss-bench
b() { timeout 120 "$@" 2>&1 | grep -E '^\| (tg|pp)' | awk -F'|' '{printf "%s %s; ", $2, $4}'; }
A="--no-gemm-probe -p 0 -n 128 -d 0 -r 3"
for r in 1 2; do
  echo "20b base r$r: $(b $BASE --synthetic 20b $A)"
  for m in 0 1 2 3 4 5 6 7; do echo "20b L2=$m r$r: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 20b $A)"; done
done | tee "$OUT/bench-20b.txt"
best=$(awk '/L2=/ {split($2, a, "="); s[a[2]] += $5} END {m = -1; for (k in s) if (s[k] > m) {m = s[k]; bk = k}; print bk}' \
  "$OUT/bench-20b.txt")
echo "== best mode on 20b: $best"
{
  D="--no-gemm-probe -p 0 -n 128 -d 8192 -r 2"
  echo "20b base @8192: $(b $BASE --synthetic 20b $D)"
  for m in $best 7; do echo "20b L2=$m @8192: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 20b $D)"; done
  C="--no-gemm-probe -p 0 -n 64 -d 0 -r 2"
  echo "120b base: $(b $BASE --synthetic 120b $C)"
  for m in 0 $best 7; do echo "120b L2=$m: $(GPTOSS_DECODE_L2=$m b $NEW --synthetic 120b $C)"; done
} | tee "$OUT/bench-more.txt"
( cd /tmp/l2/new && cmake --build build-d -j16 --target test-kernels-decode > "$OUT/build-tests.log" 2>&1 ) ||
  { tail -20 "$OUT/build-tests.log"; exit 1; }
timeout 120 /tmp/l2/new/build-d/test-kernels-decode > "$OUT/test-decode.txt" 2>&1
echo "== test-kernels-decode (new) rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-decode.txt" | tr '\n' ' ')"
