#!/usr/bin/env bash
# tools/device-ncu.sh - per-kernel hardware timings of the decode step on the GPU machine:
# builds (sm_90a), then runs Nsight Compute over a short gptoss-bench run (a 16-token prefill and
# a few decode steps of the synthetic 20b shape) and writes one CSV row per kernel launch
# (duration, DRAM bytes read, DRAM throughput % of peak, grid) to $OUT/ncu-20b.csv, plus a
# per-kernel-name summary of the last decode step to $OUT/ncu-summary.txt.
# Usage (repository root, GPU machine): tools/device-ncu.sh --deps DIR/.deps [--model 20b|120b]
set -uo pipefail
. "$(dirname "$0")/device-lib.sh"
DEPS="" MODEL=20b
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) DEPS="$2"; shift 2;;
    --model) MODEL="$2"; shift 2;;
    *) echo "device-ncu: unknown option $1"; exit 2;;
  esac
done
OUT="${OUT:-/tmp/device-ncu-out}"
mkdir -p "$OUT"
B=build-gpu
dev_build $B "$OUT/ncu-build.log" gptoss-bench || { tail -40 "$OUT/ncu-build.log"; exit 1; }
timeout 400 ncu --clock-control none --csv --page raw \
  -k regex:"gemm|gemv|router|attention|residual|rope|argmax" --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread \
  ./$B/gptoss-bench --synthetic $MODEL --no-gemm-probe -p 16 -n 2 -d 0 -r 1 > "$OUT/ncu-$MODEL.csv" 2> "$OUT/ncu-$MODEL.err"
echo "ncu rc=$?"
python3 - "$OUT/ncu-$MODEL.csv" <<'PY' | tee "$OUT/ncu-summary-$MODEL.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
idx = {k: head.index(k) for k in head}
data = [r for r in rows[2:] if r[idx["Kernel Name"]]]
def f(r, k):
    try: return float(r[idx[k]].replace(",", ""))
    except Exception: return 0.0
# The last decode step: the kernels after the last lm_head-sized launch, walking back.
names = [r[idx["Kernel Name"]] for r in data]
print(f"{len(data)} kernel launches profiled")
# group by layer position: take the last 24*7+2 launches before the final argmax/lm_head
tail = data[-260:]
agg = collections.OrderedDict()
for r in tail:
    n = r[idx["Kernel Name"]].split("(")[0][:60] + " grid " + r[idx["launch__grid_size"]]
    a = agg.setdefault(n, [0, 0.0, 0.0])
    a[0] += 1; a[1] += f(r, "gpu__time_duration.sum"); a[2] += f(r, "dram__bytes_read.sum")
print(f"{'kernel':<75} {'n':>4} {'us/launch':>10} {'MB/launch':>10} {'GB/s':>8}")
for n, (c, t, b) in agg.items():
    print(f"{n:<75} {c:>4} {t/c/1000:>10.2f} {b/c/1e6:>10.2f} {b/t if t else 0:>8.0f}")
PY
