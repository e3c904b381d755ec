#!/usr/bin/env bash
# tools/device-decode3b.sh - the second GPU-machine call of helper decode's round 3 (issue 12):
# the kernel tests with the new defaults (router cluster, route_early, attention prefetch),
# then gptoss-bench A/B runs alternating main's step (all three off), each alone and all three
# on (20b twice each, 120b and depth 8192 once each), and the probe again with the defaults. Binaries prebuilt (sm_90a) in BIN; results in $OUT.
# GPTOSS_DECODE_ROUTE_EARLY / _ATTN_PREFETCH exist only with bench/v14-decode-route-early-attn-prefetch.patch
# applied (not on main: not yet validated on a GPU; bench/NOTES.md "v14 decode").
# Usage (from the repository root on the GPU machine): tools/device-decode3b.sh BIN DEPS_LIBDIR
set -uo pipefail
bin=$1
export LD_LIBRARY_PATH=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT="${OUT:-/tmp/device-decode3b-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$S"
"$bin/gptoss-synth" --preset tiny --seed 1 --out /tmp/tiny > /dev/null 2>&1
T="$OUT/tests.txt"
{
  echo "== test-kernels-decode"; timeout 60 "$bin/test-kernels-decode"; echo "rc=$?"
  echo "== test-kernels (all, defaults)"; GPTOSS_TINY_MODEL=/tmp/tiny timeout 150 "$bin/test-kernels"; echo "rc=$?"
} > "$T" 2>&1
grep -E "^== |^\[doctest\] (test cases|assertions)|^rc=|ERROR" "$T" | head -40 | tee -a "$S"

B="$OUT/bench.txt"
a20="--synthetic 20b --no-gemm-probe -p 512 -n 128 -d 0 -r 3"
a120="--synthetic 120b --no-gemm-probe -p 512 -n 64 -d 0 -r 2"
run() {  # label, env assignments, bench args
  echo "== $1 [$2]" >> "$B"
  env $2 timeout 60 "$bin/gptoss-bench" $3 >> "$B" 2>&1
  echo "rc=$?" >> "$B"
  grep -E "^== |^\| tg|rc=[1-9]" "$B" | tail -2 | tee -a "$S"
}
v() { echo "GPTOSS_DECODE_ROUTER_CLUSTER=$1 GPTOSS_DECODE_ROUTE_EARLY=$2 GPTOSS_DECODE_ATTN_PREFETCH=$3"; }
main=$(v 0 0 0); all=$(v 1 1 1); clus=$(v 1 0 0); early=$(v 0 1 0); pref=$(v 0 0 1)
run "20b main" "$main" "$a20"
run "20b all three" "$all" "$a20"
run "20b cluster" "$clus" "$a20"
run "20b route_early" "$early" "$a20"
run "20b attn prefetch" "$pref" "$a20"
run "20b main" "$main" "$a20"
run "20b all three" "$all" "$a20"
run "20b attn prefetch" "$pref" "$a20"
run "20b route_early" "$early" "$a20"
run "20b cluster" "$clus" "$a20"
run "120b main" "$main" "$a120"
run "120b all three" "$all" "$a120"
d20="--synthetic 20b --no-gemm-probe -p 0 -n 128 -d 8192 -r 2"
run "20b depth 8192 main" "$main" "$d20"
run "20b depth 8192 all three" "$all" "$d20"
run "20b probe none, defaults" "GPTOSS_DECODE_PROBE=none" "--synthetic 20b --no-gemm-probe -p 0 -n 128 -d 0 -r 3"
for op in attn gate_up router all; do
  run "20b probe $op, defaults" "GPTOSS_DECODE_PROBE=$op" "--synthetic 20b --no-gemm-probe -p 0 -n 128 -d 0 -r 3"
done
