// SPDX-License-Identifier: Apache-2.0
// The tensor-core partition kernel of the decode with a cp.async ring
// (DecodeKernel::kTensorCoreRing; TcRingStages: INT4 at head size 128,
// where the register path waited on K at every step). The register path's
// math (tc_partition_common.cuh), but each warp keeps TcRingStages stages
// of its steps' K chunks, V spans and scale entries (as stored) in shared
// memory, two steps ahead: every lane copies with cp.async and reads back
// only its own slots (slot-major, conflict-free). The K and V copies have
// L2 fetch 256-byte spans from DRAM (.L2::256B: a block's K and V pieces
// are 1 KB each at block size 16, at scattered addresses; INT4 0.2-0.7%
// faster on every benchmark shape), but for block size 8's 4-byte V
// copies (not measured). Since the scale entries travel in the ring, no
// partition-wide record table exists: each warp keeps its own V factor
// 2^wexp, lowered (with an exact power-of-two rescale of O) when a larger
// V scale arrives. The kernel writes its output directly where
// PartitionWritesOutput says so (its 8192-token partitions make most
// sequences one partition).
#ifndef KVPAGE_KERNELS_TC_RING_DECODE_CUH_
#define KVPAGE_KERNELS_TC_RING_DECODE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/tc_partition_common.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

// The ring's mainloop: this warp's slice of the ring (TcRingStages stages
// of TcStageBytes), this lane's copy of the steps' scale entries, and the
// warp's V factor. The partition's state and the prologue are passed to
// each call.
template <class S>
struct TcRingMainloop {
  static constexpr int kStages = TcRingStages(S::kT, S::kD);
  static constexpr int kKSlots = TcRingKSlots(S::kT, S::kD);
  static constexpr int kStageBytes = TcStageBytes(S::kT, S::kD);
  static constexpr int kEntry = TcEntryBytes(S::kT);
  // The step's K and V scale entries, 16 bytes a lane (the first 2 *
  // kRecChunks lanes): chunk q covers 16 / kEntry tokens of one block.
  static constexpr int kRecChunks = S::kStep * kEntry / 16;
  static constexpr int kRecTokens = kEntry > 0 ? 16 / kEntry : 1;  // tokens of a chunk
  static_assert(kStages > 0, "a ring of stages");
  static_assert(kKSlots == S::kTiles * 2 * S::kLaneChunks,
                "ring K slots: a lane's K chunks of a step");
  static_assert(kEntry == 0 || (kRecChunks >= 1 && 2 * kRecChunks <= 32 && kRecTokens <= S::kBS),
                "a step's scale entries: whole 16-byte chunks, one per lane at most");
  static_assert(S::kStep % S::kBS == 0, "ring steps start on a block boundary");

  int lane;
  uint8_t* ring;
  // Lane q < 2 * kRecChunks copies chunk q % kRecChunks of the K (q <
  // kRecChunks) or V entries: its token offset in a step and, since steps
  // start on a block boundary, its entry's place in the block are the same
  // at every step. Computed here once: inside the lane-conditional copy the
  // compiler recomputed the geometry's offsets (a division among them) at
  // every step, about 95 instructions (docs/archive.md, "INT4 ring").
  int rec_tok;
  const uint8_t* rec_head;
  int rec_block_stride;
  // The ring keeps s0 + kWarps * kStep at each use rather than the next
  // step in a register (with one live its registers grew from 195 to 197).
  int s0;
  // wmax_e: the exponent of the largest V scale this warp has seen so far
  // (-inf: none); 2^wexp: the warp's V factor from it (the register path's
  // vfac rule). (wmax_e first: the order of the step loop's phis.)
  float wmax_e;
  int wexp;

  __device__ __forceinline__ TcRingMainloop(const DecodeParams& p, const PartitionState& st,
                                            const TcPrologue<S>& pro) {
    const CacheGeometry& g = p.geo;
    lane = pro.lane;
    ring = reinterpret_cast<uint8_t*>(pro.smem + pro.lay.ring + pro.warp * pro.lay.ring_warp);
    const bool rec_is_v = pro.lane >= kRecChunks;
    rec_tok = (pro.lane % max(kRecChunks, 1)) * kRecTokens;
    rec_head = p.layer +
               (rec_is_v ? g.v_scale_offset() + int64_t{st.kvh} * g.v_scale_head_stride()
                         : g.k_scale_offset() + int64_t{st.kvh} * g.k_scale_head_stride()) +
               (rec_tok & (S::kBS - 1)) * kEntry;
    rec_block_stride =
        static_cast<int>(rec_is_v ? g.v_scale_block_stride() : g.k_scale_block_stride());
    s0 = 0;
  }

  // This lane's slots of stage `stage`: K slot (j, hh, c), V slot (i, hh);
  // the step's scale entries: K of token t at RecSlot(stage) + t * kEntry,
  // V after the step's K entries.
  __device__ __forceinline__ uint8_t* KSlot(int stage, int j, int hh, int c) const {
    return ring + stage * kStageBytes + (((j * 2 + hh) * S::kLaneChunks + c) * 32 + lane) * 16;
  }
  __device__ __forceinline__ uint8_t* VSlot(int stage, int i, int hh) const {
    return ring + stage * kStageBytes + 32 * 16 * kKSlots + ((i * 2 + hh) * 32 + lane) * 8;
  }
  __device__ __forceinline__ uint8_t* RecSlot(int stage) const {
    return ring + stage * kStageBytes + 32 * (16 * kKSlots + 8 * TcRingVSlots(S::kD));
  }

  // ---- Copies (TcPrologue::LoadStep): into this lane's slots. The V
  // copies stay 8-byte, L1-allocating ones: pairing a lane's rows into
  // 16-byte copies (which bypass L1) measured 19% slower (docs/archive.md,
  // "INT4 ring").
  __device__ __forceinline__ void Records(const PartitionState& st, const TcPrologue<S>& pro,
                                          const int t0, const int stage) {
    if (lane < 2 * kRecChunks) {
      const int t = t0 + rec_tok;
      const bool in = t < st.n_valid;
      const int b = in ? pro.blk_s[t >> S::kLbs] : 0;
      CpAsync<16>(RecSlot(stage) + lane * 16, rec_head + int64_t{b} * rec_block_stride, in);
    }
  }
  __device__ __forceinline__ void K(int stage, int j, int hh, int c, const uint8_t* base, int off,
                                    bool in) {
    CpAsync<16, true>(KSlot(stage, j, hh, c), base + off, in);
  }
  __device__ __forceinline__ void V(int stage, int i, int hh, const uint8_t* src, bool in) {
    CpAsync<8, true>(VSlot(stage, i, hh), src, in);
  }
  __device__ __forceinline__ void VHalves(int stage, int i, int hh, const uint8_t* lo,
                                          const uint8_t* hi, int off, bool in_lo, bool in_hi) {
    CpAsync<4>(VSlot(stage, i, hh), lo + off, in_lo);
    CpAsync<4>(VSlot(stage, i, hh) + 4, hi + off, in_hi);
  }

  // ---- A step's codes and scales (TcPass), from the stage.
  __device__ __forceinline__ uint4 KChunk(int stage, int j, int hh, int c) const {
    return *reinterpret_cast<const uint4*>(KSlot(stage, j, hh, c));
  }
  __device__ __forceinline__ uint2 VPair(int stage, int i, int hh) const {
    return *reinterpret_cast<const uint2*>(VSlot(stage, i, hh));
  }
  // Entries as stored; past the sequence end stale bytes: zeros. (16-bit
  // caches have none: TokenScaleFromBits gives 1, 0.)
  __device__ __forceinline__ TcTokenScales Scales(int stage, int t0, int tt, int, bool in) const {
    uint32_t kb = 0, vb = 0;
    const uint8_t* entries = RecSlot(stage) + kEntry * (tt - t0);
    if constexpr (kEntry == 4) {
      kb = *reinterpret_cast<const uint32_t*>(entries);
      vb = *reinterpret_cast<const uint32_t*>(entries + S::kStep * 4);
    } else if constexpr (kEntry == 2) {
      kb = *reinterpret_cast<const uint16_t*>(entries);
      vb = *reinterpret_cast<const uint16_t*>(entries + S::kStep * 2);
    }
    const TokenScale k = TokenScaleFromBits<S::kT>(in ? kb : 0u);
    const TokenScale v = TokenScaleFromBits<S::kT>(in ? vb : 0u);
    return {k.scale, k.min, v.scale, v.min};
  }

  // A pass's first loads: the steps of stages 0 .. kStages - 2, one
  // cp.async group each (empty past the partition's end).
  __device__ __forceinline__ void StartPass(const PartitionState& st, const TcPrologue<S>& pro) {
    s0 = pro.warp * S::kStep;
#pragma unroll
    for (int i = 0; i + 1 < kStages; ++i) {
      pro.LoadStep(st, *this, (pro.warp + i * kWarps) * S::kStep, i, true, true);
      CpAsyncCommit();
    }
  }

  // The step's largest V scale (warp-wide); a larger exponent than seen
  // lowers this warp's factor: O rescaled by a power of two. The warp-wide
  // scale has a larger exponent exactly when some lane's own largest scale
  // has, which after the first steps none has: a vote decides, and the
  // shuffles that reduce the scales (a chain of three on the step's path)
  // run only then. Same results. Then vs times the factor (and the hi
  // registers' unit).
  __device__ __forceinline__ void ScaleV(TcPass<S>& pass, float (&vs)[S::kTiles][2]) {
    float vmax = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) vmax = fmaxf(vmax, fmaxf(vs[j][0], vs[j][1]));
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
          for (int i = 0; i < S::kMTiles; ++i) {
#pragma unroll
            for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
              for (int c = 0; c < 4; ++c) pass.o[i][nt][c] *= ratio;
            }
          }
        }
        wmax_e = static_cast<float>(e);
        wexp = nexp;
      }
    }
    const float wfac = ldexpf(1.0f, wexp);
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) {
      vs[j][0] *= wfac;
      vs[j][1] *= wfac * S::kHiRatio;
    }
  }

  // One step from s0 in stage `stage`, compiled for the logit variant V.
  // The stage of step s0 - 1 (consumed: the barrier orders every lane's
  // reads of its scale entries first) takes the step kStages - 1 ahead;
  // then the step waits for its own group, and for the other lanes' (each
  // copied some of the step's scale entries).
  template <class V>
  __device__ __forceinline__ void Step(const PartitionState& st, const TcPrologue<S>& pro,
                                       TcPass<S>& pass, const int stage) {
    const int span_tok = s0 + S::kSpan * pro.tig;
    __syncwarp();
    pro.LoadStep(st, *this, s0 + (kStages - 1) * kWarps * S::kStep,
                 stage == 0 ? kStages - 1 : stage - 1, true, true);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncwarp();
    float s[S::kTiles][S::kNT][4];
    pass.Scores(*this, stage, s);
    float vs[S::kTiles][2], vm[S::kTiles][2], mstep[S::kNT][2];
    pass.template Logits<V>(*this, st, pro, s0, stage, s, vs, vm, mstep);
    pass.template Rescale<V>(mstep);
    ScaleV(pass, vs);
    uint32_t pb[S::kTiles][S::kNT][2][S::kParts];
    pass.template POperands<V>(s, vs, vm, pb);
    pass.template AccumulateV<V>(*this, stage, pb, span_tok, st.n_valid);
  }

  // The warp's steps of the pass. Nothing is in flight past the last step
  // (loads stop at n_valid), but the ring slice becomes this warp's O block
  // in the epilogue: every lane done with its slots first.
  __device__ __forceinline__ void Run(const PartitionState& st, const TcPrologue<S>& pro,
                                      TcPass<S>& pass) {
    wexp = 100;
    wmax_e = -INFINITY;
    int stage = 0;  // the ring stage of step s0
#pragma unroll 1
    while (s0 < st.n_valid) {
      if (pro.rules.Unmasked(s0, S::kStep, st.n_valid)) {
        Step<UnmaskedLogits>(st, pro, pass, stage);
      } else {
        Step<MaskedLogits>(st, pro, pass, stage);
      }
      stage = stage + 1 == kStages ? 0 : stage + 1;
      s0 += kWarps * S::kStep;
    }
    CpAsyncWait<0>();
    __syncwarp();
  }
};

template <DType T, int D, int kNT, int kBS>
__global__ void __launch_bounds__(kThreads, TcMinBlocksPerSm(T, D, kNT))
    TcRingKernel(const __grid_constant__ DecodeParams p, const __grid_constant__ DecodePlan plan,
                 const __grid_constant__ DecodeWorkspace ws) {
  using S = TcShape<T, D, kNT, kBS>;
  PartitionState st;
  // The first partition copies its block ids while the length loads
  // (CopyTableSlice): INT4 0.2-1.3% faster on every benchmark shape. Not
  // the other partitions, which ragged batches leave mostly empty (copies
  // for nothing: +0.2% there), nor the register path (no gain measured,
  // and moving its layout ahead of BeginPartition cost FP8/INT8 1-2%;
  // docs/archive.md, "INT4 ring").
  int* early_blk_s = nullptr;
  if (blockIdx.x == 0) {
    early_blk_s = reinterpret_cast<int*>(
        SharedWords() + MakeTcSmemLayout(p.geo, plan.partition_size, S::kPassRows).blk);
  }
  if (!BeginPartition(p, plan, ws, st, true, early_blk_s)) return;  // past this sequence's end
  TcPrologue<S> pro;
  pro.Layout(p, st);
  if (!pro.StageIds(p, plan, ws, st, true, early_blk_s)) return;
  TcRingMainloop<S> ml(p, st, pro);
  ml.StartPass(st, pro);
  __syncthreads();  // ends the prologue block-wide, as in the register path
  // No partition-wide V factor: each warp keeps its own (ScaleV).
  constexpr float kInvVfac = 1.0f / S::kLoUnit;  // a power of two: exact

  for (int r0 = 0; r0 < st.rows; r0 += S::kPassRows) {
    TcPass<S> pass;
    pass.Begin(p, st, pro, r0);
    ml.Run(st, pro, pass);
    TcMergeRows<S, true, true>(p, plan, ws, st, pro, pass, r0, kInvVfac, ml.wexp);
    __syncthreads();  // the next pass reuses stat / row / out
    if (r0 + S::kPassRows < st.rows) ml.StartPass(st, pro);
  }
}

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_RING_DECODE_CUH_
