#!/usr/bin/env bash
# tools/device-multi-ab.sh - a two-GPU A/B in one call on a machine with >= 2 GPUs (bench/NOTES.md
# "v18 batched decode and two GPUs"): builds test-kernels-multi, gptoss-bench and gptoss-synth in the
# working tree (new) and in BASE_DIR (base: e.g. `git archive REV | tar -x -C BASE_DIR`), in
# parallel, against the system NCCL (/usr: libnccl-dev, whose header matches the library the
# device API needs); runs test-kernels-multi (new; stops on failure: a collective that hangs
# would eat the call); then gptoss-bench tg128 on one GPU and on --devices 0,1, base and new
# alternating (two rounds for 20b, one for 120b). NCCL_NVLS_ENABLE=0 (no NVLink multicast).
# Usage (repository root): tools/device-multi-ab.sh DEPS_DIR TOKENIZER_DIR BASE_DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0
DEPS="$1" TOK="$2" BASE_DIR="$3"
OUT="${OUT:-/tmp/device-multi-ab-out}"
mkdir -p "$OUT"
bld() {  # source dir, log
  ( cd "$1" && cmake -S . -B build-multi -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu \
      -DGPTOSS_TOKENIZER_DIR=$TOK -DNCCL_ROOT=/usr > "$2" 2>&1 \
    && cmake --build build-multi -j16 --target test-kernels-multi gptoss-bench gptoss-synth >> "$2" 2>&1 )
}
bld "$BASE_DIR" "$OUT/build-base.log" & bld . "$OUT/build-new.log"; rc=$?; wait
[ $rc -eq 0 ] || { dev_build_errors "$OUT/build-new.log"; exit 1; }
[ -x "$BASE_DIR/build-multi/gptoss-bench" ] || { tail -20 "$OUT/build-base.log"; exit 1; }
echo "== built"
./build-multi/gptoss-synth --preset tiny --hidden 128 --intermediate 256 --layers 3 --out /tmp/multi3 > /dev/null 2>&1
GPTOSS_MULTI_MODEL=/tmp/multi3 timeout 60 ./build-multi/test-kernels-multi > "$OUT/test-multi.txt" 2>&1
trc=$?
echo "== test-kernels-multi rc=$trc $(grep -E '^\[doctest\] (test cases|assertions)|worst relative|differ from|leading tokens' "$OUT/test-multi.txt" | tr '\n' ' ')"
[ $trc -eq 0 ] || { tail -30 "$OUT/test-multi.txt"; exit 1; }
NEW=./build-multi/gptoss-bench BASE="$BASE_DIR/build-multi/gptoss-bench"
A="-p 512 -n 128 -d 0 -r 3 --no-gemm-probe"
b() { timeout 60 "$@" 2>&1 | grep -E '^\| (tg|pp)' | awk -F'|' '{printf "%s %s; ", $2, $4}'; }
echo "== 20b 1 GPU: $(b $NEW --synthetic 20b $A)"
for r in 1 2; do
  echo "== 20b 2 GPUs base r$r: $(b $BASE --synthetic 20b --devices 0,1 $A)"
  echo "== 20b 2 GPUs new  r$r: $(b $NEW --synthetic 20b --devices 0,1 $A)"
done
echo "== 120b 1 GPU: $(b $NEW --synthetic 120b $A)"
echo "== 120b 2 GPUs base: $(b $BASE --synthetic 120b --devices 0,1 $A)"
echo "== 120b 2 GPUs new: $(b $NEW --synthetic 120b --devices 0,1 $A)"
