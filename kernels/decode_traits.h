// SPDX-License-Identifier: Apache-2.0
// What the host needs to know of each decode kernel, with no CUDA syntax:
// block shape, shared-memory layouts, register budgets (blocks per SM),
// the partition sizes it takes and whether it writes its own output. The
// kernels (paged_decode.cuh, tc_decode.cuh, tc_staged_decode.cuh) lay out
// their memory by these functions, and the decode plan (src/decode_plan.cc)
// sizes their launches by the same ones, through KernelTraits() at the end:
// the one table of the kernels' limits. docs/DESIGN.md, "Decode plan".
#ifndef KVPAGE_KERNELS_DECODE_TRAITS_H_
#define KVPAGE_KERNELS_DECODE_TRAITS_H_

#include <cstdint>

#include "src/geometry.h"
#include "src/manifest.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace decode {

// ---- Thread-group kernel (paged_decode.cuh) ----------------------------

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowTile = 8;  // query rows per pass over the partition

// How the V phase maps 16-byte vectors of a (block, KV head) V region
// ([D][block_size] codes) to threads.
struct VMapping {
  int elems;     // codes per vector: 8 (16-bit), 16 (8-bit), 32 (INT4)
  int tokens;    // consecutive tokens of one channel in a vector
  int channels;  // channels in a vector (elems / tokens)
  int segs;      // vectors per channel row (block_size / tokens)
  int vecs;      // vectors per (block, KV head)
  int team;      // threads per team: min(vecs, kThreads)
  int teams;     // teams, each on different blocks
};

KVP_HOST_DEVICE constexpr VMapping MakeVMapping(const CacheGeometry& g) {
  VMapping m{};
  m.elems = 128 / g.v_bits();
  m.tokens = g.block_size < m.elems ? g.block_size : m.elems;
  m.channels = m.elems / m.tokens;
  m.segs = g.block_size / m.tokens;
  m.vecs = g.head_size * g.block_size * g.v_bits() / 128;
  m.team = m.vecs < kThreads ? m.vecs : kThreads;
  m.teams = kThreads / m.team;
  return m;
}

// Dynamic shared memory of the partition kernel, in 4-byte words; every
// region starts at a 16-byte boundary (float4 reads).
struct SmemLayout {
  int rt;  // rows per tile: min(rows, kRowTile)
  int kd;  // padded q row: k_chunks * k_x
  int q, qsum, row_pos, row_lo, row_slope, row_max, row_sum, row_pm;
  int blk, vscale, vmin, logits, vred;
  int total;
};

KVP_HOST_DEVICE constexpr int AlignWords(int n) { return (n + 3) / 4 * 4; }

KVP_HOST_DEVICE constexpr SmemLayout MakeSmemLayout(const CacheGeometry& g, int rows,
                                                    int partition_size) {
  SmemLayout s{};
  s.rt = rows < kRowTile ? rows : kRowTile;
  s.kd = g.k_chunks() * g.k_x();
  int o = 0;
  s.q = o;
  o += s.rt * s.kd;  // q tile, FP32
  s.qsum = o;
  o += kRowTile;  // sum of each q row (INT4 K min term)
  s.row_pos = o;
  o += kRowTile;  // each row's query position (int)
  s.row_lo = o;
  o += kRowTile;  // first visible token (int)
  s.row_slope = o;
  o += kRowTile;  // ALiBi slope
  s.row_max = o;
  o += kRowTile;
  s.row_sum = o;
  o += kRowTile;
  s.row_pm = o;
  o += kRowTile;  // sum_t p_t * vmin_t
  s.blk = o;
  o += AlignWords(partition_size / g.block_size);  // physical block ids
  s.vscale = o;
  o += partition_size;  // V scale per token (1 for FP16/BF16)
  s.vmin = o;
  o += partition_size;  // V min per token (INT4), else 0
  s.logits = o;
  o += s.rt * partition_size;  // logits, then p * vscale
  s.vred = o;
  o += MakeVMapping(g).teams * s.rt * g.head_size;  // V partial sums per team
  s.total = o;
  return s;
}

// 4 blocks (16 warps) per SM: at most 128 registers a thread. The one-row
// variant, bound by loads in flight, runs 6 (80 registers; 8 spills).
constexpr int kMinBlocksPerSm = 4;
constexpr int kMinBlocksPerSmOneRow = 6;

// The decode kernels' dynamic shared memory starts on a 128-byte boundary
// (partition_common.cuh, SharedWords): bulk and cp.async copies run slower to
// destinations off one.
constexpr int kDecodeSmemAlign = 128;

// ---- Tensor-core kernel, register path and ring (tc_decode.cuh) --------

// Words of a token's scale record in shared memory: {k scale, v scale}
// (INT8/FP8), {k scale, k min, v scale, v min} (INT4), none (16-bit).
KVP_HOST_DEVICE constexpr int TcRecordWords(DType t) {
  return t == DType::kINT4 ? 4 : IsQuantized(t) ? 2 : 0;
}

// Tokens a warp takes per step: four lanes' V spans of 64 / bits tokens.
KVP_HOST_DEVICE constexpr int TcStepTokens(DType t) { return 4 * (64 / DTypeBits(t)); }

// Whether a tensor-core kernel can exist for (dtype, head size): four lanes
// share a token's K row, one 16-byte chunk each, so the chunks must come in
// fours. (Which head sizes are built:
// kernels/manifest.cmake.)
KVP_HOST_DEVICE constexpr bool TcSupports(DType t, int head_size) {
  return head_size % (4 * (128 / DTypeBits(t))) == 0;
}

// Column tiles of 8 query rows per pass for `rows` rows per KV head: one up
// to 8 rows, two (16 rows per pass) beyond.
KVP_HOST_DEVICE constexpr int TcColumnTiles(int rows) { return rows <= 8 ? 1 : 2; }

// Blocks per SM the register budget is cut for: 3 (168 registers) for the one-column-tile kernels
// of head size <= 128 with 16- and 8-bit codes (few spills; 4-7% faster than 2 at B = 512 and MHA);
// 2 (255 registers) elsewhere, INT4 included (its dequantization spilled 232 bytes at 168
// registers; 2 blocks measured 15-25% faster).
KVP_HOST_DEVICE constexpr int TcMinBlocksPerSm(DType t, int head_size, int column_tiles) {
  return t != DType::kINT4 && head_size <= 128 && column_tiles == 1 ? 3 : 2;
}

// Stages of the shared-memory ring that carries each warp's K and V codes
// (cp.async, every lane its own slots) ahead of use, or 0: the codes go
// through registers one step ahead. The ring keeps two steps in flight
// while a third is consumed, and frees the registers the codes held; INT4
// at head size 128 waited on its K codes at every step with registers
// (ncu). Its 102 KB
// (3 stages x 4 warps x 8.5 KB) leave room for two blocks per SM at any
// partition size: the stages carry the scale entries, so no per-partition
// record table is staged. (Other dtypes measured slower with it.)
KVP_HOST_DEVICE constexpr int TcRingStages(DType t, int head_size) {
  return t == DType::kINT4 && head_size <= 128 ? 3 : 0;
}

// Bytes of one ring stage of one warp: every lane's K chunks (16 bytes
// each) and V spans (8 bytes each) of a step, slot-major, so that the 32
// lanes' copies of one slot are adjacent (conflict-free shared loads).
KVP_HOST_DEVICE constexpr int TcRingKSlots(DType t, int head_size) {
  return TcStepTokens(t) / 16 * 2 * (head_size / (128 / DTypeBits(t)) / 4);
}
KVP_HOST_DEVICE constexpr int TcRingVSlots(int head_size) { return head_size / 16 * 2; }
// Bytes of a token's K (or V) scale entry as stored: {scale, min} halves
// (INT4), a scale half (INT8/FP8), none.
KVP_HOST_DEVICE constexpr int TcEntryBytes(DType t) {
  return t == DType::kINT4 ? 4 : IsQuantized(t) ? 2 : 0;
}
// A stage also carries the step's scale entries as stored, K then V, so
// that no per-partition record table is staged (or kept) in shared memory.
KVP_HOST_DEVICE constexpr int TcStageBytes(DType t, int head_size) {
  return 32 * (16 * TcRingKSlots(t, head_size) + 8 * TcRingVSlots(head_size)) +
         2 * TcStepTokens(t) * TcEntryBytes(t);
}

// Shared memory of the tensor-core kernel, in 4-byte words.
struct TcSmemLayout {
  int blk;   // [partition_size / block_size] physical block ids
  int rec;   // [partition_size rounded up to a step][record words]
  int stat;  // [3][kWarps][pass_rows]: each warp's row max (log2 units),
             // sum(p), sum(p * vmin)
  int row;   // [pass_rows][8]: a row's merge coefficients (TcRowMerge)
  int out;   // [kWarps][out_warp]: each warp's O, unnormalized, [pass_rows]
             // [head_size + 4] (rows padded by 4 words: the fragment stores
             // hit 32 banks); with a ring, inside the warp's own ring slice
             // (written once the warp's steps are done)
  int out_warp;
  int ring;  // [kWarps][ring_warp]: each warp's TcRingStages stages
  int ring_warp;
  int total;
};

KVP_HOST_DEVICE constexpr TcSmemLayout MakeTcSmemLayout(const CacheGeometry& g, int partition_size,
                                                        int pass_rows) {
  TcSmemLayout s{};
  const int step = TcStepTokens(g.k_dtype);
  int o = 0;
  s.blk = o;
  o += AlignWords(partition_size / g.block_size);
  s.rec = o;  // none with a ring: its stages carry the scale entries
  if (TcRingStages(g.k_dtype, g.head_size) == 0) {
    o += (partition_size + step - 1) / step * step * TcRecordWords(g.k_dtype);
  }
  s.stat = o;
  o += AlignWords(3 * kWarps * pass_rows);
  s.row = o;
  o += 8 * pass_rows;
  const int out_rows = pass_rows * (g.head_size + 4);
  s.ring = s.out = o;
  s.ring_warp = TcRingStages(g.k_dtype, g.head_size) * TcStageBytes(g.k_dtype, g.head_size) / 4;
  s.out_warp = s.ring_warp > out_rows ? s.ring_warp : out_rows;
  o += kWarps * s.out_warp;
  s.total = o;
  return s;
}

// ---- Staged tensor-core kernel (tc_staged_decode.cuh, sm_90+) ----------

constexpr int kStagedBlockSize = 16;
constexpr int kStagedConsumerWarps = 4;
constexpr int kStagedStageBlocks = kStagedConsumerWarps;  // one block per consumer warp
constexpr int kStagedStageTokens = kStagedStageBlocks * kStagedBlockSize;
constexpr int kStagedStages = 3;
constexpr int kStagedThreads = 32 * (1 + kStagedConsumerWarps);
constexpr int kStagedMaxRows = 8;
constexpr int kStagedBlocksPerSm = 2;

// Whether the staged kernel exists for (K = V dtype, head size, block size)
// and `rows` query rows per KV head (GQA group x query tokens).
KVP_HOST_DEVICE constexpr bool StagedSupports(const CacheGeometry& g, int rows) {
  return g.k_dtype == g.v_dtype && (g.k_dtype == DType::kBF16 || g.k_dtype == DType::kFP16) &&
         g.block_size == kStagedBlockSize && g.head_size == 128 && rows >= 1 &&
         rows <= kStagedMaxRows;
}

// Bytes of one stage: K and V pieces of kStagedStageBlocks blocks.
KVP_HOST_DEVICE constexpr int StagedStageBytes(int head_size) {
  return kStagedStageBlocks * 2 * head_size * kStagedBlockSize * 2;
}
// The partition's block ids, ahead of the stages: a multiple of 128 bytes,
// so that the stages, like the region (SharedWords), start 128-byte
// aligned: bulk copies to destinations 64 bytes past such a boundary took
// BF16 at 128 sequences from 183 to 191 us (H100, docs/archive.md, "Shared-memory alignment").
KVP_HOST_DEVICE constexpr int StagedIdsBytes(int partition_size) {
  return (partition_size / kStagedBlockSize * 4 + kDecodeSmemAlign - 1) / kDecodeSmemAlign *
         kDecodeSmemAlign;
}
KVP_HOST_DEVICE constexpr int StagedSharedBytes(int head_size, int partition_size) {
  return StagedIdsBytes(partition_size) + kStagedStages * StagedStageBytes(head_size);
}

}  // namespace decode

// ---- The table ------------------------------------------------------------

// One row per kernel: what the decode plan sizes a launch by.
struct DecodeKernelTraits {
  int threads;                  // a block's threads
  int32_t max_partition;        // the longest partition of its halves
  int32_t max_third_partition;  // the longest third of the context it takes (0: none past halves)
  int32_t third_step;           // the step a third is rounded up to (0: halves only)
  bool writes_output;           // can write a short sequence's out and lse itself
  int blocks_per_sm;            // resident blocks its register budget is cut for
  int wave_blocks_per_sm;       // blocks per SM the wave model counts as a wave's slots
};

// The traits of `kernel` for geometry `g` and `rows` query rows per KV head
// at capacity (GQA group x query tokens). The partition limits are decisions
// from measurements (docs/DESIGN.md, "Decode plan", gives the evidence):
//   - thread-group: 512-token partitions; 4 blocks an SM (6 for one row);
//   - tensor-core registers: 2048 tokens for 16-bit codes, 4096 for 8-bit
//     (a longer partition amortizes the per-block prologue), and thirds of
//     the context up to 4096 rounded to a 32-token warp step, which fill the
//     gap between two and four partitions a sequence that halving leaves;
//   - tensor-core ring (INT4, head <= 128): 8192 tokens; the wave model
//     counts one block an SM (one streamed as fast as two, and fewer, longer
//     partitions win at small batches); the ring stages carry the scales,
//     so it can write its own output;
//   - staged: 4096 tokens and thirds rounded to a 64-token stage, 2 blocks
//     an SM.
KVP_HOST_DEVICE constexpr DecodeKernelTraits KernelTraits(DecodeKernel kernel,
                                                          const CacheGeometry& g, int rows) {
  using namespace decode;
  switch (kernel) {
    case DecodeKernel::kThreadGroup: {
      const int blocks = rows <= 1 ? kMinBlocksPerSmOneRow : kMinBlocksPerSm;
      return {kThreads, 512, 0, 0, true, blocks, blocks};
    }
    case DecodeKernel::kTensorCoreRegisters: {
      const int blocks = TcMinBlocksPerSm(g.k_dtype, g.head_size, TcColumnTiles(rows));
      const int step = TcStepTokens(g.k_dtype) > kPartitionTokenMultiple ? TcStepTokens(g.k_dtype)
                                                                         : kPartitionTokenMultiple;
      return {kThreads, DTypeBits(g.k_dtype) == 8 ? 4096 : 2048, 4096, step, false, blocks, blocks};
    }
    case DecodeKernel::kTensorCoreRing: {
      const int blocks = TcMinBlocksPerSm(g.k_dtype, g.head_size, TcColumnTiles(rows));
      return {kThreads, 8192, 0, 0, true, blocks, 1};
    }
    case DecodeKernel::kTensorCoreStaged:
      return {kStagedThreads,    4096, 4096, kStagedStageTokens, false, kStagedBlocksPerSm,
              kStagedBlocksPerSm};
  }
  return {};
}

// Whether `kernel`'s code can serve geometry `g` with `rows` rows per KV
// head at all (whether this build holds it is the manifest's word,
// src/manifest.h).
KVP_HOST_DEVICE constexpr bool KernelServes(DecodeKernel kernel, const CacheGeometry& g, int rows) {
  using namespace decode;
  switch (kernel) {
    case DecodeKernel::kThreadGroup:
      return true;
    case DecodeKernel::kTensorCoreRegisters:
    case DecodeKernel::kTensorCoreRing:
      return g.k_dtype == g.v_dtype && TcSupports(g.k_dtype, g.head_size) &&
             (TcRingStages(g.k_dtype, g.head_size) > 0) ==
                 (kernel == DecodeKernel::kTensorCoreRing);
    case DecodeKernel::kTensorCoreStaged:
      return StagedSupports(g, rows);
  }
  return false;
}

// Dynamic shared memory of `kernel` for `rows` query rows per block and a
// partition of `partition_size` tokens.
KVP_HOST_DEVICE constexpr int64_t KernelSharedBytes(DecodeKernel kernel, const CacheGeometry& g,
                                                    int rows, int32_t partition_size) {
  using namespace decode;
  if (rows < 1) rows = 1;
  switch (kernel) {
    case DecodeKernel::kThreadGroup:
      return 4 * int64_t{MakeSmemLayout(g, rows, partition_size).total};
    case DecodeKernel::kTensorCoreRegisters:
    case DecodeKernel::kTensorCoreRing:
      return 4 * int64_t{MakeTcSmemLayout(g, partition_size, 8 * TcColumnTiles(rows)).total};
    case DecodeKernel::kTensorCoreStaged:
      return StagedSharedBytes(g.head_size, partition_size);
  }
  return 0;
}

// Whether this build holds `kernel` for `g` and `rows`: its code serves the
// geometry and the manifest (kernels/manifest.cmake) instantiated it.
KVP_HOST_DEVICE constexpr bool KernelBuilt(DecodeKernel kernel, const CacheGeometry& g, int rows) {
  switch (kernel) {
    case DecodeKernel::kThreadGroup:
      return ManifestHasDecode(DecodeFamily::kThreadGroup, g.k_dtype, g.head_size);
    case DecodeKernel::kTensorCoreRegisters:
    case DecodeKernel::kTensorCoreRing:
      return KernelServes(kernel, g, rows) && ManifestHasTcBlockSize(g.block_size) &&
             ManifestHasDecode(DecodeFamily::kTensorCore, g.k_dtype, g.head_size);
    case DecodeKernel::kTensorCoreStaged:
      return KernelServes(kernel, g, rows) &&
             ManifestHasDecode(DecodeFamily::kStaged, g.k_dtype, g.head_size);
  }
  return false;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_DECODE_TRAITS_H_
