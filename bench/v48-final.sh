#!/usr/bin/env bash
# bench/v48-final.sh - the closing H100 call of bench/NOTES.md "v48": a clean build of the whole
# tree (v47's spread kernels removed), `ctest -L gpu`, then issue 12's deep-context rows on the H100
# (tg at 131 072 tokens of context, 20b and 120b).
# Usage (repository root, GPU machine): OUT=... bash bench/v48-final.sh DEPS TOK
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
. tools/device-lib.sh
dev_start "$1" "$2"
rm -rf build-gpu
dev_build build-gpu "$OUT/build.log" || { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build done at $(el)s"
export GPTOSS_SOURCE_DIR=$PWD
dev_ctest_gpu build-gpu "$OUT/ctest.txt"
grep -E "Test +#" "$OUT/ctest.txt" | head -30
echo "== ctest done at $(el)s"
for m in 20b 120b; do
  echo "== $m @131072: $(timeout 150 ./build-gpu/gptoss-bench --synthetic $m --no-gemm-probe -p 0 -n 64 -d 131072 -r 1 2>&1 | grep -E '^\| tg|rror') ($(el)s)"
done
echo "== end at $(el)s"
