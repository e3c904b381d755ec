// tools/tiktoken-vectors.mjs - produces tests/data/tokenizer/tiktoken-vectors.json: token ids
// from the real tiktoken (npm `tiktoken`, a WASM build of the openai/tiktoken Rust core) for a
// corpus covering what issue 3 lists, and optionally the o200k_base.tiktoken file that
// tools/tokenizer-bench.py and Tokenizer::load_tiktoken read. Deterministic (fixed seed).
//
//   mkdir /tmp/tk && (cd /tmp/tk && npm install tiktoken@1.0.22)
//   node tools/tiktoken-vectors.mjs --node-modules /tmp/tk/node_modules \
//        --out tests/data/tokenizer/tiktoken-vectors.json [--tiktoken-out o200k_base.tiktoken]
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const nodeModules = args["node-modules"] ?? "node_modules";
const require = createRequire(path.resolve(nodeModules, "x.cjs"));
const { Tiktoken } = require("tiktoken/lite");
const o200k = require("tiktoken/encoders/o200k_base.json");
const tiktokenVersion = JSON.parse(fs.readFileSync(path.resolve(nodeModules, "tiktoken/package.json"), "utf8")).version;

// o200k_harmony: Python tiktoken's o200k_harmony() table (HARMONY.md §1.2): o200k_base's own
// specials (<|endoftext|>, <|endofprompt|>) plus the harmony names and <|reserved_N|> for
// 200013..201087, so text may spell 200018 two ways. (Which name a decoder shows for 200018
// depends on hash-map order: the WASM build shows <|reserved_200018|>; gptoss <|endofprompt|>.)
const special = {
  "<|endofprompt|>": 200018,
  "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|reserved_200000|>": 200000,
  "<|reserved_200001|>": 200001, "<|return|>": 200002, "<|constrain|>": 200003,
  "<|reserved_200004|>": 200004, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
  "<|message|>": 200008, "<|reserved_200009|>": 200009, "<|reserved_200010|>": 200010,
  "<|reserved_200011|>": 200011, "<|call|>": 200012,
};
for (let i = 200013; i < 201088; i++) special[`<|reserved_${i}|>`] = i;
const enc = new Tiktoken(o200k.bpe_ranks, special, o200k.pat_str);

// The .tiktoken file: "base64 rank" per line, rank order. bpe_ranks is "! <first rank> b64 b64 ...".
if (args["tiktoken-out"]) {
  const lines = [];
  for (const line of o200k.bpe_ranks.split("\n")) {
    const parts = line.split(" ");
    if (parts.length < 2) continue;
    let rank = Number(parts[1]);
    for (const b64 of parts.slice(2)) lines.push(`${b64} ${rank++}`);
  }
  fs.writeFileSync(args["tiktoken-out"], lines.join("\n") + "\n");
}

// --- corpus -------------------------------------------------------------------------------
let seed = 0x9e3779b9;
function rand() {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const cases = [];
const add = (group, text, allowSpecial = false) => cases.push({ group, allow_special: allowSpecial, text });

// English prose.
add("prose", "The quick brown fox jumps over the lazy dog. It's a well-known pangram; isn't it?");
add("prose", `It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light,
it was the season of Darkness. "Well," said Mr. O'Brien -- who'd arrived at 3:45 p.m. -- "we'll see."

Section 2.1(b): The U.S.A. & the E.U. signed the agreement on Jan. 5th, 2024 (see footnote [12]).
HELLO WORLD!!! camelCaseWords, XMLHttpRequest, iPhone, McDonald's, O'NEIL'S, e-mail, well‐being…`);
add("prose", "Dear Sir/Madam,\r\n\r\nPlease find attached the invoice #A-1029 for $1,234.56 (USD).\r\nRegards,\r\nJ. Smith   \r\n");

// Source code.
add("python", `import os, sys
from typing import Dict, List

class Tokenizer:
    """Byte-level BPE."""
    def __init__(self, ranks: Dict[bytes, int]) -> None:
        self.ranks = ranks  # bytes -> rank
        self._cache = {}

    def encode(self, text: str) -> List[int]:
        if not text:
            return []
        return [self.ranks[b] for b in text.encode("utf-8")]

if __name__ == "__main__":
\tprint(f"{len(sys.argv)=}", file=sys.stderr)
`);
add("cpp", `#include <cstdio>
#include <vector>

// Sums the vector; returns 0 for an empty one.
template <typename T>
static T sum(const std::vector<T>& xs) {
    T total{};
    for (const T& x : xs) total += x;   // no overflow check
    return total;
}

int main(int argc, char** argv) {
    std::vector<int> v{1, 2, 3, 0x7fffffff, -42};
    std::printf("%d\\n", sum(v));
    return argc > 1 ? 1 : 0;
}
`);
add("json", `{"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
 "temperature": 0.7, "max_tokens": 1024, "stop": ["<|end|>", "\\n\\n"], "nested": {"a": [1, 2.5e-3, null, true]},
 "unicode": "caf\\u00e9 \u00e9t\u00e9", "empty": {}, "list": []}`);
add("shell", `#!/usr/bin/env bash
set -euo pipefail
for f in "$@"; do
  if [[ -f "$f" ]]; then
    wc -l "$f" | awk '{print $1}' >> /tmp/out.txt 2>&1
  fi
done
echo "done: $(date +%Y-%m-%d)" && exit 0
`);
add("code", "a/b/c//d///e\n./path/to/file.txt\r\nC:\\Windows\\System32 ~/.bashrc http://example.com/a?b=c&d=e#f");

// Whitespace runs.
const spaces = [" ", "\t", "\n", "\r\n", "\r", "\u000b", "\u000c", "\u0085", "\u00a0", "\u1680", "\u2000", "\u200a",
  "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\u200b"];
const after = ["", "x", "X", "1", "!", "\n", "é", "中", "'s", " "];
for (const s of spaces) {
  for (const n of [1, 2, 3, 5, 17]) {
    for (const a of after) add("whitespace", "a" + s.repeat(n) + a);
    add("whitespace", s.repeat(n));
  }
}
for (let i = 0; i < 300; i++) {
  let t = "";
  const len = 1 + Math.floor(rand() * 12);
  for (let j = 0; j < len; j++) t += pick([...spaces, " ", " ", "\n", "w", "W", "7", ".", "'"]);
  add("whitespace-mix", t);
}
add("whitespace", "trailing spaces   \nand tabs\t\t\n\n   \n\t \r\n  end   ");

// Embedded NUL bytes and other C0 controls are ordinary text.
add("controls", "a\u0000b");
add("controls", "\u0000\u0000 \u0000x\u0000\n\u0000 1\u0000");
add("controls", "\u0001\u0002\u001b[31mred\u001b[0m\u007f\u0080\u009f");

// Numbers of every length and mixed digits.
for (let n = 1; n <= 25; n++) {
  let digits = "";
  for (let j = 0; j < n; j++) digits += String(Math.floor(rand() * 10));
  add("numbers", digits);
  add("numbers", "x" + digits + "y");
  add("numbers", " " + digits + ".");
}
add("numbers", "1,234,567.89 -0.5e-10 0x1F 1_000_000 3.14159265358979 2024-01-05 12:30:45 +1 (555) 010-9999");
add("numbers", "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ १२३४५ ๑๒๓๔ ０１２３４ ¹²³⁴ ½¾⅓ ⅠⅡⅢⅫ 𝟘𝟙𝟚𝟛 ①②③ 1٢3४5");
add("numbers", "12٣45६78９0");

// Contractions in every case.
const suffixes = ["s", "t", "re", "ve", "m", "ll", "d"];
for (const suf of suffixes) {
  const variants = new Set();
  for (let mask = 0; mask < 1 << suf.length; mask++) {
    let v = "";
    for (let k = 0; k < suf.length; k++) v += mask & (1 << k) ? suf[k].toUpperCase() : suf[k];
    variants.add(v);
  }
  for (const v of variants) {
    for (const word of ["it", "IT", "It", "we", "WE", "x", "中", "1", " ", ""]) add("contractions", `${word}'${v} ok`);
  }
}
add("contractions", "it'ſ ok ſ 'ſ IT'ſ don’t it’s I'M y'all rock'n'roll 'tis ''s '''ll can't've");

// Scripts.
add("cjk", "你好世界。我们今天去公园散步，天气很好！中文分词是一个难题。");
add("cjk", "こんにちは、世界！カタカナとひらがな、漢字が混ざった文章です。ｶﾀｶﾅ半角。");
add("cjk", "안녕하세요, 세계! 한국어 문장입니다. 한글 자모: ㄱㄴㄷ ᄀᄂᄃ");
add("arabic", "مرحبا بالعالم! هذه جملة عربية مع تشكيل: بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ");
add("hebrew", "שלום עולם! עִבְרִית עם ניקוד, ומספרים 123.");
add("devanagari", "नमस्ते दुनिया! हिन्दी में क्षत्रिय, द्वितीय, श्री। संस्कृतम्");
add("thai", "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ น้ำ ที่ ผู้ใหญ่");
add("other-scripts", "Привет, мир! Ελληνικά: Καλημέρα. Ünïcödé naïve naïve café résumé Straße ǅemal ǈ ǋ");
add("other-scripts", "Ꭳ Ᏸ ᏸ ʰʲ ˢ ᵃ ꜰ 𝐀𝐁𝐂 𝓐 ᴬᴮ ﬁ ﬀ ǅǆ ǲ Ⓐⓑ");
// Emoji.
add("emoji", "💖 👨‍👩‍👧‍👦 👍🏽 👩🏿‍💻 🏳️‍🌈 🇺🇸🇯🇵🇩🇪 🏴󠁧󠁢󠁳󠁣󠁴󠁿 ❤️‍🔥 1️⃣ #️⃣ 🧑‍🤝‍🧑 😀😃😄");
add("emoji", "text😀text 😀, 'emoji' 👋hello 🙂🙃 ☺️");
// Mixed scripts.
add("mixed", "GPT-4o说：“Hello, 世界!” — مرحبا 👋 Привет 123 नमस्ते tschüß ‘quotes’ «guillemets»");
add("mixed", "English中文English日本語한국어العربيةEnglish");
add("mixed", "a\u0301 e\u0301\u0302 \u0301x \u0301 \u0308\u0308 A\u030a ñ ñ");

// Text spelling special tokens, both ways.
const specialText = [
  "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant",
  "<|endoftext|> <|startoftext|>x<|endofprompt|><|reserved_200018|><|reserved_201087|><|reserved_201088|>",
  "<|channel|>analysis<|message|>ok<|call|><|return|><|constrain|>json",
  "<|start|<|end|>> <||> <|nope|> <<|end|>| <|end||> <|END|> <|ReTuRn|>",
  "a<|end|>b c <|end|> d\n<|end|>\n 12<|end|>34 it<|end|>'s",
];
for (const t of specialText) {
  add("special-ordinary", t, false);
  add("special-allowed", t, true);
}

// Long runs (>= 10k characters), kept short enough for the quadratic WASM oracle.
add("long", "a".repeat(12000));
add("long", "a".repeat(100000));  // ~15 s in the quadratic WASM merge; test-tokenizer's timing case uses it
add("long", " ".repeat(10001) + "x");
add("long", "\n".repeat(10000));
add("long", "1234567890".repeat(1100));
add("long", "!?".repeat(6000));
add("long", "中文".repeat(5000));
add("long", "ab".repeat(6000) + "'s");
add("long", "\t \n".repeat(4000));
add("long", "😀".repeat(5000));
{
  const words = ["the", "of", "token", "BPE", "tiktoken", "ids", "é", "中文", "123", "don't", ",", ".", "\n"];
  let t = "";
  while (t.length < 20000) t += pick(words) + pick([" ", " ", " ", "", "  ", "\n"]);
  add("long", t);
}

// Random code points from every plane. Code points unassigned in Unicode 15.0 inside planes
// 0-3 and 14 may be assigned in the Unicode 16.0 tables tiktoken uses, so unassigned ones come
// from planes 4-13 (unassigned in both); see tokenizer/README.md.
const assigned = [];
{
  const lines = fs.readFileSync(args.ucd ?? "/usr/share/unicode/UnicodeData.txt", "utf8").split("\n");
  let first = null;
  for (const line of lines) {
    if (!line) continue;
    const f = line.split(";");
    const cp = parseInt(f[0], 16);
    if (f[1].endsWith(", First>")) { first = cp; continue; }
    const lo = f[1].endsWith(", Last>") ? first : cp;
    if (f[2] === "Cs") continue;
    if (cp - lo > 4096) {  // big ranges (CJK, private use): a sample is enough
      for (let k = 0; k < 64; k++) assigned.push(lo + Math.floor(rand() * (cp - lo + 1)));
    } else {
      for (let c = lo; c <= cp; c++) assigned.push(c);
    }
  }
}
const byPlane = new Map();
for (const c of assigned) {
  const p = c >> 16;
  if (!byPlane.has(p)) byPlane.set(p, []);
  byPlane.get(p).push(c);
}
for (let p = 4; p <= 13; p++) byPlane.set(p, Array.from({ length: 64 }, () => (p << 16) + Math.floor(rand() * 0xfffe)));
const glue = [" ", "a", "A", "'s", "1", ".", "\n", "  "];
for (const [p, cps] of [...byPlane.entries()].sort((a, b) => a[0] - b[0])) {
  for (let i = 0; i < 40; i++) {
    let t = "";
    const len = 1 + Math.floor(rand() * 10);
    for (let j = 0; j < len; j++) t += rand() < 0.25 ? pick(glue) : String.fromCodePoint(pick(cps));
    add(`plane-${p}`, t);
  }
}
// Random code points of the whole BMP + supplementary planes mixed with ASCII.
for (let i = 0; i < 400; i++) {
  let t = "";
  const len = 1 + Math.floor(rand() * 16);
  for (let j = 0; j < len; j++) {
    const r = rand();
    if (r < 0.3) t += pick(glue);
    else if (r < 0.9) t += String.fromCodePoint(pick(assigned));
    else t += String.fromCodePoint(pick(byPlane.get(4 + Math.floor(rand() * 10))));
  }
  add("random-mixed", t);
}

// --- ids ------------------------------------------------------------------------------------
for (const c of cases) {
  c.ids = Array.from(c.allow_special ? enc.encode(c.text, "all") : enc.encode_ordinary(c.text));
}
enc.free();
const out = {
  _about: `GENERATED by tools/tiktoken-vectors.mjs with npm tiktoken@${tiktokenVersion} (WASM build of the ` +
    "openai/tiktoken core; its regex engine is regex-syntax 0.8.5, Unicode 16.0), o200k_base ranks and pat_str from " +
    "tiktoken/encoders/o200k_base.json, o200k_harmony special tokens 199998..201087. allow_special true: " +
    "encode(text, 'all'); false: encode_ordinary(text).",
  cases,
};
fs.writeFileSync(args.out ?? "tiktoken-vectors.json", JSON.stringify(out, null, 0).replace(/\},\{"group"/g, '},\n{"group"') + "\n");
console.error(`${cases.length} cases, ${cases.reduce((n, c) => n + c.ids.length, 0)} ids`);
