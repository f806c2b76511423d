// SPDX-License-Identifier: Apache-2.0
// Block copy (copy-on-write, kvp_cache_copy_blocks): pairs[2i] -> pairs[2i+1]
// in every layer,
// for each of the layer's block regions (K data, V data, K scales, V
// scales; CacheGeometry::block_region), in one launch.
//
// Grid: x = (pair, layer), y = slices of the bytes of one block. Every
// region's block stride is a multiple of 16 bytes for the supported
// geometries (K chunks are 16 B; V is head_size * block_size * bits / 8 with
// head_size a multiple of 16; scales are block_size (>= 8) * 2 or 4 B per
// head) and region offsets are 256-byte aligned, so the copy runs on 16-byte
// vectors; a region that is not 16-byte aligned falls back to bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/checked.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"

namespace kvpage {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// Each thread copies about this many 16-byte vectors per region and slice.
constexpr int kVectorsPerThread = 4;
constexpr int kMaxSlices = 64;
// Pairs passed by value per launch when they come from the host.
constexpr int kInlinePairs = 32;

struct InlinePairs {
  int32_t v[2 * kInlinePairs];
};

__global__ void __launch_bounds__(kThreads)
    CopyBlocksKernel(const CacheGeometry g, uint8_t* base, const int32_t* pairs,
                     const InlinePairs inline_pairs, int32_t num_pairs,
                     DeviceErrorRecord* checked) {
  const int64_t pair = blockIdx.x / g.num_layers;
  const int32_t layer = static_cast<int32_t>(blockIdx.x % g.num_layers);
  if (pair >= num_pairs) return;
  const int32_t src = pairs != nullptr ? pairs[2 * pair] : inline_pairs.v[2 * pair];
  const int32_t dst = pairs != nullptr ? pairs[2 * pair + 1] : inline_pairs.v[2 * pair + 1];
  // The host validates host-side pairs; device-side ones out of range copy
  // nothing (and are reported in checked mode).
  if (src < 0 || src >= g.num_blocks || dst < 0 || dst >= g.num_blocks) {
    if (layer == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
      ReportFault(checked, DeviceFault::kCopyPairOutOfRange, pair,
                  src < 0 || src >= g.num_blocks ? src : dst, g.num_blocks);
    }
    return;
  }
  uint8_t* const l = base + layer * g.layer_bytes();
  const int64_t first = int64_t{blockIdx.y} * kThreads + threadIdx.x;
  const int64_t step = int64_t{gridDim.y} * kThreads;
#pragma unroll
  for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
    const CacheGeometry::BlockRegion region = g.block_region(r);
    if (region.block_stride == 0) continue;
    const uint8_t* from = l + region.offset + src * region.block_stride;
    uint8_t* to = l + region.offset + dst * region.block_stride;
    const bool vec = ((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
                       static_cast<uintptr_t>(region.block_stride)) %
                      16) == 0;
    if (vec) {
      const int64_t n = region.block_stride / 16;
      const uint4* f = reinterpret_cast<const uint4*>(from);
      uint4* t = reinterpret_cast<uint4*>(to);
      for (int64_t i = first; i < n; i += step) t[i] = f[i];
    } else {
      for (int64_t i = first; i < region.block_stride; i += step) to[i] = from[i];
    }
  }
}

}  // namespace

int LaunchCopyBlocks(const CacheGeometry& geo, uint8_t* base, const int32_t* pairs,
                     int32_t num_pairs, bool pairs_on_host, DeviceErrorRecord* checked,
                     void* stream) {
  if (num_pairs <= 0 || geo.num_layers <= 0) return cudaSuccess;
  // Enough slices that the largest region gives each thread a few vectors.
  int64_t largest = 0;
  for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
    const int64_t s = geo.block_region(r).block_stride;
    if (s > largest) largest = s;
  }
  int64_t slices = (largest / 16 + int64_t{kThreads} * kVectorsPerThread - 1) /
                   (int64_t{kThreads} * kVectorsPerThread);
  if (slices < 1) slices = 1;
  if (slices > kMaxSlices) slices = kMaxSlices;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  InlinePairs inline_pairs{};
  const int32_t per_launch = pairs_on_host ? kInlinePairs : num_pairs;
  for (int32_t first = 0; first < num_pairs; first += per_launch) {
    const int32_t n = num_pairs - first < per_launch ? num_pairs - first : per_launch;
    const int64_t x = int64_t{n} * geo.num_layers;
    if (x > 0x7FFFFFFF) return cudaErrorInvalidValue;
    if (pairs_on_host) {
      for (int32_t i = 0; i < 2 * n; ++i) inline_pairs.v[i] = pairs[2 * first + i];
    }
    const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(slices));
    CopyBlocksKernel<<<grid, kThreads, 0, s>>>(geo, base, pairs_on_host ? nullptr : pairs,
                                               inline_pairs, n, checked);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace kvpage
