# SPDX-License-Identifier: Apache-2.0
"""Float64 reference attention and cache dequantization, in torch.

For checking an integration: ``dequantize(cache, layer)`` decodes a layer's
bytes through the public layout (kvp_cache_get_layout, docs/FORMATS.md) into
exact float64 values, and ``attention(...)`` is kvp_decode's definition
(kvpage.h) computed in float64. Needs torch; works for CPU and CUDA caches
(computing on the cache's device). Not a fast path.
"""

import math
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _arrays as A
from ._lib import DType

if TYPE_CHECKING:
    from ._cache import Cache


def _torch():
    t = A.torch_module()
    if t is None:
        raise ImportError("kvpage.reference needs torch")
    return t


def _codes16(t, raw, dtype):
    return raw.contiguous().view(t.bfloat16 if dtype == DType.BF16 else t.float16).to(t.float64)


def _fp8_e4m3_value(b):
    """FP8 E4M3 "fn" byte -> float (docs/FORMATS.md); 0x7F/0xFF are NaN."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m * 2.0 ** -9
    return sign * (1 + m / 8.0) * 2.0 ** (e - 7)


_FP8_LUT = {}


def _codes8(t, raw, dtype):
    if dtype == DType.INT8:
        return raw.contiguous().view(t.int8).to(t.float64)
    # A lookup table rather than torch.float8_e4m3fn: exact, and independent
    # of the torch version.
    dev = str(raw.device)
    if dev not in _FP8_LUT:
        _FP8_LUT[dev] = t.tensor([_fp8_e4m3_value(b) for b in range(256)], dtype=t.float64,
                                 device=raw.device)
    return _FP8_LUT[dev][raw.long()]


def _nibbles(t, raw):
    lo = raw & 0xF
    hi = raw >> 4
    return t.stack([lo, hi], dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2).to(t.float64)


def _scales(t, mem, block_stride, head_stride, entry, shape, pick):
    nb, h, bs = shape
    raw = pick(mem.as_strided((nb, h, bs, entry), (block_stride, head_stride, entry, 1)))
    return raw.contiguous().view(t.float16).to(t.float64)  # [..., 1] or [..., 2]


def _apply_scales(codes, sc, dtype):
    if dtype in (DType.FP16, DType.BF16):
        return codes
    if dtype == DType.INT4:
        return codes * sc[..., 0:1] + sc[..., 1:2]
    return codes * sc[..., 0:1]


def dequantize(cache: "Cache", layer: int = 0, blocks: Optional[Any] = None) -> Tuple[Any, Any]:
    """(K, V): float64 tensors [num_blocks, num_kv_heads, block_size, head_size]
    on the cache's device, the exact values the layer's codes and scales
    stand for (K as stored: K / lambda when the cache smooths keys).
    ``blocks`` (int tensor) decodes only those blocks, in that order."""
    t = _torch()
    L = cache.layout(layer)
    mem = cache.layer_tensors(layer)
    nb, H, bs, D = cache.num_blocks, cache.num_kv_heads, cache.block_size, cache.head_size
    sel = None
    if blocks is not None:
        sel = t.as_tensor(blocks, device=mem["k_data"].device).to(t.long).reshape(-1)

    def pick(x):
        return x if sel is None else x.index_select(0, sel)
    kt, vt = cache.k_dtype, cache.v_dtype
    # K: [block][head][chunk][token][16 bytes]
    kraw = pick(mem["k_data"].as_strided(
        (nb, H, L.k_chunks, bs, 16), (L.k_block_stride, L.k_head_stride, L.k_chunk_stride, 16, 1)))
    if L.k_bits == 16:
        kc = _codes16(t, kraw, kt)
    elif L.k_bits == 8:
        kc = _codes8(t, kraw, kt)
    else:
        kc = _nibbles(t, kraw)
    n = kraw.shape[0]
    kc = kc.permute(0, 1, 3, 2, 4).reshape(n, H, bs, L.k_chunks * L.k_x)[..., :D]
    # V: [block][head][channel][tokens packed]
    row = bs * L.v_bits // 8
    vraw = pick(mem["v_data"].as_strided(
        (nb, H, D, row), (L.v_block_stride, L.v_head_stride, L.v_channel_stride, 1)))
    if L.v_bits == 16:
        vc = _codes16(t, vraw, vt)
    elif L.v_bits == 8:
        vc = _codes8(t, vraw, vt)
    else:
        vc = _nibbles(t, vraw)
    vc = vc.transpose(2, 3)  # [nb, H, bs, D]
    if L.k_scale_entry_bytes:
        ks = _scales(t, mem["k_scales"], L.k_scale_block_stride, L.k_scale_head_stride,
                     L.k_scale_entry_bytes, (nb, H, bs), pick)
        kc = _apply_scales(kc, ks, kt)
    if L.v_scale_entry_bytes:
        vs = _scales(t, mem["v_scales"], L.v_scale_block_stride, L.v_scale_head_stride,
                     L.v_scale_entry_bytes, (nb, H, bs), pick)
        vc = _apply_scales(vc, vs, vt)
    return kc.contiguous(), vc.contiguous()


def gather(blocks: Any, block_table: Any, width: Optional[int] = None) -> Any:
    """Dense per-sequence tensors [num_seqs, heads, width * block_size, D]
    from paged ones [num_blocks, heads, block_size, D] and an int32 table
    [num_seqs, >= width]."""
    t = _torch()
    bt = block_table.to(device=blocks.device, dtype=t.long)
    if width is not None:
        bt = bt[:, :width]
    s, w = bt.shape
    nb, h, bs, d = blocks.shape
    g = blocks[bt.reshape(-1)].reshape(s, w, h, bs, d)
    return g.permute(0, 2, 1, 3, 4).reshape(s, h, w * bs, d)


def attention(q: Any, k: Any, v: Any, seq_lens: Any, *, query_len: int = 1,
              sm_scale: Optional[float] = None, key_smoothing: Optional[Any] = None,
              logits_soft_cap: float = 0.0, alibi_slopes: Optional[Any] = None,
              sliding_window: int = 0, return_lse: bool = False) -> Any:
    """kvp_decode's definition in float64.

    q: [num_seqs * query_len, HQ, D]; k, v: [num_seqs, HKV, T, D] (token j of
    sequence s at [s, :, j]; T >= every seq_len); seq_lens: [num_seqs].
    key_smoothing: [HKV, D] lambda, multiplied into q (k holds K / lambda).
    Returns out [num_seqs * query_len, HQ, D] float64 (and lse
    [num_seqs * query_len, HQ] if return_lse)."""
    t = _torch()
    dev = k.device
    S, HKV, T, D = k.shape
    HQ = q.shape[-2]
    G = HQ // HKV
    qf = q.to(device=dev, dtype=t.float64).reshape(S, query_len, HKV, G, D)
    if key_smoothing is not None:
        lam = t.as_tensor(key_smoothing, dtype=t.float64, device=dev).reshape(1, 1, HKV, 1, D)
        qf = qf * lam
    kf = k.to(t.float64)
    vf = v.to(t.float64)
    scale = sm_scale if sm_scale else 1.0 / math.sqrt(D)
    logits = t.einsum("sqhgd,shtd->sqhgt", qf, kf) * scale
    if logits_soft_cap and logits_soft_cap > 0:
        logits = logits_soft_cap * t.tanh(logits / logits_soft_cap)
    lens = t.as_tensor(seq_lens, device=dev).to(t.long).reshape(S, 1)
    j = t.arange(T, device=dev).reshape(1, T)
    pos = (lens - query_len + t.arange(query_len, device=dev).reshape(1, query_len))  # [S, QL]
    pos = pos.reshape(S, query_len, 1, 1, 1)
    jj = j.reshape(1, 1, 1, 1, T)
    if alibi_slopes is not None:
        sl = t.as_tensor(alibi_slopes, dtype=t.float64, device=dev).reshape(1, 1, HKV, G, 1)
        logits = logits + sl * (jj - pos).to(t.float64)
    visible = (jj <= pos) & (jj < lens.reshape(S, 1, 1, 1, 1))
    if sliding_window and sliding_window > 0:
        visible = visible & (jj > pos - sliding_window)
    logits = logits.masked_fill(~visible, float("-inf"))
    m = logits.amax(dim=-1, keepdim=True)
    any_vis = t.isfinite(m)
    m = t.where(any_vis, m, t.zeros_like(m))
    p = t.exp(logits - m)
    den = p.sum(dim=-1, keepdim=True)
    w = p / t.where(den > 0, den, t.ones_like(den))
    out = t.einsum("sqhgt,shtd->sqhgd", w, vf).reshape(S * query_len, HQ, D)
    if not return_lse:
        return out
    lse = (m + t.log(den)).squeeze(-1)
    lse = t.where(any_vis.squeeze(-1), lse, t.full_like(lse, float("-inf")))
    return out, lse.reshape(S * query_len, HQ)


def decode_reference(cache: "Cache", layer: int, q: Any, block_table: Any, seq_lens: Any,
                     **kw: Any) -> Any:
    """attention() over the cache's dequantized layer, read through its block
    table: the exact result a decode of this cache should round to."""
    t = _torch()
    k, v = dequantize(cache, layer)
    bt = t.as_tensor(block_table).reshape(len(seq_lens) if hasattr(seq_lens, "__len__")
                                          else seq_lens.shape[0], -1)
    return attention(q, gather(k, bt), gather(v, bt), seq_lens, **kw)


def rel_l2(x: Any, ref: Any) -> float:
    """||x - ref|| / ||ref|| in float64 (inf if x holds a non-finite value)."""
    t = _torch()
    x = x.to(t.float64)
    ref = ref.to(device=x.device, dtype=t.float64)
    if not bool(t.isfinite(x).all()):
        return float("inf")
    den = float(t.linalg.vector_norm(ref))
    return float(t.linalg.vector_norm(x - ref)) / (den if den > 0 else 1.0)
