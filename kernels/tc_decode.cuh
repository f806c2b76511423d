// SPDX-License-Identifier: Apache-2.0
// Tensor-core partition kernel of the decode: the path for GQA groups (and
// multi-token queries) whose rows outrun the CUDA cores of the thread-group
// kernel (paged_decode.cuh). Same grid, same split-K partials, same reduce
// kernel, same graph-stable launch; Q.K^T and P.V run on mma.sync m16n8k16
// with FP32 accumulation, K and V codes go through the conversions of
// common/dequant.cuh straight into the operand registers (no round trip of
// dequantized values through shared memory). The codes arrive either by 16-
// and 8-byte loads into registers one step ahead, or (TcRingStages: INT4 at
// head size 128, where the register path waited on K at every step) through
// a per-warp cp.async ring in shared memory, two steps ahead, each lane
// copying and reading back its own slots; the ring's stages also carry the
// steps' scale entries; its K and V copies have L2 fetch 256-byte spans
// from DRAM (.L2::256B: a block's K and V pieces are 1 KB each at block
// size 16, at scattered addresses; INT4 0.2-0.7% faster on every benchmark
// shape), but for block size 8's 4-byte V copies (not measured).
// Block size is a template argument, so every load address is a base plus
// an immediate.
//
// Layout. Block (p, h, s), 4 warps, K dtype T = V dtype. A pass covers 8 or
// 16 query rows (kNT = 1 or 2 column tiles of 8); more rows take more passes.
// Warp w takes steps of F::kStepTokens tokens (16-bit 16, 8-bit 32, INT4 64)
// at w, w + 4, ... of the partition, with a private online softmax; the
// four warps merge through shared memory at the end of the pass. A step's
// K and V loads are issued one step ahead (K as soon as S^T has consumed
// the previous codes, V after P.V; the first step's right after the block
// ids, overlapping the scale records and the q operands), and L2 is asked
// for the blocks of the step after (prefetch_k_steps / prefetch_v_steps).
// Steps that end before the sequence and that every row sees whole,
// without ALiBi or soft-cap and with a positive logit scale, run a copy of
// the step without guards and masks.
//   S^T = K Q^T:  A = K (16 tokens x 16 channels), B = Q^T (16 channels x 8
//                 rows), C = S^T. Lane (g, t) loads 16-byte chunk 4c + t of
//                 the two tokens of A rows g and g + 8; the channels a k-step
//                 takes from that chunk are those CodePairs picks
//                 (PairElement), and Q^T is loaded in the same order, so the
//                 conversions never shuffle bits.
//   O^T = V^T P^T: A = V^T (16 channels x 16 tokens), B = P^T, C = O^T (the
//                 channels x rows accumulators stay in registers all pass).
//                 Lane (g, t) loads 8 bytes of V channel rows 16i + g and
//                 16i + g + 8: the span of F::kSpan tokens number t of the
//                 step. The k order of P^T is S^T's row order; StepToken maps
//                 S^T rows to tokens so that P.V's k-steps take the span's
//                 codes in CodePairs order too.
//   P^T:          the FP32 S^T accumulators (rows = tokens) become P as
//                 FP16/BF16 pairs, and movmatrix transposes each 8x8 half
//                 into a B operand: no shared memory.
// Scales. Per-token records {k scale, v scale[, k min, v min]} staged in
// shared memory with 16-byte loads (with a ring: each step's entries as
// stored, in its stage). K: applied to the FP32 accumulator per
// token (INT4: + min * sum(q)). V: folded into P (P' = p * vscale * 2^ev,
// 2^ev chosen from the largest V scale so that P' stays within FP16's normal
// range: per partition up front, or with a ring per warp as the steps come,
// O rescaled by a power of two when a larger scale arrives); INT4's min term
// sum(p * vmin) is kept per row in FP32. The
// softmax runs in log2 units (one FFMA + EX2 a probability).
// Codes exact. Feeding INT8/INT4 codes to the mma with the magic number's
// bias still on (skipping one FP16 op a pair; the bias removed from the
// products) was measured 2% faster and lost the FP32 accumulator's
// precision: P.V by 2e-2 over long partitions, Q.K^T by 0.02 in a logit
// (docs/archive.md, "Exact codes in the mma"). INT4 codes enter as FP16 subnormals instead (no
// bias at all, one LOP3 a pair): their units (2^-24, and 2^-20 for the
// high nibbles) ride on q and P' and leave with the logit factor and the
// output's normalization.
#ifndef KVPAGE_KERNELS_TC_DECODE_CUH_
#define KVPAGE_KERNELS_TC_DECODE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/mma.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/partition_common.cuh"
#include "src/manifest.h"

namespace kvpage {
namespace kernels {
namespace decode {

template <DType T>
struct TcFormat {
  static constexpr int kBits = DTypeBits(T);
  static constexpr int kX = 128 / kBits;               // channels per 16-byte K chunk
  static constexpr int kSpan = 64 / kBits;             // tokens of a V channel row in 8 bytes
  static constexpr int kStepTokens = TcStepTokens(T);  // tokens a warp takes per step
  static constexpr int kTiles = kStepTokens / 16;      // 16-token mma k-steps per step
  static constexpr bool kBf16 = T == DType::kBF16;     // mma input type; FP16 otherwise
  static constexpr bool kSplit = !IsQuantized(T);      // 16-bit caches: hi + lo operands
  // A lane's K tokens of a step lie in sub-spans of at most 8 consecutive,
  // 8-aligned tokens (INT4: two of them, 8 apart), so none crosses a block.
  static constexpr int kKHalves = T == DType::kINT4 ? 2 : 1;
};

// A merged row of the partition: out[d] = sum_w coef[w] * O_w[d] + add.
struct TcRowMerge {
  float coef[kWarps];
  float add;
  int index_lo, index_hi;  // RowOutIndex of the row, split in two words
  float pad;
};
static_assert(sizeof(TcRowMerge) == 8 * sizeof(float), "TcSmemLayout::row holds 8 words a row");

// Token (within a warp's step) of row m of S^T tile j, which is also k
// position m of the P.V step j: rows 2t, 2t + 1, 2t + 8, 2t + 9 belong to
// V span t (lane t's), in the order CodePairs takes that span's codes.
template <DType T>
KVP_HOST_DEVICE constexpr int StepToken(int j, int m) {
  return TcFormat<T>::kSpan * ((m & 7) >> 1) + PairElement<T>(j, 2 * (m >> 3) + (m & 1));
}

// 2^x (MUFU.EX2; -inf gives 0). The softmax runs in log2 units.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Zeroes the 16-bit halves of `x` whose tokens are past the sequence end:
// their codes are stale bytes, possibly NaN patterns, and 0 * NaN must not
// reach the accumulators.
__device__ __forceinline__ uint32_t KeepHalves(uint32_t x, bool lo, bool hi) {
  return x & ((lo ? 0x0000FFFFu : 0u) | (hi ? 0xFFFF0000u : 0u));
}

// What a partition's logits obey (used by the staged kernel; TcPartitionKernel
// below keeps the same rules inline: written with these helpers, INT4's ring
// kernel grew from 195 to 213 registers, docs/archive.md, "INT4 ring"): the soft-cap
// (the scaled logit is divided by cap before tanh), ALiBi, the logit scale,
// and the partition tokens every row sees whole (no window or causal cut):
// steps inside [vis_lo, vis_hi] skip the masks.
struct TcLogitRules {
  float cap, q_scale;
  bool alibi, plain;
  int vis_lo, vis_hi;
};
__device__ __forceinline__ TcLogitRules MakeTcLogitRules(const DecodeParams& p,
                                                         const PartitionState& st) {
  TcLogitRules r;
  r.cap = p.logits_soft_cap;
  r.q_scale = r.cap > 0.0f ? p.sm_scale / r.cap : p.sm_scale;
  r.alibi = p.alibi_slopes != nullptr;
  r.plain = !r.alibi && !(r.cap > 0.0f);
  r.vis_hi = st.len - p.query_len - st.start;
  r.vis_lo = (p.sliding_window > 0 ? max(0, st.len - p.sliding_window) : 0) - st.start;
  return r;
}

// What the masks need of query row `row` of the partition: its last
// visible token (-1: a padding row sees nothing), its first (sliding
// window), its ALiBi slope.
struct TcRowMask {
  int pos, lo;
  float slope;
};
__device__ __forceinline__ TcRowMask MakeTcRowMask(const DecodeParams& p, const PartitionState& st,
                                                   bool alibi, int row) {
  const int gi = row / p.query_len;
  const int i = row - gi * p.query_len;
  const bool live = row < st.rows;
  const int pos = st.len - p.query_len + i;
  TcRowMask m;
  m.pos = live ? pos : -1;
  m.lo = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
  m.slope = (alibi && live) ? p.alibi_slopes[st.kvh * st.group + gi] : 0.0f;
  return m;
}

// A logit y (log2 units, the row's factor applied) of token t through the
// soft-cap, ALiBi and the row's mask (`in`: t is before the sequence end);
// -inf where the row does not see t.
__device__ __forceinline__ float MaskedLogit(float y, const TcLogitRules& r, const TcRowMask& m,
                                             int t, bool in) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  if (!r.plain) {
    float l = y * kLn2;
    if (r.cap > 0.0f) l = r.cap * tanhf(l);
    if (r.alibi) l = fmaf(m.slope, static_cast<float>(t - m.pos), l);
    y = l * kLog2e;
  }
  const bool visible = in && t >= m.lo && t <= m.pos;
  return visible ? y : -INFINITY;
}

// The power of two q's row is scaled by before it is rounded to 16 bits:
// its largest |element| `amax` lands in [2^14, 2^15) (1 for a zero or
// non-finite row).
__device__ __forceinline__ float QOperandScale(float amax) {
  int qe = 0;
  if (amax > 0.0f && isfinite(amax)) {
    frexpf(amax, &qe);  // amax in [2^(qe-1), 2^qe)
    qe = min(max(15 - qe, -100), 100);
  }
  return ldexpf(1.0f, qe);
}

// The partition's per-token scale records (TcRecordWords) -> rec, for the
// slots up to n_valid rounded up to a step (zeros past the sequence end, so
// no step reads outside). The entries of a block are contiguous (16-128
// bytes a KV head): each thread loads 16-byte chunks of K and V entries,
// all of its chunks in flight together. Returns the largest V scale this
// thread stored.
template <DType T, int kBS>
__device__ __forceinline__ float StageTcRecords(const DecodeParams& p, const PartitionState& st,
                                                const int* blk_s, float* rec) {
  float largest = 0.0f;
  if constexpr (TcRecordWords(T) != 0) {
    const CacheGeometry& g = p.geo;
    const uint8_t* ks = p.layer + g.k_scale_offset() + int64_t{st.kvh} * g.k_scale_head_stride();
    const uint8_t* vs = p.layer + g.v_scale_offset() + int64_t{st.kvh} * g.v_scale_head_stride();
    const int64_t kbs = g.k_scale_block_stride(), vbs = g.v_scale_block_stride();
    constexpr int kEntry = T == DType::kINT4 ? 4 : 2;  // bytes (K = V dtype)
    constexpr int kPerChunk = 16 / kEntry;             // tokens of a 16-byte chunk
    constexpr int kChunksPerBlock = kBS * kEntry / 16;
    static_assert(kChunksPerBlock >= 1, "a block's entries fill whole chunks");
    const int nchunks = st.nblk * kChunksPerBlock;
#pragma unroll 4
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      const int b = c / kChunksPerBlock;
      const int at = (c % kChunksPerBlock) * 16;
      const uint4 kc = Load16(ks + int64_t{blk_s[b]} * kbs + at);
      const uint4 vc = Load16(vs + int64_t{blk_s[b]} * vbs + at);
      const uint32_t kw[4] = {kc.x, kc.y, kc.z, kc.w};
      const uint32_t vw[4] = {vc.x, vc.y, vc.z, vc.w};
#pragma unroll
      for (int t = 0; t < kPerChunk; ++t) {
        const int j = c * kPerChunk + t;
        const int shift = kEntry == 2 ? 16 * (t & 1) : 0;
        TokenScale k = TokenScaleFromBits<T>(kw[t * kEntry / 4] >> shift);
        TokenScale v = TokenScaleFromBits<T>(vw[t * kEntry / 4] >> shift);
        if (j >= st.n_valid) k = v = {0.0f, 0.0f};  // stale slots of the last block
        if constexpr (T == DType::kINT4) {
          reinterpret_cast<float4*>(rec)[j] = make_float4(k.scale, k.min, v.scale, v.min);
        } else {
          reinterpret_cast<float2*>(rec)[j] = make_float2(k.scale, v.scale);
        }
        largest = fmaxf(largest, v.scale);
      }
    }
    // Past the last block, up to the step the last warp reads.
    constexpr int kStep = TcFormat<T>::kStepTokens;
    const int n = (st.n_valid + kStep - 1) / kStep * kStep;
    for (int j = st.nblk * kBS + threadIdx.x; j < n; j += blockDim.x) {
      for (int w = 0; w < TcRecordWords(T); ++w) rec[TcRecordWords(T) * j + w] = 0.0f;
    }
  }
  return largest;
}

template <DType T, int D, int kNT, int kBS>
__global__ void __launch_bounds__(kThreads, TcMinBlocksPerSm(T, D, kNT))
    TcPartitionKernel(const __grid_constant__ DecodeParams p,
                      const __grid_constant__ DecodePlan plan,
                      const __grid_constant__ DecodeWorkspace ws) {
  using F = TcFormat<T>;
  constexpr bool kBf16 = F::kBf16;
  constexpr int kLaneChunks = D / F::kX / 4;  // K chunks per lane per token
  constexpr int kChunkSteps = F::kX / 4;      // mma k-steps per K chunk
  constexpr int kKSteps = D / 16;
  constexpr int kMTiles = D / 16;
  constexpr int kPassRows = 8 * kNT;
  constexpr int kParts = F::kSplit ? 2 : 1;
  constexpr int kStep = F::kStepTokens;
  constexpr int kBits = F::kBits;
  constexpr bool kInt4 = T == DType::kINT4;
  constexpr int kRec = TcRecordWords(T);
  constexpr int kOutStride = D + 4;
  constexpr int kStages = TcRingStages(T, D);
  constexpr bool kRing = kStages > 0;
  constexpr int kKSlots = TcRingKSlots(T, D);
  static_assert(kKSlots == F::kTiles * 2 * kLaneChunks,
                "ring K slots: a lane's K chunks of a step");
  static_assert(kLaneChunks * kChunkSteps == kKSteps, "four lanes per K row");
  static_assert(D % 8 == 0 && F::kX % 8 == 0, "q is loaded eight channels at a time");
  constexpr bool kMaskV = T != DType::kINT8 && T != DType::kINT4;  // codes that can be NaN
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  // The codes' units in the mma operands (CodePairUnit; INT4: subnormals).
  // K: q's channels in the hi registers take kHiRatio, so that every
  // product is q * code * kLoUnit, removed in the logit factor. V: P' of the
  // hi registers' tokens takes kHiRatio, and O is kLoUnit times its value
  // until it leaves the registers.
  constexpr float kLoUnit = CodePairUnit<T>(false);
  constexpr float kHiRatio = CodePairUnit<T>(false) / CodePairUnit<T>(true);

  const CacheGeometry& g = p.geo;
  PartitionState st;
  // The ring kernel's first partition copies its block ids while the
  // length loads (CopyTableSlice): INT4 0.2-1.3% faster on every benchmark
  // shape. Not its other partitions, which ragged batches leave mostly
  // empty (copies for nothing: +0.2% there), nor the register path (no
  // gain measured, and moving its layout ahead of BeginPartition cost
  // FP8/INT8 1-2%: its code stays as it was; docs/archive.md, "INT4
  // ring").
  int* early_blk_s = nullptr;
  if constexpr (kRing) {
    if (blockIdx.x == 0) {
      early_blk_s = reinterpret_cast<int*>(SharedWords() +
                                           MakeTcSmemLayout(g, plan.partition_size, kPassRows).blk);
    }
  }
  if (!BeginPartition(p, plan, ws, st, kRing, early_blk_s)) return;  // past this sequence's end
  const TcSmemLayout lay = MakeTcSmemLayout(g, st.P, kPassRows);
  float* smem = SharedWords();
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int grp = lane / 4;
  const int tig = lane % 4;
  constexpr int bs = kBS;
  constexpr int lbs = kBS == 8 ? 3 : kBS == 16 ? 4 : 5;
  static_assert(kBS == 8 || kBS == 16 || kBS == 32, "block sizes 8, 16, 32");
  const int qlen = p.query_len;

  __shared__ unsigned vmax_bits;
  if (tid == 0) vmax_bits = 0u;  // ordered by StageBlockIds' barriers
  int* blk_s = reinterpret_cast<int*>(smem + lay.blk);
  if (!StageBlockIds(p, plan, ws, st, blk_s, kRing, early_blk_s != nullptr)) return;
  const uint8_t* k_head = p.layer + g.k_data_offset() + int64_t{st.kvh} * g.k_head_stride();
  const uint8_t* v_head = p.layer + g.v_data_offset() + int64_t{st.kvh} * g.v_head_stride();
  const int64_t k_block_stride = g.k_block_stride();
  const int64_t v_block_stride = g.v_block_stride();
  constexpr int chunk4 = 4 * bs * 16;   // bytes between a lane's K chunks of one token
  constexpr int vrow = bs * kBits / 8;  // bytes of a V channel row in a block
  constexpr int vrow8 = 8 * vrow;       // between the V rows of hh and i neighbours
  // With a soft-cap the scaled logit is divided by cap before tanh.
  const float cap = p.logits_soft_cap;
  const float q_scale = cap > 0.0f ? p.sm_scale / cap : p.sm_scale;
  const bool alibi = p.alibi_slopes != nullptr;
  const bool plain = !alibi && !(cap > 0.0f);
  // Tokens of the partition that every row sees whole (no window or causal
  // cut): steps inside [vis_lo, vis_hi] skip the masks.
  const int vis_hi = st.len - qlen - st.start;
  const int vis_lo = (p.sliding_window > 0 ? max(0, st.len - p.sliding_window) : 0) - st.start;

  // A lane's K tokens in a step: s0 + k_lane + StepToken<T>(j, 8 hh).
  const int k_lane = F::kSpan * (grp >> 1) + (kInt4 ? 4 : 1) * (grp & 1);
  const uint8_t* k_lane_head = k_head + (k_lane % 8) * 16 + tig * (bs * 16);
  const uint8_t* v_lane_head = v_head + grp * vrow;

  // Registers of one step's K and V codes (no ring). A step's loads are
  // issued a step ahead: K once S^T of the step before has consumed its
  // codes, V once its P.V has (the first step's right after the block ids,
  // so that they overlap the scale records and the q operands).
  uint4 kraw[kRing ? 1 : F::kTiles][2][kLaneChunks];
  uint2 vraw[kRing ? 1 : kMTiles][2];
  // With a ring: this lane's slots of stage `stage` (K slot (j, hh, c),
  // V slot (i, hh)); the lane copies into and reads back only its own.
  uint8_t* const ring = reinterpret_cast<uint8_t*>(smem + lay.ring + warp * lay.ring_warp);
  auto k_slot = [&](int stage, int j, int hh, int c) {
    return ring + stage * TcStageBytes(T, D) + (((j * 2 + hh) * kLaneChunks + c) * 32 + lane) * 16;
  };
  auto v_slot = [&](int stage, int i, int hh) {
    return ring + stage * TcStageBytes(T, D) + 32 * 16 * kKSlots + ((i * 2 + hh) * 32 + lane) * 8;
  };
  // The step's scale entries: K of token t at rec_slot(stage) + t * kEntry,
  // V after the step's K entries.
  constexpr int kEntry = TcEntryBytes(T);
  auto rec_slot = [&](int stage) {
    return ring + stage * TcStageBytes(T, D) + 32 * (16 * kKSlots + 8 * TcRingVSlots(D));
  };
  // K: the rows of S^T rows grp, grp + 8 of every tile. kFull: the step
  // ends before the sequence does (no guards).
  auto load_k = [&](const int s0, const int stage, auto full) {
    constexpr bool kFull = decltype(full)::value;
    const uint8_t* kb[F::kKHalves];
#pragma unroll
    for (int h = 0; h < F::kKHalves; ++h) {
      const int t8 = s0 + ((k_lane + 8 * h) & ~7);  // the sub-span's first token
      const int b = kFull || t8 < st.n_valid ? blk_s[t8 >> lbs] : 0;
      kb[h] = k_lane_head + int64_t{b} * k_block_stride + (t8 & (bs - 1)) * 16;
    }
#pragma unroll
    for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int off = StepToken<T>(j, 8 * hh);  // compile-time after unrolling
        const int h = off / 8;
        const uint8_t* kp = kb[h] + (off % 8) * 16;
        const bool in = kFull || s0 + k_lane + off < st.n_valid;
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          if constexpr (kRing) {
            CpAsync<16, true>(k_slot(stage, j, hh, c), kp + c * chunk4, in);
          } else {
            kraw[j][hh][c] = in ? Load16(kp + c * chunk4) : Zero16();
          }
        }
      }
    }
  };
  // V: the lane's span of every channel row it holds. The ring's V copies
  // stay 8-byte, L1-allocating ones: pairing a lane's rows into 16-byte
  // copies (which bypass L1) measured 19% slower (docs/archive.md,
  // "INT4 ring").
  auto load_v = [&](const int s0, const int stage, auto full) {
    constexpr bool kFull = decltype(full)::value;
    const int span_tok = s0 + F::kSpan * tig;
    const bool in = kFull || span_tok < st.n_valid;
    const int b = in ? blk_s[span_tok >> lbs] : 0;
    const uint8_t* vb =
        v_lane_head + int64_t{b} * v_block_stride + (span_tok & (bs - 1)) * kBits / 8;
    if constexpr (!kInt4 || bs > 8) {
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint8_t* vp = vb + (2 * i + hh) * vrow8;
          if constexpr (kRing) {
            CpAsync<8, true>(v_slot(stage, i, hh), vp, in);
          } else {
            vraw[i][hh] = in ? __ldg(reinterpret_cast<const uint2*>(vp)) : make_uint2(0u, 0u);
          }
        }
      }
    } else {
      // An INT4 span of 16 tokens over two blocks of 8: two 4-byte rows.
      const bool in2 = kFull || span_tok + 8 < st.n_valid;
      const int b2 = in2 ? blk_s[(span_tok >> lbs) + 1] : 0;
      const uint8_t* vb2 = v_lane_head + int64_t{b2} * v_block_stride;
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int off = (2 * i + hh) * vrow8;
          if constexpr (kRing) {
            CpAsync<4>(v_slot(stage, i, hh), vb + off, in);
            CpAsync<4>(v_slot(stage, i, hh) + 4, vb2 + off, in2);
          } else {
            vraw[i][hh] =
                make_uint2(in ? __ldg(reinterpret_cast<const unsigned*>(vb + off)) : 0u,
                           in2 ? __ldg(reinterpret_cast<const unsigned*>(vb2 + off)) : 0u);
          }
        }
      }
    }
  };
  // The step's K and V scale entries, 16 bytes a lane (the first 2 *
  // kRecChunks lanes): chunk q covers 16 / kEntry tokens of one block.
  constexpr int kRecChunks = kStep * kEntry / 16;
  constexpr int kRecTokens = kEntry > 0 ? 16 / kEntry : 1;  // tokens of a chunk
  static_assert(
      !kRing || kEntry == 0 || (kRecChunks >= 1 && 2 * kRecChunks <= 32 && kRecTokens <= kBS),
      "a step's scale entries: whole 16-byte chunks, one per lane at most");
  // Lane q < 2 * kRecChunks copies chunk q % kRecChunks of the K (q <
  // kRecChunks) or V entries: its token offset in a step and, since steps
  // start on a block boundary, its entry's place in the block are the same
  // at every step. Computed here once: inside the lane-conditional copy the
  // compiler recomputed the geometry's offsets (a division among them) at
  // every step, about 95 instructions (docs/archive.md, "INT4 ring").
  static_assert(!kRing || kStep % kBS == 0, "ring steps start on a block boundary");
  const bool rec_is_v = lane >= kRecChunks;
  const int rec_tok = (lane % max(kRecChunks, 1)) * kRecTokens;
  const uint8_t* const rec_head =
      p.layer +
      (rec_is_v ? g.v_scale_offset() + int64_t{st.kvh} * g.v_scale_head_stride()
                : g.k_scale_offset() + int64_t{st.kvh} * g.k_scale_head_stride()) +
      (rec_tok & (bs - 1)) * kEntry;
  const int rec_block_stride =
      static_cast<int>(rec_is_v ? g.v_scale_block_stride() : g.k_scale_block_stride());
  auto load_rec = [&](const int s0, const int stage) {
    if (lane < 2 * kRecChunks) {
      const int t = s0 + rec_tok;
      const bool in = t < st.n_valid;
      const int b = in ? blk_s[t >> lbs] : 0;
      CpAsync<16>(rec_slot(stage) + lane * 16, rec_head + int64_t{b} * rec_block_stride, in);
    }
  };
  auto load_step = [&](const int s0, const int stage, const bool with_k, const bool with_v) {
    if (s0 >= st.n_valid) return;
    if constexpr (kRing) load_rec(s0, stage);
    if (s0 + kStep <= st.n_valid) {
      if (with_k) load_k(s0, stage, std::true_type{});
      if (with_v) load_v(s0, stage, std::true_type{});
    } else {
      if (with_k) load_k(s0, stage, std::false_type{});
      if (with_v) load_v(s0, stage, std::false_type{});
    }
  };
  // The first steps' loads, right after the block ids: with a ring, the
  // steps of stages 0 .. kStages - 2 (one cp.async group each, empty past
  // the partition's end), else the first step into registers.
  auto load_first_steps = [&](const int first) {
    if constexpr (kRing) {
#pragma unroll
      for (int i = 0; i + 1 < kStages; ++i) {
        load_step((warp + i * kWarps) * kStep, i, true, true);
        CpAsyncCommit();
      }
    } else {
      load_step(first, 0, true, true);
    }
  };
  // Register path: each step's loads are issued one step ahead, which ncu
  // found too little to cover DRAM's latency (FP8 at B = 512: 57% of the
  // warps' stall samples on the first use of the K codes). So the L2 fetches
  // the K blocks of the warp's step plan.prefetch_k_steps ahead and the V
  // blocks prefetch_v_steps ahead (0: none): one bulk prefetch per block
  // and region from lanes 0 .. kPfBlocks - 1 (K) and the next kPfBlocks
  // (V), no registers held. Further ahead than a step thrashed L2
  // (docs/archive.md, "L2 prefetch").
  constexpr int kPfBlocks = kStep >= kBS ? kStep / kBS : 1;  // blocks a step touches
  constexpr int kKBlockBytes = kLaneChunks * 4 * kBS * 16;   // one KV head's K of a block
  constexpr int kVBlockBytes = D * kBS * kBits / 8;
  const int pf_steps = kRing || lane >= 2 * kPfBlocks ? 0
                       : lane < kPfBlocks             ? plan.prefetch_k_steps
                                                      : plan.prefetch_v_steps;
  const int pf_ahead = pf_steps * kWarps * kStep;  // tokens
  // This lane's prefetch for the warp's step at s0 (its first token). A
  // step shorter than a block shares it with the next warp's: the warp
  // whose step starts the block fetches it.
  auto prefetch_step = [&](const int s0) {
    if (kStep < kBS && (s0 & (kBS - 1)) != 0) return;
    const int bi = (s0 >> lbs) + lane % kPfBlocks;
    if (s0 < st.n_valid && bi < st.nblk) {
      const int b = blk_s[bi];
      if (lane < kPfBlocks) {
        PrefetchL2<kKBlockBytes>(k_head + int64_t{b} * k_block_stride);
      } else {
        PrefetchL2<kVBlockBytes>(v_head + int64_t{b} * v_block_stride);
      }
    }
  };
  // The warp's step (s0) and its next one (nxt), every kWarps-th step of
  // the partition. The register path carries the next step in a register
  // instead of forming s0 + kWarps * kStep at each use: BF16 in 2752-token
  // partitions measured 0.5-1.8% faster (docs/archive.md, "Tensor-core decode:
  // register path").
  // The ring keeps its own loop as it was (with nxt live its registers
  // grew from 195 to 197).
  int s0 = 0, nxt = 0;
  // A pass's first loads, and the prefetches of the steps before the first
  // one the loop issues.
  auto start_pass = [&]() {
    s0 = warp * kStep;
    nxt = s0 + kWarps * kStep;
    load_first_steps(s0);
    for (int i = 1; i < pf_steps; ++i) prefetch_step((warp + i * kWarps) * kStep);
  };
  start_pass();

  const float* rec = smem + lay.rec;
  if constexpr (!kRing) {
    const float vlargest = StageTcRecords<T, kBS>(p, st, blk_s, smem + lay.rec);
    if (kRec != 0) atomicMax(&vmax_bits, __float_as_uint(vlargest));  // scales >= 0 order as bits
  }
  __syncthreads();
  // P' = p * vscale * vfac < 2^14: inside FP16's range, and the tokens that
  // carry weight stay clear of its subnormals (16-bit caches: vscale = 1).
  // With a ring there is no partition-wide maximum up front: each warp keeps
  // its own factor, lowered (and its O rescaled) when a step brings a
  // larger V scale (wexp below); vfac stays 1 there.
  float vfac = 1.0f;
  if constexpr (!kRing) {
    const float vmax = kRec != 0 ? __uint_as_float(vmax_bits) : 1.0f;
    if (vmax > 0.0f && isfinite(vmax)) {
      int e = 0;
      frexpf(vmax, &e);  // vmax in [2^(e-1), 2^e)
      vfac = ldexpf(1.0f, min(max(14 - e, -100), 100));
    }
  }
  const float inv_vfac = 1.0f / kLoUnit / vfac;      // powers of two: exact (with a ring too)
  const float vfac_hh[2] = {vfac, vfac * kHiRatio};  // P' of the lo, hi registers' tokens

  for (int r0 = 0; r0 < st.rows; r0 += kPassRows) {
    // ---- Q^T operands: lane (grp, tig) holds row r0 + 8 nt + grp at the
    // channels of its K chunks, times lambda, times 2^qe (per row).
    uint32_t qb[kNT][kKSteps][2][kParts];
    float own_fac[kNT], own_sum[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int row = r0 + 8 * nt + grp;
      const bool live = row < st.rows;
      const int gi = row / qlen;
      const int i = row - gi * qlen;
      const int64_t qbase =
          (int64_t{st.seq} * qlen + i) * p.q_stride + int64_t{st.kvh * st.group + gi} * D;
      float x[kKSteps][4];
      float amax = 0.0f;
#pragma unroll
      for (int c = 0; c < kLaneChunks; ++c) {
        const int ch0 = (4 * c + tig) * F::kX;  // the lane's chunk: kX channels
#pragma unroll
        for (int e8 = 0; e8 < F::kX; e8 += 8) {
          float v[8], lam[8];
          if (live) {
            LoadAsFloat8(p.q_dtype, p.q, qbase + ch0 + e8, v);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
          }
          if (p.key_smoothing != nullptr) {
            LoadAsFloat8(DType::kFP32, p.key_smoothing, int64_t{st.kvh} * D + ch0 + e8, lam);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] *= lam[e];
          }
          // Channel ch0 + e8 + e is slot `slot` of k-step k where
          // PairElement<T>(k, slot) == e8 + e.
#pragma unroll
          for (int k = 0; k < kChunkSteps; ++k) {
#pragma unroll
            for (int slot = 0; slot < 4; ++slot) {
              const int el = PairElement<T>(k, slot);
              if (el >= e8 && el < e8 + 8) {
                x[c * kChunkSteps + k][slot] = v[el - e8];
                amax = fmaxf(amax, fabsf(v[el - e8]));
              }
            }
          }
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
      int qe = 0;
      if (amax > 0.0f && isfinite(amax)) {
        frexpf(amax, &qe);  // amax in [2^(qe-1), 2^qe)
        qe = min(max(15 - qe, -100), 100);
      }
      const float up = ldexpf(1.0f, qe);
      float qsum = 0.0f;  // sum(q) as rounded (INT4's min term)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float u = h == 1 ? kHiRatio : 1.0f;  // the codes' unit
          const float a = x[ks][2 * h] * up * u;
          const float b = x[ks][2 * h + 1] * up * u;
          const uint32_t hi = PackPair<kBf16>(a, b);
          const float2 hv = UnpackPair<kBf16>(hi);
          qb[nt][ks][h][0] = hi;
          qsum += (hv.x + hv.y) / u;
          if constexpr (kParts == 2) {
            const uint32_t lo = PackPair<kBf16>(a - hv.x, b - hv.y);
            const float2 lv = UnpackPair<kBf16>(lo);
            qb[nt][ks][h][kParts - 1] = lo;
            qsum += lv.x + lv.y;
          }
        }
      }
      qsum += __shfl_xor_sync(kFullMask, qsum, 1);
      qsum += __shfl_xor_sync(kFullMask, qsum, 2);
      // S^T comes in kLoUnit units: so do the min term's sum(q).
      own_fac[nt] = q_scale / up * kLog2e / kLoUnit;
      own_sum[nt] = qsum * kLoUnit;
    }

    // ---- The rows of this lane's accumulators: 8 nt + 2 tig + e. Logits
    // y are in log2 units: y = rfac * (kscale * s + kmin * sum(q)).
    float rfac[kNT][2], rsum[kNT][2], rslope[kNT][2];
    int rpos[kNT][2], rlo[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int src = 4 * (2 * tig + e);  // the lane that loaded that row's q
        rfac[nt][e] = __shfl_sync(kFullMask, own_fac[nt], src);
        rsum[nt][e] = __shfl_sync(kFullMask, own_sum[nt], src);
        // What the masks need: the row's last visible token, its first
        // (sliding window), its ALiBi slope.
        const int row = r0 + 8 * nt + 2 * tig + e;
        const int gi = row / qlen;
        const int i = row - gi * qlen;
        const bool live = row < st.rows;
        const int pos = st.len - qlen + i;
        rpos[nt][e] = live ? pos : -1;  // a padding row sees nothing
        rlo[nt][e] = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
        rslope[nt][e] = (alibi && live) ? p.alibi_slopes[st.kvh * st.group + gi] : 0.0f;
      }
    }

    float o[kMTiles][kNT][4];
    float mrun[kNT][2], lrun[kNT][2], pmrun[kNT][2];
    // Ring: this warp's V factor 2^wexp, from the largest V scale it has
    // seen so far (vfac's rule); wmax_e: that scale's exponent (-inf: none).
    int wexp = 100;
    float wmax_e = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
        for (int c = 0; c < 4; ++c) o[i][nt][c] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        mrun[nt][e] = -INFINITY;
        lrun[nt][e] = 0.0f;
        pmrun[nt][e] = 0.0f;
      }
    }

    // One step of kStep tokens from s0. kFast: every token is before the
    // sequence end and seen by every row, there is no ALiBi or soft-cap,
    // and the logit scale is positive — no per-element masks, no guarded
    // loads, the scale applied to the row maxima instead of every logit.
    auto step = [&](const int s0, const int stage, auto fast) {
      constexpr bool kFast = decltype(fast)::value;
      const int span_tok = s0 + F::kSpan * tig;
      if constexpr (kRing) {
        // The stage of step s0 - 1 (consumed: the barrier orders every
        // lane's reads of its scale entries first) takes the step kStages -
        // 1 ahead; then wait for this step's own group, and for the other
        // lanes' (each copied some of the step's scale entries).
        __syncwarp();
        load_step(s0 + (kStages - 1) * kWarps * kStep, stage == 0 ? kStages - 1 : stage - 1, true,
                  true);
        CpAsyncCommit();
        CpAsyncWait<kStages - 1>();
        __syncwarp();
      }
      // ---- S^T = K Q^T.
      // The hi and lo products of a 16-bit cache accumulate apart: two
      // independent mma chains instead of one twice as long.
      float s[F::kTiles][kNT][4];
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
        float sp[kParts][kNT][4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int part = 0; part < kParts; ++part) sp[part][nt][c] = 0.0f;
          }
        }
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const uint4 k0 = kRing ? *reinterpret_cast<const uint4*>(k_slot(stage, j, 0, c))
                                 : kraw[kRing ? 0 : j][0][c];
          const uint4 k1 = kRing ? *reinterpret_cast<const uint4*>(k_slot(stage, j, 1, c))
                                 : kraw[kRing ? 0 : j][1][c];
          const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w};
          const uint32_t w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
          for (int k = 0; k < kChunkSteps; ++k) {
            uint32_t a[4];
            CodePairs<T>(w0, k, a[0], a[2]);
            CodePairs<T>(w1, k, a[1], a[3]);
            const int ks = c * kChunkSteps + k;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
              for (int part = 0; part < kParts; ++part) {
                MmaM16N8K16<kBf16>(sp[part][nt], a, qb[nt][ks][0][part], qb[nt][ks][1][part]);
              }
            }
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            s[j][nt][c] = sp[0][nt][c];
            if constexpr (kParts == 2) s[j][nt][c] += sp[kParts - 1][nt][c];
          }
        }
      }

      if constexpr (!kRing) load_step(nxt, 0, true, false);  // kraw is free again

      // ---- Logits (log2 units): K scale, soft-cap, ALiBi, masks; the
      // step's row maxima. The token records serve the P stage too.
      float vs[F::kTiles][2], vm[F::kTiles][2];
      float mstep[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mstep[nt][0] = mstep[nt][1] = -INFINITY;
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tt = s0 + k_lane + StepToken<T>(j, 8 * hh);
          float ks = 1.0f, km = 0.0f;
          vs[j][hh] = vfac_hh[hh];
          vm[j][hh] = 0.0f;
          const bool in = kFast || tt < st.n_valid;
          if constexpr (kRing) {
            // Entries as stored; past the sequence end stale bytes: zeros.
            // (16-bit caches have none: TokenScaleFromBits gives 1, 0.)
            uint32_t kb = 0, vb = 0;
            const uint8_t* entries = rec_slot(stage) + kEntry * (tt - s0);
            if constexpr (kEntry == 4) {
              kb = *reinterpret_cast<const uint32_t*>(entries);
              vb = *reinterpret_cast<const uint32_t*>(entries + kStep * 4);
            } else if constexpr (kEntry == 2) {
              kb = *reinterpret_cast<const uint16_t*>(entries);
              vb = *reinterpret_cast<const uint16_t*>(entries + kStep * 2);
            }
            const TokenScale k = TokenScaleFromBits<T>(in ? kb : 0u);
            const TokenScale v = TokenScaleFromBits<T>(in ? vb : 0u);
            ks = k.scale, km = k.min, vs[j][hh] = v.scale, vm[j][hh] = v.min;
          } else if constexpr (kRec == 4) {
            const float4 r = *reinterpret_cast<const float4*>(rec + 4 * tt);
            ks = r.x, km = r.y, vs[j][hh] = r.z * vfac_hh[hh], vm[j][hh] = r.w;
          } else if constexpr (kRec == 2) {
            const float2 r = *reinterpret_cast<const float2*>(rec + 2 * tt);
            ks = r.x, vs[j][hh] = r.y * vfac_hh[hh];
          }
          const int t = st.start + tt;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float sx = s[j][nt][2 * hh + e];
              // A fast step keeps y unscaled: rfac (> 0 there) rides on the
              // row maximum and on the FFMA before EX2, one FMUL less an element.
              float y = kInt4 ? fmaf(ks, sx, km * rsum[nt][e]) : ks * sx;
              if constexpr (!kFast) {
                y *= rfac[nt][e];
                if (!plain) {
                  float l = y * kLn2;
                  if (cap > 0.0f) l = cap * tanhf(l);
                  if (alibi) l = fmaf(rslope[nt][e], static_cast<float>(t - rpos[nt][e]), l);
                  y = l * kLog2e;
                }
                const bool visible = in && t >= rlo[nt][e] && t <= rpos[nt][e];
                y = visible ? y : -INFINITY;
              }
              s[j][nt][2 * hh + e] = y;
              mstep[nt][e] = fmaxf(mstep[nt][e], y);
            }
          }
        }
      }

      // ---- Online softmax: rescale what the warp has so far, only when
      // some row's maximum grew (rare after the first steps). A vote on the
      // lanes' own maxima ahead of these shuffles, as for the V scales
      // below, measured slower for short partitions: on random logits some
      // row of eight grows at most of their steps, which then pay for the
      // vote too (docs/archive.md, "Tensor-core decode: register path").
      bool grew = false;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float m = mstep[nt][e];
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 4));
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 8));
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 16));
          mstep[nt][e] = fmaxf(mrun[nt][e], kFast ? m * rfac[nt][e] : m);
          grew |= mstep[nt][e] > mrun[nt][e];
        }
      }
      if (__any_sync(kFullMask, grew)) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float mnew = mstep[nt][e];
            const float alpha = mnew > mrun[nt][e] ? Exp2(mrun[nt][e] - mnew) : 1.0f;
            mrun[nt][e] = mnew;
            lrun[nt][e] *= alpha;
            pmrun[nt][e] *= alpha;  // also where it stays 0: guarding it made ptxas spill 300 B
#pragma unroll
            for (int i = 0; i < kMTiles; ++i) {
              o[i][nt][e] *= alpha;
              o[i][nt][e + 2] *= alpha;
            }
          }
        }
      }

      if constexpr (kRing) {
        // The step's largest V scale (warp-wide); a larger exponent than
        // seen lowers this warp's factor: O rescaled by a power of two.
        // The warp-wide scale has a larger exponent exactly when some
        // lane's own largest scale has, which after the first steps none
        // has: a vote decides, and the shuffles that reduce the scales (a
        // chain of three on the step's path) run only then. Same results.
        float vmax = 0.0f;
#pragma unroll
        for (int j = 0; j < F::kTiles; ++j) vmax = fmaxf(vmax, fmaxf(vs[j][0], vs[j][1]));
        int e = 0;
        if (vmax > 0.0f && isfinite(vmax)) frexpf(vmax, &e);  // vmax in [2^(e-1), 2^e)
        const bool larger = vmax > 0.0f && isfinite(vmax) && static_cast<float>(e) > wmax_e;
        if (__any_sync(kFullMask, larger)) {
          vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 4));
          vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 8));
          vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 16));
        }
        if (vmax > 0.0f && isfinite(vmax)) {
          frexpf(vmax, &e);  // vmax in [2^(e-1), 2^e)
          if (static_cast<float>(e) > wmax_e) {
            const int nexp = min(max(14 - e, -100), 100);
            if (nexp != wexp) {
              // FP16 scales have exponents -23..16: ratios of 2^-39 at least.
              const float ratio = ldexpf(1.0f, nexp - wexp);
#pragma unroll
              for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
                  for (int c = 0; c < 4; ++c) o[i][nt][c] *= ratio;
                }
              }
            }
            wmax_e = static_cast<float>(e);
            wexp = nexp;
          }
        }
        const float wfac = ldexpf(1.0f, wexp);
#pragma unroll
        for (int j = 0; j < F::kTiles; ++j) {
          vs[j][0] *= wfac;
          vs[j][1] *= wfac * kHiRatio;
        }
      }

      // ---- P' = p * vscale * vfac as B operands (P^T), via movmatrix.
      uint32_t pb[F::kTiles][kNT][2][kParts];
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float pv[2][2];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float y = s[j][nt][2 * hh + e];
              // A masked logit is -inf; so may the row maximum be (nothing
              // seen yet): -inf - -inf must give 0, not NaN.
              const float pr = kFast ? Exp2(fmaf(y, rfac[nt][e], -mrun[nt][e]))
                                     : (y == -INFINITY ? 0.0f : Exp2(y - mrun[nt][e]));
              lrun[nt][e] += pr;
              if constexpr (kInt4) pmrun[nt][e] = fmaf(pr, vm[j][hh], pmrun[nt][e]);
              pv[hh][e] = pr * vs[j][hh];
            }
          }
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const uint32_t hi = PackPair<kBf16>(pv[hh][0], pv[hh][1]);
            pb[j][nt][hh][0] = TransposeM8N8(hi);
            if constexpr (kParts == 2) {
              const float2 hv = UnpackPair<kBf16>(hi);
              pb[j][nt][hh][kParts - 1] =
                  TransposeM8N8(PackPair<kBf16>(pv[hh][0] - hv.x, pv[hh][1] - hv.y));
            }
          }
        }
      }

      // ---- O^T += V^T P^T. Exact codes here, not biased ones: the bias
      // would ride on every product (1024 * sum(P') against outputs that
      // can be 100x smaller than the codes' mean over long contexts) and
      // cost the FP32 accumulator the precision the output needs.
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint2 v0 =
            kRing ? *reinterpret_cast<const uint2*>(v_slot(stage, i, 0)) : vraw[kRing ? 0 : i][0];
        const uint2 v1 =
            kRing ? *reinterpret_cast<const uint2*>(v_slot(stage, i, 1)) : vraw[kRing ? 0 : i][1];
        const uint32_t w0[2] = {v0.x, v0.y};
        const uint32_t w1[2] = {v1.x, v1.y};
#pragma unroll
        for (int j = 0; j < F::kTiles; ++j) {
          uint32_t a[4];
          CodePairs<T>(w0, j, a[0], a[2]);
          CodePairs<T>(w1, j, a[1], a[3]);
          if constexpr (kMaskV && !kFast) {
            bool keep[4];
#pragma unroll
            for (int slot = 0; slot < 4; ++slot) {
              keep[slot] = span_tok + PairElement<T>(j, slot) < st.n_valid;
            }
            a[0] = KeepHalves(a[0], keep[0], keep[1]);
            a[1] = KeepHalves(a[1], keep[0], keep[1]);
            a[2] = KeepHalves(a[2], keep[2], keep[3]);
            a[3] = KeepHalves(a[3], keep[2], keep[3]);
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int part = 0; part < kParts; ++part) {
              MmaM16N8K16<kBf16>(o[i][nt], a, pb[j][nt][0][part], pb[j][nt][1][part]);
            }
          }
        }
      }
      if constexpr (!kRing) load_step(nxt, 0, false, true);  // vraw is free again
    };

    int stage = 0;  // the ring stage of step s0
#pragma unroll 1
    while (s0 < st.n_valid) {
      if (pf_ahead > 0) prefetch_step(s0 + pf_ahead);
      const bool fast = plain && q_scale > 0.0f && s0 + kStep <= st.n_valid && s0 >= vis_lo &&
                        s0 + kStep - 1 <= vis_hi;
      if (fast) {
        step(s0, stage, std::true_type{});
      } else {
        step(s0, stage, std::false_type{});
      }
      stage = stage + 1 == kStages ? 0 : stage + 1;
      if constexpr (kRing) {
        s0 += kWarps * kStep;
      } else {
        s0 = nxt;
        nxt += kWarps * kStep;
      }
    }
    // Nothing is in flight past the last step (loads stop at n_valid), but
    // the ring slice becomes this warp's O block below: every lane done
    // with its slots first.
    if constexpr (kRing) {
      CpAsyncWait<0>();
      __syncwarp();
    }

    // ---- Merge the warps, normalize, write the partials.
    float* stat = smem + lay.stat;
    float* wout = smem + lay.out;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float l = lrun[nt][e], pm = pmrun[nt][e];
#pragma unroll
        for (int off = 4; off < 32; off *= 2) {
          l += __shfl_xor_sync(kFullMask, l, off);
          if constexpr (kInt4) pm += __shfl_xor_sync(kFullMask, pm, off);
        }
        const int r = 8 * nt + 2 * tig + e;
        if (grp == 0) {
          stat[(0 * kWarps + warp) * kPassRows + r] = mrun[nt][e];
          stat[(1 * kWarps + warp) * kPassRows + r] = l;
          stat[(2 * kWarps + warp) * kPassRows + r] = pm;
        }
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            wout[warp * lay.out_warp + r * kOutStride + 16 * i + grp + 8 * hh] =
                kRing ? o[i][nt][2 * hh + e] * ldexpf(1.0f, -wexp) : o[i][nt][2 * hh + e];
          }
        }
      }
    }
    __syncthreads();
    const int live_rows = min(kPassRows, st.rows - r0);
    // Only the ring kernel writes out directly: compiled into the
    // 168-register kernels, the direct stores cost them 2-3% on multi-wave
    // grids (docs/archive.md, "Direct output").
    const bool direct = kRing && PartitionWritesOutput(plan, st);
    auto* merge = reinterpret_cast<TcRowMerge*>(smem + lay.row);
    if (tid < live_rows) {
      const int r = tid;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, stat[w * kPassRows + r]);
      float f[kWarps];
      float sum = 0.0f, pm = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        // 0 for a warp that saw nothing; all 0 when no warp saw anything.
        f[w] = m == -INFINITY ? 0.0f : Exp2(stat[w * kPassRows + r] - m);
        sum = fmaf(f[w], stat[(kWarps + w) * kPassRows + r], sum);
        pm = fmaf(f[w], stat[(2 * kWarps + w) * kPassRows + r], pm);
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      TcRowMerge mg;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mg.coef[w] = f[w] * inv_vfac * inv;
      mg.add = pm * inv;
      const int64_t at = RowOutIndex(p, plan, st, direct, r0 + r);
      mg.index_lo = static_cast<int>(at & 0xFFFFFFFF);
      mg.index_hi = static_cast<int>(at >> 32);
      mg.pad = 0.0f;
      merge[r] = mg;
      StoreRowStats(p, plan, ws, st, direct, r0 + r, m * kLn2, sum);  // natural log units
    }
    __syncthreads();
    constexpr int kQuads = D / 4;
    for (int idx = tid; idx < live_rows * kQuads; idx += kThreads) {
      const int r = idx / kQuads;
      const int d = 4 * (idx - r * kQuads);
      const TcRowMerge mg = merge[r];
      float4 acc = make_float4(mg.add, mg.add, mg.add, mg.add);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float4 v = LoadFloat4(wout + w * lay.out_warp + r * kOutStride + d);
        acc.x = fmaf(mg.coef[w], v.x, acc.x);
        acc.y = fmaf(mg.coef[w], v.y, acc.y);
        acc.z = fmaf(mg.coef[w], v.z, acc.z);
        acc.w = fmaf(mg.coef[w], v.w, acc.w);
      }
      const int64_t at = ((int64_t{mg.index_hi} << 32) |
                          static_cast<int64_t>(static_cast<uint32_t>(mg.index_lo))) +
                         d;
      if (direct) {
        StoreFromFloat(p.out_dtype, p.out, at + 0, acc.x);
        StoreFromFloat(p.out_dtype, p.out, at + 1, acc.y);
        StoreFromFloat(p.out_dtype, p.out, at + 2, acc.z);
        StoreFromFloat(p.out_dtype, p.out, at + 3, acc.w);
      } else {
        *reinterpret_cast<float4*>(ws.partial_out + at) = acc;
      }
    }
    __syncthreads();  // the next pass reuses stat / row / out
    if (r0 + kPassRows < st.rows) start_pass();
  }
}

// Launches TcPartitionKernel<T, D, kNT, kBS> with the shared memory it lays
// out.
template <DType T, int D, int kNT, int kBS>
int LaunchTcPartitionKernelShape(const DecodeParams& p, const DecodePlan& plan,
                                 const DecodeWorkspace& ws, cudaStream_t stream) {
  static std::atomic<size_t> configured[kMaxSmemDevices];
  const size_t smem_bytes =
      sizeof(float) *
      static_cast<size_t>(MakeTcSmemLayout(p.geo, plan.partition_size, 8 * kNT).total);
  return LaunchPartitionGrid(&TcPartitionKernel<T, D, kNT, kBS>, configured, p, plan, ws,
                             smem_bytes, stream);
}

template <DType T, int D, int kNT>
int LaunchTcPartitionKernelRows(const DecodeParams& p, const DecodePlan& plan,
                                const DecodeWorkspace& ws, cudaStream_t stream) {
  switch (p.geo.block_size) {
#define KVPAGE_TC_BLOCK_SIZE_CASE(BS) \
  case BS:                            \
    return LaunchTcPartitionKernelShape<T, D, kNT, BS>(p, plan, ws, stream);
    KVPAGE_MANIFEST_TC_BLOCK_SIZES(KVPAGE_TC_BLOCK_SIZE_CASE)
#undef KVPAGE_TC_BLOCK_SIZE_CASE
    default:
      return cudaErrorInvalidValue;  // not in the manifest: the plan never picks it
  }
}

// The tensor-core partition launcher for (T, D), same signature as
// LaunchPartitionKernel (the shared memory argument is recomputed: the two
// kernels lay it out differently).
template <DType T, int D>
int LaunchTcPartitionKernel(const DecodeParams& p, const DecodePlan& plan,
                            const DecodeWorkspace& ws, size_t /*smem_bytes*/, cudaStream_t stream) {
  if constexpr (!TcSupports(T, D)) {
    return cudaErrorInvalidValue;
  } else {
    const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
    if (TcColumnTiles(rows) == 1) return LaunchTcPartitionKernelRows<T, D, 1>(p, plan, ws, stream);
    return LaunchTcPartitionKernelRows<T, D, 2>(p, plan, ws, stream);
  }
}

#define KVPAGE_TC_DECODE_INSTANTIATE(T, D)                                           \
  template int LaunchTcPartitionKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                             const DecodeWorkspace&, size_t, cudaStream_t);
#define KVPAGE_TC_DECODE_DECLARE_EXTERN(T, D)                                               \
  extern template int LaunchTcPartitionKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                                    const DecodeWorkspace&, size_t, cudaStream_t);

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_DECODE_CUH_
