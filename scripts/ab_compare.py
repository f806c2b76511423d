#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Summarizes scripts/gpu_ab.sh's folder: per benchmark case the base and new
graph times of every round (us), the change of the medians, and whether the
decode outputs' fingerprints agree; then the kernels whose registers, stack
or spills differ between the two builds. Exits 1 where an output differs."""
import csv
import glob
import os
import re
import statistics
import sys


def read_rounds(out, side):
    times, hashes = {}, {}
    for path in sorted(glob.glob(os.path.join(out, "bench_%s_*.csv" % side))):
        for row in csv.DictReader(open(path)):
            key = (row["shape"], row["batch"], row["kv_dtype"])
            times.setdefault(key, []).append(float(row["time_us"]))
    for path in sorted(glob.glob(os.path.join(out, "hashes_%s_*.txt" % side))):
        for line in open(path):
            shape, batch, dtype, h = line.strip().rsplit(",", 3)
            hashes.setdefault((shape, batch, dtype), set()).add(h)
    return times, hashes


def resources(path):
    kernels, name = {}, None
    if not os.path.exists(path):
        return kernels
    for line in open(path):
        m = re.search(r"Function (\S+):", line)
        if m:
            # Anonymous namespaces carry a per-build hash: fold it.
            name = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", m.group(1))
            # The tensor-core decode kernels of one shape under any of their
            # names (one template, or one per mechanism) compare as one.
            name = re.sub(r"\d+Tc(Partition|Register|Ring)Kernel", "TcDecodeKernel", name)
        elif name and "REG:" in line:
            kernels[name] = " ".join("%s:%s" % p for p in re.findall(r"(REG|STACK|LOCAL):(\d+)", line))
            name = None
    return kernels


def main():
    out = sys.argv[1]
    bt, bh = read_rounds(out, "base")
    nt, nh = read_rounds(out, "new")
    bad = 0
    print("| shape | B | KV | base us | new us | change | outputs |")
    print("|---|---|---|---|---|---|---|")
    for key in bt:
        if key not in nt:
            continue
        b, n = statistics.median(bt[key]), statistics.median(nt[key])
        same = bh.get(key) == nh.get(key) and len(bh.get(key, ())) == 1
        bad += not same
        print("| %s | %s | %s | %s | %s | %+.1f%% | %s |" % (
            key[0], key[1], key[2], "/".join("%.1f" % t for t in bt[key]),
            "/".join("%.1f" % t for t in nt[key]), 100 * (n / b - 1),
            "identical" if same else "DIFFER"))
    rb = resources(os.path.join(out, "resources_base.txt"))
    rn = resources(os.path.join(out, "resources_new.txt"))
    if rb or rn:
        changed = [k for k in rn if k in rb and rb[k] != rn[k]]
        print("\nkernels: %d base, %d new, %d in both with other resources, %d only in new, %d only in base"
              % (len(rb), len(rn), len(changed), len(set(rn) - set(rb)), len(set(rb) - set(rn))))
        for k in changed[:40]:
            print("  %s: %s -> %s" % (k[:120], rb[k], rn[k]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
