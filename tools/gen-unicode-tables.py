#!/usr/bin/env python3
# tools/gen-unicode-tables.py - generates tokenizer/unicode-tables.cpp, the code point classes
# the o200k pre-tokenizer needs (HARMONY.md §1.3), from one of two copies of the Unicode
# Character Database (General_Category and White_Space are all it reads):
#   --unicode-npm DIR  the unpacked npm package @unicode/unicode-<version> (node-unicode-data):
#                      General_Category/<Name>/ranges.mjs, Binary_Property/White_Space/ranges.mjs.
#                      This is how the committed table is made (Unicode 16.0.0, the version of
#                      tiktoken's regex-syntax 0.8.5); tokenizer/README.md says how to fetch it.
#   --ucd DIR          UnicodeData.txt + PropList.txt + ReadMe.txt, e.g. Debian's `unicode-data`
#                      package (/usr/share/unicode; Debian 12 ships 15.0.0). The default.
# Output: a two-stage table, one flag byte per code point, blocks of 128 code points
# deduplicated. Either input gives the same format; the header names the version and source.
#   python3 tools/gen-unicode-tables.py --unicode-npm /tmp/u16/package > tokenizer/unicode-tables.cpp
import argparse
import json
import os
import re
import sys
import textwrap

# Flag bits; tokenizer/unicode.h declares the same values.
LETTER = 1   # \p{L}
NUMBER = 2   # \p{N}
UPPER = 4    # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]  (the "head" class of branches 1-2)
LOWER = 8    # [\p{Ll}\p{Lm}\p{Lo}\p{M}]        (the "tail" class of branches 1-2)
SPACE = 16   # \s = White_Space
BLOCK = 128
N_CODE_POINTS = 0x110000

# The 30 General_Category values: long name (the npm package's folder names) -> short name.
CATEGORIES = {
    "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll", "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
    "Decimal_Number": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
    "Other_Punctuation": "Po",
    "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So",
    "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp",
    "Control": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}


def category_flags(gc):
    f = 0
    if gc[0] == "L":
        f |= LETTER
    if gc[0] == "N":
        f |= NUMBER
    if gc in ("Lu", "Lt", "Lm", "Lo") or gc[0] == "M":
        f |= UPPER
    if gc in ("Ll", "Lm", "Lo") or gc[0] == "M":
        f |= LOWER
    return f


# --- input 1: the UCD text files ---------------------------------------------------------------
def read_ucd(ucd):
    """Returns (version, source, gc, white_space): gc[cp] is the short category ("Cn" if absent),
    white_space the set of White_Space code points."""
    version = "unknown"
    with open(os.path.join(ucd, "ReadMe.txt"), encoding="utf-8") as f:
        m = re.search(r"for Version (\d+\.\d+\.\d+)", f.read())
        if m:
            version = m.group(1)

    gc = ["Cn"] * N_CODE_POINTS
    first = None
    with open(os.path.join(ucd, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.split(";")
            cp, name, cat = int(fields[0], 16), fields[1], fields[2]
            if name.endswith(", First>"):
                first = cp
                continue
            lo = first if name.endswith(", Last>") else cp
            first = None
            for c in range(lo, cp + 1):
                gc[c] = cat

    white_space = set()
    with open(os.path.join(ucd, "PropList.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            rng, prop = [x.strip() for x in line.split(";")]
            if prop != "White_Space":
                continue
            lo, _, hi = rng.partition("..")
            white_space.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    source = f"Unicode Character Database {version} (UnicodeData.txt + PropList.txt in {ucd})"
    return version, source, gc, white_space


# --- input 2: the npm package @unicode/unicode-<version> ---------------------------------------
# Each <property>/<value>/ranges.mjs holds one string literal, decodeRanges('...'), in the
# package's encoding (its decode-ranges.mjs): base64url digits (A-Z a-z 0-9 - _ = 0..63) form
# variable-length numbers. A first digit below 32 is the number itself; 32..47 starts a 10-bit
# number (low 4 bits, then one more digit), 48..55 a 15-bit one (low 3 bits, two more digits),
# 56..63 a 21-bit one (low 3 bits, three more digits). The numbers come in pairs (gap, extra):
# a range starts 1 + gap code points after the end (one past the last code point) of the
# previous one, the first at `gap`, and holds 1 + extra code points. Ranges therefore never touch.
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def decode_ranges(text):
    digit = {c: i for i, c in enumerate(B64)}
    numbers, i = [], 0
    while i < len(text):
        x = digit[text[i]]
        i += 1
        more = 0 if x < 32 else 1 if x < 48 else 2 if x < 56 else 3
        x &= 15 if more == 1 else 7 if more else 31
        for _ in range(more):
            x = (x << 6) | digit[text[i]]
            i += 1
        numbers.append(x)
    if len(numbers) % 2:
        raise ValueError("odd count of numbers in a ranges.mjs string")
    ranges, end = [], -1  # end: one past the previous range (-1 before the first)
    for gap, extra in zip(numbers[0::2], numbers[1::2]):
        lo = end + 1 + gap
        end = lo + 1 + extra
        ranges.append((lo, end - 1))  # inclusive
    return ranges


def read_npm_ranges(path):
    with open(path, encoding="utf-8") as f:
        m = re.search(r"decodeRanges\('([A-Za-z0-9_-]*)'\)", f.read())
    if not m:
        raise ValueError(f"{path}: no decodeRanges('...') literal")
    return decode_ranges(m.group(1))


def read_unicode_npm(pkg):
    with open(os.path.join(pkg, "package.json"), encoding="utf-8") as f:
        meta = json.load(f)
    m = re.fullmatch(r"@unicode/unicode-(\d+\.\d+\.\d+)", meta["name"])
    if not m:
        raise ValueError(f"{pkg}: package {meta['name']} is not @unicode/unicode-<version>")
    version = m.group(1)

    gc = [None] * N_CODE_POINTS
    for long_name, short in CATEGORIES.items():
        for lo, hi in read_npm_ranges(os.path.join(pkg, "General_Category", long_name, "ranges.mjs")):
            for c in range(lo, hi + 1):
                if gc[c] is not None:
                    raise ValueError(f"U+{c:04X} is both {gc[c]} and {short}")
                gc[c] = short
    missing = [c for c in range(N_CODE_POINTS) if gc[c] is None]
    if missing:  # the 30 categories partition the code space; anything else is a decoding bug
        raise ValueError(f"{len(missing)} code points have no category, first U+{missing[0]:04X}")

    white_space = set()
    for lo, hi in read_npm_ranges(os.path.join(pkg, "Binary_Property", "White_Space", "ranges.mjs")):
        white_space.update(range(lo, hi + 1))
    source = (f"Unicode Character Database {version} (npm package {meta['name']}@{meta['version']}: "
              "General_Category/*, Binary_Property/White_Space)")
    return version, source, gc, white_space


# --- output ------------------------------------------------------------------------------------
def flag_table(gc, white_space):
    flags = bytearray(category_flags(cat) for cat in gc)
    for c in white_space:
        flags[c] |= SPACE
    return flags


def write_table(out, version, source, flags):
    blocks, index = {}, []
    for b in range(N_CODE_POINTS // BLOCK):
        chunk = bytes(flags[b * BLOCK:(b + 1) * BLOCK])
        index.append(blocks.setdefault(chunk, len(blocks)))
    assert len(blocks) < 65536

    out.write("// tokenizer/unicode-tables.cpp - GENERATED by tools/gen-unicode-tables.py; do not edit.\n")
    for line in textwrap.wrap(f"Source: {source}.", width=97):
        out.write(f"// {line}\n")
    out.write("// One flag byte per code point (tokenizer/unicode.h), as a two-stage table:\n")
    out.write(f"// kUnicodeStage1[cp / {BLOCK}] picks a block of {BLOCK} flag bytes in kUnicodeStage2.\n")
    out.write(f"// {len(blocks)} distinct blocks.\n")
    out.write('#include "tokenizer/unicode.h"\n\nnamespace gptoss {\n\n')
    out.write(f'const char kUnicodeVersion[] = "{version}";\n\n')
    out.write(f"const uint16_t kUnicodeStage1[{len(index)}] = {{\n")
    for i in range(0, len(index), 16):
        out.write("    " + ", ".join(str(x) for x in index[i:i + 16]) + ",\n")
    out.write("};\n\n")
    out.write(f"const uint8_t kUnicodeStage2[{len(blocks) * BLOCK}] = {{\n")
    for chunk in blocks:  # dicts keep insertion order == block number
        for i in range(0, BLOCK, 32):
            out.write("    " + ",".join(str(x) for x in chunk[i:i + 32]) + ",\n")
    out.write("};\n\n}  // namespace gptoss\n")


def main():
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--ucd", help="folder with UnicodeData.txt, PropList.txt, ReadMe.txt "
                     "(default /usr/share/unicode)")
    src.add_argument("--unicode-npm", help="the unpacked npm package @unicode/unicode-<version>")
    args = ap.parse_args()

    if args.unicode_npm:
        version, source, gc, white_space = read_unicode_npm(args.unicode_npm)
    else:
        version, source, gc, white_space = read_ucd(args.ucd or "/usr/share/unicode")
    write_table(sys.stdout, version, source, flag_table(gc, white_space))


if __name__ == "__main__":
    main()
