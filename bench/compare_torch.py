#!/usr/bin/env python3
"""kvpage decode vs PyTorch attention, on one GPU, in one run.

For the shapes of kvpage-bench (bench/kvpage_bench.cc): kvpage's paged decode
(through the Python binding) for every KV dtype, against PyTorch's
scaled_dot_product_attention with the cuDNN and the flash backends (dense
BF16 K/V, enable_gqa=True) and FlexAttention (torch.compile'd), all on the
same random q/K/V. Each implementation's output is checked against a float64
reference before it is timed (kvpage's quantized dtypes against float64
attention over the dequantized cache, where the only difference left is the
output's rounding). The device's copy bandwidth is measured in the same run.

Bytes counted (as kvpage-bench counts them): K, V and scales of every token
attended, read once: kvpage's bytes_per_token_per_layer for kvpage, dense
BF16 K + V for PyTorch. Timing: CUDA events around one call, after a GPU
spin (torch.cuda._sleep) that hides the host's launch overhead, so the
figure is the GPU's time for the call; 10 warm-ups, median of >= 50 runs;
inputs rotate over copies (kvpage: layers) spanning > 4x the L2 cache.

usage: python3 bench/compare_torch.py [--quick] [--out DIR] [--iters N]
           [--dtypes bf16,fp16,fp8,int8,int4] [--skip flex,cudnn,flash]
           [--shapes SUBSTR,...] [--list-shapes]
Needs torch (with CUDA), matplotlib for the plot, and a CUDA build of
libkvpage (KVPAGE_LIBRARY=/path/to/libkvpage.so).
"""

import argparse
import csv
import math
import os
import platform
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

import kvpage  # noqa: E402

DTYPES = ["bf16", "fp16", "fp8", "int8", "int4"]
BLOCK = 16
D = 128


# ---------------------------------------------------------------------------
# Shapes: the same as kvpage-bench, the ragged batch drawn the same way
# (std::mt19937(1234) and std::uniform_real_distribution<double>).
# ---------------------------------------------------------------------------


class MT19937(object):
    """std::mt19937 (32-bit Mersenne Twister, seeded as the C++ standard does)."""

    def __init__(self, seed):
        self.mt = [0] * 624
        self.mt[0] = seed & 0xFFFFFFFF
        for i in range(1, 624):
            self.mt[i] = (1812433253 * (self.mt[i - 1] ^ (self.mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
        self.i = 624

    def next(self):
        if self.i >= 624:
            mt = self.mt
            for k in range(624):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    def uniform(self, a, b):
        # libstdc++: generate_canonical<double, 53> from two 32-bit draws.
        lo = self.next()
        hi = self.next()
        u = (lo + hi * 4294967296.0) / 18446744073709551616.0
        if u >= 1.0:
            u = math.nextafter(1.0, 0.0)
        return a + (b - a) * u


def ragged_lens():
    r = MT19937(1234)
    lo, hi = math.log(16.0), math.log(32768.0)
    return [int(math.exp(r.uniform(lo, hi))) for _ in range(256)]


class Shape(object):
    def __init__(self, name, family, hq, hkv, lens):
        self.name, self.family, self.hq, self.hkv, self.lens = name, family, hq, hkv, lens
        self.batch = len(lens)
        self.tokens = sum(lens)
        self.uniform = len(set(lens)) == 1


def shapes(quick):
    out = []
    for b in (32, 64, 128, 256, 512):
        out.append(Shape("seed GQA 8/1 T=8192 D=128", "seed", 8, 1, [8192] * b))
    out.append(Shape("MHA 32/32 T=4096 D=128", "mha", 32, 32, [4096] * 64))
    out.append(Shape("GQA 32/8 T=8192 D=128", "gqa", 32, 8, [8192] * 64))
    out.append(Shape("ragged 32/8 log-uniform 16..32768", "ragged", 32, 8, ragged_lens()))
    if quick:
        out = [out[0], out[2], out[5], out[7]]
    return out


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class Timer(object):
    """CUDA-event timing of one call, with the GPU kept busy (spinning) while
    the host enqueues it, so the host's overhead stays out of the figure."""

    def __init__(self, torch, iters, warmup=10):
        self.t = torch
        self.iters = iters
        self.warmup = warmup
        # Calibrate the spin: cycles for ~1.5 ms.
        t = torch
        t.cuda.synchronize()
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record()
        t.cuda._sleep(1000000)
        b.record()
        b.synchronize()
        ms = a.elapsed_time(b)
        self.spin = int(1000000 * 1.5 / max(ms, 1e-3))

    def median_ms(self, fn):
        t = self.t
        for i in range(self.warmup):
            fn(i)
        t.cuda.synchronize()
        starts = [t.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [t.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for i in range(self.iters):
            t.cuda._sleep(self.spin)
            starts[i].record()
            fn(self.warmup + i)
            ends[i].record()
        t.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth_gbs(torch, timer):
    """Device-to-device copy of 1 GiB: (bytes read + written) / time."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda i: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * n / (ms * 1e-3) / 1e9


# ---------------------------------------------------------------------------
# Data and reference
# ---------------------------------------------------------------------------


class Problem(object):
    """Random q and K/V of a shape (BF16), and the float64 reference output."""

    def __init__(self, torch, shape, gen):
        t = torch
        self.t = t
        self.shape = shape
        B, HQ, HKV = shape.batch, shape.hq, shape.hkv
        self.q = t.randn(B, HQ, D, device="cuda", dtype=t.bfloat16, generator=gen)
        # K/V packed token-major [tokens, HKV, D] (sequence after sequence):
        # what an engine writes, and the layout jagged tensors use.
        self.k = t.randn(shape.tokens, HKV, D, device="cuda", dtype=t.bfloat16, generator=gen)
        self.v = t.randn(shape.tokens, HKV, D, device="cuda", dtype=t.bfloat16, generator=gen)
        lens = t.tensor(shape.lens, dtype=t.int64)
        self.offsets = t.cat([t.zeros(1, dtype=t.int64), t.cumsum(lens, 0)]).to("cuda")
        self.starts = [0]
        for n in shape.lens:
            self.starts.append(self.starts[-1] + n)
        self.ref = self._reference()

    def dense(self, x):
        """[B, HKV, T, D] contiguous copy of uniform-length packed K or V."""
        s = self.shape
        T = s.lens[0]
        return x.view(s.batch, T, s.hkv, D).transpose(1, 2).contiguous()

    def seq_kv(self, s):
        a, b = self.starts[s], self.starts[s + 1]
        return self.k[a:b], self.v[a:b]

    def _reference(self):
        t = self.t
        s = self.shape
        out = t.empty(s.batch, s.hq, D, dtype=t.float64, device="cuda")
        G = s.hq // s.hkv
        for i in range(s.batch):
            k, v = self.seq_kv(i)
            out[i] = attend64(t, self.q[i], k.double(), v.double(), G)
        return out


def attend64(t, q, k, v, group):
    """Exact attention of one sequence: q [HQ, D]; k, v [L, HKV, D] float64."""
    HQ = q.shape[0]
    HKV = k.shape[1]
    qd = q.double().view(HKV, group, D)
    logits = t.einsum("hgd,lhd->hgl", qd, k) / math.sqrt(D)
    w = t.softmax(logits, dim=-1)
    return t.einsum("hgl,lhd->hgd", w, v).reshape(HQ, D)


def rel_l2(t, x, ref):
    x = x.double()
    if not bool(t.isfinite(x).all()):
        return float("inf")
    return float(t.linalg.vector_norm(x - ref) / t.linalg.vector_norm(ref))


def copies_for_rotation(set_bytes, l2_bytes, cap=16):
    """How many copies of the inputs so that rotating through them spans > 4x L2."""
    return int(min(cap, max(2, (4 * l2_bytes) // max(set_bytes, 1) + 1)))


# ---------------------------------------------------------------------------
# Implementations
# ---------------------------------------------------------------------------


class Result(object):
    def __init__(self, shape, impl, kv_dtype):
        self.shape, self.impl, self.kv_dtype = shape, impl, kv_dtype
        self.us = self.gbs = self.frac = self.speedup = None
        self.err = self.err_exact = None
        self.bytes = None
        self.status = "ok"
        self.note = ""


def run_kvpage(t, prob, dtype, timer, l2_bytes, copy_gbs, gen):
    from kvpage import reference as R
    s = prob.shape
    res = Result(s, "kvpage", dtype)
    nblk = [-(-n // BLOCK) for n in s.lens]
    total_blocks = sum(nblk)
    width = max(nblk)
    probe = kvpage.Cache(num_blocks=total_blocks, num_kv_heads=s.hkv, head_size=D,
                         block_size=BLOCK, dtype=dtype, device="cuda")
    layer_bytes = probe.info.total_bytes
    bpt = probe.info.bytes_per_token_per_layer
    probe.close()
    layers = int(min(64, max(2, (4 * l2_bytes) // layer_bytes + 1)))
    cache = kvpage.Cache(num_blocks=total_blocks, num_kv_heads=s.hkv, head_size=D,
                         block_size=BLOCK, dtype=dtype, device="cuda", num_layers=layers)
    try:
        # Each sequence gets its own blocks, shuffled as a real pool is.
        perm = t.randperm(total_blocks, device="cuda", generator=gen).to(t.int32)
        table = t.zeros(s.batch, width, dtype=t.int32, device="cuda")
        slots = t.empty(s.tokens, dtype=t.int64, device="cuda")
        k0 = 0
        for i, n in enumerate(s.lens):
            table[i, :nblk[i]] = perm[k0:k0 + nblk[i]]
            k0 += nblk[i]
            pos = t.arange(n, device="cuda")
            slots[prob.starts[i]:prob.starts[i + 1]] = (
                table[i, pos // BLOCK].to(t.int64) * BLOCK + pos % BLOCK)
        chunk = 1 << 20
        for layer in range(layers):
            for a in range(0, s.tokens, chunk):
                b = min(s.tokens, a + chunk)
                cache.write(layer, prob.k[a:b], prob.v[a:b], slots[a:b])
        if cache.write_stats() != (0, 0):
            raise RuntimeError("write stats %s" % (cache.write_stats(),))
        lens = t.tensor(s.lens, dtype=t.int32, device="cuda")
        dec = cache.decoder(s.hq, s.batch, max(s.lens))
        out = t.full((s.batch, s.hq, D), float("nan"), dtype=t.bfloat16, device="cuda")
        dec(prob.q, table, lens, out=out, layer=0)
        t.cuda.synchronize()
        # Check: against float64 attention over the dequantized cache (the
        # kernel's own error: must be at the output's rounding) and against
        # exact attention over the BF16 inputs (the format's error).
        res.err_exact = rel_l2(t, out, prob.ref)
        G = s.hq // s.hkv
        zero = t.zeros((), dtype=t.float64, device="cuda")
        num, den, rnd = zero.clone(), zero.clone(), zero.clone()
        i = 0
        while i < s.batch:
            # Sequences in groups of <= 2^20 token-heads (1 GiB of float64 K).
            j, tok = i, 0
            while j < s.batch and (j == i or (tok + s.lens[j]) * s.hkv <= (1 << 20)):
                tok += s.lens[j]
                j += 1
            blocks = t.cat([table[x, :nblk[x]] for x in range(i, j)])
            kq, vq = R.dequantize(cache, 0, blocks=blocks)  # [blocks, HKV, 16, D]
            kq = kq.permute(0, 2, 1, 3).reshape(-1, s.hkv, D)
            vq = vq.permute(0, 2, 1, 3).reshape(-1, s.hkv, D)
            first = 0
            for x in range(i, j):
                a = first * BLOCK
                ref = attend64(t, prob.q[x], kq[a:a + s.lens[x]], vq[a:a + s.lens[x]], G)
                num += ((out[x].double() - ref) ** 2).sum()
                rnd += ((ref.to(t.bfloat16).double() - ref) ** 2).sum()
                den += (ref ** 2).sum()
                first += nblk[x]
            del kq, vq
            i = j
        res.err = math.sqrt(float(num / den))
        floor = math.sqrt(float(rnd / den))
        res.note = "BF16 rounding of the reference: %.2e" % floor
        if not (res.err < max(5e-3, 2.5 * floor)):
            res.status = "FAILED check"
            return res
        ms = timer.median_ms(lambda i: dec(prob.q, table, lens, out=out, layer=i % layers))
        res.bytes = float(s.tokens) * bpt
        res.us = ms * 1e3
        res.gbs = res.bytes / (ms * 1e-3) / 1e9
        res.frac = res.gbs / copy_gbs
        dec.close()
        return res
    finally:
        cache.close()
        t.cuda.empty_cache()


class TorchImpl(object):
    """One PyTorch attention path: prepare(prob) -> callable(i) -> out [B, HQ, D]."""

    name = ""

    def prepare(self, t, prob, copies):
        raise NotImplementedError


def _sdpa_dense(t, prob, copies, backend):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    s = prob.shape
    q4 = prob.q.view(s.batch, s.hq, 1, D)
    k0, v0 = prob.dense(prob.k), prob.dense(prob.v)
    ks = [k0] + [k0.clone() for _ in range(copies - 1)]
    vs = [v0] + [v0.clone() for _ in range(copies - 1)]
    gqa = s.hq != s.hkv

    def call(i):
        j = i % copies
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q4, ks[j], vs[j], enable_gqa=gqa)
        return o.view(s.batch, s.hq, D)
    return call, (ks, vs)


class NotApplicable(Exception):
    """This implementation has no variant for this shape (no table row)."""


def _sdpa_jagged(t, prob, copies, backend, repeat_heads=False):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    s = prob.shape
    G = s.hq // s.hkv
    maxlen, minlen = max(s.lens), min(s.lens)
    qoff = t.arange(s.batch + 1, device="cuda", dtype=t.int64)
    qn = t.nested.nested_tensor_from_jagged(prob.q, qoff, min_seqlen=1, max_seqlen=1)
    qn = qn.transpose(1, 2)
    sets = []
    for c in range(copies):
        if repeat_heads:
            # Jagged SDPA has no GQA: K/V heads materialized HQ/HKV times.
            kk = prob.k.repeat_interleave(G, dim=1)
            vv = prob.v.repeat_interleave(G, dim=1)
        else:
            kk = prob.k if c == 0 else prob.k.clone()
            vv = prob.v if c == 0 else prob.v.clone()
        kn = t.nested.nested_tensor_from_jagged(kk, prob.offsets, min_seqlen=minlen,
                                                max_seqlen=maxlen).transpose(1, 2)
        vn = t.nested.nested_tensor_from_jagged(vv, prob.offsets, min_seqlen=minlen,
                                                max_seqlen=maxlen).transpose(1, 2)
        sets.append((kn, vn))
    gqa = s.hq != s.hkv and not repeat_heads

    def call(i):
        kn, vn = sets[i % copies]
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qn, kn, vn, enable_gqa=gqa)
        return o.transpose(1, 2).values().view(s.batch, s.hq, D)
    return call, sets


class SdpaImpl(TorchImpl):
    """SDPA with one backend: dense [B, H, T, D] K/V for uniform lengths,
    jagged (nested) tensors for ragged batches. ``repeat_heads``: the ragged
    GQA fallback with K/V heads materialized (the only SDPA path there)."""

    def __init__(self, name, backend_name, repeat_heads=False):
        self.name = name
        self.backend_name = backend_name
        self.repeat_heads = repeat_heads

    def prepare(self, t, prob, copies):
        from torch.nn.attention import SDPBackend
        backend = getattr(SDPBackend, self.backend_name)
        s = prob.shape
        if self.repeat_heads:
            if s.uniform or s.hq == s.hkv:
                raise NotApplicable()
            return _sdpa_jagged(t, prob, 1, backend, repeat_heads=True)
        if s.uniform:
            return _sdpa_dense(t, prob, copies, backend)
        return _sdpa_jagged(t, prob, copies, backend)


class FlexImpl(TorchImpl):
    """FlexAttention, compiled once per shape family and reused."""

    name = "flex"

    def __init__(self):
        self.compiled = {}

    def fn(self, t, family):
        if family not in self.compiled:
            from torch.nn.attention.flex_attention import flex_attention
            self.compiled[family] = t.compile(flex_attention)
        return self.compiled[family]

    def prepare(self, t, prob, copies):
        s = prob.shape
        flex = self.fn(t, s.family)
        gqa = s.hq != s.hkv
        if s.uniform:
            q4 = prob.q.view(s.batch, s.hq, 1, D)
            k0, v0 = prob.dense(prob.k), prob.dense(prob.v)
            ks = [k0] + [k0.clone() for _ in range(copies - 1)]
            vs = [v0] + [v0.clone() for _ in range(copies - 1)]

            def call(i):
                j = i % copies
                return flex(q4, ks[j], vs[j], enable_gqa=gqa).view(s.batch, s.hq, D)
            return call, (ks, vs)
        # Ragged: the batch packed into one row with a document mask (query s
        # sees the tokens of sequence s only), the block mask skipping the rest.
        from torch.nn.attention.flex_attention import create_block_mask
        doc = t.repeat_interleave(t.arange(s.batch, device="cuda", dtype=t.int32),
                                  t.tensor(s.lens, device="cuda"))

        def mask_mod(b, h, q_idx, kv_idx):
            return doc[kv_idx] == q_idx
        bm = create_block_mask(mask_mod, None, None, s.batch, s.tokens, device="cuda")
        q4 = prob.q.transpose(0, 1).unsqueeze(0).contiguous()  # [1, HQ, B, D]
        k0 = prob.k.transpose(0, 1).unsqueeze(0).contiguous()  # [1, HKV, tokens, D]
        v0 = prob.v.transpose(0, 1).unsqueeze(0).contiguous()
        ks = [k0] + [k0.clone() for _ in range(copies - 1)]
        vs = [v0] + [v0.clone() for _ in range(copies - 1)]

        def call(i):
            j = i % copies
            o = flex(q4, ks[j], vs[j], block_mask=bm, enable_gqa=gqa)  # [1, HQ, B, D]
            return o[0].transpose(0, 1)
        return call, (ks, vs, bm)


def run_torch(t, prob, impl, timer, l2_bytes, copy_gbs):
    s = prob.shape
    res = Result(s, impl.name, "bf16")
    set_bytes = 2.0 * s.tokens * s.hkv * D * 2
    copies = copies_for_rotation(set_bytes, l2_bytes)
    keep = None
    try:
        t0 = time.time()
        call, keep = impl.prepare(t, prob, copies)
        out = call(0)  # first call compiles (Flex)
        t.cuda.synchronize()
        res.note = "prepare+first call %.1f s" % (time.time() - t0)
        if getattr(impl, "repeat_heads", False):
            res.note = "K/V heads repeated x%d (jagged SDPA has no GQA); %s" % (
                s.hq // s.hkv, res.note)
        res.err = rel_l2(t, out.reshape(s.batch, s.hq, D), prob.ref)
        res.err_exact = res.err
        if not res.err < 1e-2:
            res.status = "FAILED check"
            return res
        ms = timer.median_ms(call)
        res.bytes = set_bytes
        res.us = ms * 1e3
        res.gbs = set_bytes / (ms * 1e-3) / 1e9
        res.frac = res.gbs / copy_gbs
    except NotApplicable:
        return None
    except Exception as e:  # a backend that cannot run this shape
        res.status = "n/a"
        msg = str(e).strip().splitlines()
        res.note = "%s: %s" % (type(e).__name__, msg[0][:160] if msg else "")
        traceback.print_exc(limit=2)
    finally:
        del keep
        t.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def impl_label(r):
    return "kvpage %s" % r.kv_dtype if r.impl == "kvpage" else "torch %s" % r.impl


def fmt(v, f):
    return "-" if v is None else f % v


def print_table(results, out, env=(), quiet=False):
    lines = list(env) + ([""] if env else []) + ["| shape | B | implementation | time (us) | GB/s | of copy BW | speed-up vs fastest PyTorch | rel-L2 error | check |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        status = r.status if r.status != "ok" else "ok"
        if r.status == "n/a":
            status = "n/a (%s)" % r.note[:90].replace("|", "/")
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r.shape.name, r.shape.batch, impl_label(r), fmt(r.us, "%.1f"), fmt(r.gbs, "%.0f"),
            fmt(None if r.frac is None else 100 * r.frac, "%.1f%%"),
            fmt(r.speedup, "%.2fx"), fmt(r.err, "%.1e"), status))
    text = "\n".join(lines)
    if not quiet:
        print(text)
    with open(os.path.join(out, "compare_torch.md"), "w") as f:
        f.write(text + "\n")


def write_csv(results, out, device, copy_gbs):
    with open(os.path.join(out, "compare_torch.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "copy_gbs", "shape", "batch", "implementation", "kv_dtype",
                    "time_us", "gbs", "fraction", "speedup_vs_fastest_torch",
                    "rel_l2_vs_reference", "rel_l2_vs_exact", "status", "note"])
        for r in results:
            w.writerow([device, "%.1f" % copy_gbs, r.shape.name, r.shape.batch, r.impl, r.kv_dtype,
                        fmt(r.us, "%.2f"), fmt(r.gbs, "%.1f"), fmt(r.frac, "%.4f"),
                        fmt(r.speedup, "%.3f"), fmt(r.err, "%.3e"), fmt(r.err_exact, "%.3e"),
                        r.status, r.note])


def plot(results, out, device, copy_gbs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print("no plot: matplotlib unavailable (%s)" % e)
        return
    seed = [r for r in results if r.shape.family == "seed" and r.us is not None]
    labels = []
    for r in results:
        if impl_label(r) not in labels:
            labels.append(impl_label(r))
    colors = {}
    cmap = plt.get_cmap("tab10")
    for i, l in enumerate(labels):
        colors[l] = cmap(i % 10)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    ax_bw, ax_t, ax_o = axes
    for l in labels:
        pts = sorted((r.shape.batch, r.gbs, r.us) for r in seed if impl_label(r) == l)
        if not pts:
            continue
        style = "-o" if l.startswith("kvpage") else "--s"
        ax_bw.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colors[l], label=l, ms=4)
        ax_t.plot([p[0] for p in pts], [p[2] for p in pts], style, color=colors[l], label=l, ms=4)
    ax_bw.axhline(copy_gbs, color="k", lw=1, ls=":", label="copy bandwidth")
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_bw.set_ylabel("GB/s (K+V+scales read)")
    ax_t.set_ylabel("time per decode (us)")
    ax_bw.set_title("GQA 8/1, T=8192, D=128: bandwidth")
    ax_t.set_title("GQA 8/1, T=8192, D=128: time")
    ax_bw.legend(fontsize=7, loc="lower right")
    # Other shapes: speed-up over the fastest PyTorch path (time ratio).
    oth = [r for r in results if r.shape.family != "seed"]
    names = []
    for r in oth:
        if r.shape.name not in names:
            names.append(r.shape.name)
    width = 0.8 / max(1, len(labels))
    for j, l in enumerate(labels):
        for i, n in enumerate(names):
            x = i + (j - len(labels) / 2.0) * width + width / 2
            row = [r for r in oth if r.shape.name == n and impl_label(r) == l]
            if not row:
                continue
            if row[0].speedup is None:
                ax_o.text(x, 0.02, "n/a", rotation=90, fontsize=6, ha="center", va="bottom",
                          transform=ax_o.get_xaxis_transform())
                continue
            ax_o.bar(x, row[0].speedup, width, color=colors[l],
                     label=l if i == 0 or not any(impl_label(r) == l for r in oth
                                                  if r.shape.name in names[:i]) else None)
    ax_o.axhline(1.0, color="k", lw=1, ls=":")
    ax_o.set_xticks(range(len(names)))
    ax_o.set_xticklabels([n.replace(" D=128", "").replace(" log-uniform", "\nlog-uniform")
                          for n in names], fontsize=7)
    ax_o.set_ylim(bottom=0)
    from matplotlib.ticker import FuncFormatter
    ax_o.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%gx" % v))
    if oth:  # a run of the seed shapes only leaves this panel empty
        ax_o.legend(fontsize=6, loc="upper left")
    ax_o.set_ylabel("speed-up over the fastest PyTorch path")
    ax_o.set_title("other shapes (B=64; ragged B=256): speed-up")
    ax_o.grid(axis="y", alpha=0.3)
    fig.suptitle("kvpage decode vs PyTorch on %s (copy bandwidth %.0f GB/s, dotted); "
                 "time = GPU time per decode call" %
                 (device, copy_gbs), fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "compare_torch.png")
    fig.savefig(path, dpi=80)
    print("plot: %s (%d bytes)" % (path, os.path.getsize(path)))


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 shapes instead of 8")
    ap.add_argument("--out", default="out/compare_torch", help="folder for CSV, table, plot")
    ap.add_argument("--iters", type=int, default=60, help="timed runs per case (>= 50)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="kvpage KV dtypes")
    ap.add_argument("--skip", default="", help="comma list of torch paths to skip: cudnn,flash,flex")
    ap.add_argument("--shapes", default="",
                    help="keep shapes whose label '<name> B=<batch>' contains one of these "
                         "comma-separated substrings (as kvpage-bench --shapes)")
    ap.add_argument("--list-shapes", action="store_true", help="print the shapes and exit")
    args = ap.parse_args()
    only = [x for x in args.shapes.split(",") if x]

    def selected():
        return [s for s in shapes(args.quick)
                if not only or any(o in "%s B=%d" % (s.name, s.batch) for o in only)]
    if args.list_shapes:
        for s in selected():
            print("%-36s B=%-4d HQ=%-3d HKV=%-3d tokens=%d max=%d" %
                  (s.name, s.batch, s.hq, s.hkv, s.tokens, max(s.lens)))
        return 0
    if args.iters < 50:
        print("note: --iters %d < 50: figures are not the medians the docs report" % args.iters)
    dtypes = [d for d in args.dtypes.split(",") if d]
    skip = set(x for x in args.skip.split(",") if x)
    os.makedirs(args.out, exist_ok=True)

    import torch as t
    if not t.cuda.is_available():
        print("compare_torch: no CUDA device; nothing to measure")
        return 0
    if kvpage.device_count("cuda") == 0:
        print("compare_torch: libkvpage has no CUDA backend (%s); nothing to measure"
              % kvpage.library().path)
        return 0
    prop = t.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    device = prop.name
    try:
        import triton
        triton_v = triton.__version__
    except Exception:
        triton_v = "n/a"
    env = ["device: %s, %d SMs, L2 %d MiB" % (device, prop.multi_processor_count, l2 >> 20),
           "torch %s, CUDA %s, cuDNN %s, Triton %s, Python %s" % (
               t.__version__, t.version.cuda, t.backends.cudnn.version(), triton_v,
               platform.python_version()),
           "kvpage %s (%s) | %s" % (kvpage.version(), kvpage.library().path,
                                    kvpage.library().build_info())]
    timer = Timer(t, args.iters)
    copy_gbs = copy_bandwidth_gbs(t, timer)
    env.append("copy bandwidth (D2D 1 GiB, read+write): %.0f GB/s" % copy_gbs)
    for line in env:
        print(line)

    impls = []
    if "cudnn" not in skip:
        impls.append(SdpaImpl("sdpa-cudnn", "CUDNN_ATTENTION"))
    if "flash" not in skip:
        impls.append(SdpaImpl("sdpa-flash", "FLASH_ATTENTION"))
    if "flash" not in skip:
        impls.append(SdpaImpl("sdpa-flash, K/V repeated", "FLASH_ATTENTION", repeat_heads=True))
    if "flex" not in skip:
        impls.append(FlexImpl())

    gen = t.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    results = []
    t_start = time.time()
    for s in selected():
        t1 = time.time()
        prob = Problem(t, s, gen)
        rows = []
        for impl in impls:
            r = run_torch(t, prob, impl, timer, l2, copy_gbs)
            if r is None:
                continue
            rows.append(r)
            print("  %-36s B=%-4d %-18s %s %s %s" % (s.name, s.batch, impl_label(r),
                                                     fmt(r.us, "%9.1f us"), r.status, r.note),
                  flush=True)
        for d in dtypes:
            try:
                r = run_kvpage(t, prob, d, timer, l2, copy_gbs, gen)
            except Exception as e:
                r = Result(s, "kvpage", d)
                r.status = "error"
                r.note = "%s: %s" % (type(e).__name__, str(e)[:160])
                traceback.print_exc()
            rows.append(r)
            print("  %-36s B=%-4d %-18s %s err %s %s" % (s.name, s.batch, impl_label(r),
                                                         fmt(r.us, "%9.1f us"), fmt(r.err, "%.1e"),
                                                         r.status), flush=True)
        torch_us = [r.us for r in rows if r.impl != "kvpage" and r.us is not None]
        fastest = min(torch_us) if torch_us else None
        for r in rows:
            if fastest is not None and r.us is not None:
                r.speedup = fastest / r.us
        results.extend(rows)
        # Partial results on disk after every shape.
        print_table(results, args.out, env, quiet=True)
        write_csv(results, args.out, device, copy_gbs)
        del prob
        t.cuda.empty_cache()
        print("  (shape done in %.1f s)" % (time.time() - t1), flush=True)
    print("\ntotal %.1f s\n" % (time.time() - t_start))
    print_table(results, args.out, env)
    write_csv(results, args.out, device, copy_gbs)
    plot(results, args.out, device, copy_gbs)
    # Exit status: kvpage's own rows (a PyTorch path that cannot run a shape,
    # or gets it wrong, is reported in the table, not as a failure here).
    failed = [r for r in results if r.impl == "kvpage" and r.status != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
