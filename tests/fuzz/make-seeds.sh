#!/usr/bin/env bash
# Writes the seed corpora of the fuzzers into tests/fuzz/corpus/NAME/ (committed; rerun after
# changing a fuzzer's input format). Small valid inputs of every kind, plus a few broken ones:
#   tests/fuzz/make-seeds.sh BUILD_DIR
# BUILD_DIR holds gptoss-tokenize and the tiny test model (models/tiny, from its synth-tiny test):
# the token streams of the Harmony seeds are real tokenizer output; the tokenizer.json seed is
# cut from $GPTOSS_TOKENIZER_DIR's (default ~/.cache/gptoss/tokenizer-gptoss).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: make-seeds.sh BUILD_DIR}"
tok_dir="${GPTOSS_TOKENIZER_DIR:-$HOME/.cache/gptoss/tokenizer-gptoss}"
tokenize() { "$build/gptoss-tokenize" --model "$build/models/tiny" --allow-special; }
rm -rf "$here/corpus"
mkdir -p "$here/corpus"
# Harmony token streams (ids as text, one stream per line) for the Python part below.
streams=$(mktemp)
trap 'rm -f "$streams"' EXIT
{
  printf '%s' '<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>' | tokenize
  printf '%s' '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"Tokyo"}<|call|>' | tokenize
  printf '%s' '<|channel|>final<|message|>Héllo wörld 日本 🙂 STOP here<|return|>' | tokenize
  printf '%s' 'analysis<|message|>no channel token<|end|><|start|>assistant to=python<|channel|>analysis code<|message|>print(1)<|call|>' | tokenize
  printf '%s' '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{}<|end|><|endoftext|>' | tokenize
  for f in "$here"/../data/harmony/test_*.txt; do tokenize < "$f"; done
} > "$streams"
python3 - "$here/corpus" "$tok_dir/tokenizer.json" "$streams" <<'PY'
import json, os, struct, sys
out, tokenizer_json, streams = sys.argv[1], sys.argv[2], sys.argv[3]
def put(target, name, data):
    d = os.path.join(out, target); os.makedirs(d, exist_ok=True)
    if isinstance(data, str): data = data.encode()
    open(os.path.join(d, name), "wb").write(data)

# config.json: the tiny preset's shape, and the 20b one with YaRN and layer_types.
tiny = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4, "num_local_experts": 4,
        "num_experts_per_tok": 2, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 201088, "sliding_window": 128,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 150000, "swiglu_limit": 7.0,
        "eos_token_id": 200002}
put("config", "tiny.json", json.dumps(tiny))
b20 = dict(tiny, num_hidden_layers=24, num_local_experts=32, experts_per_token=4, hidden_size=2880,
           intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
           max_position_embeddings=131072, eos_token_id=[200002, 199999, 200012],
           rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
           layer_types=["sliding_attention", "full_attention"] * 12)
del b20["num_experts_per_tok"]
put("config", "20b.json", json.dumps(b20, indent=2))
put("config", "rope-parameters.json", json.dumps(dict(tiny, rope_parameters={"rope_type": "yarn", "factor": 2.0})))
put("config", "bad-heads.json", json.dumps(dict(tiny, num_key_value_heads=3)))
put("config", "not-object.json", "[1, 2]")

# safetensors: the JSON header, then the data region's size (4 bytes LE); 0xFF + a whole file.
def shard(tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = {"BF16": 2, "F32": 4, "U8": 1}[dtype]
        for d in shape: n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    return json.dumps(header).encode(), off
for i, tensors in enumerate([
        [("model.norm.weight", "BF16", [64])],
        [("a", "BF16", [2, 3]), ("b", "F32", [4]), ("c", "U8", [4, 2, 16]), ("e", "BF16", [0, 5])],
        [("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [4, 128, 2, 16]),
         ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", [4, 128, 2]),
         ("model.layers.0.self_attn.sinks", "F32", [4])]]):
    h, n = shard(tensors)
    put("safetensors", "shard%d" % i, h + struct.pack("<I", n))
    put("safetensors", "file%d" % i, b"\xff" + struct.pack("<Q", len(h)) + h + bytes(n))
h, n = shard([("a", "BF16", [4]), ("b", "BF16", [4])])
put("safetensors", "overlap", h.replace(b"[8, 16]", b"[4, 12]") + struct.pack("<I", n))
put("safetensors", "beyond", h + struct.pack("<I", n - 2))
put("safetensors", "gap", h + struct.pack("<I", n + 6))

# model.safetensors.index.json
put("index", "two.json", json.dumps({"metadata": {"total_size": 123}, "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))
put("index", "dotdot.json", json.dumps({"weight_map": {"x": "../x.safetensors"}}))
put("index", "empty.json", json.dumps({"weight_map": {}}))

# tokenizer.json: the real file's structure with a handful of ranks and special tokens.
real = json.load(open(tokenizer_json, encoding="utf-8"))
small = {k: v for k, v in real.items() if k not in ("model", "added_tokens")}
vocab = dict(list(real["model"]["vocab"].items())[:40])
small["model"] = dict(real["model"], vocab=vocab, merges=real["model"].get("merges", [])[:10])
small["added_tokens"] = real["added_tokens"][:6]
put("tokenizer-json", "small.json", json.dumps(small, ensure_ascii=False))
put("tokenizer-json", "no-model.json", json.dumps({k: v for k, v in small.items() if k != "model"}))

# tokenizer: byte 0 bit 0 = allow_special, then text.
for i, text in enumerate([b"Hello, world! 123 4567", "naïve café — 日本語 🙂\r\n\t  x".encode(),
                          b"<|start|>assistant<|channel|>final<|message|>hi<|return|>", b"bad \xff\xfe utf8 \xc3",
                          b"   \n\n  's 've 'LL \xe2\x80\x8b", b"<|reserved_200018|><|endoftext|>"]):
    put("tokenizer", "text%d" % i, bytes([i & 1]) + text)

# harmony: flags, stop strings, tokens (4 bytes LE each).
for i, line in enumerate(open(streams)):
    ids = [int(x) for x in line.replace(",", " ").split()]
    if not ids: continue
    stops = [b"STOP", "ö".encode()] if i % 3 == 2 else [b"4."] if i % 3 == 0 else []
    head = bytes([(i & 1) | (len(stops) << 1)]) + b"".join(bytes([len(s)]) + s for s in stops)
    put("harmony", "stream%02d" % i, head + b"".join(struct.pack("<I", t) for t in ids))

# conversation / server-request: Chat Completions bodies.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather at a place",
          "parameters": {"type": "object", "properties": {"location": {"type": "string"},
          "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["location"]}}}]
bodies = [
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Answer in French."},
                  {"role": "user", "content": "Weather in Tokyo?"},
                  {"role": "assistant", "reasoning_content": "Call the tool.", "tool_calls": [{"id": "call_1",
                   "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Tokyo\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
                  {"role": "assistant", "content": "21 °C."}, {"role": "user", "content": "Thanks"}],
     "tools": tools, "reasoning_effort": "high"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], "reasoning_effort": "low"},
    {"messages": [{"role": "tool", "content": "orphan"}]},
]
for i, b in enumerate(bodies):
    put("conversation", "body%d.json" % i, json.dumps(b, ensure_ascii=False))
    put("server-request", "body%d.json" % i, json.dumps(dict(b, model="gpt-oss-20b", temperature=0.7, top_p=0.9,
        max_tokens=64, seed=1, stop=["\n\n", "END"], stream=bool(i % 2), stream_options={"include_usage": True}),
        ensure_ascii=False))
put("server-request", "tool-choice.json", json.dumps(dict(bodies[1], tool_choice="none", n=1, stop="x")))
put("server-request", "bad.json", json.dumps({"messages": [], "temperature": 3, "logprobs": True}))

# JSON Schemas (constrained decoding), each followed by a NUL and a document to match.
schema_dir = os.path.join(os.path.dirname(out), "..", "data", "schema")
docs = {"weather.json": '{"city": "Oslo", "unit":"celsius", "tags":["a"]}',
        "nested.json": '{"user":{"name":"x","address":{"country":"NO"}},"tags":["a","c"]}',
        "unions.json": '{"v":null,"w":true,"c":"fixed","o":{"kind":"circle","r":1.5e2}}',
        "refs.json": '{"a":{"x":1,"y":-2},"pair":["ab",3],"when":"2024-05-17"}'}
for name, doc in sorted(docs.items()):
    put("schema", name, open(os.path.join(schema_dir, name), "rb").read().strip() + b"\0" + doc.encode())
put("schema", "any.json", b'{}\0[1, {"k": "\\u00e9"}, "s", true]')
put("schema", "recursive.json", b'{"$defs":{"t":{"type":"array","items":{"$ref":"#/$defs/t"}}},"$ref":"#/$defs/t"}\0[[[]],[]]')
put("schema", "unsupported.json", b'{"type":"string","pattern":"^a"}')
PY
ls "$here/corpus" | while read -r d; do echo "$d: $(ls "$here/corpus/$d" | wc -l) seeds"; done
