#!/usr/bin/env bash
# tools/device-decode-breakdown.sh - issue 12's accounting of a decode step on the GPU machine,
# with a built gptoss-bench (BENCH) of the working tree: (1) the timing-only probe
# (GPTOSS_DECODE_PROBE, cuda/decode_probe.h) cumulatively, ops emptied in pipeline order (qkv;
# qkv,attn; ... all seven; then the lm_head too), so the differences between consecutive steps
# add up exactly to step(nothing emptied) - step(all emptied), the part of the step the layers' ops take beyond
# their launch boundaries; then in reverse order (combine first), which attributes the overlap
# between neighbours the other way; (2) Nsight Compute over one decode step of the 20b shape
# (each kernel alone: duration, DRAM bytes, issue rate, occupancy, top stalls; tools/ncu-decode-
# table.py). Results in $OUT/breakdown-*.txt; the summary lines on stdout.
# DEPTH (default 0): the context the decode step runs at (gptoss-bench -d), for both parts.
# Usage (repository root, GPU machine): [ORDERS="forward reverse"] [NCU=1] [DEPTH=0] tools/device-decode-breakdown.sh BENCH [20b|120b ...]
set -uo pipefail
bench=$1
shift
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(20b)
OUT="${OUT:-/tmp/device-decode-breakdown-out}"
mkdir -p "$OUT"
ops=(qkv attn o router gate_up down combine)
tg() {  # model probe-list -> "tok/s"
  local n=128 r=3
  [ "$1" = 120b ] && n=64 && r=2
  env GPTOSS_DECODE_PROBE="$2" timeout 120 "$bench" --synthetic "$1" --no-gemm-probe -p 0 -n $n -d "${DEPTH:-0}" -r $r 2>&1 |
    awk -F'|' '/^\| tg/ {gsub(/ /, "", $4); print $4}'
}
row() {  # model probe-list -> "ORDER LIST TOK/S STEP-US" ($order from the loop below)
  local t
  t=$(tg "$1" "$2")
  echo "$order $2 $t $(awk -v t="$t" 'BEGIN{printf "%.1f", 1e6/t}')"
}
for m in "${models[@]}"; do
  f="$OUT/breakdown-$m${DEPTH:+-d$DEPTH}.txt"
  {
    echo "# $m at depth ${DEPTH:-0}: decode step us (from tg tok/s) with the listed ops emptied"
    for order in ${ORDERS:-forward reverse}; do
      list=""
      seq=("${ops[@]}")
      [ $order = reverse ] && seq=(combine down gate_up router o attn qkv)
      row "$m" none
      for op in "${seq[@]}"; do
        list="${list:+$list,}$op"
        row "$m" "$list"
      done
      # The lm_head emptied too: step(all) - this is the lm_head's cost, and this is the 7 x layers
      # launch boundaries + the embedding + sampling, measured instead of estimated.
      row "$m" "$list,lm_head"
    done
  } > "$f"
  echo "== $m"; cat "$f"
done
[ "${NCU:-1}" = 1 ] || exit 0
timeout 240 ncu --clock-control none --csv --page raw \
  -k regex:"gemv_decode|gemv_spread|router_decode|attention_decode|residual_rmsnorm" -c 170 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum \
  "$bench" --synthetic 20b --no-gemm-probe -p 0 -n 1 -d "${DEPTH:-0}" -r 1 > "$OUT/breakdown-ncu-20b.csv" 2> "$OUT/breakdown-ncu-20b.err"
echo "ncu rc=$?"
python3 "$(dirname "$0")/ncu-decode-table.py" "$OUT/breakdown-ncu-20b.csv" | tee "$OUT/breakdown-ncu-20b.txt"
