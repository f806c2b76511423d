// Paged decode attention: the split-K partition kernel and its reduce
// (flash-decoding), after vLLM's PagedAttention v2 with one thread block
// serving every query row of a KV head.
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
//      sliding window, sequence end) as in CpuBackend::Decode; logits ->
//      shared memory [rt][P].
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
// Reduce kernel. Grid (num_q_heads / rows a block, query_len, num_seqs),
// a warp per query head (ReduceKernel): merges the
// ceil(seq_len / P) partitions (read on the device) with the max trick and
// writes out (FP32/FP16/BF16) and lse (natural log, FP32); a row with
// nothing visible gets zeros and -inf. A sequence shorter than P is left
// alone (step 5 wrote its rows).
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
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace decode {

constexpr int kLaneTokens = 2;                 // K phase: tokens per lane
constexpr int kSpanTokens = 32 * kLaneTokens;  // K phase: tokens per warp pass

// Everything the phases of one partition share.
struct PartitionState {
  int seq, kvh, part;
  int len;      // seq_lens[seq]
  int start;    // first token of the partition
  int n_valid;  // tokens of the partition < len
  int nblk;     // cache blocks the partition touches
  int P;        // partition size
  int group, rows;
  SmemLayout lay;
};

// The decode kernels' dynamic shared memory, aligned to kDecodeSmemAlign
// (128 bytes): copies into shared memory (cp.async of a warp's 16-byte
// slots, cp.async.bulk of whole pieces) run slower where their destinations
// are not. Without the alignment the region starts wherever a kernel's
// static variables end, 16-byte aligned: 16 or 64 bytes past a 128-byte
// boundary, which cost the INT4 ring and the staged BF16 kernels 2-4%
// (docs/archive.md, "Shared-memory alignment").
__device__ __forceinline__ float* SharedWords() {
  extern __shared__ __align__(kDecodeSmemAlign) float4 kvpage_decode_smem[];
  return reinterpret_cast<float*>(kvpage_decode_smem);
}

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
          if (cap > 0.0f) l = cap * tanhf(l);  // q carries sm_scale / cap
          const int pos = pos_s[r];
          if (alibi) l = fmaf(slope_s[r], static_cast<float>(t - pos), l);
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

// seq_lens[s] as the kernels use it. In checked mode a length outside
// [0, min(max_context_len, block_table_width * block_size)] — one that would
// read past the table row or the workspace — is reported and taken as 0.
__device__ __forceinline__ int SequenceLength(const DecodeParams& p, int s) {
  const int len = p.seq_lens[s];
  if (p.checked != nullptr) {
    const int64_t limit =
        min(int64_t{p.max_context_len}, int64_t{p.block_table_width} * p.geo.block_size);
    if (len < 0 || len > limit) {
      ReportFault(p.checked, DeviceFault::kSeqLenOutOfRange, s, len, limit);
      return 0;
    }
  }
  return len;
}

// Index of partition 0 of (sequence, query token, query head) in the
// partial_* arrays (src/params.h); its partitions follow contiguously.
__device__ __forceinline__ int64_t PartialBase(const DecodeParams& p, const DecodePlan& plan,
                                               int seq, int token, int head) {
  return ((int64_t{seq} * plan.max_query_len + token) * p.num_q_heads + head) * plan.max_partitions;
}

// Partitions of a sequence of `len` tokens (0 for len <= 0); those past
// max_partitions do not exist (a length beyond the capacity is cut there).
__device__ __forceinline__ int PartitionCount(const DecodePlan& plan, int len) {
  return len > 0 ? min((len + plan.partition_size - 1) / plan.partition_size, plan.max_partitions)
                 : 0;
}

// Whether the one partition of a sequence of `len` tokens writes the rows'
// out and lse itself (plan.direct_output), the reduce kernel then leaving
// the sequence alone: short sequences, and partitions as long as the
// context, so skip the reduce's round trip. A length of exactly one
// partition keeps the merge: the partition kernel tests this on its
// partition's n_valid (= len for partition 0 when len <= P), which its
// loops keep in a register anyway.
__device__ __forceinline__ bool PartitionWritesOutput(const DecodePlan& plan, int len) {
  return plan.direct_output && len > 0 && (len < plan.partition_size || plan.max_partitions == 1);
}
__device__ __forceinline__ bool PartitionWritesOutput(const DecodePlan& plan,
                                                      const PartitionState& st) {
  return st.part == 0 && PartitionWritesOutput(plan, st.n_valid);
}
// Whether the partition kernel writes every row's out and lse, so that the
// reduce kernel is not launched at all: one partition a sequence in a
// kernel with direct output. Every sequence of some tokens is then written
// by PartitionWritesOutput, and a sequence of none by its partition-0
// block (zeros, lse -inf; BeginPartition). Saves the reduce grid's launch
// and drain where partitions are as long as the context (the INT4 ring
// kernel's 8192-token partitions, the thread-group kernel's short contexts).
KVP_HOST_DEVICE inline bool PartitionKernelOwnsOutput(const DecodePlan& plan) {
  return plan.direct_output && plan.max_partitions == 1;
}

// Where a partition block stores a query row's results: its partials, or
// with `direct` (PartitionWritesOutput) the row's output and lse.
// RowOutIndex is the element index of channel 0 (in partial_out, or in
// out); StoreRowOut stores a channel's value there.
// Row r of a partition block: query token r % query_len of query head
// kvh * group + r / query_len.
struct RowCoords {
  int token, head;
};
__device__ __forceinline__ RowCoords RowOf(const DecodeParams& p, const PartitionState& st,
                                           int row) {
  const int gi = row / p.query_len;
  return {row - gi * p.query_len, st.kvh * st.group + gi};
}
__device__ __forceinline__ int64_t RowOutIndex(const DecodeParams& p, const DecodePlan& plan,
                                               const PartitionState& st, bool direct, int row) {
  const RowCoords rc = RowOf(p, st, row);
  if (direct) {
    return (int64_t{st.seq} * p.query_len + rc.token) * p.out_stride +
           int64_t{rc.head} * p.geo.head_size;
  }
  return (PartialBase(p, plan, st.seq, rc.token, rc.head) + st.part) * p.geo.head_size;
}
__device__ __forceinline__ void StoreRowOut(const DecodeParams& p, const DecodeWorkspace& ws,
                                            bool direct, int64_t index, float v) {
  if (direct) {
    StoreFromFloat(p.out_dtype, p.out, index, v);
  } else {
    ws.partial_out[index] = v;
  }
}
// The row's largest logit `max` (natural log units) and sum(exp(l - max)):
// partial_max / partial_sum, or the lse (-inf when nothing was visible).
__device__ __forceinline__ void StoreRowStats(const DecodeParams& p, const DecodePlan& plan,
                                              const DecodeWorkspace& ws, const PartitionState& st,
                                              bool direct, int row, float max, float sum) {
  const RowCoords rc = RowOf(p, st, row);
  if (direct) {
    if (p.lse != nullptr) {
      p.lse[(int64_t{st.seq} * p.query_len + rc.token) * p.num_q_heads + rc.head] =
          sum > 0.0f ? max + logf(sum) : -INFINITY;
    }
  } else {
    const int64_t at = PartialBase(p, plan, st.seq, rc.token, rc.head) + st.part;
    ws.partial_max[at] = max;
    ws.partial_sum[at] = sum;
  }
}

// A partition's slice of the block table: the entries a partition may use,
// inside the table's width (none for a partition past it).
struct TableSlice {
  const int32_t* ids;
  int entries;  // <= 0: none
};
__device__ __forceinline__ TableSlice PartitionTableSlice(const DecodeParams& p,
                                                          const DecodePlan& plan, int seq,
                                                          int part) {
  const int per_part = plan.partition_size / p.geo.block_size;
  const int first = part * per_part;
  const int entries = min(per_part, p.block_table_width - first);
  return {p.block_table + int64_t{seq} * p.block_table_stride + first, entries};
}

// Asks L2 for what a partition's prologue reads that does not depend on
// its sequence's length: the q rows of its KV head and, with `with_table`,
// its slice of the block table (PartitionTableSlice; without, the caller
// copies those lines itself: CopyTableSlice). Otherwise each is another
// round trip after the length's, and while the grid streams a round trip
// takes the loaded latency, 2-3 us on an H100 (docs/archive.md, "L2
// prefetch"). Lines, not bulk copies: q rows and table slices may start anywhere.
// A partition past its sequence's end fetches a few lines it does not use:
// the table row's (in the table) and q's (used by the sequence's first
// partition).
__device__ __forceinline__ void PrefetchPrologueInputs(const DecodeParams& p,
                                                       const DecodePlan& plan, int seq, int kvh,
                                                       int part, bool with_table) {
  constexpr int kLine = 128;
  const CacheGeometry& g = p.geo;
  const int group = p.num_q_heads / g.num_kv_heads;
  const int q_bytes = DTypeBits(p.q_dtype) / 8;
  const char* q0 =
      static_cast<const char*>(p.q) +
      (int64_t{seq} * p.query_len * p.q_stride + int64_t{kvh} * group * g.head_size) * q_bytes;
  const int64_t q_token_bytes = p.q_stride * q_bytes;
  const int q_row_bytes = group * g.head_size * q_bytes;
  // A row of n bytes from anywhere touches at most n / kLine + 2 lines.
  const int q_lines = q_row_bytes / kLine + 2;
  const TableSlice slice = PartitionTableSlice(p, plan, seq, part);
  const char* t0 = reinterpret_cast<const char*>(slice.ids);
  const int t_bytes = 4 * slice.entries;
  const int t_lines = with_table && slice.entries > 0 ? t_bytes / kLine + 2 : 0;
  const int n = p.query_len * q_lines + t_lines;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const char* base;
    int bytes, line;
    if (i < p.query_len * q_lines) {
      const int tok = i / q_lines;
      base = q0 + tok * q_token_bytes;
      bytes = q_row_bytes;
      line = i - tok * q_lines;
    } else {
      base = t0;
      bytes = t_bytes;
      line = i - p.query_len * q_lines;
    }
    // The line's first byte inside [base, base + bytes), if any.
    const int64_t skew = static_cast<int64_t>(reinterpret_cast<uintptr_t>(base) % kLine);
    const int64_t at = max(int64_t{0}, int64_t{line} * kLine - skew);
    if (at < bytes) PrefetchL2Line(base + at);
  }
}

// Every row of the partition as "nothing visible": partials of max -inf
// and sum 0, or with `direct` zeros in out and -inf in lse. All threads.
__device__ __forceinline__ void StoreNothingVisible(const DecodeParams& p, const DecodePlan& plan,
                                                    const DecodeWorkspace& ws,
                                                    const PartitionState& st, bool direct) {
  const int D = p.geo.head_size;
  for (int idx = threadIdx.x; idx < st.rows * D; idx += blockDim.x) {
    const int r = idx / D;
    const int d = idx - r * D;
    StoreRowOut(p, ws, direct, RowOutIndex(p, plan, st, direct, r) + d, 0.0f);
    if (d == 0) StoreRowStats(p, plan, ws, st, direct, r, -INFINITY, 0.0f);
  }
}

// The partition's slice of the block table (PartitionTableSlice, padded
// to a partition's entries) -> blk_s by asynchronous copies, one committed
// group: issued before the sequence's length is known, so the ids arrive
// alongside it instead of one round trip after it. Entries past the
// sequence's end are copied too and never used; entries past the table's
// width become block 0 (never read past the table, and a length past it,
// which only checked mode catches, still reads inside the cache).
__device__ __forceinline__ void CopyTableSlice(const DecodeParams& p, const DecodePlan& plan,
                                               int seq, int part, int* blk_s) {
  const TableSlice slice = PartitionTableSlice(p, plan, seq, part);
  for (int b = threadIdx.x; b < plan.partition_size / p.geo.block_size; b += blockDim.x) {
    const bool in = b < slice.entries;
    CpAsync<4>(blk_s + b, in ? slice.ids + b : p.block_table, in);
  }
  CpAsyncCommit();
}

// Fills the partition's coordinates from blockIdx; false when the
// partition starts past its sequence's end (nothing to do, but for an
// empty sequence's partition-0 block when the reduce kernel is not
// launched: PartitionKernelOwnsOutput, in a kernel that can write its
// output, `kernel_writes_output`, a constant: elsewhere that code is not
// compiled into the prologue). With `early_blk_s`, the partition's block
// ids are copied there while the length loads (CopyTableSlice;
// StageBlockIds then takes them with `copied_early`).
__device__ __forceinline__ bool BeginPartition(const DecodeParams& p, const DecodePlan& plan,
                                               const DecodeWorkspace& ws, PartitionState& st,
                                               bool kernel_writes_output,
                                               int* early_blk_s = nullptr) {
  // As a programmatic dependent (DecodePlan::dependent_launch), the
  // stream's previous kernel may still be writing q, the tables or the cache.
  WaitForPrerequisiteGrid();
  // The reduce grid (a programmatic dependent too) may be scheduled as soon as every partition
  // block has started: its blocks then take SM slots as this grid drains.
  AllowDependentGrid();
  const CacheGeometry& g = p.geo;
  st.part = blockIdx.x;
  st.kvh = blockIdx.y;
  st.seq = blockIdx.z;
  PrefetchPrologueInputs(p, plan, st.seq, st.kvh, st.part, early_blk_s == nullptr);
  if (early_blk_s != nullptr) CopyTableSlice(p, plan, st.seq, st.part, early_blk_s);
  st.len = SequenceLength(p, st.seq);
  st.P = plan.partition_size;
  st.start = st.part * st.P;
  st.group = p.num_q_heads / g.num_kv_heads;
  st.rows = st.group * p.query_len;
  if (st.start >= st.len) {
    if (kernel_writes_output && st.part == 0 && PartitionKernelOwnsOutput(plan)) {
      StoreNothingVisible(p, plan, ws, st, true);
    }
    if (early_blk_s != nullptr) CpAsyncWait<0>();  // nothing in flight at exit
    return false;
  }
  st.n_valid = min(st.P, st.len - st.start);
  st.nblk = (st.n_valid + g.block_size - 1) / g.block_size;
  return true;
}

// The partition's physical block ids -> blk_s (shared by every phase and
// row tile). In checked mode a block id outside [0, num_blocks) is
// reported, the partition's partials are written as "nothing visible" for
// every row (or out and lse, PartitionWritesOutput, where the kernel
// writes them: `kernel_writes_output`, a constant), and false is returned:
// the caller exits without reading any block. All threads must call.
// `copied_early`: blk_s already holds the ids (BeginPartition's
// early_blk_s); only checked mode reads them again, to validate.
__device__ __forceinline__ bool StageBlockIds(const DecodeParams& p, const DecodePlan& plan,
                                              const DecodeWorkspace& ws, const PartitionState& st,
                                              int* blk_s, bool kernel_writes_output,
                                              bool copied_early = false) {
  __shared__ int bad_block;
  const CacheGeometry& g = p.geo;
  const int tid = threadIdx.x;
  const int32_t* table =
      p.block_table + int64_t{st.seq} * p.block_table_stride + st.start / g.block_size;
  if (tid == 0) bad_block = 0;
  if (copied_early) CpAsyncWait<0>();  // CopyTableSlice's group
  __syncthreads();
  // Copied early, the ids are read again only to be validated.
  const int n = copied_early && p.checked == nullptr ? 0 : st.nblk;
  for (int b = tid; b < n; b += blockDim.x) {
    int id = copied_early ? blk_s[b] : __ldg(table + b);
    if (p.checked != nullptr && (id < 0 || id >= g.num_blocks)) {
      ReportFault(p.checked, DeviceFault::kBlockIdOutOfRange, st.seq, id, g.num_blocks);
      bad_block = 1;
      id = 0;
    }
    blk_s[b] = id;
  }
  __syncthreads();
  if (!bad_block) return true;
  StoreNothingVisible(p, plan, ws, st, kernel_writes_output && PartitionWritesOutput(plan, st));
  return false;
}

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

  // With a soft-cap the scaled logit is divided by cap before tanh: fold
  // both into q. ALiBi is added after the cap (CpuBackend::Decode).
  const float q_scale = p.logits_soft_cap > 0.0f ? p.sm_scale / p.logits_soft_cap : p.sm_scale;
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
      const int lo = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
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

// ---- The reduce kernel --------------------------------------------------

// Grid (ceil(num_q_heads / kRows), query_len, num_seqs), one warp per query
// head: warp w of block x merges head x * kRows + w. A row's merge is a
// chain of latencies (the length, the grid wait, the partials, the stores)
// over a few KB, so what counts is how many chains run at once: one block
// per row (128 threads, two channels each) made two waves of blocks at B =
// 512, and its share of the decode was 6-8 us (docs/archive.md, "Reduce
// kernel and direct output"). A lane takes four channels at a time (16-byte loads).
template <int kRows>
__global__ void __launch_bounds__(32 * kRows)
    ReduceKernel(const __grid_constant__ DecodeParams p, const __grid_constant__ DecodePlan plan,
                 const __grid_constant__ DecodeWorkspace ws) {
  constexpr int kChunk = 256;           // partition weights staged at a time (per warp)
  constexpr int kQuads = 256 / 4 / 32;  // 4-channel groups per lane (D <= 256)
  __shared__ float w_s[kRows][kChunk];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int h = blockIdx.x * kRows + warp;
  const int i = blockIdx.y;
  const int s = blockIdx.z;
  const int D = p.geo.head_size;
  const int quads = D / 4;
  const int len = SequenceLength(p, s);
  const int nparts = PartitionCount(plan, len);
  const bool written = PartitionWritesOutput(plan, len);
  const int64_t base = PartialBase(p, plan, s, i, min(h, p.num_q_heads - 1));
  const int64_t row = int64_t{s} * p.query_len + i;
  // Everything above reads the caller's inputs, which were complete before
  // the partition kernel passed its own wait; the partials are its results.
  WaitForPrerequisiteGrid();
  AllowDependentGrid();
  if (written || h >= p.num_q_heads) return;  // by the sequence's one partition; no such head
  // out = acc / total (sum of the weights), lse = m + log(total); total >= 1
  // whenever anything was visible (the partition holding the maximum
  // contributes exp(0) * sum >= 1).
  auto store = [&](const float4(&acc)[kQuads], float total, float m) {
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const int64_t at = row * p.out_stride + int64_t{h} * D;
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) {
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 0, acc[k].x * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 1, acc[k].y * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 2, acc[k].z * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 3, acc[k].w * inv);
      }
    }
    if (p.lse != nullptr && lane == 0) {
      p.lse[row * p.num_q_heads + h] = total > 0.0f ? m + logf(total) : -INFINITY;
    }
  };
  auto fma4 = [](float w, const float4& x, float4& a) {
    a.x = fmaf(w, x.x, a.x);
    a.y = fmaf(w, x.y, a.y);
    a.z = fmaf(w, x.z, a.z);
    a.w = fmaf(w, x.w, a.w);
  };
  float4 acc[kQuads];
#pragma unroll
  for (int k = 0; k < kQuads; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // A few partitions (small batches and short sequences): every input of
  // the merge is loaded at once, each lane taking all the maxima and sums
  // itself (broadcast loads) — one round of loads after the length. The
  // general path below takes three rounds.
  constexpr int kFew = 8;
  if (nparts <= kFew) {
    float pm[kFew], ps[kFew];
    float4 po[kFew][kQuads];
#pragma unroll
    for (int j = 0; j < kFew; ++j) {
      pm[j] = j < nparts ? ws.partial_max[base + j] : -INFINITY;
      ps[j] = j < nparts ? ws.partial_sum[base + j] : 0.0f;
#pragma unroll
      for (int k = 0; k < kQuads; ++k) {
        const int q = lane + 32 * k;
        po[j][k] = j < nparts && q < quads ? LoadFloat4(ws.partial_out + (base + j) * D + 4 * q)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kFew; ++j) m = fmaxf(m, pm[j]);
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < kFew; ++j) {
      // A partition with nothing visible for this row has max -inf, sum 0.
      const float w = pm[j] == -INFINITY ? 0.0f : ps[j] * __expf(pm[j] - m);
      total += w;
#pragma unroll
      for (int k = 0; k < kQuads; ++k) fma4(w, po[j][k], acc[k]);
    }
    store(acc, total, m);
    return;
  }

  float m = -INFINITY;
  for (int j = lane; j < nparts; j += 32) m = fmaxf(m, ws.partial_max[base + j]);
  m = WarpReduceMax(m);
  float wsum = 0.0f;
  for (int c0 = 0; c0 < nparts; c0 += kChunk) {
    const int n = min(kChunk, nparts - c0);
    __syncwarp();  // w_s of the previous chunk is consumed
    for (int j = lane; j < n; j += 32) {
      const float pm = ws.partial_max[base + c0 + j];
      // A partition with nothing visible for this row has max -inf, sum 0.
      const float w = pm == -INFINITY ? 0.0f : ws.partial_sum[base + c0 + j] * __expf(pm - m);
      w_s[warp][j] = w;
      wsum += w;
    }
    __syncwarp();
    const float* po = ws.partial_out + (base + c0) * D;
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) {
        float4 a = acc[k];
        for (int j = 0; j < n; ++j) fma4(w_s[warp][j], LoadFloat4(po + int64_t{j} * D + 4 * q), a);
        acc[k] = a;
      }
    }
  }
  store(acc, WarpReduceSum(wsum), m);
}

// ---- Host side ----------------------------------------------------------

// Raises a kernel's dynamic shared memory limit to `bytes` when it exceeds
// the default 48 KiB: once per (kernel, device, size increase), a host-side
// attribute set, no synchronization.
inline int EnsureDynamicSmem(const void* kernel, size_t bytes, std::atomic<size_t>* configured,
                             int max_devices) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::atomic<size_t>* slot = dev < max_devices ? &configured[dev] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  if (slot != nullptr) {
    size_t cur = slot->load(std::memory_order_relaxed);
    while (cur < bytes && !slot->compare_exchange_weak(cur, bytes)) {
    }
  }
  return cudaSuccess;
}

// A partition kernel: grid (max_partitions, num_kv_heads, num_seqs).
using PartitionKernelFn = void (*)(DecodeParams, DecodePlan, DecodeWorkspace);

// Launches `kernel` with `threads` a block and `smem_bytes` of dynamic
// shared memory, raising its limit first where needed (`configured`: the
// kernel's own per-device record, kMaxSmemDevices entries).
constexpr int kMaxSmemDevices = 64;
inline int LaunchPartitionGrid(PartitionKernelFn kernel, std::atomic<size_t>* configured,
                               const DecodeParams& p, const DecodePlan& plan,
                               const DecodeWorkspace& ws, size_t smem_bytes, cudaStream_t stream,
                               int threads = kThreads) {
  const int err = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), smem_bytes, configured,
                                    kMaxSmemDevices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.max_partitions),
                  static_cast<unsigned>(p.geo.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  return LaunchKernel(kernel, grid, dim3(threads), smem_bytes, stream, plan.dependent_launch, p,
                      plan, ws);
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
