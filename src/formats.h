// SPDX-License-Identifier: Apache-2.0
// The reference definition of every KV cache format: scalar conversions and
// the per-token-per-head quantizer, each an exact sequence of IEEE FP32
// operations. The CUDA write kernel must produce the same bytes; where it
// does arithmetic, it uses the same operations in the same order with
// explicitly rounded intrinsics (__fsub_rn, __fdiv_rn, no FMA contraction).
// docs/FORMATS.md describes the formats for engine authors.
#ifndef KVPAGE_SRC_FORMATS_H_
#define KVPAGE_SRC_FORMATS_H_

#include <cstdint>

#include "src/geometry.h"

namespace kvpage {

// ---- Scalar conversions (bit-exact software implementations) -------------

// IEEE binary16 from FP32, round half to even; overflow gives +-Inf, NaN
// stays NaN.
uint16_t FloatToHalfRne(float f);
// IEEE binary16 from FP32, rounded toward +Inf / toward -Inf (used for
// scales, so that codes never overflow because the scale was rounded).
uint16_t FloatToHalfUp(float f);
uint16_t FloatToHalfDown(float f);
float HalfToFloat(uint16_t h);

// bfloat16 from FP32, round half to even; overflow gives +-Inf.
uint16_t FloatToBf16Rne(float f);
float Bf16ToFloat(uint16_t b);

// IEEE binary16 and bfloat16 from double, rounded once, half to even
// (never through FP32, which would round twice: 1 + 2^-11 + 2^-26 is
// 0x3C01 in binary16, but 0x3C00 through FP32). Subnormals round like
// everything else; a magnitude that rounds past the largest finite value
// gives +-Inf; NaN gives a quiet NaN of the same sign (binary16: 0x7E00;
// bfloat16: the top payload bits kept, as through FP32). The CPU decode
// rounds its double results to FP16/BF16 outputs with these.
uint16_t DoubleToHalfRne(double d);
uint16_t DoubleToBf16Rne(double d);

// FP8 E4M3 ("fn": no Inf, 0x7F/0xFF are NaN, max 448) from FP32, round half
// to even, including subnormals (smallest 2^-9). Values whose rounding
// would exceed 448 in magnitude give +-448 (saturate); NaN gives 0x7F.
// Same as CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3).
uint8_t FloatToFp8E4M3(float f);
float Fp8E4M3ToFloat(uint8_t b);

// Largest finite binary16 (65504) as bits.
constexpr uint16_t kHalfMaxBits = 0x7BFF;

// ---- Per-token-per-head quantizer ----------------------------------------

// One scale entry as stored in the cache, FP16 bits. `min` is used by INT4
// only (asymmetric: x = code * scale + min); symmetric formats store
// `scale` alone (x = code * scale).
struct ScaleEntry {
  uint16_t scale = 0;
  uint16_t min = 0;
};

// What the quantizer saw (the write telemetry).
struct QuantStats {
  uint64_t non_finite = 0;  // NaN/Inf inputs; stored as 0
  uint64_t saturated = 0;   // finite values clipped to the format's range
};

// Largest code magnitude of a symmetric format: INT8 127, FP8 448.
float SymmetricMax(DType dtype);

// Quantizes one token's vector for one KV head, x[0..n), into codes[0..n)
// and *scale. `smoothing` is NULL or n positive divisors (key smoothing:
// the stored value is x / smoothing). Codes by dtype:
//   FP16 / BF16: the 16-bit pattern;           scale unused (left 0)
//   FP8_E4M3:    the E4M3 byte;                scale = FP16 scale
//   INT8:        the int8 byte (two's complement), -127..127
//   INT4:        0..15;                        scale = {scale, min}
// The exact sequence (v_i = x_i / smoothing_i, or x_i):
//   1. non-finite x_i (or v_i that overflowed to +-Inf: saturated, clipped
//      to +-FLT_MAX) become 0 and are counted;
//   2. FP16/BF16: code = round-half-even(v); overflow saturates to the
//      largest finite value and is counted;
//   3. symmetric: amax = max |v_i|; amax == 0 -> scale 0, codes 0. Else
//      s = FloatToHalfUp(amax / QMAX), clipped to 65504; code =
//      RNE(v_i / s) clipped to +-QMAX (clips counted as saturated);
//   4. INT4: m = FloatToHalfDown(min v_i) clipped to [-65504, 65504];
//      r = max v_i - m; r <= 0 -> scale 0, codes 0. Else
//      s = FloatToHalfUp(r / 15) clipped to 65504;
//      code = RNE((v_i - m) / s) clipped to [0, 15] (clips counted).
// Because scales round away from the data, codes clip only when the scale
// itself had to be clipped (values beyond ~65504 * QMAX).
void QuantizeVector(DType dtype, const float* x, const float* smoothing, int n, uint16_t* codes,
                    ScaleEntry* scale, QuantStats* stats);

// The value a stored code stands for, exactly (double holds every result).
double DequantizeCode(DType dtype, uint16_t code, ScaleEntry scale);
// The same for n codes sharing one scale entry (a token's row).
void DequantizeCodes(DType dtype, const uint16_t* codes, int n, ScaleEntry scale, double* out);

// Converts an input element of dtype FP32/FP16/BF16 to float (exact).
float LoadAsFloat(DType dtype, const void* base, int64_t index);
// Stores a float as FP32/FP16/BF16 (RNE; 16-bit overflow gives +-Inf).
void StoreFromFloat(DType dtype, void* base, int64_t index, float v);
// Stores a double as FP32/FP16/BF16, rounded once (RNE; overflow gives
// +-Inf): the CPU decode's outputs.
void StoreFromDouble(DType dtype, void* base, int64_t index, double v);

}  // namespace kvpage

#endif  // KVPAGE_SRC_FORMATS_H_
