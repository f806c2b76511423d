// SPDX-License-Identifier: Apache-2.0
// Toolchain probe and test-support kernels (tests/kernels/test_kernels.h).
#include <cuda_runtime.h>

#include "kernels/common/grid_dependency.cuh"
#include "tests/kernels/test_kernels.h"

namespace kvpage {
namespace kernels {
namespace {

__global__ void FillPatternKernel(uint32_t* dst, int64_t n, uint32_t seed) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  }
}

// Every thread block takes all the shared memory a block may have and sets
// it to 0xFF bytes.
__global__ void PoisonSharedKernel(int words) {
  extern __shared__ uint4 smem[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) smem[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
}

// Counts the 32-bit words of its `words` words of shared memory that are
// not all ones, before writing any.
__global__ void CountUnpoisonedSharedKernel(int words, unsigned int* count) {
  extern __shared__ uint4 smem[];
  unsigned int n = 0;
  for (int i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = smem[i];
    n += (v.x != ~0u) + (v.y != ~0u) + (v.z != ~0u) + (v.w != ~0u);
  }
  if (n != 0) atomicAdd(count, n);
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void DelayedCopyKernel(uint8_t* dst, const uint8_t* src, int64_t bytes,
                                  int64_t delay_ns) {
  AllowDependentGrid();
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < static_cast<uint64_t>(delay_ns)) __nanosleep(1000);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    dst[i] = src[i];
  }
}

// The current device's attribute `attr` -> *value.
cudaError_t CurrentDeviceAttribute(cudaDeviceAttr attr, int* value) {
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  return e != cudaSuccess ? e : cudaDeviceGetAttribute(value, attr, device);
}

}  // namespace

int LaunchCountUnpoisonedShared(unsigned int* count, void* stream) {
  int sms = 0;
  const cudaError_t e = CurrentDeviceAttribute(cudaDevAttrMultiProcessorCount, &sms);
  if (e != cudaSuccess) return e;
  constexpr int kBytes = 48 * 1024;  // the default limit: no opt-in
  CountUnpoisonedSharedKernel<<<2 * sms, 256, kBytes, static_cast<cudaStream_t>(stream)>>>(
      kBytes / 16, count);
  return cudaGetLastError();
}

int LaunchPoisonShared(void* stream) {
  int sms = 0, bytes = 0;
  cudaError_t e = CurrentDeviceAttribute(cudaDevAttrMultiProcessorCount, &sms);
  if (e == cudaSuccess) e = CurrentDeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &bytes);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(PoisonSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             bytes);
  }
  if (e != cudaSuccess) return e;
  // One block fills an SM's shared memory (less the 1 KiB the hardware
  // reserves a block); twice the SM count reaches every SM in practice
  // (the scheduler promises nothing: CudaProbe.PoisonSharedIsSeen checks).
  PoisonSharedKernel<<<2 * sms, 256, bytes, static_cast<cudaStream_t>(stream)>>>(bytes / 16);
  return cudaGetLastError();
}

int LaunchDelayedCopy(void* dst, const void* src, int64_t bytes, int64_t delay_ns, void* stream) {
  // A few blocks: the dependent's blocks must find room beside them.
  DelayedCopyKernel<<<4, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes, delay_ns);
  return cudaGetLastError();
}

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
