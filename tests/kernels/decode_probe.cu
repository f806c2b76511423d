// SPDX-License-Identifier: Apache-2.0
// The decode kernels' shared-memory alignment probe
// (tests/kernels/test_kernels.h).
#include <cuda_runtime.h>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/partition_common.cuh"
#include "tests/kernels/test_kernels.h"

namespace kvpage {
namespace kernels {
namespace {

// Static variables of an odd size ahead of the dynamic region, as every
// decode kernel has (block ids' fault flag, barriers, q rows).
__global__ void DecodeSmemAlignmentProbe(uint32_t* bytes) {
  __shared__ uint32_t own[5];
  if (threadIdx.x < 5) own[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    // (+ own[4] - 4: keeps `own`, and so its place ahead of the region.)
    bytes[0] = SharedAddress(decode::SharedWords()) % decode::kDecodeSmemAlign + own[4] - 4u;
  }
}

}  // namespace

int ProbeDecodeSmemMisalignment(uint32_t* bytes) {
  uint32_t* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(uint32_t));
  if (err != cudaSuccess) return err;
  DecodeSmemAlignmentProbe<<<1, 32, 256>>>(d);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(bytes, d, sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

}  // namespace kernels
}  // namespace kvpage
