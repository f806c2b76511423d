# SPDX-License-Identifier: Apache-2.0
"""Test helpers in plain Python (no numpy, no torch): number formats, the
cache read back through the public layout, and kvp_decode's definition in
float64 (Python floats are IEEE doubles).

An independent second implementation: it shares nothing with the library
but the header's layout fields and docs/FORMATS.md.
"""

import array
import math
import os
import random
import struct

import kvpage

# ---------------------------------------------------------------------------
# formats
# ---------------------------------------------------------------------------


def f32(x):
    """x rounded to float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    """bfloat16 bit pattern of float32(x), round half to even."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def f16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]


def f16_value(bits):
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def fp8_value(b):
    """FP8 E4M3 "fn" byte -> float (FORMATS.md)."""
    sign = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xF
    m = b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m * 2.0 ** -9
    return sign * (1 + m / 8.0) * 2.0 ** (e - 7)


def encode(values, dtype):
    """A host buffer holding values in an input dtype (FP32 / FP16 / BF16):
    array('f'), or array('H') of FP16 / BF16 bit patterns.
    Returns (buffer, the exact values it holds)."""
    if dtype == kvpage.DType.FP32:
        buf = array.array("f", values)
        return buf, list(buf)
    if dtype == kvpage.DType.FP16:
        bits = array.array("H", [f16_bits(v) for v in values])
        return bits, [f16_value(b) for b in bits]
    bits = array.array("H", [bf16_bits(v) for v in values])
    return bits, [bf16_value(b) for b in bits]


def decode_output(buf, dtype):
    """Values of an output buffer made by kvpage (new_like) or encode()."""
    if dtype == kvpage.DType.BF16:
        return [bf16_value(b) for b in buf]
    if dtype == kvpage.DType.FP16:
        return [f16_value(b) for b in buf]
    return [float(x) for x in buf]


def poisoned(n, dtype):
    """An output buffer of n elements filled with NaN."""
    nan = float("nan")
    if dtype == kvpage.DType.FP32:
        return array.array("f", [nan] * n)
    if dtype == kvpage.DType.FP16:
        return array.array("H", [0x7E00] * n)
    return array.array("H", [0x7FC0] * n)


# ---------------------------------------------------------------------------
# the cache through its layout
# ---------------------------------------------------------------------------


def _u16(buf, off):
    return buf[off] | (buf[off + 1] << 8)


def _code_value(dtype, code):
    D = kvpage.DType
    if dtype == D.BF16:
        return bf16_value(code)
    if dtype == D.FP16:
        return f16_value(code)
    if dtype == D.FP8_E4M3:
        return fp8_value(code)
    if dtype == D.INT8:
        return code - 256 if code >= 128 else code
    return float(code)  # INT4: 0..15


def dequantize(cache, layer=0):
    """(K, V): dicts (block, head, token) -> list of head_size floats, the
    exact values the layer's bytes stand for."""
    L = cache.layout(layer)
    mem = cache.layer_buffers(layer)
    kd, vd = mem["k_data"], mem["v_data"]
    ks, vs = mem.get("k_scales"), mem.get("v_scales")
    D = kvpage.DType
    nb, H, bs, HD = cache.num_blocks, cache.num_kv_heads, cache.block_size, cache.head_size
    K, V = {}, {}
    for b in range(nb):
        for h in range(H):
            for t in range(bs):
                kscale = kmin = vscale = vmin = 0.0
                if ks is not None:
                    o = b * L.k_scale_block_stride + h * L.k_scale_head_stride + t * L.k_scale_entry_bytes
                    kscale = f16_value(_u16(ks, o))
                    if L.k_scale_entry_bytes == 4:
                        kmin = f16_value(_u16(ks, o + 2))
                if vs is not None:
                    o = b * L.v_scale_block_stride + h * L.v_scale_head_stride + t * L.v_scale_entry_bytes
                    vscale = f16_value(_u16(vs, o))
                    if L.v_scale_entry_bytes == 4:
                        vmin = f16_value(_u16(vs, o + 2))
                krow, vrow = [], []
                for d in range(HD):
                    kbit = (d % L.k_x) * L.k_bits
                    ko = (b * L.k_block_stride + h * L.k_head_stride + (d // L.k_x) * L.k_chunk_stride
                          + t * 16 + kbit // 8)
                    if L.k_bits == 16:
                        kc = _u16(kd, ko)
                    elif L.k_bits == 8:
                        kc = kd[ko]
                    else:
                        kc = (kd[ko] >> (kbit % 8)) & 0xF
                    vbit = t * L.v_bits
                    vo = b * L.v_block_stride + h * L.v_head_stride + d * L.v_channel_stride + vbit // 8
                    if L.v_bits == 16:
                        vc = _u16(vd, vo)
                    elif L.v_bits == 8:
                        vc = vd[vo]
                    else:
                        vc = (vd[vo] >> (vbit % 8)) & 0xF
                    kv = _code_value(cache.k_dtype, kc)
                    vv = _code_value(cache.v_dtype, vc)
                    if cache.k_dtype in (D.FP8_E4M3, D.INT8):
                        kv *= kscale
                    elif cache.k_dtype == D.INT4:
                        kv = kv * kscale + kmin
                    if cache.v_dtype in (D.FP8_E4M3, D.INT8):
                        vv *= vscale
                    elif cache.v_dtype == D.INT4:
                        vv = vv * vscale + vmin
                    krow.append(kv)
                    vrow.append(vv)
                K[(b, h, t)] = krow
                V[(b, h, t)] = vrow
    return K, V


# ---------------------------------------------------------------------------
# decode in float64
# ---------------------------------------------------------------------------


def attention(q, table, width, seq_lens, K, V, *, num_q_heads, num_kv_heads, head_size,
              block_size, query_len=1, sm_scale=0.0, key_smoothing=None, logits_soft_cap=0.0,
              alibi_slopes=None, sliding_window=0):
    """kvp_decode's definition (kvpage.h) in float64.

    q: flat list [(s * query_len + i) * HQ * D + h * D + d]; table: flat int
    list with row stride ``width``; K/V as dequantize() returns them.
    Returns (out flat list, lse list [(s * query_len + i) * HQ + h])."""
    D = head_size
    G = num_q_heads // num_kv_heads
    # sm_scale is a float in the ABI; its default is 1/sqrt(D) in float32.
    scale = f32(sm_scale) if sm_scale else f32(1.0 / f32(math.sqrt(D)))
    out, lse = [], []
    for s, length in enumerate(seq_lens):
        for i in range(query_len):
            pos = length - query_len + i
            for h in range(num_q_heads):
                kvh = h // G
                row = (s * query_len + i) * num_q_heads + h
                qv = q[row * D:(row + 1) * D]
                if key_smoothing is not None:
                    lam = [f32(x) for x in key_smoothing[kvh * D:(kvh + 1) * D]]
                    qv = [a * b for a, b in zip(qv, lam)]
                logits = []
                for j in range(length):
                    if j > pos or (sliding_window and j <= pos - sliding_window):
                        continue
                    blk = table[s * width + j // block_size]
                    kr = K[(blk, kvh, j % block_size)]
                    l = scale * sum(a * b for a, b in zip(qv, kr))
                    if logits_soft_cap:
                        l = f32(logits_soft_cap) * math.tanh(l / f32(logits_soft_cap))
                    if alibi_slopes is not None:
                        l += alibi_slopes[h] * (j - pos)
                    logits.append((j, l))
                if not logits:
                    out.extend([0.0] * D)
                    lse.append(float("-inf"))
                    continue
                m = max(l for _, l in logits)
                ssum = sum(math.exp(l - m) for _, l in logits)
                acc = [0.0] * D
                for j, l in logits:
                    w = math.exp(l - m) / ssum
                    blk = table[s * width + j // block_size]
                    vr = V[(blk, kvh, j % block_size)]
                    for d in range(D):
                        acc[d] += w * vr[d]
                out.extend(acc)
                lse.append(m + math.log(ssum))
    return out, lse


# ---------------------------------------------------------------------------
# random inputs
# ---------------------------------------------------------------------------


def rng(test):
    """A fresh random.Random per test; its seed is printed on failure through
    the test's id (set KVPAGE_TEST_SEED to replay)."""
    seed = int(os.environ.get("KVPAGE_TEST_SEED") or random.SystemRandom().randrange(2 ** 32))
    test._seed = seed
    return random.Random(seed)


def gaussians(r, n, std=1.0):
    return [r.gauss(0.0, std) for _ in range(n)]


def rel_l2(x, ref):
    num = sum((a - b) ** 2 for a, b in zip(x, ref))
    den = sum(b * b for b in ref)
    if any(not math.isfinite(a) for a in x):
        return float("inf")
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)
