// SPDX-License-Identifier: Apache-2.0
// What the query-chunk attention kernel (kernels/varlen_attention.cuh) is
// built from, as plain constexpr data the plan (src/decode_plan.cc) and the
// kernel share: how each side feeds the tensor cores, the tile shape per
// head size and the shared-memory layout. No CUDA syntax.
#ifndef KVPAGE_KERNELS_ATTEND_TRAITS_H_
#define KVPAGE_KERNELS_ATTEND_TRAITS_H_

#include <cstdint>

#include "src/geometry.h"

namespace kvpage {
namespace kernels {

// How the K side (Q·Kᵀ) or the V side (P·V) of the attention kernel feeds
// its mma.sync products; a compile-time choice per side, so that mixed K/V
// dtypes compose from the same two halves.
//   kBf16, kFp16  the cache holds the operands: cp.async copies the pages
//                 straight into the operand tiles;
//   kCodes        FP8 / INT8 / INT4: the pages land in staging buffers and
//                 a conversion pass writes their codes as FP16 operands
//                 (exact: docs/FORMATS.md); the per-token scales (and
//                 INT4's min) apply outside the products, to the columns
//                 of S (K) and to P before it is rounded (V). Which of the
//                 three is a run-time value, read once per tile.
enum class OperandKind : int32_t { kBf16 = 0, kFp16 = 1, kCodes = 2 };

KVP_HOST_DEVICE constexpr OperandKind OperandKindOf(DType t) {
  return t == DType::kBF16   ? OperandKind::kBf16
         : t == DType::kFP16 ? OperandKind::kFp16
                             : OperandKind::kCodes;
}

// The mainloop of the attention kernel, by the tensor-core instruction it
// is built on (the plan picks one per device and head size):
//   kWarpMma        mma.sync m16n8k16 (sm_80+), each warp its own rows;
//                   operands through ldmatrix from padded tiles;
//   kWarpgroupMma   wgmma (sm_90a), warp-specialized: a producer
//                   warpgroup copies the pages into stages, two warpgroups
//                   of 64 rows each compute, paced by mbarriers alone, so
//                   one's softmax runs beside the other's products; Q, K
//                   and V read by the tensor cores from 128-byte-swizzled
//                   tiles (kernels/common/wgmma.cuh), P from registers.
//                   Head sizes 64 and 128 (64-column panels; 256 would
//                   leave no registers), BF16/FP16 K and V: sides of codes
//                   measured slower converted by the producer warpgroup
//                   than on kWarpMma (docs/archive.md, "Query-chunk
//                   attention kernel").
enum class AttendMainloop : int32_t { kWarpMma = 0, kWarpgroupMma = 1 };

// The tile of one block: `rows` query rows (a row is a query token of the
// chunk times a query head of the KV head's group, so the group's heads
// share every K/V byte a block reads), `tokens` KV tokens a mainloop step,
// `threads` computing (and `producers` more copying), `m_tiles` m-tiles of
// 16 rows a warp, and `stages` of the K/V pipeline.
//   kWarpMma: 4 warps of 2 m-tiles, so that each K/V fragment a warp loads
//     from shared memory serves 32 rows; at head size 256 one, and 32-token
//     steps, whose FP32 output tile takes twice the registers and whose
//     operand tiles twice the shared memory.
//     Two stages: a step's pages are requested one step before it runs
//     (three measured 3-8% slower on the H100: the step is not waiting on
//     its copies).
//   kWarpgroupMma: 2 warpgroups of 64 rows (each warp 16 rows of the
//     accumulators) and a producer warpgroup; 64-token steps (at head size
//     128 S = 32 and O = 64 registers a thread: 384 threads leave 168);
//     three stages, so that the producer runs a step ahead of the slower
//     warpgroup while the faster one may be a step ahead of it.
struct AttendTile {
  int rows;
  int tokens;
  int threads;
  int m_tiles;
  int producers;
  int stages;
};
KVP_HOST_DEVICE constexpr AttendTile AttendTileFor(int head_size,
                                                   AttendMainloop loop = AttendMainloop::kWarpMma) {
  return loop == AttendMainloop::kWarpgroupMma ? AttendTile{128, 64, 256, 1, 128, 3}
         : head_size <= 64                     ? AttendTile{128, 64, 128, 2, 0, 2}
         : head_size <= 128                    ? AttendTile{128, 32, 128, 2, 0, 2}
                                               : AttendTile{64, 32, 128, 1, 0, 2};
}

KVP_HOST_DEVICE constexpr bool AttendWarpgroupServes(int head_size, OperandKind k, OperandKind v) {
  return (head_size == 64 || head_size == 128) && k != OperandKind::kCodes &&
         v != OperandKind::kCodes;
}

// Shared memory of one block, in bytes from the start of the dynamic
// region. kWarpMma: each region 128-byte aligned; 16-bit operand tiles
// have rows padded by 16 bytes, so that the eight rows one ldmatrix reads
// fall into eight different 16-byte bank groups at every head size (a row
// pitch of an odd number of 16-byte units). kWarpgroupMma: each region
// 1024-byte aligned, operand tiles unpadded and swizzled (the swizzle
// spreads the rows over the banks).
//   q          [rows][head_size (+ 8)] 16-bit (K's operand type)
//   stage s    (`stages` of them): K, V, K scales, V scales as the
//              cache holds them for kCodes sides, or the operand tiles of
//              kBf16 / kFp16 sides
//   k_operand  [tokens][head_size (+ 8)], v_operand [head_size][tokens (+ 8)]
//              (kCodes sides: the converted stage; else absent)
//   scales     FP32 k_scale, k_min, v_scale, v_min [tokens] each
//              (kWarpMma; the warpgroup mainloop serves 16-bit sides)
//   q_sum      FP32 [rows]: each row's sum of q (INT4 K's min term)
//   barriers   kWarpgroupMma: mbarriers full[stages], empty[stages]
// kWarpgroupMma's regions start at the first 1024-byte boundary of the
// dynamic shared memory (the swizzle is of absolute addresses): its
// `bytes` hold 1024 more for that.

struct AttendSmemLayout {
  int64_t q = 0;
  int64_t stage_base = 0, stage_bytes = 0;  // stage s at stage_base + s * stage_bytes
  int64_t stage_k = 0, stage_v = 0, stage_k_scales = 0, stage_v_scales = 0;  // within a stage
  int64_t k_operand = 0, v_operand = 0;
  int64_t scales = 0;
  int64_t q_sum = 0;
  int64_t barriers = 0;
  int64_t bytes = 0;
};

KVP_HOST_DEVICE constexpr int64_t AttendAlignTo(int64_t bytes, int64_t align) {
  return (bytes + align - 1) / align * align;
}

KVP_HOST_DEVICE constexpr AttendSmemLayout AttendLayout(
    int head_size, OperandKind k, OperandKind v, AttendMainloop loop = AttendMainloop::kWarpMma) {
  const AttendTile t = AttendTileFor(head_size, loop);
  const bool swizzled = loop == AttendMainloop::kWarpgroupMma;
  const int pad = swizzled ? 0 : 8;
  const int64_t align = swizzled ? 1024 : 128;
  const int64_t k_tile = int64_t{t.tokens} * (head_size + pad) * 2;
  const int64_t v_tile = int64_t{head_size} * (t.tokens + pad) * 2;
  // Codes of 8 bits or fewer: at most one byte per element; scale entries
  // of at most 4 bytes per token.
  const int64_t k_codes = int64_t{t.tokens} * head_size;
  const int64_t v_codes = int64_t{t.tokens} * head_size;
  const bool k_codes_side = k == OperandKind::kCodes;
  const bool v_codes_side = v == OperandKind::kCodes;
  AttendSmemLayout l;
  int64_t at = 0;
  l.q = at;
  at += AttendAlignTo(int64_t{t.rows} * (head_size + pad) * 2, align);
  l.stage_k = 0;
  l.stage_v = AttendAlignTo(k_codes_side ? k_codes : k_tile, align);
  l.stage_k_scales = l.stage_v + AttendAlignTo(v_codes_side ? v_codes : v_tile, align);
  l.stage_v_scales =
      l.stage_k_scales + (k_codes_side ? AttendAlignTo(int64_t{t.tokens} * 4, align) : 0);
  const int64_t stage_bytes =
      l.stage_v_scales + (v_codes_side ? AttendAlignTo(int64_t{t.tokens} * 4, align) : 0);
  l.stage_base = at;
  l.stage_bytes = stage_bytes;
  at += t.stages * stage_bytes;
  l.k_operand = at;
  at += k_codes_side ? AttendAlignTo(k_tile, align) : 0;
  l.v_operand = at;
  at += v_codes_side ? AttendAlignTo(v_tile, align) : 0;
  l.scales = at;
  at += swizzled ? 0 : AttendAlignTo(int64_t{t.tokens} * 4 * 4, align);
  l.q_sum = at;
  at += AttendAlignTo(int64_t{t.rows} * 4, align);
  l.barriers = at;
  at += swizzled ? AttendAlignTo(2 * t.stages * 8, align) : 0;
  l.bytes = at + (swizzled ? 1024 : 0);
  return l;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_ATTEND_TRAITS_H_
