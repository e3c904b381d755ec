#!/usr/bin/env bash
# Installs the official OpenAI Node SDK (npm package openai, pinned) into a cache outside git,
# for tests/test-server.sh, which drives gptoss-server with it: a real client none of us wrote.
# Prints the directory holding node_modules/openai. Run by the test; needs npm.
set -euo pipefail
version="4.104.0"
dir="${GPTOSS_OPENAI_NODE_DIR:-$HOME/.cache/gptoss/openai-node-$version}"
if [ ! -f "$dir/node_modules/openai/package.json" ]; then
  echo "gptoss: installing openai@$version from npm into $dir" >&2
  tmp="$dir.tmp-$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund "openai@$version" >&2)
  rm -rf "$dir"
  mv "$tmp" "$dir"
fi
echo "$dir"
