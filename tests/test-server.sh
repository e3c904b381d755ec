#!/usr/bin/env bash
# test-server.sh - gptoss-server on the tiny synthetic model (CPU), driven by the official OpenAI
# Node SDK (tests/test-server.cjs: plain and streamed completions, prefix reuse across requests,
# a tool call round trip, 400s naming the field, 401, 8 requests at once, a client disconnecting
# mid-stream) and by curl for what an SDK hides: the raw SSE framing, the health and error
# bodies, 503 when the queue is full, and a clean exit on SIGTERM (a request it cuts short: 503).
# Exits 77 (skipped, with the reason) when gptoss-server was not built or node/npm are missing.
set -euo pipefail

server="${GPTOSS_BUILD_DIR:?}/gptoss-server"
model="${GPTOSS_TINY_MODEL:?}"
src="${GPTOSS_SOURCE_DIR:?}"
skip() { echo "SKIPPED: $*"; exit 77; }
[ -x "$server" ] || skip "gptoss-server was not built (install libcpp-httplib-dev: tools/install-deps.sh)"
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are needed to run the OpenAI SDK"
command -v curl >/dev/null || skip "curl is needed"
node_dir=$(bash "$src/tools/fetch-openai-node.sh") || skip "could not install the openai npm package"

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# start NAME ARGS...: starts a server on a free port; sets url and server_pid.
start() {
    local name=$1
    shift
    "$server" --model "$model" --device cpu --port 0 "$@" 2>"$work/$name.log" &
    server_pid=$!
    pids+=("$server_pid")
    for _ in $(seq 100); do
        url=$(grep -o 'listening on http://[^ ]*' "$work/$name.log" | sed 's/listening on //' || true)
        [ -n "$url" ] && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$work/$name.log" >&2
    echo "FAIL: gptoss-server did not start" >&2
    exit 1
}

# --- the main server: the SDK's checks ---------------------------------------------------------
key=test-key-123
start main --parallel 2 --ctx 2048 --api-key "$key" --alias tiny-test
main_pid=$server_pid
main_url=$url
SERVER_URL=$main_url SERVER_KEY=$key SERVER_ALIAS=tiny-test OPENAI_NODE_DIR=$node_dir \
    node "$src/tests/test-server.cjs" || fail "the OpenAI SDK checks (above)"

# --- curl: raw SSE framing, health, errors ------------------------------------------------------
auth=(-H "Authorization: Bearer $key" -H "Content-Type: application/json")
curl -sS -N "${auth[@]}" "$main_url/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"seed":3,"stream":true}' >"$work/sse.txt"
python3 - "$work/sse.txt" <<'EOF' || fail "the SSE framing"
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
assert raw.endswith("data: [DONE]\n\n"), repr(raw[-40:])
events = raw.split("\n\n")[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), events
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, chunks[0]
assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
assert all("usage" not in c for c in chunks), "usage only with stream_options.include_usage"
EOF
# response_format + vLLM's thinking_token_budget: the tiny model answers, and the answer validates.
curl -sS "${auth[@]}" "$main_url/v1/chat/completions" -d '{"messages":[{"role":"user","content":"ok?"}],"seed":4,
    "max_tokens":200,"thinking_token_budget":2,"response_format":{"type":"json_schema","json_schema":{"name":"a",
    "schema":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}}}}' >"$work/rf.json"
python3 - "$work/rf.json" <<'EOF' || fail "response_format with thinking_token_budget: $(head -c 600 "$work/rf.json")"
import json, sys
choice = json.load(open(sys.argv[1]))["choices"][0]
assert choice["finish_reason"] == "stop", choice
assert json.loads(choice["message"]["content"]) in ({"ok": True}, {"ok": False}), choice
EOF
code=$(curl -s -o "$work/h.json" -w '%{http_code}' "$main_url/health")
[ "$code" = 200 ] && grep -q '"status":"ok"' "$work/h.json" || fail "/health: $code $(cat "$work/h.json")"
code=$(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" "$main_url/v1/chat/completions" -d '{"messages": [')
[ "$code" = 400 ] && grep -q '"type":"invalid_request_error"' "$work/e.json" && grep -q 'not valid JSON' "$work/e.json" ||
    fail "malformed JSON: $code $(cat "$work/e.json")"
code=$(curl -s -o "$work/e.json" -w '%{http_code}' "$main_url/v1/chat/completions" -d '{}')
[ "$code" = 401 ] && grep -q '"code":"invalid_api_key"' "$work/e.json" || fail "no key: $code $(cat "$work/e.json")"
python3 -c 'import json; print(json.dumps({"messages": [{"role": "user", "content": "word " * 20000}], "max_tokens": 1}))' >"$work/big.json"
code=$(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" "$main_url/v1/chat/completions" -d @"$work/big.json")
# Read whole (not 413) and counted: 20000 words do not fit --ctx 2048.
[ "$code" = 400 ] && grep -q '"code":"context_length_exceeded"' "$work/e.json" ||
    fail "a 100 kB body: $code $(head -c 300 "$work/e.json")"
code=$(curl -s -o "$work/e.json" -w '%{http_code}' -H "Authorization: Bearer $key" "$main_url/v1/chat/completions" -d @"$work/big.json")
[ "$code" = 413 ] && grep -q 'application/json' "$work/e.json" || fail "a form-encoded 100 kB body: $code $(cat "$work/e.json")"
code=$(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" "$main_url/v1/nothing")
[ "$code" = 404 ] && grep -q '"error"' "$work/e.json" || fail "unknown path: $code $(cat "$work/e.json")"

# SIGTERM: a clean exit, status 0.
kill -TERM "$main_pid"
rc=0
wait "$main_pid" || rc=$?
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
grep -q "stopping" "$work/main.log" || fail "no shutdown message"

# --- a bad flag value: a usage error naming it ---------------------------------------------------
rc=0
"$server" --model "$model" --device cpu --batch-invariant maybe 2>"$work/flag.log" || rc=$?
[ "$rc" = 2 ] && grep -q -- '--batch-invariant: expected on or off, found "maybe"' "$work/flag.log" ||
    fail "--batch-invariant maybe: exit $rc, $(cat "$work/flag.log")"

# --- a full queue: 503 (batch invariance off: a lone request on its own decode path) ---------------
start busy --parallel 1 --queue 1 --decode-batch 2 --batch-invariant off
long='{"messages":[{"role":"user","content":"go on"}],"max_tokens":100000,"stream":true}'
curl -sS -N "$url/v1/chat/completions" -d "$long" >/dev/null 2>&1 &
c1=$!
pids+=("$c1")
for _ in $(seq 50); do grep -q '"busy":1' <(curl -s "$url/health") && break; sleep 0.1; done
curl -sS -N "$url/v1/chat/completions" -d "$long" >/dev/null 2>&1 &
c2=$!
pids+=("$c2")
for _ in $(seq 50); do grep -q '"waiting":1' <(curl -s "$url/health") && break; sleep 0.1; done
code=$(curl -s -o "$work/e.json" -w '%{http_code}' "$url/v1/chat/completions" -d "$long")
[ "$code" = 503 ] && grep -q '"code":"server_busy"' "$work/e.json" || fail "full queue: $code $(cat "$work/e.json")"
kill "$c1" "$c2" 2>/dev/null || true
for _ in $(seq 50); do grep -q '"busy":0,"waiting":0' <(curl -s "$url/health") && break; sleep 0.1; done
grep -q '"busy":0,"waiting":0' <(curl -s "$url/health") || fail "clients that left still hold the session: $(curl -s "$url/health")"
# SIGTERM while a request generates: it is answered 503 (not a cut-short 200), and the server exits 0.
curl -s -o "$work/cut.json" -w '%{http_code}' "$url/v1/chat/completions" -d "${long/true/false}" >"$work/cut.code" &
c3=$!
pids+=("$c3")
for _ in $(seq 50); do grep -q '"busy":1' <(curl -s "$url/health") && break; sleep 0.1; done
kill -TERM "$server_pid"
rc=0
wait "$server_pid" || rc=$?
[ "$rc" = 0 ] || fail "busy server: exit status $rc after SIGTERM"
wait "$c3" || true
[ "$(cat "$work/cut.code")" = 503 ] && grep -q '"code":"shutting_down"' "$work/cut.json" ||
    fail "a request cut short by SIGTERM: $(cat "$work/cut.code") $(head -c 300 "$work/cut.json")"

if [ "$failures" -ne 0 ]; then
    echo "--- server log ---" >&2
    tail -40 "$work/main.log" >&2
    echo "$failures failed" >&2
    exit 1
fi
echo "test-server: all checks passed"
