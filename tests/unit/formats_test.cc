// SPDX-License-Identifier: Apache-2.0
// Tests of the reference formats: scalar conversions against references
// built from double arithmetic and exhaustive tables, and the quantizer's
// error bounds, telemetry and edge cases.
#include "src/formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kvpage {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

float NextUp(float f) { return std::nextafter(f, INFINITY); }
float NextDown(float f) { return std::nextafter(f, -INFINITY); }

// A fresh seed for every run, printed with any failure.
uint32_t FreshSeed() { return std::random_device{}(); }

std::string SeedTrace(uint32_t seed) { return "seed=" + std::to_string(seed); }

// ---- References for the narrow float formats ---------------------------

enum class Mode { kRne, kUp, kDown };

// The non-negative finite values of a narrow format, indexed by magnitude
// bit pattern (the bit pattern of a positive value is its rank), computed
// from the format's definition in double.
std::vector<double> HalfGrid() {
  std::vector<double> grid;
  for (int bits = 0; bits <= 0x7BFF; ++bits) {
    const int exp = bits >> 10;
    const int mant = bits & 0x3FF;
    grid.push_back(exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25));
  }
  return grid;
}

std::vector<double> Fp8Grid() {
  std::vector<double> grid;
  for (int bits = 0; bits <= 0x7E; ++bits) {
    const int exp = bits >> 3;
    const int mant = bits & 7;
    grid.push_back(exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10));
  }
  return grid;
}

const std::vector<double>& HalfValues() {
  static const std::vector<double> grid = HalfGrid();
  return grid;
}

const std::vector<double>& Fp8Values() {
  static const std::vector<double> grid = Fp8Grid();
  return grid;
}

// Index of the grid value at or below `a` (a >= 0), and whether it is exact.
size_t FloorIndex(const std::vector<double>& grid, double a, bool* exact) {
  const size_t lo =
      static_cast<size_t>(std::upper_bound(grid.begin(), grid.end(), a) - grid.begin()) - 1;
  *exact = grid[lo] == a;
  return lo;
}

// Rounds `f` onto a grid whose next value past the end is `beyond` (the
// next binade's first value, as if the exponent range went on). Returns the
// magnitude rank; grid.size() means "past the largest finite value".
size_t RoundOnGrid(const std::vector<double>& grid, double beyond, double f, Mode mode) {
  const double a = std::fabs(f);
  bool exact;
  const size_t lo = FloorIndex(grid, a, &exact);
  if (exact) return lo;
  const size_t hi = lo + 1;
  const double hi_value = hi < grid.size() ? grid[hi] : beyond;
  const bool negative = f < 0;
  switch (mode) {
    case Mode::kRne: {
      const double below = a - grid[lo];
      const double above = hi_value - a;
      if (below < above) return lo;
      if (above < below) return hi;
      return lo % 2 == 0 ? lo : hi;
    }
    case Mode::kUp:
      return negative ? lo : hi;
    case Mode::kDown:
      return negative ? hi : lo;
  }
  return lo;
}

// IEEE binary16 result of rounding a float, from the grid above.
uint16_t RefHalf(float f, Mode mode) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0x7E00;  // compared as "is NaN" only
  if (std::isinf(f)) return sign | 0x7C00;
  // Indices past 0x7BFF are 0x7C00: Inf.
  const size_t rank = RoundOnGrid(HalfValues(), 65536.0, f, mode);
  return static_cast<uint16_t>(sign | std::min<size_t>(rank, 0x7C00));
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }

// FP8 E4M3 with saturation, from the grid.
uint8_t RefFp8(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isinf(f)) return sign | 0x7E;
  const size_t rank = RoundOnGrid(Fp8Values(), 480.0, f, Mode::kRne);
  return static_cast<uint8_t>(sign | std::min<size_t>(rank, 0x7E));
}

// bfloat16 RNE from the two neighbouring bfloat16 values, in double.
uint16_t RefBf16(float f) {
  const uint32_t bits = Bits(f);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t lower = bits & 0x7FFF0000u;
  const uint32_t upper = lower + 0x10000u;
  const double a = std::fabs(static_cast<double>(f));
  const double lo = FromBits(lower);
  // The value past the largest finite one (0x7F7F) is 2^128.
  const double hi = upper == 0x7F800000u ? std::ldexp(1.0, 128) : FromBits(upper);
  uint32_t pick;
  if (a - lo < hi - a) {
    pick = lower;
  } else if (hi - a < a - lo) {
    pick = upper;
  } else {
    pick = ((lower >> 16) & 1) == 0 ? lower : upper;
  }
  return static_cast<uint16_t>((sign | pick) >> 16);
}

// ---- binary16 ---------------------------------------------------------------

TEST(HalfTest, DecodesEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const bool negative = (h & 0x8000) != 0;
    const uint32_t mag = h & 0x7FFF;
    if (mag > 0x7C00) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else if (mag == 0x7C00) {
      EXPECT_EQ(f, negative ? -INFINITY : INFINITY) << std::hex << h;
    } else {
      const double want = negative ? -HalfValues()[mag] : HalfValues()[mag];
      EXPECT_EQ(static_cast<double>(f), want) << std::hex << h;
      EXPECT_EQ(std::signbit(f), negative) << std::hex << h;
    }
  }
}

TEST(HalfTest, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfToFloat(bits);
    if (IsHalfNan(bits)) {
      EXPECT_TRUE(IsHalfNan(FloatToHalfRne(f))) << std::hex << h;
      EXPECT_TRUE(IsHalfNan(FloatToHalfUp(f))) << std::hex << h;
      EXPECT_TRUE(IsHalfNan(FloatToHalfDown(f))) << std::hex << h;
      continue;
    }
    // Exact values round to themselves in every mode.
    EXPECT_EQ(FloatToHalfRne(f), bits) << std::hex << h;
    EXPECT_EQ(FloatToHalfUp(f), bits) << std::hex << h;
    EXPECT_EQ(FloatToHalfDown(f), bits) << std::hex << h;
  }
}

void ExpectHalfMatchesReference(float f) {
  EXPECT_EQ(FloatToHalfRne(f), RefHalf(f, Mode::kRne)) << std::hexfloat << f;
  EXPECT_EQ(FloatToHalfUp(f), RefHalf(f, Mode::kUp)) << std::hexfloat << f;
  EXPECT_EQ(FloatToHalfDown(f), RefHalf(f, Mode::kDown)) << std::hexfloat << f;
}

TEST(HalfTest, EveryBoundaryMatchesReference) {
  // The midpoint between each pair of adjacent halves (exact in FP32), the
  // floats next to it, and next to each half value; both signs. The last
  // midpoint, 65520, is where RNE overflows to Inf.
  const std::vector<double>& grid = HalfValues();
  for (size_t i = 0; i < grid.size(); ++i) {
    const double next = i + 1 < grid.size() ? grid[i + 1] : 65536.0;
    const float value = static_cast<float>(grid[i]);
    const float mid = static_cast<float>((grid[i] + next) / 2);
    ASSERT_EQ(static_cast<double>(mid), (grid[i] + next) / 2);
    for (float f : {value, NextUp(value), NextDown(value), mid, NextUp(mid), NextDown(mid)}) {
      if (f < 0) continue;  // NextDown(0)
      ExpectHalfMatchesReference(f);
      ExpectHalfMatchesReference(-f);
    }
  }
}

TEST(HalfTest, SweepOfRoundingBitsMatchesReference) {
  // Every FP32 sign/exponent/top-10-mantissa combination, with the 13
  // dropped bits set to each interesting pattern around the half-way point.
  for (uint32_t top = 0; top < (1u << 19); ++top) {
    for (uint32_t low : {0x0u, 0x1u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFFu}) {
      const float f = FromBits((top << 13) | low);
      if (std::isnan(f)) continue;
      const uint16_t rne = FloatToHalfRne(f);
      const uint16_t want = RefHalf(f, Mode::kRne);
      if (rne != want) {
        ADD_FAILURE() << std::hexfloat << f << " got " << rne << " want " << want;
        return;
      }
      if (FloatToHalfUp(f) != RefHalf(f, Mode::kUp) ||
          FloatToHalfDown(f) != RefHalf(f, Mode::kDown)) {
        ADD_FAILURE() << "directed rounding of " << std::hexfloat << f;
        return;
      }
    }
  }
}

TEST(HalfTest, RandomFloatsMatchReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  // Any bit pattern, and patterns whose exponent lies in or near the half
  // range (2^-27 .. 2^17), where all the interesting cases are.
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> exp(127 - 27, 127 + 17);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = any(rng);
    if (i % 2 == 0) bits = (bits & 0x807FFFFFu) | (exp(rng) << 23);
    const float f = FromBits(bits);
    if (std::isnan(f)) continue;
    if (FloatToHalfRne(f) != RefHalf(f, Mode::kRne) || FloatToHalfUp(f) != RefHalf(f, Mode::kUp) ||
        FloatToHalfDown(f) != RefHalf(f, Mode::kDown)) {
      ADD_FAILURE() << std::hexfloat << f;
      return;
    }
  }
}

#if defined(__FLT16_MAX__)
TEST(HalfTest, AgreesWithCompilerFloat16) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(any(rng) >> (i % 3));  // skew toward small
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, sizeof(want));
    ASSERT_EQ(FloatToHalfRne(f), want) << std::hexfloat << f;
  }
}
#endif

TEST(HalfTest, SpecialValues) {
  EXPECT_EQ(FloatToHalfRne(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalfRne(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfRne(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalfRne(65504.0f), kHalfMaxBits);
  EXPECT_EQ(FloatToHalfRne(NextDown(65520.0f)), kHalfMaxBits);
  EXPECT_EQ(FloatToHalfRne(65520.0f), 0x7C00);  // tie goes to "even" Inf
  EXPECT_EQ(FloatToHalfRne(-65520.0f), 0xFC00);
  EXPECT_EQ(FloatToHalfRne(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalfRne(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalfRne(-INFINITY), 0xFC00);
  EXPECT_TRUE(IsHalfNan(FloatToHalfRne(NAN)));
  EXPECT_TRUE(IsHalfNan(FloatToHalfRne(-NAN)));
  // A signalling NaN comes out quiet (top mantissa bit set).
  EXPECT_NE(FloatToHalfRne(FromBits(0x7F800001u)) & 0x0200, 0);
  // Subnormals: smallest 2^-24; half of it ties to 0, just above it to 1.
  EXPECT_EQ(FloatToHalfRne(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalfRne(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalfRne(NextUp(std::ldexp(1.0f, -25))), 0x0001);
  EXPECT_EQ(FloatToHalfRne(std::ldexp(3.0f, -25)), 0x0002);  // tie to even
  EXPECT_EQ(FloatToHalfRne(std::ldexp(1.0f, -14)), 0x0400);  // min normal
  EXPECT_EQ(FloatToHalfRne(1e-40f), 0x0000);
  // Directed rounding beyond the range (IEEE): toward the finite side gives
  // the largest finite value, the other way Inf.
  EXPECT_EQ(FloatToHalfUp(65505.0f), 0x7C00);
  EXPECT_EQ(FloatToHalfDown(65505.0f), kHalfMaxBits);
  EXPECT_EQ(FloatToHalfDown(1e30f), kHalfMaxBits);
  EXPECT_EQ(FloatToHalfUp(-65505.0f), 0x8000 | kHalfMaxBits);
  EXPECT_EQ(FloatToHalfUp(-1e30f), 0x8000 | kHalfMaxBits);
  EXPECT_EQ(FloatToHalfDown(-65505.0f), 0xFC00);
  EXPECT_EQ(FloatToHalfUp(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalfDown(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalfUp(-INFINITY), 0xFC00);
  // Tiny values: up gives the smallest subnormal (or -0), down gives 0.
  EXPECT_EQ(FloatToHalfUp(1e-40f), 0x0001);
  EXPECT_EQ(FloatToHalfDown(1e-40f), 0x0000);
  EXPECT_EQ(FloatToHalfUp(-1e-40f), 0x8000);
  EXPECT_EQ(FloatToHalfDown(-1e-40f), 0x8001);
}

// The half value just above `h` (in value; -0 and +0 are both zero).
uint16_t NextHalfUp(uint16_t h) {
  if ((h & 0x7FFF) == 0) return 0x0001;
  return (h & 0x8000) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}

TEST(HalfTest, UpAndDownBracketAndAreAdjacent) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> exp(127 - 30, 127 + 16);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits((any(rng) & 0x807FFFFFu) | (exp(rng) << 23));
    if (std::fabs(f) > 65504.0f) continue;
    const uint16_t up = FloatToHalfUp(f);
    const uint16_t down = FloatToHalfDown(f);
    const float up_f = HalfToFloat(up);
    const float down_f = HalfToFloat(down);
    ASSERT_GE(up_f, f) << std::hexfloat << f;
    ASSERT_LE(down_f, f) << std::hexfloat << f;
    if (up_f == f) {
      ASSERT_EQ(down_f, f) << std::hexfloat << f;
    } else {
      ASSERT_EQ(HalfToFloat(NextHalfUp(down)), up_f) << std::hexfloat << f;
    }
    // RNE picks one of the two.
    const float rne = HalfToFloat(FloatToHalfRne(f));
    ASSERT_TRUE(rne == up_f || rne == down_f) << std::hexfloat << f;
  }
}

// ---- bfloat16 ---------------------------------------------------------------

TEST(Bf16Test, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(bits);
    EXPECT_EQ(Bits(f), b << 16);
    if (std::isnan(f)) {
      const uint16_t back = FloatToBf16Rne(f);
      EXPECT_EQ(back & 0x7F80, 0x7F80);
      EXPECT_NE(back & 0x0040, 0) << "NaN must come back quiet";
    } else {
      EXPECT_EQ(FloatToBf16Rne(f), bits) << std::hex << b;
    }
  }
}

TEST(Bf16Test, RandomAndBoundaryFloatsMatchReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = any(rng);
    // Every other sample sits on or next to a rounding midpoint.
    if (i % 2 == 0) bits = (bits & 0xFFFF0000u) | (0x8000u + (i % 6) - 3);
    const float f = FromBits(bits);
    if (std::isnan(f)) continue;
    if (FloatToBf16Rne(f) != RefBf16(f)) {
      ADD_FAILURE() << std::hexfloat << f;
      return;
    }
  }
  EXPECT_EQ(FloatToBf16Rne(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16Rne(FromBits(0x3F808000u)), 0x3F80);  // tie, even
  EXPECT_EQ(FloatToBf16Rne(FromBits(0x3F818000u)), 0x3F82);  // tie, even
  EXPECT_EQ(FloatToBf16Rne(FLT_MAX), 0x7F80);                // overflow
  EXPECT_EQ(FloatToBf16Rne(-FLT_MAX), 0xFF80);
  EXPECT_EQ(FloatToBf16Rne(FromBits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBf16Rne(INFINITY), 0x7F80);
  EXPECT_EQ(FloatToBf16Rne(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16Rne(FromBits(0x00008000u)), 0x0000);  // subnormal tie
  EXPECT_EQ(FloatToBf16Rne(FromBits(0x00018000u)), 0x0002);
  // NaN stays NaN, including a NaN whose payload lies in the low bits only.
  const uint16_t nan = FloatToBf16Rne(FromBits(0x7F800001u));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16Rne(FromBits(0xFFFFFFFFu)))));
}

// ---- FP8 E4M3 ---------------------------------------------------------------

TEST(Fp8Test, DecodesAndReencodesEveryCode) {
  for (uint32_t c = 0; c <= 0xFF; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = Fp8E4M3ToFloat(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(FloatToFp8E4M3(f), 0x7F);
      continue;
    }
    const double mag = Fp8Values()[c & 0x7F];
    EXPECT_EQ(static_cast<double>(f), (c & 0x80) ? -mag : mag) << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;
    EXPECT_EQ(FloatToFp8E4M3(f), code) << c;
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
}

TEST(Fp8Test, MidpointsRoundToEven) {
  const std::vector<double>& grid = Fp8Values();
  for (size_t c = 0; c + 1 < grid.size(); ++c) {
    const float mid = static_cast<float>((grid[c] + grid[c + 1]) / 2);
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    EXPECT_EQ(FloatToFp8E4M3(mid), even) << mid;
    EXPECT_EQ(FloatToFp8E4M3(-mid), 0x80 | even) << mid;
    EXPECT_EQ(FloatToFp8E4M3(NextDown(mid)), c) << mid;
    EXPECT_EQ(FloatToFp8E4M3(NextUp(mid)), c + 1) << mid;
  }
}

TEST(Fp8Test, SubnormalsAndSaturation) {
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);  // tie to 0
  EXPECT_EQ(FloatToFp8E4M3(NextUp(std::ldexp(1.0f, -10))), 0x01);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);   // tie to even
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(15.0f, -10)), 0x08);  // 7.5 * 2^-9
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(FloatToFp8E4M3(1e-30f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-1e-30f), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(1e-40f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7E);          // tie between 448 and 480
  EXPECT_EQ(FloatToFp8E4M3(NextUp(464.0f)), 0x7E);  // saturates
  EXPECT_EQ(FloatToFp8E4M3(480.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-1e6f), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(FLT_MAX), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(INFINITY), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-INFINITY), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(NAN), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(-NAN), 0x7F);
}

TEST(Fp8Test, RandomFloatsMatchReference) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> exp(127 - 12, 127 + 10);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = any(rng);
    if (i % 4 != 0) bits = (bits & 0x807FFFFFu) | (exp(rng) << 23);
    const float f = FromBits(bits);
    if (FloatToFp8E4M3(f) != RefFp8(f)) {
      ADD_FAILURE() << std::hexfloat << f;
      return;
    }
  }
}

// ---- Quantizer
// ----------------------------------------------------------------

const DType kCacheDtypes[] = {DType::kFP16, DType::kBF16, DType::kFP8E4M3, DType::kINT8,
                              DType::kINT4};
const int kHeadSizes[] = {64, 80, 96, 112, 128, 256};

struct Quantized {
  std::vector<uint16_t> codes;
  ScaleEntry scale;
  QuantStats stats;
};

Quantized Quantize(DType dtype, const std::vector<float>& x, const float* smoothing = nullptr) {
  Quantized q;
  q.codes.assign(x.size(), 0xDEAD);
  q.scale.scale = 0xDEAD;
  q.scale.min = 0xDEAD;
  QuantizeVector(dtype, x.data(), smoothing, static_cast<int>(x.size()), q.codes.data(), &q.scale,
                 &q.stats);
  return q;
}

bool IsFiniteHalf(uint16_t h) { return (h & 0x7C00) != 0x7C00; }

// Structural checks every quantized vector must pass: codes in range, scale
// entries finite FP16, nothing decodes to NaN/Inf.
void ExpectWellFormed(DType dtype, const Quantized& q) {
  if (IsQuantized(dtype)) {
    EXPECT_TRUE(IsFiniteHalf(q.scale.scale)) << std::hex << q.scale.scale;
    EXPECT_EQ(q.scale.scale & 0x8000, 0) << "scales are non-negative";
  }
  if (dtype == DType::kINT4) {
    EXPECT_TRUE(IsFiniteHalf(q.scale.min)) << std::hex << q.scale.min;
  } else {
    EXPECT_EQ(q.scale.min, 0);
  }
  if (!IsQuantized(dtype)) {
    EXPECT_EQ(q.scale.scale, 0);
  }
  for (uint16_t c : q.codes) {
    switch (dtype) {
      case DType::kINT8:
        ASSERT_LE(c, 0xFF);
        ASSERT_NE(c, 0x80) << "-128 is never produced";
        break;
      case DType::kINT4:
        ASSERT_LE(c, 15);
        break;
      case DType::kFP8E4M3:
        ASSERT_LE(c, 0xFF);
        ASSERT_NE(c & 0x7F, 0x7F) << "NaN code";
        break;
      case DType::kFP16:
        ASSERT_TRUE(IsFiniteHalf(c)) << std::hex << c;
        break;
      case DType::kBF16:
        ASSERT_NE(c & 0x7F80, 0x7F80) << std::hex << c;
        break;
      case DType::kFP32:
        break;
    }
    ASSERT_TRUE(std::isfinite(DequantizeCode(dtype, c, q.scale)));
  }
}

// The round-trip error bound of one element x (already divided by any
// smoothing) stored as `code`.
void ExpectWithinBound(DType dtype, float x, uint16_t code, ScaleEntry scale, int i) {
  const double xd = x;
  const double got = DequantizeCode(dtype, code, scale);
  const double err = std::fabs(got - xd);
  const double s = HalfToFloat(scale.scale);
  // Slack for the FP32 division (and, for INT4, subtraction) before
  // rounding: a few FP32 ulps of the operands.
  const double fp32_slack = std::fabs(xd) * 0x1p-22;
  switch (dtype) {
    case DType::kFP16:
    case DType::kBF16: {
      // Exactly the nearest value: at most half an ulp of the result, and
      // the code equals the scalar conversion.
      const uint16_t want = dtype == DType::kFP16 ? FloatToHalfRne(x) : FloatToBf16Rne(x);
      EXPECT_EQ(code, want) << "element " << i << " x=" << x;
      const double rel = dtype == DType::kFP16 ? 0x1p-11 : 0x1p-8;
      const double abs_floor = dtype == DType::kFP16 ? 0x1p-25 : 0x1p-134;
      EXPECT_LE(err, std::max(std::fabs(got) * rel, abs_floor)) << "element " << i << " x=" << x;
      break;
    }
    case DType::kINT8:
      EXPECT_LE(err, s / 2 + fp32_slack) << "element " << i << " x=" << x;
      break;
    case DType::kINT4: {
      const double m = HalfToFloat(scale.min);
      EXPECT_LE(err, s / 2 + (std::fabs(xd) + std::fabs(m)) * 0x1p-22)
          << "element " << i << " x=" << x << " s=" << s << " m=" << m;
      break;
    }
    case DType::kFP8E4M3:
      if (std::fabs(xd) >= 0x1p-6 * s) {
        EXPECT_LE(err, std::fabs(xd) * 0x1p-4 * (1 + 0x1p-20)) << "element " << i << " x=" << x;
      } else {
        EXPECT_LE(err, 0x1p-10 * s * (1 + 0x1p-20)) << "element " << i << " x=" << x;
      }
      break;
    case DType::kFP32:
      break;
  }
}

void ExpectRoundTrip(DType dtype, const std::vector<float>& x, const Quantized& q) {
  ExpectWellFormed(dtype, q);
  for (size_t i = 0; i < x.size(); ++i) {
    ExpectWithinBound(dtype, x[i], q.codes[i], q.scale, static_cast<int>(i));
  }
}

// Scale bounds that make the error bounds meaningful: the scale covers the
// data (rounded up) and is no larger than rounding up requires.
void ExpectScaleCovers(DType dtype, const std::vector<float>& x, const Quantized& q) {
  if (!IsQuantized(dtype)) return;
  const double s = HalfToFloat(q.scale.scale);
  if (dtype == DType::kINT4) {
    const double lo = *std::min_element(x.begin(), x.end());
    const double hi = *std::max_element(x.begin(), x.end());
    const double m = HalfToFloat(q.scale.min);
    EXPECT_LE(m, lo);
    EXPECT_GE(m + 15 * s, hi - std::fabs(hi - m) * 0x1p-21);
    // At most one FP16 step above the exact quotient (steps are 2^-24
    // apart below 2^-14, where scales are FP16 subnormals).
    EXPECT_LE(s, (hi - m) / 15 * (1 + 0x1p-9) + 0x1p-24);
  } else {
    double amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    const double qmax = SymmetricMax(dtype);
    EXPECT_GE(s * qmax, amax * (1 - 0x1p-22));
    EXPECT_LE(s, amax / qmax * (1 + 0x1p-9) + 0x1p-24);
  }
}

std::vector<float> RandomVector(std::mt19937& rng, int n) {
  // N(0,1) times a random magnitude (1e-3 .. 1e3), sometimes shifted so
  // that INT4's asymmetric range is exercised.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-3.0f, 3.0f);
  std::uniform_real_distribution<float> shift(-2.0f, 2.0f);
  const float mag = std::pow(10.0f, log_mag(rng));
  const float offset = (rng() % 2) ? shift(rng) * mag : 0.0f;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) * mag + offset;
  return x;
}

TEST(QuantizeTest, RandomVectorsRoundTripWithinBounds) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  for (DType dtype : kCacheDtypes) {
    for (int n : kHeadSizes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      for (int rep = 0; rep < 200; ++rep) {
        const std::vector<float> x = RandomVector(rng, n);
        const Quantized q = Quantize(dtype, x);
        ExpectRoundTrip(dtype, x, q);
        ExpectScaleCovers(dtype, x, q);
        EXPECT_EQ(q.stats.non_finite, 0u);
        EXPECT_EQ(q.stats.saturated, 0u);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(QuantizeTest, IsDeterministic) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  for (DType dtype : kCacheDtypes) {
    const std::vector<float> x = RandomVector(rng, 128);
    const Quantized a = Quantize(dtype, x);
    const Quantized b = Quantize(dtype, x);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scale.scale, b.scale.scale);
    EXPECT_EQ(a.scale.min, b.scale.min);
  }
}

TEST(QuantizeTest, ZeroVectorGivesZeroScaleZeroCodesExactZeros) {
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(DTypeName(dtype));
    for (bool negative_zeros : {false, true}) {
      std::vector<float> x(128, 0.0f);
      if (negative_zeros) {
        for (size_t i = 0; i < x.size(); i += 2) x[i] = -0.0f;
      }
      const Quantized q = Quantize(dtype, x);
      EXPECT_EQ(q.scale.scale, 0);
      EXPECT_EQ(q.scale.min, 0);
      EXPECT_EQ(q.stats.non_finite, 0u);
      EXPECT_EQ(q.stats.saturated, 0u);
      for (size_t i = 0; i < x.size(); ++i) {
        // FP16/BF16 keep the sign of zero; quantized formats store code 0.
        const uint16_t want = (!IsQuantized(dtype) && std::signbit(x[i])) ? 0x8000 : 0;
        EXPECT_EQ(q.codes[i], want) << i;
        EXPECT_EQ(DequantizeCode(dtype, q.codes[i], q.scale), 0.0) << i;
      }
    }
  }
}

TEST(QuantizeTest, OutlierStillWithinBound) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : kCacheDtypes) {
    for (int n : kHeadSizes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      x[rng() % n] = (rng() % 2) ? 1e4f : -1e4f;
      const Quantized q = Quantize(dtype, x);
      ExpectRoundTrip(dtype, x, q);
      ExpectScaleCovers(dtype, x, q);
      EXPECT_EQ(q.stats.saturated, 0u);
    }
  }
}

TEST(QuantizeTest, SubnormalInputs) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<float> x(128);
    for (float& v : x) v = normal(rng) * 1e-40f;  // FP32 subnormals
    const Quantized q = Quantize(dtype, x);
    ExpectRoundTrip(dtype, x, q);
    EXPECT_EQ(q.stats.saturated, 0u);
    for (size_t i = 0; i < x.size(); ++i) {
      // Far below the resolution of every format but BF16 (which has FP32's
      // exponent range): stored as (signed) zero.
      const double want = dtype == DType::kBF16 ? Bf16ToFloat(FloatToBf16Rne(x[i])) : 0.0;
      EXPECT_EQ(DequantizeCode(dtype, q.codes[i], q.scale), want);
    }
    if (dtype == DType::kINT8 || dtype == DType::kFP8E4M3) {
      EXPECT_EQ(q.scale.scale, 0x0001);  // amax > 0: smallest FP16 scale
    }
  }
}

TEST(QuantizeTest, ScaleQuotientUnderflowStillGivesPositiveScale) {
  // amax / QMAX underflows to 0 in FP32 for the smallest subnormal; the
  // scale is still the smallest positive FP16 and codes are 0, never NaN.
  for (DType dtype : {DType::kINT8, DType::kFP8E4M3, DType::kINT4}) {
    SCOPED_TRACE(DTypeName(dtype));
    const float tiny = std::numeric_limits<float>::denorm_min();
    const std::vector<float> x = {tiny, 0.0f, tiny, 0.0f};
    const Quantized q = Quantize(dtype, x);
    ExpectRoundTrip(dtype, x, q);
    EXPECT_EQ(q.scale.scale, 0x0001);
    for (uint16_t c : q.codes) EXPECT_EQ(c, 0);
  }
}

TEST(QuantizeTest, ConstantVectors) {
  for (DType dtype : kCacheDtypes) {
    for (float c : {2.5f, -3.3f, 0.1f, 1e-3f, -700.0f}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " c=" + std::to_string(c));
      const std::vector<float> x(96, c);
      const Quantized q = Quantize(dtype, x);
      ExpectRoundTrip(dtype, x, q);
      EXPECT_EQ(q.stats.saturated, 0u);
      for (uint16_t code : q.codes) EXPECT_EQ(code, q.codes[0]);
      if (dtype == DType::kINT8 && HalfToFloat(q.scale.scale) >= 0x1p-14) {
        // A normal FP16 scale is fine enough to put amax on code +-127 (a
        // subnormal one may land it lower: 1e-3 gives 126).
        EXPECT_EQ(q.codes[0], c > 0 ? 127 : 0x81);
      }
      if (dtype == DType::kINT4 && HalfToFloat(FloatToHalfRne(c)) == c) {
        // Representable constant: min holds it, range is empty.
        EXPECT_EQ(q.scale.scale, 0);
        EXPECT_EQ(q.codes[0], 0);
        EXPECT_EQ(DequantizeCode(dtype, q.codes[0], q.scale), c);
      }
    }
  }
}

TEST(QuantizeTest, NonFiniteElementsAreZeroedAndCounted) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  for (DType dtype : kCacheDtypes) {
    for (int n : kHeadSizes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      std::vector<float> x = RandomVector(rng, n);
      std::vector<float> cleaned = x;
      const float bad[] = {NAN, INFINITY, -INFINITY, -NAN};
      std::vector<int> positions;
      for (int k = 0; k < 3; ++k) {
        const int pos = static_cast<int>(rng() % n);
        if (std::find(positions.begin(), positions.end(), pos) != positions.end()) {
          continue;
        }
        positions.push_back(pos);
        x[pos] = bad[rng() % 4];
        cleaned[pos] = 0.0f;
      }
      const Quantized q = Quantize(dtype, x);
      const Quantized want = Quantize(dtype, cleaned);
      ExpectWellFormed(dtype, q);
      EXPECT_EQ(q.stats.non_finite, positions.size());
      EXPECT_EQ(q.stats.saturated, 0u);
      // Exactly as if the bad elements had been 0.
      EXPECT_EQ(q.codes, want.codes);
      EXPECT_EQ(q.scale.scale, want.scale.scale);
      EXPECT_EQ(q.scale.min, want.scale.min);
      for (int pos : positions) {
        ExpectWithinBound(dtype, 0.0f, q.codes[pos], q.scale, pos);
      }
    }
  }
}

TEST(QuantizeTest, AllNonFiniteIsAZeroVector) {
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> x(64, NAN);
    const Quantized q = Quantize(dtype, x);
    EXPECT_EQ(q.stats.non_finite, 64u);
    EXPECT_EQ(q.scale.scale, 0);
    EXPECT_EQ(q.scale.min, 0);
    for (uint16_t c : q.codes) EXPECT_EQ(c, 0);
  }
}

TEST(QuantizeTest, HugeFiniteValuesSaturateAndAreCounted) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // 1e30 is beyond FP16 and every scaled format; BF16 holds it, so BF16
    // gets FLT_MAX, which rounds past its largest finite value.
    const float huge = dtype == DType::kBF16 ? FLT_MAX : 1e30f;
    std::vector<float> x = RandomVector(rng, 128);
    x[3] = huge;
    x[77] = -huge;
    const Quantized q = Quantize(dtype, x);
    ExpectWellFormed(dtype, q);
    EXPECT_EQ(q.stats.saturated, 2u);
    EXPECT_EQ(q.stats.non_finite, 0u);
    switch (dtype) {
      case DType::kFP16:
        EXPECT_EQ(q.codes[3], kHalfMaxBits);
        EXPECT_EQ(q.codes[77], 0x8000 | kHalfMaxBits);
        break;
      case DType::kBF16:
        EXPECT_EQ(q.codes[3], 0x7F7F);
        EXPECT_EQ(q.codes[77], 0xFF7F);
        break;
      case DType::kINT8:
        EXPECT_EQ(q.scale.scale, kHalfMaxBits);
        EXPECT_EQ(q.codes[3], 127);
        EXPECT_EQ(q.codes[77], 0x81);
        break;
      case DType::kFP8E4M3:
        EXPECT_EQ(q.scale.scale, kHalfMaxBits);
        EXPECT_EQ(q.codes[3], 0x7E);
        EXPECT_EQ(q.codes[77], 0xFE);
        break;
      case DType::kINT4:
        EXPECT_EQ(q.scale.scale, kHalfMaxBits);
        EXPECT_EQ(q.scale.min, 0x8000 | kHalfMaxBits);
        EXPECT_EQ(q.codes[3], 15);
        EXPECT_EQ(q.codes[77], 0);
        break;
      case DType::kFP32:
        break;
    }
  }
}

TEST(QuantizeTest, Int4AllBelowClippedMinCountsEachElement) {
  // Every value below -65504: min clips to -65504, the range is empty, and
  // each element (none equals the stored min) is counted as saturated.
  const std::vector<float> x = {-1e6f, -2e6f, -65504.0f, -7e5f};
  const Quantized q = Quantize(DType::kINT4, x);
  ExpectWellFormed(DType::kINT4, q);
  EXPECT_EQ(q.scale.scale, 0);
  EXPECT_EQ(q.scale.min, 0x8000 | kHalfMaxBits);
  EXPECT_EQ(q.stats.saturated, 3u);
  for (uint16_t c : q.codes) EXPECT_EQ(c, 0);
}

TEST(QuantizeTest, StatsAccumulateAcrossCalls) {
  QuantStats stats;
  std::vector<uint16_t> codes(4);
  ScaleEntry scale;
  const float x[] = {1.0f, NAN, 1e30f, 2.0f};
  QuantizeVector(DType::kINT8, x, nullptr, 4, codes.data(), &scale, &stats);
  QuantizeVector(DType::kINT8, x, nullptr, 4, codes.data(), &scale, &stats);
  EXPECT_EQ(stats.non_finite, 2u);
  EXPECT_EQ(stats.saturated, 2u);
  // A null stats pointer is allowed.
  QuantizeVector(DType::kINT8, x, nullptr, 4, codes.data(), &scale, nullptr);
}

TEST(QuantizeTest, SmoothingDividesBeforeQuantizing) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> log_lambda(-3.0f, 3.0f);
  for (DType dtype : kCacheDtypes) {
    for (int n : kHeadSizes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      const std::vector<float> x = RandomVector(rng, n);
      std::vector<float> lambda(n);
      std::vector<float> divided(n);
      for (int i = 0; i < n; ++i) {
        lambda[i] = std::exp2(log_lambda(rng));
        divided[i] = x[i] / lambda[i];
      }
      const Quantized q = Quantize(dtype, x, lambda.data());
      const Quantized want = Quantize(dtype, divided);
      EXPECT_EQ(q.codes, want.codes);
      EXPECT_EQ(q.scale.scale, want.scale.scale);
      EXPECT_EQ(q.scale.min, want.scale.min);
      ExpectRoundTrip(dtype, divided, q);
    }
  }
}

TEST(QuantizeTest, SmoothingOverflowSaturatesOnceAndNonFiniteStillCounted) {
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // 1e38 / 1e-3 overflows FP32: clipped to FLT_MAX and counted once,
    // although the later steps clip it again.
    const std::vector<float> x = {1e38f, 1.0f, NAN, -2.0f};
    const std::vector<float> lambda = {1e-3f, 2.0f, 1.0f, 4.0f};
    const Quantized q = Quantize(dtype, x, lambda.data());
    ExpectWellFormed(dtype, q);
    EXPECT_EQ(q.stats.saturated, 1u);
    EXPECT_EQ(q.stats.non_finite, 1u);
    const Quantized want = Quantize(dtype, {FLT_MAX, 0.5f, 0.0f, -0.5f});
    EXPECT_EQ(q.codes, want.codes);
    EXPECT_EQ(q.scale.scale, want.scale.scale);
    EXPECT_EQ(q.scale.min, want.scale.min);
  }
}

TEST(QuantizeTest, Fp8NegativeZero) {
  // -0.0 and negative values that round to zero keep their sign (0x80);
  // a vector of zeros only gives code 0 (the zero-vector rule).
  const std::vector<float> x = {-0.0f, 1.0f, -1e-6f, 0.0f, 1e-6f};
  const Quantized q = Quantize(DType::kFP8E4M3, x);
  EXPECT_EQ(q.codes[0], 0x80);
  EXPECT_EQ(q.codes[2], 0x80);
  EXPECT_EQ(q.codes[3], 0x00);
  EXPECT_EQ(q.codes[4], 0x00);
  EXPECT_EQ(DequantizeCode(DType::kFP8E4M3, 0x80, q.scale), 0.0);
  const Quantized zeros = Quantize(DType::kFP8E4M3, {-0.0f, -0.0f, 0.0f});
  for (uint16_t c : zeros.codes) EXPECT_EQ(c, 0);
  // INT8 has no negative zero.
  const Quantized int8 = Quantize(DType::kINT8, x);
  EXPECT_EQ(int8.codes[0], 0);
  EXPECT_EQ(int8.codes[2], 0);
}

// Golden bytes, computed by hand from the specified FP32 sequence; the CUDA
// write kernel must produce the same.
TEST(QuantizeTest, GoldenInt8) {
  // amax/127 = 0.02 -> FP16 up: 0x251F = 0.0200042724609375.
  const Quantized q = Quantize(DType::kINT8, {2.54f, -1.27f, 0.0f, 1.0f});
  EXPECT_EQ(q.scale.scale, 0x251F);
  EXPECT_EQ(q.codes, (std::vector<uint16_t>{127, 0xC1, 0, 50}));
}

TEST(QuantizeTest, GoldenFp8) {
  // amax/448 = 1/448 -> FP16 up: 0x1893 = 0.0022335052490234375.
  const Quantized q = Quantize(DType::kFP8E4M3, {1.0f, -0.5f, 0.1f, 0.0f});
  EXPECT_EQ(q.scale.scale, 0x1893);
  // 447.72 -> 448 (0x7E); -223.86 -> -224 (0xF6); 44.77 -> 44 (0x63).
  EXPECT_EQ(q.codes, (std::vector<uint16_t>{0x7E, 0xF6, 0x63, 0x00}));
}

TEST(QuantizeTest, GoldenInt4) {
  // min -1.1 -> FP16 down 0xBC67 (-1.1005859375); range 3.1005859 / 15 ->
  // FP16 up 0x329E (0.206787109375).
  const Quantized q = Quantize(DType::kINT4, {-1.1f, 2.0f, 0.0f, 0.5f});
  EXPECT_EQ(q.scale.min, 0xBC67);
  EXPECT_EQ(q.scale.scale, 0x329E);
  EXPECT_EQ(q.codes, (std::vector<uint16_t>{0, 15, 5, 8}));
}

// ---- DequantizeCode, SymmetricMax, Load/Store
// ---------------------------------

TEST(DequantizeTest, Values) {
  const ScaleEntry none{};
  EXPECT_EQ(DequantizeCode(DType::kFP16, 0x3C00, none), 1.0);
  EXPECT_EQ(DequantizeCode(DType::kFP16, 0xC000, none), -2.0);
  EXPECT_EQ(DequantizeCode(DType::kBF16, 0x3F80, none), 1.0);
  EXPECT_EQ(DequantizeCode(DType::kBF16, 0xC040, none), -3.0);
  const ScaleEntry half{0x3800, 0};  // 0.5
  EXPECT_EQ(DequantizeCode(DType::kFP8E4M3, 0x7E, half), 224.0);
  EXPECT_EQ(DequantizeCode(DType::kFP8E4M3, 0xB8, half), -0.5);
  EXPECT_EQ(DequantizeCode(DType::kINT8, 0xFF, half), -0.5);
  EXPECT_EQ(DequantizeCode(DType::kINT8, 0x81, half), -63.5);
  EXPECT_EQ(DequantizeCode(DType::kINT8, 127, half), 63.5);
  const ScaleEntry asym{0x3C00, 0xC000};  // scale 1, min -2
  EXPECT_EQ(DequantizeCode(DType::kINT4, 15, asym), 13.0);
  EXPECT_EQ(DequantizeCode(DType::kINT4, 0, asym), -2.0);
  // Exact in double even where FP32 would round: 15 * 65504 + 2^-24.
  const ScaleEntry wide{kHalfMaxBits, 0x0001};
  EXPECT_EQ(DequantizeCode(DType::kINT4, 15, wide), 15.0 * 65504 + 0x1p-24);
  EXPECT_TRUE(std::isnan(DequantizeCode(DType::kFP8E4M3, 0x7F, half)));
}

TEST(SymmetricMaxTest, Values) {
  EXPECT_EQ(SymmetricMax(DType::kINT8), 127.0f);
  EXPECT_EQ(SymmetricMax(DType::kFP8E4M3), 448.0f);
}

TEST(LoadStoreTest, RoundTripsEachInputDtype) {
  const float values[] = {1.0f, -2.5f, 0.333333f, 65504.0f, -0.0f, 1e-7f};
  for (DType dtype : {DType::kFP32, DType::kFP16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<unsigned char> buffer(6 * 4 + 4, 0xAB);
    for (int i = 0; i < 6; ++i) StoreFromFloat(dtype, buffer.data(), i, values[i]);
    const int bytes = DTypeBits(dtype) / 8;
    EXPECT_EQ(buffer[6 * bytes], 0xAB) << "wrote past the last element";
    for (int i = 0; i < 6; ++i) {
      const float got = LoadAsFloat(dtype, buffer.data(), i);
      float want = values[i];
      if (dtype == DType::kFP16) want = HalfToFloat(FloatToHalfRne(want));
      if (dtype == DType::kBF16) want = Bf16ToFloat(FloatToBf16Rne(want));
      EXPECT_EQ(Bits(got), Bits(want)) << i;
    }
  }
  uint16_t h = 0;
  StoreFromFloat(DType::kFP16, &h, 0, 1e6f);
  EXPECT_EQ(h, 0x7C00);  // 16-bit overflow gives Inf
  h = 0x3C00;
  EXPECT_EQ(LoadAsFloat(DType::kFP16, &h, 0), 1.0f);
}

}  // namespace
}  // namespace kvpage
