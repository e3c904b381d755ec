#!/usr/bin/env bash
# Fetches cuobjdump and nvdisasm (SASS disassemblers) for the build machine, which has nvcc but
# no GPU and no disassembler: Debian's nvidia-cuda-toolkit package (sid, non-free; CUDA 12.4),
# extracted into a folder outside the system (no root, nothing installed). Their 12.4 versions read
# the sm_90a cubins nvcc 13 writes (`nvcc -cubin`); the 11.8 of bookworm does not. Used by
# tools/sass-count.py to count a kernel's instructions per loop before a device call
# (bench/NOTES.md "v37"). Usage: tools/fetch-sass-tools.sh [DIR] (default .sass-tools), then
# DIR/usr/bin/cuobjdump -sass FILE.cubin.
set -euo pipefail
dir="$(realpath -m "${1:-.sass-tools}")"
if [ -x "$dir/usr/bin/cuobjdump" ]; then echo "$dir/usr/bin/cuobjdump"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
echo "deb http://deb.debian.org/debian sid non-free" > "$tmp/sources.list"
apt_opts=(-o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=/dev/null
          -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1
          -o APT::Sandbox::User="$(id -un)")
apt-get "${apt_opts[@]}" update > "$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; exit 1; }
(cd "$tmp" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit > "$tmp/download.log" 2>&1) \
    || { cat "$tmp/download.log" >&2; exit 1; }
mkdir -p "$dir"
dpkg-deb --fsys-tarfile "$tmp"/nvidia-cuda-toolkit_*.deb | tar -x -C "$dir" ./usr/bin/cuobjdump ./usr/bin/nvdisasm
echo "$dir/usr/bin/cuobjdump"
