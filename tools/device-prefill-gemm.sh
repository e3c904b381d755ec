#!/usr/bin/env bash
# tools/device-prefill-gemm.sh - the prefill GEMM variant A/B on the GPU machine (bench/NOTES.md
# "v14 prefill GEMM"): builds gptoss-bench, gptoss-synth, test-kernels-gemm and test-kernels
# (Release, sm_90a, -j16); runs test-kernels-gemm once per GPTOSS_SM90_WS_VARIANT in --test;
# then gptoss-bench pp2048 at depth 0 on the synthetic 20b (-r 3) and 120b (-r 2) shapes, the
# variants alternating and the first one again at the end (the baseline twice); test-kernels
# (tiny checkpoint + the 20b-shaped 2-layer model) with each variant in --full; Nsight Compute
# of layer 0's prefill GEMMs (time, SM active cycles min/avg/max, issue slots) with --ncu "V ...".
# A variant is GPTOSS_SM90_WS_VARIANT's number, then x4 / x8 (GPTOSS_SM90_WS_64), w8
# (GPTOSS_SM90_WS_256=8), p (GPTOSS_SM90_WS_PDL=0), n (GPTOSS_SM90_WS_HINT=0), c3 (GPTOSS_SM90_64C=3),
# t128 (GPTOSS_PREFILL_TILE_MIN=128), e32 / e33 (GPTOSS_PREFILL_TILE_EXTRA=32 / 33): e.g. 9x4,
# 10w8p, 9n, 12c3, 12t128, 12e32. --full auto = the fastest 20b
# variant with the 64-token choice of the fastest 120b one. --profile adds gptoss-bench --profile.
# --smem "8 12": per variant, Nsight Compute of layer 0's four prefill GEMMs of the 20b with the
# shared-memory, pipe and tensor-core counters this ncu knows (picked from --query-metrics; the
# list is written to $OUT/ncu-metrics.txt); the first variant also with the SpeedOfLight /
# ComputeWorkload / MemoryWorkload sections; --smem120 "8": the same counters on the 120b.
# Output: $OUT/summary.txt and one file per kind (bench, tests, ncu), few files in all.
# Usage (repository root, GPU machine):
#   tools/device-prefill-gemm.sh --deps DIR/.deps --tokenizer DIR/.tokenizer [--build DIR]
#     [--test "8 9x4"] [--v20 "7 8 9"] [--v120 "7 9 9x4"] [--full "9"|auto] [--ncu "8 9"|auto] [--profile]
#     [--smem "8 12"] [--smem120 "8"]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" TOK="" TEST="" V20="7" V120="7" FULL="" NCU="" B=build-gpu PROF="" SMEM="" SMEM120=""
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
    --profile) PROF=--profile; shift;;
    --smem) SMEM="$2"; shift 2;;
    --smem120) SMEM120="$2"; shift 2;;
    *) echo "device-prefill-gemm: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-prefill-gemm-out}"
mkdir -p "$OUT"
export GPTOSS_SOURCE_DIR=$PWD
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
dt() { grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr -s ' ' | tr '\n' ' '; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > /tmp/gpu.txt 2>&1
log "GPU: $(cat /tmp/gpu.txt)"
t0=$(date +%s)
dev_build $B "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-gemm test-kernels
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then tail -60 "$OUT/build.log"; exit 1; fi

# venv VARIANT command...: runs the command with the variant's environment.
venv() {
  local v=$1; shift
  local x=$(echo "$v" | sed -nE 's/.*x([48]).*/\1/p') w=$(echo "$v" | sed -nE 's/.*w(8).*/\1/p')
  local p=$(case "$v" in *p*) echo 0;; esac) n=$(case "$v" in *n*) echo 0;; esac) c=$(case "$v" in *c3*) echo 3;; esac) t=$(case "$v" in *t128*) echo 128;; esac)
  local e=$(echo "$v" | sed -nE 's/.*e(3[23]).*/\1/p')
  GPTOSS_SM90_WS_VARIANT=$(echo "$v" | sed -E 's/^([0-9]+).*/\1/') GPTOSS_SM90_WS_64=$x GPTOSS_SM90_WS_256=$w \
    GPTOSS_SM90_WS_PDL=$p GPTOSS_SM90_WS_HINT=$n GPTOSS_SM90_64C=$c GPTOSS_PREFILL_TILE_MIN=$t GPTOSS_PREFILL_TILE_EXTRA=$e "$@"
}
T="$OUT/tests.txt"
for v in $TEST; do
  echo "=== test-kernels-gemm v$v" >> "$T"
  venv $v timeout 40 ./$B/test-kernels-gemm > /tmp/tkg.log 2>&1
  log "test-kernels-gemm v$v rc=$? $(dt /tmp/tkg.log)"
  tail -30 /tmp/tkg.log >> "$T"
done

bench() {  # model variant tag
  local r=3
  [ "$1" = 120b ] && r=2
  echo "=== bench $1 v$2 ($3): gptoss-bench --synthetic $1 --no-gemm-probe -p 2048 -n 0 -d 0 -r $r $PROF" >> "$OUT/bench.txt"
  venv $2 timeout 40 ./$B/gptoss-bench --synthetic $1 --no-gemm-probe -p 2048 -n 0 -d 0 -r $r $PROF > /tmp/bench.txt 2>&1
  log "bench $1 v$2 ($3) rc=$? $(grep -E '^pp2048' /tmp/bench.txt | tr '\n' ' ')"
  cat /tmp/bench.txt >> "$OUT/bench.txt"
}
first20=${V20%% *}
for v in $V20; do bench 20b $v a; done
bench 20b $first20 b
first120=${V120%% *}
for v in $V120; do bench 120b $v a; done
bench 120b $first120 b

# The variant of a model with the highest mean pp2048 tok/s over its runs.
best() { grep -E "bench $1 v" "$OUT/summary.txt" | sed -E 's/.* v([0-9a-z]+) .*pp2048 @ 0: ([0-9.]+).*/\1 \2/' |
  awk '{s[$1]+=$2; n[$1]++} END {for (k in s) print s[k]/n[k], k}' | sort -rn | head -1 | cut -d' ' -f2; }
if [ "$FULL" = auto ]; then
  b20=$(best 20b); b120=$(best 120b)
  FULL=$b20
  x=$(echo "$b120" | sed -nE 's/.*(x[48]).*/\1/p')
  [ -n "$x" ] && FULL="$(echo "$b20" | sed -E 's/x[48]//')$x"
  log "fastest: 20b v$b20, 120b v$b120 -> test-kernels with v$FULL"
fi
if [ -n "$FULL" ]; then
  ./$B/gptoss-synth --preset tiny --seed 1 --out $B/models/tiny > /tmp/synth-tiny.log 2>&1
  ./$B/gptoss-synth --preset 20b --layers 2 --seed 3 --out /tmp/m20b2l > /tmp/synth-20b2l.log 2>&1
  log "synth rc=$?"
  for v in $FULL; do
    echo "=== test-kernels v$v" >> "$T"
    venv $v env GPTOSS_TINY_MODEL=$PWD/$B/models/tiny GPTOSS_20B_2L_MODEL=/tmp/m20b2l timeout 90 \
      ./$B/test-kernels > /tmp/tk.log 2>&1
    log "test-kernels v$v rc=$? $(dt /tmp/tk.log)"
    tail -30 /tmp/tk.log >> "$T"
  done
fi

[ "$NCU" = auto ] && NCU=${FULL%% *}
for v in $NCU; do
  echo "=== ncu v$v" >> "$OUT/ncu.txt"
  venv $v timeout 60 ncu -k regex:gemm_prefill -c 4 --metrics \
gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__inst_issued.avg.per_cycle_active,launch__grid_size,launch__registers_per_thread \
    ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 2048 -n 0 -d 0 -r 1 >> "$OUT/ncu.txt" 2>&1
  log "ncu v$v rc=$?"
done
if [ -n "$SMEM$SMEM120" ]; then
  # Counters this ncu has: Counter -> .sum (cycles_active also as % of peak), Throughput -> % of peak.
  ncu --query-metrics > /tmp/qm.txt 2>&1
  grep -E '^(l1tex__data_pipe_lsu_wavefronts_mem_shared|l1tex__data_bank_conflicts_pipe_lsu_mem_shared|sm__pipe_tensor_op|sm__pipe_shared|smsp__inst_executed_pipe_(lsu|alu|fma|fmaheavy|fmalite|uniform|tensor|xu)|sm__inst_executed_pipe_(lsu|tensor|uniform)|smsp__inst_executed_op_(ldsm|shared)|l1tex__throughput|sm__memory_throughput|l1tex__data_pipe|lts__t_sectors_srcunit_tex|sm__sass_inst_executed_op_shared|sm__sass_data_bytes_mem_shared|smsp__sass_inst_executed_op_shared)' /tmp/qm.txt > "$OUT/ncu-metrics.txt"
  MET=$(awk '$2 == "Counter" { print $1 ".sum"; if ($1 ~ /cycles_active/) print $1 ".avg.pct_of_peak_sustained_active" }
             $2 == "Throughput" { print $1 ".avg.pct_of_peak_sustained_elapsed" }' "$OUT/ncu-metrics.txt" | sort -u | paste -sd,)
  MET="gpu__time_duration.sum,sm__cycles_active.avg,sm__inst_issued.avg.per_cycle_active,launch__grid_size,${MET}"
  first=1
  for v in $SMEM; do
    echo "=== ncu counters 20b v$v" >> "$OUT/ncu.txt"
    venv $v timeout 120 ncu -k regex:gemm_prefill -c 4 --metrics "$MET" \
      ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 2048 -n 0 -d 0 -r 1 >> "$OUT/ncu.txt" 2>&1
    log "ncu counters 20b v$v rc=$?"
    if [ $first = 1 ]; then
      first=0
      echo "=== ncu sections 20b v$v" >> "$OUT/ncu.txt"
      venv $v timeout 120 ncu -k regex:gemm_prefill -s 2 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --print-details all \
        ./$B/gptoss-bench --synthetic 20b --no-gemm-probe -p 2048 -n 0 -d 0 -r 1 >> "$OUT/ncu.txt" 2>&1
      log "ncu sections 20b v$v rc=$?"
    fi
  done
  for v in $SMEM120; do
    echo "=== ncu counters 120b v$v" >> "$OUT/ncu.txt"
    venv $v timeout 150 ncu -k regex:gemm_prefill -c 4 --metrics "$MET" \
      ./$B/gptoss-bench --synthetic 120b --no-gemm-probe -p 2048 -n 0 -d 0 -r 1 >> "$OUT/ncu.txt" 2>&1
    log "ncu counters 120b v$v rc=$?"
  done
fi
log "done in $(( $(date +%s) - t0 )) s"
