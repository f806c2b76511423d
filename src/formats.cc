// SPDX-License-Identifier: Apache-2.0
// The reference definition of every KV cache format (see formats.h and
// docs/FORMATS.md). Everything here is plain IEEE FP32 arithmetic in the
// default rounding mode (round half to even); conversions to narrow floats
// are done on bit patterns so that they do not depend on F16C or on the
// compiler's handling of _Float16.
#include "src/formats.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvpage {
namespace {

// ---- Bit helpers ----------------------------------------------------------

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}

constexpr uint64_t kF64SignMask = uint64_t{1} << 63;
constexpr uint64_t kF64AbsMask = kF64SignMask - 1;
constexpr uint64_t kF64InfBits = uint64_t{0x7FF} << 52;
constexpr int kF64MantBits = 52;
constexpr int kF64Bias = 1023;
// 2^e as a double's bit pattern.
constexpr uint64_t F64PowerOfTwoBits(int e) { return static_cast<uint64_t>(kF64Bias + e) << 52; }

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32InfBits = 0x7F800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;

// ---- Rounding FP32 to a narrower binary float -----------------------------

// Where the discarded part of a magnitude lies relative to half of the
// target's unit in the last place.
enum class Remainder { kZero, kBelowHalf, kHalf, kAboveHalf };

// A finite, non-negative FP32 magnitude cut down (truncated toward zero) to a
// narrower binary format with `mant_bits` fraction bits and smallest normal
// exponent `min_exp` (unbiased), plus what was cut off. `truncated` is the
// target's magnitude bit pattern (biased exponent above the fraction), so
// that adding 1 to it steps to the next representable magnitude, across
// binades and subnormals alike. Only valid below the power of two just past
// the target's largest finite value (the callers handle overflow first).
struct Truncated {
  uint32_t truncated;
  Remainder remainder;
};

Remainder Classify(uint64_t rem, uint64_t half) {
  if (rem == 0) return Remainder::kZero;
  if (rem < half) return Remainder::kBelowHalf;
  if (rem == half) return Remainder::kHalf;
  return Remainder::kAboveHalf;
}

// The source is FP32 (Bits = uint32_t, 23 fraction bits, bias 127) or
// double (uint64_t, 52, 1023); one definition serves both.
template <typename Bits, int kSrcMant, int kSrcBias>
Truncated TruncateMagnitude(Bits abs_bits, int mant_bits, int min_exp) {
  const int bias = 1 - min_exp;
  const Bits exp_field = abs_bits >> kSrcMant;
  const Bits frac = abs_bits & ((Bits{1} << kSrcMant) - 1);
  if (exp_field == 0) {
    // Source subnormals (FP32: < 2^-126, double: < 2^-1022) are far below
    // the smallest subnormal of every target (2^-24, 2^-133, 2^-9):
    // nonzero ones lie below half of it.
    return {0, frac == 0 ? Remainder::kZero : Remainder::kBelowHalf};
  }
  const int exp = static_cast<int>(exp_field) - kSrcBias;
  const int drop = kSrcMant - mant_bits;  // source fraction bits the target lacks
  if (exp >= min_exp) {
    // Normal in the target: rebias the exponent, drop low fraction bits.
    const Bits rebased = abs_bits - (static_cast<Bits>(kSrcBias - bias) << kSrcMant);
    return {static_cast<uint32_t>(rebased >> drop),
            Classify(static_cast<uint64_t>(rebased & ((Bits{1} << drop) - 1)),
                     uint64_t{1} << (drop - 1))};
  }
  // Subnormal in the target: count units of 2^(min_exp - mant_bits) in the
  // full significand (kSrcMant + 1 bits), whose unit is 2^(exp - kSrcMant).
  const uint64_t significand = static_cast<uint64_t>(frac) | (uint64_t{1} << kSrcMant);
  const int shift = drop + (min_exp - exp);
  if (shift > kSrcMant + 2) {
    // significand < 2^(kSrcMant + 1) < half of a unit: rounds like a tiny
    // value.
    return {0, Remainder::kBelowHalf};
  }
  const uint64_t mask = (uint64_t{1} << shift) - 1;
  return {static_cast<uint32_t>(significand >> shift),
          Classify(significand & mask, uint64_t{1} << (shift - 1))};
}

// From FP32 bit patterns (the quantizer's conversions).
Truncated TruncateMagnitude(uint32_t abs_bits, int mant_bits, int min_exp) {
  return TruncateMagnitude<uint32_t, 23, 127>(abs_bits, mant_bits, min_exp);
}

// Whether the truncated magnitude must step up by one unit.
enum class Rounding { kNearestEven, kTowardPositive, kTowardNegative };

bool RoundsUp(const Truncated& t, bool negative, Rounding mode) {
  switch (mode) {
    case Rounding::kNearestEven:
      return t.remainder == Remainder::kAboveHalf ||
             (t.remainder == Remainder::kHalf && (t.truncated & 1u) != 0);
    case Rounding::kTowardPositive:
      // Away from zero only for positive values; negatives truncate.
      return !negative && t.remainder != Remainder::kZero;
    case Rounding::kTowardNegative:
      return negative && t.remainder != Remainder::kZero;
  }
  return false;
}

// ---- binary16 -------------------------------------------------------------

constexpr uint16_t kHalfSignMask = 0x8000;
constexpr uint16_t kHalfInfBits = 0x7C00;
constexpr uint16_t kHalfQuietNanBits = 0x7E00;
constexpr int kHalfMantBits = 10;
constexpr int kHalfMinExp = -14;
// 2^16: the first power of two past every finite half.
constexpr uint32_t kF32Bits65536 = 0x47800000u;

uint16_t FloatToHalf(float f, Rounding mode) {
  const uint32_t bits = FloatBits(f);
  const bool negative = (bits & kF32SignMask) != 0;
  const uint16_t sign = negative ? kHalfSignMask : 0;
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return sign | kHalfQuietNanBits;
  if (abs_bits >= kF32Bits65536) {
    // Infinite, or finite beyond the largest binade (>= 2^16). Rounding
    // toward zero gives the largest finite value; the other ways give Inf.
    if (abs_bits == kF32InfBits) return sign | kHalfInfBits;
    const bool toward_zero = (mode == Rounding::kTowardPositive && negative) ||
                             (mode == Rounding::kTowardNegative && !negative);
    return sign | (toward_zero ? kHalfMaxBits : kHalfInfBits);
  }
  const Truncated t = TruncateMagnitude(abs_bits, kHalfMantBits, kHalfMinExp);
  // Stepping up from 0x7BFF gives 0x7C00 (Inf): exactly IEEE overflow.
  const uint32_t mag = t.truncated + (RoundsUp(t, negative, mode) ? 1u : 0u);
  return static_cast<uint16_t>(sign | mag);
}

// ---- FP8 E4M3 ("fn") ------------------------------------------------------

constexpr uint8_t kFp8NanBits = 0x7F;
constexpr uint8_t kFp8MaxBits = 0x7E;  // 448
constexpr int kFp8MantBits = 3;
constexpr int kFp8MinExp = -6;
constexpr uint32_t kF32Bits512 = 0x44000000u;  // 2^9: beyond every finite E4M3

// ---- Quantizer helpers ----------------------------------------------------

// What step 1 of the quantizer did to an element.
enum class Fixup { kNone, kNonFinite, kOverflow };

// Step 1: the value to be stored for element i (x_i / smoothing_i or x_i),
// with non-finite inputs replaced by 0 and a smoothing quotient that
// overflowed clipped to +-FLT_MAX.
float PreparedValue(const float* x, const float* smoothing, int i, Fixup* fixup) {
  *fixup = Fixup::kNone;
  const float xi = x[i];
  if (!std::isfinite(xi)) {
    *fixup = Fixup::kNonFinite;
    return 0.0f;
  }
  if (smoothing == nullptr) return xi;
  const float v = xi / smoothing[i];
  if (std::isnan(v)) {
    // Only possible with an invalid divisor (0/0); the C API rejects
    // non-positive or non-finite smoothing, so treat it like a bad input.
    *fixup = Fixup::kNonFinite;
    return 0.0f;
  }
  if (std::isinf(v)) {
    *fixup = Fixup::kOverflow;
    return std::copysign(FLT_MAX, v);
  }
  return v;
}

// Counts an element clipped by steps 2-4, unless step 1 already counted it
// (a smoothing overflow is always clipped again later; count it once).
void CountClip(Fixup fixup, QuantStats* stats) {
  if (fixup != Fixup::kOverflow) ++stats->saturated;
}

// Scales are FP16, rounded up (away from the data) and clipped to 65504. A
// positive quotient whose FP32 division underflowed to 0 still gets the
// smallest positive half, which is where rounding the exact quotient up
// would have put it: amax > 0 always gives scale > 0.
uint16_t ScaleUp(float quotient) {
  uint16_t s = FloatToHalfUp(quotient);
  if (s == kHalfInfBits) s = kHalfMaxBits;
  if (s == 0) s = 0x0001;
  return s;
}

// Step 2: FP16/BF16 codes (round half to even, overflow saturates).
void QuantizeFloat16(DType dtype, const float* x, const float* smoothing, int n, uint16_t* codes,
                     QuantStats* stats) {
  const bool bf16 = dtype == DType::kBF16;
  const uint16_t max_bits = bf16 ? 0x7F7F : kHalfMaxBits;
  for (int i = 0; i < n; ++i) {
    Fixup fixup;
    const float v = PreparedValue(x, smoothing, i, &fixup);
    if (fixup == Fixup::kNonFinite) ++stats->non_finite;
    if (fixup == Fixup::kOverflow) ++stats->saturated;
    uint16_t code = bf16 ? FloatToBf16Rne(v) : FloatToHalfRne(v);
    if ((code & 0x7FFF) == (bf16 ? 0x7F80 : kHalfInfBits)) {
      // v is finite here, so an infinite code is an overflow.
      code = (code & 0x8000) | max_bits;
      CountClip(fixup, stats);
    }
    codes[i] = code;
  }
}

// Step 3: symmetric formats (INT8, FP8), one FP16 scale.
void QuantizeSymmetric(DType dtype, const float* x, const float* smoothing, int n, uint16_t* codes,
                       ScaleEntry* scale, QuantStats* stats) {
  const float qmax = SymmetricMax(dtype);
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    Fixup fixup;
    const float v = PreparedValue(x, smoothing, i, &fixup);
    if (fixup == Fixup::kNonFinite) ++stats->non_finite;
    if (fixup == Fixup::kOverflow) ++stats->saturated;
    amax = std::fmax(amax, std::fabs(v));
  }
  if (amax == 0.0f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    scale->scale = 0;
    return;
  }
  scale->scale = ScaleUp(amax / qmax);
  const float s = HalfToFloat(scale->scale);
  for (int i = 0; i < n; ++i) {
    Fixup fixup;
    const float q = PreparedValue(x, smoothing, i, &fixup) / s;
    if (dtype == DType::kINT8) {
      float r = std::nearbyint(q);
      if (std::fabs(r) > qmax) {
        r = std::copysign(qmax, r);
        CountClip(fixup, stats);
      }
      const int8_t c = static_cast<int8_t>(r);
      codes[i] = static_cast<uint8_t>(c);
    } else {
      // E4M3 rounding goes past 448 exactly when |q| > 464 (the midpoint
      // to the next step, 480, ties to the even 448); it saturates.
      if (std::fabs(q) > 464.0f) CountClip(fixup, stats);
      codes[i] = FloatToFp8E4M3(q);
    }
  }
}

// Step 4: INT4, asymmetric: FP16 {scale, min}, x = code * scale + min.
void QuantizeInt4(const float* x, const float* smoothing, int n, uint16_t* codes, ScaleEntry* scale,
                  QuantStats* stats) {
  float lo = 0.0f;
  float hi = 0.0f;
  for (int i = 0; i < n; ++i) {
    Fixup fixup;
    const float v = PreparedValue(x, smoothing, i, &fixup);
    if (fixup == Fixup::kNonFinite) ++stats->non_finite;
    if (fixup == Fixup::kOverflow) ++stats->saturated;
    lo = i == 0 ? v : std::fmin(lo, v);
    hi = i == 0 ? v : std::fmax(hi, v);
  }
  // Rounded down (away from the data); only -Inf needs clipping, since
  // rounding a value above 65504 down gives 65504.
  uint16_t m_bits = FloatToHalfDown(lo);
  if (m_bits == (kHalfSignMask | kHalfInfBits)) {
    m_bits = kHalfSignMask | kHalfMaxBits;
  }
  // A min of -0 is stored as +0, so that zero vectors give all-zero entries
  // whatever the signs of their zeros (and whatever fmin does with them).
  if (m_bits == kHalfSignMask) m_bits = 0;
  const float m = HalfToFloat(m_bits);
  scale->min = m_bits;
  const float r = hi - m;
  if (!(r > 0.0f)) {
    // Every value equals m, or lies below it because m was clipped.
    for (int i = 0; i < n; ++i) {
      Fixup fixup;
      if (PreparedValue(x, smoothing, i, &fixup) < m) CountClip(fixup, stats);
      codes[i] = 0;
    }
    scale->scale = 0;
    return;
  }
  scale->scale = ScaleUp(r / 15.0f);
  const float s = HalfToFloat(scale->scale);
  for (int i = 0; i < n; ++i) {
    Fixup fixup;
    const float q = (PreparedValue(x, smoothing, i, &fixup) - m) / s;
    float c = std::nearbyint(q);
    if (c < 0.0f || c > 15.0f) {
      c = c < 0.0f ? 0.0f : 15.0f;
      CountClip(fixup, stats);
    }
    codes[i] = static_cast<uint16_t>(c);
  }
}

}  // namespace

// ---- Scalar conversions ----------------------------------------------------

uint16_t FloatToHalfRne(float f) { return FloatToHalf(f, Rounding::kNearestEven); }
uint16_t FloatToHalfUp(float f) { return FloatToHalf(f, Rounding::kTowardPositive); }
uint16_t FloatToHalfDown(float f) { return FloatToHalf(f, Rounding::kTowardNegative); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & kHalfSignMask) << 16;
  const uint32_t exp = (h >> kHalfMantBits) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) {
    // Inf, or NaN with its payload kept and made quiet.
    return BitsToFloat(sign | kF32InfBits | (mant << 13) | (mant != 0 ? kF32QuietBit : 0));
  }
  // mant * 2^-24 for subnormals, (1024 + mant) * 2^(exp - 25) otherwise;
  // both are exact in FP32.
  const float mag = exp == 0
                        ? std::ldexp(static_cast<float>(mant), -24)
                        : std::ldexp(static_cast<float>(1024 + mant), static_cast<int>(exp) - 25);
  return BitsToFloat(sign | FloatBits(mag));
}

uint16_t FloatToBf16Rne(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & kF32AbsMask) > kF32InfBits) {
    return static_cast<uint16_t>((bits | kF32QuietBit) >> 16);
  }
  // Adding 0x7FFF plus the kept part's lowest bit rounds half to even; a
  // carry into the exponent is the correct result (up to Inf on overflow).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

uint16_t DoubleToHalfRne(double d) {
  const uint64_t bits = DoubleBits(d);
  const bool negative = (bits & kF64SignMask) != 0;
  const uint16_t sign = negative ? kHalfSignMask : 0;
  const uint64_t abs_bits = bits & kF64AbsMask;
  if (abs_bits > kF64InfBits) return sign | kHalfQuietNanBits;
  // 2^16 and beyond (Inf included) is past every finite half.
  if (abs_bits >= F64PowerOfTwoBits(16)) return sign | kHalfInfBits;
  const Truncated t =
      TruncateMagnitude<uint64_t, kF64MantBits, kF64Bias>(abs_bits, kHalfMantBits, kHalfMinExp);
  // Stepping up from 0x7BFF gives 0x7C00 (Inf): exactly IEEE overflow.
  const uint32_t mag = t.truncated + (RoundsUp(t, negative, Rounding::kNearestEven) ? 1u : 0u);
  return static_cast<uint16_t>(sign | mag);
}

uint16_t DoubleToBf16Rne(double d) {
  constexpr int kBf16MantBits = 7;
  constexpr int kBf16MinExp = -126;
  constexpr uint16_t kBf16InfBits = 0x7F80;
  const uint64_t bits = DoubleBits(d);
  const bool negative = (bits & kF64SignMask) != 0;
  const uint16_t sign = negative ? kHalfSignMask : 0;
  const uint64_t abs_bits = bits & kF64AbsMask;
  if (abs_bits > kF64InfBits) {
    // Quiet, with the payload's top bits: what FP32 would have kept.
    const uint16_t payload =
        static_cast<uint16_t>((abs_bits >> (kF64MantBits - kBf16MantBits)) & 0x7F);
    return sign | kBf16InfBits | 0x40 | payload;
  }
  // 2^128 and beyond (Inf included) is past every finite bfloat16.
  if (abs_bits >= F64PowerOfTwoBits(128)) return sign | kBf16InfBits;
  const Truncated t =
      TruncateMagnitude<uint64_t, kF64MantBits, kF64Bias>(abs_bits, kBf16MantBits, kBf16MinExp);
  // Stepping up from 0x7F7F gives 0x7F80 (Inf): exactly IEEE overflow.
  const uint32_t mag = t.truncated + (RoundsUp(t, negative, Rounding::kNearestEven) ? 1u : 0u);
  return static_cast<uint16_t>(sign | mag);
}

uint8_t FloatToFp8E4M3(float f) {
  const uint32_t bits = FloatBits(f);
  const uint8_t sign = (bits & kF32SignMask) != 0 ? 0x80 : 0;
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return kFp8NanBits;
  // Inf and everything >= 512 saturate (SATFINITE).
  if (abs_bits >= kF32Bits512) return static_cast<uint8_t>(sign | kFp8MaxBits);
  const Truncated t = TruncateMagnitude(abs_bits, kFp8MantBits, kFp8MinExp);
  uint32_t mag = t.truncated + (RoundsUp(t, false, Rounding::kNearestEven) ? 1u : 0u);
  // 0x7F would be NaN: anything rounding past 448 saturates.
  if (mag > kFp8MaxBits) mag = kFp8MaxBits;
  return static_cast<uint8_t>(sign | mag);
}

float Fp8E4M3ToFloat(uint8_t b) {
  const bool negative = (b & 0x80) != 0;
  if ((b & 0x7F) == kFp8NanBits) return std::nanf("");
  const int exp = (b >> kFp8MantBits) & 0xF;
  const int mant = b & 0x7;
  // mant * 2^-9 for subnormals, (8 + mant) * 2^(exp - 10) otherwise.
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)
                             : std::ldexp(static_cast<float>(8 + mant), exp - 10);
  return negative ? -mag : mag;
}

// ---- Quantizer
// ---------------------------------------------------------------

float SymmetricMax(DType dtype) {
  switch (dtype) {
    case DType::kINT8:
      return 127.0f;
    case DType::kFP8E4M3:
      return 448.0f;
    default:
      return 0.0f;  // not a symmetric format
  }
}

void QuantizeVector(DType dtype, const float* x, const float* smoothing, int n, uint16_t* codes,
                    ScaleEntry* scale, QuantStats* stats) {
  // Counters accumulate over calls (the write telemetry sums over tokens).
  QuantStats ignored;
  if (stats == nullptr) stats = &ignored;
  *scale = ScaleEntry{};
  switch (dtype) {
    case DType::kFP16:
    case DType::kBF16:
      QuantizeFloat16(dtype, x, smoothing, n, codes, stats);
      return;
    case DType::kFP8E4M3:
    case DType::kINT8:
      QuantizeSymmetric(dtype, x, smoothing, n, codes, scale, stats);
      return;
    case DType::kINT4:
      QuantizeInt4(x, smoothing, n, codes, scale, stats);
      return;
    case DType::kFP32:
      break;  // not a cache dtype; callers validate dtypes
  }
  for (int i = 0; i < n; ++i) codes[i] = 0;
}

void DequantizeCodes(DType dtype, const uint16_t* codes, int n, ScaleEntry scale, double* out) {
  const double s = HalfToFloat(scale.scale);
  // The switch sits outside the loops: the CPU decode calls this per token.
  switch (dtype) {
    case DType::kFP16:
      for (int i = 0; i < n; ++i) out[i] = HalfToFloat(codes[i]);
      return;
    case DType::kBF16:
      for (int i = 0; i < n; ++i) out[i] = Bf16ToFloat(codes[i]);
      return;
    case DType::kFP8E4M3:
      for (int i = 0; i < n; ++i) {
        out[i] = static_cast<double>(Fp8E4M3ToFloat(static_cast<uint8_t>(codes[i]))) * s;
      }
      return;
    case DType::kINT8:
      for (int i = 0; i < n; ++i)
        out[i] = static_cast<double>(static_cast<int8_t>(codes[i] & 0xFF)) * s;
      return;
    case DType::kINT4: {
      const double m = HalfToFloat(scale.min);
      for (int i = 0; i < n; ++i) out[i] = static_cast<double>(codes[i] & 0xF) * s + m;
      return;
    }
    case DType::kFP32:
      break;  // not a cache dtype
  }
  for (int i = 0; i < n; ++i) out[i] = std::nan("");
}

double DequantizeCode(DType dtype, uint16_t code, ScaleEntry scale) {
  double value;
  DequantizeCodes(dtype, &code, 1, scale, &value);
  return value;
}

// Internal helpers: callers (the C API) have validated that dtype is FP32,
// FP16 or BF16; anything else loads NaN and stores nothing.
float LoadAsFloat(DType dtype, const void* base, int64_t index) {
  const unsigned char* p = static_cast<const unsigned char*>(base);
  switch (dtype) {
    case DType::kFP32: {
      float f;
      std::memcpy(&f, p + index * 4, sizeof(f));
      return f;
    }
    case DType::kFP16:
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + index * 2, sizeof(h));
      return dtype == DType::kFP16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
    default:
      return std::nanf("");
  }
}

void StoreFromFloat(DType dtype, void* base, int64_t index, float v) {
  unsigned char* p = static_cast<unsigned char*>(base);
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(p + index * 4, &v, sizeof(v));
      return;
    case DType::kFP16:
    case DType::kBF16: {
      const uint16_t h = dtype == DType::kFP16 ? FloatToHalfRne(v) : FloatToBf16Rne(v);
      std::memcpy(p + index * 2, &h, sizeof(h));
      return;
    }
    default:
      return;
  }
}

void StoreFromDouble(DType dtype, void* base, int64_t index, double v) {
  unsigned char* p = static_cast<unsigned char*>(base);
  switch (dtype) {
    case DType::kFP32: {
      const float f = static_cast<float>(v);  // one IEEE rounding, half to even
      std::memcpy(p + index * 4, &f, sizeof(f));
      return;
    }
    case DType::kFP16:
    case DType::kBF16: {
      const uint16_t h = dtype == DType::kFP16 ? DoubleToHalfRne(v) : DoubleToBf16Rne(v);
      std::memcpy(p + index * 2, &h, sizeof(h));
      return;
    }
    default:
      return;
  }
}

}  // namespace kvpage
