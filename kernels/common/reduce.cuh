// SPDX-License-Identifier: Apache-2.0
// Warp reductions: butterfly shuffles, so that every lane ends with the
// result, which the decode needs for its per-row softmax and the reduce
// kernel for its row's maximum and weight sum (CUB's WarpReduce leaves it
// in lane 0 only).
#ifndef KVPAGE_KERNELS_COMMON_REDUCE_CUH_
#define KVPAGE_KERNELS_COMMON_REDUCE_CUH_

#include <cuda_runtime.h>

namespace kvpage {
namespace kernels {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Max / sum over groups of `kWidth` consecutive lanes (a power of two
// <= 32); every lane of the group gets the result. All 32 lanes must call.
template <int kWidth = 32>
__device__ __forceinline__ float WarpReduceMax(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

template <int kWidth = 32>
__device__ __forceinline__ float WarpReduceSum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_REDUCE_CUH_
