// SPDX-License-Identifier: Apache-2.0
// K/V codes to float, in registers: the only place where the bit tricks of
// the cache formats (docs/FORMATS.md) are written.
//
// DequantCodes<T>(v, f) turns the 16 bytes `v` into kElems<T> floats
// f[e], e in memory order (for INT4: element 2i is the low nibble of byte
// i). The values are the *codes* of the format:
//   FP16 / BF16   the stored value itself
//   FP8_E4M3      the E4M3 value (no scale)
//   INT8          the signed integer, -128..127
//   INT4          the unsigned integer, 0..15
// Every conversion is exact: each of these fits in FP16's 11 significant
// bits, and the FP16 -> FP32 step is exact. The per-token scale (and INT4's
// min) is applied by the caller *after* the conversion; both uses are
// linear, so the decode folds the scale into one multiply per token
// (K: dot(q, codes) * scale + min * sum(q); V: the softmax weight times
// scale, and sum_t p_t * min_t once per row) instead of one per element.
#ifndef KVPAGE_KERNELS_COMMON_DEQUANT_CUH_
#define KVPAGE_KERNELS_COMMON_DEQUANT_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/geometry.h"

namespace kvpage {
namespace kernels {

// Elements of dtype T in one 16-byte vector.
template <DType T>
inline constexpr int kElems = 128 / DTypeBits(T);

namespace dequant_detail {

__device__ __forceinline__ __half2 AsHalf2(uint32_t u) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = u;
  return h;
}

// (a & b) | c in one LOP3 (lookup table 0xEA = (0xF0 & 0xCC) | 0xAA).
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Four signed bytes (byte i = element i) -> FP16 pairs (e0, e1), (e2, e3).
// FP16 with exponent field 25 (0x64xx) holds 1024 + m for the 10-bit
// mantissa m, so placing an unsigned byte u under 0x64 gives 1024 + u
// exactly; a PRMT builds two such halves at once and one HSUB2 removes the
// 1024 and the +128 bias that made the signed byte unsigned (x ^ 0x80 =
// x + 128 for two's complement bytes).
__device__ __forceinline__ void Int8x4ToHalf2x2(uint32_t w, __half2& e01, __half2& e23) {
  const uint32_t u = w ^ 0x80808080u;
  // Selector nibbles pick bytes of {u (0..3), 0x64646464 (4..7)}:
  // 0x5140 -> [u0, 0x64, u1, 0x64], 0x7362 -> [u2, 0x64, u3, 0x64].
  const uint32_t h01 = __byte_perm(u, 0x64646464u, 0x5140);
  const uint32_t h23 = __byte_perm(u, 0x64646464u, 0x7362);
  const __half2 kBias = AsHalf2(0x64806480u);  // 1152 = 1024 + 128
  e01 = __hsub2(AsHalf2(h01), kBias);
  e23 = __hsub2(AsHalf2(h23), kBias);
}

// Two FP16 pairs (e0, e1), (e2, e3) -> f[0..3] (exact).
__device__ __forceinline__ void Half2x2ToFloat(__half2 e01, __half2 e23, float* f) {
  const float2 a = __half22float2(e01);
  const float2 b = __half22float2(e23);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

__device__ __forceinline__ void Int8x4ToFloat(uint32_t w, float* f) {
  __half2 e01, e23;
  Int8x4ToHalf2x2(w, e01, e23);
  Half2x2ToFloat(e01, e23, f);
}

// Eight unsigned nibbles (nibble i = bits 4i..4i+3 = element i) -> FP16
// pairs (e0, e4), (e1, e5), (e2, e6), (e3, e7).
// PRMT cannot address nibbles, so LOP3 masks them in place under the 0x6400
// exponent: mask 0x000F000F yields halves (1024 + n0, 1024 + n4), mask
// 0x00F000F0 yields (1024 + 16 n1, 1024 + 16 n5); the same on w >> 8 gives
// n2/n6 and n3/n7. HSUB2 removes 1024, HFMA2 (x / 16 - 64) the scaled ones;
// both exact. Consumers take the interleaved order as it comes (register
// naming, or a channel/token order chosen to match), which is free.
__device__ __forceinline__ void Int4x8ToHalf2x4(uint32_t w, __half2 (&e)[4]) {
  constexpr uint32_t kLo = 0x000F000Fu, kHi = 0x00F000F0u, kMagic = 0x64006400u;
  const __half2 k1024 = AsHalf2(0x64006400u);
  const __half2 kSixteenth = AsHalf2(0x2C002C00u);  // 1/16
  const __half2 kMinus64 = AsHalf2(0xD400D400u);    // -64
  const uint32_t w8 = w >> 8;
  e[0] = __hsub2(AsHalf2(AndOr(w, kLo, kMagic)), k1024);
  e[1] = __hfma2(AsHalf2(AndOr(w, kHi, kMagic)), kSixteenth, kMinus64);
  e[2] = __hsub2(AsHalf2(AndOr(w8, kLo, kMagic)), k1024);
  e[3] = __hfma2(AsHalf2(AndOr(w8, kHi, kMagic)), kSixteenth, kMinus64);
}

// The same pairs as FP16 *subnormals*, for the tensor-core operands: a
// half whose exponent field is 0 has the value (its 10-bit mantissa) *
// 2^-24, so the masked bits are the value itself. Mask 0x000F000F yields
// (n0, n4) * 2^-24, mask 0x00F000F0 yields (n1, n5) * 2^-20; no bias to
// remove and no scaling: five instructions for eight codes instead of nine.
// The consumer folds the units into its other operand and its FP32 result
// (CodePairUnit). Exact: the mma multiplies FP16 subnormals exactly and
// its FP32 accumulator holds the products (>= 2^-48) as normal numbers.
__device__ __forceinline__ void Int4x8ToSubnormalHalf2x4(uint32_t w, __half2 (&e)[4]) {
  constexpr uint32_t kLo = 0x000F000Fu, kHi = 0x00F000F0u;
  const uint32_t w8 = w >> 8;
  e[0] = AsHalf2(w & kLo);
  e[1] = AsHalf2(w & kHi);
  e[2] = AsHalf2(w8 & kLo);
  e[3] = AsHalf2(w8 & kHi);
}

__device__ __forceinline__ void Int4x8ToFloat(uint32_t w, float* f) {
  __half2 e[4];
  Int4x8ToHalf2x4(w, e);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(e[i]);
    f[i] = v.x;
    f[i + 4] = v.y;
  }
}

// Four E4M3 bytes -> FP16 pairs (e0, e1), (e2, e3) through the hardware
// conversion (cvt.f16x2.e4m3x2 on sm_89+, cuda_fp8.h's software path
// before): every E4M3 value is exact in FP16. NaN codes (0x7F/0xFF) never
// occur in written tokens.
__device__ __forceinline__ void Fp8x4ToHalf2x2(uint32_t w, __half2& e01, __half2& e23) {
  e01 = __half2(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3));
  e23 = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3));
}

__device__ __forceinline__ void Fp8x4ToFloat(uint32_t w, float* f) {
  __half2 e01, e23;
  Fp8x4ToHalf2x2(w, e01, e23);
  Half2x2ToFloat(e01, e23, f);
}

// Two BF16 (element 0 in the low half): a BF16 is the top half of an FP32.
__device__ __forceinline__ void Bf16x2ToFloat(uint32_t w, float* f) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xFFFF0000u);
}

__device__ __forceinline__ void Fp16x2ToFloat(uint32_t w, float* f) {
  const float2 a = __half22float2(AsHalf2(w));
  f[0] = a.x;
  f[1] = a.y;
}

}  // namespace dequant_detail

// The codes of one 16-byte vector of dtype T as floats, memory order.
template <DType T>
__device__ __forceinline__ void DequantCodes(const uint4& v, float (&f)[kElems<T>]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  constexpr int kPerWord = kElems<T> / 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float* out = f + j * kPerWord;
    if constexpr (T == DType::kBF16) {
      dequant_detail::Bf16x2ToFloat(w[j], out);
    } else if constexpr (T == DType::kFP16) {
      dequant_detail::Fp16x2ToFloat(w[j], out);
    } else if constexpr (T == DType::kFP8E4M3) {
      dequant_detail::Fp8x4ToFloat(w[j], out);
    } else if constexpr (T == DType::kINT8) {
      dequant_detail::Int8x4ToFloat(w[j], out);
    } else {
      static_assert(T == DType::kINT4, "not a cache dtype");
      dequant_detail::Int4x8ToFloat(w[j], out);
    }
  }
}

// Eight codes at a time: elements 8 * step .. 8 * step + 7 of the vector
// (step < kElems<T> / 8), so that a kernel holding several vectors keeps
// only eight floats of each live. `step` must be a constant after
// unrolling (it selects registers).
template <DType T>
__device__ __forceinline__ void DequantCodes8(const uint4& v, int step, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (T == DType::kBF16 || T == DType::kFP16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (T == DType::kBF16) {
        dequant_detail::Bf16x2ToFloat(w[j], f + 2 * j);
      } else {
        dequant_detail::Fp16x2ToFloat(w[j], f + 2 * j);
      }
    }
  } else if constexpr (T == DType::kFP8E4M3) {
    dequant_detail::Fp8x4ToFloat(w[2 * step], f);
    dequant_detail::Fp8x4ToFloat(w[2 * step + 1], f + 4);
  } else if constexpr (T == DType::kINT8) {
    dequant_detail::Int8x4ToFloat(w[2 * step], f);
    dequant_detail::Int8x4ToFloat(w[2 * step + 1], f + 4);
  } else {
    static_assert(T == DType::kINT4, "not a cache dtype");
    dequant_detail::Int4x8ToFloat(w[step], f);
  }
}

// ---- Codes as tensor-core operands (tc_decode.cuh) ----------------------
//
// The mma fragments take codes as 32-bit registers of two FP16 (BF16 for a
// BF16 cache) values. CodePairs<T>(w, step, lo, hi) gives step `step` of the
// 32-bit words `w` (a 16-byte K chunk: steps 0 .. 128 / bits / 4 - 1; an
// 8-byte V span: steps 0 .. 64 / bits / 4 - 1) as two such registers, four
// codes in all, without any shuffling of bits beyond the conversions above:
// the elements it picks are PairElement<T>(step, slot) for slots 0, 1 (lo)
// and 2, 3 (hi). The decode lays its channels (K) and tokens (V) out in that
// order, so every conversion is as cheap as the format allows. INT4 codes
// come as FP16 subnormals (Int4x8ToSubnormalHalf2x4): code n is n *
// CodePairUnit<T>(false) in `lo` and n * CodePairUnit<T>(true) in `hi`.
template <DType T>
KVP_HOST_DEVICE constexpr int PairElement(int step, int slot) {
  if constexpr (T == DType::kINT4) {
    // Int4x8ToSubnormalHalf2x4's pairs (n0, n4), (n1, n5) | (n2, n6), (n3, n7).
    return 8 * (step >> 1) + 2 * (step & 1) + (slot >> 1) + 4 * (slot & 1);
  } else {
    return 4 * step + slot;
  }
}

// The value code 1 has in CodePairs' lo (hi = false) and hi registers.
template <DType T>
KVP_HOST_DEVICE constexpr float CodePairUnit(bool hi) {
  if constexpr (T == DType::kINT4) {
    return hi ? 1.0f / (1 << 20) : 1.0f / (1 << 24);
  } else {
    return 1.0f;
  }
}

template <DType T>
__device__ __forceinline__ void CodePairs(const uint32_t* w, int step, uint32_t& lo, uint32_t& hi) {
  if constexpr (T == DType::kBF16 || T == DType::kFP16) {
    lo = w[2 * step];  // already pairs of the mma's input type
    hi = w[2 * step + 1];
  } else {
    __half2 a, b;
    if constexpr (T == DType::kINT8) {
      dequant_detail::Int8x4ToHalf2x2(w[step], a, b);
    } else if constexpr (T == DType::kFP8E4M3) {
      dequant_detail::Fp8x4ToHalf2x2(w[step], a, b);
    } else {
      static_assert(T == DType::kINT4, "not a cache dtype");
      __half2 e[4];
      dequant_detail::Int4x8ToSubnormalHalf2x4(w[step >> 1], e);
      a = e[2 * (step & 1)];
      b = e[2 * (step & 1) + 1];
    }
    lo = *reinterpret_cast<const uint32_t*>(&a);
    hi = *reinterpret_cast<const uint32_t*>(&b);
  }
}

// A token's scale entry (docs/FORMATS.md "Scales"): {scale, min} as float.
// FP16/BF16 have none: {1, 0}. Symmetric formats: {scale, 0}. INT4: the
// two FP16 halves of the 4-byte entry, scale first.
struct TokenScale {
  float scale;
  float min;
};

// A token's scale entry from its bits (INT4: the 4-byte entry; INT8/FP8:
// the 2-byte entry in the low half).
template <DType T>
__device__ __forceinline__ TokenScale TokenScaleFromBits(uint32_t u) {
  if constexpr (T == DType::kINT4) {
    const float2 sm = __half22float2(dequant_detail::AsHalf2(u));
    return {sm.x, sm.y};
  } else if constexpr (T == DType::kINT8 || T == DType::kFP8E4M3) {
    return {__half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xFFFFu))), 0.0f};
  } else {
    return {1.0f, 0.0f};
  }
}

template <DType T>
__device__ __forceinline__ TokenScale LoadTokenScale(const uint8_t* entry) {
  if constexpr (T == DType::kINT4) {
    return TokenScaleFromBits<T>(__ldg(reinterpret_cast<const unsigned int*>(entry)));
  } else if constexpr (T == DType::kINT8 || T == DType::kFP8E4M3) {
    return TokenScaleFromBits<T>(__ldg(reinterpret_cast<const unsigned short*>(entry)));
  } else {
    return {1.0f, 0.0f};
  }
}

// The same with the dtype known at run time only (V in the decode).
__device__ __forceinline__ TokenScale LoadTokenScale(DType t, const uint8_t* entry) {
  switch (t) {
    case DType::kINT4:
      return LoadTokenScale<DType::kINT4>(entry);
    case DType::kINT8:
    case DType::kFP8E4M3:
      return LoadTokenScale<DType::kINT8>(entry);
    default:
      return {1.0f, 0.0f};
  }
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_DEQUANT_CUH_
