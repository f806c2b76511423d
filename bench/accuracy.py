#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpage decode accuracy on one GPU: each kernel's precision contract, each format's error.

Writes docs/ACCURACY.md.

Contract (the main table). A *path* is a cache and a decode shape for which
the decode plan's rules (docs/DESIGN.md, "Decode plan") choose one partition
kernel: MHA BF16 -> thread-group; BF16 with 8 rows a KV head -> tensor-core
staged (sm_90+; registers before); FP16 at block 32 -> tensor-core registers;
FP8, INT8 -> registers; INT4 at head 128 -> tensor-core ring; K INT8 / V INT4
-> thread-group. For each path and each kind of data

  gaussian      q, K, V ~ N(0, 1)
  peaked        q ~ N(0, 6^2): a peaked softmax
  large logits  channel 0 of every key 30 + N(0, 0.5^2), of every query
                40 + N(0, 1): logits near 106 at scale 1/sqrt(128)
  long context  one sequence of 32768 tokens, q, K, V ~ N(0, 1)

with FP32 q and FP32 output (so that only the kernel's own rounding shows),
2 KV heads, head size 128, sequences of 2048, 517 and 1 tokens (long
context: one of 32768) through shuffled block tables, it measures against
float64 attention over the dequantized cache (kvpage.reference):

  out   rel-L2 of the output, ||out - ref|| / ||ref|| over every row;
  lse   max over rows of |lse - ref| / (1 + |ref|);

once with the decoder's default (the plan's kernel) and once in precise mode
(precise=True: the thread-group kernel for every cache), each against the
path's stated bound (PATHS and PRECISE_*_BOUND below, the same as
tests/capi/gpu_test.cc GpuDecode.PrecisionContract). The kernel that ran is the plan's by its rules;
on CUDA the script also checks it: the same data goes into caches created
with KVPAGE_DECODE_KERNEL / KVPAGE_DECODE_STAGED forcing each kernel, and the
default decode must be bit-identical to the one forcing the predicted kernel
(the decode is deterministic: same kernel and plan, same bits) and not to a
different kernel's.

End to end (the second table): GQA 32/8, D=128, block 16, 16 sequences of
2048 tokens (--quick: 8 of 1024), BF16 q, K/V written as BF16; every KV
dtype on Gaussian keys and on keys with outlier channels, with and without
key smoothing: rel-L2 against float64 attention over the BF16 K/V written
(the format's error), against the dequantized cache (what the kernel adds;
it must stay within 1.5x of the BF16 output's rounding floor), and both with
FP32 output.

Exit status 1 if a bound is exceeded, a kernel check finds another kernel,
a path cannot run, or an end-to-end kernel error is above the rounding
floor. docs/ACCURACY.md is written only when nothing failed; the page's text
is always in DIR/ACCURACY.md, the measurements in DIR/accuracy.json.

usage:
  python3 bench/accuracy.py [--out DIR] [--doc PATH | --no-doc] [--quick] [--seed N]
                            [--no-kernel-check] [--device cuda|cpu]
  python3 bench/accuracy.py --from-json DIR/accuracy.json [--doc PATH]   # re-render, no GPU
  python3 bench/accuracy.py --selftest                                  # no GPU, no torch
Needs torch with CUDA and a CUDA build of libkvpage (KVPAGE_LIBRARY=...,
PYTHONPATH=bindings/python). --device cpu runs the same measurements on the
CPU backend: a check of the script itself (no kernels to tell apart; the
page is not written unless --doc names a path).
"""

import argparse
import collections
import csv
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_DOC = os.path.join(REPO, "docs", "ACCURACY.md")

# The command that regenerates the page (written into it).
COMMAND = ("PYTHONUNBUFFERED=1 KVPAGE_LIBRARY=build/libkvpage.so PYTHONPATH=bindings/python "
           "python3 bench/accuracy.py --out out/accuracy")

# ---------------------------------------------------------------------------
# The contract: paths, data, bounds. The one place these numbers live here;
# tests/capi/gpu_test.cc (GpuDecode.PrecisionContract) states the same.
# ---------------------------------------------------------------------------

HEAD = 128
CONTRACT_KV_HEADS = 2
CONTRACT_LENS = (2048, 517, 1)
LONG_LENS = (32768,)

Path = collections.namedtuple(
    "Path", ["id", "k_dtype", "v_dtype", "block_size", "rows", "out_bound", "lse_bound"])

# rows: query rows a KV head (the GQA group). Bounds: FP32 output rel-L2, and
# LSE error |lse - ref| / (1 + |ref|), against float64 over the dequantized
# cache, in default mode.
PATHS = [
    Path("thread-group BF16 MHA", "bf16", "bf16", 16, 1, 2e-5, 2e-5),
    Path("staged BF16", "bf16", "bf16", 16, 8, 2e-5, 5e-5),
    Path("registers FP16 block 32", "fp16", "fp16", 32, 8, 2e-5, 5e-5),
    Path("registers FP8", "fp8", "fp8", 16, 8, 3e-3, 1.5e-2),
    Path("registers INT8", "int8", "int8", 16, 8, 3e-3, 1.5e-2),
    Path("ring INT4", "int4", "int4", 16, 8, 3e-3, 1.5e-2),
    Path("thread-group K INT8 / V INT4", "int8", "int4", 16, 8, 2e-5, 2e-5),
]
# Precise mode (the decoder's precise=True), every cache.
PRECISE_OUT_BOUND, PRECISE_LSE_BOUND = 2e-5, 2e-5

DATA = ["gaussian", "peaked", "large logits", "long context"]
DATA_TEXT = {
    "gaussian": "q, K, V ~ N(0, 1)",
    "peaked": "q ~ N(0, 6²) (a peaked softmax), K, V ~ N(0, 1)",
    "large logits": ("channel 0 of every key 30 + N(0, 0.5²), of every query 40 + N(0, 1), "
                     "the rest N(0, 1): logits near 106 at scale 1/√128"),
    "long context": "one sequence of 32768 tokens, q, K, V ~ N(0, 1)",
}

# ---------------------------------------------------------------------------
# The plan's rules (src/decode_plan.cc ChooseDecodeKernel, docs/DESIGN.md),
# for a full build (every dtype, head size and block size in the manifest).
# ---------------------------------------------------------------------------

THREAD_GROUP, REGISTERS, RING, STAGED, CPU = "thread_group", "registers", "ring", "staged", "cpu"
KERNEL_NAMES = {
    THREAD_GROUP: "thread-group",
    REGISTERS: "tensor-core registers",
    RING: "tensor-core ring",
    STAGED: "tensor-core staged",
    CPU: "CPU backend",
}
BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
QUANTIZED = ("fp8", "int8", "int4")
TC_MIN_ROWS_16 = 2      # kTensorCoreMinRows16
STAGED_MAX_ROWS = 8     # kStagedMaxRows


def tensor_core_kernel(k_dtype, v_dtype, head_size):
    """The tensor-core kernel serving the cache (ring or registers), or None."""
    if k_dtype != v_dtype or head_size % (4 * (128 // BITS[k_dtype])) != 0:
        return None
    return RING if k_dtype == "int4" and head_size <= 128 else REGISTERS


def staged_serves(k_dtype, v_dtype, head_size, block_size, rows):
    return (k_dtype == v_dtype and k_dtype in ("bf16", "fp16") and head_size == 128
            and block_size == 16 and 1 <= rows <= STAGED_MAX_ROWS)


def expected_kernel(k_dtype, v_dtype, head_size, block_size, rows, cc_major, precise=False,
                    family=None, staged=True):
    """The partition kernel the plan runs. family: KVPAGE_DECODE_KERNEL
    (None, "thread_group" or "tensor_core"); staged: KVPAGE_DECODE_STAGED
    not 0."""
    if precise:
        return THREAD_GROUP
    tc = tensor_core_kernel(k_dtype, v_dtype, head_size)
    if family == "thread_group" or tc is None:
        return THREAD_GROUP
    if family != "tensor_core" and k_dtype not in QUANTIZED and rows < TC_MIN_ROWS_16:
        return THREAD_GROUP
    if (tc == REGISTERS and cc_major >= 9 and staged
            and staged_serves(k_dtype, v_dtype, head_size, block_size, rows)):
        return STAGED
    return tc


# The caches the kernel check compares: name -> (environment, family, staged).
CONFIGS = collections.OrderedDict([
    ("default", ({}, None, True)),
    ("KVPAGE_DECODE_KERNEL=thread_group", ({"KVPAGE_DECODE_KERNEL": "thread_group"},
                                           "thread_group", True)),
    ("KVPAGE_DECODE_KERNEL=tensor_core", ({"KVPAGE_DECODE_KERNEL": "tensor_core"},
                                          "tensor_core", True)),
    ("KVPAGE_DECODE_KERNEL=tensor_core KVPAGE_DECODE_STAGED=0",
     ({"KVPAGE_DECODE_KERNEL": "tensor_core", "KVPAGE_DECODE_STAGED": "0"}, "tensor_core", False)),
])
# Switches that change which kernel or partition size runs; cleared for the run.
PLAN_ENV = ("KVPAGE_DECODE_KERNEL", "KVPAGE_DECODE_STAGED", "KVPAGE_DECODE_PARTITION")


def config_kernels(path, cc_major, precise=False):
    """{config name: kernel the rules predict there}; precise applies to the
    default config's decoder only (the one measured)."""
    out = collections.OrderedDict()
    for name, (_, family, staged) in CONFIGS.items():
        out[name] = expected_kernel(path.k_dtype, path.v_dtype, HEAD, path.block_size, path.rows,
                                    cc_major, precise=precise and name == "default",
                                    family=family, staged=staged)
    return out


def kernel_verdict(expected, comparisons):
    """comparisons: [(config, kernel the rules predict there, bit-identical to
    the measured decode)]. Returns (verdict, detail):
      verified    identical to every config running the expected kernel, to none other;
      consistent  identical to them, and no config runs another kernel;
      ambiguous   identical to those and to a config predicted to run another kernel;
      unverified  identical to no config running the expected kernel, nor to another;
      MISMATCH    identical to a config running another kernel, not to the expected one's."""
    if not comparisons:
        return "n/a", "no kernel to compare against"
    same = [c for c, k, eq in comparisons if k == expected]
    other = [(c, k) for c, k, eq in comparisons if k != expected]
    same_eq = [c for c, k, eq in comparisons if k == expected and eq]
    other_eq = [(c, k) for c, k, eq in comparisons if k != expected and eq]
    if not same:
        return "unverified", "no config forces %s" % KERNEL_NAMES[expected]
    if len(same_eq) == len(same):
        if not other_eq:
            if not other:
                return "consistent", "identical to %s; no other kernel serves the cache" % (
                    ", ".join(same))
            return "verified", "identical to %s; differs from %s" % (
                ", ".join(same), ", ".join("%s (%s)" % (c, KERNEL_NAMES[k]) for c, k in other))
        return "ambiguous", "identical to %s, and to %s" % (
            ", ".join(same), ", ".join("%s (%s)" % (c, KERNEL_NAMES[k]) for c, k in other_eq))
    if other_eq and not same_eq:
        return "MISMATCH", "differs from %s; identical to %s" % (
            ", ".join(same), ", ".join("%s (%s)" % (c, KERNEL_NAMES[k]) for c, k in other_eq))
    return "unverified", "identical to %s of %s" % (
        ", ".join(same_eq) or "none", ", ".join(same))


def dtype_label(k_dtype, v_dtype):
    names = {"bf16": "BF16", "fp16": "FP16", "fp8": "FP8 E4M3", "int8": "INT8", "int4": "INT4"}
    if k_dtype == v_dtype:
        return names[k_dtype]
    return "K %s / V %s" % (names[k_dtype], names[v_dtype])


def shape_label(path, data):
    lens = LONG_LENS if data == "long context" else CONTRACT_LENS
    hkv = CONTRACT_KV_HEADS
    return "%s %d/%d, D %d, block %d, T %s" % (
        "MHA" if path.rows == 1 else "GQA", path.rows * hkv, hkv, HEAD, path.block_size,
        "+".join(str(x) for x in lens))


def within(value, bound):
    return value is not None and math.isfinite(value) and value <= bound


def row_failures(r):
    """Why a contract row fails ([] if it passes)."""
    why = []
    if r.get("error"):
        return ["%s" % r["error"]]
    if not within(r["out_err"], r["out_bound"]):
        why.append("output rel-L2 %.3g > %s" % (r["out_err"], bound_text(r["out_bound"])))
    if not within(r["lse_err"], r["lse_bound"]):
        why.append("LSE error %.3g > %s" % (r["lse_err"], bound_text(r["lse_bound"])))
    if r.get("check") == "MISMATCH":
        why.append("another kernel ran (%s)" % r.get("check_detail", ""))
    return why


def failures(data):
    """Every failure of a run, as lines."""
    out = []
    for r in data["contract"]:
        for w in row_failures(r):
            out.append("contract: %s, %s, %s mode: %s" % (r["path"], r["data"], r["mode"], w))
    for r in data["e2e"]:
        if r.get("error"):
            out.append("end to end: %s: %s" % (r["dtype"], r["error"]))
        elif not r["ok"]:
            out.append("end to end: %s, %s, smoothing %s: kernel %.3g above 1.5x the rounding "
                       "floor %.3g" % (r["dtype"], r["cond"], "on" if r["smooth"] else "off",
                                       r["kernel"], r["rounding"]))
    if not data["contract"]:
        out.append("contract: no rows measured")
    return out


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

ROUNDING_ROWS = [
    # (kernel, caches, q, K/V, logits, P, accumulators, LSE, output)
    ("thread-group (CUDA cores)",
     "every cache: one query row a KV head on BF16/FP16, K and V of different dtypes, "
     "every cache in precise mode",
     "q·λ·scale in FP32. FP32 q stays FP32 (never rounded to 16 bits); BF16/FP16 q is exact "
     "in FP32",
     "codes exact in FP32; the token's FP16 scale applied in FP32 (K's once a token on the dot "
     "product, INT4's min as min·Σq; V's folded into P)",
     "FP32 FMA",
     "FP32: __expf (ex2.approx) of logit − max, times the token's V scale",
     "FP32",
     "max + logf(sum) in FP32; partitions merged in FP32",
     "one rounding to the out dtype (FP32 out: the FP32 result)"),
    ("tensor-core registers, ring (mma.sync m16n8k16)",
     "FP8, INT8 (registers); INT4 (ring at head 128, registers at 256)",
     "q·λ times a power of two (the row's largest in [2¹⁴, 2¹⁵)) rounded to FP16: 11 significant "
     "bits whatever q's dtype, so FP32 q loses the bits past the 11th; FP16 and BF16 q without "
     "key smoothing stay exact (elements down to 2⁻²⁸ of the row's largest). The logit scale "
     "multiplies the FP32 logits",
     "codes exact in the FP16 operands; K's scale (INT4: and min·Σq) applied to the FP32 logits; "
     "V's scale folded into P (INT4: V's min term summed in FP32 apart)",
     "FP32 accumulation (the mma's)",
     "p in FP32 (ex2.approx, log2 units), times the token's V scale and a power of two, "
     "rounded to FP16 (11 bits) before P·V",
     "FP32 (the mma's)",
     "max + log(sum) in FP32 over the unrounded p; carries q's FP16 rounding through the logits",
     "one rounding to the out dtype"),
    ("tensor-core staged (sm_90+), registers",
     "BF16, FP16 with ≥ 2 rows a KV head (staged at head 128, block 16, ≤ 8 rows; else registers)",
     "q·λ times a power of two split into hi + lo parts of the cache's 16-bit type, two mmas: "
     "about 16 significant bits (BF16 cache) or 22 (FP16); 16-bit q without key smoothing is "
     "exact. The logit scale multiplies the FP32 logits",
     "exact (the stored 16-bit values)",
     "FP32 accumulation (the mma's), hi and lo products",
     "p in FP32 (ex2.approx, log2 units) split into hi + lo parts of the cache's type: about 16 "
     "(BF16) or 22 (FP16) significant bits",
     "FP32 (the mma's)",
     "max + log(sum) in FP32 over the unrounded p",
     "one rounding to the out dtype"),
]


def fmt(x):
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return "%.2e" % x


def bound_text(b):
    return "%.2g" % b  # 0.015 as 0.015: %.0e would print 2e-02


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        assert len(r) == len(header), (header, r)
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return lines


def pct(x):
    return "%.2g%%" % (100 * x) if x >= 0.001 else "%.2e" % x


def e2e_summary(rows):
    """Sentences on the end-to-end table, from its numbers."""
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return []
    out = []

    def get(dtype, cond, smooth):
        for r in ok:
            if r["dtype"] == dtype and r["cond"] == cond and r["smooth"] == smooth:
                return r
        return None
    at_floor = sum(1 for r in ok if r["ok"])
    worst = max(r["kernel"] / r["rounding"] for r in ok if r["rounding"] > 0)
    k32 = [r["kernel_fp32"] for r in ok]
    out.append("- **The kernel adds nothing measurable above the output's rounding.** Against "
               "the dequantized cache, %d of %d BF16 outputs are within 1.5x of the BF16 "
               "rounding floor (the largest ratio %.3f); with FP32 output the kernel's own "
               "error is %.1e to %.1e. Everything above the floor in the \"vs exact\" column "
               "is the format, not the kernel." % (at_floor, len(ok), worst, min(k32), max(k32)))
    parts = []
    for d in ("int8", "fp8", "int4", "int8/int4"):
        r = get(d, "gaussian", False)
        if r:
            parts.append("%s %s" % (DTYPE_SHORT.get(d, d), pct(r["exact"])))
    if parts:
        out.append("- **Format errors** (Gaussian data, no smoothing): " + ", ".join(parts) +
                   ". The output is a weighted mean of V, so V's per-element error passes "
                   "through almost unchanged, while the softmax damps K's.")
    parts = []
    for d in ("fp8", "int8", "int4"):
        g, o = get(d, "gaussian", False), get(d, "outlier keys", False)
        if g and o and g["exact"] > 0:
            parts.append("%s %s (%.1fx Gaussian)" % (DTYPE_SHORT[d], pct(o["exact"]),
                                                    o["exact"] / g["exact"]))
    if parts:
        out.append("- **Outlier channels** (no smoothing): " + ", ".join(parts) + ". The "
                   "integer formats' per-token scale is set by the largest channel.")
    parts = []
    for d in ("bf16", "fp8", "int8", "int4"):
        off, on = get(d, "outlier keys", False), get(d, "outlier keys", True)
        if off and on:
            parts.append("%s %s → %s" % (DTYPE_SHORT[d], pct(off["exact"]), pct(on["exact"])))
    if parts:
        out.append("- **Key smoothing** on outlier keys: " + ", ".join(parts) + ". On BF16/FP16 "
                   "caches K/λ is rounded a second time: use it with quantized keys.")
    return out


DTYPE_SHORT = {"bf16": "BF16", "fp16": "FP16", "fp8": "FP8 E4M3", "int8": "INT8", "int4": "INT4",
               "int8/int4": "K INT8 / V INT4"}


def render_doc(data, plot_rel=None):
    """docs/ACCURACY.md from a run's measurements (pure: no torch, no GPU)."""
    m = data["meta"]
    c = data["contract"]
    e = data["e2e"]
    L = []
    L.append("# Accuracy")
    L.append("")
    L.append("<!-- Generated by bench/accuracy.py from one run on a GPU; do not edit by hand. "
             "Regenerate: %s (a saved run re-renders with: python3 bench/accuracy.py "
             "--from-json out/accuracy/accuracy.json). -->" % COMMAND)
    L.append("")
    L.append("What kvpage's decode rounds on each path, the bounds it is held to, what it "
             "measures against them, and how far each KV format is from exact attention end to "
             "end. Every number here comes from one run of "
             "[`bench/accuracy.py`](../bench/accuracy.py), which fails (exit 1) where a bound "
             "is exceeded and writes this page only when none is:")
    L.append("")
    L.append("```sh")
    L.append(COMMAND)
    L.append("```")
    L.append("")
    L.append("- device: %s (compute capability %s), %s backend" % (
        m["device"], m.get("cc", "—"), m.get("backend", "CUDA")))
    L.append("- kvpage %s (ABI %s, %s%s)" % (
        m.get("kvpage", "?"), m.get("abi", "?"), m.get("build", "?"),
        ", commit %s" % m["commit"] if m.get("commit") else ""))
    L.append("- torch %s%s computes the references (float64, on the device)" % (
        m.get("torch", "?"), " (CUDA %s)" % m["torch_cuda"] if m.get("torch_cuda") else ""))
    L.append("- run on %s, seed %s, %s s" % (m.get("date", "?"), m.get("seed", "?"),
                                             m.get("seconds", "?")))
    L.append("")
    L.append("Contents: [What each path rounds](#what-each-path-rounds) · [Bounds](#bounds) · "
             "[Measured against the bounds](#measured-against-the-bounds) · [Method](#method) · "
             "[End to end: each format's error](#end-to-end-each-formats-error)")
    L.append("")

    L.append("## What each path rounds")
    L.append("")
    L.append("The CUDA decode runs one of four partition kernels, chosen per decoder by the "
             "plan (docs/DESIGN.md, \"Decode plan\"): MHA (one query row a KV head) on BF16/FP16 "
             "caches → thread-group; BF16/FP16 with 2 or more rows a KV head → tensor-core "
             "staged on sm_90+ where it serves (head 128, block 16, up to 8 rows), else "
             "tensor-core registers; FP8 and INT8 → registers; INT4 at head 128 → tensor-core "
             "ring (head 256: registers); K and V of different dtypes → thread-group. Precise "
             "mode (`kvp_decode_config.precise = 1`, Python `precise=True`) runs the "
             "thread-group kernel for every cache. `KVPAGE_DECODE_KERNEL` and "
             "`KVPAGE_DECODE_STAGED` (README) force a family. λ is the key-smoothing vector "
             "(1 without smoothing), scale the logit scale (default 1/√D).")
    L.append("")
    L.extend(md_table(["kernel", "runs for", "q", "K / V", "logits", "P", "accumulators", "LSE",
                       "output"], ROUNDING_ROWS))
    L.append("")
    L.append("For every kernel: q and out may be FP32, BF16 or FP16; a 16-bit q enters exactly "
             "(the q column says where a tensor-core path rounds it further); the output is "
             "rounded once, from FP32, to the out dtype (round to nearest even). The LSE "
             "(`kvp_decode_args.lse`) is always FP32. The split-K partitions of a row are "
             "merged by the reduce kernel in FP32 (`__expf` of the maxima's differences).")
    L.append("")

    L.append("## Bounds")
    L.append("")
    L.append("With FP32 q and FP32 output, against float64 attention over the dequantized "
             "cache: the output's rel-L2 over all rows, and the LSE error max |lse − ref| / "
             "(1 + |ref|), on every kind of data below. The same bounds are stated in "
             "`tests/capi/gpu_test.cc` (`GpuDecode.PrecisionContract`). With a 16-bit output "
             "add that format's rounding (BF16: about 1.7e-3 rel-L2, FP16: 2e-4).")
    L.append("")
    brows = []
    for p in PATHS:
        kern = next((r["kernel_name"] for r in c if r["path"] == p.id and r["mode"] == "default"
                     and r.get("kernel_name")), "—")
        brows.append([p.id, kern, dtype_label(p.k_dtype, p.v_dtype),
                      "%d (%s)" % (p.rows, "MHA" if p.rows == 1 else "GQA"), str(p.block_size),
                      bound_text(p.out_bound), bound_text(p.lse_bound)])
    pkern = next((r["kernel_name"] for r in c if r["mode"] == "precise" and r.get("kernel_name")
                  and not r.get("error")), KERNEL_NAMES[THREAD_GROUP])
    brows.append(["precise mode", pkern, "every cache", "any", "any",
                  bound_text(PRECISE_OUT_BOUND), bound_text(PRECISE_LSE_BOUND)])
    L.extend(md_table(["path", "kernel on this device", "cache", "rows a KV head", "block",
                       "output rel-L2 ≤", "LSE error ≤"], brows))
    L.append("")

    L.append("## Measured against the bounds")
    L.append("")
    L.append("One row per path and kind of data, in default mode (the plan's kernel) and in "
             "precise mode. \"kernel check\": the output and LSE are bit-identical to those of "
             "a cache forcing the predicted kernel, and differ from those forcing another "
             "([Method](#method)).")
    L.append("")
    trows = []
    for r in c:
        if r.get("error"):
            trows.append([r.get("kernel_name", "—"), r["cache"], r["shape"], r["data"], "—", "—",
                          "—", "—", "%s / %s" % (bound_text(r["out_bound"]),
                                            bound_text(r["lse_bound"])),
                          "—", "**FAIL**: %s" % r["error"]])
            continue
        name = r["kernel_name"] + (" (precise mode)" if r["mode"] == "precise" else "")
        trows.append([name, r["cache"], r["shape"], r["data"], fmt(r["out_err"]),
                      fmt(r.get("row_err")), fmt(r["lse_err"]), "%.1f" % r["lse_max"],
                      "%s / %s" % (bound_text(r["out_bound"]), bound_text(r["lse_bound"])),
                      r.get("check", "—"), "pass" if not row_failures(r) else "**FAIL**"])
    L.extend(md_table(["kernel", "cache", "shape", "data", "FP32-out rel-L2", "worst row",
                       "LSE error", "max \\|LSE\\|", "bounds (out / LSE)", "kernel check",
                       "result"], trows))
    L.append("")
    worst = {}
    for r in c:
        if r.get("error"):
            continue
        key = (r["mode"], r["path"])
        for f, b in (("out_err", "out_bound"), ("lse_err", "lse_bound")):
            frac = r[f] / r[b] if math.isfinite(r[f]) else float("inf")
            worst[key + (f,)] = max(worst.get(key + (f,), 0.0), frac)
    if worst:
        top = max(worst.items(), key=lambda kv: kv[1])
        L.append("The closest any measurement comes to its bound: %.0f%% of it (%s mode, %s, %s)."
                 % (100 * top[1], top[0][0], top[0][1],
                    "output" if top[0][2] == "out_err" else "LSE"))
        L.append("")

    L.append("## Method")
    L.append("")
    L.append("- **Shapes**: %d KV heads, head size %d; %s query rows a KV head as the path "
             "says; sequences of %s tokens (the long context: one of %s), their blocks taken "
             "from a shuffled pool; FP32 q and FP32 output, so that only the kernel's own "
             "rounding shows; the default logit scale 1/√%d. K/V are written as FP32 through "
             "`kvp_cache_write` (quantized there)." % (
                 CONTRACT_KV_HEADS, HEAD, "1 or 8", ", ".join(str(x) for x in CONTRACT_LENS),
                 LONG_LENS[0], HEAD))
    L.append("- **Data**: " + "; ".join("%s: %s" % (k, DATA_TEXT[k]) for k in DATA) + ".")
    L.append("- **Reference**: float64 attention (`kvpage.reference.attention`, kvp_decode's "
             "definition) over the cache read back through the public layout "
             "(`kvpage.reference.dequantize`: the exact values the stored codes and scales "
             "stand for), with the same q. The format's own error is not in these numbers "
             "(it is in [the end-to-end table](#end-to-end-each-formats-error)).")
    L.append("- **Errors**: output rel-L2 ‖out − ref‖ / ‖ref‖ over every row (the bounded "
             "quantity); LSE error max over rows of |lse − ref| / (1 + |ref|) (absolute for "
             "small LSEs, relative for large ones); max |LSE| shows how large the logits were. "
             "The rows of one batch differ in norm (a 1-token sequence's output is its V, a "
             "2048-token one's an average over 2048 V), so the largest rows weigh most in the "
             "rel-L2: \"worst row\" gives the largest rel-L2 of one row on its own (not "
             "bounded; the long context, one sequence, has no such weighting).")
    L.append("- **Which kernel ran**: the rows follow the plan's rules (docs/DESIGN.md, "
             "\"Decode plan\"; `src/decode_plan.cc`), the shapes chosen so that each path's "
             "kernel is the plan's choice on this device. The script checks it: the same "
             "bytes are written into caches created under `KVPAGE_DECODE_KERNEL=thread_group`, "
             "`=tensor_core` and `=tensor_core` with `KVPAGE_DECODE_STAGED=0`; a decoder's "
             "output and LSE depend only on its kernel and plan, so the measured decode must be "
             "bit-identical to the cache forcing the predicted kernel (\"verified\" when it also "
             "differs from every other kernel's; \"ambiguous\" when another kernel gave the "
             "same bits; \"consistent\" when no other kernel serves the cache; \"MISMATCH\", a "
             "failure, when only another kernel's match). Precise mode is checked against the "
             "forced thread-group kernel.%s" % (
                 "" if m.get("kernel_check", True) else
                 " This run skipped the check (--no-kernel-check): the column says n/a."))
    L.append("- **Bounds**: set above what the kernels measure on this data, with margin for "
             "other seeds; a run with a new seed must pass them (the script takes a random "
             "seed each run, and prints it).")
    L.append("")

    L.append("## End to end: each format's error")
    L.append("")
    L.append("How far the decode output is from exact attention for every KV dtype, and how "
             "much of that the kernel adds. GQA 32/8, head size 128, block 16, %d sequences of "
             "%d tokens; q ~ N(0, 1) in BF16; K/V written as BF16 (what an engine holds) "
             "through `kvp_cache_write` with shuffled block tables; BF16 output unless said; "
             "the default mode's kernel (column \"kernel\"). For each KV dtype (K and V in the "
             "same dtype, plus K INT8 / V INT4), four kinds of data:" % (m.get("e2e_B", 16),
                                                                          m.get("e2e_T", 2048)))
    L.append("")
    L.append("- **gaussian**: K, V ~ N(0, 1);")
    L.append("- **outlier keys**: as real LLM keys, a few channels carry most of the magnitude: "
             "in each KV head 4 fixed channels (of 128) hold 12 + 3·N(0, 1) instead of N(0, 1);")
    L.append("- each **with and without key smoothing** (SmoothAttention, FORMATS.md): "
             "λ = sqrt(max_t |K[t, h, c]|) per head and channel (α = 0.5), calibrated on the "
             "same keys; the write stores K/λ, the decode multiplies q by λ.")
    L.append("")
    L.extend(md_table(["column", "reference", "what it shows"], [
        ["vs exact", "float64 attention over the BF16 K/V that were written",
         "the format's error, end to end"],
        ["kernel vs dequantized", "float64 attention over the dequantized cache",
         "what the kernel adds on top of the stored values"],
        ["BF16 rounding floor", "that float64 reference rounded to BF16, against itself",
         "the least error any BF16 output has"],
        ["kernel, FP32 out", "as \"kernel vs dequantized\", with FP32 output",
         "the kernel's arithmetic without the output rounding"],
        ["exact, FP32 out", "as \"vs exact\", with FP32 output",
         "the format's error without the output rounding"],
    ]))
    L.append("")
    L.append("The run fails where \"kernel vs dequantized\" is above 1.5x the rounding floor.")
    L.append("")
    erows = []
    for r in e:
        if r.get("error"):
            erows.append([r["cond"], "on" if r["smooth"] else "off", DTYPE_SHORT.get(r["dtype"],
                          r["dtype"]), r.get("kernel_name", "—")] + ["—"] * 5 +
                         ["**FAIL**: %s" % r["error"]])
            continue
        erows.append([r["cond"], "on" if r["smooth"] else "off",
                      DTYPE_SHORT.get(r["dtype"], r["dtype"]), r["kernel_name"], fmt(r["exact"]),
                      fmt(r["kernel"]), fmt(r["rounding"]), fmt(r["kernel_fp32"]),
                      fmt(r["exact_fp32"]), "yes" if r["ok"] else "**NO**"])
    L.extend(md_table(["keys", "smoothing", "KV dtype", "kernel", "rel-L2 vs exact",
                       "kernel vs dequantized", "BF16 rounding floor", "kernel, FP32 out",
                       "exact, FP32 out", "at rounding level"], erows))
    L.append("")
    if plot_rel:
        L.append("![rel-L2 error by KV dtype](%s)" % plot_rel)
        L.append("")
    s = e2e_summary(e)
    if s:
        L.append("What it says (this run's numbers):")
        L.append("")
        L.extend(s)
        L.append("")
    L.append("The CPU-backend tests (`bindings/python/tests`, `tests/capi`) check the same "
             "properties on the CPU oracle, `bindings/python/tests/test_torch.py` on the GPU for "
             "every dtype with FP32 and BF16 outputs, and `tests/capi/gpu_test.cc` "
             "(`GpuDecode.PrecisionContract`) the bounds above.")
    return "\n".join(L) + "\n"


def write_plot(e2e, path, device):
    """The end-to-end plot (needs matplotlib); returns True if written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as ex:  # noqa: BLE001
        print("no plot: %s" % ex)
        return False
    rows = [r for r in e2e if not r.get("error")]
    if not rows:
        return False
    dts = []
    for r in rows:
        if r["dtype"] not in dts:
            dts.append(r["dtype"])
    series = [("gaussian", False), ("gaussian", True), ("outlier keys", False),
              ("outlier keys", True)]
    fig, ax = plt.subplots(figsize=(9, 4))
    wdt = 0.2
    for j, (cond, sm) in enumerate(series):
        ys = [next((r["exact"] for r in rows if r["cond"] == cond and r["smooth"] == sm
                    and r["dtype"] == d), float("nan")) for d in dts]
        ax.bar([i + (j - 1.5) * wdt for i in range(len(dts))], ys, wdt,
               label="%s, smoothing %s" % (cond, "on" if sm else "off"))
    kern = [max(r["kernel"] for r in rows if r["dtype"] == d) for d in dts]
    floor = [max(r["rounding"] for r in rows if r["dtype"] == d) for d in dts]
    ax.plot(range(len(dts)), kern, "k_", ms=30, mew=2, label="kernel vs dequantized (max)")
    ax.plot(range(len(dts)), floor, "r:", label="BF16 output rounding (max)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(dts)))
    ax.set_xticklabels([DTYPE_SHORT.get(d, d) for d in dts])
    ax.set_ylabel("rel-L2 error of the decode output")
    ax.set_title("kvpage decode accuracy vs float64 attention (%s, GQA 32/8, D=128)" % device,
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print("plot: %s (%d bytes)" % (path, os.path.getsize(path)))
    return True


def print_contract_row(r):
    if r.get("error"):
        print("  %-30s %-13s %-8s FAIL: %s" % (r["path"], r["data"], r["mode"], r["error"]),
              flush=True)
        return
    why = row_failures(r)
    print("  %-30s %-13s %-8s %-22s out %.2e (<= %.2g, worst row %.2e) lse %.2e (<= %.2g) "
          "|lse| <= %6.1f kernel %s %s" % (r["path"], r["data"], r["mode"], r["kernel_name"],
                            r["out_err"], r["out_bound"], r["row_err"], r["lse_err"],
                            r["lse_bound"], r["lse_max"],
                            r.get("check", "-"), "ok" if not why else "FAIL: " + "; ".join(why)),
          flush=True)


# ---------------------------------------------------------------------------
# Measurements (torch, kvpage)
# ---------------------------------------------------------------------------

class EnvVars(object):
    """Sets the PLAN_ENV switches to `values` (others unset), restores on exit."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in PLAN_ENV}
        for k in PLAN_ENV:
            os.environ.pop(k, None)
        os.environ.update(self.values)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


class Ctx(object):
    """What the measurements share: torch, kvpage, its reference, the device."""

    def __init__(self, t, kvpage, R, device, gen, cc_major):
        self.t, self.kvpage, self.R = t, kvpage, R
        self.device = device
        self.gen = gen
        self.cc_major = cc_major
        self.cuda = device != "cpu"

    def sync(self):
        if self.cuda:
            self.t.cuda.synchronize()

    def randn(self, *shape):
        return self.t.randn(*shape, generator=self.gen, device=self.device)


def random_layout(x, lens, bs, num_blocks):
    """A block table [S, width] int32 over a shuffled pool, and the slots of
    every token (sequence by sequence) int64."""
    t = x.t
    perm = t.randperm(num_blocks, generator=x.gen, device=x.device).to(t.int32)
    width = max(1, max((n + bs - 1) // bs for n in lens))
    table = t.zeros(len(lens), width, dtype=t.int32, device=x.device)
    slots, nxt = [], 0
    for s, n in enumerate(lens):
        nb = (n + bs - 1) // bs
        table[s, :nb] = perm[nxt:nxt + nb]
        nxt += nb
        pos = t.arange(n, device=x.device)
        slots.append(table[s, pos // bs].to(t.int64) * bs + pos % bs)
    return table, t.cat(slots)


def contract_data(x, kind, n, num_seqs, hq, hkv):
    k = x.randn(n, hkv, HEAD)
    v = x.randn(n, hkv, HEAD)
    q = x.randn(num_seqs, hq, HEAD) * (6.0 if kind == "peaked" else 1.0)
    if kind == "large logits":
        k[:, :, 0] = 30.0 + 0.5 * x.randn(n, hkv)
        q[:, :, 0] = 40.0 + x.randn(num_seqs, hq)
    return q.contiguous(), k.contiguous(), v.contiguous()


class NoPreciseKeyword(Exception):
    pass


def decode_fp32(x, cache, q, table, lens, hq, ctx, precise):
    """One decode with FP32 q and out, LSE on: (out, lse)."""
    t = x.t
    kw = {"q_dtype": "fp32", "out_dtype": "fp32"}
    if precise:
        kw["precise"] = True
    try:
        dec = cache.decoder(hq, lens.shape[0], ctx, **kw)
    except TypeError as e:
        if precise and "precise" in str(e):
            raise NoPreciseKeyword("this kvpage binding's decoder takes no precise= keyword "
                                   "(kvp_decode_config.precise, ABI 1.2): %s" % e)
        raise
    try:
        out = t.full((lens.shape[0], hq, HEAD), float("nan"), dtype=t.float32, device=x.device)
        lse = t.full((lens.shape[0] * hq,), float("nan"), dtype=t.float32, device=x.device)
        dec(q, table, lens, out=out, lse=lse)
        x.sync()
    finally:
        dec.close()
    return out, lse


def errors(x, out, lse, ref_out, ref_lse):
    """(output rel-L2 over all rows, worst row's rel-L2, LSE error, max |ref LSE|)."""
    t, R = x.t, x.R
    out_err = R.rel_l2(out, ref_out)
    o = out.to(t.float64).reshape(-1, HEAD)
    ro = ref_out.to(device=o.device, dtype=t.float64).reshape(-1, HEAD)
    if not bool(t.isfinite(o).all()):
        row_err = float("inf")
    else:
        den = t.linalg.vector_norm(ro, dim=1)
        num = t.linalg.vector_norm(o - ro, dim=1)
        row_err = float((num / t.where(den > 0, den, t.ones_like(den))).max())
    a = lse.to(t.float64).reshape(-1)
    b = ref_lse.to(device=a.device, dtype=t.float64).reshape(-1)
    if not bool(t.isfinite(a).all()):
        lse_err = float("inf")
    else:
        lse_err = float(((a - b).abs() / (1.0 + b.abs())).max())
    return out_err, row_err, lse_err, float(b.abs().max())


def same_bits(t, a, b):
    return bool(t.equal(a[0], b[0])) and bool(t.equal(a[1], b[1]))


def measure_contract(x, path, data, kernel_check):
    """The default-mode and the precise-mode row of one path and data."""
    t, kvpage, R = x.t, x.kvpage, x.R
    lens_list = LONG_LENS if data == "long context" else CONTRACT_LENS
    hkv = CONTRACT_KV_HEADS
    hq = path.rows * hkv
    bs = path.block_size
    ctx = max(lens_list)
    num_blocks = sum((n + bs - 1) // bs for n in lens_list) + 2
    base = dict(path=path.id, cache=dtype_label(path.k_dtype, path.v_dtype),
                shape=shape_label(path, data), data=data)
    rows = []
    for mode in ("default", "precise"):
        r = dict(base, mode=mode)
        if mode == "default":
            r.update(out_bound=path.out_bound, lse_bound=path.lse_bound)
        else:
            r.update(out_bound=PRECISE_OUT_BOUND, lse_bound=PRECISE_LSE_BOUND)
        if x.cuda:
            r["kernel"] = expected_kernel(path.k_dtype, path.v_dtype, HEAD, bs, path.rows,
                                          x.cc_major, precise=mode == "precise")
        else:
            r["kernel"] = CPU
        r["kernel_name"] = KERNEL_NAMES[r["kernel"]]
        rows.append(r)
    table, slots = random_layout(x, lens_list, bs, num_blocks)
    lens = t.tensor(lens_list, dtype=t.int32, device=x.device)
    q, k, v = contract_data(x, data, slots.shape[0], len(lens_list), hq, hkv)
    configs = list(CONFIGS.items())
    if not (x.cuda and kernel_check):
        configs = configs[:1]  # the default cache alone
    caches = []
    results = {}
    try:
        for name, (env, _, _) in configs:
            with EnvVars(env):
                cache = kvpage.Cache(num_blocks=num_blocks, num_kv_heads=hkv, head_size=HEAD,
                                     block_size=bs, k_dtype=path.k_dtype, v_dtype=path.v_dtype,
                                     device=x.device)
            caches.append(cache)
            cache.write(0, k, v, slots)
            results[name] = decode_fp32(x, cache, q, table, lens, hq, ctx, False)
            if name == "default":
                results["precise"] = decode_fp32(x, cache, q, table, lens, hq, ctx, True)
                kq, vq = R.dequantize(cache, 0)
                ref_out, ref_lse = R.attention(q, R.gather(kq, table), R.gather(vq, table), lens,
                                               return_lse=True)
                del kq, vq
        for r in rows:
            measured = results[r["mode"]]
            r["out_err"], r["row_err"], r["lse_err"], r["lse_max"] = errors(
                x, measured[0], measured[1], ref_out, ref_lse)
            if len(configs) == 1:
                r["check"], r["check_detail"] = "n/a", "not checked"
                continue
            predicted = config_kernels(path, x.cc_major)
            comps = []
            for name, _ in configs:
                if name == "default" and r["mode"] == "default":
                    continue
                comps.append((name, predicted[name], same_bits(t, measured, results[name])))
            r["check"], r["check_detail"] = kernel_verdict(r["kernel"], comps)
    finally:
        for cache in caches:
            cache.close()
    return rows


def make_keys(x, n, hkv, d, outliers):
    t = x.t
    k = x.randn(n, hkv, d)
    if outliers:
        # 4 fixed channels per head, different in each head.
        idx = t.stack([t.randperm(d, generator=x.gen, device=x.device)[:4] for _ in range(hkv)])
        vals = 12.0 + 3.0 * x.randn(n, hkv, 4)
        k.scatter_(2, idx.unsqueeze(0).expand(n, hkv, 4), vals)
    return k.to(t.bfloat16)


E2E_HQ, E2E_HKV, E2E_BLOCK = 32, 8, 16
E2E_DTYPES = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "fp8"), ("int8", "int8"),
              ("int4", "int4"), ("int8", "int4")]


def measure_e2e(x, B, T, cond, smooth, kd, vd):
    """One row of the end-to-end table (the format's error, BF16 q)."""
    t, kvpage, R = x.t, x.kvpage, x.R
    D, HQ, HKV, BLOCK = HEAD, E2E_HQ, E2E_HKV, E2E_BLOCK
    n = B * T
    k = make_keys(x, n, HKV, D, cond == "outlier keys")
    v = x.randn(n, HKV, D).to(t.bfloat16)
    q = x.randn(B, HQ, D).to(t.bfloat16)
    lam = None
    if smooth:
        lam = k.float().abs().amax(dim=0).clamp_min(1e-3).sqrt()  # [HKV, D]
    nb = B * T // BLOCK
    cache = kvpage.Cache(num_blocks=nb, num_kv_heads=HKV, head_size=D, block_size=BLOCK,
                         k_dtype=kd, v_dtype=vd, device=x.device,
                         key_smoothing=lam.cpu() if lam is not None else None)
    try:
        perm = t.randperm(nb, generator=x.gen, device=x.device).to(t.int32)
        table = perm.view(B, T // BLOCK)
        pos = t.arange(T, device=x.device)
        slots = (table[:, pos // BLOCK].to(t.int64) * BLOCK + pos % BLOCK).reshape(-1)
        cache.write(0, k, v, slots)
        stats = cache.write_stats()
        lens = t.full((B,), T, dtype=t.int32, device=x.device)
        outs = {}
        for name, odt in (("bf16", t.bfloat16), ("fp32", t.float32)):
            dec = cache.decoder(HQ, B, T, out_dtype=odt)
            try:
                out = t.full((B, HQ, D), float("nan"), dtype=odt, device=x.device)
                dec(q, table, lens, out=out)
                x.sync()
            finally:
                dec.close()
            outs[name] = out
        kd_ = k.double().view(B, T, HKV, D).transpose(1, 2)
        vd_ = v.double().view(B, T, HKV, D).transpose(1, 2)
        exact = R.attention(q, kd_, vd_, lens)
        del kd_, vd_
        kq, vq = R.dequantize(cache, 0)
        deq = R.attention(q, R.gather(kq, table), R.gather(vq, table), lens,
                          key_smoothing=lam.double() if lam is not None else None)
        del kq, vq
        row = {}
        row["exact"] = R.rel_l2(outs["bf16"], exact)
        row["kernel"] = R.rel_l2(outs["bf16"], deq)
        row["rounding"] = R.rel_l2(deq.to(t.bfloat16), deq)
        row["kernel_fp32"] = R.rel_l2(outs["fp32"], deq)
        row["exact_fp32"] = R.rel_l2(outs["fp32"], exact)
        row["saturated"] = stats.saturated
        row["ok"] = row["kernel"] <= 1.5 * row["rounding"]
        return row
    finally:
        cache.close()


def git_commit():
    try:
        c = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if c.returncode != 0:
            return None
        commit = c.stdout.strip()
        d = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10)
        if d.returncode == 0 and d.stdout.strip():
            commit += " + local changes"
        return commit
    except Exception:  # noqa: BLE001
        return None


def measure(args):
    """Runs every measurement; returns the run's data (meta, contract, e2e)."""
    import torch as t
    import kvpage
    from kvpage import reference as R
    started = time.time()
    cleared = [k for k in PLAN_ENV if k in os.environ]
    for k in cleared:
        print("accuracy: ignoring %s=%s (the run measures the plan's own choice)"
              % (k, os.environ.pop(k)))
    if args.device == "cuda":
        if not t.cuda.is_available() or kvpage.device_count("cuda") == 0:
            raise SystemExit("accuracy: needs a CUDA device and a CUDA build of libkvpage "
                             "(--device cpu checks the script on the CPU backend)")
        dev = "cuda"
        cc = t.cuda.get_device_capability(0)
        device_name = t.cuda.get_device_name(0)
    else:
        dev, cc, device_name = "cpu", (0, 0), "CPU"
    gen = t.Generator(device=dev)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen.manual_seed(seed)
    x = Ctx(t, kvpage, R, dev, gen, cc[0])
    info = kvpage.build_info()
    B, T = (8, 1024) if args.quick else (16, 2048)
    meta = {
        "device": device_name, "cc": "%d.%d" % cc if dev == "cuda" else "—",
        "backend": "CUDA" if dev == "cuda" else "CPU",
        "torch": t.__version__, "torch_cuda": getattr(t.version, "cuda", None),
        "kvpage": kvpage.version(), "abi": "%d.%d" % kvpage.abi_version(),
        "build": "built for %s" % (info.get("cuda_architectures") or "CPU only"),
        "commit": git_commit(), "seed": seed,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "argv": " ".join(sys.argv), "e2e_B": B, "e2e_T": T, "kernel_check": bool(args.kernel_check),
    }
    print("device %s (cc %s), torch %s, kvpage %s (ABI %s), seed %d" % (
        device_name, meta["cc"], t.__version__, meta["kvpage"], meta["abi"], seed), flush=True)
    contract = []
    print("contract (FP32 q and out; against float64 over the dequantized cache):", flush=True)
    for path in PATHS:
        for data in DATA:
            try:
                rows = measure_contract(x, path, data, args.kernel_check)
            except NoPreciseKeyword:
                raise
            except kvpage.KvpError as e:
                rows = [dict(path=path.id, cache=dtype_label(path.k_dtype, path.v_dtype),
                             shape=shape_label(path, data), data=data, mode=mode,
                             out_bound=ob, lse_bound=lb, kernel_name="—",
                             error="%s: %s" % (type(e).__name__, e))
                        for mode, ob, lb in (("default", path.out_bound, path.lse_bound),
                                             ("precise", PRECISE_OUT_BOUND, PRECISE_LSE_BOUND))]
            for r in rows:
                print_contract_row(r)
            contract.extend(rows)
    # Default rows first (by path, data), then precise mode.
    contract.sort(key=lambda r: 0 if r["mode"] == "default" else 1)
    print("contract: %.1f s" % (time.time() - started), flush=True)
    e2e = []
    print("end to end (B=%d T=%d GQA %d/%d D=%d, BF16 q):" % (B, T, E2E_HQ, E2E_HKV, HEAD),
          flush=True)
    for cond in ("gaussian", "outlier keys"):
        for smooth in (False, True):
            for kd, vd in E2E_DTYPES:
                label = kd if kd == vd else "%s/%s" % (kd, vd)
                kern = (expected_kernel(kd, vd, HEAD, E2E_BLOCK, E2E_HQ // E2E_HKV, x.cc_major)
                        if x.cuda else CPU)
                try:
                    r = measure_e2e(x, B, T, cond, smooth, kd, vd)
                except kvpage.KvpError as e:
                    r = {"error": "%s: %s" % (type(e).__name__, e)}
                r.update(cond=cond, smooth=smooth, dtype=label, kernel_id=kern,
                         kernel_name=KERNEL_NAMES[kern])
                e2e.append(r)
                if r.get("error"):
                    print("  %-13s smoothing=%-5s %-10s FAIL: %s" % (cond, smooth, label,
                                                                    r["error"]), flush=True)
                    continue
                print("  %-13s smoothing=%-5s %-10s %-22s exact %.2e kernel %.2e rounding %.2e "
                      "kernel(fp32 out) %.2e %s" % (cond, smooth, label, r["kernel_name"],
                                                    r["exact"], r["kernel"], r["rounding"],
                                                    r["kernel_fp32"],
                                                    "ok" if r["ok"] else "ABOVE ROUNDING"),
                      flush=True)
    meta["seconds"] = int(round(time.time() - started))
    return {"meta": meta, "contract": contract, "e2e": e2e}


def write_outputs(data, out_dir):
    """accuracy.json and accuracy.csv (both tables) into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "accuracy.json"), "w") as f:
        json.dump(data, f, indent=1)
    dev = data["meta"]["device"]
    with open(os.path.join(out_dir, "accuracy.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "table", "mode", "path", "kernel", "cache", "shape", "data",
                    "out_rel_l2", "worst_row_rel_l2", "lse_err", "lse_max", "out_bound",
                    "lse_bound", "kernel_check",
                    "pass"])
        for r in data["contract"]:
            w.writerow([dev, "contract", r["mode"], r["path"], r.get("kernel_name", ""),
                        r["cache"], r["shape"], r["data"],
                        "%.4e" % r["out_err"] if "out_err" in r else "",
                        "%.4e" % r["row_err"] if "row_err" in r else "",
                        "%.4e" % r["lse_err"] if "lse_err" in r else "",
                        "%.2f" % r["lse_max"] if "lse_max" in r else "",
                        bound_text(r["out_bound"]), bound_text(r["lse_bound"]), r.get("check", ""),
                        int(not row_failures(r))])
    with open(os.path.join(out_dir, "accuracy_e2e.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "keys", "smoothing", "kv_dtype", "kernel", "rel_l2_exact",
                    "rel_l2_kernel", "bf16_rounding", "rel_l2_kernel_fp32_out",
                    "rel_l2_exact_fp32_out", "saturated", "at_rounding_level"])
        for r in data["e2e"]:
            if r.get("error"):
                w.writerow([dev, r["cond"], int(r["smooth"]), r["dtype"], r["kernel_name"]] +
                           [""] * 6 + [0])
                continue
            w.writerow([dev, r["cond"], int(r["smooth"]), r["dtype"], r["kernel_name"],
                        "%.4e" % r["exact"], "%.4e" % r["kernel"], "%.4e" % r["rounding"],
                        "%.4e" % r["kernel_fp32"], "%.4e" % r["exact_fp32"], r["saturated"],
                        int(r["ok"])])


def publish(data, out_dir, doc):
    """Writes the page into out_dir, and to `doc` (with its plot) if nothing
    failed. Returns the exit status."""
    bad = failures(data)
    plot_rel = None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        if write_plot(data["e2e"], os.path.join(out_dir, "accuracy.png"), data["meta"]["device"]):
            plot_rel = "accuracy.png"
        elif os.path.exists(os.path.join(out_dir, "accuracy.png")):
            plot_rel = "accuracy.png"  # re-rendering a saved run: the plot it made
        with open(os.path.join(out_dir, "ACCURACY.md"), "w") as f:
            f.write(render_doc(data, plot_rel))
    if bad:
        print()
        print("FAILED (%d):" % len(bad))
        for line in bad:
            print("  " + line)
        if doc:
            print("%s not written (it is written only when every bound holds)" % doc)
        return 1
    if doc:
        rel = None
        if plot_rel:  # beside the page, in img/ (docs/img/accuracy.png)
            img_dir = os.path.join(os.path.dirname(os.path.abspath(doc)), "img")
            os.makedirs(img_dir, exist_ok=True)
            shutil.copyfile(os.path.join(out_dir, plot_rel), os.path.join(img_dir, "accuracy.png"))
            rel = "img/accuracy.png"
        with open(doc, "w") as f:
            f.write(render_doc(data, rel))
        print("wrote %s" % doc)
    print("all %d contract rows and %d end-to-end rows within their bounds"
          % (len(data["contract"]), len(data["e2e"])))
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/accuracy",
                    help="folder for accuracy.json, the CSVs, the plot and the page's text")
    ap.add_argument("--doc", default=None,
                    help="the page to write when nothing failed (default: docs/ACCURACY.md on "
                         "CUDA; none with --device cpu)")
    ap.add_argument("--no-doc", action="store_true", help="write no page outside --out")
    ap.add_argument("--quick", action="store_true",
                    help="end-to-end table on 8 sequences of 1024 tokens (the contract unchanged)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: a new one)")
    ap.add_argument("--no-kernel-check", dest="kernel_check", action="store_false",
                    help="skip the check of which kernel ran (the forced-kernel caches)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the CPU backend (checks the script, not the kernels)")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="re-render the page from a saved accuracy.json (no measuring)")
    ap.add_argument("--selftest", action="store_true",
                    help="run bench/test_accuracy.py (no GPU, no torch)")
    args = ap.parse_args(argv)
    args.doc_explicit = args.doc is not None
    if args.no_doc:
        args.doc = None
    elif args.doc is None and args.device == "cuda":
        args.doc = DEFAULT_DOC
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.selftest:
        import unittest
        sys.path.insert(0, HERE)
        suite = unittest.defaultTestLoader.loadTestsFromName("test_accuracy")
        res = unittest.TextTestRunner(verbosity=1).run(suite)
        return 0 if res.wasSuccessful() else 1
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        if data["meta"].get("backend") != "CUDA" and not args.doc_explicit:
            args.doc = None  # a CPU run never becomes the page unless asked
        return publish(data, os.path.dirname(os.path.abspath(args.from_json)), args.doc)
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    try:
        data = measure(args)
    except NoPreciseKeyword as e:
        print("accuracy: %s" % e)
        return 1
    write_outputs(data, args.out)
    print("measurements: %s" % os.path.join(args.out, "accuracy.json"))
    return publish(data, args.out, args.doc)


if __name__ == "__main__":
    sys.exit(main())
