#!/usr/bin/env bash
# tools/device-hostmoe-v18.sh - issue 16's GPU share of the host experts on the GPU machine in one
# call (bench/NOTES.md "v18 host experts: the GPU's share"): build the few targets;
# test-kernels-hostmoe-gpu (the kernels against the CPU reference; again under compute-sanitizer
# memcheck); test-kernels-offload (tiny + the 20b-shaped 2-layer model, offloaded == all-GPU within
# tolerance) with GPTOSS_HOST_MOE_GPU_SLOTS=0, the default and 4 (every expert of a decode token on
# the GPU); test-kernels-hostmoe-stop; one engine run of 120b (24 GB) and 20b (8 GB) with
# GPTOSS_HOST_MOE_TIMING=1 for each slot count in TIMED (default "1 4": the round trip's pieces, and
# the GPU alone); then the engine A/B over SLOTS (default "0 1 2"), ROUNDS rounds (every second one in
# reverse order) while time is left ("default" in TIMED or SLOTS: no GPTOSS_HOST_MOE_GPU_SLOTS). With
# FINAL=1, before the timed runs, issue 16's table: 120b in 24 GB and 20b in 8 GB, pp2048 and tg at
# depths 0 and 32768, the default share (its log line kept).
# Usage (repository root): tools/device-hostmoe-v18.sh DEPS_DIR TOKENIZER_DIR [SECONDS]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="$1" TOK="$2" LIMIT="${3:-480}"
OUT="${OUT:-/tmp/device-hostmoe-v18-out}"
mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s)
L="$OUT/summary.txt"
log() { echo "== $(( $(date +%s) - T0 )) s: $*" | tee -a "$L"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
{ nproc; lscpu | grep -E "Model name|Thread|Core|L3"; nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader;
  git log --oneline -1 2>/dev/null; } > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt" >> "$L"
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-offload test-kernels-hostmoe-stop \
  test-kernels-hostmoe-gpu
rc=$?
log "build rc=$rc"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
summary() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr '\n' ' '; }
timeout 120 ./$B/test-kernels-hostmoe-gpu > "$OUT/test-hostmoe-gpu.txt" 2>&1
log "test-kernels-hostmoe-gpu rc=$? $(summary "$OUT/test-hostmoe-gpu.txt")"
timeout 200 compute-sanitizer --tool memcheck ./$B/test-kernels-hostmoe-gpu > "$OUT/memcheck-hostmoe-gpu.txt" 2>&1
log "memcheck test-kernels-hostmoe-gpu rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-hostmoe-gpu.txt")"
./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny --tokenizer-dir $TOK > /dev/null 2>&1
./$B/gptoss-synth --preset 20b --layers 2 --seed 3 --out /tmp/m20b2l > /dev/null 2>&1
for s in 0 default 4; do
  e="GPTOSS_HOST_MOE_GPU_SLOTS=$s"; [ $s = default ] && e="GPTOSS_HOST_MOE_TIMING=0"
  env $e GPTOSS_TINY_MODEL=$PWD/$B/models/tiny GPTOSS_20B_2L_MODEL=/tmp/m20b2l timeout 150 ./$B/test-kernels-offload \
    > "$OUT/test-offload.txt" 2>&1
  log "test-kernels-offload [$e] rc=$? $(summary "$OUT/test-offload.txt")"
  { echo "===== test-kernels-offload [$e]"; tail -30 "$OUT/test-offload.txt"; } >> "$OUT/tests.txt"
done
rm -f "$OUT/test-offload.txt"
GPTOSS_TINY_MODEL=$PWD/$B/models/tiny timeout 60 ./$B/test-kernels-hostmoe-stop > "$OUT/test-stop.txt" 2>&1
log "test-kernels-hostmoe-stop rc=$? $(summary "$OUT/test-stop.txt")"
run_engine() {  # model, name, environment
  local m=$1 name=$2 e=$3 args
  if [ $m = 20b ]; then args="--gpu-memory 8G -p 512 -n 64 -r 2 -d 0"; else args="--gpu-memory 24G -p 512 -n 32 -r 2 -d 0"; fi
  [ -n "${4:-}" ] && args="$4"
  local f="$OUT/engine-$m-$name.txt"
  env GPTOSS_LOG=info $e timeout 150 ./$B/gptoss-bench --synthetic $m --no-gemm-probe --n-cpu-moe auto $args > "$f" 2>&1
  local rc=$?
  { echo "===== $m $name [$e] ($args) rc=$rc"; cat "$f"; } >> "$OUT/engine-all.txt"
  log "$m $name [$e] rc=$rc $(grep -o 'the GPU computes [0-9]* of.*' "$f" | head -1) $(grep -E '^(tg|pp)[0-9]+ @' "$f" | tr '\n' ' ') $(grep -o 'host streaming read [0-9.]* GB/s' "$f") $(grep -oE '^\| tg[0-9]+ .*' "$f" | awk -F'|' '{print "pct_floor" $7}') $(grep -o 'host-moe timing (.*' "$f" | cut -c1-400) $(grep -o 'host-moe experts pass.*' "$f" | cut -c1-300)"
  rm -f "$f"
}
slot_env() { [ "$1" = default ] && echo "GPTOSS_HOST_MOE_TIMING=${2:-0}" || echo "GPTOSS_HOST_MOE_GPU_SLOTS=$1 GPTOSS_HOST_MOE_TIMING=${2:-0}"; }
if [ "${FINAL:-0}" = 1 ]; then
  run_engine 120b final "$(slot_env default)" "--gpu-memory 24G -p 2048 -n 32 -r 1 -d 0,32768"
  run_engine 20b final "$(slot_env default)" "--gpu-memory 8G -p 2048 -n 64 -r 1 -d 0,32768"
fi
for s in ${TIMED:-1 4}; do
  for m in 120b 20b; do
    [ "$(left)" -gt 30 ] && run_engine $m timed-s$s "$(slot_env $s 1)"
  done
done
SL="${SLOTS:-0 1 2}"
for r in $(seq "${ROUNDS:-2}"); do
  order="$SL"; [ $((r % 2)) -eq 0 ] && order="$(echo $SL | tr ' ' '\n' | tac | tr '\n' ' ')"
  for m in 120b 20b; do
    for s in $order; do
      [ "$(left)" -gt $([ $m = 120b ] && echo 25 || echo 9) ] || continue
      run_engine $m s$s-r$r "$(slot_env $s)"
    done
  done
done
log "done"
