#!/usr/bin/env bash
# tools/device-hostmoe.sh - issue 16's host experts on the GPU machine in one call (bench/NOTES.md
# "v14 host experts"): build the few targets, the host-expert tests natively (AVX-512 VNNI) and
# test-kernels-offload on the tiny checkpoint, the standalone sweep (gptoss-bench
# --host-moe-sweep 120b: splits, prefetch, page size, pool sizes against the read floor), then
# the engine, 120b with a 24 GB GPU budget: v13's settings (everything of v14 switched off by its
# environment variables) against v14's (the sweep's best split), and the latter with 15 threads
# if time is left. Usage (repository root): tools/device-hostmoe.sh DEPS_DIR TOKENIZER_DIR [SECONDS]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="$1" TOK="$2" LIMIT="${3:-130}"
OUT="${OUT:-/tmp/device-hostmoe-out}"
mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/summary.txt"; }
{ nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node|L3"; grep -o -E "avx512_vnni|avx512bw" /proc/cpuinfo | sort -u;
  echo "THP enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)";
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } > "$OUT/host.txt" 2>&1
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-host-experts test-host-experts-q8 \
  test-kernels-offload
rc=$?
log "build rc=$rc"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny > /dev/null 2>&1
# (with the new split switched on: its one-pass wait runs inside the decode graph's host callback)
GPTOSS_HOST_MOE_RANGES=1 GPTOSS_HOST_MOE_PREFETCH=2048 GPTOSS_HOST_MOE_ONE_PASS=1 GPTOSS_TINY_MODEL=$PWD/$B/models/tiny \
  timeout 60 ./$B/test-kernels-offload > "$OUT/test-kernels-offload.txt" 2>&1
log "test-kernels-offload rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-kernels-offload.txt" | tr '\n' ' ')"
for t in test-host-experts test-host-experts-q8; do
  timeout 60 ./$B/$t > "$OUT/$t.txt" 2>&1
  log "$t rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$t.txt" | tr '\n' ' ')"
done
timeout 60 ./$B/gptoss-bench --host-moe-sweep 120b > "$OUT/sweep.txt" 2>&1
log "sweep rc=$? $(grep 'best' "$OUT/sweep.txt")"
BEST=$(grep -o 'GPTOSS_HOST_MOE_RANGES=[0-9]* GPTOSS_HOST_MOE_PREFETCH=[0-9]* GPTOSS_HOST_MOE_ONE_PASS=[0-9]' "$OUT/sweep.txt" | head -1)
[ -n "$BEST" ] || BEST="GPTOSS_HOST_MOE_RANGES=1 GPTOSS_HOST_MOE_PREFETCH=2048 GPTOSS_HOST_MOE_ONE_PASS=1"
ENGINE="./$B/gptoss-bench --synthetic 120b --no-gemm-probe --n-cpu-moe auto --gpu-memory 24G -p 512 -n 64 -d 0 -r 1"
V13="GPTOSS_HOST_MOE_RANGES=0 GPTOSS_HOST_MOE_PREFETCH=0 GPTOSS_HOST_MOE_ONE_PASS=0 GPTOSS_HOST_HUGEPAGE=0 GPTOSS_HOST_MOE_OVERLAP=0"
run_engine() {  # name, environment
  env $2 timeout 90 $ENGINE > "$OUT/engine-$1.txt" 2>&1
  log "engine $1 ($2) rc=$? $(grep -E '^(pp|tg)[0-9]+ @' "$OUT/engine-$1.txt" | tr '\n' ' ') $(grep -o 'host streaming read [0-9.]* GB/s' "$OUT/engine-$1.txt") $(grep -o '= [0-9.]* tok/s (% floor' "$OUT/engine-$1.txt")"
}
run_engine v13 "$V13"
run_engine v14 "$BEST GPTOSS_HOST_HUGEPAGE=1 GPTOSS_HOST_MOE_OVERLAP=1"
if [ $(( $(date +%s) - T0 )) -lt $(( LIMIT - 35 )) ]; then
  run_engine v14-15threads "$BEST GPTOSS_HOST_HUGEPAGE=1 GPTOSS_HOST_MOE_OVERLAP=1 GPTOSS_THREADS=15"
fi
log "done"
