#!/usr/bin/env bash
# test-chat-cli.sh - drives the interactive gptoss-chat in a real terminal (tmux) on the tiny
# synthetic model with the CPU backend, as a person would: a reply streams and ends with its
# stats line; Ctrl-C during a long reply stops it and the prompt returns with the chat intact;
# a """ block sends several lines as one message; /save writes what was typed; /reset forgets
# it; the input history reaches its file; Ctrl-D exits with status 0; Ctrl-C at the prompt
# exits with status 0; a pending tool call takes the result the user types. The expected texts
# are the ones this script types.
set -euo pipefail

chat="${GPTOSS_CHAT:-${GPTOSS_BUILD_DIR:?}/gptoss-chat}"
model="${GPTOSS_TINY_MODEL:?}"
# `make test` installs tmux first (tools/install-deps.sh), so this skip is seen only where the
# tests run by hand without it, such as the GPU machine.
if ! command -v tmux >/dev/null; then
    echo "SKIPPED: tmux is not installed (tools/install-deps.sh installs it)"
    exit 0
fi
# Without libedit (its -dev package missing at build time) input is plain and has no history.
libedit=0
"$chat" --version | grep -q "line editing: libedit" && libedit=1

work=$(mktemp -d)
sock="gptoss-test-$$"
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    # tmux can leave its socket file behind; one per run would pile up in /tmp.
    rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$sock"
    rm -rf "$work"
}
trap cleanup EXIT

T() { tmux -L "$sock" "$@"; }
pane() { T capture-pane -p -J -t chat -S -1000; }
fail() {
    echo "FAIL: $*" >&2
    echo "--- terminal ---" >&2
    pane | sed -e '/^$/d' | tail -40 >&2
    exit 1
}
# wait_for REGEX [COUNT] [SECONDS]: until the terminal shows at least COUNT lines matching.
wait_for() {
    local pattern=$1 want=${2:-1} limit=${3:-120}
    local end=$((SECONDS + limit))
    while ((SECONDS < end)); do
        if (($(pane | grep -cE -- "$pattern" || true) >= want)); then return 0; fi
        sleep 0.1
    done
    fail "timed out after ${limit}s waiting for $want line(s) matching /$pattern/"
}
type_line() {
    T send-keys -t chat -l -- "$1"
    T send-keys -t chat Enter
}
start_chat() {
    # The pane outlives the program, so its exit status can be read from the screen.
    T new-session -d -s chat -x 200 -y 50 \
        "env XDG_STATE_HOME='$work/state' '$chat' --model '$model' --device cpu --seed 1 --max-tokens 16 \
         --history '$work/history'; echo CHAT-EXIT=\$?; sleep 600"
    wait_for '^>>> ' 1 120
}

# A session that lives as long as the test keeps the tmux server up between the chat sessions
# (a server whose last session ends exits, racing the next new-session).
T new-session -d -s keeper "sleep 3600"

stats='^\[[0-9]+ prompt tokens \([0-9]+ cached\), prefill [0-9.]+ tok/s; [0-9]+ tokens, decode [0-9.]+ tok/s; stop: '

# --- a reply streams and ends with the stats line ---------------------------------------------
start_chat
type_line "Hello there"
wait_for "$stats" 1
line=$(pane | grep -E "$stats" | head -1)
generated=$(sed -E 's/.*; ([0-9]+) tokens, decode.*/\1/' <<<"$line")
((generated >= 1 && generated <= 16)) || fail "first reply generated $generated tokens, expected 1..16 (--max-tokens 16)"
prompt_tokens=$(sed -E 's/^\[([0-9]+) prompt.*/\1/' <<<"$line")
((prompt_tokens > 0)) || fail "first reply reports $prompt_tokens prompt tokens"

# --- Ctrl-C during a long generation returns the prompt --------------------------------------
type_line "/set max_tokens 0"
wait_for '^max_tokens = 0$'
type_line "Tell me a long story"
# Streaming: the reply grows on screen while no stats line has been printed for it.
snapshot() { pane | sed -n '/^>>> Tell me a long story/,$p' | tr -d ' \n' | wc -c; }
wait_for '^>>> Tell me a long story'
end=$((SECONDS + 120))
first=$(snapshot)
grew=0
while ((SECONDS < end)); do
    sleep 0.5
    now=$(snapshot)
    if (($(pane | grep -cE "$stats" || true) >= 2)); then fail "the long reply ended by itself before Ctrl-C"; fi
    if ((now > first + 20)); then grew=1; break; fi
done
((grew)) || fail "no streamed output appeared during the long reply"
T send-keys -t chat C-c
wait_for '^\[stopped\]' 1 30
wait_for "${stats}cancelled" 1 30
wait_for '^>>> ?$' 1 30

# The chat goes on after the interruption: the session and the conversation survive.
type_line "/set max_tokens 4"
wait_for '^max_tokens = 4$'
type_line '"""'
type_line "first line"
type_line 'second line"""'
wait_for "$stats" 3
last=$(pane | grep -E "$stats" | tail -1)
cached=$(sed -E 's/.*\(([0-9]+) cached\).*/\1/' <<<"$last")
((cached > 0)) || fail "the turn after the interruption reused no cached tokens: $last"

# --- /save writes the conversation; /reset forgets it ---------------------------------------
type_line "/save $work/a.json"
wait_for '^saved [0-9]+ messages to '
type_line "/reset"
wait_for '^conversation cleared$'
type_line "/save $work/b.json"
wait_for '^saved 0 messages to '
python3 - "$work/a.json" "$work/b.json" <<'EOF' || fail "saved conversations are wrong"
import json, sys
a = json.load(open(sys.argv[1]))
users = [m["content"] for m in a["messages"] if m["role"] == "user"]
expected = ["Hello there", "Tell me a long story", "first line\nsecond line"]
assert users == expected, f"user messages {users!r}, expected {expected!r}"
assert a["reasoning_effort"] == "medium", a["reasoning_effort"]
b = json.load(open(sys.argv[2]))
assert b["messages"] == [], f"after /reset: {b['messages']!r}"
EOF

# --- history file, then Ctrl-D exits with status 0 --------------------------------------------
# libedit writes entries vis(3)-encoded (a space is \040) after a _HiStOrY_V2_ line.
((libedit == 0)) || python3 - "$work/history" <<'EOF' || fail "input history file is wrong"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
entries = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), l) for l in lines if l != "_HiStOrY_V2_"]
for want in ["Hello there", "first line\nsecond line", "/reset"]:
    assert want in entries, f"{want!r} not in history {entries!r}"
EOF
T send-keys -t chat C-d
wait_for '^CHAT-EXIT=0$' 1 30
T kill-session -t chat

# --- Ctrl-C at the prompt exits with status 0 --------------------------------------------------
start_chat
T send-keys -t chat C-c
wait_for '^CHAT-EXIT=0$' 1 30
T kill-session -t chat

# --- a pending tool call asks the user for its result -----------------------------------------
# The random model never calls a tool by itself, so the conversation starts with a call.
cat >"$work/call.json" <<'EOF'
{"messages": [
  {"role": "user", "content": "What is the weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}]}
EOF
T new-session -d -s chat -x 200 -y 50 \
    "'$chat' --model '$model' --device cpu --seed 1 --max-tokens 4 --history '$work/history2' \
     --tools '${GPTOSS_SOURCE_DIR:?}/examples/tools.json' --conversation '$work/call.json'; echo CHAT-EXIT=\$?; sleep 600"
wait_for '^functions\.get_weather result> ' 1 120
type_line '{"temperature": 18}'
wait_for "$stats" 1
wait_for '^>>> ' 1 30
type_line "/save $work/c.json"
wait_for '^saved [0-9]+ messages to '
python3 - "$work/c.json" <<'EOF' || fail "the typed tool result is not in the conversation"
import json, sys
d = json.load(open(sys.argv[1]))
tools = [m for m in d["messages"] if m["role"] == "tool"]
assert len(tools) == 1 and tools[0]["name"] == "get_weather", d["messages"]
assert tools[0]["content"] == '{"temperature": 18}', tools[0]
assert tools[0]["tool_call_id"] == d["messages"][1]["tool_calls"][0]["id"], d["messages"]
assert [t["function"]["name"] for t in d["tools"]] == ["get_weather", "add"], d["tools"]
EOF
T send-keys -t chat C-d
wait_for '^CHAT-EXIT=0$' 1 30

echo "PASS: test-chat-cli"
