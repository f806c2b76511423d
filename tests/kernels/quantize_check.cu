// SPDX-License-Identifier: Apache-2.0
// Test support: ScaleDivisor (kernels/common/quantize.cuh) against
// __fdiv_rn on the device, the scales' reciprocals and their constant
// divisors (see kernels/launch.h).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/common/quantize.cuh"
#include "tests/kernels/test_kernels.h"

namespace kvpage {
namespace kernels {
namespace {

// Whether the fast quotient gives the quantizer the codes and counts of the
// exact one (the rules of ScaleDivisor's comment): bit for bit from 2^-20 up
// to FLT_MAX; below, a quotient under 2^-19 of the same sign; from FLT_MAX
// up (Inf included), one of the same sign.
__device__ bool SameForQuantizer(float exact, float fast) {
  const bool same_sign = signbit(exact) == signbit(fast);
  if (fabsf(exact) >= FLT_MAX || fabsf(fast) >= FLT_MAX) {
    return same_sign && fabsf(exact) >= FLT_MAX && fabsf(fast) >= FLT_MAX;
  }
  if (fabsf(exact) < 0x1p-20f) return same_sign && fabsf(fast) < 0x1p-19f;
  return __float_as_uint(exact) == __float_as_uint(fast);
}

__device__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Every FP16 significand of s (s in [1, 2)) against every FP32 significand
// of v (v in [1, 2)): 2^10 x 2^23 pairs, bit for bit.
__global__ void SignificandPairsKernel(unsigned long long* mismatches,
                                       unsigned long long* checked) {
  const int64_t total = int64_t{1} << 33;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned long long bad = 0;
  unsigned long long seen = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const uint32_t s_sig = static_cast<uint32_t>(i >> 23);  // 10 bits
    const uint32_t v_sig = static_cast<uint32_t>(i & 0x7FFFFF);
    const float s = __uint_as_float(0x3F800000u | (s_sig << 13));
    const float v = __uint_as_float(0x3F800000u | v_sig);
    if (__float_as_uint(ScaleDivisor(s).Divide<true, true>(v)) != __float_as_uint(__fdiv_rn(v, s)))
      ++bad;
    ++seen;
  }
  if (bad != 0) atomicAdd(mismatches, bad);
  atomicAdd(checked, seen);
}

// Random FP16 scales (subnormal ones included) against random finite FP32
// values of every exponent, and values a few hundred scales wide.
__global__ void RandomPairsKernel(int64_t n, uint32_t seed, unsigned long long* mismatches,
                                  unsigned long long* checked) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned long long bad = 0;
  unsigned long long seen = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t a = Hash(uint64_t(seed) << 40 ^ uint64_t(i) * 3);
    const uint32_t b = Hash(uint64_t(seed) << 40 ^ (uint64_t(i) * 3 + 1));
    const uint32_t c = Hash(uint64_t(seed) << 40 ^ (uint64_t(i) * 3 + 2));
    const float s = HalfBitsToFloat(static_cast<uint16_t>(1 + a % kHalfMaxBits));
    float v;
    if (c % 2 == 0) {
      const uint32_t exponent = 1 + (c >> 1) % 254;  // every finite binade
      v = __uint_as_float((b & 0x807FFFFFu) | (exponent << 23));
    } else {
      // v / s within a few hundred, where the codes are not all clipped.
      const float u = (static_cast<float>(b) / 4294967296.0f - 0.5f) * 1024.0f;
      v = __fmul_rn(u, s);
    }
    if (!SameForQuantizer(__fdiv_rn(v, s), ScaleDivisor(s).Divide<true, true>(v))) ++bad;
    ++seen;
  }
  if (bad != 0) atomicAdd(mismatches, bad);
  atomicAdd(checked, seen);
}

// The scales' divisions by the constants (ConstantDivisor) against
// __fdiv_rn for every positive finite FP32 value: the FP16 scale ScaleUp
// makes of the two quotients, and whether it clipped, must agree.
__global__ void ConstantDivisorsKernel(unsigned long long* mismatches,
                                       unsigned long long* checked) {
  constexpr ConstantDivisor kDivisors[] = {kInt8CodeMax, kFp8CodeMax, kInt4CodeMax};
  const int64_t total = int64_t{0x7F800000};  // +0 .. FLT_MAX
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned long long bad = 0;
  unsigned long long seen = 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    // Each constant is RN(1 / divisor), bit for bit.
    for (const ConstantDivisor& c : kDivisors) {
      bad += __float_as_uint(__frcp_rn(c.divisor)) != __float_as_uint(c.reciprocal);
    }
  }
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const float v = __uint_as_float(static_cast<uint32_t>(i));
#pragma unroll
    for (const ConstantDivisor& c : kDivisors) {
      bool fast_clipped, exact_clipped;
      const uint16_t fast = ScaleUp(ScaleDivisor(c).Divide<false, false>(v), &fast_clipped);
      const uint16_t exact = ScaleUp(__fdiv_rn(v, c.divisor), &exact_clipped);
      if (fast != exact || fast_clipped != exact_clipped) ++bad;
      ++seen;
    }
  }
  if (bad != 0) atomicAdd(mismatches, bad);
  atomicAdd(checked, seen);
}

// The reciprocal of a vector's scale (HalfReciprocal) against __frcp_rn
// for every positive finite FP16 value, bit for bit.
__global__ void ScaleReciprocalsKernel(unsigned long long* mismatches,
                                       unsigned long long* checked) {
  const uint32_t bits = 1 + blockIdx.x * blockDim.x + threadIdx.x;
  if (bits >= kHalfInfBits) return;
  const float s = HalfBitsToFloat(static_cast<uint16_t>(bits));
  if (__float_as_uint(HalfReciprocal(s)) != __float_as_uint(__frcp_rn(s))) {
    atomicAdd(mismatches, 1ull);
  }
  atomicAdd(checked, 1ull);
}

}  // namespace

int LaunchScaleDivisionCheck(unsigned long long* counts, int64_t random_pairs, uint32_t seed,
                             void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  SignificandPairsKernel<<<4096, 256, 0, s>>>(counts, counts + 2);
  RandomPairsKernel<<<4096, 256, 0, s>>>(random_pairs, seed, counts + 1, counts + 2);
  ConstantDivisorsKernel<<<4096, 256, 0, s>>>(counts + 3, counts + 4);
  ScaleReciprocalsKernel<<<(kHalfInfBits + 255) / 256, 256, 0, s>>>(counts + 3, counts + 4);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvpage
