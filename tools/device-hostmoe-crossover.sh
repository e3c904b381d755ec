#!/usr/bin/env bash
# tools/device-hostmoe-crossover.sh - issue 16's prefill crossover on the GPU machine
# (bench/NOTES.md "v18 host experts"): a prompt chunk of T tokens runs its host layers' experts
# either on the CPU (cpu::host_moe_experts, chunks of at most GPTOSS_HOST_MOE_STREAM_MIN tokens) or
# by streaming each host layer's experts to the GPU (longer chunks). gptoss-bench pp T (one
# forward of T tokens at depth 0) for 120b in 24 GB and 20b in 8 GB, once with every chunk on the
# CPU (STREAM_MIN=4096) and once with every chunk streamed (STREAM_MIN=1), REPS repetitions.
# Usage (repository root): tools/device-hostmoe-crossover.sh DEPS_DIR TOKENIZER_DIR [BUILD_DIR]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="$1" TOK="$2" B="${3:-build-gpu}"
OUT="${OUT:-/tmp/device-hostmoe-crossover-out}"
mkdir -p "$OUT"
dev_build $B "$OUT/build-crossover.log" gptoss-bench || { tail -30 "$OUT/build-crossover.log"; exit 1; }
SIZES="${SIZES:-2,4,8,16,24,32,48,64,96,128,192,256,384}"
for m in 120b 20b; do
  mem=$([ $m = 120b ] && echo 24G || echo 8G)
  for sm in 4096 1; do
    f="$OUT/crossover-$m-sm$sm.txt"
    GPTOSS_HOST_MOE_STREAM_MIN=$sm timeout 200 ./$B/gptoss-bench --synthetic $m --no-gemm-probe --n-cpu-moe auto \
      --gpu-memory $mem -p $SIZES -n 0 -r ${REPS:-2} -d 0 > "$f" 2>&1
    echo "== $m STREAM_MIN=$sm rc=$? $(grep -E '^pp[0-9]+ @' "$f" | sed 's/ @ 0//' | tr '\n' ' ')"
  done
done
