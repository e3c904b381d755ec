#!/usr/bin/env bash
# Runs every fuzzer of BUILD_DIR/tests/fuzz (make fuzz) for SECONDS each, one after the other:
#   tests/fuzz/run.sh BUILD_DIR SECONDS [NAME...]      (NAME: config, harmony, ...; default all)
# Each starts from its committed seeds (tests/fuzz/corpus/NAME), the inputs that once failed
# (tests/fuzz/regressions/NAME, also unit tests in tests/test-fuzz-regressions.cpp), and what earlier runs found in
# BUILD_DIR/fuzz-corpus/NAME, where new inputs go (the tree is never written). A crash, leak,
# UBSan report or timeout fails the script; the input is saved as
# BUILD_DIR/fuzz-artifacts/NAME-crash-... and the last lines of the log are shown
# (reproduce: BUILD_DIR/tests/fuzz/fuzz-NAME FILE). A summary line per fuzzer gives the
# executions, coverage (cov: edges) and corpus size.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: run.sh BUILD_DIR SECONDS [NAME...]}"
seconds="${2:?usage: run.sh BUILD_DIR SECONDS [NAME...]}"
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$here"/fuzz-*.cpp; do n=$(basename "$f" .cpp); names+=("${n#fuzz-}"); done
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"
mkdir -p "$build/fuzz-artifacts"
failed=()
for name in "${names[@]}"; do
  exe="$build/tests/fuzz/fuzz-$name"
  [ -x "$exe" ] || { echo "fuzz: $exe is missing (make fuzz)"; failed+=("$name"); continue; }
  work="$build/fuzz-corpus/$name"
  mkdir -p "$work"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$build/fuzz-artifacts/$name-")
  case "$name" in
    tokenizer-json) args+=(-max_len=65536) ;;   # mutations of a small file, not of 27 MB
    *) args+=(-max_len=16384) ;;
  esac
  log="$build/fuzz-artifacts/$name.log"
  dirs=("$work" "$here/corpus/$name")
  [ -d "$here/regressions/$name" ] && dirs+=("$here/regressions/$name")  # inputs that once failed
  if "$exe" "${args[@]}" "${dirs[@]}" > "$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    done_line=$(grep -aE '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")
    echo "fuzz-$name: ok, ${seconds} s, ${execs:-?} executions, cov ${cov:-?}, corpus ${corp:-?}"
  else
    echo "fuzz-$name: FAILED (log: $log)"
    grep -E 'ERROR|SUMMARY|fuzz: |runtime error|Test unit written' "$log" | head -20
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "fuzz: failed: ${failed[*]}"; exit 1; fi
