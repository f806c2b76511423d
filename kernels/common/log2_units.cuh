// SPDX-License-Identifier: Apache-2.0
// The softmaxes of the attention kernels run in log2 units (one FFMA and
// one EX2 a probability): the unit conversions and the exponential.
#ifndef KVPAGE_KERNELS_COMMON_LOG2_UNITS_CUH_
#define KVPAGE_KERNELS_COMMON_LOG2_UNITS_CUH_

#include <cuda_runtime.h>

namespace kvpage {
namespace kernels {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x (MUFU.EX2, 2 ulp; -inf gives +0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_LOG2_UNITS_CUH_
