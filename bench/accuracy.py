#!/usr/bin/env python3
"""Accuracy of kvpage's decode for every KV dtype, on one GPU.

For each KV dtype, on Gaussian K/V and on keys with a few large outlier
channels (as real LLM keys have), with and without key smoothing:

  exact    rel-L2 of the decode output against float64 attention over the
           BF16 K/V the engine wrote (the format's error, end to end);
  kernel   rel-L2 against float64 attention over the dequantized cache (the
           values the stored codes and scales stand for, read back through
           the public layout): what the kernel adds. It must stay at the
           level of the output's rounding:
  rounding rel-L2 of that float64 reference rounded to BF16, the floor any
           BF16 output has;
  kernel (FP32 out)  the same with FP32 output, the kernel's arithmetic
           without the output rounding.

Shape: GQA 32/8, D=128, block 16, 16 sequences of 2048 tokens (--quick: 8 of
1024); q ~ N(0, 1) BF16, outputs BF16 unless said. Outlier keys: in each KV
head, 4 fixed channels hold 12 + 3 N(0, 1) instead of N(0, 1). Smoothing:
lambda = sqrt(max_t |K[t, h, c]|) per head and channel (SmoothAttention's
alpha = 0.5, calibrated on the same keys).

usage: python3 bench/accuracy.py [--quick] [--out DIR]
"""

import argparse
import csv
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

import kvpage  # noqa: E402

HQ, HKV, D, BLOCK = 32, 8, 128, 16
KV_DTYPES = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "fp8"), ("int8", "int8"),
             ("int4", "int4"), ("int8", "int4")]


def make_keys(t, gen, n, outliers):
    k = t.randn(n, HKV, D, device="cuda", generator=gen)
    if outliers:
        # 4 fixed channels per head, different in each head.
        idx = t.stack([t.randperm(D, device="cuda", generator=gen)[:4] for _ in range(HKV)])
        vals = 12.0 + 3.0 * t.randn(n, HKV, 4, device="cuda", generator=gen)
        k.scatter_(2, idx.unsqueeze(0).expand(n, HKV, 4), vals)
    return k.to(t.bfloat16)


def run(t, R, gen, B, T, cond, smooth, kd, vd):
    n = B * T
    k = make_keys(t, gen, n, cond == "outlier keys")
    v = t.randn(n, HKV, D, device="cuda", generator=gen).to(t.bfloat16)
    q = t.randn(B, HQ, D, device="cuda", generator=gen).to(t.bfloat16)
    lam = None
    if smooth:
        lam = k.float().abs().amax(dim=0).clamp_min(1e-3).sqrt()  # [HKV, D]
    nb = B * T // BLOCK
    cache = kvpage.Cache(num_blocks=nb, num_kv_heads=HKV, head_size=D, block_size=BLOCK,
                         k_dtype=kd, v_dtype=vd, device="cuda",
                         key_smoothing=lam.cpu() if lam is not None else None)
    try:
        perm = t.randperm(nb, device="cuda", generator=gen).to(t.int32)
        table = perm.view(B, T // BLOCK)
        pos = t.arange(T, device="cuda")
        slots = (table[:, pos // BLOCK].to(t.int64) * BLOCK + pos % BLOCK).reshape(-1)
        cache.write(0, k, v, slots)
        stats = cache.write_stats()
        lens = t.full((B,), T, dtype=t.int32, device="cuda")
        row = {}
        outs = {}
        for name, odt in (("bf16", t.bfloat16), ("fp32", t.float32)):
            dec = cache.decoder(HQ, B, T, out_dtype=odt)
            out = t.full((B, HQ, D), float("nan"), dtype=odt, device="cuda")
            dec(q, table, lens, out=out)
            outs[name] = out
        t.cuda.synchronize()
        kd_, vd_ = k.double().view(B, T, HKV, D).transpose(1, 2), v.double().view(B, T, HKV, D).transpose(1, 2)
        exact = R.attention(q, kd_, vd_, lens)
        kq, vq = R.dequantize(cache, 0)
        deq = R.attention(q, R.gather(kq, table), R.gather(vq, table), lens,
                          key_smoothing=lam.double() if lam is not None else None)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 sequences of 1024 tokens")
    ap.add_argument("--out", default="out/accuracy", help="folder for the table, CSV and plot")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch as t
    from kvpage import reference as R
    if not t.cuda.is_available() or kvpage.device_count("cuda") == 0:
        print("accuracy: needs a CUDA device and a CUDA build of libkvpage; nothing to measure")
        return 0
    B, T = (8, 1024) if args.quick else (16, 2048)
    gen = t.Generator(device="cuda")
    seed = int.from_bytes(os.urandom(4), "little")
    gen.manual_seed(seed)
    device = t.cuda.get_device_name(0)
    head = "device %s, torch %s, kvpage %s, seed %d, B=%d T=%d GQA %d/%d D=%d" % (
        device, t.__version__, kvpage.version(), seed, B, T, HQ, HKV, D)
    print(head)
    rows = []
    for cond in ("gaussian", "outlier keys"):
        for smooth in (False, True):
            for kd, vd in KV_DTYPES:
                r = run(t, R, gen, B, T, cond, smooth, kd, vd)
                r.update(cond=cond, smooth=smooth, dtype=kd if kd == vd else "%s/%s" % (kd, vd))
                rows.append(r)
                print("  %-13s smoothing=%-5s %-10s exact %.2e kernel %.2e rounding %.2e "
                      "kernel(fp32 out) %.2e %s" % (cond, smooth, r["dtype"], r["exact"],
                                                    r["kernel"], r["rounding"], r["kernel_fp32"],
                                                    "ok" if r["ok"] else "ABOVE ROUNDING"),
                      flush=True)
    lines = [head, "",
             "| keys | smoothing | KV dtype | rel-L2 vs exact | kernel vs dequantized | BF16 rounding floor | kernel, FP32 out | exact, FP32 out | at rounding level |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| %s | %s | %s | %.2e | %.2e | %.2e | %.2e | %.2e | %s |" % (
            r["cond"], "on" if r["smooth"] else "off", r["dtype"], r["exact"], r["kernel"],
            r["rounding"], r["kernel_fp32"], r["exact_fp32"], "yes" if r["ok"] else "NO"))
    text = "\n".join(lines)
    print()
    print(text)
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "accuracy.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "keys", "smoothing", "kv_dtype", "rel_l2_exact", "rel_l2_kernel",
                    "bf16_rounding", "rel_l2_kernel_fp32_out", "rel_l2_exact_fp32_out",
                    "saturated", "at_rounding_level"])
        for r in rows:
            w.writerow([device, r["cond"], int(r["smooth"]), r["dtype"], "%.4e" % r["exact"],
                        "%.4e" % r["kernel"], "%.4e" % r["rounding"], "%.4e" % r["kernel_fp32"],
                        "%.4e" % r["exact_fp32"], r["saturated"], int(r["ok"])])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        dts = []
        for r in rows:
            if r["dtype"] not in dts:
                dts.append(r["dtype"])
        series = [("gaussian", False), ("gaussian", True), ("outlier keys", False),
                  ("outlier keys", True)]
        fig, ax = plt.subplots(figsize=(9, 4))
        wdt = 0.2
        for j, (cond, sm) in enumerate(series):
            ys = [next(r["exact"] for r in rows if r["cond"] == cond and r["smooth"] == sm
                       and r["dtype"] == d) for d in dts]
            ax.bar([i + (j - 1.5) * wdt for i in range(len(dts))], ys, wdt,
                   label="%s, smoothing %s" % (cond, "on" if sm else "off"))
        kern = [max(r["kernel"] for r in rows if r["dtype"] == d) for d in dts]
        floor = [max(r["rounding"] for r in rows if r["dtype"] == d) for d in dts]
        ax.plot(range(len(dts)), kern, "k_", ms=30, mew=2, label="kernel vs dequantized (max)")
        ax.plot(range(len(dts)), floor, "r:", label="BF16 output rounding (max)")
        ax.set_yscale("log")
        ax.set_xticks(range(len(dts)))
        ax.set_xticklabels(dts)
        ax.set_ylabel("rel-L2 error of the decode output")
        ax.set_title("kvpage decode accuracy vs float64 attention (%s, GQA 32/8, D=128)" % device,
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(args.out, "accuracy.png")
        fig.savefig(path, dpi=80)
        print("plot: %s (%d bytes)" % (path, os.path.getsize(path)))
    except Exception as e:
        print("no plot: %s" % e)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
