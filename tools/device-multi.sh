#!/usr/bin/env bash
# tools/device-multi.sh - the several-GPU check on a GPU machine with >= 2 GPUs: builds (sm_90a)
# the multi-GPU test, gptoss-bench and gptoss-synth; runs tests/test-kernels-multi.cu on a small
# checkpoint that splits over two GPUs; then gptoss-bench decode on one GPU and on --devices 0,1
# in the same run, for the synthetic 20b and 120b shapes. Everything lands in $OUT.
# NCCL_NVLS_ENABLE=0 is exported (NVLink multicast must stay off on shared machines).
# Usage: tools/device-multi.sh --deps DIR/.deps --tokenizer DIR/.tokenizer [--bench-args "..."] [--skip-bench]
#        [--nccl-variants]   (also: 120b over 2 GPUs under NCCL_PROTO=LL / LL128 / Simple, 1 channel)
#        [--modes "nccl sym lsa"] (GPTOSS_MULTI_AR values to test and time, cuda/rank_comm.h) [--skip-nocomm]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
DEPS="" TOK="" BENCH_ARGS="-p 512 -n 128 -d 0 -r 3 --no-gemm-probe" BENCH=1 VARIANTS=0 NOCOMM=1 MODES="nccl sym lsa"
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --bench-args) BENCH_ARGS="$2"; shift 2;;
    --skip-bench) BENCH=0; shift;;
    --nccl-variants) VARIANTS=1; shift;;
    --modes) MODES="$2"; shift 2;;
    --skip-nocomm) NOCOMM=0; shift;;
    *) echo "device-multi: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-multi-out}"
mkdir -p "$OUT"
B=build-multi
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
log "GPUs: $(tail -n +2 "$OUT/gpu.txt" | tr '\n' ';')"
# NCCL: the toolkit's, else the system's (libnccl-dev: its header matches /usr/lib's libnccl, which
# the device API needs), else the pip wheel's (nvidia-nccl-*).
NR=""
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -f /usr/include/nccl.h ]; then
  NR=/usr
elif [ ! -f /usr/local/cuda/include/nccl.h ]; then
  NR=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
log "NCCL_ROOT=${NR:-toolkit}"
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu} \
  ${TOK:+-DGPTOSS_TOKENIZER_DIR=$TOK} ${NR:+-DNCCL_ROOT=$NR} > "$OUT/build.log" 2>&1 \
  && cmake --build $B -j16 --target test-kernels-multi gptoss-bench gptoss-synth >> "$OUT/build.log" 2>&1
rc=$?
log "build rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -o 'NCCL ON.*\|several-GPU support OFF.*' "$OUT/build.log")"
if [ $rc -ne 0 ]; then grep -B2 -A12 -m3 "error" "$OUT/build.log" | head -60; exit 1; fi

NI=$(sed -n 's/GPTOSS_NCCL_INCLUDE_DIR:PATH=//p' $B/CMakeCache.txt)
log "nccl.h: $NI ($(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' $NI/nccl.h | awk '{printf "%s.", $3}')); nccl_device.h: $(ls $NI/nccl_device.h 2>/dev/null || echo no); libnccl: $(grep -o 'GPTOSS_NCCL_LIBRARY:FILEPATH=.*' $B/CMakeCache.txt) $(ls /usr/include/nccl*.h /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null | tr '\n' ' ')"
./$B/gptoss-synth --preset tiny --hidden 128 --intermediate 256 --layers 3 --out /tmp/multi3 > /dev/null 2>&1
# the collective modes (cuda/rank_comm.h): the whole test under each; its mode test case compares them bitwise
PASSED=""
for ar in $MODES; do
  dbg=WARN; [ $ar = lsa ] && dbg=INFO  # NCCL's version and transport lines, once
  GPTOSS_MULTI_AR=$ar NCCL_DEBUG=$dbg GPTOSS_MULTI_MODEL=/tmp/multi3 GPTOSS_LOG=info timeout 90 ./$B/test-kernels-multi \
    > "$OUT/test-multi-$ar.log" 2>&1
  rc=$?
  [ $rc -ne 124 ] && PASSED="$PASSED $ar"  # a mode whose test hung is not timed
  log "test-kernels-multi [GPTOSS_MULTI_AR=$ar] rc=$rc $(grep -v 'NCCL INFO' "$OUT/test-multi-$ar.log" | grep -E '^\[doctest\] (test cases|assertions)|worst relative|leading tokens|logits differ|collectives|ERROR|WARN|warn' | sort | uniq -c | tr '\n' ' ')"
done
grep -m8 -E "NCCL INFO (NCCL version|.*via P2P|.*via SHM|.*Connected all|.*[Ss]ymmetric|.*[Ww]indow)" "$OUT/test-multi-lsa.log" | tee -a "$OUT/summary.txt"

[ $BENCH -eq 1 ] || exit 0
tg() { grep -E '^\| (tg|pp)' "$1" | awk -F'|' '{printf "%s %s tok/s; ", $2, $4}'; }
for m in 20b 120b; do
  timeout 150 ./$B/gptoss-bench --synthetic $m $BENCH_ARGS --profile > "$OUT/bench-$m-1gpu.txt" 2>&1
  log "bench $m 1 GPU rc=$? $(tg "$OUT/bench-$m-1gpu.txt")"
  for ar in $PASSED; do
    GPTOSS_MULTI_AR=$ar GPTOSS_LOG=info timeout 150 ./$B/gptoss-bench --synthetic $m --devices 0,1 $BENCH_ARGS --profile \
      > "$OUT/bench-$m-2gpu-$ar.txt" 2>&1
    log "bench $m 2 GPUs [GPTOSS_MULTI_AR=$ar] rc=$? $(tg "$OUT/bench-$m-2gpu-$ar.txt") $(grep -m1 -o 'collectives .*' "$OUT/bench-$m-2gpu-$ar.txt")"
  done
  grep -E "split model: GPU" "$OUT/bench-$m-2gpu-nccl.txt" | tee -a "$OUT/summary.txt"
  if [ $NOCOMM -eq 1 ]; then
    timeout 100 ./$B/gptoss-bench --synthetic $m --devices 0,1 $BENCH_ARGS --no-collectives > "$OUT/bench-nocomm.txt" 2>&1
    log "bench $m 2 GPUs, collectives skipped (timing only) rc=$? $(tg "$OUT/bench-nocomm.txt")"
  fi
done
[ $VARIANTS -eq 1 ] || exit 0
# NCCL's own knobs for small all-reduces (the decode step's 2 per layer); results only, no profile
for v in "NCCL_PROTO=LL" "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=1" "NCCL_PROTO=LL128" "NCCL_PROTO=Simple"; do
  env $v timeout 100 ./$B/gptoss-bench --synthetic 120b --devices 0,1 $BENCH_ARGS > "$OUT/bench-var.txt" 2>&1
  log "bench 120b 2 GPUs [$v] rc=$? $(tg "$OUT/bench-var.txt")"
done
