#!/usr/bin/env bash
# tools/gptoss-bench on the CPU backend with the tiny checkpoint: decode-only runs at a depth
# (-p 0 -d N: the context is filled in 512-token chunks; a 0-token fill step once looped
# forever), a pp + tg run and a --concurrency run report their rows. Each run is bounded by `timeout`.
set -uo pipefail
bench="${GPTOSS_BUILD_DIR:?}/gptoss-bench"
model="${GPTOSS_TINY_MODEL:?}"
passed=0 failed=0
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" == "$3" ]; then passed=$((passed + 1)); else
        failed=$((failed + 1)); printf 'FAIL %s\n  expected: %q\n  got:      %q\n' "$1" "$2" "$3"; fi
}
rows() { grep -oE '^\| (pp|tg)[0-9]+ +\| +[0-9]+ ' | tr -s ' ' | tr '\n' ';'; }
out=$(timeout 120 "$bench" --device cpu --model "$model" -p 0 -n 2 -d 600 -r 1 2>/dev/null); rc=$?
check "-p 0 -d 600 finishes" "0" "$rc"
check "-p 0 -d 600 rows" "| tg2 | 600 ;" "$(rows <<< "$out")"
out=$(timeout 120 "$bench" --device cpu --model "$model" -p 16 -n 2 -d 0,40 -r 1 2>/dev/null); rc=$?
check "-p 16 -d 0,40 finishes" "0" "$rc"
check "-p 16 -d 0,40 rows" "| pp16 | 0 ;| tg2 | 0 ;| pp16 | 40 ;| tg2 | 40 ;" "$(rows <<< "$out")"
# --concurrency: N streams at once through the public API, decode steps batched (issue 13).
out=$(timeout 120 "$bench" --device cpu --model "$model" --concurrency 1,3 -p 12 -n 4 2>/dev/null); rc=$?
check "--concurrency 1,3 finishes" "0" "$rc"
check "--concurrency 1,3 rows" "| 1 | 4 ;| 3 | 12 ;" \
    "$(grep -oE '^\| +[0-9]+ \| +[0-9]+ ' <<< "$out" | tr -s ' ' | tr '\n' ';')"
out=$(timeout 120 "$bench" --device cpu --model "$model" --concurrency 2 -p 12 -n 4 --batch-invariant off 2>/dev/null); rc=$?
check "--batch-invariant off finishes" "0" "$rc"
check "--batch-invariant off says so" "1" "$(grep -c 'max_decode_batch 2 (batch invariance off)' <<< "$out")"
out=$(timeout 20 "$bench" --device cpu --model "$model" --concurrency 2 --batch-invariant maybe 2>&1); rc=$?
check "--batch-invariant maybe is refused" "1" "$(grep -c 'expected on or off, found \"maybe\"' <<< "$out")"
out=$(timeout 20 "$bench" --device cpu --model "$model" -p 0 -n 2 --decode-gap 2>&1); rc=$?
check "--decode-gap on the CPU exits 2" "2" "$rc"
check "--decode-gap on the CPU says why" "1" "$(grep -c 'decode-gap needs a GPU' <<< "$out")"
# --host-moe (the CPU experts of issue 16, tools/bench-host-moe.h): a wrong shape is refused.
out=$(timeout 20 "$bench" --host-moe 7b 2>&1); rc=$?
check "--host-moe 7b exits 2" "2" "$rc"
check "--host-moe 7b says why" "1" "$(grep -c 'expected 20b or 120b' <<< "$out")"
echo "test-bench: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
