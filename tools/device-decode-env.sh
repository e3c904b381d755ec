#!/usr/bin/env bash
# tools/device-decode-env.sh - one GPU call that times environment switches of one build against
# each other on the decode graph (batch-1, issue 12): builds gptoss-bench with tools/device-lib.sh's
# dev_build (unless BENCH names a built one), then for each round and each variant, alternating,
# `gptoss-bench --synthetic MODEL --no-gemm-probe -p 0 -n 128 -d DEPTHS -r 3` and prints the tg
# tok/s per depth. A variant is one argument of space-separated NAME=VALUE pairs; "" is the
# defaults. Raw lines go to $OUT/decode-env.txt. Environment: MODEL (20b), DEPTHS (0,8192),
# ROUNDS (2).
# Usage (repository root, GPU machine): tools/device-decode-env.sh DEPS_DIR TOKENIZER_DIR VARIANT...
set -uo pipefail
OUT="${OUT:-/tmp/device-decode-env-out}"
. tools/device-lib.sh
dev_start "$1" "$2"
shift 2
if [ -z "${BENCH:-}" ]; then
  dev_build build-gpu "$OUT/build.log" gptoss-bench || { dev_build_errors "$OUT/build.log"; exit 1; }
  BENCH=./build-gpu/gptoss-bench
fi
tg() {  # variant -> "DEPTH TOK/S; ..." per depth
  env $1 timeout 200 "$BENCH" --synthetic "${MODEL:-20b}" --no-gemm-probe -p 0 -n 128 -d "${DEPTHS:-0,8192}" -r 3 2>&1 |
    awk -F'|' '/^\| tg/ {gsub(/ /, "", $3); gsub(/ /, "", $4); printf "%s %s; ", $3, $4}'
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in "$@"; do
    echo "== ${MODEL:-20b} [${v:-defaults}] r$r: $(tg "$v")" | tee -a "$OUT/decode-env.txt"
  done
done
