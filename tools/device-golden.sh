#!/usr/bin/env bash
# device-golden.sh - the one GPU-machine call behind tests/data/golden/: builds gptoss-synth
# (standalone, plain g++), writes the tiny checkpoint (preset tiny, seed 1: what the synth-tiny
# ctest fixture writes) and a variant whose H, I, D, Q/G and E all differ (so a confused axis
# shows), runs tools/golden.py (transformers oracle) on each, and times gptoss-synth and
# load_checkpoint on the 20b shape. Results go to $OUT. Run from the repository root, with
# .deps (simdjson) carried:   OUT=/tmp/out bash tools/device-golden.sh
set -uo pipefail
OUT=${OUT:-/tmp/golden-out}
DEPS=${DEPS:-$PWD/.deps/usr}
VARIANT="--preset tiny --seed 2 --layers 3 --hidden 96 --intermediate 160 --heads 8 --kv-heads 2 --experts 6 --vocab 8192"
mkdir -p "$OUT"
exec > >(tee "$OUT/device-golden.log") 2>&1
echo "== $(date -u) $(hostname) $(nproc) cores; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
g++ --version | head -1
g++ -O2 -std=c++17 -Wall -Wextra -Werror -I. -pthread tools/gptoss-synth.cpp -o /tmp/gptoss-synth || exit 1
/tmp/gptoss-synth --preset tiny --seed 1 --out /tmp/tiny || exit 1
/tmp/gptoss-synth $VARIANT --out /tmp/variant || exit 1
sha256sum /tmp/tiny/*.safetensors /tmp/variant/*.safetensors
PYTHONUNBUFFERED=1 python3 tools/golden.py --model /tmp/tiny --out "$OUT/tiny-seed1.json" \
    --params-out "$OUT/transformers-params.txt" --synth-command "gptoss-synth --preset tiny --seed 1"
echo "== golden.py tiny exit status $?"
PYTHONUNBUFFERED=1 python3 tools/golden.py --model /tmp/variant --out "$OUT/variant-seed2.json" \
    --synth-command "gptoss-synth $VARIANT"
echo "== golden.py variant exit status $?"

[ "${SKIP_20B:-0}" = 1 ] && exit 0
# 20b shape: gptoss-synth (generation + page cache, then to disk), then load_checkpoint.
cat > /tmp/load-time.cpp <<'CPP'
#include "gptoss-internal.h"
#include <chrono>
#include <cstdio>
namespace gptoss {
static char msg[4096];
gptoss_status fail(gptoss_status s, const char* f, ...) { va_list a; va_start(a, f); vsnprintf(msg, sizeof msg, f, a); va_end(a); return s; }
void log(gptoss_log_level, const char* f, ...) { va_list a; va_start(a, f); vfprintf(stderr, f, a); fputc('\n', stderr); va_end(a); }
}
int main(int, char** argv) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<gptoss::Checkpoint> c;
    gptoss_status s = gptoss::load_checkpoint(argv[1], {}, &c);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    printf("load_checkpoint(%s): status %d %s, %.1f ms, %.3f GB of tensors, %zu files\n", argv[1], int(s),
           gptoss::msg, ms, s == 0 ? double(c->total_bytes) / 1e9 : 0.0, s == 0 ? c->files.size() : 0);
    return s;
}
CPP
g++ -O2 -std=c++17 -I. -I"$DEPS/include" /tmp/load-time.cpp gptoss-loader.cpp -L"$DEPS/lib/x86_64-linux-gnu" \
    -Wl,-rpath,"$DEPS/lib/x86_64-linux-gnu" -lsimdjson -o /tmp/load-time && /tmp/load-time /tmp/tiny
df -h /tmp | tail -1
start=$(date +%s.%N)
/tmp/gptoss-synth --preset 20b --seed 1 --out /tmp/s20b
mid=$(date +%s.%N)
sync
end=$(date +%s.%N)
du -sh /tmp/s20b; ls -la /tmp/s20b
python3 -c "import sys; a,b,c=map(float,sys.argv[1:]); print(f'== 20b synth: {b-a:.2f} s to return, {c-a:.2f} s including sync')" $start $mid $end
[ -x /tmp/load-time ] && /tmp/load-time /tmp/s20b
rm -rf /tmp/s20b
