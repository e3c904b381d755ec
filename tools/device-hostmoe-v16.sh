#!/usr/bin/env bash
# tools/device-hostmoe-v16.sh - issue 16's host experts pass on the GPU machine in one call
# (bench/NOTES.md "v16 host experts"): build the few targets; the CPU tests natively
# (test-host-experts, -q8); test-kernels-offload (tiny + the 20b-shaped 2-layer model) under the
# OLD_ENV (default: the defaults) and NEW_ENV (or the sweep's winner), test-kernels-hostmoe-stop; without NEW_ENV
# the standalone sweep `gptoss-bench --host-moe-sweep 120b` (its last lines name the better
# tuning's environment: that becomes "new"); one engine run of 120b with GPTOSS_HOST_MOE_TIMING=1
# under TIMED_ENV (else OLD_ENV: the round trip and the experts pass's pieces); then the engine
# A/B, OLD_ENV (default: the defaults) vs NEW, 120b in 24 GB then 20b in 8 GB, over ROUNDS rounds
# (the second in reverse order) while time is left, then EXTRA_ENV (if set) once each.
# Usage (repository root): tools/device-hostmoe-v16.sh DEPS_DIR TOKENIZER_DIR [SECONDS]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="$1" TOK="$2" LIMIT="${3:-400}"
OUT="${OUT:-/tmp/device-hostmoe-v16-out}"
mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s)
L="$OUT/summary.txt"
log() { echo "== $(( $(date +%s) - T0 )) s: $*" | tee -a "$L"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
{ nproc; lscpu | grep -E "Model name|Thread|Core|L3"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader;
  git log --oneline -1 2>/dev/null; } > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt" >> "$L"
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-offload test-kernels-hostmoe-stop \
  test-host-experts test-host-experts-q8
rc=$?
log "build rc=$rc"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
for t in test-host-experts test-host-experts-q8; do
  timeout 60 ./$B/$t > "$OUT/$t.txt" 2>&1
  log "$t rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$t.txt" | tr '\n' ' ') $(grep -o 'host-moe experts pass.*' "$OUT/$t.txt" | cut -c1-120)"
done
./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny --tokenizer-dir $TOK > /dev/null 2>&1
if [ -z "${NEW_ENV:-}" ]; then
  timeout 60 ./$B/gptoss-bench --host-moe-sweep 120b > "$OUT/sweep-120b.txt" 2>&1
  log "sweep rc=$? $(grep -E '^sweep: best' "$OUT/sweep-120b.txt")"
fi
NEW="${NEW_ENV:-$(grep -oE 'engine env: .*' "$OUT/sweep-120b.txt" | sed 's/engine env: //')}"
[ -n "$NEW" ] || NEW="GPTOSS_HOST_MOE_TIMING=0"
log "new = [$NEW]"
./$B/gptoss-synth --preset 20b --layers 2 --seed 3 --out /tmp/m20b2l > /dev/null 2>&1
OLD="${OLD_ENV:-GPTOSS_HOST_MOE_TIMING=0}"
for env in "$OLD" "$NEW"; do
  env $env GPTOSS_TINY_MODEL=$PWD/$B/models/tiny GPTOSS_20B_2L_MODEL=/tmp/m20b2l timeout 120 ./$B/test-kernels-offload \
    > "$OUT/test-offload.txt" 2>&1
  log "test-kernels-offload [$env] rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-offload.txt" | tr '\n' ' ')"
  { echo "===== test-kernels-offload [$env]"; tail -30 "$OUT/test-offload.txt"; } >> "$OUT/tests.txt"
done
rm -f "$OUT/test-offload.txt"
GPTOSS_TINY_MODEL=$PWD/$B/models/tiny timeout 60 ./$B/test-kernels-hostmoe-stop -s > "$OUT/test-stop.txt" 2>&1
log "test-kernels-hostmoe-stop rc=$? $(grep -E 'freed in|^\[doctest\] (test cases|assertions)' "$OUT/test-stop.txt" | tr '\n' ' ' | cut -c1-400)"
run_engine() {  # model, name, environment
  local m=$1 name=$2 e=$3 args
  if [ $m = 20b ]; then args="--gpu-memory 8G -p 512 -n 64 -r 2"; else args="--gpu-memory 24G -p 512 -n 32 -r 2"; fi
  local f="$OUT/engine-$m-$name.txt"
  env $e timeout 120 ./$B/gptoss-bench --synthetic $m --no-gemm-probe --n-cpu-moe auto $args -d 0 > "$f" 2>&1
  local rc=$?
  { echo "===== $m $name [$e] rc=$rc"; cat "$f"; } >> "$OUT/engine-all.txt"
  log "$m $name [$e] rc=$rc $(grep -E '^tg[0-9]+ @' "$f" | tr '\n' ' ') $(grep -o 'host streaming read [0-9.]* GB/s' "$f") $(grep -o '= [0-9.]* tok/s (% floor' "$f") $(grep -oE '^\| tg[0-9]+ .*' "$f" | awk -F'|' '{print "pct_floor" $7}') $(grep -o 'host-moe timing (.*' "$f" | cut -c1-400) $(grep -o 'host-moe experts pass.*' "$f")"
  rm -f "$f"
}
run_engine 120b timed "${TIMED_ENV:-$OLD} GPTOSS_HOST_MOE_TIMING=1"
# old and new over ROUNDS rounds (the second in reverse order), then EXTRA_ENV's once if time is left.
for r in $(seq "${ROUNDS:-2}"); do
  order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
  for m in 120b 20b; do
    need=$([ $m = 120b ] && echo 42 || echo 13)  # the pair's seconds
    [ "$(left)" -gt $need ] || continue
    for v in $order; do
      if [ $v = old ]; then run_engine $m old-r$r "$OLD"; else run_engine $m new-r$r "$NEW"; fi
    done
  done
done
if [ -n "${EXTRA_ENV:-}" ]; then
  [ "$(left)" -gt 21 ] && run_engine 120b extra "$EXTRA_ENV"
  [ "$(left)" -gt 7 ] && run_engine 20b extra "$EXTRA_ENV"
fi
log "done"
