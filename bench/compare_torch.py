#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
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

Attention over query chunks (--attend: these alone; --all: after the decode
shapes): the cases of kvpage-bench --attend (prefill, one chunk over a long
context, many chunks, a chunk mixed with 255 decoding sequences and its two
parts alone, short chunks; GQA 32/8 and 8/1), on random BF16 q/K/V.
kvpage runs kvp_attend over the whole batch in one call, through the
binding's Decoder.attend (ABI 1.3; rows say n/a, and why, on an older
library or binding); the decoding part alone also runs through kvp_decode.
PyTorch runs SDPA (flash and cuDNN backends, dense BF16 K/V,
enable_gqa=True, K/V heads repeated where that fails) with a lower-right
causal mask (causal_lower_right; is_causal=True where the chunk is the
whole context; no mask for one query token), and compiled FlexAttention
with the same mask as a block mask. PyTorch has no varlen batch here: each
group of sequences with equal (query tokens, context) runs as one dense
batch, timed on its own, and a mix's time is the sum of its groups' (the
rows' notes say so). Each output is checked on a sample of query tokens
against float64 attention (kvpage: over the dequantized cache) before it
is timed. Reported: time, TFLOP/s = 4 * HQ * D * (keys visible to every
query token; causal, the token at position p sees p + 1) / time, and the
fraction of the H100's dense BF16 peak (989 TFLOP/s); for the mix,
time(mixed) / (time(chunk alone) + time(decode alone)). Written to
compare_torch_attend.md / .csv in --out.

usage: python3 bench/compare_torch.py [--quick] [--out DIR] [--iters N]
           [--dtypes bf16,fp16,fp8,int8,int4] [--skip flex,cudnn,flash]
           [--shapes SUBSTR,...] [--list-shapes] [--attend | --all]
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
    for b in (16, 32, 64, 128, 256, 512):
        out.append(Shape("seed GQA 8/1 T=8192 D=128", "seed", 8, 1, [8192] * b))
    out.append(Shape("MHA 32/32 T=4096 D=128", "mha", 32, 32, [4096] * 64))
    out.append(Shape("GQA 32/8 T=8192 D=128", "gqa", 32, 8, [8192] * 64))
    out.append(Shape("ragged 32/8 log-uniform 16..32768", "ragged", 32, 8, ragged_lens()))
    # Latency-bound steps: a few sequences over long contexts.
    for t in (32768, 131072):
        for hq, hkv in ((32, 8), (8, 1)):
            for b in (1, 2, 4, 8):
                out.append(Shape("latency GQA %d/%d T=%d D=128" % (hq, hkv, t), "latency", hq, hkv,
                                 [t] * b))
    if quick:
        keep = {("seed GQA 8/1 T=8192 D=128", 32), ("seed GQA 8/1 T=8192 D=128", 128),
                ("MHA 32/32 T=4096 D=128", 64), ("ragged 32/8 log-uniform 16..32768", 256)}
        out = [s for s in out if (s.name, s.batch) in keep]
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


class PagedCache(object):
    """A kvpage cache holding K and V (packed [tokens, HKV, D], sequence s at
    rows starts[s] .. starts[s + 1] - 1) in every layer: layers enough that
    calls rotating through them span > 4x the L2 (at least min_layers, at
    most 64), each sequence's blocks drawn from a shuffled pool, as a real
    pool's are. .table: int32 [sequences, width]; .nblk: blocks per
    sequence. The cache is closed if filling it fails."""

    def __init__(self, t, lens, starts, hkv, k, v, dtype, l2_bytes, gen, min_layers):
        self.nblk = nblk = [-(-n // BLOCK) for n in lens]
        total_blocks, width = sum(nblk), max(nblk)
        probe = kvpage.Cache(num_blocks=total_blocks, num_kv_heads=hkv, head_size=D,
                             block_size=BLOCK, dtype=dtype, device="cuda")
        layer_bytes = probe.info.total_bytes
        self.bytes_per_token = probe.info.bytes_per_token_per_layer
        probe.close()
        self.layers = int(min(64, max(min_layers, (4 * l2_bytes) // layer_bytes + 1)))
        self.cache = cache = kvpage.Cache(num_blocks=total_blocks, num_kv_heads=hkv,
                                          head_size=D, block_size=BLOCK, dtype=dtype,
                                          device="cuda", num_layers=self.layers)
        try:
            perm = t.randperm(total_blocks, device="cuda", generator=gen).to(t.int32)
            self.table = t.zeros(len(lens), width, dtype=t.int32, device="cuda")
            tokens = sum(lens)
            slots = t.empty(tokens, dtype=t.int64, device="cuda")
            k0 = 0
            for i, n in enumerate(lens):
                self.table[i, :nblk[i]] = perm[k0:k0 + nblk[i]]
                k0 += nblk[i]
                pos = t.arange(n, device="cuda")
                slots[starts[i]:starts[i + 1]] = (
                    self.table[i, pos // BLOCK].to(t.int64) * BLOCK + pos % BLOCK)
            chunk = 1 << 20
            for layer in range(self.layers):
                for a in range(0, tokens, chunk):
                    b = min(tokens, a + chunk)
                    cache.write(layer, k[a:b], v[a:b], slots[a:b])
            if cache.write_stats() != (0, 0):
                raise RuntimeError("write stats %s" % (cache.write_stats(),))
        except BaseException:
            cache.close()
            t.cuda.empty_cache()
            raise


def run_kvpage(t, prob, dtype, timer, l2_bytes, copy_gbs, gen):
    from kvpage import reference as R
    s = prob.shape
    res = Result(s, "kvpage", dtype)
    pc = PagedCache(t, s.lens, prob.starts, s.hkv, prob.k, prob.v, dtype, l2_bytes, gen, 2)
    cache, layers, table, nblk = pc.cache, pc.layers, pc.table, pc.nblk
    try:
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
        res.bytes = float(s.tokens) * pc.bytes_per_token
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
# Attention over query chunks (--attend): the cases of kvpage-bench --attend
# ---------------------------------------------------------------------------

# H100 SXM dense BF16 tensor-core peak (TFLOP/s), as kvpage-bench reports.
PEAK_TFLOPS = 989.0


class AttendCase(object):
    """One batch: sequence s has context ctx[s] (new tokens included) and
    brings the last nq[s] of them as query tokens (causal, aligned to the end).
    ``groups``: runs of sequences with equal (nq, ctx), [(first, count, n, L)],
    the batches the dense PyTorch paths run one by one."""

    def __init__(self, shape_name, hq, hkv, name, ctx, nq, role=""):
        self.shape_name, self.hq, self.hkv, self.name = shape_name, hq, hkv, name
        self.ctx, self.nq, self.role = list(ctx), list(nq), role
        self.batch = len(ctx)
        self.q_tokens = sum(nq)
        self.tokens = sum(ctx)
        self.max_ctx = max(ctx)
        # Causal: the query token at position p sees p + 1 keys.
        keys = sum(n * (2 * l - n + 1) // 2 for n, l in zip(nq, ctx))
        self.flops = 4.0 * hq * D * keys
        self.groups = []
        for s, (n, l) in enumerate(zip(nq, ctx)):
            if self.groups and self.groups[-1][2:] == (n, l):
                f, c, _, _ = self.groups[-1]
                self.groups[-1] = (f, c + 1, n, l)
            else:
                self.groups.append((s, 1, n, l))

    @property
    def label(self):
        # kvpage-bench's label: "attend <shape>: <case>".
        return "attend %s: %s" % (self.shape_name, self.name)


def attend_cases(quick):
    out = []
    shapes = [("GQA 32/8 D=128", 32, 8), ("GQA 8/1 D=128", 8, 1)]
    if quick:
        shapes = shapes[:1]
    for sname, hq, hkv in shapes:
        def c(name, ctx, nq, role=""):
            out.append(AttendCase(sname, hq, hkv, name, ctx, nq, role))
        c("a prefill 8x4096 ctx 4096", [4096] * 8, [4096] * 8)
        c("b chunk 2048 ctx 8192", [8192], [2048])
        c("b chunk 2048 ctx 32768", [32768], [2048])
        c("c 16x256 ctx 4096", [4096] * 16, [256] * 16)
        c("d mixed 2048 + 255x1 ctx 8192", [8192] * 256, [2048] + [1] * 255, "mixed")
        c("d chunk alone 2048 ctx 8192", [8192], [2048], "chunk")
        c("d decode alone 255x1 ctx 8192", [8192] * 255, [1] * 255, "decode")
        c("e 4x16 ctx 8192", [8192] * 4, [16] * 4)
        c("e 4x64 ctx 8192", [8192] * 4, [64] * 4)
        c("e 1x16 ctx 32768", [32768], [16])
    return out


def attend_copies(set_bytes, l2_bytes):
    """Input copies to rotate through: one where a set alone spans > 4x L2."""
    return 1 if set_bytes > 4 * l2_bytes else copies_for_rotation(set_bytes, l2_bytes)


class AttendProblem(object):
    """Random q [query tokens, HQ, D] and K/V [context tokens, HKV, D] (BF16,
    packed sequence after sequence), and the float64 reference of a sample
    of query tokens: the first and last sequence of each group, 5 tokens of
    each (first, quarters, last)."""

    def __init__(self, torch, case, gen):
        t = torch
        self.t, self.case = t, case
        HQ, HKV = case.hq, case.hkv
        self.q = t.randn(case.q_tokens, HQ, D, device="cuda", dtype=t.bfloat16, generator=gen)
        self.k = t.randn(case.tokens, HKV, D, device="cuda", dtype=t.bfloat16, generator=gen)
        self.v = t.randn(case.tokens, HKV, D, device="cuda", dtype=t.bfloat16, generator=gen)
        self.kv_starts, self.q_starts = [0], [0]
        for n, l in zip(case.nq, case.ctx):
            self.kv_starts.append(self.kv_starts[-1] + l)
            self.q_starts.append(self.q_starts[-1] + n)
        seqs = []
        for f, cnt, _, _ in case.groups:
            for s in (f, f + cnt - 1):
                if s not in seqs:
                    seqs.append(s)
        # samples: (seq, token index in the chunk, packed query row)
        self.samples = []
        for s in seqs:
            n = case.nq[s]
            for i in sorted(set([0, n // 4, n // 2, (3 * n) // 4, n - 1])):
                self.samples.append((s, i, self.q_starts[s] + i))
        self.ref = self.reference(lambda s: self.seq_kv(s))
        self.dense = {}

    def seq_kv(self, s):
        a, b = self.kv_starts[s], self.kv_starts[s + 1]
        return self.k[a:b], self.v[a:b]

    def reference(self, kv_of):
        """{packed row: float64 [HQ, D]} for the samples, over kv_of(s) -> (K, V)
        [L, HKV, D] of sequence s."""
        t, c = self.t, self.case
        G = c.hq // c.hkv
        out = {}
        for s in sorted(set(x[0] for x in self.samples)):
            k, v = kv_of(s)
            k, v = k.double(), v.double()
            for s2, i, row in self.samples:
                if s2 != s:
                    continue
                p = c.ctx[s] - c.nq[s] + i
                out[row] = attend64(t, self.q[row], k[:p + 1], v[:p + 1], G)
            del k, v
        return out

    def errors(self, out, ref=None):
        """Largest rel-L2 over the sampled tokens of out [query tokens, HQ, D]
        against ref (default: exact attention over the BF16 inputs), and the
        largest BF16 rounding of the reference itself (the floor)."""
        t = self.t
        ref = self.ref if ref is None else ref
        err, floor = 0.0, 0.0
        for _, _, row in self.samples:
            err = max(err, rel_l2(t, out[row], ref[row]))
            floor = max(floor, rel_l2(t, ref[row].to(t.bfloat16), ref[row]))
        return err, floor

    def group_tensors(self, g, copies, repeat_heads=False):
        """Dense BF16 tensors of group g: q [B, HQ, n, D] and `copies` (K, V)
        pairs [B, HKV, L, D] (HQ heads when repeat_heads), kept until
        drop_dense()."""
        key = (g, copies, repeat_heads)
        if key in self.dense:
            return self.dense[key]
        c = self.case
        f, cnt, n, l = c.groups[g]
        a, b = self.q_starts[f], self.q_starts[f + cnt]
        q4 = self.q[a:b].view(cnt, n, c.hq, D).transpose(1, 2).contiguous()
        ka, kb = self.kv_starts[f], self.kv_starts[f + cnt]

        def dense(x):
            x = x[ka:kb].view(cnt, l, c.hkv, D).transpose(1, 2)
            if repeat_heads:
                x = x.repeat_interleave(c.hq // c.hkv, dim=1)
            return x.contiguous()
        k0, v0 = dense(self.k), dense(self.v)
        sets = [(k0, v0)] + [(k0.clone(), v0.clone()) for _ in range(copies - 1)]
        self.dense[key] = (q4, sets)
        return self.dense[key]

    def drop_dense(self):
        self.dense = {}
        self.t.cuda.empty_cache()


class AttendResult(object):
    def __init__(self, case, impl, kv_dtype):
        self.case, self.impl, self.kv_dtype = case, impl, kv_dtype
        self.us = self.tflops = self.frac = self.speedup = None
        self.err = self.err_exact = None
        self.status = "ok"
        self.note = ""


def _attend_mask(t, n, l):
    """SDPA's mask arguments for n query tokens at the end of l keys."""
    from torch.nn.attention.bias import causal_lower_right
    if n == 1:
        return {}  # the one query token sees every key
    if n == l:
        return {"is_causal": True}
    return {"attn_mask": causal_lower_right(n, l)}


class SdpaAttend(object):
    """SDPA with one backend over each group's dense K/V, lower-right causal
    (causal_lower_right; is_causal=True where n == L; no mask for n == 1)."""

    def __init__(self, name, backend_name):
        self.name, self.backend_name = name, backend_name

    def prepare(self, t, prob, g, copies):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, self.backend_name)
        c = prob.case
        _, _, n, l = c.groups[g]
        mask = _attend_mask(t, n, l)
        gqa = c.hq != c.hkv

        def make(repeat):
            q4, sets = prob.group_tensors(g, 1 if repeat else copies, repeat_heads=repeat)

            def call(i):
                k, v = sets[i % len(sets)]
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q4, k, v, enable_gqa=gqa and not repeat,
                                                          **mask)
            return call
        call = make(False)
        try:
            call(0)
            return call, ""
        except Exception as e:
            if not gqa:
                raise
            first = e
        # No GQA in this backend (or this torch): K/V heads materialized.
        prob.drop_dense()
        try:
            call = make(True)
            call(0)
        except Exception:
            raise first
        return call, "K/V heads repeated x%d" % (c.hq // c.hkv)


class FlexAttend(object):
    """FlexAttention (compiled) with a lower-right causal block mask."""

    name = "flex"

    def __init__(self, t):
        from torch.nn.attention.flex_attention import flex_attention
        try:  # one compiled graph per shape: allow more than the default 8
            import torch._dynamo
            for knob in ("cache_size_limit", "recompile_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config,
                                                                        knob)))
        except Exception:
            pass
        self.flex = t.compile(flex_attention, dynamic=False)

    def prepare(self, t, prob, g, copies):
        from torch.nn.attention.flex_attention import create_block_mask
        c = prob.case
        cnt, n, l = c.groups[g][1:]
        q4, sets = prob.group_tensors(g, copies)
        gqa = c.hq != c.hkv
        bm = None
        if n > 1:
            off = l - n

            def mask_mod(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + off
            bm = create_block_mask(mask_mod, None, None, n, l, device="cuda")
        flex = self.flex

        def call(i):
            k, v = sets[i % len(sets)]
            return flex(q4, k, v, block_mask=bm, enable_gqa=gqa)
        return call, ""


def run_torch_attend(t, prob, impl, timer, l2_bytes):
    """One PyTorch path over every group of the case; the times of the
    groups (each timed on its own) are summed."""
    c = prob.case
    res = AttendResult(c, impl.name, "bf16")
    out = t.full((c.q_tokens, c.hq, D), float("nan"), dtype=t.bfloat16, device="cuda")
    total_ms, notes = 0.0, []
    try:
        t0 = time.time()
        for g, (f, cnt, n, l) in enumerate(c.groups):
            copies = attend_copies(2.0 * cnt * l * c.hkv * D * 2, l2_bytes)
            call, note = impl.prepare(t, prob, g, copies)
            if note and note not in notes:
                notes.append(note)
            o = call(0)  # [cnt, HQ, n, D]
            a = prob.q_starts[f]
            out[a:a + cnt * n] = o.transpose(1, 2).reshape(cnt * n, c.hq, D)
            t.cuda.synchronize()
            total_ms += timer.median_ms(call)
        if len(c.groups) > 1:
            notes.append("sum of %d groups timed one by one" % len(c.groups))
        notes.append("prepare+timing %.1f s" % (time.time() - t0))
        res.note = "; ".join(notes)
        res.err, _ = prob.errors(out)
        res.err_exact = res.err
        if not res.err < 1e-2:
            res.status = "FAILED check"
            return res
        res.us = total_ms * 1e3
        res.tflops = c.flops / (total_ms * 1e-3) / 1e12
        res.frac = res.tflops / PEAK_TFLOPS
    except Exception as e:
        res.status = "n/a"
        msg = str(e).strip().splitlines()
        res.note = "%s: %s" % (type(e).__name__, msg[0][:160] if msg else "")
        traceback.print_exc(limit=2)
    finally:
        prob.drop_dense()
    return res


def attend_unavailable():
    """Why kvpage's kvp_attend rows cannot run, or None: they need the
    binding's Decoder.attend and a library of ABI 1.3."""
    if not hasattr(kvpage.Decoder, "attend"):
        return ("the kvpage binding in %s has no Decoder.attend (too old): use this "
                "tree's bindings/python" % os.path.dirname(os.path.abspath(kvpage.__file__)))
    major, minor = kvpage.abi_version()
    if (major, minor) < (1, 3):
        return "libkvpage ABI %d.%d has no kvp_attend (1.3)" % (major, minor)
    return None


def run_kvpage_attend(t, prob, dtype, timer, l2_bytes, gen, unavailable, via_decode=False):
    """kvp_attend over the whole batch in one call (or, via_decode, kvp_decode
    with one query token per sequence); checked on the sampled tokens against
    float64 attention over the dequantized cache, then timed. unavailable:
    attend_unavailable()'s reason (kvp_attend rows n/a), or None."""
    from kvpage import reference as R
    c = prob.case
    res = AttendResult(c, "kvpage (kvp_decode)" if via_decode else "kvpage", dtype)
    if not via_decode and unavailable:
        res.status = "n/a"
        res.note = unavailable
        return res
    # One layer where it alone spans > 4x the L2.
    pc = PagedCache(t, c.ctx, prob.kv_starts, c.hkv, prob.k, prob.v, dtype, l2_bytes, gen, 1)
    cache, layers, table, nblk = pc.cache, pc.layers, pc.table, pc.nblk
    dec = None
    try:
        lens = t.tensor(c.ctx, dtype=t.int32, device="cuda")
        out = t.full((c.q_tokens, c.hq, D), float("nan"), dtype=t.bfloat16, device="cuda")
        starts = t.tensor(prob.q_starts, dtype=t.int32, device="cuda")
        if via_decode:
            dec = cache.decoder(c.hq, c.batch, c.max_ctx)

            def call(i):
                dec(prob.q, table, lens, out=out, layer=i % layers)
        else:
            dec = cache.decoder(c.hq, c.batch, c.max_ctx, max_query_tokens=c.q_tokens)

            def call(i):
                dec.attend(prob.q, starts, table, lens, out=out, layer=i % layers)
        call(0)
        t.cuda.synchronize()

        def deq(s):  # [L, HKV, D] float64 of layer 0, through the table
            kq, vq = R.dequantize(cache, 0, blocks=table[s, :nblk[s]])
            kq = kq.permute(0, 2, 1, 3).reshape(-1, c.hkv, D)[:c.ctx[s]]
            vq = vq.permute(0, 2, 1, 3).reshape(-1, c.hkv, D)[:c.ctx[s]]
            return kq, vq
        res.err, floor = prob.errors(out, prob.reference(deq))
        res.err_exact, _ = prob.errors(out)
        res.note = "BF16 rounding of the reference: %.2e" % floor
        if not (res.err < max(1e-2, 2.5 * floor)):
            res.status = "FAILED check"
            return res
        ms = timer.median_ms(call)
        res.us = ms * 1e3
        res.tflops = c.flops / (ms * 1e-3) / 1e12
        res.frac = res.tflops / PEAK_TFLOPS
        return res
    finally:
        if dec is not None:
            dec.close()
        cache.close()
        t.cuda.empty_cache()


def attend_impl_label(impl, kv_dtype):
    if impl.startswith("kvpage"):
        return impl.replace("kvpage", "kvpage %s" % kv_dtype, 1)
    return "torch %s" % impl


def attend_label(r):
    return attend_impl_label(r.impl, r.kv_dtype)


def print_attend_table(results, out, env=(), quiet=False):
    lines = list(env) + ([""] if env else []) + [
        "kvp_attend cases (kvpage-bench --attend): TFLOP/s = 4 * HQ * D * (keys visible to "
        "every query token, causal) / time; peak %.0f TFLOP/s (H100 dense BF16). PyTorch "
        "runs each group of equal (query tokens, context) as one dense batch; a mix's time "
        "is the sum of its groups' (see the notes)." % PEAK_TFLOPS,
        "",
        "| case | heads q/kv | seqs | query tokens | implementation | time (us) | TFLOP/s | "
        "of peak | speed-up vs fastest PyTorch | max rel-L2 (sampled tokens) | check | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        c = r.case
        status = r.status
        note = r.note.replace("|", "/")
        if r.status == "n/a":
            status = "n/a"
        lines.append("| %s | %d/%d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c.name, c.hq, c.hkv, c.batch, c.q_tokens, attend_label(r), fmt(r.us, "%.1f"),
            fmt(r.tflops, "%.1f"), fmt(None if r.frac is None else 100 * r.frac, "%.1f%%"),
            fmt(r.speedup, "%.2fx"), fmt(r.err, "%.1e"), status, note[:120]))
    # (d): the mixed batch against its parts, per implementation.
    ratio = []
    for r in results:
        if r.case.role != "mixed" or r.us is None:
            continue
        parts = {}
        for x in results:
            if (x.case.shape_name == r.case.shape_name and x.kv_dtype == r.kv_dtype
                    and x.us is not None and x.case.role in ("chunk", "decode")):
                parts.setdefault((x.case.role, x.impl), x.us)
        chunk = parts.get(("chunk", r.impl))
        for dec_impl in ([r.impl, "kvpage (kvp_decode)"] if r.impl == "kvpage" else [r.impl]):
            dec = parts.get(("decode", dec_impl))
            if chunk is None or dec is None:
                continue
            ratio.append("| %s | %s | %s | %.1f | %.1f | %.1f | %.2f |" % (
                r.case.shape_name, attend_label(r), attend_impl_label(dec_impl, r.kv_dtype),
                r.us, chunk, dec, r.us / (chunk + dec)))
    if ratio:
        lines += ["", "mixed batch (d): time(mixed) / (time(chunk alone) + time(decode alone))",
                  "",
                  "| shape | implementation | decode alone by | mixed (us) | chunk alone (us) | "
                  "decode alone (us) | ratio |", "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += ratio
    text = "\n".join(lines)
    if not quiet:
        print(text)
    with open(os.path.join(out, "compare_torch_attend.md"), "w") as f:
        f.write(text + "\n")


def write_attend_csv(results, out, device):
    with open(os.path.join(out, "compare_torch_attend.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "case", "heads_q", "heads_kv", "seqs", "query_tokens",
                    "implementation", "kv_dtype", "time_us", "tflops", "fraction_of_peak",
                    "speedup_vs_fastest_torch", "max_rel_l2_vs_reference",
                    "max_rel_l2_vs_exact", "status", "note"])
        for r in results:
            c = r.case
            w.writerow([device, c.label, c.hq, c.hkv, c.batch, c.q_tokens, r.impl, r.kv_dtype,
                        fmt(r.us, "%.2f"), fmt(r.tflops, "%.2f"), fmt(r.frac, "%.4f"),
                        fmt(r.speedup, "%.3f"), fmt(r.err, "%.3e"), fmt(r.err_exact, "%.3e"),
                        r.status, r.note])


def sdpa_paths(make, skip):
    """make(name, backend name) for SDPA's cuDNN and flash backends, those
    that --skip leaves, in that order."""
    return [make("sdpa-" + key, backend) for key, backend in
            (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")) if key not in skip]


def run_attend_cases(t, cases, dtypes, skip, timer, l2, gen, out_dir, env, device):
    impls = sdpa_paths(SdpaAttend, skip)
    if "flex" not in skip:
        try:
            impls.append(FlexAttend(t))
        except Exception as e:
            print("no FlexAttention: %s: %s" % (type(e).__name__, str(e)[:160]))
    unavailable = attend_unavailable()
    if unavailable:
        print("kvpage kvp_attend rows: n/a (%s)" % unavailable)
    else:
        print("kvpage kvp_attend through the binding's Decoder.attend")
    results = []
    for c in cases:
        t1 = time.time()
        prob = AttendProblem(t, c, gen)
        rows = []
        for impl in impls:
            r = run_torch_attend(t, prob, impl, timer, l2)
            rows.append(r)
            print("  %-44s %-22s %s %s %s" % (c.label, attend_label(r), fmt(r.us, "%10.1f us"),
                                              r.status, r.note), flush=True)
        kinds = [False] + ([True] if c.role == "decode" else [])
        for via_decode in kinds:
            for d in dtypes:
                try:
                    r = run_kvpage_attend(t, prob, d, timer, l2, gen, unavailable, via_decode)
                except Exception as e:
                    r = AttendResult(c, "kvpage (kvp_decode)" if via_decode else "kvpage", d)
                    r.status = "error"
                    r.note = "%s: %s" % (type(e).__name__, str(e)[:160])
                    traceback.print_exc()
                rows.append(r)
                print("  %-44s %-22s %s err %s %s" % (c.label, attend_label(r),
                                                      fmt(r.us, "%10.1f us"), fmt(r.err, "%.1e"),
                                                      r.status), flush=True)
        torch_us = [r.us for r in rows if not r.impl.startswith("kvpage") and r.us is not None]
        fastest = min(torch_us) if torch_us else None
        for r in rows:
            if fastest is not None and r.us is not None:
                r.speedup = fastest / r.us
        results.extend(rows)
        print_attend_table(results, out_dir, env, quiet=True)
        write_attend_csv(results, out_dir, device)
        del prob
        t.cuda.empty_cache()
        print("  (case done in %.1f s)" % (time.time() - t1), flush=True)
    return results


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
    oth = [r for r in results if r.shape.family in ("mha", "gqa", "ragged")]
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
    ap.add_argument("--quick", action="store_true",
                    help="4 shapes instead of 8; attend cases of GQA 32/8 only")
    ap.add_argument("--out", default="out/compare_torch", help="folder for CSV, table, plot")
    ap.add_argument("--iters", type=int, default=60, help="timed runs per case (>= 50)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="kvpage KV dtypes")
    ap.add_argument("--skip", default="", help="comma list of torch paths to skip: cudnn,flash,flex")
    ap.add_argument("--shapes", default="",
                    help="keep shapes whose label '<name> B=<batch>' contains one of these "
                         "comma-separated substrings (as kvpage-bench --shapes)")
    ap.add_argument("--list-shapes", action="store_true", help="print the shapes and exit")
    ap.add_argument("--attend", action="store_true",
                    help="only the kvp_attend (query chunk) cases, as kvpage-bench --attend")
    ap.add_argument("--all", action="store_true", help="the decode shapes, then the attend cases")
    args = ap.parse_args()
    only = [x for x in args.shapes.split(",") if x]
    run_decode = not args.attend or args.all
    run_attend = args.attend or args.all

    def selected():
        if not run_decode:
            return []
        return [s for s in shapes(args.quick)
                if not only or any(o in "%s B=%d" % (s.name, s.batch) for o in only)]

    def selected_attend():
        if not run_attend:
            return []
        return [c for c in attend_cases(args.quick) if not only or any(o in c.label for o in only)]
    if args.list_shapes:
        for s in selected():
            print("%-36s B=%-4d HQ=%-3d HKV=%-3d tokens=%d max=%d" %
                  (s.name, s.batch, s.hq, s.hkv, s.tokens, max(s.lens)))
        for c in selected_attend():
            print("%-58s seqs=%-4d query tokens=%-6d context max=%-6d groups=%d TFLOP=%.3f" %
                  (c.label, c.batch, c.q_tokens, c.max_ctx, len(c.groups), c.flops / 1e12))
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

    impls = sdpa_paths(SdpaImpl, skip)
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
    attend_results = []
    if run_attend:
        attend_results = run_attend_cases(t, selected_attend(), dtypes, skip, timer, l2, gen,
                                          args.out, env, device)
    print("\ntotal %.1f s\n" % (time.time() - t_start))
    if results:
        print_table(results, args.out, env)
        write_csv(results, args.out, device, copy_gbs)
        plot(results, args.out, device, copy_gbs)
    if attend_results:
        print_attend_table(attend_results, args.out, [] if results else env)
        write_attend_csv(attend_results, args.out, device)
    # Exit status: kvpage's own rows (a PyTorch path that cannot run a shape,
    # or gets it wrong, is reported in the table, not as a failure here;
    # kvp_attend rows on a library without it are n/a, not failures).
    failed = [r for r in results if r.impl == "kvpage" and r.status != "ok"]
    failed += [r for r in attend_results if r.impl.startswith("kvpage")
               and r.status not in ("ok", "n/a")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
