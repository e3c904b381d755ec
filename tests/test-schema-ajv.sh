#!/usr/bin/env bash
# tests/test-schema-ajv.sh - constrained decoding checked by an independent validator: the tiny
# random-weight checkpoint (which writes garbage unconstrained) writes, for each schema in
# tests/data/schema/ (nested objects, arrays, enums, unions, discriminated oneOf, nullable,
# $ref/$defs, prefixItems, formats), through one model load:
#   - SEEDS forced tool calls (gptoss_chat, tools=[f with the schema as parameters],
#     tool_choice f): every call must stop on <|call|> with arguments that validate;
#   - SEEDS response_format json_schema answers (gptoss_chat; max_reasoning_tokens 0 for even
#     seeds, 6 for odd ones, so the analysis→final path is taken too): every turn must stop on
#     <|return|> with a final message that validates;
#   - SEEDS/8 gptoss_generate outputs under sampling.json_schema (the raw-token path).
# Every text must parse as JSON and validate with npm ajv 8.17.1 (JSON Schema 2020-12, strict
# mode; formats date/uuid checked by the script). ajv is installed once into
# ~/.cache/gptoss/ajv-8.17.1 (outside git). Exit 77 (skipped) without node/npm/python3 or when
# ajv cannot be installed. GPTOSS_SCHEMA_AJV_SEEDS sets the seeds per schema: default 12, what
# CI runs (5 schemas x (12 tool calls + 12 answers + 1 generate) = 125 outputs, ~4 min on 2 cores);
# 40 gives 425 outputs, the full run recorded in bench/NOTES.md (~15 min).
set -euo pipefail
src=${GPTOSS_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
seeds=${GPTOSS_SCHEMA_AJV_SEEDS:-12}
for tool in node npm python3; do
  command -v $tool >/dev/null || { echo "test-schema-ajv: SKIPPED: $tool not found"; exit 77; }
done
: "${GPTOSS_TINY_MODEL:?run through ctest}" "${GPTOSS_LIBRARY:?run through ctest}"
ajv_dir=${HOME:-/tmp}/.cache/gptoss/ajv-8.17.1
if [ ! -f "$ajv_dir/node_modules/ajv/package.json" ]; then
  mkdir -p "$ajv_dir"
  if ! npm install --prefix "$ajv_dir" --no-audit --no-fund --silent ajv@8.17.1 >/dev/null 2>&1; then
    echo "test-schema-ajv: SKIPPED: npm could not install ajv@8.17.1 (offline?)"; exit 77
  fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Generate: one JSON line per output {"schema", "path", "seed", "stop", "text"}; "text" is
# what must validate, "stop" must be "ok".
PYTHONPATH="$src/bindings/python" python3 - "$src/tests/data/schema" "$seeds" > "$work/out.jsonl" <<'PY'
import json, os, sys
import gptoss
schema_dir, seeds = sys.argv[1], int(sys.argv[2])
model = gptoss.Model(os.environ["GPTOSS_TINY_MODEL"], device="cpu")
prompt = model.tokenize("<|start|>user<|message|>Answer in JSON.<|end|><|start|>assistant<|channel|>final<|message|>",
                        allow_special=True)
user = [{"role": "user", "content": "Answer in JSON."}]
def emit(name, path, seed, ok, text):
    print(json.dumps({"schema": name, "path": path, "seed": seed, "stop": "ok" if ok else "bad", "text": text}))
with model.session(max_context=4096) as session:
    for name in sorted(os.listdir(schema_dir)):
        schema = open(os.path.join(schema_dir, name)).read()
        tools = [{"type": "function", "function": {"name": "f", "description": "Test.", "parameters": json.loads(schema)}}]
        for seed in range(seeds):
            r = session.chat(user, tools=tools, tool_choice="f", seed=seed, max_tokens=1000)
            call = r.tool_calls[0].arguments if len(r.tool_calls) == 1 else r.raw
            emit(name, "tool call", seed, r.stop_reason.name == "CALL" and len(r.tool_calls) == 1, call)
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        for seed in range(seeds):
            r = session.chat(user, response_format=fmt, max_reasoning_tokens=0 if seed % 2 == 0 else 6,
                             seed=seed, max_tokens=1000)
            emit(name, "response_format", seed, r.stop_reason.name == "RETURN", r.final if r.final else r.raw)
        for seed in range(max(1, seeds // 8)):
            r = session.generate(prompt, seed=seed, max_tokens=1000, json_schema=schema)
            emit(name, "generate", seed, r.stop_reason.name in ("RETURN", "CALL"), r.text[:r.text.rfind("<|")])
PY

# 2. Validate with ajv.
cat > "$work/validate.cjs" <<'JS'
const fs = require("fs"), path = require("path");
const Ajv2020 = require(path.join(process.argv[2], "node_modules/ajv/dist/2020")).default;
const ajv = new Ajv2020({strict: true, allowUnionTypes: true, allErrors: true});
ajv.addFormat("uuid", /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
ajv.addFormat("date", (s) => { const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s); if (!m) return false;
  // setUTCFullYear, not Date.UTC, which reads years 0-99 as 1900-1999 ("0073-02-11" is valid).
  const d = new Date(0); d.setUTCFullYear(+m[1], +m[2] - 1, +m[3]);
  return d.getUTCFullYear() === +m[1] && d.getUTCMonth() === +m[2] - 1 && d.getUTCDate() === +m[3]; });
const validators = {};
let bad = 0, n = 0;
const counts = {};
for (const line of fs.readFileSync(process.argv[3], "utf8").split("\n").filter(Boolean)) {
  const o = JSON.parse(line); n++;
  const v = validators[o.schema] ??= ajv.compile(JSON.parse(fs.readFileSync(path.join(process.argv[4], o.schema), "utf8")));
  let why = "";
  if (o.stop !== "ok") why = "did not end as it must (a call on <|call|>, an answer on <|return|>)";
  else try { if (!v(JSON.parse(o.text))) why = ajv.errorsText(v.errors); } catch (e) { why = "not JSON: " + e.message; }
  counts[o.path] = (counts[o.path] ?? 0) + 1;
  if (why) { bad++; console.log(`FAIL ${o.schema} ${o.path} seed ${o.seed}: ${why}\n  ${JSON.stringify(o.text)}`); }
}
console.log(`${n - bad}/${n} constrained outputs validate (${JSON.stringify(counts)}; ajv ${require(path.join(process.argv[2], "node_modules/ajv/package.json")).version})`);
process.exit(bad || n === 0 ? 1 : 0);
JS
node "$work/validate.cjs" "$ajv_dir" "$work/out.jsonl" "$src/tests/data/schema"
