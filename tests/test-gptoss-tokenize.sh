#!/usr/bin/env bash
# tools/gptoss-tokenize on the tiny checkpoint (which carries the real tokenizer.json): text ->
# ids, ids -> text, --count, --allow-special, stdin, and clear errors. Expected ids are
# tiktoken's (HARMONY.md §1.7-1.8, tests/data/tokenizer/).
set -uo pipefail
tool="${GPTOSS_BUILD_DIR:?}/gptoss-tokenize"
model="${GPTOSS_TINY_MODEL:?}"
passed=0 failed=0
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" == "$3" ]; then passed=$((passed + 1)); else
        failed=$((failed + 1)); printf 'FAIL %s\n  expected: %q\n  got:      %q\n' "$1" "$2" "$3"; fi
}
check "text argument -> ids" "24912 2375" "$("$tool" --model "$model" "hello world")"
check "stdin -> ids" "24912 2375" "$(printf 'hello world' | "$tool" --model "$model")"
check "--count" "2" "$("$tool" --model "$model" --count "hello world")"
check "special text stays text by default" "27 91 5236 91 29" "$("$tool" --model "$model" "<|start|>")"
check "--allow-special" "200006 1428 200008" "$("$tool" --model "$model" --allow-special "<|start|>user<|message|>")"
check "--decode" "hello world" "$("$tool" --model "$model" --decode "24912 2375")"
check "--decode brackets and commas" "<|start|>user" "$("$tool" --model "$model" --decode "[200006, 1428]")"
check "--decode stdin" "你好世界" "$(echo "177519 28428" | "$tool" --model "$model" --decode)"
check "round trip" "naïve café 👨‍👩‍👧‍👦" "$("$tool" --model "$model" --decode "$("$tool" --model "$model" "naïve café 👨‍👩‍👧‍👦")")"
err=$("$tool" --model "$model" --decode "1 201088" 2>&1 >/dev/null); rc=$?
check "--decode out of range fails" "1" "$rc"
case "$err" in *"tokens[1]"*201088*) check "--decode names position and id" ok ok ;;
               *) check "--decode names position and id" "tokens[1] ... 201088" "$err" ;; esac
err=$(printf 'ab\xffc' | "$tool" --model "$model" 2>&1 >/dev/null); rc=$?
check "invalid UTF-8 fails" "1" "$rc"
case "$err" in *"byte offset 2"*) check "invalid UTF-8 names the offset" ok ok ;;
               *) check "invalid UTF-8 names the offset" "byte offset 2" "$err" ;; esac
"$tool" --model /nonexistent "x" >/dev/null 2>&1; check "bad model dir fails" "1" "$?"
"$tool" "x" >/dev/null 2>&1; check "missing --model is a usage error" "2" "$?"
# --chat: an OpenAI Chat Completions body rendered in the Harmony format; the expected text is
# openai/harmony's own test vector (tests/data/harmony/, verbatim).
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/request.json" <<'JSON'
{"messages": [{"role": "system", "content": "Answer the user's questions like a robot."},
              {"role": "user", "content": "What is the capital of the largest country in the world?"}],
 "reasoning_effort": "low"}
JSON
expected="$(cat "${GPTOSS_SOURCE_DIR:?}/tests/data/harmony/test_simple_convo_low_effort.txt")"
check "--chat renders harmony's text" "$expected" "$("$tool" --model "$model" --chat "$tmp/request.json")"
check "--chat --ids are the text's tokens with specials" "$("$tool" --model "$model" --allow-special "$expected")" \
      "$("$tool" --model "$model" --chat "$tmp/request.json" --ids)"
check "--chat --count" "$("$tool" --model "$model" --allow-special --count "$expected")" \
      "$("$tool" --model "$model" --chat "$tmp/request.json" --count)"
echo '{"messages": 3}' > "$tmp/bad.json"
err=$("$tool" --model "$model" --chat "$tmp/bad.json" 2>&1 >/dev/null); rc=$?
check "--chat with a bad request fails" "1" "$rc"
case "$err" in *messages*) check "--chat error names the field" ok ok ;;
               *) check "--chat error names the field" "messages: ..." "$err" ;; esac
"$tool" --model "$model" --chat "$tmp/missing.json" >/dev/null 2>&1; check "--chat with a missing file fails" "1" "$?"
echo "test-gptoss-tokenize: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
