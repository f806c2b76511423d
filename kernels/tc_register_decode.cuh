// SPDX-License-Identifier: Apache-2.0
// The tensor-core partition kernel of the decode, register path
// (DecodeKernel::kTensorCoreRegisters): the path for GQA groups (and
// multi-token queries) whose rows outrun the CUDA cores of the
// thread-group kernel (paged_decode.cuh). Same grid, same split-K
// partials, same reduce kernel, same graph-stable launch; Q.K^T and P.V
// run on mma.sync m16n8k16 with FP32 accumulation, K and V codes go
// through the conversions of common/dequant.cuh straight into the operand
// registers (no round trip of dequantized values through shared memory).
// The prologue, the step's math and the epilogue are
// tc_partition_common.cuh's; here the codes arrive by 16- and 8-byte
// loads into registers one step ahead: a step's K loads are issued as
// soon as S^T has consumed the previous codes and its V loads after P.V
// (the first step's right after the block ids, overlapping the scale
// records and the q operands), and L2 is asked for the blocks of the step
// after (prefetch_k_steps / prefetch_v_steps). The per-token scale records
// {k scale, v scale[, k min, v min]} are staged in shared memory with
// 16-byte loads, and the V factor 2^ev comes from the partition's largest
// V scale, up front. Block size is a template argument, so every load
// address is a base plus an immediate.
#ifndef KVPAGE_KERNELS_TC_REGISTER_DECODE_CUH_
#define KVPAGE_KERNELS_TC_REGISTER_DECODE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/tc_partition_common.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

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

// The register path's mainloop: this lane's codes of one step in
// registers (kraw, vraw), loaded a step ahead, the partition's scale
// records in shared memory, and the L2 prefetch of the steps after. The
// partition's state and the prologue are passed to each call.
template <class S>
struct TcRegisterMainloop {
  static constexpr int kRec = TcRecordWords(S::kT);
  uint4 kraw[S::kTiles][2][S::kLaneChunks];
  uint2 vraw[S::kMTiles][2];
  int pf_steps, pf_ahead;
  // The warp's step (s0) and its next one (nxt), every kWarps-th step of
  // the partition: the next step in a register instead of forming s0 +
  // kWarps * kStep at each use, BF16 in 2752-token partitions measured
  // 0.5-1.8% faster (docs/archive.md, "Tensor-core decode: register
  // path").
  int s0, nxt;
  const float* rec;
  float vfac_hh[2];  // P' of the lo, hi registers' tokens: vfac, vfac * kHiRatio

  // Each step's loads are issued one step ahead, which ncu found too
  // little to cover DRAM's latency (FP8 at B = 512: 57% of the warps'
  // stall samples on the first use of the K codes). So the L2 fetches the
  // K blocks of the warp's step plan.prefetch_k_steps ahead and the V
  // blocks prefetch_v_steps ahead (0: none): one bulk prefetch per block
  // and region from lanes 0 .. kPfBlocks - 1 (K) and the next kPfBlocks
  // (V), no registers held. Further ahead than a step thrashed L2
  // (docs/archive.md, "L2 prefetch").
  static constexpr int kPfBlocks = S::kStep >= S::kBS ? S::kStep / S::kBS : 1;  // a step's blocks
  static constexpr int kKBlockBytes = S::kLaneChunks * 4 * S::kBS * 16;  // a KV head's K of a block
  static constexpr int kVBlockBytes = S::kD * S::kBS * S::kBits / 8;

  // pf_steps: this lane's prefetch distance in steps (PrefetchSteps).
  __device__ __forceinline__ explicit TcRegisterMainloop(int pf_steps_) {
    pf_steps = pf_steps_;
    pf_ahead = pf_steps * kWarps * S::kStep;  // tokens
    s0 = 0;
    nxt = 0;
  }

  // ---- Copies (TcPrologue::LoadStep): into this lane's registers.
  __device__ __forceinline__ void Records(const PartitionState&, const TcPrologue<S>&, int, int) {}
  __device__ __forceinline__ void K(int, int j, int hh, int c, const uint8_t* base, int off,
                                    bool in) {
    kraw[j][hh][c] = in ? Load16(base + off) : Zero16();
  }
  __device__ __forceinline__ void V(int, int i, int hh, const uint8_t* src, bool in) {
    vraw[i][hh] = in ? __ldg(reinterpret_cast<const uint2*>(src)) : make_uint2(0u, 0u);
  }
  __device__ __forceinline__ void VHalves(int, int i, int hh, const uint8_t* lo, const uint8_t* hi,
                                          int off, bool in_lo, bool in_hi) {
    vraw[i][hh] = make_uint2(in_lo ? __ldg(reinterpret_cast<const unsigned*>(lo + off)) : 0u,
                             in_hi ? __ldg(reinterpret_cast<const unsigned*>(hi + off)) : 0u);
  }

  // ---- A step's codes and scales (TcPass).
  __device__ __forceinline__ uint4 KChunk(int, int j, int hh, int c) const {
    return kraw[j][hh][c];
  }
  __device__ __forceinline__ uint2 VPair(int, int i, int hh) const { return vraw[i][hh]; }
  __device__ __forceinline__ TcTokenScales Scales(int, int, int tt, int hh, bool) const {
    TcTokenScales sc{1.0f, 0.0f, vfac_hh[hh], 0.0f};
    if constexpr (kRec == 4) {
      const float4 r = *reinterpret_cast<const float4*>(rec + 4 * tt);
      sc.ks = r.x, sc.km = r.y, sc.vs = r.z * vfac_hh[hh], sc.vm = r.w;
    } else if constexpr (kRec == 2) {
      const float2 r = *reinterpret_cast<const float2*>(rec + 2 * tt);
      sc.ks = r.x, sc.vs = r.y * vfac_hh[hh];
    }
    return sc;
  }

  // This lane's L2 prefetch for the warp's step at t0 (its first token). A
  // step shorter than a block shares it with the next warp's: the warp
  // whose step starts the block fetches it.
  __device__ __forceinline__ void Prefetch(const PartitionState& st, const TcPrologue<S>& pro,
                                           const int t0) const {
    if (S::kStep < S::kBS && (t0 & (S::kBS - 1)) != 0) return;
    const int bi = (t0 >> S::kLbs) + pro.lane % kPfBlocks;
    if (t0 < st.n_valid && bi < st.nblk) {
      const int b = pro.blk_s[bi];
      if (pro.lane < kPfBlocks) {
        PrefetchL2<kKBlockBytes>(pro.k_head + int64_t{b} * pro.k_block_stride);
      } else {
        PrefetchL2<kVBlockBytes>(pro.v_head + int64_t{b} * pro.v_block_stride);
      }
    }
  }

  // A pass's first loads, and the prefetches of the steps before the first
  // one the loop issues.
  __device__ __forceinline__ void StartPass(const PartitionState& st, const TcPrologue<S>& pro) {
    s0 = pro.warp * S::kStep;
    nxt = s0 + kWarps * S::kStep;
    pro.LoadStep(st, *this, s0, 0, true, true);
    for (int i = 1; i < pf_steps; ++i) Prefetch(st, pro, (pro.warp + i * kWarps) * S::kStep);
  }

  // One step from s0, compiled for the logit variant V.
  template <class V>
  __device__ __forceinline__ void Step(const PartitionState& st, const TcPrologue<S>& pro,
                                       TcPass<S>& pass) {
    const int span_tok = s0 + S::kSpan * pro.tig;
    float s[S::kTiles][S::kNT][4];
    pass.Scores(*this, 0, s);
    pro.LoadStep(st, *this, nxt, 0, true, false);  // kraw is free again
    float vs[S::kTiles][2], vm[S::kTiles][2], mstep[S::kNT][2];
    pass.template Logits<V>(*this, st, pro, s0, 0, s, vs, vm, mstep);
    pass.template Rescale<V>(mstep);
    uint32_t pb[S::kTiles][S::kNT][2][S::kParts];
    pass.template POperands<V>(s, vs, vm, pb);
    pass.template AccumulateV<V>(*this, 0, pb, span_tok, st.n_valid);
    pro.LoadStep(st, *this, nxt, 0, false, true);  // vraw is free again
  }

  // The warp's steps of the pass.
  __device__ __forceinline__ void Run(const PartitionState& st, const TcPrologue<S>& pro,
                                      TcPass<S>& pass) {
#pragma unroll 1
    while (s0 < st.n_valid) {
      if (pf_ahead > 0) Prefetch(st, pro, s0 + pf_ahead);
      if (pro.rules.Unmasked(s0, S::kStep, st.n_valid)) {
        Step<UnmaskedLogits>(st, pro, pass);
      } else {
        Step<MaskedLogits>(st, pro, pass);
      }
      s0 = nxt;
      nxt += kWarps * S::kStep;
    }
  }
};

template <DType T, int D, int kNT, int kBS>
__global__ void __launch_bounds__(kThreads, TcMinBlocksPerSm(T, D, kNT))
    TcRegisterKernel(const __grid_constant__ DecodeParams p,
                     const __grid_constant__ DecodePlan plan,
                     const __grid_constant__ DecodeWorkspace ws) {
  using S = TcShape<T, D, kNT, kBS>;
  constexpr int kRec = TcRecordWords(T);
  static_assert(TcRingStages(T, D) == 0, "the ring kernel serves this shape");
  PartitionState st;
  if (!BeginPartition(p, plan, ws, st, false)) return;  // past this sequence's end
  TcPrologue<S> pro;
  pro.Layout(p, st);
  __shared__ unsigned vmax_bits;
  if (pro.tid == 0) vmax_bits = 0u;  // ordered by StageBlockIds' barriers
  if (!pro.StageIds(p, plan, ws, st, false, nullptr)) return;
  // Lanes 0 .. kPfBlocks - 1 prefetch K blocks, the next kPfBlocks V
  // blocks (TcRegisterMainloop::Prefetch). (Here, where plan is the
  // kernel's parameter: both distances load ahead of the lane's choice.)
  constexpr int kPfBlocks = TcRegisterMainloop<S>::kPfBlocks;
  TcRegisterMainloop<S> ml(pro.lane >= 2 * kPfBlocks ? 0
                           : pro.lane < kPfBlocks    ? plan.prefetch_k_steps
                                                     : plan.prefetch_v_steps);
  ml.StartPass(st, pro);

  ml.rec = pro.smem + pro.lay.rec;
  const float vlargest = StageTcRecords<T, kBS>(p, st, pro.blk_s, pro.smem + pro.lay.rec);
  if (kRec != 0) atomicMax(&vmax_bits, __float_as_uint(vlargest));  // scales >= 0 order as bits
  __syncthreads();
  // P' = p * vscale * vfac < 2^14: inside FP16's range, and the tokens that
  // carry weight stay clear of its subnormals (16-bit caches: vscale = 1).
  float vfac = 1.0f;
  const float vmax = kRec != 0 ? __uint_as_float(vmax_bits) : 1.0f;
  if (vmax > 0.0f && isfinite(vmax)) {
    int e = 0;
    frexpf(vmax, &e);  // vmax in [2^(e-1), 2^e)
    vfac = ldexpf(1.0f, min(max(14 - e, -100), 100));
  }
  const float inv_vfac = 1.0f / S::kLoUnit / vfac;  // powers of two: exact
  ml.vfac_hh[0] = vfac;
  ml.vfac_hh[1] = vfac * S::kHiRatio;

  for (int r0 = 0; r0 < st.rows; r0 += S::kPassRows) {
    TcPass<S> pass;
    pass.Begin(p, st, pro, r0);
    ml.Run(st, pro, pass);
    TcMergeRows<S, false, false>(p, plan, ws, st, pro, pass, r0, inv_vfac, 0);
    __syncthreads();  // the next pass reuses stat / row / out
    if (r0 + S::kPassRows < st.rows) ml.StartPass(st, pro);
  }
}

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_REGISTER_DECODE_CUH_
