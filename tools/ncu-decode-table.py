#!/usr/bin/env python3
"""tools/ncu-decode-table.py - per-op table of one decode step from Nsight Compute's raw CSV
(tools/device-decode-breakdown.sh: `ncu --csv --page raw` over the decode kernels of one step). The step
is found as the launches from the embed RMSNorm before the first decode attention: embed norm,
then per layer QKV, attention, O, router, gate_up, down, combine, then the lm_head. Prints one
line per op (mean over layers): µs, MB read from DRAM, GB/s, issue rate per scheduler, achieved
occupancy, the three largest stall reasons (cycles per issued instruction), and the sums.
Usage: ncu-decode-table.py NCU.csv"""
import csv
import re
import sys

OPS = ["qkv", "attn", "o", "router", "gate_up", "down", "combine"]


def main(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    if len(rows) < 3:
        print("no ncu rows in", path)
        return
    head = rows[0]
    col = {k: i for i, k in enumerate(head)}
    data = [r for r in rows[2:] if r[col["Kernel Name"]]]

    def f(r, k):
        i = col.get(k)
        if i is None:
            return 0.0
        try:
            return float(r[i].replace(",", ""))
        except ValueError:
            return 0.0

    def first(r, keys):
        for k in keys:
            if k in col:
                return f(r, k)
        return 0.0

    stall_cols = [(m.group(1), i) for k, i in col.items()
                  for m in [re.match(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$", k)] if m]
    if not stall_cols:
        stall_cols = [(m.group(1), i) for k, i in col.items()
                      for m in [re.match(r"smsp__average_warp_latency_issue_stalled_(\w+)\.ratio$", k)] if m]
    names = [r[col["Kernel Name"]] for r in data]
    start = next((i for i, n in enumerate(names) if "attention_decode" in n), None)
    if start is None or start < 2:
        print("no decode step found;", len(data), "rows")
        return
    start -= 2
    n_layers = 0
    while start + 1 + 7 * (n_layers + 1) <= len(data) and "attention_decode" in names[start + 2 + 7 * n_layers]:
        n_layers += 1
    groups = {"embed norm": [data[start]]}
    for l in range(n_layers):
        for k, op in enumerate(OPS):
            groups.setdefault(op, []).append(data[start + 1 + 7 * l + k])
    if start + 1 + 7 * n_layers < len(data):
        groups["lm_head"] = [data[start + 1 + 7 * n_layers]]
    print(f"{len(data)} launches profiled; decode step from launch {start}, {n_layers} layers")
    print(f"{'op':<11} {'n':>3} {'kernel (grid)':<44} {'us':>7} {'MB':>8} {'GB/s':>6} {'IPC/sch':>7} "
          f"{'occ%':>5}  top stalls (cycles per issue)")
    tot_us = 0.0
    for op, rs in groups.items():
        n = len(rs)
        us = sum(f(r, "gpu__time_duration.sum") for r in rs) / n / 1000.0
        mb = sum(f(r, "dram__bytes_read.sum") for r in rs) / n / 1e6
        ipc = sum(first(r, ["smsp__issue_active.avg.per_cycle_active"]) for r in rs) / n
        occ = sum(first(r, ["sm__warps_active.avg.pct_of_peak_sustained_active"]) for r in rs) / n
        st = sorted(((sum(float(r[i].replace(",", "") or 0) for r in rs) / n, s) for s, i in stall_cols), reverse=True)[:3]
        kname = re.sub(r"\(.*", "", rs[0][col["Kernel Name"]]).replace("void ", "").replace("(anonymous namespace)::", "")
        grid = rs[0][col["launch__grid_size"]] if "launch__grid_size" in col else "?"
        kn = (kname[:34] + " " + grid)[:44]
        print(f"{op:<11} {n:>3} {kn:<44} {us:>7.2f} {mb:>8.2f} {mb / us * 1e3 if us else 0:>6.0f} {ipc:>7.2f} "
              f"{occ:>5.1f}  " + ", ".join(f"{s} {v:.1f}" for v, s in st))
        tot_us += us * n
    print(f"step sum (each kernel alone, no PDL overlap): {tot_us:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
