// SPDX-License-Identifier: Apache-2.0
// The staged tensor-core partition kernel of the decode (sm_90+): 16-bit K
// and V at block size 16, up to 8 query rows per KV head. Same grid, same
// split-K partials, same reduce kernel and graph-stable launch as
// TcRegisterKernel (tc_register_decode.cuh), which it replaces where
// it runs (DecodePlan::staged): that path holds a step's codes in each
// warp's registers, which caps the bytes an SM keeps in flight, and BF16
// stayed at 91-92% of the copy bandwidth at 128 sequences. Here one
// producer warp copies each stage's blocks with the copy engine into a ring
// of shared-memory stages, and the four consumer warps share every stage:
//   - a stage is 4 blocks (64 tokens): per block the K piece and the V
//     piece of one KV head, as stored (bulk copies complete on the stage's
//     `full` barrier; the consumers hand the stage back on `empty`);
//   - S^T = K Q^T: consumer warp w takes block w (16 tokens x the rows):
//     K's A operands by ldmatrix straight from the stored layout ([D/8]
//     chunks of [16 tokens][8 channels]), Q^T in registers (hi + lo parts,
//     the lo mma only where some lo part is not zero);
//   - the warps exchange their row maxima (one named barrier), so that all
//     take the same running maximum, and their P^T operands (hi + lo, one
//     more barrier);
//   - O^T = V^T P^T: warp w accumulates channels w D/4 .. (w + 1) D/4 over
//     all 64 tokens (V's A operands by ldmatrix from [D][16 tokens]).
// Registers stay few (O^T is D/4 channels x 8 rows a warp), so a thread
// block of 160 threads and 3 stages of 32 KB (D = 128) runs 2 to an SM:
// 6 stages an SM, those not being computed on in flight. Masks, ALiBi,
// soft-cap, sliding window and multi-token queries follow the register
// path's rules (logit_variants.cuh); stages that every row sees whole skip
// them (UnmaskedLogits).
#ifndef KVPAGE_KERNELS_TC_STAGED_DECODE_CUH_
#define KVPAGE_KERNELS_TC_STAGED_DECODE_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/partition_common.cuh"
#include "kernels/tc_partition_common.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

// The compile-time shape of the staged kernel: K = V dtype T, head size D.
template <DType T, int D>
struct TcStagedShape {
  static constexpr bool kBf16 = T == DType::kBF16;
  static constexpr int kBS = kStagedBlockSize;
  static constexpr int kKSteps = D / 16;
  static constexpr int kWarpChannels = D / kStagedConsumerWarps;
  static constexpr int kMTiles = kWarpChannels / 16;
  static constexpr int kPieceBytes = D * kBS * 2;  // one block's K (or V) of one KV head
  static constexpr int kStageBytes = StagedStageBytes(D);
  static constexpr int kConsumerThreads = 32 * kStagedConsumerWarps;
  static constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps
  static_assert(kWarpChannels % 16 == 0, "a consumer warp's channels fill whole m16 tiles");
};

// ---- Producer: stage k takes blocks 4k .. 4k + 3 of the partition (those
// before its last block), K pieces then V pieces.
template <DType T, int D>
__device__ __forceinline__ void TcStagedProduce(const DecodeParams& p, const PartitionState& st,
                                                const int* blk_s, uint8_t* const stages,
                                                uint64_t (&full)[kStagedStages],
                                                uint64_t (&empty)[kStagedStages], const int lane,
                                                const int nstages) {
  using S = TcStagedShape<T, D>;
  const CacheGeometry& g = p.geo;
  const uint8_t* k_head = p.layer + g.k_data_offset() + int64_t{st.kvh} * g.k_head_stride();
  const uint8_t* v_head = p.layer + g.v_data_offset() + int64_t{st.kvh} * g.v_head_stride();
  const int64_t k_block_stride = g.k_block_stride(), v_block_stride = g.v_block_stride();
  const int j = lane % kStagedStageBlocks;
  const bool is_k = lane < kStagedStageBlocks;
  for (int k = 0; k < nstages; ++k) {
    const int s = k % kStagedStages;
    if (k >= kStagedStages) MbarrierWait(&empty[s], ((k / kStagedStages) - 1) & 1);
    const int nb = min(kStagedStageBlocks, st.nblk - k * kStagedStageBlocks);
    if (lane == 0) MbarrierArriveExpectBytes(&full[s], nb * 2 * S::kPieceBytes);
    __syncwarp();
    if (lane < 2 * kStagedStageBlocks && j < nb) {
      const int64_t b = blk_s[k * kStagedStageBlocks + j];
      uint8_t* dst = stages + s * S::kStageBytes +
                     (is_k ? 0 : kStagedStageBlocks * S::kPieceBytes) + j * S::kPieceBytes;
      const uint8_t* src = is_k ? k_head + b * k_block_stride : v_head + b * v_block_stride;
      BulkCopyToShared(dst, src, S::kPieceBytes, &full[s]);
    }
  }
}

// ---- Consumers: the math of one consumer warp over the stages and its
// epilogue, on the warp's state (Q^T operands, the factors and masks of its
// lane's rows, O^T of its channels and the rows' online softmax, the row
// sums). The kernel body holds that state, and forms the q rows and Q^T
// operands itself, and this struct refers to it, as a lambda would: with
// the state in the struct the PTX differs (address folding, where tests
// sit), and with the q loads, the Q^T operands or the row sums in helpers
// the phis of v, o, mrun and lrun are numbered in another order, which
// ptxas schedules differently (docs/DESIGN.md, "Changing a kernel").
template <DType T, int D>
struct TcStagedConsumer {
  using S = TcStagedShape<T, D>;
  static constexpr bool kBf16 = S::kBf16;
  static constexpr int kBS = S::kBS;

  const PartitionState& st;
  const int &w, &lane, &grp, &tig;
  const LogitRules& rules;
  const uint32_t (&qb)[S::kKSteps][2][2];
  const bool& q_split;
  const float (&rfac)[2];
  const RowMask (&rmask)[2];
  float (&o)[S::kMTiles][4];
  float (&mrun)[2];
  float (&lrun)[2];
  const uint32_t &k_lane_off, &v_lane_off;
  float (&row_red)[kStagedConsumerWarps][kStagedMaxRows];
  uint4 (&p_frag)[kStagedConsumerWarps][32];

  // One stage from partition token s0, compiled for the logit variant V
  // (logit_variants.cuh).
  template <class V>
  __device__ __forceinline__ void Stage(const int s0, const uint32_t kbase) {
    const uint32_t vbase = kbase + kStagedStageBlocks * S::kPieceBytes;
    // ---- S^T of block w: rows grp, grp + 8 are its tokens.
    float sp[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const uint32_t kw = kbase + w * S::kPieceBytes + k_lane_off;
    // (The lo products only where q has lo parts: a branch per stage, not
    // per k-step, so that the ldmatrix loads run ahead of the mma chain.)
    if (q_split) {
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t a[4];
        LoadMatrixX4(a, kw + ks * 2 * (kBS * 16));
        MmaM16N8K16<kBf16>(sp[0], a, qb[ks][0][0], qb[ks][1][0]);
        MmaM16N8K16<kBf16>(sp[1], a, qb[ks][0][1], qb[ks][1][1]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t a[4];
        LoadMatrixX4(a, kw + ks * 2 * (kBS * 16));
        MmaM16N8K16<kBf16>(sp[0], a, qb[ks][0][0], qb[ks][1][0]);
      }
    }
    // ---- Logits (log2 units) and the warp's row maxima.
    float y[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int e = c & 1;
      float v = sp[0][c] + sp[1][c];
      if constexpr (V::kMasked) {
        const int tt = s0 + kBS * w + grp + 8 * (c >> 1);
        v = MaskedLogit(v * rfac[e], rules, rmask[e], st.start + tt, tt < st.n_valid);
      }
      y[c] = v;
    }
    float mx[2] = {fmaxf(y[0], y[2]), fmaxf(y[1], y[3])};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(kFullMask, mx[e], 4));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(kFullMask, mx[e], 8));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(kFullMask, mx[e], 16));
      mx[e] = V::RowMax(mx[e], rfac[e]);
      if (grp == 0) row_red[w][2 * tig + e] = mx[e];
    }
    NamedBarrierSync(S::kConsumerBarrier, S::kConsumerThreads);
    // ---- The stage's maxima of all warps: every warp takes the same.
    float alpha[2], mnew[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float m = mrun[e];
#pragma unroll
      for (int v = 0; v < kStagedConsumerWarps; ++v) m = fmaxf(m, row_red[v][2 * tig + e]);
      mnew[e] = m;
      alpha[e] = m > mrun[e] ? Exp2(mrun[e] - m) : 1.0f;
      mrun[e] = m;
    }
    float pr[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int e = c & 1;
      pr[c] = V::Prob(y[c], rfac[e], mnew[e]);
    }
    lrun[0] = fmaf(lrun[0], alpha[0], pr[0] + pr[2]);
    lrun[1] = fmaf(lrun[1], alpha[1], pr[1] + pr[3]);
    // ---- P^T operands of block w (hi + lo) for every warp.
    const uint32_t hi0 = PackPair<kBf16>(pr[0], pr[1]);
    const uint32_t hi1 = PackPair<kBf16>(pr[2], pr[3]);
    const float2 h0 = UnpackPair<kBf16>(hi0), h1 = UnpackPair<kBf16>(hi1);
    const uint32_t lo0 = PackPair<kBf16>(pr[0] - h0.x, pr[1] - h0.y);
    const uint32_t lo1 = PackPair<kBf16>(pr[2] - h1.x, pr[3] - h1.y);
    p_frag[w][lane] =
        make_uint4(TransposeM8N8(hi0), TransposeM8N8(hi1), TransposeM8N8(lo0), TransposeM8N8(lo1));
    NamedBarrierSync(S::kConsumerBarrier, S::kConsumerThreads);
    // ---- O^T += V^T P^T over the stage's blocks, this warp's channels.
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[mt][c] *= alpha[c & 1];
    }
#pragma unroll
    for (int j = 0; j < kStagedStageBlocks; ++j) {
      const int b0 = s0 + kBS * j;  // the block's first token
      // A block past the sequence end was not copied: its P is zero and
      // its shared memory holds another stage's bytes.
      if (V::kMasked && b0 >= st.n_valid) continue;
      const uint4 pb = p_frag[j][lane];
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
        uint32_t a[4];
        LoadMatrixX4(a, vbase + j * S::kPieceBytes + (w * S::kWarpChannels + 16 * mt) * (kBS * 2) +
                            v_lane_off);
        if constexpr (V::kMasked) {
          // Codes past the sequence end are stale bytes, possibly NaN
          // patterns, and 0 * NaN must not reach the accumulators.
          const int t = b0 + 2 * tig;
          const bool k0 = t < st.n_valid, k1 = t + 1 < st.n_valid;
          const bool k8 = t + 8 < st.n_valid, k9 = t + 9 < st.n_valid;
          a[0] = KeepHalves(a[0], k0, k1);
          a[1] = KeepHalves(a[1], k0, k1);
          a[2] = KeepHalves(a[2], k8, k9);
          a[3] = KeepHalves(a[3], k8, k9);
        }
        MmaM16N8K16<kBf16>(o[mt], a, pb.x, pb.y);
        MmaM16N8K16<kBf16>(o[mt], a, pb.z, pb.w);
      }
    }
  }

  // The partition's stages as the producer fills them.
  __device__ __forceinline__ void Run(uint64_t (&full)[kStagedStages],
                                      uint64_t (&empty)[kStagedStages], uint8_t* const stages,
                                      const int nstages) {
#pragma unroll 1
    for (int k = 0; k < nstages; ++k) {
      const int s = k % kStagedStages;
      MbarrierWait(&full[s], (k / kStagedStages) & 1);
      const int s0 = k * kStagedStageTokens;
      const uint32_t kbase = SharedAddress(stages + s * S::kStageBytes);
      if (rules.Unmasked(s0, kStagedStageTokens, st.n_valid)) {
        Stage<UnmaskedLogits>(s0, kbase);
      } else {
        Stage<MaskedLogits>(s0, kbase);
      }
      __syncwarp();
      if (lane == 0) MbarrierArrive(&empty[s]);  // the warp's reads of the stage are done
    }
  }

  // ---- Epilogue: each row's sum over all warps and its inverse (every
  // warp read row_red for the last stage before its second barrier).
  __device__ __forceinline__ void RowSums(float (&sum)[2], float (&inv)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = lrun[e];
      l += __shfl_xor_sync(kFullMask, l, 4);
      l += __shfl_xor_sync(kFullMask, l, 8);
      l += __shfl_xor_sync(kFullMask, l, 16);
      if (grp == 0) row_red[w][2 * tig + e] = l;
    }
    NamedBarrierSync(S::kConsumerBarrier, S::kConsumerThreads);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      sum[e] = 0.0f;
#pragma unroll
      for (int v = 0; v < kStagedConsumerWarps; ++v) sum[e] += row_red[v][2 * tig + e];
      inv[e] = sum[e] > 0.0f ? 1.0f / sum[e] : 0.0f;
    }
  }

  // The partials of this lane's rows (normalized) and their statistics.
  __device__ __forceinline__ void Store(const DecodeParams& p, const DecodePlan& plan,
                                        const DecodeWorkspace& ws, const float (&sum)[2],
                                        const float (&inv)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 2 * tig + e;
      if (r >= st.rows) continue;
      const int64_t at = RowOutIndex(p, plan, st, false, r);
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          ws.partial_out[at + w * S::kWarpChannels + 16 * mt + grp + 8 * hh] =
              o[mt][2 * hh + e] * inv[e];
        }
      }
      if (w == 0 && grp == 0) StoreRowStats(p, plan, ws, st, false, r, mrun[e] * kLn2, sum[e]);
    }
  }
};

template <DType T, int D>
__global__ void __launch_bounds__(kStagedThreads, kStagedBlocksPerSm)
    TcStagedKernel(const __grid_constant__ DecodeParams p, const __grid_constant__ DecodePlan plan,
                   const __grid_constant__ DecodeWorkspace ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = TcStagedShape<T, D>;
  __shared__ uint64_t full[kStagedStages], empty[kStagedStages];
  __shared__ float row_red[kStagedConsumerWarps][kStagedMaxRows];
  __shared__ uint4
      p_frag[kStagedConsumerWarps][32];  // each warp's P^T {hi b0, hi b1, lo b0, lo b1}
  __shared__ float q_s[kStagedMaxRows][D];

  PartitionState st;
  if (!BeginPartition(p, plan, ws, st, false)) return;  // past this sequence's end
  uint8_t* const smem = reinterpret_cast<uint8_t*>(SharedWords());
  int* const blk_s = reinterpret_cast<int*>(smem);
  uint8_t* const stages = smem + StagedIdsBytes(st.P);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStagedStages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], kStagedConsumerWarps);
    }
    MbarrierFenceInit();
  }
  // Its block barriers also publish the stage barriers' initialization.
  if (!StageBlockIds(p, plan, ws, st, blk_s, false)) return;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int nstages = (st.n_valid + kStagedStageTokens - 1) / kStagedStageTokens;

  if (warp == 0) {
    TcStagedProduce<T, D>(p, st, blk_s, stages, full, empty, lane, nstages);
    return;  // no block-wide barrier follows
  }

  const int w = warp - 1;
  const int grp = lane / 4;
  const int tig = lane % 4;
  const int qlen = p.query_len;
  const LogitRules rules = MakeLogitRules(p, st, qlen);
  // The pass's q rows (times lambda) -> q_s, 8 channels a thread: one round
  // trip for all of them (element loads with a dtype switch each went one
  // round trip after another and cost 6% at 128 sequences, H100).
  const int ctid = threadIdx.x - 32;
  for (int c = ctid; c < kStagedMaxRows * D / 8; c += S::kConsumerThreads) {
    const int row = c / (D / 8);
    const int ch0 = 8 * (c - row * (D / 8));
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (row < st.rows) {
      const int gi = row / qlen;
      const int i = row - gi * qlen;
      const int64_t qbase =
          (int64_t{st.seq} * qlen + i) * p.q_stride + int64_t{st.kvh * st.group + gi} * D;
      LoadAsFloat8(p.q_dtype, p.q, qbase + ch0, v);
      if (p.key_smoothing != nullptr) {
        float lam[8];
        LoadAsFloat8(DType::kFP32, p.key_smoothing, int64_t{st.kvh} * D + ch0, lam);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] *= lam[e];
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) q_s[row][ch0 + e] = v[e];
  }
  NamedBarrierSync(S::kConsumerBarrier, S::kConsumerThreads);
  // Q^T operands: lane (grp, tig) holds row grp at channels 16 ks + 2 tig
  // (+1) and + 8 (+9), times 2^qe (per row), as hi and lo parts (lo: what
  // the 16-bit hi part rounded off).
  uint32_t qb[S::kKSteps][2][2];
  float own_fac;
  bool any_lo = false;
  {
    float x[S::kKSteps][4];
    float amax = 0.0f;
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[ks][e] = q_s[grp][16 * ks + 8 * (e >> 1) + 2 * tig + (e & 1)];
        amax = fmaxf(amax, fabsf(x[ks][e]));
      }
    }
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
    const float up = QOperandScale(amax);
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float a = x[ks][2 * h] * up;
        const float b = x[ks][2 * h + 1] * up;
        const uint32_t hi = PackPair<S::kBf16>(a, b);
        const float2 hv = UnpackPair<S::kBf16>(hi);
        const uint32_t lo = PackPair<S::kBf16>(a - hv.x, b - hv.y);
        qb[ks][h][0] = hi;
        qb[ks][h][1] = lo;
        any_lo |= (lo & 0x7FFF7FFFu) != 0u;
      }
    }
    own_fac = rules.q_scale / up * kLog2e;
  }
  // Every warp holds all of Q^T: the same vote in each.
  const bool q_split = __any_sync(kFullMask, any_lo);

  // The rows of this lane's accumulators: 2 tig + e.
  float rfac[2];
  RowMask rmask[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int row = 2 * tig + e;
    rfac[e] = __shfl_sync(kFullMask, own_fac, 4 * row);  // the lane that loaded that row's q
    rmask[e] = MakeRowMask(p, st, rules, qlen, 2 * tig, e);
  }

  float o[S::kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) o[mt][c] = 0.0f;
  }
  float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
  // ldmatrix row addresses of this lane within a piece: K tile (16 tokens x
  // 16 channels of k-step 0), V tile (16 channels x the block's 16 tokens).
  const uint32_t k_lane_off =
      (lane >> 4) * (S::kBS * 16) + ((lane >> 3) & 1) * 128 + (lane & 7) * 16;
  const uint32_t v_lane_off =
      (((lane >> 3) & 1) * 8 + (lane & 7)) * (S::kBS * 2) + (lane >> 4) * 16;

  TcStagedConsumer<T, D> c{st,    w, lane, grp,  tig,        rules,      qb,      q_split, rfac,
                           rmask, o, mrun, lrun, k_lane_off, v_lane_off, row_red, p_frag};
  c.Run(full, empty, stages, nstages);
  float sum[2], inv[2];  // the kernel's, as the state (TcStagedConsumer)
  c.RowSums(sum, inv);
  c.Store(p, plan, ws, sum, inv);
#endif
}

// Launches TcStagedKernel<T, D> on the partition grid.
template <DType T, int D>
int LaunchTcStagedKernel(const DecodeParams& p, const DecodePlan& plan, const DecodeWorkspace& ws,
                         cudaStream_t stream) {
  static std::atomic<size_t> configured[kMaxSmemDevices];
  return LaunchPartitionGrid(&TcStagedKernel<T, D>, configured, p, plan, ws,
                             StagedSharedBytes(D, plan.partition_size), stream, kStagedThreads);
}

#define KVPAGE_TC_STAGED_DECODE_INSTANTIATE(T, D)                                 \
  template int LaunchTcStagedKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                          const DecodeWorkspace&, cudaStream_t);
#define KVPAGE_TC_STAGED_DECODE_DECLARE_EXTERN(T, D)                                     \
  extern template int LaunchTcStagedKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                                 const DecodeWorkspace&, cudaStream_t);

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_STAGED_DECODE_CUH_
