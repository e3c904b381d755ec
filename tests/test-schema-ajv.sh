#!/usr/bin/env bash
# tests/test-schema-ajv.sh - constrained decoding checked by an independent validator: the tiny
# random-weight checkpoint (which writes garbage unconstrained) generates through gptoss_generate
# with sampling.json_schema, SEEDS seeds per schema in tests/data/schema/ (nested objects, arrays,
# enums, unions, oneOf, nullable, $ref/$defs, prefixItems, formats), and every output must end in
# a stop token, parse as JSON and validate with npm ajv 8.17.1 (JSON Schema 2020-12, strict mode;
# formats date/uuid checked by the script). ajv is installed once into
# ~/.cache/gptoss/ajv-8.17.1 (outside git). Exit 77 (skipped) without node/npm/python3 or when
# ajv cannot be installed. GPTOSS_SCHEMA_AJV_SEEDS (default 50, so 200 documents) sets the
# seeds per schema.
set -euo pipefail
src=${GPTOSS_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
seeds=${GPTOSS_SCHEMA_AJV_SEEDS:-50}
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

# 1. Generate: one JSON line per output {"schema": FILE, "seed": N, "stop": R, "text": TEXT}.
PYTHONPATH="$src/bindings/python" python3 - "$src/tests/data/schema" "$seeds" > "$work/out.jsonl" <<'PY'
import json, os, sys
import gptoss
schema_dir, seeds = sys.argv[1], int(sys.argv[2])
model = gptoss.Model(os.environ["GPTOSS_TINY_MODEL"], device="cpu")
prompt = model.tokenize("<|start|>user<|message|>Answer in JSON.<|end|><|start|>assistant<|channel|>final<|message|>",
                        allow_special=True)
with model.session(max_context=2048) as session:
    for name in sorted(os.listdir(schema_dir)):
        schema = open(os.path.join(schema_dir, name)).read()
        for seed in range(seeds):
            r = session.generate(prompt, seed=seed, max_tokens=1000, json_schema=schema)
            print(json.dumps({"schema": name, "seed": seed, "stop": r.stop_reason.name, "text": r.text}))
PY

# 2. Validate with ajv.
cat > "$work/validate.cjs" <<'JS'
const fs = require("fs"), path = require("path");
const Ajv2020 = require(path.join(process.argv[2], "node_modules/ajv/dist/2020")).default;
const ajv = new Ajv2020({strict: true, allowUnionTypes: true, allErrors: true});
ajv.addFormat("uuid", /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
ajv.addFormat("date", (s) => { const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s); if (!m) return false;
  const d = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3]));
  return d.getUTCFullYear() === +m[1] && d.getUTCMonth() === +m[2] - 1 && d.getUTCDate() === +m[3]; });
const validators = {};
let bad = 0, n = 0;
for (const line of fs.readFileSync(process.argv[3], "utf8").split("\n").filter(Boolean)) {
  const o = JSON.parse(line); n++;
  const v = validators[o.schema] ??= ajv.compile(JSON.parse(fs.readFileSync(path.join(process.argv[4], o.schema), "utf8")));
  const cut = o.text.lastIndexOf("<|");
  let why = "";
  if (o.stop !== "RETURN" && o.stop !== "CALL") why = "stopped by " + o.stop;
  else try { if (!v(JSON.parse(o.text.slice(0, cut)))) why = ajv.errorsText(v.errors); } catch (e) { why = "not JSON: " + e.message; }
  if (why) { bad++; console.log(`FAIL ${o.schema} seed ${o.seed}: ${why}\n  ${JSON.stringify(o.text)}`); }
}
console.log(`${n - bad}/${n} constrained outputs validate (ajv ${require(path.join(process.argv[2], "node_modules/ajv/package.json")).version})`);
process.exit(bad || n === 0 ? 1 : 0);
JS
node "$work/validate.cjs" "$ajv_dir" "$work/out.jsonl" "$src/tests/data/schema"
