#!/usr/bin/env python3
"""tools/sass-count.py - instruction counts of CUDA kernels from their SASS, without a GPU.

Reads cubins written by `nvcc -arch=sm_90a -cubin` through cuobjdump (tools/fetch-sass-tools.sh
fetches one for the build machine). Two uses:

  sass-count.py OLD.cubin NEW.cubin        per kernel whose SASS differs (instruction text,
                                           addresses aside): static instruction count, PRMT and
                                           local-memory (spill) instructions, old -> new, and
                                           whether only the schedule differs; kernels in one
                                           cubin only are listed as such
  sass-count.py --loops REGEX FILE.cubin   per backward-branch loop holding HMMA/HGMMA in the
                                           kernels whose mangled name matches REGEX: its size and
                                           its straight path (from the loop head to the first
                                           unconditional branch or the back edge), the path a
                                           steady state runs; instructions per mma chunk follow
                                           by dividing by the HMMA count per chunk
  sass-count.py --loads REGEX FILE.cubin   per kernel matching REGEX: its global loads and mma in
                                           program order, one letter each (W 16-byte load, s
                                           8-byte, l narrower, H an HMMA, M four in a row = one
                                           64-k chunk of the decode GEMVs, | a barrier) and the
                                           16-byte loads before the first HMMA: how far ptxas
                                           hoisted the weight refills (bench/NOTES.md "v41")

Static counts, not executed ones: a loop's straight path times its trip count is what a warp
issues there. bench/NOTES.md "v37" used it on moe_batch_kernel.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

INSTR = re.compile(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(\S*)")  # opcode, then its .suffixes


def cuobjdump():
    """$CUOBJDUMP, else tools/fetch-sass-tools.sh's copy in .sass-tools/, else the one on PATH."""
    local = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".sass-tools", "usr", "bin", "cuobjdump")
    return os.environ.get("CUOBJDUMP") or (local if os.path.exists(local) else "cuobjdump")


def kernels(cubin):
    """{mangled name: [(address, instruction text)]} of every function in `cubin`."""
    try:
        out = subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"sass-count: cuobjdump -sass {cubin} failed ({e}); run tools/fetch-sass-tools.sh or set CUOBJDUMP")
    res, name = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            # An anonymous namespace's mangled name carries a per-compilation hash: zeroed (same
            # length, so the name still demangles), so that two builds of the same kernel (e.g.
            # from two checkouts) pair up.
            name = re.sub(r"(_GLOBAL__N__)([0-9a-f]+)_", lambda h: h.group(1) + "0" * len(h.group(2)) + "_", m.group(1))
            res[name] = []
            continue
        m = INSTR.match(line)
        if m and name is not None:
            res[name].append((int(m.group(1), 16), m.group(2)))
    return res


def demangle(name):
    try:
        d = subprocess.run(["c++filt"], input=name, capture_output=True, text=True).stdout.strip()
    except OSError:
        return name
    return re.sub(r"gptoss::cuda::|\(anonymous namespace\)::|gemm_detail::|\(.*\)$", "", d)


def opcodes(instrs):
    c = collections.Counter()
    for _, text in instrs:
        m = OPCODE.match(text)
        if m:
            c[m.group(1)] += 1
    return c


def compare(old, new):
    """Per kernel whose instructions differ: counts old -> new, and whether only the schedule differs
    (the same opcode counts); kernels in one cubin only are listed as such."""
    a, b = kernels(old), kernels(new)
    for name in a:
        if name not in b:
            print(f"{demangle(name)[:80]:80s} only in {old}")
            continue
        if [t for _, t in a[name]] == [t for _, t in b[name]]:
            continue
        ca, cb = opcodes(a[name]), opcodes(b[name])
        na, nb = len(a[name]), len(b[name])
        spill = lambda c: c["LDL"] + c["STL"]
        what = "  (same opcode counts: scheduled differently)" if ca == cb else ""
        print(f"{demangle(name)[:80]:80s} {na:6d} -> {nb:6d} ({nb - na:+d})  PRMT {ca['PRMT']} -> {cb['PRMT']}"
              f"  LDL/STL {spill(ca)} -> {spill(cb)}{what}")
    for name in b:
        if name not in a:
            print(f"{demangle(name)[:80]:80s} only in {new}")


def loops(pattern, cubin):
    for name, instrs in kernels(cubin).items():
        if not re.search(pattern, name):
            continue
        print(demangle(name))
        index = {addr: i for i, (addr, _) in enumerate(instrs)}
        for i, (addr, text) in enumerate(instrs):
            m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr or int(m.group(1), 16) not in index:
                continue
            body = instrs[index[int(m.group(1), 16)]:i + 1]
            mma = lambda part: sum(("HMMA" in t) or ("HGMMA" in t) for _, t in part)
            if mma(body) == 0:
                continue
            path = []
            for a2, t2 in body:
                path.append((a2, t2))
                if re.match(r"BRA ", t2):
                    break
            spills = sum(("LDL" in t) or ("STL" in t) for _, t in path)
            print(f"  loop {body[0][0]:#x}-{addr:#x}: {len(body)} instructions, {mma(body)} mma; straight path "
                  f"{len(path)} instructions, {mma(path)} mma, {spills} LDL/STL")


def loads(pattern, cubin):
    for name, instrs in kernels(cubin).items():
        if not re.search(pattern, name):
            continue
        seq = []
        for _, text in instrs:
            m = OPCODE.match(text)
            op, suffixes = (m.group(1), m.group(2)) if m else ("", "")
            if op == "LDG":
                seq.append("W" if ".128" in suffixes else "s" if ".64" in suffixes else "l")
            elif op == "HMMA":
                seq.append("H")
            elif op == "BAR":
                seq.append("|")
        line = "".join(seq)
        first = line.find("H")
        ahead = line[:first].count("W") if first >= 0 else line.count("W")
        print(f"{demangle(name)[:100]}\n  {ahead} W before the first HMMA: {line.replace('HHHH', 'M')}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loops", metavar="REGEX", help="list the mma loops of the kernels matching REGEX")
    p.add_argument("--loads", metavar="REGEX", help="the loads and mma in order of the kernels matching REGEX")
    p.add_argument("cubins", nargs="+")
    args = p.parse_args()
    if args.loads or args.loops:
        if len(args.cubins) != 1:
            p.error("--loads / --loops take one cubin")
        (loads if args.loads else loops)(args.loads or args.loops, args.cubins[0])
    else:
        if len(args.cubins) != 2:
            p.error("give OLD.cubin NEW.cubin")
        compare(*args.cubins)


if __name__ == "__main__":
    main()
