#!/usr/bin/env bash
# bench/v49-fold.sh - issue 12's router fold (cuda/router_fold.cuh) on the GPU: a clean build of
# what it touches, its kernel test and the decode GEMV / whole-backend kernel tests, then tg128 with
# the fold on (its CTAs' arrival by fences, then by acquire-release atomics: _ACQREL=1) and off
# (GPTOSS_DECODE_ROUTER_FOLD=0: router_decode's launch), 20b at
# depths 0 and 8 192 in two rounds alternating, the 120b at depth 0, then compute-sanitizer memcheck
# and racecheck of the fold's test while the call has time left.
# Usage (repository root, GPU machine): OUT=... [CARRY_BIN=.carry-bin] [LIMIT=560] bash bench/v49-fold.sh DEPS TOK
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
L=${LIMIT:-560}  # the call's limit in seconds: the phases below stop in time for it
# CARRY_BIN=DIR: gptoss-bench, test-kernels-fold and test-kernels-decode built on the build machine
# from this tree (sm_90a, Release; carried to save the call's build) when they run here; else a build.
B=build-gpu
if [ -n "${CARRY_BIN:-}" ] && LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu "$CARRY_BIN/gptoss-bench" --help > /dev/null 2>&1; then
  B=$CARRY_BIN
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "== carried binaries ($B)"
  for t in test-kernels-fold test-kernels-decode; do [ -x "$B/$t" ] || continue
    GPTOSS_DECODE_ROUTER_FOLD=1 timeout 120 "$B/$t" > "$OUT/$t.txt" 2>&1
    echo "== $t rc=$? $(grep -E 'test cases|assertions' "$OUT/$t.txt" | tr '\n' ' ')"
  done
  # The engine's tests with the fold (test-kernels: the backend against the CPU backend, the
  # transformers goldens) need the tiny model and a build: built here in the background, niced, while
  # the benches run (the A/B rounds alternate, so both variants share its load), run after the 20b rows.
  (nice -n 19 bash -c '. tools/device-lib.sh; DEPS='"$DEPS"' TOK='"$TOK"' dev_build build-gpu "'"$OUT"'/build.log" gptoss-synth test-kernels' \
    && echo ok > "$OUT/build.done" || echo failed > "$OUT/build.done") &
else
  T=(gptoss-bench gptoss-synth test-kernels test-kernels-decode test-kernels-fold)
  dev_build build-gpu "$OUT/build.log" "${T[@]}" || { dev_build_errors "$OUT/build.log"; exit 1; }
  echo "== build done at $(dev_elapsed)s"
  export GPTOSS_SOURCE_DIR=$PWD
  GPTOSS_DECODE_ROUTER_FOLD=1 dev_ctest_gpu build-gpu "$OUT/ctest.txt" '^(test-kernels|test-kernels-decode|test-kernels-fold)$'
  grep -E "Test +#" "$OUT/ctest.txt" | head -10
fi
grep -B3 -A25 -m3 -E "ERROR|FAILED" "$OUT"/test-kernels-*.txt 2>/dev/null | head -60
echo "== tests done at $(dev_elapsed)s"
tg() {  # MODEL DEPTHS TOKENS REPEATS [NAME=VALUE...] -> gptoss-bench's tg rows (or its error)
  local m=$1 d=$2 n=$3 r=$4
  shift 4
  env "$@" timeout 150 "$B/gptoss-bench" --synthetic "$m" --no-gemm-probe -p 0 -n "$n" -d "$d" -r "$r" 2>&1 |
    grep -E '^\| tg|rror' | tr '\n' ' '
}
V=("GPTOSS_DECODE_ROUTER_FOLD=1" "GPTOSS_DECODE_ROUTER_FOLD=1 GPTOSS_DECODE_ROUTER_FOLD_ACQREL=1" "GPTOSS_DECODE_ROUTER_FOLD=0")
for r in 1 2; do
  for v in "${V[@]}"; do
    [ "$(dev_elapsed)" -lt $((L - 100)) ] || break 2
    echo "== 20b [$v] r$r: $(tg 20b 0,8192 128 3 $v) ($(dev_elapsed)s)"
  done
done
if [ "$B" != build-gpu ]; then
  while [ ! -f "$OUT/build.done" ] && [ "$(dev_elapsed)" -lt $((L - 140)) ]; do sleep 5; done
  echo "== background build: $(cat "$OUT/build.done" 2>/dev/null || echo 'not done') at $(dev_elapsed)s"
  if [ "$(cat "$OUT/build.done" 2>/dev/null)" = ok ]; then
    GPTOSS_SOURCE_DIR=$PWD GPTOSS_DECODE_ROUTER_FOLD=1 dev_ctest_gpu build-gpu "$OUT/ctest.txt" '^test-kernels$'
  else
    dev_build_errors "$OUT/build.log"
  fi
  echo "== ctest done at $(dev_elapsed)s"
fi
for v in "${V[@]}"; do
  [ "$(dev_elapsed)" -lt $((L - 70)) ] || break
  echo "== 120b [$v]: $(tg 120b 0 128 3 $v) ($(dev_elapsed)s)"
done
for tool in memcheck racecheck; do
  [ "$(dev_elapsed)" -lt $((L - 40)) ] || break
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$B/test-kernels-fold" > "$OUT/$tool.txt" 2>&1
  echo "== $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases' "$OUT/$tool.txt" | tr '\n' ' ') ($(dev_elapsed)s)"
done
echo "== end at $(dev_elapsed)s"
