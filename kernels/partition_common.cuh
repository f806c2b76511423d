// SPDX-License-Identifier: Apache-2.0
// What every partition kernel of the decode shares (the thread-group kernel,
// paged_decode.cuh; the tensor-core kernels, tc_decode.cuh; the staged
// kernel, tc_staged_decode.cuh): the partition's state and its dynamic
// shared memory, the prologue (the sequence's length, the partition's slice
// of the block table and its block ids, L2 prefetch of q and the table),
// where a row's results go (its split-K partials, or with direct output its
// out and lse) and the host's launch of a partition grid
// (max_partitions, num_kv_heads, num_seqs). docs/DESIGN.md, "Decode kernels".
#ifndef KVPAGE_KERNELS_PARTITION_COMMON_CUH_
#define KVPAGE_KERNELS_PARTITION_COMMON_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/checked.cuh"
#include "kernels/common/dequant.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/decode_traits.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace decode {

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

// ---- The prologue, and where a row's results go -------------------------------------------

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

// ---- Host side ----------------------------------------------------------

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

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_PARTITION_COMMON_CUH_
