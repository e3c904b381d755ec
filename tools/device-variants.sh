#!/usr/bin/env bash
# tools/device-variants.sh - tuning runs on the GPU machine: one Release build per decode
# ring-depth variant of cuda/gemm.cu (GPTOSS_DECODE_DEPTH_FP4 / _BF16), then gptoss-bench's
# tg128 on the synthetic 20b shape for each (and Nsight Compute per-kernel times with --ncu).
# Usage (repository root, GPU machine): tools/device-variants.sh [--ncu] "FP4 BF16" ...
set -uo pipefail
NCU=0
[ "${1:-}" = "--ncu" ] && { NCU=1; shift; }
OUT="${OUT:-/tmp/device-variants-out}"
mkdir -p "$OUT"
bash ../shared/device/carry-deps.sh >/dev/null 2>&1
for v in "$@"; do
  set -- $v; B=build-v$1-$2
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_PREFIX_PATH=$PWD/.deps/usr -DCMAKE_BUILD_RPATH=$PWD/.deps/usr/lib/x86_64-linux-gnu \
    "-DCMAKE_CUDA_FLAGS=-DGPTOSS_DECODE_DEPTH_FP4=$1 -DGPTOSS_DECODE_DEPTH_BF16=$2" > /dev/null 2>&1 \
    && cmake --build $B -j16 --target gptoss-bench > /dev/null 2>&1 || { echo "build $v failed"; continue; }
  echo "== fp4 depth $1, bf16 depth $2"
  ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3 2>&1 | grep -E "^\| tg"
  [ $NCU -eq 1 ] && timeout 120 ncu --clock-control none --csv --page raw --print-units base \
    -k regex:"gemm|router|attention|residual" --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 16 -n 2 -d 0 -r 1 > "$OUT/ncu-$1-$2.csv" 2>/dev/null
done
