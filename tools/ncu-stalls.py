#!/usr/bin/env python3
"""tools/ncu-stalls.py - where a kernel's warps wait, from Nsight Compute's source view.

Input: `ncu -i REPORT --page source --csv --print-source sass > SOURCE.csv` of a report taken with
the SourceCounters section (e.g. `ncu --set full` or `--section SourceCounters`; bench/NOTES.md
"v33" ran it on dense_batch_kernel). For each profiled kernel it prints the warp-stall samples by
reason, then the SASS split into regions at its barriers (BAR.SYNC, DEPBAR, cluster barriers,
MEMBAR, EXIT): each region's share of the samples and the instructions executed in it, and the
top instructions by samples with their main reasons. Standard library only.
Usage: ncu-stalls.py SOURCE.csv [--top N]"""
import csv
import sys

MARKS = ("BAR.SYNC", "DEPBAR", "UCGABAR_WAIT", "MEMBAR", "EXIT")


def kernels(path):
    """Yields (name, header, rows) per kernel block of the CSV."""
    name, head, rows = None, None, []
    for r in csv.reader(open(path, errors="replace")):
        if not r:
            continue
        if r[0] == "Kernel Name":
            if head:
                yield name, head, rows
            name, head, rows = r[1], None, []
        elif r[0] == "Address":
            head = r
        elif head:
            rows.append(r)
    if head:
        yield name, head, rows


def num(s):
    try:
        return int(float(s))
    except ValueError:
        return 0


def report(index, name, head, rows, top):
    col = {k: i for i, k in enumerate(head)}
    samples_col = col.get("Warp Stall Sampling (All Samples)")
    if samples_col is None:
        print(f"{name}: no 'Warp Stall Sampling (All Samples)' column (profile with SourceCounters)")
        return
    reasons = [k for k in head if k.startswith("stall_") and "Not Issued" not in k]
    executed = col.get("Instructions Executed")
    base = int(rows[0][0], 16)
    total = sum(num(r[samples_col]) for r in rows) or 1
    print(f"== [{index}] {name}\n   {total} samples")
    by_reason = {k: sum(num(r[col[k]]) for r in rows) for k in reasons}
    print("   by reason: " + ", ".join(f"{k[6:]} {100 * v / total:.0f} %"
                                       for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1]) if v))
    # Regions end at each marked instruction (inclusive): a barrier's waiting shows on it.
    start, acc, ins = 0, 0, 0
    print("   regions (SASS offsets, share of samples, instructions executed):")
    for r in rows:
        acc += num(r[samples_col])
        ins += num(r[executed]) if executed is not None else 0
        src = r[col["Source"]].strip()
        if any(m in src for m in MARKS):
            off = int(r[0], 16) - base
            if acc:
                print(f"     {start:#7x}-{off:#7x} {100 * acc / total:5.1f} %  {ins:>10}  ends at {src[:48]}")
            start, acc, ins = off + 16, 0, 0
    if acc:
        print(f"     {start:#7x}-end     {100 * acc / total:5.1f} %  {ins:>10}")
    print(f"   top {top} instructions:")
    ranked = sorted(rows, key=lambda r: -num(r[samples_col]))[:top]
    for r in ranked:
        main = sorted(((num(r[col[k]]), k[6:]) for k in reasons if num(r[col[k]])), reverse=True)[:2]
        why = ", ".join(f"{k} {v}" for v, k in main)
        print(f"     {int(r[0], 16) - base:#7x} {num(r[samples_col]):5} {r[col['Source']].strip()[:56]:56} {why}")


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__)
        return 2
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 12
    seen, last = 0, None
    for name, head, rows in kernels(argv[1]):  # one block per profiled launch, in launch order
        if rows and rows != last:  # (ncu 2025 printed each launch's block twice)
            report(seen, name, head, rows, top)
            seen += 1
        last = rows
    if not seen:
        print(f"{argv[1]}: no kernel blocks (expected `ncu --page source --csv --print-source sass` output)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
