#!/usr/bin/env bash
# test-readme.sh - keeps README.md honest: its C example compiles as strict C99 against
# gptoss.h with warnings as errors, links against libgptoss.so and runs on the tiny model
# (exit 0); the make targets and files the README names exist.
set -euo pipefail

src="${GPTOSS_SOURCE_DIR:?}"
lib="${GPTOSS_LIBRARY:?}"
model="${GPTOSS_TINY_MODEL:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# The C block right after the <!-- readme-example.c --> marker.
awk '/<!-- readme-example.c -->/ { found = 1; next }
     found && /^```c$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$src/README.md" >"$work/example.c"
lines=$(wc -l <"$work/example.c")
((lines >= 10)) || fail "README.md: no C example after <!-- readme-example.c --> ($lines lines found)"

cc -std=c99 -pedantic-errors -Wall -Wextra -Werror -I"$src" "$work/example.c" "$lib" \
    -Wl,-rpath,"$(dirname "$lib")" -o "$work/example" || fail "README.md: the C example does not compile"
if [ -x "$work/example" ]; then
    "$work/example" "$model" >"$work/out" 2>"$work/err" ||
        { fail "README.md: the C example exited with status $? on the tiny model"; cat "$work/err" >&2; }
    # Its failure path prints gptoss_last_error(), which names the directory.
    rc=0
    "$work/example" "$work/missing" >/dev/null 2>"$work/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "README.md: the C example exits with $rc on a missing model, expected 1"
    grep -q "^gptoss: .*missing" "$work/err" || fail "README.md: the C example's error does not name the directory"
fi

# The two commands, and the targets the README mentions, exist in the Makefile.
for target in chat test; do
    grep -q "^$target:" "$src/Makefile" || fail "README.md names 'make $target', which the Makefile lacks"
done
grep -q "make test" "$src/.ci/run" || fail ".ci/run does not run 'make test', the README's test command"

# Relative links and paths in backquotes that look like repository files point at real files.
python3 - "$src" <<'EOF' || fail "README.md links to missing files"
import os, re, sys
src = sys.argv[1]
text = open(os.path.join(src, "README.md")).read()
missing = []
for target in re.findall(r"\]\(([^)#]+)\)", text):
    if "://" not in target and not os.path.exists(os.path.join(src, target)):
        missing.append(target)
assert not missing, f"missing: {missing}"
EOF

if [ "$failures" -ne 0 ]; then exit 1; fi
echo "PASS: test-readme"
