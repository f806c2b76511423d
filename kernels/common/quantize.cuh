// SPDX-License-Identifier: Apache-2.0
// Device version of the reference quantizer (src/formats.cc, QuantizeVector):
// the same IEEE FP32 operations in the same order, each written as an
// explicitly rounded intrinsic (__fdiv_rn, __fsub_rn, __float2half_ru/rd,
// rintf) so that nvcc can neither contract nor reorder them; the divisions
// by a scale use ScaleDivisor, proven to round like __fdiv_rn. The cache write
// kernel must produce the CPU backend's bytes exactly; every clamp and every
// counting rule below mirrors one in formats.cc (docs/FORMATS.md, "The
// quantizer, exactly").
//
// One token-head vector is spread over a group of kLanes adjacent lanes
// (aligned within the warp): each lane holds up to N elements in registers
// (`valid` says which exist). Reductions (amax, min, max) are exact, so
// their order does not matter.
#ifndef KVPAGE_KERNELS_COMMON_QUANTIZE_CUH_
#define KVPAGE_KERNELS_COMMON_QUANTIZE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "src/geometry.h"

namespace kvpage {
namespace kernels {

constexpr unsigned kFullWarp = 0xFFFFFFFFu;

constexpr uint16_t kHalfMaxBits = 0x7BFF;  // 65504
constexpr uint16_t kHalfInfBits = 0x7C00;
constexpr uint16_t kHalfSignBits = 0x8000;
constexpr uint16_t kBf16MaxBits = 0x7F7F;
constexpr uint16_t kBf16InfBits = 0x7F80;

// Per-lane telemetry; summed over the warp once, at the end of the kernel.
struct LaneStats {
  unsigned non_finite = 0;
  unsigned saturated = 0;
};

// ---- Scalar steps ----------------------------------------------------------

// Step 1: x / lambda (or x), non-finite inputs -> 0, a quotient that
// overflowed -> +-FLT_MAX. Counts the element once, here, like the CPU's
// first pass does. *overflow records formats.cc's Fixup::kOverflow, the
// only fixup later steps need to know about.
__device__ __forceinline__ float PrepareValue(float x, float lambda, bool smooth, bool* overflow,
                                              LaneStats* stats) {
  *overflow = false;
  const bool finite = isfinite(x);
  stats->non_finite += static_cast<unsigned>(!finite);
  if (!finite) x = 0.0f;
  if (!smooth || !finite) return x;
  const float v = __fdiv_rn(x, lambda);
  if (isnan(v)) {  // only with an invalid divisor; the CPU treats it so too
    ++stats->non_finite;
    return 0.0f;
  }
  if (isinf(v)) {
    *overflow = true;
    ++stats->saturated;
    return copysignf(FLT_MAX, v);
  }
  return v;
}

// A clip in steps 2-4 counts unless step 1 already counted the element as
// a smoothing overflow (each element counts at most once) or the element
// is not part of the vector: `uncounted` says either. Branch-free, like
// every per-element step here: the element loops stay straight-line code.
__device__ __forceinline__ void CountClip(bool clipped, bool uncounted, LaneStats* stats) {
  stats->saturated += static_cast<unsigned>(clipped && !uncounted);
}

__device__ __forceinline__ uint16_t HalfBits(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));  // exact
}

// FP16 scale rounded toward +Inf (away from the data), +Inf clipped to
// 65504, and a quotient that underflowed to 0 raised to 2^-24, exactly as
// formats.cc's ScaleUp. `quotient` is positive. *clipped: the scale is
// below the quotient (the +Inf case).
__device__ __forceinline__ uint16_t ScaleUp(float quotient, bool* clipped) {
  uint16_t s = HalfBits(__float2half_ru(quotient));
  *clipped = s == kHalfInfBits;
  if (*clipped) s = kHalfMaxBits;
  if (s == 0) s = 0x0001;
  return s;
}

// Step 2: an FP16/BF16 code, round half to even; overflow saturates to the
// largest finite value of its sign and is counted.
__device__ __forceinline__ uint32_t Float16Code(float v, bool bf16, bool uncounted,
                                                LaneStats* stats) {
  const uint32_t code =
      bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : HalfBits(__float2half_rn(v));
  const bool inf = (code & 0x7FFF) == (bf16 ? kBf16InfBits : kHalfInfBits);
  CountClip(inf, uncounted, stats);
  return inf ? (code & kHalfSignBits) | (bf16 ? kBf16MaxBits : kHalfMaxBits) : code;
}

// Division by a vector's scale s (an FP16 value, so 2^-24 <= s <= 65504):
// RN(v / s), bit for bit what __fdiv_rn(v, s) returns for every v the
// quantizer divides, in four operations instead of ~10 and a slow-path
// check. r = RN(1 / s) once per vector (HalfReciprocal); per element
// q = RN(v * r), the residual v - s * q (exact in one FMA) and one
// correction (Markstein's scheme). Why it is exact here:
//   - the quantizer's quotients are bounded (|v / s| <= ~464: s comes from
//     the vector's own range, rounded up), so nothing overflows;
//   - away from underflow, scaling v or s by a power of two scales every
//     step exactly, so the result depends on the two significands only, and
//     the GPU test CudaQuantizer.ScaleDivisionIsExact checks all pairs
//     (every FP16 significand of s against every FP32 significand of v);
//   - where a residual may underflow (|v / s| < 2^-20) the last bit may
//     differ, but every code of such a quotient is zero (INT8, INT4) or a
//     zero with v's sign (FP8); kSignedZero gives that sign (-0 / s
//     included, which the plain correction would turn into +0);
//   - a quotient can pass FLT_MAX only in INT4 with a clipped minimum
//     (values below -65504); kMayOverflow returns +-Inf there (the
//     correction would make it NaN), and every code and count of such a
//     quotient is that of +-Inf.
// The test also compares Divide<true, true> with __fdiv_rn over random
// FP16 scales and FP32 values of every exponent under these rules; the
// other instances differ from it only where their callers do not look.
//
// The scales' own divisions (amax / 127, amax / 448, range / 15) use it
// too, with RN(1 / s) as a constant (ConstantDivisor): their divisors are
// FP16 values, so the significand argument above holds for every quotient
// that does not underflow, and a quotient that does (below 2^-100) becomes
// the smallest FP16 scale either way (ScaleUp). The test checks that
// claim for every positive finite FP32 value and each constant.
struct ConstantDivisor {
  float divisor;
  float reciprocal;  // RN(1 / divisor), what __frcp_rn returns
};
__device__ constexpr ConstantDivisor kInt8CodeMax{127.0f, 0x1.020408p-7f};
__device__ constexpr ConstantDivisor kFp8CodeMax{448.0f, 0x1.24924ap-9f};
__device__ constexpr ConstantDivisor kInt4CodeMax{15.0f, 0x1.111112p-4f};

// RN(1 / s) for an FP16 value s (2^-24 <= s <= 65504: normal in FP32, and
// so is 1 / s): the approximate reciprocal and one Newton step, which is
// rcp.rn's own fast path without its test and branch to the slow path
// (taken only for operands or results outside the normal range, never
// here). The GPU test checks it against __frcp_rn for every positive
// finite FP16 value. INT8 writes measured 0.5-1% faster with it, the
// other dtypes the same (docs/archive.md, "Cache write").
__device__ __forceinline__ float HalfReciprocal(float s) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
  const float e = __fmaf_rn(-s, r0, 1.0f);
  return __fmaf_rn(r0, e, r0);
}

struct ScaleDivisor {
  float s;
  float r;
  // s: an FP16 value (a vector's scale).
  __device__ explicit ScaleDivisor(float scale) {
    s = scale;
    r = HalfReciprocal(scale);
  }
  __device__ explicit ScaleDivisor(ConstantDivisor c) : s(c.divisor), r(c.reciprocal) {}
  template <bool kSignedZero, bool kMayOverflow>
  __device__ float Divide(float v) const {
    const float q = __fmul_rn(v, r);
    const float e = __fmaf_rn(-s, q, v);
    float corrected = __fmaf_rn(e, r, q);
    if (kSignedZero) corrected = copysignf(corrected, v);
    if (kMayOverflow) corrected = isinf(q) ? q : corrected;
    return corrected;
  }
};

// RNE(q) for |q| <= 2^22 in the low bits of the result, two's complement
// below zero: q + 1.5 * 2^23 rounds once, to nearest even at integer
// granularity (as rintf does), and leaves the integer in the significand's
// low bits. One FADD instead of a rounding and a conversion: INT8's fast
// path writes 3.5% faster with it (its code is the low byte, which the
// cache write takes as it is). INT4 keeps rintf and the conversion: its
// packing would need a mask per code, and measured 1.5% slower.
__device__ __forceinline__ uint32_t RoundToIntBits(float q) {
  return __float_as_uint(__fadd_rn(q, 12582912.0f));
}

// The byte of an INT8 code from an integral value in [-127, 127].
__device__ __forceinline__ uint32_t Int8Bits(float r) {
  return static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(r)));
}
// The byte of an FP8 E4M3 code: the hardware conversion (round half to
// even, saturating to 448).
__device__ __forceinline__ uint32_t Fp8Bits(float q) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// Step 3, one element of INT8: RNE(v / s) clipped to +-127.
__device__ __forceinline__ uint32_t Int8Code(float v, const ScaleDivisor& s, bool uncounted,
                                             LaneStats* stats) {
  float r = rintf(s.Divide<false, false>(v));
  const bool clipped = fabsf(r) > 127.0f;
  CountClip(clipped, uncounted, stats);
  if (clipped) r = copysignf(127.0f, r);
  return Int8Bits(r);
}

// Step 3, one element of FP8 E4M3: the hardware conversion (round half to
// even, saturating to 448). SATFINITE only clamps; the CPU counts values
// whose rounding would pass 448, i.e. |q| > 464.
__device__ __forceinline__ uint32_t Fp8Code(float v, const ScaleDivisor& s, bool uncounted,
                                            LaneStats* stats) {
  const float q = s.Divide<true, false>(v);
  CountClip(fabsf(q) > 464.0f, uncounted, stats);
  return Fp8Bits(q);
}

// Step 4, one element of INT4: RNE((v - m) / s) clipped to [0, 15].
__device__ __forceinline__ uint32_t Int4Code(float v, float m, const ScaleDivisor& s,
                                             bool uncounted, LaneStats* stats) {
  const float c = rintf(s.Divide<false, true>(__fsub_rn(v, m)));
  CountClip(c < 0.0f || c > 15.0f, uncounted, stats);
  return static_cast<uint32_t>(fminf(fmaxf(c, 0.0f), 15.0f));
}

// ---- Lane-group reductions (exact: max and min do not round) --------------
// Over the kLanes-lane group (a power of two) holding one vector; every
// lane of the warp takes part.

template <int kLanes>
__device__ __forceinline__ float LaneGroupMax(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, o));
  }
  return v;
}

template <int kLanes>
__device__ __forceinline__ float LaneGroupMin(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) {
    v = fminf(v, __shfl_xor_sync(kFullWarp, v, o));
  }
  return v;
}

// ---- One vector, spread over a lane group ----------------------------------

// Bounds of one lane's valid values: their minimum and maximum. FP8 and
// INT8 use only max(|lo|, |hi|), so a caller that knows just the largest
// magnitude may pass {-amax, amax}.
struct LaneRange {
  float lo;
  float hi;
};

// Quantizes the prepared values v[i] (step 1 done; bit i of `overflow` set
// where it clipped a smoothing overflow) of the elements this lane holds
// (bit i of `valid`; the others must hold NaN, which fminf/fmaxf skip) into
// codes[i] (FP16/BF16: 16 bits; FP8: a byte; INT8: the low byte, the bits
// above are not part of it; INT4: 0..15), with the vector's FP16 scale (and
// INT4 min) in *scale / *min on every lane of the group. Every lane of the
// warp must call it with the same dtype (the reductions shuffle
// warp-wide); a group with no valid element counts nothing (its results
// are not used). Codes of invalid elements are meaningless: the element
// loops run on every register without branches and only the counts look
// at `valid`. `range`: the lane's LaneRange where the caller has it
// (`has_range`; then every element is valid and finite). By value: a
// pointer that may be null put the range in local memory.
template <int kLanes, int N>
__device__ __forceinline__ void QuantizeLaneGroupVector(DType dtype, const float (&v)[N],
                                                        uint32_t overflow, uint32_t valid,
                                                        bool has_range, LaneRange range,
                                                        uint32_t (&codes)[N], uint16_t* scale,
                                                        uint16_t* min, LaneStats* stats) {
  *scale = 0;
  *min = 0;
  const uint32_t uncounted = overflow | ~valid;

  if (dtype == DType::kFP16 || dtype == DType::kBF16) {
    const bool bf16 = dtype == DType::kBF16;
#pragma unroll
    for (int i = 0; i < N; ++i) codes[i] = Float16Code(v[i], bf16, (uncounted >> i) & 1u, stats);
    return;
  }

  if (dtype == DType::kFP8E4M3 || dtype == DType::kINT8) {
    float amax = 0.0f;
    if (has_range) {
      amax = fmaxf(fabsf(range.lo), fabsf(range.hi));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = LaneGroupMax<kLanes>(amax);
    if (amax == 0.0f) {  // scale 0, codes 0 (FP8 included: no -0 codes)
#pragma unroll
      for (int i = 0; i < N; ++i) codes[i] = 0;
      return;
    }
    const bool int8 = dtype == DType::kINT8;
    const ScaleDivisor code_max(int8 ? kInt8CodeMax : kFp8CodeMax);
    bool clipped;
    *scale = ScaleUp(code_max.Divide<false, false>(amax), &clipped);
    const ScaleDivisor s(HalfBitsToFloat(*scale));
    if (!clipped) {
      // s >= RN(amax / 127) >= amax / 127 * (1 - 2^-24), so |v / s| <=
      // 127 * (1 + 2^-23) (448 * (1 + 2^-23) for FP8): every code is in
      // range, nothing clips or counts, and the steps reduce to the
      // division and the conversion.
      if (int8) {
#pragma unroll
        for (int i = 0; i < N; ++i) codes[i] = RoundToIntBits(s.Divide<false, false>(v[i]));
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) codes[i] = Fp8Bits(s.Divide<true, false>(v[i]));
      }
      return;
    }
    if (int8) {
#pragma unroll
      for (int i = 0; i < N; ++i) codes[i] = Int8Code(v[i], s, (uncounted >> i) & 1u, stats);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) codes[i] = Fp8Code(v[i], s, (uncounted >> i) & 1u, stats);
    }
    return;
  }

  if (dtype == DType::kINT4) {
    // Identities that never win: every valid value is finite.
    float lo = INFINITY;
    float hi = -INFINITY;
    if (has_range) {
      lo = range.lo;
      hi = range.hi;
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        lo = fminf(lo, v[i]);
        hi = fmaxf(hi, v[i]);
      }
    }
    lo = LaneGroupMin<kLanes>(lo);
    hi = LaneGroupMax<kLanes>(hi);
    // Rounded down (away from the data); only -Inf needs clipping. -0 is
    // stored as +0, so the sign fminf picked among zeros does not matter.
    uint16_t m_bits = HalfBits(__float2half_rd(lo));
    const bool m_clipped = m_bits == (kHalfSignBits | kHalfInfBits);
    if (m_clipped) m_bits = kHalfSignBits | kHalfMaxBits;
    if (m_bits == kHalfSignBits) m_bits = 0;
    *min = m_bits;
    const float m = HalfBitsToFloat(m_bits);
    const float r = __fsub_rn(hi, m);
    if (!(r > 0.0f)) {
      // Every value equals m, or lies below it because m was clipped.
#pragma unroll
      for (int i = 0; i < N; ++i) {
        CountClip(v[i] < m, (uncounted >> i) & 1u, stats);
        codes[i] = 0;
      }
      return;  // scale 0, codes 0
    }
    bool s_clipped;
    *scale = ScaleUp(ScaleDivisor(kInt4CodeMax).Divide<false, false>(r), &s_clipped);
    const ScaleDivisor s(HalfBitsToFloat(*scale));
    if (!m_clipped && !s_clipped) {
      // m <= every v, and s >= RN(r / 15) * (1 - 2^-24) with RN(v - m) <= r,
      // so 0 <= (v - m) / s <= 15 * (1 + 2^-23): every code is in range and
      // nothing clips, overflows or counts.
#pragma unroll
      for (int i = 0; i < N; ++i) {
        codes[i] = static_cast<uint32_t>(rintf(s.Divide<false, false>(__fsub_rn(v[i], m))));
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) codes[i] = Int4Code(v[i], m, s, (uncounted >> i) & 1u, stats);
  }
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_QUANTIZE_CUH_
