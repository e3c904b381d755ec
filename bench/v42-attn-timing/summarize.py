#!/usr/bin/env python3
"""Summarizes the decode-attention phase stamps of bench/v42-attn-timing.patch and bench/v44-attn-timing.patch (bench/NOTES.md "v42", "v44").

Input: the GPTOSS_ATTN_TIMING_OUT file (plain or .gz), one line per CTA: seven %globaltimer values in
ns (entry, K/V requests issued, dependency wait released, q roped, split state done, counter
arrival, merge done or 0) and an info word (split | kv head << 8 | last << 16 | splits << 17 |
SM << 32 | sliding << 48). CTAs are grouped into launches by gaps of more than 5 us between
entries. Prints, per kind of layer, the medians over launches of each phase's last CTA, in us from
the launch's first release from the dependency wait.
Usage: summarize.py FILE
"""
import gzip
import statistics
import sys


def launches(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = sorted((list(map(int, line.split())) for line in f if line.strip()), key=lambda r: r[0])
    out, cur = [], []
    for r in rows:
        if cur and r[0] - cur[-1][0] > 5000:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def main():
    groups = launches(sys.argv[1])
    names = ["first entry", "last entry", "last q roped", "last split done", "last counter", "merge done",
             "CTA issue (med)", "CTA q after wait", "CTA split (med)"]
    for sliding in (0, 1):
        gs = [g for g in groups if (g[0][7] >> 48) & 1 == sliding]
        if not gs:
            continue
        acc = {n: [] for n in names}
        for g in gs:
            w0 = min(r[2] for r in g)
            acc["first entry"].append((min(r[0] for r in g) - w0) / 1e3)
            acc["last entry"].append((max(r[0] for r in g) - w0) / 1e3)
            acc["last q roped"].append((max(r[3] for r in g) - w0) / 1e3)
            acc["last split done"].append((max(r[4] for r in g) - w0) / 1e3)
            acc["last counter"].append((max(r[5] for r in g) - w0) / 1e3)
            acc["CTA issue (med)"].append(statistics.median((r[1] - r[0]) / 1e3 for r in g))
            acc["CTA q after wait"].append(statistics.median((r[3] - r[2]) / 1e3 for r in g if r[2]))
            acc["CTA split (med)"].append(statistics.median((r[4] - r[3]) / 1e3 for r in g))
            merged = [r[6] for r in g if r[6]]
            acc["merge done"].append((max(merged) - w0) / 1e3 if merged else float("nan"))
        ctas = statistics.median(len(g) for g in gs)
        print(f"{'sliding' if sliding else 'full'} layers: {len(gs)} launches, {ctas:.0f} CTAs each")
        for n in names:
            print(f"  {n:16s} {statistics.median(acc[n]):6.2f} us")


if __name__ == "__main__":
    main()
