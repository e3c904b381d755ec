#!/usr/bin/env bash
# tools/device-hostmoe-trip.sh - issue 16's host-layer round trip on the GPU machine in one call
# (bench/NOTES.md "v15 host experts: the round trip"): build the few targets; test-kernels-offload
# (tiny checkpoint + the 20b-shaped 2-layer model) under v14's way, the staged callback and the
# defaults; the standalone host experts of one 20b layer if STANDALONE is set; then the engine, 20b in 8 GB and 120b in 24 GB, the variants named in
# VARIANTS_20B / VARIANTS_120B (name=environment, "-" for none) alternated over ROUNDS rounds, and
# each timed variant once with GPTOSS_HOST_MOE_TIMING=1 (where the µs of a host layer go).
# Usage (repository root): tools/device-hostmoe-trip.sh DEPS_DIR TOKENIZER_DIR [SECONDS]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="$1" TOK="$2" LIMIT="${3:-400}"
OUT="${OUT:-/tmp/device-hostmoe-trip-out}"
mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s)
L="$OUT/summary.txt"
log() { echo "== $(( $(date +%s) - T0 )) s: $*" | tee -a "$L"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
{ nproc; lscpu | grep -E "Model name|Thread|Core|L3"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader;
  git log --oneline -1 2>/dev/null; } > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt" >> "$L"
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-offload
rc=$?
log "build rc=$rc"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny --tokenizer-dir $TOK > /dev/null 2>&1
./$B/gptoss-synth --preset 20b --layers 2 --seed 3 --out /tmp/m20b2l > /dev/null 2>&1
for env in "GPTOSS_HOST_MOE_TRIP=callback GPTOSS_HOST_MOE_STAGE=0 GPTOSS_HOST_MOE_BLOCKING=0" \
           "GPTOSS_HOST_MOE_TRIP=callback GPTOSS_HOST_MOE_STAGE=1 GPTOSS_HOST_MOE_BLOCKING=1" \
           "GPTOSS_HOST_MOE_TIMING=0"; do  # the last: the defaults
  tag=$(echo "$env" | tr -cd 'a-z01=_ ' | tr ' =' '_-' | cut -c1-80)
  env $env GPTOSS_TINY_MODEL=$PWD/$B/models/tiny GPTOSS_20B_2L_MODEL=/tmp/m20b2l timeout 120 ./$B/test-kernels-offload \
    > "$OUT/test-offload-$tag.txt" 2>&1
  log "test-kernels-offload [$env] rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-offload-$tag.txt" | tr '\n' ' ')"
  { echo "===== test-kernels-offload [$env]"; tail -30 "$OUT/test-offload-$tag.txt"; } >> "$OUT/tests.txt"
  rm -f "$OUT/test-offload-$tag.txt"
done
if [ -n "${STANDALONE:-}" ]; then
  timeout 40 ./$B/gptoss-bench --host-moe 20b > "$OUT/host-moe-20b.txt" 2>&1
  log "standalone --host-moe 20b rc=$? $(grep -E 'ms' "$OUT/host-moe-20b.txt" | head -3 | tr '\n' ' ')"
fi
run_engine() {  # model, name, environment
  local m=$1 name=$2 e=$3 args
  [ "$e" = "-" ] && e=""
  if [ $m = 20b ]; then args="--gpu-memory 8G -p 512 -n 64 -r 2"; else args="--gpu-memory 24G -p 512 -n 32 -r 2"; fi
  local f="$OUT/engine-$m-$name.txt"
  [ -e "$f" ] && f="$OUT/engine-$m-$name-b.txt"
  env $e timeout 120 ./$B/gptoss-bench --synthetic $m --no-gemm-probe --n-cpu-moe auto $args -d 0 > "$f" 2>&1
  local rc=$?
  { echo "===== $m $name [$e] rc=$rc"; cat "$f"; } >> "$OUT/engine-all.txt"
  log "$m $name [$e] rc=$rc $(grep -E '^tg[0-9]+ @' "$f" | tr '\n' ' ') $(grep -o 'host streaming read [0-9.]* GB/s' "$f") $(grep -o '= [0-9.]* tok/s (% floor' "$f") $(grep -oE '^\| tg[0-9]+ .*' "$f" | awk -F'|' '{print "pct_floor" $7}') $(grep -o 'host-moe timing.*' "$f" | cut -c1-400)"
  rm -f "$f"
}
IFS=';' read -ra V20 <<< "${VARIANTS_20B:-old=GPTOSS_HOST_MOE_TRIP=callback}"
IFS=';' read -ra V120 <<< "${VARIANTS_120B:-old=GPTOSS_HOST_MOE_TRIP=callback}"
IFS=';' read -ra VT <<< "${TIMED:-}"
for v in "${VT[@]}"; do
  [ "$(left)" -gt 60 ] || break
  run_engine 20b "timed-${v%%=*}" "${v#*=} GPTOSS_HOST_MOE_TIMING=1"
done
for r in $(seq "${ROUNDS:-2}"); do
  for v in "${V20[@]}"; do
    [ "$(left)" -gt 40 ] || break
    run_engine 20b "${v%%=*}" "${v#*=}"
  done
  for v in "${V120[@]}"; do
    [ "$(left)" -gt 50 ] || break
    run_engine 120b "${v%%=*}" "${v#*=}"
  done
done
log "done"
