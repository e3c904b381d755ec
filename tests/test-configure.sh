#!/usr/bin/env bash
# tools/configure.sh runs CMake exactly when it must: for a new build directory, when an
# optional dependency appears (the NOTFOUND CMake cached is looked for again and found), when
# the arguments change, and after a failed configure; never when nothing changed. It drives a
# throwaway CMake project (no compiler, so it is fast) with a fake dependency on a private
# PATH directory, as `make deps` installing libedit or nvcc after a first configure would.
set -euo pipefail
src="${GPTOSS_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/proj" "$tmp/bin"
cat > "$tmp/proj/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.24)
project(configure_probe NONE)
# As check_language(CUDA) does: the result is cached, NOTFOUND included, and never looked
# for again while it is defined (find_program alone would retry a NOTFOUND by itself).
if(NOT DEFINED FAKE_TOOL)
  find_program(_fake NAMES gptoss-fake-dependency NO_CACHE)
  if(_fake)
    set(FAKE_TOOL ${_fake} CACHE FILEPATH "the fake dependency")
  else()
    set(FAKE_TOOL NOTFOUND CACHE FILEPATH "the fake dependency")
  endif()
endif()
if(FAIL)
  message(FATAL_ERROR "failing as asked")
endif()
file(APPEND ${CMAKE_BINARY_DIR}/runs.txt "${FAKE_TOOL} ${MODE}\n")
EOF
export GPTOSS_CONFIGURE_PROGRAMS=gptoss-fake-dependency GPTOSS_CONFIGURE_FILES=
export PATH="$tmp/bin:$PATH"
b="$tmp/build"
passed=0 failed=0
configure() { bash "$src/tools/configure.sh" -S "$tmp/proj" "$b" "$@" > "$tmp/out.txt" 2>&1; }
runs() { wc -l < "$b/runs.txt"; }
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; cat "$tmp/out.txt"; fi
}

configure -DMODE=a
check "a new build directory is configured" test "$(runs)" = 1
check "the missing dependency is NOTFOUND" grep -q '^NOTFOUND a$' "$b/runs.txt"
configure -DMODE=a
check "nothing changed: CMake does not run" test "$(runs)" = 1

printf '#!/bin/sh\n' > "$tmp/bin/gptoss-fake-dependency"
chmod +x "$tmp/bin/gptoss-fake-dependency"
configure -DMODE=a
check "a dependency appeared: CMake runs again" test "$(runs)" = 2
check "... and finds it" grep -q "^$tmp/bin/gptoss-fake-dependency a\$" "$b/runs.txt"
check "... and says why" grep -q 'program gptoss-fake-dependency' "$tmp/out.txt"
configure -DMODE=a
check "then nothing changed again" test "$(runs)" = 2

configure -DMODE=b
check "other arguments: CMake runs again" test "$(runs)" = 3
if configure -DMODE=b -DFAIL=ON; then check "a failing configure fails" false; fi
check "a failing configure leaves no stamp" test ! -f "$b/gptoss-configure.stamp"
configure -DMODE=b -DFAIL=OFF
check "after a failure, CMake runs again" test "$(runs)" = 4
configure -DMODE=b -DFAIL=OFF
check "and then not" test "$(runs)" = 4

echo "test-configure: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
