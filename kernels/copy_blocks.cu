// SPDX-License-Identifier: Apache-2.0
// Block moves (BlockMoveParams, src/params.h): copies within a cache
// (copy-on-write, kvp_cache_copy_blocks), packs into a contiguous buffer
// (kvp_cache_pack) and unpacks from one (kvp_cache_unpack), every layer of
// the range and every region of a block (K data, V data, K scales, V
// scales; CacheGeometry::block_region), in one launch.
//
// Grid: one thread block per (layer, item, slice), a block's slices
// adjacent. The block's regions are taken as one sequence of 16-byte
// vectors (K data, then V data, K scales, V scales) split evenly over a
// slice's threads, so that the small scale regions leave no thread idle;
// each thread loads its vectors of a step before it stores them (sizing:
// docs/DESIGN.md, "Block copy, pack and unpack"). Every region's block
// stride is a multiple of 16 bytes for the supported geometries (K chunks
// are 16 B; V is head_size * block_size * bits / 8 with head_size a
// multiple of 16; scales are block_size (>= 8) * 2 or 4 B per head),
// region offsets are 256-byte aligned and packed buffers 16-byte aligned;
// the launcher refuses anything else rather than moving bytes one at a
// time.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/common/checked.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// Vectors a thread loads before storing them; the slices give each thread
// about this many of a block (rounded to the nearest slice count).
constexpr int kVectorsPerThread = 8;
constexpr int kMaxSlices = 64;
// Pairs passed by value per launch when they come from the host.
constexpr int kInlinePairs = 32;
constexpr int kRegions = CacheGeometry::kNumBlockRegions;

struct InlinePairs {
  int32_t v[2 * kInlinePairs];
};

// One block's regions as one sequence of 16-byte vectors: vector v lies in
// region r where end[r - 1] <= v < end[r] (absent regions are empty).
struct BlockVectors {
  const uint4* from[kRegions];
  uint4* to[kRegions];
  int64_t end[kRegions];

  __device__ __forceinline__ void Locate(int64_t v, const uint4** f, uint4** t) const {
    int64_t begin = 0;
#pragma unroll
    for (int r = 0; r < kRegions; ++r) {
      if (v >= begin && v < end[r]) {
        *f = from[r] + (v - begin);
        *t = to[r] + (v - begin);
      }
      begin = end[r];
    }
  }
};

// `first_item`: the launch's first item in the call (faults name items by
// their index in the call); `slices`: thread blocks per block moved.
__global__ void __launch_bounds__(kThreads)
    MoveBlocksKernel(const BlockMoveParams p, const InlinePairs inline_pairs, int32_t first_item,
                     int32_t slices) {
  const int32_t slice = static_cast<int32_t>(blockIdx.x % slices);
  const int32_t unit = static_cast<int32_t>(blockIdx.x / slices);
  const int32_t layer = unit / p.num_items;
  const int32_t item = unit % p.num_items;
  const bool copy = p.move == BlockMove::kCopy;
  const int64_t at = copy ? 2 * int64_t{item} : item;
  const int32_t id = p.ids_on_host ? inline_pairs.v[at] : p.ids[at];
  const int32_t dst = !copy ? 0 : p.ids_on_host ? inline_pairs.v[at + 1] : p.ids[at + 1];
  const int32_t limit = p.geo.num_blocks;
  const bool bad_id = id < 0 || id >= limit;
  const bool bad_dst = dst < 0 || dst >= limit;
  const bool reporter = layer == 0 && slice == 0;  // one thread block per item reports
  // The host validates host-side ids; device-side ones out of range move
  // nothing (and are reported in checked mode).
  if (bad_id || bad_dst) {
    if (reporter && threadIdx.x == 0) {
      ReportFault(p.checked,
                  copy ? DeviceFault::kCopyPairOutOfRange : DeviceFault::kPackBlockOutOfRange,
                  int64_t{first_item} + item, bad_id ? id : dst, limit);
    }
    return;
  }
  // Checked mode: an unpack destination an earlier item names too (its
  // block then holds either item's bytes, possibly mixed).
  if (p.move == BlockMove::kUnpack && p.checked != nullptr && reporter) {
    __shared__ int32_t earlier;
    if (threadIdx.x == 0) earlier = INT_MAX;
    __syncthreads();
    for (int32_t j = threadIdx.x; j < item; j += kThreads) {
      if (p.ids[j] == id) atomicMin(&earlier, j);
    }
    __syncthreads();
    if (threadIdx.x == 0 && earlier != INT_MAX) {
      ReportFault(p.checked, DeviceFault::kUnpackBlockRepeated, item, id, earlier);
    }
  }
  BlockVectors b;
  int64_t n = 0;
#pragma unroll
  for (int r = 0; r < kRegions; ++r) {
    const BlockMoveEnds e = BlockMoveRegion(p, layer, r, item, id, dst);
    b.from[r] = reinterpret_cast<const uint4*>(e.from);
    b.to[r] = reinterpret_cast<uint4*>(e.to);
    n += p.geo.block_region(r).block_stride / 16;
    b.end[r] = n;
  }
  const int64_t step = int64_t{slices} * kThreads;
  for (int64_t v0 = int64_t{slice} * kThreads + threadIdx.x; v0 < n;
       v0 += step * kVectorsPerThread) {
    uint4 val[kVectorsPerThread];
    uint4* to[kVectorsPerThread];
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      to[u] = nullptr;
      const int64_t v = v0 + u * step;
      if (v < n) {
        const uint4* from = nullptr;
        b.Locate(v, &from, &to[u]);
        val[u] = __ldcg(from);  // global space, L2 only: nothing is read twice
      }
    }
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      if (to[u] != nullptr) __stcg(to[u], val[u]);
    }
  }
}

}  // namespace

int LaunchMoveBlocks(const BlockMoveParams& params, void* stream) {
  const BlockMoveParams& p = params;
  if (p.num_items <= 0 || p.num_layers <= 0) return cudaSuccess;
  if (p.ids_on_host && p.move != BlockMove::kCopy) return cudaErrorInvalidValue;
  // 16-byte vectors everywhere (see the top of this file).
  uintptr_t bits =
      reinterpret_cast<uintptr_t>(p.cache) | static_cast<uintptr_t>(p.geo.layer_bytes());
  if (p.move != BlockMove::kCopy) bits |= reinterpret_cast<uintptr_t>(p.buffer);
  for (int r = 0; r < kRegions; ++r) {
    const CacheGeometry::BlockRegion region = p.geo.block_region(r);
    bits |= static_cast<uintptr_t>(region.offset) | static_cast<uintptr_t>(region.block_stride);
  }
  if (bits % 16 != 0) return cudaErrorInvalidValue;
  // The slice count nearest to each thread moving kVectorsPerThread vectors.
  const int64_t vectors = p.geo.packed_block_bytes() / 16;
  constexpr int64_t kSliceVectors = int64_t{kThreads} * kVectorsPerThread;
  int64_t slices = (vectors + kSliceVectors / 2) / kSliceVectors;
  if (slices < 1) slices = 1;
  if (slices > kMaxSlices) slices = kMaxSlices;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int32_t per_launch = p.ids_on_host ? kInlinePairs : p.num_items;
  for (int32_t first = 0; first < p.num_items; first += per_launch) {
    BlockMoveParams q = p;
    q.num_items = p.num_items - first < per_launch ? p.num_items - first : per_launch;
    InlinePairs inline_pairs{};
    if (p.ids_on_host) {
      for (int32_t i = 0; i < 2 * q.num_items; ++i) inline_pairs.v[i] = p.ids[2 * first + i];
      q.ids = nullptr;
    }
    // Grid x holds (layer, item, slice): as many layers a launch as fit in
    // 2^31 - 1.
    const int64_t per_layer = int64_t{q.num_items} * slices;
    const int64_t fit = INT_MAX / per_layer > 0 ? INT_MAX / per_layer : 1;
    const int32_t layers_per_launch = static_cast<int32_t>(fit < p.num_layers ? fit : p.num_layers);
    for (int32_t l = 0; l < p.num_layers; l += layers_per_launch) {
      BlockMoveParams part = q;
      part.first_layer = p.first_layer + l;
      part.num_layers = p.num_layers - l < layers_per_launch ? p.num_layers - l : layers_per_launch;
      if (p.move != BlockMove::kCopy) {
        part.buffer = p.buffer + int64_t{l} * p.num_items * p.geo.packed_block_bytes();
      }
      const unsigned grid = static_cast<unsigned>(per_layer * part.num_layers);
      MoveBlocksKernel<<<grid, kThreads, 0, s>>>(part, inline_pairs, first,
                                                 static_cast<int32_t>(slices));
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace kvpage
