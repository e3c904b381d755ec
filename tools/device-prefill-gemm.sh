#!/usr/bin/env bash
# tools/device-prefill-gemm.sh - the prefill GEMM variant A/B on the GPU machine (bench/NOTES.md
# "v14 prefill GEMM"): builds gptoss-bench, gptoss-synth, test-kernels-gemm and test-kernels
# (Release, sm_90a, -j16); runs test-kernels-gemm once per GPTOSS_SM90_WS_VARIANT in --test;
# then gptoss-bench pp2048 at depth 0 on the synthetic 20b (-r 3) and 120b (-r 2) shapes, the
# variants alternating and the first one again at the end (the baseline twice); test-kernels
# (tiny checkpoint + the 20b-shaped 2-layer model) with each variant in --full; Nsight Compute
# (a few sections) of layer 0's prefill GEMMs with --ncu VARIANT. A variant is V or V:W
# (GPTOSS_SM90_WS_VARIANT=V GPTOSS_SM90_WS_64=W); --full auto = the fastest 20b variant with the
# 64-token choice of the fastest 120b one. Everything lands in $OUT.
# Usage (repository root, GPU machine):
#   tools/device-prefill-gemm.sh --deps DIR/.deps --tokenizer DIR/.tokenizer [--build DIR]
#     [--test "8 9:4"] [--v20 "7 8 9"] [--v120 "7 9 9:4"] [--full "9"|auto] [--ncu 9|auto]
set -uo pipefail
DEPS="" TOK="" TEST="" V20="7" V120="7" FULL="" NCU="" B=build-gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --test) TEST="$2"; shift 2;;
    --v20) V20="$2"; shift 2;;
    --v120) V120="$2"; shift 2;;
    --full) FULL="$2"; shift 2;;
    --ncu) NCU="$2"; shift 2;;
    --build) B="$2"; shift 2;;
    *) echo "device-prefill-gemm: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-prefill-gemm-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
dt() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr -s ' ' | tr '\n' ' '; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
log "GPU: $(cat "$OUT/gpu.txt")"
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu} \
  ${TOK:+-DGPTOSS_TOKENIZER_DIR=$TOK} > "$OUT/build.log" 2>&1 \
  && cmake --build $B -j16 --target gptoss-bench gptoss-synth test-kernels-gemm test-kernels >> "$OUT/build.log" 2>&1
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then tail -60 "$OUT/build.log"; exit 1; fi

# venv V[:W]: runs the rest of the line with the variant's environment.
venv() { local v=$1; shift; GPTOSS_SM90_WS_VARIANT=${v%%:*} GPTOSS_SM90_WS_64=$([ "${v#*:}" != "$v" ] && echo "${v#*:}") "$@"; }
for v in $TEST; do
  venv $v timeout 40 ./$B/test-kernels-gemm > "$OUT/test-kernels-gemm-v$v.log" 2>&1
  log "test-kernels-gemm v$v rc=$? $(dt "$OUT/test-kernels-gemm-v$v.log")"
done

bench() {  # model variant tag
  local f="$OUT/bench-$1-v$2-$3.txt" r=3
  [ "$1" = 120b ] && r=2
  venv $2 timeout 40 ./$B/gptoss-bench --synthetic $1 --no-gemm-probe -p 2048 -n 0 -d 0 -r $r > "$f" 2>&1
  log "bench $1 v$2 ($3) rc=$? $(grep -E '^pp2048' "$f" | tr '\n' ' ')"
}
first20=${V20%% *}
for v in $V20; do bench 20b $v a; done
bench 20b $first20 b
first120=${V120%% *}
for v in $V120; do bench 120b $v a; done
bench 120b $first120 b

# The variant of a model with the highest mean pp2048 tok/s over its runs.
best() { grep -E "bench $1 v" "$OUT/summary.txt" | sed -E 's/.* v([0-9:]+) .*pp2048 @ 0: ([0-9.]+).*/\1 \2/' |
  awk '{s[$1]+=$2; n[$1]++} END {for (k in s) print s[k]/n[k], k}' | sort -rn | head -1 | cut -d' ' -f2; }
if [ "$FULL" = auto ]; then
  b20=$(best 20b); b120=$(best 120b)
  FULL=$b20
  [ "${b120#*:}" != "$b120" ] && FULL="${b20%%:*}:${b120#*:}"
  log "fastest: 20b v$b20, 120b v$b120 -> test-kernels with v$FULL"
fi
if [ -n "$FULL" ]; then
  ./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny > "$OUT/synth-tiny.log" 2>&1
  ./$B/gptoss-synth --preset 20b --layers 2 --seed 3 --out /tmp/m20b2l > "$OUT/synth-20b2l.log" 2>&1
  log "synth rc=$?"
  for v in $FULL; do
    venv $v env GPTOSS_TINY_MODEL=$PWD/$B/models/tiny GPTOSS_20B_2L_MODEL=/tmp/m20b2l timeout 90 \
      ./$B/test-kernels > "$OUT/test-kernels-v$v.log" 2>&1
    log "test-kernels v$v rc=$? $(dt "$OUT/test-kernels-v$v.log")"
  done
fi

[ "$NCU" = auto ] && NCU=${FULL%% *}
if [ -n "$NCU" ]; then
  venv $NCU timeout 60 ncu -k regex:gemm_prefill -c 4 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
    ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 2048 -n 0 -d 0 -r 1 > "$OUT/ncu-v$NCU.txt" 2>&1
  log "ncu v$NCU rc=$?"
fi
log "done in $(( $(date +%s) - t0 )) s"
