// SPDX-License-Identifier: Apache-2.0
// Test support: one warpgroup's S = Q·Kᵀ (m64n64k16, both operands from
// swizzled shared memory) and O = P·V with P = S rounded to 16 bits
// (m64n128k16, A from the S accumulators' registers), through the
// wrappers of kernels/common/wgmma.cuh, as the Hopper attention mainloop
// issues them (tests/unit/cuda_probe_test.cc checks them in double).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/common/wgmma.cuh"
#include "tests/kernels/test_kernels.h"

namespace kvpage {
namespace kernels {
namespace {

constexpr int kRows = 64, kD = 128, kTokens = 64;

template <bool kBf16>
__global__ void __launch_bounds__(128)
    WgmmaTileKernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* s_out,
                    float* o_out) {
  __shared__ __align__(1024) uint16_t sq[kRows * kD];
  __shared__ __align__(1024) uint16_t sk[kTokens * kD];
  __shared__ __align__(1024) uint16_t sv[kD * kTokens];
  for (int i = threadIdx.x; i < kRows * kD; i += 128) {
    sq[SwizzledIndex(kRows, i / kD, i % kD)] = q[i];
    sk[SwizzledIndex(kTokens, i / kD, i % kD)] = k[i];
  }
  for (int i = threadIdx.x; i < kD * kTokens; i += 128) {
    sv[SwizzledIndex(kD, i / kTokens, i % kTokens)] = v[i];
  }
  FenceProxyAsyncShared();
  __syncthreads();
  const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(sq));
  const uint32_t k_base = static_cast<uint32_t>(__cvta_generic_to_shared(sk));
  const uint32_t v_base = static_cast<uint32_t>(__cvta_generic_to_shared(sv));
  float s[kTokens / 8][4];
  WgmmaFence();
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    WgmmaM64K16<kTokens, kBf16>(s, WgmmaDescriptor(q_base + 2 * SwizzledIndex(kRows, 0, 16 * ks)),
                                WgmmaDescriptor(k_base + 2 * SwizzledIndex(kTokens, 0, 16 * ks)),
                                ks > 0);
  }
  WgmmaCommit();
  WgmmaWait<0>();
  WgmmaPin(s);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  for (int n = 0; n < kTokens / 8; ++n) {
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + g + 8 * (e / 2), c = 8 * n + 2 * t + e % 2;
      s_out[r * kTokens + c] = s[n][e];
    }
  }
  float o[kD / 8][4];
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTokens / 16; ++kk) {
    const uint32_t a[4] = {PackPair<kBf16>(s[2 * kk][0], s[2 * kk][1]),
                           PackPair<kBf16>(s[2 * kk][2], s[2 * kk][3]),
                           PackPair<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           PackPair<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    WgmmaM64K16<kD, kBf16>(o, a, WgmmaDescriptor(v_base + 2 * SwizzledIndex(kD, 0, 16 * kk)),
                           kk > 0);
  }
  WgmmaCommit();
  WgmmaWait<0>();
  WgmmaPin(o);
  for (int n = 0; n < kD / 8; ++n) {
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + g + 8 * (e / 2), c = 8 * n + 2 * t + e % 2;
      o_out[r * kD + c] = o[n][e];
    }
  }
}

}  // namespace

int LaunchWgmmaTileCheck(bool bf16, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                         float* s, float* o, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (bf16) {
    WgmmaTileKernel<true><<<1, 128, 0, st>>>(q, k, v, s, o);
  } else {
    WgmmaTileKernel<false><<<1, 128, 0, st>>>(q, k, v, s, o);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels
}  // namespace kvpage
