#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The device code a library ships, per architecture, against a budget.

Reads the ELF section .nv_fatbin of a shared library or object (the CUDA
fat binaries nvcc embeds, one per translation unit), walks its entries
(each a cubin for one sm_XX or a PTX text for one compute_XX, possibly
compressed) and sums their stored sizes per architecture and kind.

usage: library_size.py LIB [--budget-mib ARCH=MIB ...]
Prints a table; exits 1 where an architecture's SASS + PTX exceeds its
budget, 2 where the file cannot be read.
"""
import argparse
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "sass"}


def section(data, name):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    for h in headers:
        start = strtab[4] + h[0]
        end = data.index(b"\0", start)
        if data[start:end].decode() == name:
            return data[h[4]:h[4] + h[5]]
    raise ValueError("no section " + name)


def entries(fatbin):
    """Yields (kind, arch, stored bytes) of every entry of every fat binary."""
    off = 0
    while off + 16 <= len(fatbin):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", fatbin, off)
        if magic != FATBIN_MAGIC:
            off += 8  # fat binaries are 8-byte aligned; skip padding
            continue
        pos = off + header_size
        end = pos + fat_size
        while pos + 64 <= end:
            kind, _v, ehs, size = struct.unpack_from("<HHIQ", fatbin, pos)
            arch, = struct.unpack_from("<I", fatbin, pos + 28)
            yield KINDS.get(kind, "kind%d" % kind), arch, size
            pos += ehs + size
        off = end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--budget-mib", action="append", default=[],
                    help="ARCH=MIB, e.g. 90=24: the most device code sm_ARCH may ship")
    args = ap.parse_args()
    try:
        data = open(args.lib, "rb").read()
        fatbin = section(data, ".nv_fatbin")
    except (OSError, ValueError) as e:
        print("library_size: %s: %s" % (args.lib, e), file=sys.stderr)
        return 2
    per_arch = {}
    for kind, arch, size in entries(fatbin):
        per_arch.setdefault(arch, {}).setdefault(kind, 0)
        per_arch[arch][kind] += size
    budgets = {}
    for b in args.budget_mib:
        arch, mib = b.split("=")
        budgets[int(arch)] = float(mib)
    mib = 1 << 20
    print("%s: %.1f MiB file, %.1f MiB device code" % (args.lib, len(data) / mib, len(fatbin) / mib))
    print("arch  sass MiB  ptx MiB  budget MiB")
    failed = False
    for arch in sorted(per_arch):
        k = per_arch[arch]
        total = sum(k.values())
        budget = budgets.get(arch)
        over = budget is not None and total > budget * mib
        failed |= over
        print("sm_%-3d %8.2f %8.2f  %s%s" % (arch, k.get("sass", 0) / mib, k.get("ptx", 0) / mib,
                                              "-" if budget is None else "%.1f" % budget,
                                              "  OVER BUDGET" if over else ""))
    missing = [a for a in budgets if a not in per_arch]
    if missing:
        print("no device code for budgeted architectures %s" % missing)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
