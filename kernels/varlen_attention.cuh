// SPDX-License-Identifier: Apache-2.0
// Attention over query chunks on tensor cores (kvp_attend), in the manner
// of FlashAttention-2: a block holds a tile of 128 query rows (query
// tokens of one sequence x the query heads of one KV head's group, so that
// each K/V byte it reads serves the whole group) and walks the tile's
// visible KV tokens in steps, double-buffered through cp.async straight
// from the paged layout: S = Q·Kᵀ (FP32 sums), the logit rules, an online
// softmax, O += P·V. Two mainloops (kernels/attend_traits.h,
// AttendMainloop): mma.sync, each warp 32 rows through ldmatrix from
// padded tiles; or on sm_90a wgmma, each warpgroup 64 rows read by the
// tensor cores from swizzled tiles. Both share everything else, since a
// wgmma accumulator holds each warp's 16 rows in mma.sync's fragment
// layout.
//
// Composed of: the query tile (LoadQueryTile), the K/V stage of a step
// (IssueKvStage; ConvertKvStage for sides of codes), the step
// (ScoreStep, SoftmaxStep, AccumulateStep) and the epilogue (StoreTile).
// Sides are OperandKind (kernels/attend_traits.h); the work items come
// from AttendScheduleKernel (kernels/attend_schedule.cuh). docs/DESIGN.md,
// "Attention over query chunks".
#ifndef KVPAGE_KERNELS_VARLEN_ATTENTION_CUH_
#define KVPAGE_KERNELS_VARLEN_ATTENTION_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/attend_traits.h"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/checked.cuh"
#include "kernels/common/dequant.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/log2_units.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/wgmma.cuh"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace attend {

template <int kD, OperandKind kK, OperandKind kV, AttendMainloop kLoop>
struct VarlenAttention {
  static constexpr bool kWarpgroup = kLoop == AttendMainloop::kWarpgroupMma;
  static constexpr AttendTile kTile = AttendTileFor(kD, kLoop);
  static constexpr int kRows = kTile.rows;
  static constexpr int kTokens = kTile.tokens;
  static constexpr int kThreads = kTile.threads;  // computing threads (the producer aside)
  static constexpr int kStages = kTile.stages;
  // The threads that copy (and convert) a step's pages: all of them
  // (kWarpMma), or the producer warpgroup after the computing ones.
  static constexpr int kCopiers = kWarpgroup ? kTile.producers : kThreads;
  __device__ static unsigned CopierIndex() {
    return kWarpgroup ? threadIdx.x - kThreads : threadIdx.x;
  }
  static constexpr int kQPitch = kD + 8;         // kWarpMma: 16-bit elements a Q and K tile row
  static constexpr int kVPitch = kTokens + 8;    // a V tile channel row
  static constexpr int kMTiles = kTile.m_tiles;  // 16-row m-tiles per warp
  static constexpr int kSlots = 2 * kMTiles;     // rows per thread
  static constexpr int kNTiles = kTokens / 8;    // n-tiles of S per warp
  static constexpr int kDTiles = kD / 8;         // n-tiles of O per warp
  static constexpr bool kKBf16 = kK == OperandKind::kBf16;
  static constexpr bool kVBf16 = kV == OperandKind::kBf16;
  static constexpr bool kKCodes = kK == OperandKind::kCodes;
  static constexpr bool kVCodes = kV == OperandKind::kCodes;
  // The shared-memory layout's offsets (AttendLayout), as scalars: device
  // code reads constexpr scalars, not constexpr struct members.
  struct Layout {
    static constexpr int64_t q = AttendLayout(kD, kK, kV, kLoop).q;
    static constexpr int64_t stage_base = AttendLayout(kD, kK, kV, kLoop).stage_base;
    static constexpr int64_t stage_bytes = AttendLayout(kD, kK, kV, kLoop).stage_bytes;
    static constexpr int64_t stage_k = AttendLayout(kD, kK, kV, kLoop).stage_k;
    static constexpr int64_t stage_v = AttendLayout(kD, kK, kV, kLoop).stage_v;
    static constexpr int64_t stage_k_scales = AttendLayout(kD, kK, kV, kLoop).stage_k_scales;
    static constexpr int64_t stage_v_scales = AttendLayout(kD, kK, kV, kLoop).stage_v_scales;
    static constexpr int64_t k_operand = AttendLayout(kD, kK, kV, kLoop).k_operand;
    static constexpr int64_t v_operand = AttendLayout(kD, kK, kV, kLoop).v_operand;
    static constexpr int64_t scales = AttendLayout(kD, kK, kV, kLoop).scales;
    static constexpr int64_t q_sum = AttendLayout(kD, kK, kV, kLoop).q_sum;
    static constexpr int64_t barriers = AttendLayout(kD, kK, kV, kLoop).barriers;
  };
  static_assert(kD % 16 == 0 && kRows == 16 * kMTiles * (kThreads / 32),
                "a warp owns kMTiles m-tiles of 16 rows");
  static_assert(!kWarpgroup || (AttendWarpgroupServes(kD, kK, kV) && kMTiles == 1 &&
                                kThreads == 256 && kTile.producers == 128),
                "the warpgroup mainloop: two warpgroups, a warp's 16 rows of the products, a "
                "producer warpgroup");
  using Scores = float[kMTiles][kNTiles][4];  // S, then P, of the warp's rows
  using Output = float[kMTiles][kDTiles][4];  // O of the warp's rows

  // Element index of Q tile (row r, channel d), K tile (token t, channel
  // d) and V tile (channel d, token t): padded rows for ldmatrix, or the
  // swizzled panels wgmma reads (kernels/common/wgmma.cuh).
  __device__ static int QAt(int r, int d) {
    return kWarpgroup ? SwizzledIndex(kRows, r, d) : r * kQPitch + d;
  }
  __device__ static int KAt(int t, int d) {
    return kWarpgroup ? SwizzledIndex(kTokens, t, d) : t * kQPitch + d;
  }
  __device__ static int VAt(int d, int t) {
    return kWarpgroup ? SwizzledIndex(kD, d, t) : d * kVPitch + t;
  }

  // Row slot i of a thread: lane / 4 + 8 * (i % 2) of its warp's m-tile
  // i / 2.
  __device__ static int RowOfSlot(int i) {
    return 16 * ((threadIdx.x / 32) * kMTiles + i / 2) + (threadIdx.x % 32) / 4 + 8 * (i % 2);
  }

  // The running softmax state of a thread's rows (what the rules need of
  // a row, its position and window, is recomputed where a step needs a
  // mask: registers are the scarce resource here).
  struct RowState {
    float max[kSlots];      // running max of the log2-scaled logits
    float sum[kSlots];      // this thread's share of the running sum of P
    float min_acc[kSlots];  // this thread's share of sum_j P_j * v_min_j (INT4 V)
    // Over the warp's rows inside the chunk: the earliest position and the
    // latest first visible token. A step within both needs no mask.
    int32_t warp_min_pos;
    int32_t warp_max_lo;
  };

  // A row's place in the sequence: inside the chunk, its position, its
  // first visible token, its query head.
  struct RowInfo {
    bool valid;
    int32_t pos;
    int32_t lo;
    int head;
  };
  __device__ static RowInfo RowInfoOf(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                      int r) {
    const int group = p.num_q_heads / p.geo.num_kv_heads;
    RowInfo ri;
    int32_t token;
    RowCoords(item, group, r, kvh, token, ri.head);
    ri.valid = token < item.query_count;
    ri.pos = item.context - item.query_count + token;
    ri.lo = p.sliding_window > 0 ? ri.pos - p.sliding_window + 1 : 0;
    return ri;
  }

  struct Smem {
    uint8_t* base;
    __device__ uint16_t* q() const { return reinterpret_cast<uint16_t*>(base + Layout::q); }
    __device__ uint8_t* stage(int s) const {
      return base + Layout::stage_base + s * Layout::stage_bytes;
    }
    __device__ uint16_t* k_tile(int s) const {
      return reinterpret_cast<uint16_t*>(kKCodes ? base + Layout::k_operand
                                                 : stage(s) + Layout::stage_k);
    }
    __device__ uint16_t* v_tile(int s) const {
      return reinterpret_cast<uint16_t*>(kVCodes ? base + Layout::v_operand
                                                 : stage(s) + Layout::stage_v);
    }
    // k_scale, k_min, v_scale, v_min [kTokens] each, of the step.
    __device__ float* scales() const { return reinterpret_cast<float*>(base + Layout::scales); }
    __device__ float* q_sum() const { return reinterpret_cast<float*>(base + Layout::q_sum); }
    // kWarpgroupMma: stage s holds its step's pages (the producer's
    // arrivals) / is free again (every computing thread's).
    __device__ uint64_t* full(int s) const {
      return reinterpret_cast<uint64_t*>(base + Layout::barriers) + s;
    }
    __device__ uint64_t* empty(int s) const {
      return reinterpret_cast<uint64_t*>(base + Layout::barriers) + kStages + s;
    }
  };
  // The layout's origin in the dynamic shared memory: its start, or for
  // the swizzled tiles the first 1024-byte boundary.
  __device__ static Smem SmemAt(uint8_t* dynamic) {
    if constexpr (!kWarpgroup) return Smem{dynamic};
    const uint32_t pad = (1024u - (SharedAddress(dynamic) & 1023u)) & 1023u;
    return Smem{dynamic + pad};
  }

  // Packed row r of the item's tile -> query token of the chunk, query head.
  __device__ static void RowCoords(const AttendWorkItem& item, int group, int r, int kvh,
                                   int32_t& token, int& head) {
    const int64_t packed = int64_t{item.tile} * kRows + r;
    token = static_cast<int32_t>(packed / group);
    head = kvh * group + static_cast<int>(packed % group);
  }

  // q (times the key smoothing), rounded to K's operand type, into the Q
  // tile; rows past the chunk are zeros. Then each row's sum (INT4 K).
  __device__ static void LoadQueryTile(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                       const Smem& sm) {
    const int group = p.num_q_heads / p.geo.num_kv_heads;
    for (int u = threadIdx.x; u < kRows * (kD / 2); u += kThreads) {
      const int r = u / (kD / 2), d = 2 * (u % (kD / 2));
      int32_t token;
      int head;
      RowCoords(item, group, r, kvh, token, head);
      float x0 = 0.0f, x1 = 0.0f;
      if (token < item.query_count) {
        const int64_t at = int64_t{item.query_start + token} * p.q_stride + int64_t{head} * kD + d;
        x0 = LoadAsFloat(p.q_dtype, p.q, at);
        x1 = LoadAsFloat(p.q_dtype, p.q, at + 1);
        if (p.key_smoothing != nullptr) {
          x0 *= p.key_smoothing[kvh * kD + d];
          x1 *= p.key_smoothing[kvh * kD + d + 1];
        }
      }
      *reinterpret_cast<uint32_t*>(sm.q() + QAt(r, d)) = PackPair<kKBf16>(x0, x1);
    }
    if constexpr (kWarpgroup) FenceProxyAsyncShared();
    if constexpr (kKCodes) {
      __syncthreads();
      // Two threads a row, each half of it, in a fixed order.
      for (int u = threadIdx.x; u < 2 * kRows; u += kThreads) {
        const int r = u / 2, half = u % 2;
        float s = 0.0f;
        for (int d = half * (kD / 2); d < (half + 1) * (kD / 2); d += 2) {
          const float2 v =
              UnpackPair<false>(*reinterpret_cast<const uint32_t*>(sm.q() + QAt(r, d)));
          s += v.x + v.y;
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (half == 0) sm.q_sum()[r] = s;
      }
    }
  }

  // Block id of table slot `slot` of the item's sequence, or -1 where the
  // slot is past the context or (checked mode: reported) out of range.
  __device__ static int32_t BlockIdAt(const DecodeParams& p, const AttendWorkItem& item,
                                      int32_t slot) {
    if (int64_t{slot} * p.geo.block_size >= item.context) return -1;
    const int32_t id = __ldg(p.block_table + int64_t{item.seq} * p.block_table_stride + slot);
    if (id < 0 || id >= p.geo.num_blocks) {
      ReportFault(p.checked, DeviceFault::kBlockIdOutOfRange, item.seq, id, p.geo.num_blocks);
      return -1;
    }
    return id;
  }

  // Where a thread's copies of one step come from. Each thread copies the
  // same token (K) or the same span of tokens (V, scales) in every one of
  // its copies of a step (the copy index advances by kCopiers, a multiple
  // of the tile's tokens and spans), so it needs one block id per side a
  // step, and its indices are shifts of powers of two. The ids of a step
  // are read a step ahead (StepIds), so that the table's latency hides
  // behind the math instead of holding up the copies.
  __device__ static int KToken() { return CopierIndex() % kTokens; }
  // V: 8 tokens (16 bytes of a channel) a copy for 16-bit sides; for codes
  // pieces of min(16, a block's channel row) bytes.
  __device__ static int CodePieceBytes(const CacheGeometry& g) {
    return min(16, g.block_size * g.v_bits() / 8);
  }
  __device__ static int CodePieces(const CacheGeometry& g) {
    return kTokens * g.v_bits() / 8 / CodePieceBytes(g);  // a power of two dividing kCopiers
  }
  __device__ static int VToken(const CacheGeometry& g) {
    if constexpr (kVCodes) {
      return (CopierIndex() % CodePieces(g)) * CodePieceBytes(g) * 8 / g.v_bits();
    } else {
      return 8 * (CopierIndex() % (kTokens / 8));
    }
  }
  // Scale entries: 16 bytes a copy, the first kTokens * entry / 16 threads.
  __device__ static bool CopiesScales(int entry) {
    return static_cast<int>(CopierIndex()) < kTokens * entry / 16;
  }
  __device__ static int ScaleToken(int entry) { return CopierIndex() * 16 / entry; }

  struct StepIds {
    int32_t k, v, k_scales, v_scales;  // -1: past the context (zeros)
  };
  __device__ static StepIds LoadStepIds(const DecodeParams& p, const AttendWorkItem& item,
                                        int32_t first) {
    const CacheGeometry& g = p.geo;
    const int bs = g.block_size;
    StepIds ids;
    ids.k = BlockIdAt(p, item, (first + KToken()) / bs);
    ids.v = BlockIdAt(p, item, (first + VToken(g)) / bs);
    ids.k_scales = kKCodes && CopiesScales(g.k_scale_entry_bytes())
                       ? BlockIdAt(p, item, (first + ScaleToken(g.k_scale_entry_bytes())) / bs)
                       : -1;
    ids.v_scales = kVCodes && CopiesScales(g.v_scale_entry_bytes())
                       ? BlockIdAt(p, item, (first + ScaleToken(g.v_scale_entry_bytes())) / bs)
                       : -1;
    return ids;
  }

  struct PageSource {
    const uint8_t* base;  // the block's head slice (valid only where `in`)
    int in_block;         // the token's offset inside the block
    bool in;              // inside the context and the table
  };
  __device__ static PageSource SourceOf(const DecodeParams& p, int32_t id, int token,
                                        int64_t region, int64_t block_stride, int64_t head_stride,
                                        int kvh) {
    const uint8_t* base =
        p.layer + region + (id < 0 ? 0 : int64_t{id} * block_stride + kvh * head_stride);
    return {base, token & (p.geo.block_size - 1), id >= 0};
  }

  // cp.async of a step (block ids `ids`) into stage `s`: the operand tiles
  // themselves for 16-bit sides, the cache's codes and scale entries for
  // sides of codes (K as [chunk][token][16 bytes], V as [channel][token
  // codes], scales [token]). Pages past the context land as zeros.
  __device__ static void IssueKvStage(const DecodeParams& p, const StepIds& ids, int kvh,
                                      const Smem& sm, int s) {
    const CacheGeometry& g = p.geo;
    uint8_t* stage = sm.stage(s);
    {  // K: 16-byte chunks of the thread's token.
      const int token = KToken();
      const PageSource src =
          SourceOf(p, ids.k, token, g.k_data_offset(), g.k_block_stride(), g.k_head_stride(), kvh);
      const int chunks = g.k_chunks();
      const int64_t chunk_stride = g.k_chunk_stride();
      for (int c = CopierIndex() / kTokens; c < chunks; c += kCopiers / kTokens) {
        const uint8_t* from = src.base + c * chunk_stride + src.in_block * 16;
        uint8_t* to;
        if constexpr (kKCodes) {
          to = stage + Layout::stage_k + (c * kTokens + token) * 16;
        } else {
          to = reinterpret_cast<uint8_t*>(sm.k_tile(s) + KAt(token, c * 8));
        }
        CpAsync<16>(to, from, src.in);
      }
    }
    {  // V: every channel's row of the thread's span.
      const int token = VToken(g);
      const PageSource src =
          SourceOf(p, ids.v, token, g.v_data_offset(), g.v_block_stride(), g.v_head_stride(), kvh);
      if constexpr (kVCodes) {
        IssueCodeRows(g, src, token, stage + Layout::stage_v);
      } else {
        constexpr int kSpans = kTokens / 8;
        const int64_t channel_stride = g.v_channel_stride();
        for (int d = CopierIndex() / kSpans; d < kD; d += kCopiers / kSpans) {
          CpAsync<16>(sm.v_tile(s) + VAt(d, token),
                      src.base + d * channel_stride + src.in_block * 2, src.in);
        }
      }
    }
    if constexpr (kKCodes) {
      IssueScales(p, ids.k_scales, kvh, g.k_scale_offset(), g.k_scale_block_stride(),
                  g.k_scale_head_stride(), g.k_scale_entry_bytes(), stage + Layout::stage_k_scales);
    }
    if constexpr (kVCodes) {
      IssueScales(p, ids.v_scales, kvh, g.v_scale_offset(), g.v_scale_block_stride(),
                  g.v_scale_head_stride(), g.v_scale_entry_bytes(), stage + Layout::stage_v_scales);
    }
  }

  // V codes of every channel, as [channel][kTokens codes] (8 or 4 bits).
  __device__ static void IssueCodeRows(const CacheGeometry& g, const PageSource& src, int token,
                                       uint8_t* dst) {
    const int bits = g.v_bits();
    const int piece = CodePieceBytes(g);
    const int pieces = CodePieces(g);
    const int64_t channel_stride = g.v_channel_stride();
    const int tile_row = kTokens * bits / 8;
    const int offset = src.in_block * bits / 8;
    const int at = token * bits / 8;
    for (int d = CopierIndex() / pieces; d < kD; d += kCopiers / pieces) {
      uint8_t* to = dst + d * tile_row + at;
      const uint8_t* from = src.base + d * channel_stride + offset;
      if (piece == 16) {
        CpAsync<16>(to, from, src.in);
      } else if (piece == 8) {
        CpAsync<8>(to, from, src.in);
      } else {
        CpAsync<4>(to, from, src.in);
      }
    }
  }

  // The kTokens scale entries of one side (`entry` bytes each).
  __device__ static void IssueScales(const DecodeParams& p, int32_t id, int kvh, int64_t region,
                                     int64_t block_stride, int64_t head_stride, int entry,
                                     uint8_t* dst) {
    if (!CopiesScales(entry)) return;
    const PageSource src =
        SourceOf(p, id, ScaleToken(entry), region, block_stride, head_stride, kvh);
    CpAsync<16>(dst + CopierIndex() * 16, src.base + src.in_block * entry, src.in);
  }

  // The producer warpgroup (kWarpgroupMma): step t's pages are copied into
  // stage t % kStages once both computing warpgroups have released it, and
  // the stage is published (full) a step later, when every producer
  // thread's copies of it have landed and are fenced to the async proxy the
  // products read through; the copies of step t + 1 are in flight
  // meanwhile.
  __device__ static void ProduceSteps(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                      const Smem& sm, int steps) {
    constexpr int kProducerBarrier = 1;
    StepIds ids = LoadStepIds(p, item, item.kv_begin);
    for (int t = 0; t <= steps; ++t) {
      if (t < steps) {  // issue step t
        if (t >= kStages) MbarrierWait(sm.empty(t % kStages), (t / kStages - 1) & 1);
        IssueKvStage(p, ids, kvh, sm, t % kStages);
        if (t + 1 < steps) ids = LoadStepIds(p, item, item.kv_begin + (t + 1) * kTokens);
      }
      CpAsyncCommit();
      if (t == 0) continue;
      const int done = t - 1;  // publish step t - 1
      CpAsyncWait<1>();
      FenceProxyAsyncShared();
      NamedBarrierSync(kProducerBarrier, kCopiers);
      if (CopierIndex() == 0) MbarrierArrive(sm.full(done % kStages));
    }
  }

  // Four codes of a 32-bit word as two FP16 pairs in element order (8-bit
  // codes), or eight (INT4: element 2i is byte i's low nibble).
  __device__ static void CodesToHalves(DType t, uint32_t w, uint32_t (&h)[4]) {
    __half2 a, b;
    if (t == DType::kINT4) {
      __half2 e[4];  // (e0, e4), (e1, e5), (e2, e6), (e3, e7)
      dequant_detail::Int4x8ToHalf2x4(w, e);
      const __half2 pairs[4] = {__lows2half2(e[0], e[1]), __lows2half2(e[2], e[3]),
                                __highs2half2(e[0], e[1]), __highs2half2(e[2], e[3])};
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = *reinterpret_cast<const uint32_t*>(&pairs[i]);
      return;
    }
    if (t == DType::kINT8) {
      dequant_detail::Int8x4ToHalf2x2(w, a, b);
    } else {
      dequant_detail::Fp8x4ToHalf2x2(w, a, b);
    }
    h[0] = *reinterpret_cast<const uint32_t*>(&a);
    h[1] = *reinterpret_cast<const uint32_t*>(&b);
  }

  // Stores the halves of one word of codes at `dst` (4 or 8 values).
  __device__ static void StoreHalves(uint16_t* dst, const uint32_t (&h)[4], bool eight) {
    if (eight) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
    } else {
      *reinterpret_cast<uint2*>(dst) = make_uint2(h[0], h[1]);
    }
  }

  // The staged codes of sides of codes as FP16 operand tiles, and every
  // token's scale entry as floats (zeros past the context).
  __device__ static void ConvertKvStage(const DecodeParams& p, const Smem& sm, int s) {
    const CacheGeometry& g = p.geo;
    const uint8_t* stage = sm.stage(s);
    float* scales = sm.scales();
    if constexpr (kKCodes) {
      const DType t = g.k_dtype;
      const bool eight = t == DType::kINT4;
      const int per_chunk = 128 / g.k_bits();
      // Words as [chunk][token][4]: word w is token (w / 4) % kTokens.
      const uint32_t* words = reinterpret_cast<const uint32_t*>(stage + Layout::stage_k);
      for (int w = CopierIndex(); w < g.k_chunks() * kTokens * 4; w += kCopiers) {
        const int chunk = w / (kTokens * 4), token = (w / 4) % kTokens;
        const int d = chunk * per_chunk + (w % 4) * (eight ? 8 : 4);
        if (d >= kD) continue;  // INT4's zero tail past the head size
        uint32_t h[4];
        CodesToHalves(t, words[w], h);
        StoreHalves(sm.k_tile(s) + KAt(token, d), h, eight);
      }
      ConvertScales(t, stage + Layout::stage_k_scales, scales, scales + kTokens);
    }
    if constexpr (kVCodes) {
      const DType t = g.v_dtype;
      const uint32_t* words = reinterpret_cast<const uint32_t*>(stage + Layout::stage_v);
      if (t == DType::kINT4) {
        ConvertCodeRows<8>(t, words, sm.v_tile(s));
      } else {
        ConvertCodeRows<4>(t, words, sm.v_tile(s));
      }
      ConvertScales(t, stage + Layout::stage_v_scales, scales + 2 * kTokens, scales + 3 * kTokens);
    }
  }

  // V's [channel][kTokens codes] rows, kPerWord codes a 32-bit word, as
  // FP16 operand rows.
  template <int kPerWord>
  __device__ static void ConvertCodeRows(DType t, const uint32_t* words, uint16_t* tile) {
    constexpr int kRowWords = kTokens / kPerWord;
    for (int w = CopierIndex(); w < kD * kRowWords; w += kCopiers) {
      const int channel = w / kRowWords, token = (w % kRowWords) * kPerWord;
      uint32_t h[4];
      CodesToHalves(t, words[w], h);
      StoreHalves(tile + VAt(channel, token), h, kPerWord == 8);
    }
  }

  __device__ static void ConvertScales(DType t, const uint8_t* entries, float* scale, float* min) {
    for (int j = CopierIndex(); j < kTokens; j += kCopiers) {
      const TokenScale ts =
          t == DType::kINT4
              ? TokenScaleFromBits<DType::kINT4>(reinterpret_cast<const uint32_t*>(entries)[j])
              : TokenScaleFromBits<DType::kINT8>(reinterpret_cast<const uint16_t*>(entries)[j]);
      scale[j] = ts.scale;
      min[j] = ts.min;
    }
  }

  // S = Q·Kᵀ for the warp's rows and the step's tokens: each K fragment
  // serves the warp's kMTiles m-tiles.
  __device__ static void ScoreStep(const Smem& sm, int s, Scores& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int mat = lane / 8, mrow = lane % 8;
    const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(sm.q()));
    const uint32_t k_base = static_cast<uint32_t>(__cvta_generic_to_shared(sm.k_tile(s)));
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int row = 16 * (warp * kMTiles + mt) + (mat & 1) * 8 + mrow;
        LoadMatrixX4(a[mt], q_base + 2 * (row * kQPitch + 16 * ks + (mat >> 1) * 8));
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        LoadMatrixX4(b, k_base + 2 * ((16 * np + (mat >> 1) * 8 + mrow) * kQPitch + 16 * ks +
                                      (mat & 1) * 8));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          MmaM16N8K16<kKBf16>(acc[mt][2 * np], a[mt], b[0], b[1]);
          MmaM16N8K16<kKBf16>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // kWarpgroupMma: issues S = Q·Kᵀ of stage s for the warpgroup's 64 rows
  // (the first k-step starts the sums) as one commit group; the caller
  // fences before and waits after.
  __device__ static void IssueScoreProducts(const Smem& sm, int s, Scores& acc) {
    const uint32_t q_base =
        SharedAddress(sm.q()) + 2 * static_cast<uint32_t>(QAt(64 * (threadIdx.x / 128), 0));
    const uint32_t k_base = SharedAddress(sm.k_tile(s));
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      WgmmaM64K16<kTokens, kKBf16>(acc[0], WgmmaDescriptor(q_base + 2 * QAt(0, 16 * ks)),
                                   WgmmaDescriptor(k_base + 2 * KAt(0, 16 * ks)), ks > 0);
    }
    WgmmaCommit();
  }
  // P (the probabilities of S's registers) rounded to V's operand type, as
  // the A operands of the P·V k-steps.
  using Probs = uint32_t[kTokens / 16][4];
  __device__ static void PackProbabilities(const Scores& pw, Probs& a) {
#pragma unroll
    for (int kk = 0; kk < kTokens / 16; ++kk) {
      a[kk][0] = PackPair<kVBf16>(pw[0][2 * kk][0], pw[0][2 * kk][1]);
      a[kk][1] = PackPair<kVBf16>(pw[0][2 * kk][2], pw[0][2 * kk][3]);
      a[kk][2] = PackPair<kVBf16>(pw[0][2 * kk + 1][0], pw[0][2 * kk + 1][1]);
      a[kk][3] = PackPair<kVBf16>(pw[0][2 * kk + 1][2], pw[0][2 * kk + 1][3]);
    }
  }
  // O += P·V of stage s, one commit group.
  __device__ static void IssueValueProducts(const Smem& sm, int s, const Probs& a, Output& out) {
    const uint32_t v_base = SharedAddress(sm.v_tile(s));
#pragma unroll
    for (int kk = 0; kk < kTokens / 16; ++kk) {
      WgmmaM64K16<kD, kVBf16>(out[0], a[kk], WgmmaDescriptor(v_base + 2 * VAt(0, 16 * kk)), true);
    }
    WgmmaCommit();
  }

  // The logit rules on S, then the online softmax: P in place of S (times
  // V's scales for sides of codes), the row state and O rescaled. K's
  // scales (and INT4's min) apply to the columns first. A step that every
  // row of the warp sees whole, without soft-cap or ALiBi (the bulk of a
  // long context), keeps S raw and folds sm_scale * log2(e) into the
  // exponent's FMA; other steps apply every rule (LogitRules).
  __device__ static void SoftmaxStep(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                     const Smem& sm, int32_t first, RowState& rs, Scores& acc,
                                     Output& out) {
    float rescale[kSlots];
    Probabilities(p, item, kvh, sm, first, rs, acc, rescale);
    RescaleOutput(rescale, out);
  }

  // O times each row's rescale factor.
  __device__ static void RescaleOutput(const float (&rescale)[kSlots], Output& out) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        out[i / 2][dt][2 * (i % 2)] *= rescale[i];
        out[i / 2][dt][2 * (i % 2) + 1] *= rescale[i];
      }
    }
  }

  // SoftmaxStep but for O: P in place of S, the row state, and the factor
  // O must be rescaled by before P·V is added.
  __device__ static void Probabilities(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                       const Smem& sm, int32_t first, RowState& rs, Scores& acc,
                                       float (&rescale_out)[kSlots]) {
    const int lane = threadIdx.x % 32;
    const float* scales = sm.scales();
    if constexpr (kKCodes) ScaleKeyColumns(p, sm, acc);
    const bool plain = p.logits_soft_cap == 0.0f && p.alibi_slopes == nullptr &&
                       first + kTokens - 1 <= rs.warp_min_pos && first >= rs.warp_max_lo;
    float scale;  // acc times this is the logit in log2 units
    if (plain) {
      scale = p.sm_scale * kLog2e;
    } else {
      LogitRules(p, item, kvh, first, acc);
      scale = 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int mt = i / 2, h = i % 2;
      float top = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        top = fmaxf(top, fmaxf(acc[mt][n][2 * h], acc[mt][n][2 * h + 1]));
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float next = fmaxf(rs.max[i], top * scale);
      const float base = next == -INFINITY ? 0.0f : next;
      const float rescale = Exp2(rs.max[i] - base);
      rs.max[i] = next;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        acc[mt][n][2 * h] = Exp2(fmaf(acc[mt][n][2 * h], scale, -base));
        acc[mt][n][2 * h + 1] = Exp2(fmaf(acc[mt][n][2 * h + 1], scale, -base));
        sum += acc[mt][n][2 * h] + acc[mt][n][2 * h + 1];
      }
      rs.sum[i] = rs.sum[i] * rescale + sum;
      rs.min_acc[i] *= rescale;
      rescale_out[i] = rescale;
    }
    if constexpr (kVCodes) {
      const bool has_min = p.geo.v_dtype == DType::kINT4;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int col = 8 * n + 2 * (lane % 4);
        const float2 vm = has_min ? *reinterpret_cast<const float2*>(scales + 3 * kTokens + col)
                                  : make_float2(0.0f, 0.0f);
        const float2 vs = *reinterpret_cast<const float2*>(scales + 2 * kTokens + col);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if (has_min) {
            rs.min_acc[2 * mt] =
                fmaf(acc[mt][n][0], vm.x, fmaf(acc[mt][n][1], vm.y, rs.min_acc[2 * mt]));
            rs.min_acc[2 * mt + 1] =
                fmaf(acc[mt][n][2], vm.x, fmaf(acc[mt][n][3], vm.y, rs.min_acc[2 * mt + 1]));
          }
          acc[mt][n][0] *= vs.x;
          acc[mt][n][1] *= vs.y;
          acc[mt][n][2] *= vs.x;
          acc[mt][n][3] *= vs.y;
        }
      }
    }
  }

  // K's per-token scales (and INT4's min times the row's q sum) on the
  // columns of S.
  __device__ static void ScaleKeyColumns(const DecodeParams& p, const Smem& sm, Scores& acc) {
    const int lane = threadIdx.x % 32;
    const float* scales = sm.scales();
    const bool has_min = p.geo.k_dtype == DType::kINT4;
    float q_sum[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) q_sum[i] = has_min ? sm.q_sum()[RowOfSlot(i)] : 0.0f;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int col = 8 * n + 2 * (lane % 4);
      const float2 ks = *reinterpret_cast<const float2*>(scales + col);
      const float2 km = has_min ? *reinterpret_cast<const float2*>(scales + kTokens + col)
                                : make_float2(0.0f, 0.0f);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        acc[mt][n][0] = fmaf(km.x, q_sum[2 * mt], acc[mt][n][0] * ks.x);
        acc[mt][n][1] = fmaf(km.y, q_sum[2 * mt], acc[mt][n][1] * ks.y);
        acc[mt][n][2] = fmaf(km.x, q_sum[2 * mt + 1], acc[mt][n][2] * ks.x);
        acc[mt][n][3] = fmaf(km.y, q_sum[2 * mt + 1], acc[mt][n][3] * ks.y);
      }
    }
  }

  // sm_scale, soft-cap, ALiBi and the masks (causal, sliding window, the
  // context's end) on S (K's scales applied), in log2 units; -inf where
  // masked.
  __device__ static void LogitRules(const DecodeParams& p, const AttendWorkItem& item, int kvh,
                                    int32_t first, Scores& acc) {
    const int lane = threadIdx.x % 32;
    const bool soft_cap = p.logits_soft_cap > 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int mt = i / 2, h = i % 2;
      const RowInfo ri = RowInfoOf(p, item, kvh, RowOfSlot(i));
      const float slope = p.alibi_slopes != nullptr && ri.valid ? p.alibi_slopes[ri.head] : 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int32_t j = first + 8 * n + 2 * (lane % 4) + (e & 1);
          float x = acc[mt][n][e] * p.sm_scale;
          if (soft_cap) x = p.logits_soft_cap * tanhf(x / p.logits_soft_cap);
          x += slope * static_cast<float>(j - ri.pos);
          const bool visible = ri.valid && j <= ri.pos && j >= ri.lo && j < item.context;
          acc[mt][n][e] = visible ? x * kLog2e : -INFINITY;
        }
      }
    }
  }

  // O += P·V, P rounded to V's operand type: each V fragment serves the
  // warp's kMTiles m-tiles.
  __device__ static void AccumulateStep(const Smem& sm, int s, const Scores& pw, Output& out) {
    const int lane = threadIdx.x % 32;
    const int mat = lane / 8, mrow = lane % 8;
    const uint32_t v_base = static_cast<uint32_t>(__cvta_generic_to_shared(sm.v_tile(s)));
#pragma unroll
    for (int kk = 0; kk < kTokens / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = PackPair<kVBf16>(pw[mt][2 * kk][0], pw[mt][2 * kk][1]);
        a[mt][1] = PackPair<kVBf16>(pw[mt][2 * kk][2], pw[mt][2 * kk][3]);
        a[mt][2] = PackPair<kVBf16>(pw[mt][2 * kk + 1][0], pw[mt][2 * kk + 1][1]);
        a[mt][3] = PackPair<kVBf16>(pw[mt][2 * kk + 1][2], pw[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];
        LoadMatrixX4(b, v_base + 2 * ((16 * dp + (mat >> 1) * 8 + mrow) * kVPitch + 16 * kk +
                                      (mat & 1) * 8));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          MmaM16N8K16<kVBf16>(out[mt][2 * dp], a[mt], b[0], b[1]);
          MmaM16N8K16<kVBf16>(out[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // O / sum (plus the V min term) to out and lse, or to the split slot.
  __device__ static void StoreTile(const DecodeParams& p, const AttendWorkspace& ws,
                                   const AttendWorkItem& item, int kvh, const RowState& rs,
                                   const Output& out) {
    const int lane = threadIdx.x % 32;
    const int group = p.num_q_heads / p.geo.num_kv_heads;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int mt = i / 2, h = i % 2;
      float sum = rs.sum[i], min_sum = rs.min_acc[i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      min_sum += __shfl_xor_sync(0xffffffffu, min_sum, 1);
      min_sum += __shfl_xor_sync(0xffffffffu, min_sum, 2);
      const int r = RowOfSlot(i);
      int32_t token;
      int head;
      RowCoords(item, group, r, kvh, token, head);
      if (token >= item.query_count) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const float lse = sum > 0.0f ? (rs.max[i] + log2f(sum)) * kLn2 : -INFINITY;
      if (item.split_slot >= 0) {
        const int64_t row = (int64_t{item.split_slot} * p.geo.num_kv_heads + kvh) * kRows + r;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int d = 8 * dt + 2 * (lane % 4);
          *reinterpret_cast<float2*>(ws.partial_out + row * kD + d) = make_float2(
              (out[mt][dt][2 * h] + min_sum) * inv, (out[mt][dt][2 * h + 1] + min_sum) * inv);
        }
        if (lane % 4 == 0) ws.partial_lse[row] = lse;
        continue;
      }
      const int64_t at = int64_t{item.query_start + token} * p.out_stride + int64_t{head} * kD;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int d = 8 * dt + 2 * (lane % 4);
        StoreFromFloat(p.out_dtype, p.out, at + d, (out[mt][dt][2 * h] + min_sum) * inv);
        StoreFromFloat(p.out_dtype, p.out, at + d + 1, (out[mt][dt][2 * h + 1] + min_sum) * inv);
      }
      if (lane % 4 == 0 && p.lse != nullptr) {
        p.lse[int64_t{item.query_start + token} * p.num_q_heads + head] = lse;
      }
    }
  }

  // Whether the thread's warp (mma.sync) or warpgroup (wgmma) holds a row
  // inside the chunk: the others (a short chunk's or a decoding row's tile)
  // skip the products and the softmax, and keep copying and meeting the
  // barriers.
  __device__ static bool HoldsRows(const DecodeParams& p, const AttendWorkItem& item) {
    const int group = p.num_q_heads / p.geo.num_kv_heads;
    const int64_t rows = int64_t{item.query_count} * group - int64_t{item.tile} * kRows;
    const int first = kWarpgroup ? 64 * (threadIdx.x / 128) : 16 * kMTiles * (threadIdx.x / 32);
    return first < rows;
  }

  __device__ static RowState BeginRows(const DecodeParams& p, const AttendWorkItem& item, int kvh) {
    RowState rs;
    int32_t min_pos = INT32_MAX, max_lo = INT32_MIN;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const RowInfo ri = RowInfoOf(p, item, kvh, RowOfSlot(i));
      rs.max[i] = -INFINITY;
      rs.sum[i] = 0.0f;
      rs.min_acc[i] = 0.0f;
      if (ri.valid) {
        min_pos = min(min_pos, ri.pos);
        max_lo = max(max_lo, ri.lo);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      min_pos = min(min_pos, __shfl_xor_sync(0xffffffffu, min_pos, o));
      max_lo = max(max_lo, __shfl_xor_sync(0xffffffffu, max_lo, o));
    }
    rs.warp_min_pos = min_pos;
    rs.warp_max_lo = max_lo;
    return rs;
  }
};

// One block per (work item, KV head); items past the schedule's count exit.
// The mma.sync mainloop: every thread copies, converts and computes, a
// block barrier between the steps' phases.
template <int kD, OperandKind kK, OperandKind kV>
__global__ void __launch_bounds__(AttendTileFor(kD).threads)
    VarlenAttentionKernel(DecodeParams p, AttendPlan plan, AttendWorkspace ws) {
  using A = VarlenAttention<kD, kK, kV, AttendMainloop::kWarpMma>;
  constexpr int kAttendStages = A::kStages;
  if (static_cast<int32_t>(blockIdx.x) >= ws.counts[0]) return;
  const AttendWorkItem item = ws.items[blockIdx.x];
  const int kvh = blockIdx.y;
  extern __shared__ __align__(128) uint8_t attend_smem[];
  const typename A::Smem sm{attend_smem};

  // The pipeline: step t's pages go to stage t % kAttendStages, requested
  // kAttendStages - 1 steps ahead; one commit group a step (empty past the
  // span), so that "all but kAttendStages - 1 groups landed" always means
  // "this step's pages landed".
  const int steps = (item.kv_end - item.kv_begin + A::kTokens - 1) / A::kTokens;
  typename A::StepIds ids = A::LoadStepIds(p, item, item.kv_begin);
#pragma unroll
  for (int t = 0; t < kAttendStages - 1; ++t) {
    if (t < steps) {
      A::IssueKvStage(p, ids, kvh, sm, t);
      ids = A::LoadStepIds(p, item, item.kv_begin + (t + 1) * A::kTokens);
    }
    CpAsyncCommit();
  }
  A::LoadQueryTile(p, item, kvh, sm);
  __syncthreads();
  typename A::RowState rs = A::BeginRows(p, item, kvh);
  const bool holds_rows = A::HoldsRows(p, item);
  typename A::Output out;
#pragma unroll
  for (int mt = 0; mt < A::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < A::kDTiles; ++dt) {
      out[mt][dt][0] = out[mt][dt][1] = out[mt][dt][2] = out[mt][dt][3] = 0.0f;
    }
  }

  for (int step = 0; step < steps; ++step) {
    const int s = step % kAttendStages;
    const int32_t first = item.kv_begin + step * A::kTokens;
    const int ahead = step + kAttendStages - 1;
    if (ahead < steps) {
      A::IssueKvStage(p, ids, kvh, sm, ahead % kAttendStages);
      if (ahead + 1 < steps)
        ids = A::LoadStepIds(p, item, item.kv_begin + (ahead + 1) * A::kTokens);
    }
    CpAsyncCommit();
    CpAsyncWait<kAttendStages - 1>();
    __syncthreads();
    if constexpr (A::kKCodes || A::kVCodes) {
      A::ConvertKvStage(p, sm, s);
      __syncthreads();
    }
    if (holds_rows) {
      typename A::Scores acc;
      A::ScoreStep(sm, s, acc);
      A::SoftmaxStep(p, item, kvh, sm, first, rs, acc, out);
      A::AccumulateStep(sm, s, acc, out);
    }
    __syncthreads();  // the next step's copies and conversion reuse these buffers
  }
  A::StoreTile(p, ws, item, kvh, rs, out);
}

// The warpgroup mainloop (sm_90a): warpgroup 2 produces the stages,
// warpgroups 0 and 1 consume them, each at its own pace (mbarriers, no
// block barrier after the prologue).
template <int kD, OperandKind kK, OperandKind kV>
__global__ void __launch_bounds__(AttendTileFor(kD, AttendMainloop::kWarpgroupMma).threads +
                                      AttendTileFor(kD, AttendMainloop::kWarpgroupMma).producers,
                                  1)
    WarpSpecializedAttentionKernel(DecodeParams p, AttendPlan plan, AttendWorkspace ws) {
  using A = VarlenAttention<kD, kK, kV, AttendMainloop::kWarpgroupMma>;
  if (static_cast<int32_t>(blockIdx.x) >= ws.counts[0]) return;
  const AttendWorkItem item = ws.items[blockIdx.x];
  const int kvh = blockIdx.y;
  extern __shared__ __align__(128) uint8_t attend_smem[];
  const typename A::Smem sm = A::SmemAt(attend_smem);
  const int steps = (item.kv_end - item.kv_begin + A::kTokens - 1) / A::kTokens;
  if (threadIdx.x == 0) {
    for (int s = 0; s < A::kStages; ++s) {
      MbarrierInit(sm.full(s), 1);
      MbarrierInit(sm.empty(s), A::kThreads);
    }
  }
  if (threadIdx.x < A::kThreads) A::LoadQueryTile(p, item, kvh, sm);
  __syncthreads();
  if (threadIdx.x >= A::kThreads) {
    A::ProduceSteps(p, item, kvh, sm, steps);
    return;
  }
  typename A::RowState rs = A::BeginRows(p, item, kvh);
  typename A::Output out;
#pragma unroll
  for (int dt = 0; dt < A::kDTiles; ++dt) {
    out[0][dt][0] = out[0][dt][1] = out[0][dt][2] = out[0][dt][3] = 0.0f;
  }
  if (!A::HoldsRows(p, item)) {
    // Rows past the chunk: keep pace with the stages, compute nothing.
    for (int step = 0; step < steps; ++step) {
      MbarrierWait(sm.full(step % A::kStages), (step / A::kStages) & 1);
      MbarrierArrive(sm.empty(step % A::kStages));
    }
  } else {
    // One product after the other inside a warpgroup; the other warpgroup's
    // products run beside this one's softmax. (Issuing S_j before P_{j-1}·V
    // to overlap them inside the warpgroup measured slower: docs/archive.md,
    // "Query-chunk attention kernel".)
    for (int step = 0; step < steps; ++step) {
      const int s = step % A::kStages;
      MbarrierWait(sm.full(s), (step / A::kStages) & 1);
      typename A::Scores acc;
      WgmmaFence();
      A::IssueScoreProducts(sm, s, acc);
      WgmmaWait<0>();
      WgmmaPin(acc[0]);
      A::SoftmaxStep(p, item, kvh, sm, item.kv_begin + step * A::kTokens, rs, acc, out);
      typename A::Probs probs;
      A::PackProbabilities(acc, probs);
      WgmmaFence();
      A::IssueValueProducts(sm, s, probs, out);
      WgmmaWait<0>();
      WgmmaPin(out[0]);
      MbarrierArrive(sm.empty(s));
    }
  }
  A::StoreTile(p, ws, item, kvh, rs, out);
}

// The kernel's launcher: grid (plan.max_items, KV heads), its dynamic
// shared memory raised once per device.
template <int kD, OperandKind kK, OperandKind kV, AttendMainloop kLoop>
int LaunchVarlenAttentionOf(const DecodeParams& p, const AttendPlan& plan,
                            const AttendWorkspace& ws, cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> configured[kMaxDevices];
  void (*kernel)(DecodeParams, AttendPlan, AttendWorkspace);
  if constexpr (kLoop == AttendMainloop::kWarpgroupMma) {
    kernel = &WarpSpecializedAttentionKernel<kD, kK, kV>;
  } else {
    kernel = &VarlenAttentionKernel<kD, kK, kV>;
  }
  const int err = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), plan.shared_bytes,
                                    configured, kMaxDevices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.max_items), static_cast<unsigned>(p.geo.num_kv_heads));
  return LaunchKernel(kernel, grid, dim3(plan.threads), plan.shared_bytes, stream, false, p, plan,
                      ws);
}

// The plan's mainloop for one manifest entry. Instantiated per entry in the
// generated units (a __global__ template's launch stub is local to the
// unit that instantiates it, so the launcher is what crosses units).
template <int kD, OperandKind kK, OperandKind kV>
int LaunchVarlenAttention(const DecodeParams& p, const AttendPlan& plan, const AttendWorkspace& ws,
                          cudaStream_t stream) {
  if constexpr (AttendWarpgroupServes(kD, kK, kV)) {
    if (plan.mainloop == static_cast<int32_t>(AttendMainloop::kWarpgroupMma)) {
      return LaunchVarlenAttentionOf<kD, kK, kV, AttendMainloop::kWarpgroupMma>(p, plan, ws,
                                                                                stream);
    }
  }
  return LaunchVarlenAttentionOf<kD, kK, kV, AttendMainloop::kWarpMma>(p, plan, ws, stream);
}

#define KVPAGE_ATTEND_INSTANTIATE(K, V, D)                               \
  template int LaunchVarlenAttention<D, OperandKind::K, OperandKind::V>( \
      const DecodeParams&, const AttendPlan&, const AttendWorkspace&, cudaStream_t);
#define KVPAGE_ATTEND_DECLARE_EXTERN(K, V, D)                                   \
  extern template int LaunchVarlenAttention<D, OperandKind::K, OperandKind::V>( \
      const DecodeParams&, const AttendPlan&, const AttendWorkspace&, cudaStream_t);

}  // namespace attend
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_VARLEN_ATTENTION_CUH_
