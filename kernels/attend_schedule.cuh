// SPDX-License-Identifier: Apache-2.0
// The small kernels around kvp_attend's attention kernel (docs/DESIGN.md,
// "Attention over query chunks"):
//   AttendScheduleKernel  block 0: reads the batch's query offsets and
//                         context lengths, checks them, and writes the work
//                         items (query tile x span of KV tokens) the
//                         attention grid runs, splitting the contexts when
//                         the tiles alone would leave the GPU idle; with
//                         decode rows (AttendPlan::decode_rows), block 1 + s
//                         gathers sequence s's query if it is one;
//   AttendFinishKernel    combines the partial results of split tiles by
//                         their log-sum-exp, and moves the decode rows'
//                         results, which the decode kernel wrote by
//                         sequence, to their tokens (one launch for both).
// All run on the device, so one captured graph serves every batch.
#ifndef KVPAGE_KERNELS_ATTEND_SCHEDULE_CUH_
#define KVPAGE_KERNELS_ATTEND_SCHEDULE_CUH_

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/attend_split.h"
#include "kernels/common/checked.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace attend {

constexpr int kScheduleThreads = 256;

// Sequence s's chunk (kernels/attend_split.h), or none where the batch's
// values are out of range (reported in checked mode).
__device__ __forceinline__ SequenceChunk ReadSequenceChunk(const DecodeParams& p, int32_t s) {
  SequenceChunk c;
  const int32_t begin = p.query_starts[s];
  const int32_t end = p.query_starts[s + 1];
  const int32_t len = p.seq_lens[s];
  const int64_t len_limit =
      min(int64_t{p.max_context_len}, int64_t{p.block_table_width} * p.geo.block_size);
  if (begin < 0 || begin > p.max_query_tokens || (s == 0 && begin != 0)) {
    ReportFault(p.checked, DeviceFault::kQueryStartOutOfRange, s, begin, p.max_query_tokens);
    return c;
  }
  if (end < begin || end > p.max_query_tokens) {
    ReportFault(p.checked, DeviceFault::kQueryStartOutOfRange, s + 1, end, p.max_query_tokens);
    return c;
  }
  if (len < 0 || len > len_limit) {
    ReportFault(p.checked, DeviceFault::kSeqLenOutOfRange, s, len, len_limit);
    return c;
  }
  if (end - begin > len) {
    ReportFault(p.checked, DeviceFault::kQueryPastContext, s, end - begin, len);
    return c;
  }
  c.start = begin;
  c.count = end - begin;
  c.context = len;
  return c;
}

// n elements of `dtype` (16 or 32 bits) from src[src_at..] to dst[dst_at..],
// strided over the block's threads.
__device__ __forceinline__ void CopyElements(DType dtype, void* dst, int64_t dst_at,
                                             const void* src, int64_t src_at, int64_t n) {
  if (DTypeBits(dtype) == 32) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      static_cast<uint32_t*>(dst)[dst_at + i] = static_cast<const uint32_t*>(src)[src_at + i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      static_cast<uint16_t*>(dst)[dst_at + i] = static_cast<const uint16_t*>(src)[src_at + i];
    }
  }
}

// Sequence s's part of the decode rows' batch: its context if it is a
// decode row (else 0, which the decode kernel skips), and its query token's
// num_q_heads x head_size values at row s of a dense array. (Block 0 of the
// schedule reports the batch's bad values; this reads them quietly.)
__device__ __forceinline__ void GatherDecodeRow(const DecodeParams& p, const AttendPlan& plan,
                                                const AttendWorkspace& ws, int32_t s) {
  DecodeParams quiet = p;
  quiet.checked = nullptr;
  const SequenceChunk c = ReadSequenceChunk(quiet, s);
  const bool row = IsDecodeRow(plan, c);
  if (threadIdx.x == 0) ws.decode_lens[s] = row ? c.context : 0;
  if (!row) return;
  const int64_t n = int64_t{p.num_q_heads} * p.geo.head_size;
  CopyElements(p.q_dtype, ws.decode_q, s * n, p.q, c.start * p.q_stride, n);
}

// The schedule's view of up to kScheduleThreads consecutive sequences
// (base ..): their chunks and, for the tile-parallel loops, the running
// count of their query tiles (tile_end[i]: the tiles of sequences base ..
// base + i). A block-wide loop over the group's tiles then gives each
// thread tiles of any sequence, so that one long chunk's tiles are not one
// thread's serial work.
struct ScheduleGroup {
  int32_t start[kScheduleThreads], count[kScheduleThreads], context[kScheduleThreads];
  int32_t tile_end[kScheduleThreads];

  __device__ __forceinline__ SequenceChunk Chunk(int32_t i) const {
    SequenceChunk c;
    c.start = start[i];
    c.count = count[i];
    c.context = context[i];
    return c;
  }
};

struct ScheduleShared {
  using Reduce = cub::BlockReduce<long long, kScheduleThreads>;
  using Scan = cub::BlockScan<int32_t, kScheduleThreads>;
  union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } temp;
  ScheduleGroup group;
  long long total;
  int32_t carry, merges;
  int32_t loaded_base, loaded_tiles;  // the group sh.group holds (-1: none)
};

// Reads sequences base .. into sh.group (quietly unless `report`: block 0's
// first pass reports the batch's bad values) and returns the group's tiles;
// a batch of one group is read once for every pass. Ends with a barrier;
// the caller's previous reads of the group must be behind one too.
__device__ __forceinline__ int32_t LoadScheduleGroup(const DecodeParams& p, const AttendPlan& plan,
                                                     int32_t heads_per_kv, int32_t base,
                                                     bool report, ScheduleShared& sh) {
  if (sh.loaded_base == base) return sh.loaded_tiles;
  const int32_t s = base + static_cast<int32_t>(threadIdx.x);
  SequenceChunk c;
  if (s < p.num_seqs) {
    DecodeParams quiet = p;
    if (!report) quiet.checked = nullptr;
    c = ReadSequenceChunk(quiet, s);
  }
  int32_t end = 0, tiles = 0;
  ScheduleShared::Scan(sh.temp.scan).InclusiveSum(TilesOf(plan, c, heads_per_kv), end, tiles);
  sh.group.start[threadIdx.x] = c.start;
  sh.group.count[threadIdx.x] = c.count;
  sh.group.context[threadIdx.x] = c.context;
  sh.group.tile_end[threadIdx.x] = end;
  if (threadIdx.x == 0) {
    sh.loaded_base = base;
    sh.loaded_tiles = tiles;
  }
  __syncthreads();
  return tiles;
}

// Tile g of the group: its sequence's index in the group and its tile
// number, counted last first within the sequence (the order the items are
// written in).
struct GroupTile {
  int32_t seq;
  int32_t tile;
};
__device__ __forceinline__ GroupTile LocateGroupTile(const ScheduleGroup& gr, int32_t g) {
  int32_t lo = 0, hi = kScheduleThreads - 1;
  while (lo < hi) {  // the first sequence whose tiles end past g
    const int32_t mid = (lo + hi) / 2;
    if (gr.tile_end[mid] > g) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int32_t last = gr.tile_end[lo] - 1;  // the sequence's last tile, as g counts
  return {lo, last - g};
}

// The batch's tile steps (what = 0) or its items with spans of `chunk`
// steps (what = 1), summed over the block (every thread gets it).
__device__ __forceinline__ long long SumOverTiles(const DecodeParams& p, const AttendPlan& plan,
                                                  int32_t heads_per_kv, bool items, int32_t chunk,
                                                  ScheduleShared& sh) {
  long long sum = 0;
  for (int32_t base = 0; base < p.num_seqs; base += kScheduleThreads) {
    __syncthreads();  // the previous group's readers are done
    const int32_t tiles = LoadScheduleGroup(p, plan, heads_per_kv, base, false, sh);
    for (int32_t g = threadIdx.x; g < tiles; g += kScheduleThreads) {
      const GroupTile gt = LocateGroupTile(sh.group, g);
      const int32_t steps =
          StepsOf(plan, TileKvSpan(p, plan, sh.group.Chunk(gt.seq), heads_per_kv, gt.tile));
      sum += items ? SplitsOf(steps, chunk) : steps;
    }
  }
  __syncthreads();
  const long long all = ScheduleShared::Reduce(sh.temp.reduce).Sum(sum);
  if (threadIdx.x == 0) sh.total = all;
  __syncthreads();
  return sh.total;
}

// The split span of the batch (ChooseSplitSpan), its sums taken over the
// batch's tiles by the block.
__device__ __forceinline__ int32_t SplitChunk(const DecodeParams& p, const AttendPlan& plan,
                                              int32_t heads_per_kv, long long tiles,
                                              ScheduleShared& sh) {
  if (plan.split_items <= tiles || tiles == 0) return INT_MAX;
  const long long steps = SumOverTiles(p, plan, heads_per_kv, false, 0, sh);
  return ChooseSplitSpan(plan, tiles, steps, [&](int32_t chunk) {
    return SumOverTiles(p, plan, heads_per_kv, true, chunk, sh);
  });
}

// Writes the work items: sequence order, each sequence's tiles last first
// (the longest spans of a causal chunk start first), a tile's items in KV
// order, offsets by block-wide scans over the tiles; split tiles get a
// merge entry.
__device__ __forceinline__ void WriteWorkItems(const DecodeParams& p, const AttendPlan& plan,
                                               const AttendWorkspace& ws, int32_t heads_per_kv,
                                               int32_t chunk, ScheduleShared& sh) {
  for (int32_t base = 0; base < p.num_seqs; base += kScheduleThreads) {
    __syncthreads();  // the previous group's readers are done
    const int32_t tiles = LoadScheduleGroup(p, plan, heads_per_kv, base, false, sh);
    for (int32_t g0 = 0; g0 < tiles; g0 += kScheduleThreads) {
      const int32_t g = g0 + static_cast<int32_t>(threadIdx.x);
      GroupTile gt{0, 0};
      TileSpan span{0, 0};
      int32_t splits = 0;
      if (g < tiles) {
        gt = LocateGroupTile(sh.group, g);
        span = TileKvSpan(p, plan, sh.group.Chunk(gt.seq), heads_per_kv, gt.tile);
        splits = SplitsOf(StepsOf(plan, span), chunk);
      }
      int32_t offset = 0, all = 0;
      ScheduleShared::Scan(sh.temp.scan).ExclusiveSum(splits, offset, all);
      offset += sh.carry;
      if (g < tiles) {
        const SequenceChunk c = sh.group.Chunk(gt.seq);
        const int32_t s = base + gt.seq;
        if (splits > 1) {
          const int32_t m = atomicAdd(&sh.merges, 1);
          ws.merges[m] = AttendMerge{s, gt.tile, offset, splits};
        }
        for (int32_t j = 0; j < splits; ++j) {
          AttendWorkItem item;
          item.seq = s;
          item.tile = gt.tile;
          item.query_start = c.start;
          item.query_count = c.count;
          item.context = c.context;
          item.kv_begin = span.begin + j * chunk * plan.tile_tokens;
          item.kv_end =
              chunk == INT_MAX ? span.end : min(span.end, item.kv_begin + chunk * plan.tile_tokens);
          item.split_slot = splits > 1 ? offset + j : -1;
          ws.items[offset + j] = item;
        }
      }
      __syncthreads();  // every thread has read `carry` and the scan's storage
      if (threadIdx.x == 0) sh.carry += all;
      __syncthreads();
    }
  }
}

// Block 0 of the schedule launch (kScheduleThreads threads): checks the
// batch (reporting its first bad value in checked mode), counts its query
// tiles, picks the split span (SplitChunk) and writes the work items and
// merges, every pass a loop over the batch's tiles shared by the block;
// blocks 1 + s gather decode row s.
__global__ void __launch_bounds__(kScheduleThreads)
    AttendScheduleKernel(DecodeParams p, AttendPlan plan, AttendWorkspace ws) {
  __shared__ ScheduleShared sh;
  if (blockIdx.x > 0) {
    GatherDecodeRow(p, plan, ws, static_cast<int32_t>(blockIdx.x) - 1);
    return;
  }
  const int32_t heads_per_kv = p.num_q_heads / p.geo.num_kv_heads;
  if (threadIdx.x == 0) sh.loaded_base = -1;
  long long tiles = 0;
  for (int32_t base = 0; base < p.num_seqs; base += kScheduleThreads) {
    __syncthreads();
    tiles += LoadScheduleGroup(p, plan, heads_per_kv, base, true, sh);
  }
  if (threadIdx.x == 0) {
    sh.carry = 0;
    sh.merges = 0;
  }
  const int32_t chunk = SplitChunk(p, plan, heads_per_kv, tiles, sh);
  WriteWorkItems(p, plan, ws, heads_per_kv, chunk, sh);
  if (threadIdx.x == 0) {
    ws.counts[0] = sh.carry;
    ws.counts[1] = sh.merges;
  }
}

// A block per (split tile, KV head, group of kMergeRows rows), a warp per
// row (a warp for each, so that every row's loads are in flight at once): out = sum_j w_j out_j /
// sum_j w_j with w_j = exp(lse_j - max lse), lse = max + log(sum w). A lane holds four channels
// (eight at head size 256); the splits' loads are independent, so they overlap. Rows with no
// visible token in any split get zeros and -inf.
constexpr int kFinishThreads = 128;
constexpr int kMergeRows = kFinishThreads / 32;

__device__ __forceinline__ void MergeSplitRows(const DecodeParams& p, const AttendPlan& plan,
                                               const AttendWorkspace& ws, int32_t split, int kvh,
                                               int row_group) {
  if (split >= ws.counts[1]) return;
  const AttendMerge m = ws.merges[split];
  const int D = p.geo.head_size;
  const int32_t group = p.num_q_heads / p.geo.num_kv_heads;
  const AttendWorkItem& first = ws.items[m.first_slot];
  const int64_t rows = int64_t{first.query_count} * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = row_group * kMergeRows + warp; r < (row_group + 1) * kMergeRows;
       r += kFinishThreads / 32) {
    const int64_t packed = int64_t{m.tile} * plan.tile_rows + r;
    if (r >= plan.tile_rows || packed >= rows) break;
    const int64_t token = first.query_start + packed / group;
    const int head = kvh * group + static_cast<int>(packed % group);
    const int64_t row0 = (int64_t{m.first_slot} * p.geo.num_kv_heads + kvh) * plan.tile_rows + r;
    const int64_t split_stride = int64_t{p.geo.num_kv_heads} * plan.tile_rows;
    // The lanes load the splits' lse values together (lane j: splits j,
    // j + 32, ...), so that the row costs one round trip for them, not one
    // a split; lane j keeps split j's weight for the channel loop.
    float top = -INFINITY;
    for (int j = lane; j < m.num_splits; j += 32) {
      top = fmaxf(top, ws.partial_lse[row0 + j * split_stride]);
    }
    top = WarpReduceMax(top);
    float total = 0.0f, mine = 0.0f;
    for (int j = lane; j < m.num_splits; j += 32) {
      const float l = ws.partial_lse[row0 + j * split_stride];
      const float e = l == -INFINITY ? 0.0f : expf(l - top);
      if (j == lane) mine = e;
      total += e;
    }
    total = WarpReduceSum(total);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    mine *= inv;
    for (int d = 4 * lane; d < D; d += 128) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
      for (int j = 0; j < m.num_splits; ++j) {
        float w = __shfl_sync(0xffffffffu, mine, j % 32);
        if (j >= 32) {
          const float l = ws.partial_lse[row0 + j * split_stride];
          w = l == -INFINITY ? 0.0f : expf(l - top) * inv;
        }
        const float4 o =
            *reinterpret_cast<const float4*>(ws.partial_out + (row0 + j * split_stride) * D + d);
        acc.x += w * o.x;
        acc.y += w * o.y;
        acc.z += w * o.z;
        acc.w += w * o.w;
      }
      const int64_t at = token * p.out_stride + int64_t{head} * D + d;
      StoreFromFloat(p.out_dtype, p.out, at, acc.x);
      StoreFromFloat(p.out_dtype, p.out, at + 1, acc.y);
      StoreFromFloat(p.out_dtype, p.out, at + 2, acc.z);
      StoreFromFloat(p.out_dtype, p.out, at + 3, acc.w);
    }
    if (lane == 0 && p.lse != nullptr) {
      p.lse[token * p.num_q_heads + head] = total > 0.0f ? top + logf(total) : -INFINITY;
    }
  }
}

// A block per sequence: a decode row's output (num_q_heads x head_size
// values at row s, as the decode kernel wrote them with query_len 1) and
// lse go to its query token.
__device__ __forceinline__ void ScatterDecodeRow(const DecodeParams& p, const AttendWorkspace& ws,
                                                 int32_t s) {
  if (ws.decode_lens[s] == 0) return;
  const int64_t token = p.query_starts[s];
  const int64_t n = int64_t{p.num_q_heads} * p.geo.head_size;
  CopyElements(p.out_dtype, p.out, token * p.out_stride, ws.decode_out, s * n, n);
  if (p.lse != nullptr) {
    for (int h = threadIdx.x; h < p.num_q_heads; h += kFinishThreads) {
      p.lse[token * p.num_q_heads + h] = ws.decode_lse[int64_t{s} * p.num_q_heads + h];
    }
  }
}

// 1-D grid: AttendMergeBlocks(plan, num_kv_heads) merge blocks (split
// tile fastest, then KV head, then row group), then with decode rows one
// scatter block per sequence.
__host__ __device__ __forceinline__ int64_t AttendMergeBlocks(const AttendPlan& plan,
                                                              int num_kv_heads) {
  return int64_t{plan.split_items} * num_kv_heads *
         ((plan.tile_rows + kMergeRows - 1) / kMergeRows);
}

__global__ void __launch_bounds__(kFinishThreads)
    AttendFinishKernel(DecodeParams p, AttendPlan plan, AttendWorkspace ws) {
  const int64_t merge_blocks = AttendMergeBlocks(plan, p.geo.num_kv_heads);
  const int64_t b = blockIdx.x;
  if (b >= merge_blocks) {
    ScatterDecodeRow(p, ws, static_cast<int32_t>(b - merge_blocks));
    return;
  }
  const int64_t per_group = int64_t{plan.split_items} * p.geo.num_kv_heads;
  MergeSplitRows(p, plan, ws, static_cast<int32_t>(b % plan.split_items),
                 static_cast<int>(b / plan.split_items % p.geo.num_kv_heads),
                 static_cast<int>(b / per_group));
}

}  // namespace attend
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_ATTEND_SCHEDULE_CUH_
