// SPDX-License-Identifier: Apache-2.0
// What the two tensor-core partition kernels of the decode share: the
// register path (tc_register_decode.cuh) and the cp.async ring
// (tc_ring_decode.cuh) differ only in how a step's K and V codes and scale
// entries reach a warp. Each kernel is
//   prologue   TcPrologue: shared-memory layout, the thread's fragment
//              coordinates, the partition's block ids, its lane's K and V
//              addresses, the logit rules (logit_variants.cuh);
//   mainloop   per pass of 8 * kNT query rows, a TcPass (Q^T operands,
//              the rows' factors and masks, O^T and the online softmax)
//              driven over the warp's steps by the kernel's mainloop
//              struct, which supplies the codes and scales of each step
//              (KChunk, VPair, Scales) and issues their loads
//              (TcPrologue::LoadStep hands each copy to the mainloop);
//   epilogue   TcMergeRows: the four warps' rows merged through shared
//              memory, normalized, written as partials or as the output.
//
// Layout. Block (p, h, s), 4 warps, K dtype T = V dtype. A pass covers 8 or
// 16 query rows (kNT = 1 or 2 column tiles of 8); more rows take more passes.
// Warp w takes steps of F::kStepTokens tokens (16-bit 16, 8-bit 32, INT4 64)
// at w, w + 4, ... of the partition, with a private online softmax; the
// four warps merge through shared memory at the end of the pass.
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
// Scales. K: applied to the FP32 accumulator per token (INT4: + min *
// sum(q)). V: folded into P (P' = p * vscale * 2^ev, 2^ev chosen from the
// largest V scale so that P' stays within FP16's normal range); INT4's min
// term sum(p * vmin) is kept per row in FP32. The softmax runs in log2
// units (one FFMA + EX2 a probability).
// Codes exact. Feeding INT8/INT4 codes to the mma with the magic number's
// bias still on (skipping one FP16 op a pair; the bias removed from the
// products) was measured 2% faster and lost the FP32 accumulator's
// precision: P.V by 2e-2 over long partitions, Q.K^T by 0.02 in a logit
// (docs/archive.md, "Exact codes in the mma"). INT4 codes enter as FP16
// subnormals instead (no bias at all, one LOP3 a pair): their units
// (2^-24, and 2^-20 for the high nibbles) ride on q and P' and leave with
// the logit factor and the output's normalization.
//
// These kernels sit near their register budgets, where a few lines of
// shared code cost percents (docs/DESIGN.md, "Changing a kernel"): every
// piece here is force-inlined and keeps the order of the code it
// compiles to, so that the kernels' PTX does not change with the
// structure.
#ifndef KVPAGE_KERNELS_TC_PARTITION_COMMON_CUH_
#define KVPAGE_KERNELS_TC_PARTITION_COMMON_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/logit_variants.cuh"
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

// The compile-time shape of one tensor-core kernel: K = V dtype T, head
// size D, kNT column tiles of 8 rows a pass, block size kBS.
template <DType T, int D, int kNT_, int kBS_>
struct TcShape : TcFormat<T> {
  using F = TcFormat<T>;
  static constexpr DType kT = T;
  static constexpr int kD = D;
  static constexpr int kNT = kNT_;
  static constexpr int kBS = kBS_;
  static constexpr int kLaneChunks = D / F::kX / 4;  // K chunks per lane per token
  static constexpr int kChunkSteps = F::kX / 4;      // mma k-steps per K chunk
  static constexpr int kKSteps = D / 16;
  static constexpr int kMTiles = D / 16;
  static constexpr int kPassRows = 8 * kNT;
  static constexpr int kParts = F::kSplit ? 2 : 1;
  static constexpr int kStep = F::kStepTokens;
  static constexpr bool kInt4 = T == DType::kINT4;
  static constexpr int kOutStride = D + 4;
  static constexpr bool kMaskV = T != DType::kINT8 && T != DType::kINT4;  // codes that can be NaN
  // The codes' units in the mma operands (CodePairUnit; INT4: subnormals).
  // K: q's channels in the hi registers take kHiRatio, so that every
  // product is q * code * kLoUnit, removed in the logit factor. V: P' of the
  // hi registers' tokens takes kHiRatio, and O is kLoUnit times its value
  // until it leaves the registers.
  static constexpr float kLoUnit = CodePairUnit<T>(false);
  static constexpr float kHiRatio = CodePairUnit<T>(false) / CodePairUnit<T>(true);
  static constexpr int kLbs = kBS == 8 ? 3 : kBS == 16 ? 4 : 5;  // log2(kBS)
  static constexpr int kChunk4 = 4 * kBS * 16;      // bytes between a lane's K chunks of a token
  static constexpr int kVRow = kBS * F::kBits / 8;  // bytes of a V channel row in a block
  static constexpr int kVRow8 = 8 * kVRow;          // between the V rows of hh and i neighbours
  static_assert(kBS == 8 || kBS == 16 || kBS == 32, "block sizes 8, 16, 32");
  static_assert(kLaneChunks * kChunkSteps == kKSteps, "four lanes per K row");
  static_assert(D % 8 == 0 && F::kX % 8 == 0, "q is loaded eight channels at a time");
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

// Zeroes the 16-bit halves of `x` whose tokens are past the sequence end:
// their codes are stale bytes, possibly NaN patterns, and 0 * NaN must not
// reach the accumulators.
__device__ __forceinline__ uint32_t KeepHalves(uint32_t x, bool lo, bool hi) {
  return x & ((lo ? 0x0000FFFFu : 0u) | (hi ? 0xFFFF0000u : 0u));
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

// A token's scales as a step uses them: K's {scale, min}, V's scale times
// the V factor (P' = p * vs) and V's min.
struct TcTokenScales {
  float ks, km, vs, vm;
};

// ---- Prologue -------------------------------------------------------------------------------

// The block's state after BeginPartition: its shared memory, the thread's
// place in the mma fragments, the partition's block ids, this lane's K and
// V addresses and the partition's logit rules.
template <class S>
struct TcPrologue {
  TcSmemLayout lay;
  float* smem;
  int tid, lane, warp, grp, tig;
  int qlen;
  int* blk_s;
  const uint8_t* k_head;  // the KV head's K (V) in block 0
  const uint8_t* v_head;
  int64_t k_block_stride, v_block_stride;
  LogitRules rules;
  int k_lane;  // a lane's K tokens in a step: s0 + k_lane + StepToken<T>(j, 8 hh)
  const uint8_t* k_lane_head;
  const uint8_t* v_lane_head;

  // Lays out shared memory and finds the thread's place.
  __device__ __forceinline__ void Layout(const DecodeParams& p, const PartitionState& st) {
    lay = MakeTcSmemLayout(p.geo, st.P, S::kPassRows);
    smem = SharedWords();
    tid = threadIdx.x;
    lane = tid % 32;
    warp = tid / 32;
    grp = lane / 4;
    tig = lane % 4;
    qlen = p.query_len;
  }

  // Stages the block ids (StageBlockIds, with its `writes_output`;
  // `early_blk_s`: BeginPartition's) and this lane's addresses and the
  // logit rules; false: the caller exits.
  __device__ __forceinline__ bool StageIds(const DecodeParams& p, const DecodePlan& plan,
                                           const DecodeWorkspace& ws, const PartitionState& st,
                                           bool writes_output, const int* early_blk_s) {
    const CacheGeometry& g = p.geo;
    blk_s = reinterpret_cast<int*>(smem + lay.blk);
    if (!StageBlockIds(p, plan, ws, st, blk_s, writes_output, early_blk_s != nullptr)) {
      return false;
    }
    k_head = p.layer + g.k_data_offset() + int64_t{st.kvh} * g.k_head_stride();
    v_head = p.layer + g.v_data_offset() + int64_t{st.kvh} * g.v_head_stride();
    k_block_stride = g.k_block_stride();
    v_block_stride = g.v_block_stride();
    rules = MakeLogitRules(p, st, qlen);
    k_lane = S::kSpan * (grp >> 1) + (S::kInt4 ? 4 : 1) * (grp & 1);
    k_lane_head = k_head + (k_lane % 8) * 16 + tig * (S::kBS * 16);
    v_lane_head = v_head + grp * S::kVRow;
    return true;
  }

  // A step's loads from s0 (nothing at or past the partition's end): the
  // mainloop `ml` takes every copy (ml.K, ml.V, ml.VHalves; ml.Records,
  // the step's scale entries, first) and decides where it goes. (A copy's
  // address is a base and an offset: a load guarded by `in` adds them
  // under its guard.)
  template <class Mainloop>
  __device__ __forceinline__ void LoadStep(const PartitionState& st, Mainloop& ml, const int s0,
                                           const int stage, const bool with_k,
                                           const bool with_v) const {
    if (s0 >= st.n_valid) return;
    ml.Records(st, *this, s0, stage);
    if (s0 + S::kStep <= st.n_valid) {
      if (with_k) LoadK<true>(st, ml, s0, stage);
      if (with_v) LoadV<true>(st, ml, s0, stage);
    } else {
      if (with_k) LoadK<false>(st, ml, s0, stage);
      if (with_v) LoadV<false>(st, ml, s0, stage);
    }
  }

  // K: the rows of S^T rows grp, grp + 8 of every tile. kFull: the step
  // ends before the sequence does (no guards).
  template <bool kFull, class Mainloop>
  __device__ __forceinline__ void LoadK(const PartitionState& st, Mainloop& ml, const int s0,
                                        const int stage) const {
    const uint8_t* kb[S::kKHalves];
#pragma unroll
    for (int h = 0; h < S::kKHalves; ++h) {
      const int t8 = s0 + ((k_lane + 8 * h) & ~7);  // the sub-span's first token
      const int b = kFull || t8 < st.n_valid ? blk_s[t8 >> S::kLbs] : 0;
      kb[h] = k_lane_head + int64_t{b} * k_block_stride + (t8 & (S::kBS - 1)) * 16;
    }
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int off = StepToken<S::kT>(j, 8 * hh);  // compile-time after unrolling
        const int h = off / 8;
        const uint8_t* kp = kb[h] + (off % 8) * 16;
        const bool in = kFull || s0 + k_lane + off < st.n_valid;
#pragma unroll
        for (int c = 0; c < S::kLaneChunks; ++c) ml.K(stage, j, hh, c, kp, c * S::kChunk4, in);
      }
    }
  }

  // V: the lane's span of every channel row it holds.
  template <bool kFull, class Mainloop>
  __device__ __forceinline__ void LoadV(const PartitionState& st, Mainloop& ml, const int s0,
                                        const int stage) const {
    const int span_tok = s0 + S::kSpan * tig;
    const bool in = kFull || span_tok < st.n_valid;
    const int b = in ? blk_s[span_tok >> S::kLbs] : 0;
    const uint8_t* vb =
        v_lane_head + int64_t{b} * v_block_stride + (span_tok & (S::kBS - 1)) * S::kBits / 8;
    if constexpr (!S::kInt4 || S::kBS > 8) {
#pragma unroll
      for (int i = 0; i < S::kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) ml.V(stage, i, hh, vb + (2 * i + hh) * S::kVRow8, in);
      }
    } else {
      // An INT4 span of 16 tokens over two blocks of 8: two 4-byte rows.
      const bool in2 = kFull || span_tok + 8 < st.n_valid;
      const int b2 = in2 ? blk_s[(span_tok >> S::kLbs) + 1] : 0;
      const uint8_t* vb2 = v_lane_head + int64_t{b2} * v_block_stride;
#pragma unroll
      for (int i = 0; i < S::kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int off = (2 * i + hh) * S::kVRow8;
          ml.VHalves(stage, i, hh, vb, vb2, off, in, in2);
        }
      }
    }
  }
};

// ---- Mainloop: one pass of the warp over its steps --------------------------------------------

// A warp's pass over 8 * kNT query rows from r0: the Q^T operands, the
// factors and masks of the rows of this lane's accumulators, O^T and the
// online softmax (row maximum, sum, INT4's sum(p * vmin)), and the math of
// one step, fed by the mainloop struct `ml` (ml.KChunk, ml.VPair,
// ml.Scales) and compiled for a logit variant V (logit_variants.cuh).
template <class S>
struct TcPass {
  static constexpr bool kBf16 = S::kBf16;
  uint32_t qb[S::kNT][S::kKSteps][2][S::kParts];
  // The rows of this lane's accumulators: 8 nt + 2 tig + e. Logits y are in
  // log2 units: y = rfac * (kscale * s + kmin * sum(q)).
  float rfac[S::kNT][2], rsum[S::kNT][2];
  RowMask mask[S::kNT][2];
  // The online softmax: sum(p * vmin) (INT4), sum(p), the row maximum.
  // (In this order, before o: a field's place sets the order of the step
  // loop's phis; docs/DESIGN.md, "Changing a kernel".)
  float pmrun[S::kNT][2], lrun[S::kNT][2], mrun[S::kNT][2];
  float o[S::kMTiles][S::kNT][4];

  __device__ __forceinline__ void Begin(const DecodeParams& p, const PartitionState& st,
                                        const TcPrologue<S>& pro, const int r0) {
    // ---- Q^T operands: lane (grp, tig) holds row r0 + 8 nt + grp at the
    // channels of its K chunks, times lambda, times 2^qe (per row).
    float own_fac[S::kNT], own_sum[S::kNT];
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
      const int row = r0 + 8 * nt + pro.grp;
      const bool live = row < st.rows;
      const int gi = row / pro.qlen;
      const int i = row - gi * pro.qlen;
      const int64_t qbase =
          (int64_t{st.seq} * pro.qlen + i) * p.q_stride + int64_t{st.kvh * st.group + gi} * S::kD;
      float x[S::kKSteps][4];
      float amax = 0.0f;
#pragma unroll
      for (int c = 0; c < S::kLaneChunks; ++c) {
        const int ch0 = (4 * c + pro.tig) * S::kX;  // the lane's chunk: kX channels
#pragma unroll
        for (int e8 = 0; e8 < S::kX; e8 += 8) {
          // (lam declared before v: the order in which they become registers
          // numbers v's phis, and ptxas allocates by that order.)
          float lam[8], v[8];
          if (live) {
            LoadAsFloat8(p.q_dtype, p.q, qbase + ch0 + e8, v);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
          }
          if (p.key_smoothing != nullptr) {
            LoadAsFloat8(DType::kFP32, p.key_smoothing, int64_t{st.kvh} * S::kD + ch0 + e8, lam);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] *= lam[e];
          }
          // Channel ch0 + e8 + e is slot `slot` of k-step k where
          // PairElement<T>(k, slot) == e8 + e.
#pragma unroll
          for (int k = 0; k < S::kChunkSteps; ++k) {
#pragma unroll
            for (int slot = 0; slot < 4; ++slot) {
              const int el = PairElement<S::kT>(k, slot);
              if (el >= e8 && el < e8 + 8) {
                x[c * S::kChunkSteps + k][slot] = v[el - e8];
                amax = fmaxf(amax, fabsf(v[el - e8]));
              }
            }
          }
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
      const float up = QOperandScale(amax);
      float qsum = 0.0f;  // sum(q) as rounded (INT4's min term)
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float u = h == 1 ? S::kHiRatio : 1.0f;  // the codes' unit
          const float a = x[ks][2 * h] * up * u;
          const float b = x[ks][2 * h + 1] * up * u;
          const uint32_t hi = PackPair<kBf16>(a, b);
          const float2 hv = UnpackPair<kBf16>(hi);
          qb[nt][ks][h][0] = hi;
          qsum += (hv.x + hv.y) / u;
          if constexpr (S::kParts == 2) {
            const uint32_t lo = PackPair<kBf16>(a - hv.x, b - hv.y);
            const float2 lv = UnpackPair<kBf16>(lo);
            qb[nt][ks][h][S::kParts - 1] = lo;
            qsum += lv.x + lv.y;
          }
        }
      }
      qsum += __shfl_xor_sync(kFullMask, qsum, 1);
      qsum += __shfl_xor_sync(kFullMask, qsum, 2);
      // S^T comes in kLoUnit units: so do the min term's sum(q).
      own_fac[nt] = pro.rules.q_scale / up * kLog2e / S::kLoUnit;
      own_sum[nt] = qsum * S::kLoUnit;
    }

    // ---- The rows of this lane's accumulators, from the lanes that loaded
    // their q (4 (2 tig + e)), and their masks.
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int src = 4 * (2 * pro.tig + e);
        rfac[nt][e] = __shfl_sync(kFullMask, own_fac[nt], src);
        rsum[nt][e] = __shfl_sync(kFullMask, own_sum[nt], src);
        mask[nt][e] = MakeRowMask(p, st, pro.rules, pro.qlen, r0 + 8 * nt + 2 * pro.tig, e);
      }
    }

#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < S::kMTiles; ++i) {
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
  }

  // ---- S^T = K Q^T, the step's codes from ml.KChunk(stage, j, hh, c).
  // The hi and lo products of a 16-bit cache accumulate apart: two
  // independent mma chains instead of one twice as long.
  template <class Mainloop>
  __device__ __forceinline__ void Scores(const Mainloop& ml, const int stage,
                                         float (&s)[S::kTiles][S::kNT][4]) const {
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) {
      float sp[S::kParts][S::kNT][4];
#pragma unroll
      for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
#pragma unroll
          for (int part = 0; part < S::kParts; ++part) sp[part][nt][c] = 0.0f;
        }
      }
#pragma unroll
      for (int c = 0; c < S::kLaneChunks; ++c) {
        const uint4 k0 = ml.KChunk(stage, j, 0, c);
        const uint4 k1 = ml.KChunk(stage, j, 1, c);
        const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w};
        const uint32_t w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
        for (int k = 0; k < S::kChunkSteps; ++k) {
          uint32_t a[4];
          CodePairs<S::kT>(w0, k, a[0], a[2]);
          CodePairs<S::kT>(w1, k, a[1], a[3]);
          const int ks = c * S::kChunkSteps + k;
#pragma unroll
          for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
            for (int part = 0; part < S::kParts; ++part) {
              MmaM16N8K16<kBf16>(sp[part][nt], a, qb[nt][ks][0][part], qb[nt][ks][1][part]);
            }
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[j][nt][c] = sp[0][nt][c];
          if constexpr (S::kParts == 2) s[j][nt][c] += sp[S::kParts - 1][nt][c];
        }
      }
    }
  }

  // ---- Logits (log2 units): K scale, then the variant's rules (soft-cap,
  // ALiBi, masks); the step's row maxima. The token scales
  // (ml.Scales(stage, s0, tt, hh, in)) serve the P stage too.
  template <class V, class Mainloop>
  __device__ __forceinline__ void Logits(const Mainloop& ml, const PartitionState& st,
                                         const TcPrologue<S>& pro, const int s0, const int stage,
                                         float (&s)[S::kTiles][S::kNT][4],
                                         float (&vs)[S::kTiles][2], float (&vm)[S::kTiles][2],
                                         float (&mstep)[S::kNT][2]) const {
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) mstep[nt][0] = mstep[nt][1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int tt = s0 + pro.k_lane + StepToken<S::kT>(j, 8 * hh);
        const bool in = !V::kMasked || tt < st.n_valid;
        const TcTokenScales sc = ml.Scales(stage, s0, tt, hh, in);
        vs[j][hh] = sc.vs;
        vm[j][hh] = sc.vm;
        const int t = st.start + tt;
#pragma unroll
        for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float sx = s[j][nt][2 * hh + e];
            const float y = S::kInt4 ? fmaf(sc.ks, sx, sc.km * rsum[nt][e]) : sc.ks * sx;
            float yy = y;
            if constexpr (V::kMasked) {
              yy = CapAndAlibiLog2(yy * rfac[nt][e], pro.rules, mask[nt][e], t);
              const bool visible = in && t >= mask[nt][e].lo && t <= mask[nt][e].pos;
              yy = visible ? yy : -INFINITY;
            }
            s[j][nt][2 * hh + e] = yy;
            mstep[nt][e] = fmaxf(mstep[nt][e], s[j][nt][2 * hh + e]);
          }
        }
      }
    }
  }

  // ---- Online softmax: rescale what the warp has so far, only when some
  // row's maximum grew (rare after the first steps). A vote on the lanes'
  // own maxima ahead of these shuffles, as for the ring's V scales,
  // measured slower for short partitions: on random logits some row of
  // eight grows at most of their steps, which then pay for the vote too
  // (docs/archive.md, "Tensor-core decode: register path").
  template <class V>
  __device__ __forceinline__ void Rescale(float (&mstep)[S::kNT][2]) {
    bool grew = false;
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float m = mstep[nt][e];
        m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 4));
        m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 8));
        m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 16));
        mstep[nt][e] = fmaxf(mrun[nt][e], V::RowMax(m, rfac[nt][e]));
        grew |= mstep[nt][e] > mrun[nt][e];
      }
    }
    if (__any_sync(kFullMask, grew)) {
#pragma unroll
      for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float mnew = mstep[nt][e];
          const float alpha = mnew > mrun[nt][e] ? Exp2(mrun[nt][e] - mnew) : 1.0f;
          mrun[nt][e] = mnew;
          lrun[nt][e] *= alpha;
          pmrun[nt][e] *= alpha;  // also where it stays 0: guarding it made ptxas spill 300 B
#pragma unroll
          for (int i = 0; i < S::kMTiles; ++i) {
            o[i][nt][e] *= alpha;
            o[i][nt][e + 2] *= alpha;
          }
        }
      }
    }
  }

  // ---- P' = p * vscale * vfac as B operands (P^T), via movmatrix.
  template <class V>
  __device__ __forceinline__ void POperands(const float (&s)[S::kTiles][S::kNT][4],
                                            const float (&vs)[S::kTiles][2],
                                            const float (&vm)[S::kTiles][2],
                                            uint32_t (&pb)[S::kTiles][S::kNT][2][S::kParts]) {
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) {
#pragma unroll
      for (int nt = 0; nt < S::kNT; ++nt) {
        float pv[2][2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = V::Prob(s[j][nt][2 * hh + e], rfac[nt][e], mrun[nt][e]);
            lrun[nt][e] += pr;
            if constexpr (S::kInt4) pmrun[nt][e] = fmaf(pr, vm[j][hh], pmrun[nt][e]);
            pv[hh][e] = pr * vs[j][hh];
          }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t hi = PackPair<kBf16>(pv[hh][0], pv[hh][1]);
          pb[j][nt][hh][0] = TransposeM8N8(hi);
          if constexpr (S::kParts == 2) {
            const float2 hv = UnpackPair<kBf16>(hi);
            pb[j][nt][hh][S::kParts - 1] =
                TransposeM8N8(PackPair<kBf16>(pv[hh][0] - hv.x, pv[hh][1] - hv.y));
          }
        }
      }
    }
  }

  // ---- O^T += V^T P^T, the step's codes from ml.VPair(stage, i, hh).
  // Exact codes here, not biased ones: the bias would ride on every
  // product (1024 * sum(P') against outputs that can be 100x smaller than
  // the codes' mean over long contexts) and cost the FP32 accumulator the
  // precision the output needs. `span_tok`: the first token of the lane's
  // V span (masked steps zero the codes past the sequence end).
  template <class V, class Mainloop>
  __device__ __forceinline__ void AccumulateV(const Mainloop& ml, const int stage,
                                              const uint32_t (&pb)[S::kTiles][S::kNT][2][S::kParts],
                                              const int span_tok, const int n_valid) {
#pragma unroll
    for (int i = 0; i < S::kMTiles; ++i) {
      const uint2 v0 = ml.VPair(stage, i, 0);
      const uint2 v1 = ml.VPair(stage, i, 1);
      const uint32_t w0[2] = {v0.x, v0.y};
      const uint32_t w1[2] = {v1.x, v1.y};
#pragma unroll
      for (int j = 0; j < S::kTiles; ++j) {
        uint32_t a[4];
        CodePairs<S::kT>(w0, j, a[0], a[2]);
        CodePairs<S::kT>(w1, j, a[1], a[3]);
        if constexpr (S::kMaskV && V::kMasked) {
          bool keep[4];
#pragma unroll
          for (int slot = 0; slot < 4; ++slot) {
            keep[slot] = span_tok + PairElement<S::kT>(j, slot) < n_valid;
          }
          a[0] = KeepHalves(a[0], keep[0], keep[1]);
          a[1] = KeepHalves(a[1], keep[0], keep[1]);
          a[2] = KeepHalves(a[2], keep[2], keep[3]);
          a[3] = KeepHalves(a[3], keep[2], keep[3]);
        }
#pragma unroll
        for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
          for (int part = 0; part < S::kParts; ++part) {
            MmaM16N8K16<kBf16>(o[i][nt], a, pb[j][nt][0][part], pb[j][nt][1][part]);
          }
        }
      }
    }
  }
};

// ---- Epilogue -------------------------------------------------------------------------------

// Merges the four warps' rows of the pass from r0 and writes them: each
// warp's row maximum, sum and O (times 2^-o_exp with kWarpExp: a warp's own
// V factor) into shared memory; one thread a row computes the merge
// coefficients (inv_vfac: the block's V factor and the codes' unit, to
// remove) and the row's stats; then every thread writes quads of channels.
// kWritesOutput: the kernel writes out and lse itself where
// PartitionWritesOutput says so; compiled into the 168-register kernels,
// the direct stores cost them 2-3% on multi-wave grids (docs/archive.md,
// "Direct output"), so only the ring kernel has them.
template <class S, bool kWritesOutput, bool kWarpExp>
__device__ __forceinline__ void TcMergeRows(const DecodeParams& p, const DecodePlan& plan,
                                            const DecodeWorkspace& ws, const PartitionState& st,
                                            const TcPrologue<S>& pro, const TcPass<S>& pass,
                                            const int r0, const float inv_vfac, const int o_exp) {
  constexpr int kPassRows = S::kPassRows;
  constexpr int kOutStride = S::kOutStride;
  const TcSmemLayout& lay = pro.lay;
  float* stat = pro.smem + lay.stat;
  float* wout = pro.smem + lay.out;
#pragma unroll
  for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = pass.lrun[nt][e], pm = pass.pmrun[nt][e];
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        l += __shfl_xor_sync(kFullMask, l, off);
        if constexpr (S::kInt4) pm += __shfl_xor_sync(kFullMask, pm, off);
      }
      const int r = 8 * nt + 2 * pro.tig + e;
      if (pro.grp == 0) {
        stat[(0 * kWarps + pro.warp) * kPassRows + r] = pass.mrun[nt][e];
        stat[(1 * kWarps + pro.warp) * kPassRows + r] = l;
        stat[(2 * kWarps + pro.warp) * kPassRows + r] = pm;
      }
#pragma unroll
      for (int i = 0; i < S::kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          wout[pro.warp * lay.out_warp + r * kOutStride + 16 * i + pro.grp + 8 * hh] =
              kWarpExp ? pass.o[i][nt][2 * hh + e] * ldexpf(1.0f, -o_exp)
                       : pass.o[i][nt][2 * hh + e];
        }
      }
    }
  }
  __syncthreads();
  const int live_rows = min(kPassRows, st.rows - r0);
  const bool direct = kWritesOutput && PartitionWritesOutput(plan, st);
  auto* merge = reinterpret_cast<TcRowMerge*>(pro.smem + lay.row);
  if (pro.tid < live_rows) {
    const int r = pro.tid;
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
  constexpr int kQuads = S::kD / 4;
  for (int idx = pro.tid; idx < live_rows * kQuads; idx += kThreads) {
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
    const int64_t at =
        ((int64_t{mg.index_hi} << 32) | static_cast<int64_t>(static_cast<uint32_t>(mg.index_lo))) +
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
}

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_PARTITION_COMMON_CUH_
