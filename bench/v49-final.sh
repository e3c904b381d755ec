#!/usr/bin/env bash
# bench/v49-final.sh - the closing call of bench/NOTES.md "v49": a clean build of the whole tree with
# the router fold on by default, `ctest -L gpu`, issue 12's table rows (tg128 at depths 0 and 8 192,
# 20b and 120b), then the fold's accounting (the probe's cumulative breakdown, reverse order, 20b) while
# the call has time left.
# Usage (repository root, GPU machine): OUT=... bash bench/v49-final.sh DEPS TOK
set -uo pipefail
. tools/device-lib.sh
dev_clean_start "$1" "$2"
dev_clean_check
tg() {  # MODEL DEPTHS TOKENS REPEATS [NAME=VALUE...] -> gptoss-bench's tg rows (or its error)
  local m=$1 d=$2 n=$3 r=$4
  shift 4
  env "$@" timeout 150 ./build-gpu/gptoss-bench --synthetic "$m" --no-gemm-probe -p 0 -n "$n" -d "$d" -r "$r" 2>&1 |
    grep -E '^\| tg|rror' | tr '\n' ' '
}
for m in 20b 120b; do
  [ "$(dev_elapsed)" -lt 480 ] || break
  echo "== $m: $(tg $m 0,8192 128 3) ($(dev_elapsed)s)"
done
[ "$(dev_elapsed)" -lt 430 ] && ORDERS=reverse NCU=0 OUT=$OUT timeout $((560 - $(dev_elapsed))) \
  bash tools/device-decode-breakdown.sh ./build-gpu/gptoss-bench 20b
echo "== end at $(dev_elapsed)s"
