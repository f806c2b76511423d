#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares the device code of two builds of one instantiation unit, kernel
by kernel (docs/DESIGN.md, "Changing a kernel", gate 1):

  scripts/kernel_code_compare.py BEFORE_DIR AFTER_DIR UNIT

where each DIR holds UNIT.ptx, UNIT.ptxas.txt (the `-Xptxas -v` output) and
UNIT.cubin of the unit, e.g. from

  nvcc -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -std=c++17 \\
    -I. -Ibuild/generated -c build/generated/kernels/UNIT.cu -o UNIT.o \\
    --keep --keep-dir DIR -Xptxas -v > DIR/UNIT.ptxas.txt 2>&1

(--keep leaves UNIT.ptx and UNIT.sm_90a.cubin; either name is taken).
Kernels pair by their mangled names with the tensor-core decode kernels'
names folded (one template or one per mechanism). Per kernel: registers,
spills, stack and shared memory; the PTX without comments, .loc/.file lines,
register numbers and labels ("ops"); and the cubin's .text bytes. Exits 1
where a resource count or .text differs.
"""
import glob
import os
import re
import subprocess
import sys

KERNEL_NAME = re.compile(r"\d+Tc(Partition|Register|Ring)Kernel")


def fold(name):
    return KERNEL_NAME.sub("TcDecodeKernel", name)


def resources(path):
    out, cur = {}, None
    for line in open(path):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = fold(m.group(1))
            out[cur] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            out[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if m and cur:
            out[cur].update(regs=int(m.group(1)), smem=int(m.group(2)))
    return out


def ptx_ops(path):
    text = open(path).read()
    out = {}
    for part in re.split(r"(?m)^(?=\.visible \.entry|\.entry)", text):
        m = re.match(r"(?:\.visible )?\.entry\s+(\S+?)\(", part)
        if not m:
            continue
        body = []
        for line in part.splitlines():
            s = line.split("//")[0].strip()
            if not s or s.startswith((".loc", ".file", ".reg", ".shared")):
                continue
            s = re.sub(r"_Z\w+", lambda mm: fold(mm.group(0)), s)
            s = re.sub(r"%(p|rs|r|rd|f|fd|tmp)\d+\b", r"%\1", s)
            s = re.sub(r"\$L__BB\d+_\d+", "$L", s)
            body.append(s)
        out[fold(m.group(1))] = body
    return out


def text_sections(path):
    listing = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True).stdout
    data = open(path, "rb").read()
    out = {}
    for line in listing.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+\.text\.(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            off, size = int(m.group(2), 16), int(m.group(3), 16)
            out[fold(m.group(1))] = data[off:off + size]
    return out


def find(d, unit, suffixes):
    for s in suffixes:
        hits = glob.glob(os.path.join(d, unit + s))
        if hits:
            return hits[0]
    sys.exit("no %s{%s} in %s" % (unit, ",".join(suffixes), d))


def main():
    before, after, unit = sys.argv[1:4]
    rb = resources(find(before, unit, [".ptxas.txt"]))
    ra = resources(find(after, unit, [".ptxas.txt"]))
    pb = ptx_ops(find(before, unit, [".ptx"]))
    pa = ptx_ops(find(after, unit, [".ptx"]))
    tb = text_sections(find(before, unit, [".cubin", ".sm_*.cubin"]))
    ta = text_sections(find(after, unit, [".cubin", ".sm_*.cubin"]))
    bad = 0
    for k in sorted(set(rb) | set(ra)):
        res = "same" if rb.get(k) == ra.get(k) else "%s -> %s" % (rb.get(k), ra.get(k))
        ops = "same" if pb.get(k) == pa.get(k) else "differs"
        txt = "same" if tb.get(k) == ta.get(k) else "differs"
        bad += res != "same" or txt != "same"
        print("%s\n  resources %s; ptx %s; .text %s" % (k, res, ops, txt))
    print("%d kernels, %d with other resources or .text" % (len(set(rb) | set(ra)), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
