#!/usr/bin/env bash
# bench/v48-h100.sh - issue 12's accounting on an H100 (bench/NOTES.md "v48"): clean build,
# tools/device-decode-breakdown.sh for the 20b (both orders + Nsight Compute) and the 120b
# (reverse order), the 120b tg128 at depth 8 192, and Nsight Compute of one 20b decode step with
# the spread GEMVs on (GPTOSS_DECODE_SPREAD=24,4,1), to see gemv_spread alone beside gemm_decode
# (that last part needs bench/v47-spread-and-parts.patch applied since the kernel's removal).
# Usage (repository root, GPU machine): OUT=... bash bench/v48-h100.sh DEPS TOK
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
nvidia-smi --query-gpu=name,clocks.max.memory --format=csv,noheader
dev_build build-gpu "$OUT/build.log" gptoss-bench gptoss-synth || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build done at $(dev_elapsed)s"
B=./build-gpu/gptoss-bench
echo "== 120b @8192: $(timeout 150 $B --synthetic 120b --no-gemm-probe -p 0 -n 128 -d 8192 -r 3 2>&1 | grep -E '^\| tg') ($(dev_elapsed)s)"
OUT=$OUT/bd20 tools/device-decode-breakdown.sh $B 20b 2>&1 | tail -40
echo "== 20b breakdown done at $(dev_elapsed)s"
OUT=$OUT/bd120 ORDERS=reverse NCU=0 tools/device-decode-breakdown.sh $B 120b 2>&1 | tail -12
echo "== 120b breakdown done at $(dev_elapsed)s"
GPTOSS_DECODE_SPREAD=24,4,1 timeout 200 ncu --clock-control none --csv --page raw \
  -k regex:"gemv_decode|gemv_spread" -c 120 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum \
  $B --synthetic 20b --no-gemm-probe -p 0 -n 1 -r 1 > "$OUT/ncu-spread.csv" 2> "$OUT/ncu-spread.err"
python3 tools/ncu-decode-table.py "$OUT/ncu-spread.csv" | tee "$OUT/ncu-spread.txt" | tail -20
echo "== end at $(dev_elapsed)s"
