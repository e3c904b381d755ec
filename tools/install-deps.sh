#!/usr/bin/env bash
# Installs the Debian packages gptoss needs, and says which. Run by `make`.
#   build: cmake, g++, libsimdjson-dev, doctest-dev, libedit-dev (line editing in gptoss-chat),
#          libcpp-httplib-dev (HTTP for gptoss-server), pkg-config (finds it)
#   tests: clang + libclang-rt-dev (the clang build, sanitizer and fuzz runtimes: make test),
#          libsimde-dev (test-host-experts-simde: the AVX2/AVX-512 expert kernels emulated),
#          tmux (drives gptoss-chat in a real terminal), npm (fetches the tokenizer and the
#          OpenAI SDK that drives gptoss-server), curl (raw HTTP checks of the server),
#          python3, golang-go (binding tests; cargo is used if installed)
set -euo pipefail
need=()
for pkg in cmake g++ clang libclang-rt-dev libsimdjson-dev doctest-dev libsimde-dev libedit-dev libcpp-httplib-dev pkg-config tmux npm curl python3 golang-go; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
# Tools that may come from outside Debian (pyenv python, nodesource npm) count as present.
filtered=()
for pkg in "${need[@]:-}"; do
  case "$pkg" in
    npm) command -v npm >/dev/null || filtered+=(npm) ;;
    python3) command -v python3 >/dev/null || filtered+=(python3) ;;
    cmake) command -v cmake >/dev/null || filtered+=(cmake) ;;
    g++) command -v g++ >/dev/null || filtered+=(g++) ;;
    "") ;;
    *) filtered+=("$pkg") ;;
  esac
done
[ ${#filtered[@]} -eq 0 ] && exit 0
echo "gptoss: installing missing Debian packages: ${filtered[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${filtered[@]}"
