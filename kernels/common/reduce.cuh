// Warp and block reductions. Warp-level ones are butterfly shuffles (every
// lane ends with the result, which the decode needs for its per-row
// softmax); block-level ones wrap CUB's BlockReduce and broadcast the
// result through shared memory.
#ifndef KVPAGE_KERNELS_COMMON_REDUCE_CUH_
#define KVPAGE_KERNELS_COMMON_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

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

// Block-wide max / sum, result returned to every thread. One instance per
// block size; its shared storage is reused across calls, so the call starts
// and ends with a barrier (all threads must call).
template <int kThreads>
struct BlockReducer {
  using Reduce = cub::BlockReduce<float, kThreads>;
  struct Storage {
    typename Reduce::TempStorage temp;
    float result;
  };

  __device__ __forceinline__ static float Max(Storage& s, float v) {
    __syncthreads();
    const float r = Reduce(s.temp).Reduce(v, MaxOp{});
    if (threadIdx.x == 0) s.result = r;
    __syncthreads();
    return s.result;
  }
  __device__ __forceinline__ static float Sum(Storage& s, float v) {
    __syncthreads();
    const float r = Reduce(s.temp).Sum(v);
    if (threadIdx.x == 0) s.result = r;
    __syncthreads();
    return s.result;
  }

 private:
  struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  };
};

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_REDUCE_CUH_
