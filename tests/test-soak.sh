#!/usr/bin/env bash
# tools/gptoss-soak (issue 17's soak) for a few seconds on the CPU backend with the tiny
# checkpoint: mixed chat turns in 2 threads finish with no failure and flat memory (exit 0);
# a missing model, a bad option and a deliberate host leak (--leak-mib-per-s) each fail with
# the exit status and message that name them. The 30-minute GPU run is in bench/NOTES.md.
set -uo pipefail
soak="${GPTOSS_BUILD_DIR:?}/gptoss-soak"
model="${GPTOSS_TINY_MODEL:?}"
passed=0 failed=0
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" == "$3" ]; then passed=$((passed + 1)); else
        failed=$((failed + 1)); printf 'FAIL %s\n  expected: %q\n  got:      %q\n' "$1" "$2" "$3"; fi
}
out=$(timeout 120 "$soak" --model "$model" --device cpu --seconds 8 --threads 2 --ctx 768 --report 4 2>&1); rc=$?
echo "$out" | tail -2
check "8 s soak exits 0" "0" "$rc"
check "8 s soak: no failure, flat" "1" "$(grep -cE '^summary: [1-9][0-9]* turns, [0-9]+ tokens, 0 failures; .*\(flat\)' <<< "$out")"
out=$(timeout 120 "$soak" --model "$model" --device cpu --seconds 6 --threads 1 --ctx 768 --report 6 \
      --host-slack 16 --leak-mib-per-s 64 2>&1); rc=$?
check "a host leak fails the soak" "1" "$rc"
check "a host leak is named" "1" "$(grep -c 'MiB (GREW)' <<< "$out")"
out=$(timeout 20 "$soak" --model /nonexistent/model --device cpu --seconds 1 2>&1); rc=$?
check "a missing model exits 1" "1" "$rc"
check "a missing model is named" "1" "$(grep -c '/nonexistent/model' <<< "$out")"
out=$(timeout 20 "$soak" --model "$model" --threads 0 2>&1); rc=$?
check "--threads 0 exits 2" "2" "$rc"
check "--threads 0 is named" "1" "$(grep -c -- "--threads: invalid value '0'" <<< "$out")"
echo "test-soak: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
