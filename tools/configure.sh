#!/usr/bin/env bash
# Configures a CMake build directory when it needs it, and only then. Run by the Makefile:
#   tools/configure.sh [-S SOURCE_DIR] BUILD_DIR [cmake arguments...]
# A build configured before `make deps` finished installing something (libedit, nvcc, ...)
# must be configured again, and check_language(CUDA) caches a missing nvcc as NOTFOUND and
# never looks again while that entry exists. This script writes a stamp,
# BUILD_DIR/gptoss-configure.stamp, recording the cmake arguments and which optional
# dependencies this machine has (programs on PATH, headers and libraries under /usr and
# /usr/local). CMake runs when there is no cache, no stamp (the last configure failed or
# predates the stamp) or a different stamp; an existing cache first forgets every NOTFOUND
# entry, so the probes run again, and values that were found (or set by hand, like
# CMAKE_CUDA_ARCHITECTURES) stay. The stamp is written only after CMake succeeds.
# GPTOSS_CONFIGURE_PROGRAMS and GPTOSS_CONFIGURE_FILES replace the probe lists
# (tests/test-configure.sh uses them). Exit status: CMake's, or 2 for a usage error.
set -euo pipefail
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "-S" ]; then source_dir=$2; shift 2; fi
if [ $# -lt 1 ]; then echo "usage: $0 [-S SOURCE_DIR] BUILD_DIR [cmake arguments...]" >&2; exit 2; fi
build_dir=$1; shift
programs=${GPTOSS_CONFIGURE_PROGRAMS-nvcc python3 cargo go}
files=${GPTOSS_CONFIGURE_FILES-include/editline/readline.h lib/libedit.so lib/*/libedit.so}

# One line per probe: what was found, or "-".
probe() {
  printf 'source %s\n' "$source_dir"
  printf 'args'; printf ' %q' "$@"; printf '\n'
  local p f found
  for p in $programs; do
    found=$(command -v "$p" 2>/dev/null || true)
    [ -z "$found" ] && [ "$p" = cargo ] && [ -x "$HOME/.cargo/bin/cargo" ] && found=$HOME/.cargo/bin/cargo
    [ -z "$found" ] && [ "$p" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ] && found=/usr/local/cuda/bin/nvcc
    [ -z "$found" ] && [ "$p" = nvcc ] && [ -n "${CUDACXX:-}" ] && found=$CUDACXX
    printf 'program %s %s\n' "$p" "${found:--}"
  done
  for f in $files; do
    found=$(compgen -G "/usr/$f" || compgen -G "/usr/local/$f" || true)
    [ -n "$found" ] && found=yes
    printf 'file %s %s\n' "$f" "${found:--}"
  done
}

stamp="$build_dir/gptoss-configure.stamp"
now=$(probe "$@")
if [ -f "$build_dir/CMakeCache.txt" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$now" ]; then exit 0; fi

cmd=(cmake -S "$source_dir" -B "$build_dir")
if [ -f "$build_dir/CMakeCache.txt" ]; then
  if [ -f "$stamp" ]; then
    echo "gptoss: $build_dir: dependencies or arguments changed, configuring again:"
    diff <(echo "$now") "$stamp" | sed -n 's/^< /  now: /p' || true
  fi
  # Forget what was not found, so that CMake looks for it again.
  while IFS= read -r name; do cmd+=(-U "$name"); done < <(
    sed -n 's/^\([A-Za-z0-9_.+-]*\):[A-Z]*=\(.*-\)\{0,1\}NOTFOUND$/\1/p' "$build_dir/CMakeCache.txt")
elif command -v ninja >/dev/null 2>&1; then
  cmd+=(-G Ninja)  # the generator of a new build directory only: CMake cannot change it later
fi
rm -f "$stamp"
"${cmd[@]}" "$@"
echo "$now" > "$stamp"
