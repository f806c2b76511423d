// Block copy (copy-on-write, fork): pairs[2i] -> pairs[2i+1] in every layer,
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

#include "kernels/launch.h"
#include "src/geometry.h"

namespace kvpage {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// Each thread copies about this many 16-byte vectors per region and slice.
constexpr int kVectorsPerThread = 4;
constexpr int kMaxSlices = 64;

__global__ void __launch_bounds__(kThreads)
    CopyBlocksKernel(const CacheGeometry g, uint8_t* base, const int32_t* pairs,
                     int32_t num_pairs) {
  const int64_t pair = blockIdx.x / g.num_layers;
  const int32_t layer = static_cast<int32_t>(blockIdx.x % g.num_layers);
  if (pair >= num_pairs) return;
  const int32_t src = pairs[2 * pair];
  const int32_t dst = pairs[2 * pair + 1];
  // The host validates block ids; out-of-range ones copy nothing.
  if (src < 0 || src >= g.num_blocks || dst < 0 || dst >= g.num_blocks) return;
  uint8_t* const l = base + layer * g.layer_bytes();
  const int64_t first = int64_t{blockIdx.y} * kThreads + threadIdx.x;
  const int64_t step = int64_t{gridDim.y} * kThreads;
#pragma unroll
  for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
    const CacheGeometry::BlockRegion region = g.block_region(r);
    if (region.block_stride == 0) continue;
    const uint8_t* from = l + region.offset + src * region.block_stride;
    uint8_t* to = l + region.offset + dst * region.block_stride;
    const bool vec = ((reinterpret_cast<uintptr_t>(from) |
                       reinterpret_cast<uintptr_t>(to) |
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

int LaunchCopyBlocks(const CacheGeometry& geo, uint8_t* base,
                     const int32_t* pairs, int32_t num_pairs, void* stream) {
  if (num_pairs <= 0 || geo.num_layers <= 0) return cudaSuccess;
  const int64_t x = int64_t{num_pairs} * geo.num_layers;
  if (x > 0x7FFFFFFF) return cudaErrorInvalidValue;
  // Enough slices that the largest region gives each thread a few vectors.
  int64_t largest = 0;
  for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
    const int64_t s = geo.block_region(r).block_stride;
    if (s > largest) largest = s;
  }
  int64_t slices =
      (largest / 16 + int64_t{kThreads} * kVectorsPerThread - 1) /
      (int64_t{kThreads} * kVectorsPerThread);
  if (slices < 1) slices = 1;
  if (slices > kMaxSlices) slices = kMaxSlices;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(slices));
  CopyBlocksKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      geo, base, pairs, num_pairs);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvpage
