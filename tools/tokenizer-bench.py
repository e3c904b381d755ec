#!/usr/bin/env python3
# tools/tokenizer-bench.py - gptoss's tokenizer against the real tiktoken, side by side in one
# run: builds a deterministic mixed corpus (>= 10 MB: the repository's prose, C++/Python/JS/shell
# source and JSON, plus the multilingual texts of tests/data/tokenizer), times tiktoken's
# encode_ordinary (single thread, o200k_base loaded from a local .tiktoken file, no network) and
# gptoss-tokenizer-bench on the same bytes, checks that the ids are identical, and prints
# both MB/s and the ratio as JSON.
#
#   python3 tools/tokenizer-bench.py --bench build/gptoss-tokenizer-bench \
#       --tiktoken-file o200k_base.tiktoken --tokenizer-json DIR/tokenizer.json [--out FILE]
import argparse
import array
import base64
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_EXTENSIONS = (".md", ".h", ".hpp", ".cpp", ".c", ".cu", ".cuh", ".py", ".mjs", ".js", ".sh", ".txt",
                   ".rs", ".go", ".toml", ".json")
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_corpus(min_bytes):
    parts = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("build"))
        for name in sorted(filenames):
            if not name.endswith(TEXT_EXTENSIONS) or name == "unicode-tables.cpp":
                continue
            path = os.path.join(dirpath, name)
            if os.path.getsize(path) > 4 << 20:
                continue
            with open(path, "rb") as f:
                data = f.read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if name == "tiktoken-vectors.json":
                # The multilingual texts themselves, not the ids; without the 10k-character
                # single pieces, which measure the long-piece merge rather than typical text.
                text = "\n".join(c["text"] for c in json.loads(text)["cases"] if c["group"] != "long")
            elif name.endswith(".json"):
                continue  # other goldens are mostly numbers
            parts.append(text)
    base = "\n".join(parts)
    if not base:
        sys.exit("tokenizer-bench: no text files found under " + ROOT)
    # Repeat with a changing separator so the copies do not line up byte for byte.
    out, i = [], 0
    size = 0
    while size < min_bytes:
        chunk = base + f"\n\n# copy {i}\n\n"
        out.append(chunk)
        size += len(chunk.encode("utf-8"))
        i += 1
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of gptoss-tokenizer-bench")
    ap.add_argument("--tiktoken-file", required=True, help="o200k_base.tiktoken")
    ap.add_argument("--tokenizer-json", required=True, help="gpt-oss tokenizer.json")
    ap.add_argument("--min-mb", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    corpus = build_corpus(int(args.min_mb * 1e6))
    data = corpus.encode("utf-8")
    result = {"corpus_bytes": len(data), "corpus_chars": len(corpus)}
    tmp = tempfile.mkdtemp(prefix="tokenizer-bench-")
    corpus_path = os.path.join(tmp, "corpus.txt")
    with open(corpus_path, "wb") as f:
        f.write(data)

    import tiktoken
    result["tiktoken_version"] = tiktoken.__version__
    # What tiktoken.load.load_tiktoken_bpe does, without its blobfile dependency for local paths.
    ranks = {}
    with open(args.tiktoken_file, "rb") as f:
        for line in f.read().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    enc = tiktoken.Encoding(name="o200k_base_local", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens={})
    best = float("inf")
    ids_ref = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        ids_ref = enc.encode_ordinary(corpus)
        best = min(best, time.perf_counter() - t0)
    result["tiktoken_encode_ordinary_s"] = round(best, 4)
    result["tiktoken_mb_per_s"] = round(len(data) / best / 1e6, 2)
    result["tiktoken_tokens"] = len(ids_ref)

    ids_path = os.path.join(tmp, "ids.bin")
    for flag, path, key in (("--tokenizer-json", args.tokenizer_json, "gptoss_json"),
                            ("--tiktoken", args.tiktoken_file, "gptoss_tiktoken")):
        cmd = [args.bench, flag, path, "--corpus", corpus_path, "--repeat", str(args.repeat), "--ids-out", ids_path]
        ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        ids = array.array("i")
        with open(ids_path, "rb") as f:
            ids.frombytes(f.read())
        ours["ids_identical_to_tiktoken"] = ids.tolist() == ids_ref
        if not ours["ids_identical_to_tiktoken"]:
            first = next((i for i, (a, b) in enumerate(zip(ids, ids_ref)) if a != b), min(len(ids), len(ids_ref)))
            ours["first_difference_at_token"] = first
        result[key] = ours
    result["ratio_gptoss_over_tiktoken"] = round(result["gptoss_json"]["encode_mb_per_s"] / result["tiktoken_mb_per_s"], 2)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
