// Device version of the reference quantizer (src/formats.cc, QuantizeVector):
// the same IEEE FP32 operations in the same order, each written as an
// explicitly rounded intrinsic (__fdiv_rn, __fsub_rn, __float2half_ru/rd,
// rintf) so that nvcc can neither contract nor reorder them. The cache write
// kernel must produce the CPU backend's bytes exactly; every clamp and every
// counting rule below mirrors one in formats.cc (docs/FORMATS.md, "The
// quantizer, exactly").
//
// One token-head vector is spread over a warp: each lane holds up to N
// elements in registers (`valid` says which exist). Reductions (amax, min,
// max) are exact, so their order does not matter.
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

constexpr uint16_t kHalfMaxBits = 0x7BFF;   // 65504
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
__device__ __forceinline__ float PrepareValue(float x, float lambda,
                                              bool smooth, bool* overflow,
                                              LaneStats* stats) {
  *overflow = false;
  if (!isfinite(x)) {
    ++stats->non_finite;
    return 0.0f;
  }
  if (!smooth) return x;
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
// a smoothing overflow (each element counts at most once).
__device__ __forceinline__ void CountClip(bool overflow, LaneStats* stats) {
  if (!overflow) ++stats->saturated;
}

__device__ __forceinline__ uint16_t HalfBits(__half h) {
  return __half_as_ushort(h);
}
__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));  // exact
}

// FP16 scale rounded toward +Inf (away from the data), +Inf clipped to
// 65504, and a quotient that underflowed to 0 raised to 2^-24, exactly as
// formats.cc's ScaleUp. `quotient` is positive.
__device__ __forceinline__ uint16_t ScaleUp(float quotient) {
  uint16_t s = HalfBits(__float2half_ru(quotient));
  if (s == kHalfInfBits) s = kHalfMaxBits;
  if (s == 0) s = 0x0001;
  return s;
}

// Step 2: an FP16/BF16 code, round half to even; overflow saturates to the
// largest finite value of its sign and is counted.
__device__ __forceinline__ uint16_t Float16Code(float v, bool bf16,
                                                bool overflow,
                                                LaneStats* stats) {
  uint16_t code = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                       : HalfBits(__float2half_rn(v));
  if ((code & 0x7FFF) == (bf16 ? kBf16InfBits : kHalfInfBits)) {
    code = (code & kHalfSignBits) | (bf16 ? kBf16MaxBits : kHalfMaxBits);
    CountClip(overflow, stats);
  }
  return code;
}

// Step 3, one element of INT8: RNE(v / s) clipped to +-127.
__device__ __forceinline__ uint16_t Int8Code(float v, float s, bool overflow,
                                             LaneStats* stats) {
  float r = rintf(__fdiv_rn(v, s));
  if (fabsf(r) > 127.0f) {
    r = copysignf(127.0f, r);
    CountClip(overflow, stats);
  }
  return static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(r)));
}

// Step 3, one element of FP8 E4M3: the hardware conversion (round half to
// even, saturating to 448). SATFINITE only clamps; the CPU counts values
// whose rounding would pass 448, i.e. |q| > 464.
__device__ __forceinline__ uint16_t Fp8Code(float v, float s, bool overflow,
                                            LaneStats* stats) {
  const float q = __fdiv_rn(v, s);
  if (fabsf(q) > 464.0f) CountClip(overflow, stats);
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// Step 4, one element of INT4: RNE((v - m) / s) clipped to [0, 15].
__device__ __forceinline__ uint16_t Int4Code(float v, float m, float s,
                                             bool overflow, LaneStats* stats) {
  float c = rintf(__fdiv_rn(__fsub_rn(v, m), s));
  if (c < 0.0f || c > 15.0f) {
    c = c < 0.0f ? 0.0f : 15.0f;
    CountClip(overflow, stats);
  }
  return static_cast<uint16_t>(c);
}

// ---- Warp reductions (exact: max and min do not round) --------------------

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, o));
  }
  return v;
}

__device__ __forceinline__ float WarpMin(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v = fminf(v, __shfl_xor_sync(kFullWarp, v, o));
  }
  return v;
}

// ---- One vector, spread over a warp ----------------------------------------

// Quantizes the prepared values v[i] (step 1 done; bit i of `overflow` set
// where it clipped a smoothing overflow) of the elements this lane holds
// (bit i of `valid`) into codes[i], with the
// vector's FP16 scale (and INT4 min) in *scale / *min on every lane. Every
// lane of the warp must call it with the same dtype. Invalid elements get
// code 0 and take no part.
template <int N>
__device__ __forceinline__ void QuantizeWarpVector(
    DType dtype, const float (&v)[N], uint32_t overflow, uint32_t valid,
    uint16_t (&codes)[N], uint16_t* scale, uint16_t* min, LaneStats* stats) {
  *scale = 0;
  *min = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) codes[i] = 0;

  if (dtype == DType::kFP16 || dtype == DType::kBF16) {
    const bool bf16 = dtype == DType::kBF16;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (valid & (1u << i)) codes[i] = Float16Code(v[i], bf16, (overflow >> i) & 1u, stats);
    }
    return;
  }

  if (dtype == DType::kFP8E4M3 || dtype == DType::kINT8) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (valid & (1u << i)) amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = WarpMax(amax);
    if (amax == 0.0f) return;  // scale 0, codes 0
    const bool int8 = dtype == DType::kINT8;
    *scale = ScaleUp(__fdiv_rn(amax, int8 ? 127.0f : 448.0f));
    const float s = HalfBitsToFloat(*scale);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (valid & (1u << i)) {
        codes[i] = int8 ? Int8Code(v[i], s, (overflow >> i) & 1u, stats)
                        : Fp8Code(v[i], s, (overflow >> i) & 1u, stats);
      }
    }
    return;
  }

  if (dtype == DType::kINT4) {
    // Identities that never win: every valid value is finite.
    float lo = INFINITY;
    float hi = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (valid & (1u << i)) {
        lo = fminf(lo, v[i]);
        hi = fmaxf(hi, v[i]);
      }
    }
    lo = WarpMin(lo);
    hi = WarpMax(hi);
    // Rounded down (away from the data); only -Inf needs clipping. -0 is
    // stored as +0, so the sign fminf picked among zeros does not matter.
    uint16_t m_bits = HalfBits(__float2half_rd(lo));
    if (m_bits == (kHalfSignBits | kHalfInfBits)) {
      m_bits = kHalfSignBits | kHalfMaxBits;
    }
    if (m_bits == kHalfSignBits) m_bits = 0;
    *min = m_bits;
    const float m = HalfBitsToFloat(m_bits);
    const float r = __fsub_rn(hi, m);
    if (!(r > 0.0f)) {
      // Every value equals m, or lies below it because m was clipped.
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if ((valid & (1u << i)) && v[i] < m) CountClip((overflow >> i) & 1u, stats);
      }
      return;  // scale 0, codes 0
    }
    *scale = ScaleUp(__fdiv_rn(r, 15.0f));
    const float s = HalfBitsToFloat(*scale);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (valid & (1u << i)) codes[i] = Int4Code(v[i], m, s, (overflow >> i) & 1u, stats);
    }
  }
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_QUANTIZE_CUH_
