#!/usr/bin/env bash
# test-chat-oneshot.sh - gptoss-chat used from scripts, on the tiny synthetic model (CPU):
# -p with piped stdin and --json (exit 0, the JSON holds what was sent), plain -p prints only
# the final answer (or a note on stderr saying there is none), --json output continues with
# --conversation (whose tool_choice forces the named call), --tool-cmd answers a pending tool
# call with what the tool program prints,
# line mode runs commands and prints a note instead of a blank line for a turn with no answer,
# the default model is written on first use, and every kind of bad input exits non-zero with a
# message naming it.
# Expected values come from what this script sends, from running examples/tool.py directly, and
# from the fixture's own gptoss-synth output; the model's random text is never an expectation.
set -euo pipefail

chat="${GPTOSS_CHAT:-${GPTOSS_BUILD_DIR:?}/gptoss-chat}"
model="${GPTOSS_TINY_MODEL:?}"
src="${GPTOSS_SOURCE_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$chat" --model "$model" --device cpu --seed 7 --max-tokens 12 "$@"; }
# check NAME PYTHON_ASSERTIONS FILE: runs assertions against the JSON document `d` in FILE.
check() {
    local name=$1 code=$2 file=$3
    python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$code" "$file" || fail "$name"
}
# expect_error NAME EXIT_CODE REGEX ARGS...: the command fails with that code and says REGEX.
expect_error() {
    local name=$1 want=$2 pattern=$3
    shift 3
    local rc=0
    "$@" </dev/null >"$work/out" 2>"$work/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then fail "$name: exit status $rc, expected $want"; cat "$work/err" >&2; return; fi
    grep -qE -- "$pattern" "$work/err" || { fail "$name: stderr does not match /$pattern/:"; cat "$work/err" >&2; }
}

# --- one-shot with piped stdin and --json ----------------------------------------------------
printf 'line one\nline two\n' | run -p "Summarize this:" --json -r high -s "Answer briefly." >"$work/a.json" ||
    fail "one-shot --json exited with status $?"
check "one-shot --json holds the prompt, the piped stdin and the settings" '
users = [m["content"] for m in d["messages"] if m["role"] == "user"]
assert users == ["Summarize this:\n\nline one\nline two"], users
assert d["messages"][0] == {"role": "developer", "content": "Answer briefly."}, d["messages"][0]
assert d["reasoning_effort"] == "high", d["reasoning_effort"]
u = d["usage"]
assert 0 < u["completion_tokens"] <= 12, u
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert u["prompt_tokens"] > len("Summarize this: line one line two".split()), u
c = d["choices"][0]
assert c["message"]["role"] == "assistant", c
assert c["finish_reason"] in ("stop", "length", "tool_calls"), c
assert (c["finish_reason"] == "length") == (d["stop_reason"] == "max tokens"), (c, d["stop_reason"])
assert isinstance(d["final"], str) and isinstance(d["analysis"], str)
' "$work/a.json"

# --- plain -p prints only the final answer -----------------------------------------------------
# Same seed, same input: the same reply, so the plain output must be exactly the JSON's final;
# a reply without one prints nothing on stdout and says so on stderr, with the JSON's numbers.
printf 'line one\nline two\n' | run -p "Summarize this:" -r high -s "Answer briefly." >"$work/plain.txt" \
    2>"$work/plain.err" || fail "one-shot plain exited with status $?"
python3 - "$work/a.json" "$work/plain.txt" "$work/plain.err" <<'EOF' || fail "plain -p output is not exactly the final answer"
import json, sys
d = json.load(open(sys.argv[1]))
plain = open(sys.argv[2], encoding="utf-8", errors="replace").read()
err = open(sys.argv[3], encoding="utf-8", errors="replace").read()
if d["final"]:
    assert plain == d["final"] + "\n", (plain, d["final"])
else:
    assert plain == "", plain
    note = "[no final answer: %d tokens (" % d["usage"]["completion_tokens"]
    assert note in err and ("), stop: %s]" % d["stop_reason"]) in err, err
EOF

# --- the --json output is a conversation file -------------------------------------------------
run --conversation "$work/a.json" -p "And now?" --json </dev/null >"$work/b.json" ||
    fail "--conversation with a --json output exited with status $?"
python3 - "$work/a.json" "$work/b.json" <<'EOF' || fail "--conversation did not continue the --json conversation"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
users = [m["content"] for m in b["messages"] if m["role"] == "user"]
assert users == ["Summarize this:\n\nline one\nline two", "And now?"], users
assert b["messages"][0] == a["messages"][0], "developer instructions lost"
assert b["reasoning_effort"] == "high", b["reasoning_effort"]
assert b["usage"]["prompt_tokens"] > a["usage"]["prompt_tokens"], (a["usage"], b["usage"])
EOF

# --- --tool-cmd answers a pending tool call ----------------------------------------------------
cat >"$work/call.json" <<'EOF'
{"messages": [
  {"role": "user", "content": "What is the weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}]}
EOF
expected=$(printf '{"city": "Paris"}' | GPTOSS_TOOL_NAME=get_weather python3 "$src/examples/tool.py")
run --conversation "$work/call.json" --tools "$src/examples/tools.json" \
    --tool-cmd "python3 '$src/examples/tool.py'" -p "" --json </dev/null >"$work/tool.json" ||
    fail "--tool-cmd run exited with status $?"
EXPECTED="$expected" python3 - "$work/tool.json" <<'EOF' || fail "the tool result is not what examples/tool.py prints"
import json, os, sys
d = json.load(open(sys.argv[1]))
tools = [m for m in d["messages"] if m["role"] == "tool"]
assert len(tools) >= 1, d["messages"]
assert tools[0]["name"] == "get_weather", tools[0]
assert tools[0]["content"] == os.environ["EXPECTED"], (tools[0]["content"], os.environ["EXPECTED"])
assert [t["function"]["name"] for t in d["tools"]] == ["get_weather", "add"], d["tools"]
EOF
run --conversation "$work/call.json" --tool-cmd "exit 3" -p "" --json </dev/null >"$work/toolfail.json" \
    2>"$work/err" || fail "a failing --tool-cmd ended the program with status $?"
check "a failing tool reports its exit status to the model" '
tools = [m for m in d["messages"] if m["role"] == "tool"]
assert tools and tools[0]["content"].startswith("error: the tool failed (exit status 3)"), tools
' "$work/toolfail.json"
grep -q "exited with status 3" "$work/err" || fail "a failing --tool-cmd is not reported on stderr"

# --- tool_choice in a --conversation file constrains the reply -----------------------------------
# The random model never calls a tool by itself; a named tool_choice in the file must force the
# call (its arguments constrained to the enum), exactly as the same field does through the API.
cat >"$work/forced.json" <<'EOF'
{"messages": [{"role": "user", "content": "Weather?"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                  "required": ["city"], "additionalProperties": false}}}],
 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
EOF
run --conversation "$work/forced.json" --json --max-tokens 40 -p "Weather in Paris?" </dev/null >"$work/forced-out.json" ||
    fail "a --conversation file with tool_choice fails"
check "tool_choice from a --conversation file forces the named call" '
c = d["choices"][0]
assert c["finish_reason"] == "tool_calls", c
calls = c["message"]["tool_calls"]
assert [t["function"]["name"] for t in calls] == ["get_weather"], calls
assert json.loads(calls[0]["function"]["arguments"]) in ({"city": "Paris"}, {"city": "Oslo"}), calls
' "$work/forced-out.json"

# --- line mode: piped stdin without -p, commands included -------------------------------------
printf 'hello\n/effort low\n/save %s\n/quit\nnever sent\n' "$work/lines.json" | run >"$work/lines.out" 2>"$work/err" ||
    fail "line mode exited with status $?"
check "line mode runs turns and commands in order, and /quit stops reading" '
users = [m["content"] for m in d["messages"] if m["role"] == "user"]
assert users == ["hello"], users
assert d["reasoning_effort"] == "low", d["reasoning_effort"]
' "$work/lines.json"
# One line per turn: the final answer, or what the turn got instead of a blank line.
[ "$(wc -l <"$work/lines.out")" -eq 1 ] || fail "line mode printed $(wc -l <"$work/lines.out") lines for one turn"
if grep -q '^\[no final answer' "$work/lines.out"; then
    grep -qE '^\[no final answer: [0-9]+ tokens \(.+\), stop: [a-z ]+\]$' "$work/lines.out" ||
        fail "line mode's no-final note is malformed: $(cat "$work/lines.out")"
elif ! grep -q . "$work/lines.out"; then
    fail "line mode printed a blank line for a turn"
fi
# The tiny model, asked for a few tokens, writes no final channel: the note, not a blank line.
printf 'hello\n' | run --max-tokens 3 >"$work/lines3.out" 2>"$work/err" || fail "line mode exited with status $?"
grep -qE '^\[no final answer: 3 tokens \(.+\), stop: max tokens\]$' "$work/lines3.out" ||
    fail "line mode with no final answer printed: '$(cat "$work/lines3.out")'"

# --- the default model is written on first use --------------------------------------------------
XDG_CACHE_HOME="$work/cache" "$chat" --device cpu -p "hi" --max-tokens 2 </dev/null >"$work/out" 2>"$work/err" ||
    { fail "default model run exited with status $?"; cat "$work/err" >&2; }
tiny="$work/cache/gptoss/models/tiny-v1"
for f in config.json tokenizer.json; do
    [ -s "$tiny/$f" ] || fail "default model lacks $f"
done
# The same preset and seed as the test fixture, so the same bytes.
for f in "$model"/*.safetensors; do
    cmp -s "$f" "$tiny/$(basename "$f")" || fail "default model differs from gptoss-synth --preset tiny --seed 1: $(basename "$f")"
done
grep -q "random" "$work/err" || fail "the default model notice does not say its weights are random"
grep -q -- "--model" "$work/err" || fail "the default model notice does not say how to use a real model"
XDG_CACHE_HOME="$work/cache" "$chat" --device cpu -p "hi" --max-tokens 2 </dev/null >/dev/null 2>"$work/err2" ||
    fail "second default model run exited with status $?"
if grep -q "writing the default tiny model" "$work/err2"; then fail "the default model was written twice"; fi
ls -d "$work/cache/gptoss/models/"*.tmp-* >/dev/null 2>&1 && fail "a temporary model directory was left behind"

# --- bad input ----------------------------------------------------------------------------------
# Option and file errors come before the model load; --model points nowhere so that a check
# that went wrong can never write a default model into the user's cache.
expect_error "missing model directory" 1 "hint: $work/nope does not exist" \
    "$chat" --model "$work/nope" -p hi
mkdir -p "$work/empty"
expect_error "directory without a checkpoint" 1 "cannot load the model from $work/empty: .+" \
    "$chat" --model "$work/empty" --device cpu -p hi
mkdir -p "$work/notgptoss"
echo '{"model_type": "llama", "hidden_size": 4096}' >"$work/notgptoss/config.json"
expect_error "a checkpoint that is not gpt-oss" 1 "cannot load the model from $work/notgptoss: .+" \
    "$chat" --model "$work/notgptoss" --device cpu -p hi
grep -q "hint: .* does not look like a gpt-oss checkpoint" "$work/err" || fail "no hint for a checkpoint that is not gpt-oss"
expect_error "a context beyond the model's" 1 "cannot create a session: .*1000000" \
    "$chat" --model "$model" --device cpu --ctx 1000000 -p hi
expect_error "bad --reasoning" 2 '--reasoning: expected low, medium or high, found "extreme"' \
    "$chat" --model "$work/nope" -r extreme -p hi
expect_error "bad --temperature" 2 '--temperature: expected a number >= 0, found "warm"' \
    "$chat" --model "$work/nope" --temperature warm -p hi
expect_error "bad --top-p" 2 '--top-p: expected a number in \(0, 1\], found "2"' "$chat" --model "$work/nope" --top-p 2 -p hi
expect_error "bad --device" 2 '--device: expected cpu, auto or a GPU number, found "gpu"' "$chat" --model "$work/nope" --device gpu -p hi
expect_error "option without its value" 2 '--seed needs a value' "$chat" --seed
expect_error "unknown option" 2 'unknown option "--frobnicate"' "$chat" --frobnicate
expect_error "missing --tools file" 2 "--tools $work/none.json: No such file" \
    "$chat" --model "$work/nope" --tools "$work/none.json" -p hi
echo '[{"type": "function", "function": {"description": "no name"}}]' >"$work/badtools.json"
expect_error "--tools entry without a name" 2 "--tools $work/badtools.json: .*name" \
    "$chat" --model "$work/nope" --tools "$work/badtools.json" -p hi
echo '{"messages": [{"role": "user", "content": 42}]}' >"$work/badconv.json"
expect_error "--conversation with a bad field" 2 "--conversation $work/badconv.json: .*messages\[0\]\.content" \
    "$chat" --model "$work/nope" --conversation "$work/badconv.json" -p hi
echo '{"messages": [' >"$work/notjson.json"
expect_error "--conversation that is not JSON" 2 "--conversation $work/notjson.json: .+" \
    "$chat" --model "$work/nope" --conversation "$work/notjson.json" -p hi
expect_error "empty prompt with nothing to continue" 2 "the prompt is empty" run -p ""

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
fi
echo "PASS: test-chat-oneshot"
