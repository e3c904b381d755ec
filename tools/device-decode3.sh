#!/usr/bin/env bash
# tools/device-decode3.sh - one GPU-machine call for issue 12's decode breakdown and the router
# cluster (helper decode, round 3): kernel tests (the cluster router on), gptoss-bench A/B runs
# with GPTOSS_DECODE_ROUTER_CLUSTER off / on alternating (20b twice each, 120b once each), the
# timing-only probe (GPTOSS_DECODE_PROBE, cuda/decode_probe.h: the step with each op, then every
# op, replaced by an empty kernel), and Nsight Compute over the first decode step of the 20b
# shape (per kernel: duration, DRAM bytes, issue rate, occupancy, the top stall reasons).
# Binaries come prebuilt (sm_90a) in BIN; results land in $OUT.
# Usage (from the repository root on the GPU machine): tools/device-decode3.sh BIN DEPS_LIBDIR
set -uo pipefail
bin=$1
export LD_LIBRARY_PATH=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT="${OUT:-/tmp/device-decode3-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$S"

T="$OUT/tests.txt"
{
  echo "== test-kernels-decode"; timeout 60 "$bin/test-kernels-decode"; echo "rc=$?"
  echo "== test-kernels router_decode (counter and cluster)"
  timeout 60 "$bin/test-kernels" -tc='*router_decode*'; echo "rc=$?"
} > "$T" 2>&1
grep -E "^== |^\[doctest\] (test cases|assertions)|^rc=|ERROR" "$T" | head -40 | tee -a "$S"

B="$OUT/bench.txt"
a20="--synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3"
a120="--synthetic 120b --no-gemm-probe -p 512 -n 64 -d 0 -r 2"
p20="--synthetic 20b --no-gemm-probe -p 0 -n 128 -d 0 -r 3"
run() {  # label, env assignments, bench args
  echo "== $1 [$2]" >> "$B"
  env $2 timeout 60 "$bin/gptoss-bench" $3 >> "$B" 2>&1
  echo "rc=$?" >> "$B"
  grep -E "^== |^\| tg|rc=[1-9]" "$B" | tail -2 | tee -a "$S"
}
run "20b off" "GPTOSS_DECODE_ROUTER_CLUSTER=0" "$a20"
run "20b cluster" "GPTOSS_DECODE_ROUTER_CLUSTER=1" "$a20"
run "20b off" "GPTOSS_DECODE_ROUTER_CLUSTER=0" "$a20"
run "20b cluster" "GPTOSS_DECODE_ROUTER_CLUSTER=1" "$a20"
run "120b off" "GPTOSS_DECODE_ROUTER_CLUSTER=0" "$a120"
run "120b cluster" "GPTOSS_DECODE_ROUTER_CLUSTER=1" "$a120"
# The probe (timing only; router cluster off = main's step).
for op in none qkv attn o router gate_up down combine all; do
  run "20b probe $op" "GPTOSS_DECODE_ROUTER_CLUSTER=0 GPTOSS_DECODE_PROBE=$op" "$p20"
done
run "20b probe all but router (cluster)" "GPTOSS_DECODE_ROUTER_CLUSTER=1 GPTOSS_DECODE_PROBE=none" "$p20"

# Nsight Compute: the 170 decode kernels of the first decode step (embed norm, 24 x 7, lm_head).
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${ncu_bin:-missing}" | tee -a "$S"
if [ -n "$ncu_bin" ]; then
  GPTOSS_DECODE_ROUTER_CLUSTER=0 timeout 240 "$ncu_bin" --clock-control none --csv --page raw \
    -k regex:"gemv_decode|router_decode|attention_decode|residual_rmsnorm" -c 170 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum \
    "$bin/gptoss-bench" --synthetic 20b --no-gemm-probe -p 0 -n 1 -d 0 -r 1 > "$OUT/ncu-20b.csv" 2> "$OUT/ncu-20b.err"
  echo "ncu rc=$?" | tee -a "$S"
  python3 tools/ncu-decode-table.py "$OUT/ncu-20b.csv" | tee "$OUT/ncu-table.txt" | tail -14 | tee -a "$S"
fi

"$bin/gptoss-synth" --preset tiny --seed 1 --out /tmp/tiny > /dev/null 2>&1
{
  echo "== test-kernels (all), GPTOSS_DECODE_ROUTER_CLUSTER=1"
  GPTOSS_DECODE_ROUTER_CLUSTER=1 GPTOSS_TINY_MODEL=/tmp/tiny timeout 150 "$bin/test-kernels"
  echo "rc=$?"
} >> "$T" 2>&1
grep -E "^== test-kernels \(|^\[doctest\] (test cases|assertions)|^rc=" "$T" | tail -4 | tee -a "$S"
