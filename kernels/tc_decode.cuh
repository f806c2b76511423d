// Tensor-core partition kernel of the decode: the path for GQA groups (and
// multi-token queries) whose rows outrun the CUDA cores of the thread-group
// kernel (paged_decode.cuh). Same grid, same split-K partials, same reduce
// kernel, same graph-stable launch; Q.K^T and P.V run on mma.sync m16n8k16
// with FP32 accumulation, K and V codes go from 16- and 8-byte loads through
// the conversions of common/dequant.cuh straight into the operand registers
// (no shared memory for cache data; a per-warp cp.async ring was tried and
// measured slower, docs/PERF_NOTES.md).
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
// sum(q)). V: folded into P (P' = p * vscale * 2^ev, 2^ev chosen per
// partition from the largest V scale so that P' stays within FP16's normal
// range); INT4's min term sum(p * vmin) is kept per row in FP32.
// Precision. Codes are exact in FP16 (BF16 for a BF16 cache). q * lambda is
// scaled by a per-row power of two into [2^14, 2^15) and rounded to the mma
// type (exact for FP16/BF16 queries without key smoothing); 16-bit caches
// add a second mma on the rounding remainder of q and of P (hi + lo), so
// their result is as precise as the FP32 kernel's; quantized caches round q
// and P once (2^-11 relative, far below the quantization error).
#ifndef KVPAGE_KERNELS_TC_DECODE_CUH_
#define KVPAGE_KERNELS_TC_DECODE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/paged_decode.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

template <DType T>
struct TcFormat {
  static constexpr int kBits = DTypeBits(T);
  static constexpr int kX = 128 / kBits;            // channels per 16-byte K chunk
  static constexpr int kSpan = 64 / kBits;          // tokens of a V channel row in 8 bytes
  static constexpr int kStepTokens = 4 * kSpan;     // tokens a warp takes per step
  static constexpr int kTiles = kStepTokens / 16;   // 16-token mma k-steps per step
  static constexpr bool kBf16 = T == DType::kBF16;  // mma input type; FP16 otherwise
  static constexpr bool kSplit = !IsQuantized(T);   // 16-bit caches: hi + lo operands
};

// The head sizes with tensor-core kernels (the K dtypes are the
// decode_tc_<dtype>.cu translation units).
#define KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(X, T) X(T, 64) X(T, 128) X(T, 256)

// Whether a tensor-core kernel can exist for (dtype, head size): four lanes
// share a token's K row, one 16-byte chunk each, so the chunks must come in
// fours. (Which head sizes are built: the list above.)
KVP_HOST_DEVICE constexpr bool TcSupports(DType t, int head_size) {
  return head_size % (4 * (128 / DTypeBits(t))) == 0;
}

// Column tiles of 8 query rows per pass for `rows` rows per KV head: one up
// to 8 rows, two (16 rows per pass) beyond.
KVP_HOST_DEVICE constexpr int TcColumnTiles(int rows) { return rows <= 8 ? 1 : 2; }

constexpr int kTcMinBlocksPerSm = 2;

// Shared memory of the tensor-core kernel, in 4-byte words.
struct TcSmemLayout {
  int blk, kscale, kmin, vscale, vmin;
  int stat;  // [3][kWarps][pass_rows]: each warp's row max, sum(p), sum(p *
             // vmin)
  int out;   // [kWarps][pass_rows][head_size]: each warp's unnormalized O
  int total;
};

KVP_HOST_DEVICE constexpr TcSmemLayout MakeTcSmemLayout(const CacheGeometry &g, int partition_size,
                                                        int pass_rows) {
  TcSmemLayout s{};
  int o = 0;
  s.blk = o;
  o += AlignWords(partition_size / g.block_size);
  s.kscale = o;
  o += partition_size;
  s.kmin = o;
  o += partition_size;
  s.vscale = o;
  o += partition_size;
  s.vmin = o;
  o += partition_size;
  s.stat = o;
  o += AlignWords(3 * kWarps * pass_rows);
  s.out = o;
  o += kWarps * pass_rows * g.head_size;
  s.total = o;
  return s;
}

// Token (within a warp's step) of row m of S^T tile j, which is also k
// position m of the P.V step j: rows 2t, 2t + 1, 2t + 8, 2t + 9 belong to
// V span t (lane t's), in the order CodePairs takes that span's codes.
template <DType T>
__device__ __forceinline__ int StepToken(int j, int m) {
  return TcFormat<T>::kSpan * ((m & 7) >> 1) + PairElement<T>(j, 2 * (m >> 3) + (m & 1));
}

// The 8 bytes of V channel `ch` holding the span of tokens tok .. tok +
// kSpan - 1 of the partition (tok a multiple of kSpan); zero where the span
// starts past the sequence end. An INT4 span is 16 tokens: with block size 8
// it covers two blocks, read as two 4-byte halves.
template <DType T>
__device__ __forceinline__ uint2 LoadVSpan(const uint8_t *v_head, int64_t block_stride,
                                           const int *blk_s, int bs, int ch, int tok, int n_valid) {
  constexpr int kBits = DTypeBits(T);
  if (tok >= n_valid) return make_uint2(0u, 0u);
  const int b = tok / bs;
  const int off = tok - b * bs;
  const int64_t row = int64_t{ch} * bs;  // the channel row's first token, in codes
  if (TcFormat<T>::kSpan <= 8 || TcFormat<T>::kSpan <= bs) {
    return __ldg(reinterpret_cast<const uint2 *>(v_head + blk_s[b] * block_stride +
                                                 (row + off) * kBits / 8));
  }
  const auto half = [&](int blk) {
    return __ldg(
        reinterpret_cast<const unsigned int *>(v_head + blk * block_stride + row * kBits / 8));
  };
  return make_uint2(half(blk_s[b]), tok + bs < n_valid ? half(blk_s[b + 1]) : 0u);
}

// Zeroes the 16-bit halves of `x` whose tokens are past the sequence end:
// their codes are stale bytes, possibly NaN patterns, and 0 * NaN must not
// reach the accumulators.
__device__ __forceinline__ uint32_t KeepHalves(uint32_t x, bool lo, bool hi) {
  return x & ((lo ? 0x0000FFFFu : 0u) | (hi ? 0xFFFF0000u : 0u));
}

template <DType T, int D, int kNT>
__global__ void __launch_bounds__(kThreads, kTcMinBlocksPerSm)
    TcPartitionKernel(const __grid_constant__ DecodeParams p,
                      const __grid_constant__ DecodeShape shape,
                      const __grid_constant__ DecodeWorkspace ws) {
  using F = TcFormat<T>;
  constexpr bool kBf16 = F::kBf16;
  constexpr int kLaneChunks = D / F::kX / 4;  // K chunks per lane per token
  constexpr int kChunkSteps = F::kX / 4;      // mma k-steps per K chunk
  constexpr int kKSteps = D / 16;
  constexpr int kMTiles = D / 16;
  constexpr int kPassRows = 8 * kNT;
  constexpr int kParts = F::kSplit ? 2 : 1;
  static_assert(kLaneChunks * kChunkSteps == kKSteps, "four lanes per K row");
  constexpr bool kMaskV = T != DType::kINT8 && T != DType::kINT4;  // codes that can be NaN

  const CacheGeometry &g = p.geo;
  PartitionState st;
  if (!BeginPartition(p, shape, st)) return;  // past this sequence's end
  const TcSmemLayout lay = MakeTcSmemLayout(g, st.P, kPassRows);
  float *smem = SharedWords();
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int grp = lane / 4;
  const int tig = lane % 4;
  const int bs = g.block_size;
  const int qlen = p.query_len;

  __shared__ unsigned vmax_bits;
  if (tid == 0) vmax_bits = 0u;  // ordered by StageBlockIds' barriers
  int *blk_s = reinterpret_cast<int *>(smem + lay.blk);
  if (!StageBlockIds(p, shape, ws, st, blk_s)) return;
  StageTokenScales(g.k_dtype,
                   p.layer + g.k_scale_offset() + int64_t{st.kvh} * g.k_scale_head_stride(),
                   g.k_scale_block_stride(), g.k_scale_entry_bytes(), st, bs, blk_s,
                   smem + lay.kscale, smem + lay.kmin);
  const float vlargest = StageTokenScales(
      g.v_dtype, p.layer + g.v_scale_offset() + int64_t{st.kvh} * g.v_scale_head_stride(),
      g.v_scale_block_stride(), g.v_scale_entry_bytes(), st, bs, blk_s, smem + lay.vscale,
      smem + lay.vmin);
  atomicMax(&vmax_bits,
            __float_as_uint(vlargest));  // scales are >= 0: bits order as values
  __syncthreads();
  // P' = p * vscale * vfac < 2^14: inside FP16's range, and the tokens that
  // carry weight stay clear of its subnormals.
  float vfac = 1.0f;
  {
    const float vmax = __uint_as_float(vmax_bits);
    if (vmax > 0.0f && isfinite(vmax)) {
      int e = 0;
      frexpf(vmax, &e);  // vmax in [2^(e-1), 2^e)
      vfac = ldexpf(1.0f, min(max(14 - e, -100), 100));
    }
  }
  const float inv_vfac = 1.0f / vfac;  // a power of two: exact

  const float *kscale_s = smem + lay.kscale;
  const float *kmin_s = smem + lay.kmin;
  const float *vscale_s = smem + lay.vscale;
  const float *vmin_s = smem + lay.vmin;
  const uint8_t *k_head = p.layer + g.k_data_offset() + int64_t{st.kvh} * g.k_head_stride();
  const uint8_t *v_head = p.layer + g.v_data_offset() + int64_t{st.kvh} * g.v_head_stride();
  const int64_t k_block_stride = g.k_block_stride();
  const int64_t v_block_stride = g.v_block_stride();
  const int64_t chunk_stride = g.k_chunk_stride();
  // With a soft-cap the scaled logit is divided by cap before tanh.
  const float cap = p.logits_soft_cap;
  const float q_scale = cap > 0.0f ? p.sm_scale / cap : p.sm_scale;
  const bool alibi = p.alibi_slopes != nullptr;

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
#pragma unroll
        for (int k = 0; k < kChunkSteps; ++k) {
#pragma unroll
          for (int slot = 0; slot < 4; ++slot) {
            const int ch = (4 * c + tig) * F::kX + PairElement<T>(k, slot);
            float v = live ? LoadAsFloat(p.q_dtype, p.q, qbase + ch) : 0.0f;
            if (p.key_smoothing != nullptr) v *= p.key_smoothing[int64_t{st.kvh} * D + ch];
            x[c * kChunkSteps + k][slot] = v;
            amax = fmaxf(amax, fabsf(v));
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
      float qsum = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float a = x[ks][2 * h] * up;
          const float b = x[ks][2 * h + 1] * up;
          const uint32_t hi = PackPair<kBf16>(a, b);
          const float2 hv = UnpackPair<kBf16>(hi);
          qb[nt][ks][h][0] = hi;
          qsum += hv.x + hv.y;
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
      own_fac[nt] = q_scale / up;
      own_sum[nt] = qsum;
    }

    // ---- The rows of this lane's accumulators: 8 nt + 2 tig + e.
    float rfac[kNT][2], rsum[kNT][2], rslope[kNT][2];
    int rpos[kNT][2], rlo[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int src = 4 * (2 * tig + e);  // the lane that loaded that row's q
        rfac[nt][e] = __shfl_sync(kFullMask, own_fac[nt], src);
        rsum[nt][e] = __shfl_sync(kFullMask, own_sum[nt], src);
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

#pragma unroll 1
    for (int s0 = warp * F::kStepTokens; s0 < st.n_valid; s0 += kWarps * F::kStepTokens) {
      // ---- Loads: K rows of S^T rows grp, grp + 8 of every tile; V spans.
      uint4 kraw[F::kTiles][2][kLaneChunks];
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tt = s0 + StepToken<T>(j, grp + 8 * hh);
          const uint8_t *kp = k_head;
          const bool in = tt < st.n_valid;
          if (in) {
            const int b = tt / bs;
            kp = k_head + blk_s[b] * k_block_stride + (tt - b * bs) * 16 + tig * chunk_stride;
          }
#pragma unroll
          for (int c = 0; c < kLaneChunks; ++c) {
            kraw[j][hh][c] = in ? Load16(kp + 4 * c * chunk_stride) : Zero16();
          }
        }
      }
      const int span_tok = s0 + F::kSpan * tig;
      uint2 vraw[kMTiles][2];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          vraw[i][hh] = LoadVSpan<T>(v_head, v_block_stride, blk_s, bs, 16 * i + grp + 8 * hh,
                                     span_tok, st.n_valid);
        }
      }

      // ---- S^T = K Q^T.
      // The hi and lo products of a 16-bit cache accumulate apart: two
      // independent mma chains instead of one twice as long.
      float sp[kParts][F::kTiles][kNT][4];
      float s[F::kTiles][kNT][4];
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int part = 0; part < kParts; ++part) sp[part][j][nt][c] = 0.0f;
          }
        }
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const uint4 k0 = kraw[j][0][c];
          const uint4 k1 = kraw[j][1][c];
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
                MmaM16N8K16<kBf16>(sp[part][j][nt], a, qb[nt][ks][0][part], qb[nt][ks][1][part]);
              }
            }
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            s[j][nt][c] = sp[0][j][nt][c];
            if constexpr (kParts == 2) s[j][nt][c] += sp[kParts - 1][j][nt][c];
          }
        }
      }

      // ---- Logits: K scale, soft-cap, ALiBi, masks; the step's row maxima.
      float mstep[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mstep[nt][0] = mstep[nt][1] = -INFINITY;
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tt = s0 + StepToken<T>(j, grp + 8 * hh);
          const bool in = tt < st.n_valid;
          const float ks = in ? kscale_s[tt] : 0.0f;
          const float km = in ? kmin_s[tt] : 0.0f;
          const int t = st.start + tt;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float l = rfac[nt][e] * fmaf(ks, s[j][nt][2 * hh + e], km * rsum[nt][e]);
              if (cap > 0.0f) l = cap * tanhf(l);
              if (alibi) l = fmaf(rslope[nt][e], static_cast<float>(t - rpos[nt][e]), l);
              const bool visible = in && t >= rlo[nt][e] && t <= rpos[nt][e];
              l = visible ? l : -INFINITY;
              s[j][nt][2 * hh + e] = l;
              mstep[nt][e] = fmaxf(mstep[nt][e], l);
            }
          }
        }
      }

      // ---- Online softmax: rescale what the warp has so far.
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float m = mstep[nt][e];
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 4));
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 8));
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 16));
          const float mnew = fmaxf(mrun[nt][e], m);
          const float alpha = mnew == -INFINITY ? 1.0f : __expf(mrun[nt][e] - mnew);
          mrun[nt][e] = mnew;
          lrun[nt][e] *= alpha;
          pmrun[nt][e] *= alpha;
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
            o[i][nt][e] *= alpha;
            o[i][nt][e + 2] *= alpha;
          }
        }
      }

      // ---- P' = p * vscale * vfac as B operands (P^T), via movmatrix.
      uint32_t pb[F::kTiles][kNT][2][kParts];
#pragma unroll
      for (int j = 0; j < F::kTiles; ++j) {
        float vs[2], vm[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tt = s0 + StepToken<T>(j, grp + 8 * hh);
          const bool in = tt < st.n_valid;
          vs[hh] = in ? vscale_s[tt] * vfac : 0.0f;
          vm[hh] = in ? vmin_s[tt] : 0.0f;
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float pv[2][2];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float l = s[j][nt][2 * hh + e];
              const float pr = l == -INFINITY ? 0.0f : __expf(l - mrun[nt][e]);
              lrun[nt][e] += pr;
              pmrun[nt][e] = fmaf(pr, vm[hh], pmrun[nt][e]);
              pv[hh][e] = pr * vs[hh];
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

      // ---- O^T += V^T P^T.
      const bool tail = s0 + F::kStepTokens > st.n_valid;
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint2 v0 = vraw[i][0];
        const uint2 v1 = vraw[i][1];
        const uint32_t w0[2] = {v0.x, v0.y};
        const uint32_t w1[2] = {v1.x, v1.y};
#pragma unroll
        for (int j = 0; j < F::kTiles; ++j) {
          uint32_t a[4];
          CodePairs<T>(w0, j, a[0], a[2]);
          CodePairs<T>(w1, j, a[1], a[3]);
          if (kMaskV && tail) {
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
    }

    // ---- Merge the warps, normalize, write the partials.
    float *stat = smem + lay.stat;
    float *wout = smem + lay.out;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float l = lrun[nt][e], pm = pmrun[nt][e];
#pragma unroll
        for (int off = 4; off < 32; off *= 2) {
          l += __shfl_xor_sync(kFullMask, l, off);
          pm += __shfl_xor_sync(kFullMask, pm, off);
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
            wout[(warp * kPassRows + r) * D + 16 * i + grp + 8 * hh] = o[i][nt][2 * hh + e];
          }
        }
      }
    }
    __syncthreads();
    const int live_rows = min(kPassRows, st.rows - r0);
    for (int idx = tid; idx < live_rows * D; idx += kThreads) {
      const int r = idx / D;
      const int d = idx - r * D;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, stat[w * kPassRows + r]);
      float sum = 0.0f, acc = 0.0f, pm = 0.0f;
      if (m != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float f = __expf(stat[w * kPassRows + r] - m);  // 0 for a warp that saw nothing
          sum = fmaf(f, stat[(kWarps + w) * kPassRows + r], sum);
          pm = fmaf(f, stat[(2 * kWarps + w) * kPassRows + r], pm);
          acc = fmaf(f, wout[(w * kPassRows + r) * D + d], acc);
        }
      }
      const int64_t base = PartialIndex(p, shape, st.seq, st.kvh, st.group, r0 + r, st.part);
      ws.partial_out[base * D + d] = sum > 0.0f ? fmaf(acc, inv_vfac, pm) / sum : 0.0f;
      if (d == 0) {
        ws.partial_max[base] = m;
        ws.partial_sum[base] = sum;
      }
    }
    __syncthreads();  // the next pass reuses stat / out
  }
}

// Launches TcPartitionKernel<T, D, kNT> with the shared memory it lays out.
template <DType T, int D, int kNT>
int LaunchTcPartitionKernelRows(const DecodeParams& p, const DecodeShape& shape,
                                const DecodeWorkspace& ws, cudaStream_t stream) {
  static std::atomic<size_t> configured[kMaxSmemDevices];
  const size_t smem_bytes = sizeof(float) * static_cast<size_t>(
                                MakeTcSmemLayout(p.geo, shape.partition_size, 8 * kNT).total);
  return LaunchPartitionGrid(&TcPartitionKernel<T, D, kNT>, configured, p, shape, ws, smem_bytes,
                             stream);
}

// The tensor-core partition launcher for (T, D), same signature as
// LaunchPartitionKernel (the shared memory argument is recomputed: the two
// kernels lay it out differently).
template <DType T, int D>
int LaunchTcPartitionKernel(const DecodeParams &p, const DecodeShape &shape,
                            const DecodeWorkspace &ws, size_t /*smem_bytes*/, cudaStream_t stream) {
  if constexpr (!TcSupports(T, D)) {
    return cudaErrorInvalidValue;
  } else {
    const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
    if (TcColumnTiles(rows) == 1) return LaunchTcPartitionKernelRows<T, D, 1>(p, shape, ws, stream);
    return LaunchTcPartitionKernelRows<T, D, 2>(p, shape, ws, stream);
  }
}

#define KVPAGE_TC_DECODE_INSTANTIATE(T, D)                                              \
  template int LaunchTcPartitionKernel<T, D>(const DecodeParams &, const DecodeShape &, \
                                             const DecodeWorkspace &, size_t, cudaStream_t);
#define KVPAGE_TC_DECODE_DECLARE_EXTERN(T, D)        \
  extern template int LaunchTcPartitionKernel<T, D>( \
      const DecodeParams &, const DecodeShape &, const DecodeWorkspace &, size_t, cudaStream_t);

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_DECODE_CUH_
