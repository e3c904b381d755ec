#!/usr/bin/env bash
# (Needs bench/v47-spread-and-parts.patch applied since v48, which removed those kernels from the tree.)
# bench/v47-call.sh - one H200 call for bench/NOTES.md "v47" (issue 12): builds, runs the spread
# GEMV's tests (test-kernels-decode, test-kernels-spread; memcheck and racecheck of the former's
# spread cases) and times the routed MXFP4 decode GEMVs in
# gemv_spread.cu's form against the defaults, by environment, alternating, inside one call.
# Usage (repository root, GPU machine): OUT=... PHASES="tests ab" bash bench/v47-call.sh DEPS TOK [VARIANT...]
# A variant is one argument of space-separated NAME=VALUE pairs ("" = the defaults). Environment:
# DEPTHS (0), ROUNDS (2), BUDGET (seconds after which no new bench run starts, 540).
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
shift 2
PHASES="${PHASES:-tests ab}"
dev_build build-gpu "$OUT/build.log" gptoss-bench gptoss-synth test-kernels-decode test-kernels ||
  { dev_build_errors "$OUT/build.log"; exit 1; }
echo "== build done at $(dev_elapsed)s"
if [[ " $PHASES " == *" tests "* ]]; then
  dev_ctest_gpu build-gpu "$OUT/ctest.txt" '^test-kernels-(decode|spread)$'
  grep -E "Test +#|assertions|test cases" "$OUT/ctest.txt" | head -12
  for tool in memcheck racecheck; do  # issue 12: every new kernel clean under both
    GPTOSS_TEST_SPREAD_QUICK=1 timeout 120 compute-sanitizer --tool $tool ./build-gpu/test-kernels-decode -tc='decode spread*' \
        > "$OUT/$tool.txt" 2>&1
    echo "== $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.txt" | head -1)"
  done
  echo "== tests done at $(dev_elapsed)s"
fi
tg() {  # variant -> "DEPTH TOK/S; ..."
  env $1 timeout 120 ./build-gpu/gptoss-bench --synthetic "${MODEL:-20b}" --no-gemm-probe -p 0 -n 128 \
      -d "${DEPTHS:-0}" -r 3 2>&1 | awk -F'|' '/^\| tg/ {gsub(/ /, "", $3); gsub(/ /, "", $4); printf "%s %s; ", $3, $4}'
}
if [[ " $PHASES " == *" ab "* ]]; then
  [ $# -gt 0 ] || set -- ""
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "$@"; do
      [ "$(dev_elapsed)" -lt "${BUDGET:-540}" ] || { echo "== budget reached at $(dev_elapsed)s"; break 2; }
      echo "== ${MODEL:-20b} [${v:-defaults}] r$r: $(tg "$v") ($(dev_elapsed)s)" | tee -a "$OUT/ab.txt"
    done
  done
fi
echo "== end at $(dev_elapsed)s"
