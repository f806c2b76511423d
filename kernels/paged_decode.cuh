// SPDX-License-Identifier: Apache-2.0
// The thread-group partition kernel of the decode (CUDA cores; DecodeKernel::
// kThreadGroup), after vLLM's PagedAttention v2 with one thread block
// serving every query row of a KV head. Its prologue and the row outputs
// are partition_common.cuh's; its partials are merged by decode_reduce.cuh.
//
// Partition kernel. Grid (max_partitions, num_kv_heads, num_seqs), 128
// threads. Block (p, h, s) covers tokens [p*P, min((p+1)*P, len)) of
// sequence s for KV head h, and every query row of that head: rows =
// (num_q_heads / num_kv_heads) * query_len, row r = g * query_len + i for
// query head h * group + g and query token i. It exits at once when
// p*P >= seq_lens[s] (read here, on the device: the launch shape never
// depends on lengths). Rows are processed in tiles of kRowTile; for each
// tile:
//   1. q rows -> shared memory as FP32, times the key smoothing vector and
//      sm_scale (or sm_scale / cap with a soft-cap), zero-padded to
//      k_chunks * k_x channels (INT4 K with head size 80/112 has a tail).
//   2. K: warp w takes 64-token spans w, w+4, ...; lane l holds tokens l
//      and l+32 of the span and walks their k_chunks 16-byte rows, so each
//      load instruction of the warp covers 32 consecutive tokens (32 /
//      block_size whole blocks, 128+ contiguous bytes per block). Codes are
//      dequantized in registers (common/dequant.cuh) eight at a time and
//      dotted with every row of the tile (q read from shared memory as a
//      broadcast, each value feeding both tokens); the K scale is applied
//      once per token (INT4: + min * sum(q)). No cross-lane reduction is
//      needed. Soft-cap, ALiBi and the masks (causal per query token,
//      sliding window, sequence end) as in CpuBackend::Decode, through the
//      rules of logit_variants.cuh; logits -> shared memory [rt][P].
//   3. Softmax, one warp per row: max, p = exp(l - max), sum(p); p is
//      stored times the token's V scale, and sum_t p_t * vmin_t (INT4 V) is
//      kept per row, so V needs no per-element scale.
//   4. V: the (block, KV head) V region of D x block_size codes is `vecs`
//      16-byte vectors; a team of min(vecs, 128) threads owns one or two
//      vector positions each (fixed channels and token segment), teams take
//      different blocks. Each vector gives `tokens` consecutive tokens of
//      `channels` channels (V layout [D][block]); each p value read from
//      shared memory feeds every channel the thread holds. Accumulation in
//      FP32 registers, segments of one channel are summed with shuffles,
//      teams through shared memory.
//   5. Writes partial_out (normalized by the partition's sum), partial_max,
//      partial_sum (src/params.h layouts, indexed with plan.max_query_len
//      and plan.max_partitions). A row with nothing visible in the
//      partition writes max = -inf, sum = 0, out = 0. The only partition of
//      a sequence shorter than P writes out and lse instead
//      (PartitionWritesOutput).
// K and V are each read from DRAM once per partition; with more rows than
// kRowTile later tiles re-read them from L2/L1.
//
// Compile-time parameters are the K dtype and head size only (they fix the
// K inner loop); V dtype, block size, GQA group and query_len are run-time
// values (V: a block-uniform switch among 9 vector shapes).
#ifndef KVPAGE_KERNELS_PAGED_DECODE_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/checked.cuh"
#include "kernels/common/dequant.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/decode_traits.h"
#include "kernels/logit_variants.cuh"
#include "kernels/partition_common.cuh"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace decode {

constexpr int kLaneTokens = 2;                 // K phase: tokens per lane
constexpr int kSpanTokens = 32 * kLaneTokens;  // K phase: tokens per warp pass

// ---- Phase 2: K ---------------------------------------------------------

// acc + dot(q[0..8), f[0..8)) with q as two float4.
__device__ __forceinline__ float Dot8(const float4& a, const float4& b, const float (&f)[8],
                                      float acc) {
  acc = fmaf(a.x, f[0], acc);
  acc = fmaf(a.y, f[1], acc);
  acc = fmaf(a.z, f[2], acc);
  acc = fmaf(a.w, f[3], acc);
  acc = fmaf(b.x, f[4], acc);
  acc = fmaf(b.y, f[5], acc);
  acc = fmaf(b.z, f[6], acc);
  acc = fmaf(b.w, f[7], acc);
  return acc;
}

// Warp w takes 64-token spans w, w + 4, ...; lane l holds tokens l and
// l + 32 of the span, so each q value read from shared memory (a broadcast)
// feeds two tokens, and each load instruction of the warp covers 32
// consecutive tokens: 32 / block_size whole blocks, 16 bytes per token.
template <DType KT, int D, int kRows>
__device__ __forceinline__ void LogitsPhase(const DecodeParams& p, const PartitionState& st,
                                            int rt) {
  constexpr int kX = kElems<KT>;
  constexpr int kChunks = (D + kX - 1) / kX;
  constexpr int kSteps = kX / 8;  // 8-code steps per 16-byte chunk
  // Chunks loaded before use. One row (MHA): 4 per token, 8 loads of 16
  // bytes in flight per lane — with little arithmetic per byte the phase
  // is bound by bytes in flight, and quantized K has fewer bytes per token.
  // A full row tile: 4 (16-bit) or 2 per token, which keeps the unrolled
  // body (kRows rows of multiply-adds per code) within the instruction cache.
  constexpr int kBatch = kRows == 1 ? (kChunks < 4 ? kChunks : 4) : (kX == 8 ? 4 : 2);
  const CacheGeometry& g = p.geo;
  float* smem = SharedWords();
  const float* q_s = smem + st.lay.q;
  const float* qsum_s = smem + st.lay.qsum;
  const int* pos_s = reinterpret_cast<const int*>(smem + st.lay.row_pos);
  const int* lo_s = reinterpret_cast<const int*>(smem + st.lay.row_lo);
  const float* slope_s = smem + st.lay.row_slope;
  const int* blk_s = reinterpret_cast<const int*>(smem + st.lay.blk);
  float* logits_s = smem + st.lay.logits;
  const int kd = st.lay.kd;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int bs = g.block_size;
  const int64_t chunk_stride = g.k_chunk_stride();
  const uint8_t* k_head = p.layer + g.k_data_offset() + int64_t{st.kvh} * g.k_head_stride();
  const uint8_t* ks_head = p.layer + g.k_scale_offset() + int64_t{st.kvh} * g.k_scale_head_stride();
  const float cap = p.logits_soft_cap;
  const bool alibi = p.alibi_slopes != nullptr;

  for (int span = warp; span * kSpanTokens < st.n_valid; span += kWarps) {
    int slot[kLaneTokens];
    bool valid[kLaneTokens];
    const uint8_t* kp[kLaneTokens];
    TokenScale ks[kLaneTokens];
#pragma unroll
    for (int k = 0; k < kLaneTokens; ++k) {
      slot[k] = span * kSpanTokens + k * 32 + lane;  // token within the partition
      valid[k] = slot[k] < st.n_valid;
      kp[k] = k_head;
      ks[k] = {1.0f, 0.0f};
      if (valid[k]) {
        const int b = slot[k] / bs;  // partitions start on block boundaries
        const int off = slot[k] - b * bs;
        const int64_t blk = blk_s[b];
        kp[k] = k_head + blk * g.k_block_stride() + off * 16;
        if constexpr (IsQuantized(KT)) {
          ks[k] = LoadTokenScale<KT>(ks_head + blk * g.k_scale_block_stride() +
                                     off * g.k_scale_entry_bytes());
        }
      }
    }
    float acc[kRows][kLaneTokens];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int k = 0; k < kLaneTokens; ++k) acc[r][k] = 0.0f;
    }

#pragma unroll 1
    for (int c0 = 0; c0 < kChunks; c0 += kBatch) {
      uint4 raw[kBatch][kLaneTokens];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const bool in = (kChunks % kBatch == 0 || c0 + j < kChunks);
#pragma unroll
        for (int k = 0; k < kLaneTokens; ++k) {
          raw[j][k] = (valid[k] && in) ? Load16(kp[k] + (c0 + j) * chunk_stride) : Zero16();
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (kChunks % kBatch != 0 && c0 + j >= kChunks) break;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          float f[kLaneTokens][8];
#pragma unroll
          for (int k = 0; k < kLaneTokens; ++k) DequantCodes8<KT>(raw[j][k], s, f[k]);
          const float* qc = q_s + (c0 + j) * kX + s * 8;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < rt) {
              const float4 qa = LoadFloat4(qc + r * kd);
              const float4 qb = LoadFloat4(qc + r * kd + 4);
#pragma unroll
              for (int k = 0; k < kLaneTokens; ++k) acc[r][k] = Dot8(qa, qb, f[k], acc[r][k]);
            }
          }
        }
      }
    }

#pragma unroll
    for (int k = 0; k < kLaneTokens; ++k) {
      if (!valid[k]) continue;
      const int t = st.start + slot[k];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < rt) {
          float l = acc[r][k] * ks[k].scale;
          if constexpr (KT == DType::kINT4) l = fmaf(ks[k].min, qsum_s[r], l);
          l = SoftCap(l, cap);  // q carries sm_scale / cap
          const int pos = pos_s[r];
          l = AddAlibi(l, alibi, slope_s[r], t, pos);
          const bool visible = t >= lo_s[r] && t <= pos;
          logits_s[r * st.P + slot[k]] = visible ? l : -INFINITY;
        }
      }
    }
  }
}

// ---- Phase 3: softmax ---------------------------------------------------

// One warp per row: max over the visible logits, p = exp(l - max) times the
// token's V scale back into the logits row, the row's sum(p) and
// sum(p * vmin). Slots past the sequence end (up to the end of the last
// block) get p = 0, so the V phase may read them.
__device__ __forceinline__ void SoftmaxPhase(const PartitionState& st, int rt, int bs) {
  float* smem = SharedWords();
  const float* vscale_s = smem + st.lay.vscale;
  const float* vmin_s = smem + st.lay.vmin;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int slots = st.nblk * bs;
  for (int r = warp; r < rt; r += kWarps) {
    float* lr = smem + st.lay.logits + r * st.P;
    float m = -INFINITY;
    for (int j = lane; j < st.n_valid; j += 32) m = fmaxf(m, lr[j]);
    m = WarpReduceMax(m);
    float sum = 0.0f, pm = 0.0f;
    for (int j = lane; j < slots; j += 32) {
      // m == -inf: nothing visible in this partition for this row.
      const float e = (j < st.n_valid && m != -INFINITY) ? __expf(lr[j] - m) : 0.0f;
      sum += e;
      pm = fmaf(e, vmin_s[j], pm);
      lr[j] = e * vscale_s[j];
    }
    sum = WarpReduceSum(sum);
    pm = WarpReduceSum(pm);
    if (lane == 0) {
      smem[st.lay.row_max + r] = m;
      smem[st.lay.row_sum + r] = sum;
      smem[st.lay.row_pm + r] = pm;
    }
  }
}

// ---- Phase 4: V ---------------------------------------------------------

struct VPhaseArgs {
  const uint8_t* v_head;  // the layer's V data + kvh * v_head_stride
  int64_t v_block_stride;
  int P, bs, nblk, n_valid, rt, head_size;
  int blk, logits, vred;  // shared memory offsets (words)
  VMapping vm;
};

// Accumulates sum_t p'[r][t] * code[t][d] for the tile's rows into
// vred[team][r][d]. kTok = vm.tokens (a vector holds kTok consecutive
// tokens of kElems / kTok channels). Each p value read from shared memory
// feeds every channel the thread holds: the kCh channels of its vector,
// or (kCh == 1) the vectors of two positions with the same token segment.
// Not inlined: one copy per V shape serves all head sizes of a translation
// unit (compile time).
template <DType VT, int kTok, int kRows>
__device__ __noinline__ void ValuePhase(const VPhaseArgs a) {
  constexpr int kE = kElems<VT>;
  constexpr int kCh = kE / kTok;
  constexpr int kPos = kCh == 1 ? 2 : 1;  // positions per thread at once
  constexpr int kOct = kTok / 8;          // 8-token groups per channel
  // Blocks loaded before use: 4, so that even one position per thread
  // (8-bit V with block size 16: 128 vectors) keeps 4 loads in flight;
  // 2 with two positions and a full row tile (code size, as in the K phase).
  constexpr int kUnroll = kPos == 2 && kRows > 1 ? 2 : 4;
  float* smem = SharedWords();
  const int* blk_s = reinterpret_cast<const int*>(smem + a.blk);
  const int tid = threadIdx.x;
  const int team = tid / a.vm.team;
  const int tpos = tid - team * a.vm.team;
  const bool in_team = team < a.vm.teams;

  for (int pos0 = 0; pos0 < a.vm.vecs; pos0 += kPos * a.vm.team) {  // block-uniform
    // Whether a second position exists for anyone (block-uniform): when not,
    // its multiply-adds are skipped rather than run on zeros.
    const bool two = kPos == 2 && pos0 + a.vm.team < a.vm.vecs;
    int pos[kPos];
    bool act[kPos];
#pragma unroll
    for (int k = 0; k < kPos; ++k) {
      pos[k] = pos0 + tpos + k * a.vm.team;  // vector position in the (block, head) region
      act[k] = in_team && pos[k] < a.vm.vecs;
    }
    // team is a multiple of segs, so both positions share one token segment.
    const int seg = pos[0] % a.vm.segs;
    const int tok0 = seg * kTok;
    float acc[kRows][kPos][kCh];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int k = 0; k < kPos; ++k) {
#pragma unroll
        for (int c = 0; c < kCh; ++c) acc[r][k][c] = 0.0f;
      }
    }
    if (act[0]) {
      for (int b0 = team; b0 < a.nblk; b0 += kUnroll * a.vm.teams) {
        uint4 raw[kUnroll][kPos];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int b = b0 + u * a.vm.teams;
          const uint8_t* vb = b < a.nblk ? a.v_head + blk_s[b] * a.v_block_stride : a.v_head;
#pragma unroll
          for (int k = 0; k < kPos; ++k) {
            raw[u][k] = (b < a.nblk && act[k]) ? Load16(vb + int64_t{pos[k]} * 16) : Zero16();
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int b = b0 + u * a.vm.teams;
          if (b >= a.nblk) break;
          const int slot0 = b * a.bs + tok0;
          const bool tail = slot0 + kTok > a.n_valid;
#pragma unroll
          for (int o = 0; o < kOct; ++o) {
            float f[kPos][kCh][8];
#pragma unroll
            for (int k = 0; k < kPos; ++k) {
#pragma unroll
              for (int c = 0; c < kCh; ++c) {
                DequantCodes8<VT>(raw[u][k], (c * kTok + o * 8) / 8, f[k][c]);
                if (tail) {
                  // Tokens past the sequence end hold stale bytes (possibly
                  // NaN patterns) and p = 0 there: 0 * NaN must not reach acc.
#pragma unroll
                  for (int e = 0; e < 8; ++e) {
                    if (slot0 + o * 8 + e >= a.n_valid) f[k][c][e] = 0.0f;
                  }
                }
              }
            }
            const float* pt = smem + a.logits + slot0 + o * 8;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              if (r < a.rt) {
                const float4 pa = LoadFloat4(pt + r * a.P);
                const float4 pb = LoadFloat4(pt + r * a.P + 4);
#pragma unroll
                for (int k = 0; k < kPos; ++k) {
                  if (k == 0 || two) {
#pragma unroll
                    for (int c = 0; c < kCh; ++c)
                      acc[r][k][c] = Dot8(pa, pb, f[k][c], acc[r][k][c]);
                  }
                }
              }
            }
          }
        }
      }
    }
    // The segments of one channel row sit in adjacent lanes (team sizes are
    // multiples of segs, segs <= 4 divides 32): butterfly over them.
    if (kCh == 1 && a.vm.segs > 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < a.rt) {
#pragma unroll
          for (int k = 0; k < kPos; ++k) {
            if (k == 0 || two) {
              for (int off = 1; off < a.vm.segs; off *= 2) {
                acc[r][k][0] += __shfl_xor_sync(kFullMask, acc[r][k][0], off);
              }
            }
          }
        }
      }
    }
    if (seg == 0) {
#pragma unroll
      for (int k = 0; k < kPos; ++k) {
        if (!act[k]) continue;
        float* out = smem + a.vred + team * a.rt * a.head_size + (pos[k] / a.vm.segs) * kCh;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < a.rt) {
#pragma unroll
            for (int c = 0; c < kCh; ++c) out[r * a.head_size + c] = acc[r][k][c];
          }
        }
      }
    }
  }
}

template <int kRows>
__device__ __forceinline__ void DispatchValuePhase(DType v_dtype, const VPhaseArgs& a) {
  switch (v_dtype) {
    case DType::kBF16:
      ValuePhase<DType::kBF16, 8, kRows>(a);
      break;
    case DType::kFP16:
      ValuePhase<DType::kFP16, 8, kRows>(a);
      break;
    case DType::kFP8E4M3:
      if (a.vm.tokens == 8) {
        ValuePhase<DType::kFP8E4M3, 8, kRows>(a);
      } else {
        ValuePhase<DType::kFP8E4M3, 16, kRows>(a);
      }
      break;
    case DType::kINT8:
      if (a.vm.tokens == 8) {
        ValuePhase<DType::kINT8, 8, kRows>(a);
      } else {
        ValuePhase<DType::kINT8, 16, kRows>(a);
      }
      break;
    default:  // INT4
      if (a.vm.tokens == 8) {
        ValuePhase<DType::kINT4, 8, kRows>(a);
      } else if (a.vm.tokens == 16) {
        ValuePhase<DType::kINT4, 16, kRows>(a);
      } else {
        ValuePhase<DType::kINT4, 32, kRows>(a);
      }
  }
}

// ---- The partition kernel -----------------------------------------------

// Per-token {scale, min} of the partition's slots (nblk * block_size) ->
// scale_s / min_s: {1, 0} for FP16/BF16, {0, 0} past the sequence end (so
// p * scale is 0 there). Returns the largest scale this thread stored.
__device__ __forceinline__ float StageTokenScales(DType dtype, const uint8_t* head_scales,
                                                  int64_t block_stride, int entry,
                                                  const PartitionState& st, int bs,
                                                  const int* blk_s, float* scale_s, float* min_s) {
  float largest = 0.0f;
  // Unrolled so that the scattered 2- or 4-byte loads of a thread are in
  // flight together, not one round trip each.
#pragma unroll 4
  for (int j = threadIdx.x; j < st.nblk * bs; j += blockDim.x) {
    TokenScale s{1.0f, 0.0f};
    if (j >= st.n_valid) {
      s = {0.0f, 0.0f};
    } else if (entry != 0) {
      const int b = j / bs;
      const int off = j - b * bs;
      s = LoadTokenScale(dtype, head_scales + int64_t{blk_s[b]} * block_stride + off * entry);
    }
    scale_s[j] = s.scale;
    min_s[j] = s.min;
    largest = fmaxf(largest, s.scale);
  }
  return largest;
}

template <DType KT, int D, int kRows>
__global__ void __launch_bounds__(kThreads, kRows == 1 ? kMinBlocksPerSmOneRow : kMinBlocksPerSm)
    PartitionKernel(const __grid_constant__ DecodeParams p, const __grid_constant__ DecodePlan plan,
                    const __grid_constant__ DecodeWorkspace ws) {
  const CacheGeometry& g = p.geo;
  PartitionState st;
  if (!BeginPartition(p, plan, ws, st, true)) return;  // past this sequence's end
  const int bs = g.block_size;
  st.lay = MakeSmemLayout(g, st.rows, st.P);
  float* smem = SharedWords();
  const int tid = threadIdx.x;
  const int qlen = p.query_len;

  // The partition's block ids and V scales, shared by every row tile.
  int* blk_s = reinterpret_cast<int*>(smem + st.lay.blk);
  if (!StageBlockIds(p, plan, ws, st, blk_s, true)) return;
  StageTokenScales(g.v_dtype,
                   p.layer + g.v_scale_offset() + int64_t{st.kvh} * g.v_scale_head_stride(),
                   g.v_scale_block_stride(), g.v_scale_entry_bytes(), st, bs, blk_s,
                   smem + st.lay.vscale, smem + st.lay.vmin);

  // The logit scale (and 1 / soft-cap) folded into q (logit_variants.cuh).
  const float q_scale = LogitQScale(p);
  const int kd = st.lay.kd;
  const VMapping vm = MakeVMapping(g);

  for (int r0 = 0; r0 < st.rows; r0 += kRows) {
    const int rt = min(kRows, st.rows - r0);
    __syncthreads();  // the previous tile is done with shared memory

    // Phase 1: q rows of the tile, their positions, windows and slopes.
    for (int idx = tid; idx < rt * kd; idx += kThreads) {
      const int r = idx / kd;
      const int d = idx - r * kd;
      const int row = r0 + r;
      const int gi = row / qlen;
      const int i = row - gi * qlen;
      const int h = st.kvh * st.group + gi;
      float v = 0.0f;
      if (d < D) {
        v = LoadAsFloat(p.q_dtype, p.q,
                        (int64_t{st.seq} * qlen + i) * p.q_stride + int64_t{h} * D + d);
        if (p.key_smoothing != nullptr) v *= p.key_smoothing[int64_t{st.kvh} * D + d];
        v *= q_scale;
      }
      smem[st.lay.q + idx] = v;
    }
    if (tid < rt) {
      const int row = r0 + tid;
      const int gi = row / qlen;
      const int i = row - gi * qlen;
      const int pos = st.len - qlen + i;
      const int lo = WindowStart(p, pos);
      reinterpret_cast<int*>(smem + st.lay.row_pos)[tid] = pos;
      reinterpret_cast<int*>(smem + st.lay.row_lo)[tid] = lo;
      smem[st.lay.row_slope + tid] =
          p.alibi_slopes != nullptr ? p.alibi_slopes[st.kvh * st.group + gi] : 0.0f;
    }
    __syncthreads();
    if constexpr (KT == DType::kINT4) {
      // sum(q) over the real channels, for the min term of INT4 K.
      const int lane = tid % 32;
      for (int r = tid / 32; r < rt; r += kWarps) {
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s += smem[st.lay.q + r * kd + d];
        s = WarpReduceSum(s);
        if (lane == 0) smem[st.lay.qsum + r] = s;
      }
      __syncthreads();
    }

    LogitsPhase<KT, D, kRows>(p, st, rt);
    __syncthreads();
    SoftmaxPhase(st, rt, bs);
    __syncthreads();

    VPhaseArgs va;
    va.v_head = p.layer + g.v_data_offset() + int64_t{st.kvh} * g.v_head_stride();
    va.v_block_stride = g.v_block_stride();
    va.P = st.P;
    va.bs = bs;
    va.nblk = st.nblk;
    va.n_valid = st.n_valid;
    va.rt = rt;
    va.head_size = D;
    va.blk = st.lay.blk;
    va.logits = st.lay.logits;
    va.vred = st.lay.vred;
    va.vm = vm;
    DispatchValuePhase<kRows>(g.v_dtype, va);
    __syncthreads();

    // Phase 5: merge the teams, normalize, write the partials (or out).
    const bool direct = PartitionWritesOutput(plan, st);
    for (int idx = tid; idx < rt * D; idx += kThreads) {
      const int r = idx / D;
      const int d = idx - r * D;
      float s = 0.0f;
      for (int t = 0; t < vm.teams; ++t) s += smem[st.lay.vred + (t * rt + r) * D + d];
      const float sum = smem[st.lay.row_sum + r];
      const float o = sum > 0.0f ? (s + smem[st.lay.row_pm + r]) / sum : 0.0f;
      StoreRowOut(p, ws, direct, RowOutIndex(p, plan, st, direct, r0 + r) + d, o);
      if (d == 0) StoreRowStats(p, plan, ws, st, direct, r0 + r, smem[st.lay.row_max + r], sum);
    }
  }
}

template <DType KT, int D, int kRows>
int LaunchPartitionKernelRows(const DecodeParams& p, const DecodePlan& plan,
                              const DecodeWorkspace& ws, size_t smem_bytes, cudaStream_t stream) {
  static std::atomic<size_t> configured[kMaxSmemDevices];
  return LaunchPartitionGrid(&PartitionKernel<KT, D, kRows>, configured, p, plan, ws, smem_bytes,
                             stream);
}

// Launches the partition kernel for (KT, D). Defined here, explicitly
// instantiated in decode_<dtype>.cu, declared extern in decode_dispatch.cu.
// One query row per KV head (MHA decode) gets its own variant: its loops,
// unrolled over one row instead of kRowTile, are 8x smaller, which keeps the
// hot K and V loops in the instruction cache (the kRowTile variant misses
// there on every iteration when only one row is live). Two to four rows (a
// GQA group of 4, or short multi-token queries) get a 4-row variant.
template <DType KT, int D>
int LaunchPartitionKernel(const DecodeParams& p, const DecodePlan& plan, const DecodeWorkspace& ws,
                          size_t smem_bytes, cudaStream_t stream) {
  const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
  if (rows == 1) return LaunchPartitionKernelRows<KT, D, 1>(p, plan, ws, smem_bytes, stream);
  if (rows <= 4) return LaunchPartitionKernelRows<KT, D, 4>(p, plan, ws, smem_bytes, stream);
  return LaunchPartitionKernelRows<KT, D, kRowTile>(p, plan, ws, smem_bytes, stream);
}

#define KVPAGE_DECODE_INSTANTIATE(KT, D)                                            \
  template int LaunchPartitionKernel<KT, D>(const DecodeParams&, const DecodePlan&, \
                                            const DecodeWorkspace&, size_t, cudaStream_t);
#define KVPAGE_DECODE_DECLARE_EXTERN(KT, D)                                                \
  extern template int LaunchPartitionKernel<KT, D>(const DecodeParams&, const DecodePlan&, \
                                                   const DecodeWorkspace&, size_t, cudaStream_t);

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_PAGED_DECODE_CUH_
