#!/usr/bin/env bash
# bench/v49-breakdown.sh - where the router fold's time goes: tools/device-decode-breakdown.sh (reverse
# order, no ncu) on the 20b with the fold and without it, with carried binaries (CARRY_BIN, as
# bench/v49-fold.sh). Usage (repository root, GPU machine): OUT=... CARRY_BIN=.carry-bin bash bench/v49-breakdown.sh DEPS
set -uo pipefail
export LD_LIBRARY_PATH=$1/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for f in 1 0; do
  mkdir -p "$OUT/fold$f"
  GPTOSS_DECODE_ROUTER_FOLD=$f ORDERS=reverse NCU=0 OUT="$OUT/fold$f" \
    bash tools/device-decode-breakdown.sh "$CARRY_BIN/gptoss-bench" 20b
  echo "== fold $f"; cat "$OUT/fold$f"/breakdown-*.txt
done
