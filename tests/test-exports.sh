#!/usr/bin/env bash
# libgptoss.so exports exactly the functions gptoss.h declares: no private C++ symbol leaks
# (API.md §3 rule 9), and no declared function is missing (a declared-but-unimplemented
# function is a bug the header must not carry).
set -euo pipefail
lib="${GPTOSS_LIBRARY:?GPTOSS_LIBRARY must name libgptoss.so}"
header="${GPTOSS_SOURCE_DIR:?}/gptoss.h"
declared=$(grep -oE 'GPTOSS_API [^(]*\(' "$header" | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' | grep '^gptoss_' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWiu]$/ {print $3}' | sed 's/@.*//' | sort -u)
status=0
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$extra" ]; then echo "exported but not declared in gptoss.h:"; echo "$extra" | head -20; status=1; fi
if [ -n "$missing" ]; then echo "declared in gptoss.h but not exported:"; echo "$missing"; status=1; fi
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
case "$soname" in libgptoss.so.0) ;; *) echo "SONAME is '$soname', expected libgptoss.so.0"; status=1 ;; esac
n=$(echo "$declared" | wc -l)
if [ $status -eq 0 ]; then echo "test-exports: 1 passed, 0 failed ($n functions, SONAME $soname)"; else echo "test-exports: 0 passed, 1 failed"; fi
exit $status
