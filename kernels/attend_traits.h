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

// The tile of one block: `rows` query rows (4 warps of `m_tiles` m-tiles
// of 16 rows; a row is a query token of the chunk times a query head of
// the KV head's group, so the group's heads share every K/V byte a block
// reads), `tokens` KV tokens a mainloop step. Two m-tiles a warp let each
// K/V fragment a warp loads from shared memory serve 32 rows; at head size
// 256 one, and 32-token steps, whose FP32 output tile takes twice the
// registers and whose operand tiles twice the shared memory.
struct AttendTile {
  int rows;
  int tokens;
  int threads;
  int m_tiles;
};
KVP_HOST_DEVICE constexpr AttendTile AttendTileFor(int head_size) {
  return head_size <= 64    ? AttendTile{128, 64, 128, 2}
         : head_size <= 128 ? AttendTile{128, 32, 128, 2}
                            : AttendTile{64, 32, 128, 1};
}

// Shared memory of one block, in bytes from the start of the dynamic
// region, each region 128-byte aligned. 16-bit operand tiles have rows
// padded by 16 bytes, so that the eight rows one ldmatrix reads fall into
// eight different 16-byte bank groups at every head size (a row pitch of
// an odd number of 16-byte units).
//   q          [rows][head_size + 8] 16-bit (K's operand type)
//   stage s    (kAttendStages of them): K, V, K scales, V scales as the
//              cache holds them for kCodes sides, or the operand tiles of
//              kBf16 / kFp16 sides
//   k_operand  [tokens][head_size + 8], v_operand [head_size][tokens + 8]
//              (kCodes sides: the converted stage; else absent)
//   scales     FP32 k_scale, k_min, v_scale, v_min [tokens] each
//   q_sum      FP32 [rows]: each row's sum of q (INT4 K's min term)
// Stages of the K/V pipeline: a step's pages are requested one step before
// it runs (three stages measured 3-8% slower on the H100: the step is not
// waiting on its copies).
constexpr int kAttendStages = 2;

struct AttendSmemLayout {
  int64_t q = 0;
  int64_t stage_base = 0, stage_bytes = 0;  // stage s at stage_base + s * stage_bytes
  int64_t stage_k = 0, stage_v = 0, stage_k_scales = 0, stage_v_scales = 0;  // within a stage
  int64_t k_operand = 0, v_operand = 0;
  int64_t scales = 0;
  int64_t q_sum = 0;
  int64_t bytes = 0;
};

KVP_HOST_DEVICE constexpr int64_t AttendAlign(int64_t v) { return (v + 127) / 128 * 128; }

KVP_HOST_DEVICE constexpr AttendSmemLayout AttendLayout(int head_size, OperandKind k,
                                                        OperandKind v) {
  const AttendTile t = AttendTileFor(head_size);
  const int64_t k_tile = int64_t{t.tokens} * (head_size + 8) * 2;
  const int64_t v_tile = int64_t{head_size} * (t.tokens + 8) * 2;
  // Codes of 8 bits or fewer: at most one byte per element; scale entries
  // of at most 4 bytes per token.
  const int64_t k_codes = int64_t{t.tokens} * head_size;
  const int64_t v_codes = int64_t{t.tokens} * head_size;
  const bool k_codes_side = k == OperandKind::kCodes;
  const bool v_codes_side = v == OperandKind::kCodes;
  AttendSmemLayout l;
  int64_t at = 0;
  l.q = at;
  at += AttendAlign(int64_t{t.rows} * (head_size + 8) * 2);
  l.stage_k = 0;
  l.stage_v = AttendAlign(k_codes_side ? k_codes : k_tile);
  l.stage_k_scales = l.stage_v + AttendAlign(v_codes_side ? v_codes : v_tile);
  l.stage_v_scales = l.stage_k_scales + (k_codes_side ? AttendAlign(int64_t{t.tokens} * 4) : 0);
  const int64_t stage_bytes =
      l.stage_v_scales + (v_codes_side ? AttendAlign(int64_t{t.tokens} * 4) : 0);
  l.stage_base = at;
  l.stage_bytes = stage_bytes;
  at += kAttendStages * stage_bytes;
  l.k_operand = at;
  at += k_codes_side ? AttendAlign(k_tile) : 0;
  l.v_operand = at;
  at += v_codes_side ? AttendAlign(v_tile) : 0;
  l.scales = at;
  at += AttendAlign(int64_t{t.tokens} * 4 * 4);
  l.q_sum = at;
  at += AttendAlign(int64_t{t.rows} * 4);
  l.bytes = at;
  return l;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_ATTEND_TRAITS_H_
