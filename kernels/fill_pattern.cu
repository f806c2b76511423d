// Toolchain probe kernel (see kernels/launch.h).
#include <cuda_runtime.h>

#include "kernels/launch.h"

namespace kvpage {
namespace kernels {
namespace {

__global__ void FillPatternKernel(uint32_t* dst, int64_t n, uint32_t seed) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  }
}

}  // namespace

int LaunchFillPattern(uint32_t* dst, int64_t n, uint32_t seed, void* stream) {
  if (n <= 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  FillPatternKernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), threads, 0,
                      static_cast<cudaStream_t>(stream)>>>(dst, n, seed);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvpage
