# tools/device-lib.sh - sourced by the tools/device-*.sh scripts: the build each device call starts
# with (and dev_ctest_gpu, its GPU test run), in one place. dev_build DIR LOG [TARGET...] configures
# DIR (Ninja, Release, sm_90a only; the packaged dependencies under $DEPS/usr and the tokenizer
# directory $TOK when those are set, as tools/install-deps.sh / ../shared/device/carry-deps.sh lay
# them out) and builds the targets (every target when none is named) with -j16. Both steps write to
# LOG, which the configure step truncates. Returns the status of the step that failed, 0 when both
# succeed.
dev_build() {
  local dir=$1 log=$2
  shift 2
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS/usr -DCMAKE_BUILD_RPATH=$DEPS/usr/lib/x86_64-linux-gnu} \
    ${TOK:+-DGPTOSS_TOKENIZER_DIR=$TOK} > "$log" 2>&1 \
    && cmake --build "$dir" -j16 "${targets[@]}" >> "$log" 2>&1
}

# dev_tree_hash prints 12 hex digits of a hash over the sources as they are on disk (cuda, cpu,
# tokenizer, tools, tests, the top-level C++ and build files): the device copy's git metadata can
# name an older commit than the files it carries (bench/NOTES.md "v36"), so a call identifies its
# tree by this; the same command on the build machine gives the same digits for the same files.
dev_tree_hash() {
  find cuda cpu tokenizer tools tests CMakeLists.txt Makefile ./*.cpp ./*.h -type f \
      -not -path '*/corpus/*' -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 cat | sha1sum | cut -c1-12
}

# dev_ctest_gpu DIR OUT_FILE [REGEX] writes the tiny synthetic model into DIR/models/tiny
# (gptoss-synth, tokenizer $TOK), runs `ctest -L gpu` on DIR with it (240 s at most; only the tests
# whose names match REGEX when given, e.g. '^test-kernels-batch$': a test binary run outside ctest
# lacks the model and the environment ctest gives it) into OUT_FILE, prints one summary line and, on a
# failure, the first failing tests' output; returns ctest's status. The caller's environment
# (GPTOSS_* switches) reaches the tests.
dev_ctest_gpu() {
  local dir=$1 out=$2 rc
  local only=()
  [ -n "${3:-}" ] && only=(-R "$3")
  "$dir/gptoss-synth" --preset tiny --seed 1 --out "$PWD/$dir/models/tiny" --tokenizer-dir "$TOK" > /dev/null 2>&1
  GPTOSS_TINY_MODEL="$PWD/$dir/models/tiny" timeout 240 ctest --test-dir "$dir" -L gpu "${only[@]}" --output-on-failure -j2 \
      > "$out" 2>&1
  rc=$?
  echo "== ctest -L gpu rc=$rc: $(grep -E 'tests passed|tests failed' "$out")"
  [ $rc -eq 0 ] || grep -B5 -A30 -m2 -E 'FAILED|ERROR' "$out" | head -80
  return $rc
}

# dev_start DEPS_DIR TOKENIZER_DIR: the start of a device-*.sh call that builds one tree: exports
# DEPS and TOK for dev_build, creates $OUT (the caller sets it) and prints the tree's hash.
dev_start() {
  export DEPS="$1" TOK="$2"
  mkdir -p "$OUT"
  echo "== tree $(dev_tree_hash)"
}

# dev_clean_start DEPS_DIR TOKENIZER_DIR: dev_start for a call script that builds build-gpu from
# scratch (a warm machine's objects can be newer than re-copied sources: bench/NOTES.md "v46") and
# reports its progress in seconds: removes build-gpu and starts the clock dev_elapsed reads (unless
# the caller started it earlier by setting DEV_T0).
dev_clean_start() {
  DEV_T0=${DEV_T0:-$(date +%s)}
  dev_start "$1" "$2"
  rm -rf build-gpu
}

# dev_elapsed prints the seconds since dev_clean_start (or the caller's DEV_T0).
dev_elapsed() {
  echo $(( $(date +%s) - ${DEV_T0:-$(date +%s)} ))
}

# dev_build_errors LOG prints the first compiler errors of a failed dev_build's log.
dev_build_errors() {
  grep -B2 -A10 -m3 error "$1" | head -40
}

# dev_clean_check [REGEX [TARGET...]]: after dev_clean_start, build build-gpu (every target, or the
# TARGETs) and run its `ctest -L gpu` (only the tests matching REGEX when it is not empty) into
# $OUT/build.log and $OUT/ctest.txt, printing the progress with dev_elapsed and the tests' lines;
# exits the calling script when the build fails.
dev_clean_check() {
  local regex=${1:-}
  [ $# -gt 0 ] && shift
  dev_build build-gpu "$OUT/build.log" "$@" || { dev_build_errors "$OUT/build.log"; exit 1; }
  echo "== build done at $(dev_elapsed)s"
  export GPTOSS_SOURCE_DIR=$PWD
  dev_ctest_gpu build-gpu "$OUT/ctest.txt" "$regex"
  grep -E "Test +#" "$OUT/ctest.txt" | head -30
  echo "== ctest done at $(dev_elapsed)s"
}
