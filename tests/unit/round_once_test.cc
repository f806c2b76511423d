// SPDX-License-Identifier: Apache-2.0
// DoubleToHalfRne and DoubleToBf16Rne (src/formats.h), the single rounding
// of the CPU decode's double results to FP16/BF16 outputs: every midpoint
// between neighbouring finite values of both formats and the doubles just
// beside it (including ones FP32 cannot tell from the midpoint), random
// doubles against a reference built from frexp/floor arithmetic, the
// compiler's own double -> _Float16 conversion where there is one, and the
// special values. Also the geometry's slot-count limit, at its boundary.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "src/cache.h"
#include "src/formats.h"
#include "src/manifest.h"
#include "src/status.h"
#include "tests/common/fresh_seed.h"

namespace kvpage {
namespace {

struct Format {
  const char* name;
  int precision;  // significant bits
  int min_exp;    // of the smallest normal
  int max_exp;    // of the largest finite binade
  uint16_t max_finite_bits;
  uint16_t (*from_double)(double);
  float (*to_float)(uint16_t);
};

const Format kHalf = {"binary16", 11, -14, 15, 0x7BFF, DoubleToHalfRne, HalfToFloat};
const Format kBf16 = {"bfloat16", 8, -126, 127, 0x7F7F, DoubleToBf16Rne, Bf16ToFloat};

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}
double FromBits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
}

// x rounded to the nearest value of `f`, ties to the even significand,
// with overflow to +-Inf; computed in double from frexp, floor and exact
// differences (nothing shared with the library's bit manipulation).
double RefRound(const Format& f, double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double a = std::fabs(x);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): leading bit 2^(e - 1)
  const int lead = std::max(e - 1, f.min_exp);
  const double ulp = std::ldexp(1.0, lead - (f.precision - 1));
  const double lo = std::floor(a / ulp) * ulp;
  const double hi = lo + ulp;
  // Both differences are exact (lo and hi are within a factor 2 of a, or
  // lo is 0; where hi > 2a, a is far below the midpoint whatever hi - a
  // rounds to).
  const double below = a - lo, above = hi - a;
  double r;
  if (below < above) {
    r = lo;
  } else if (above < below) {
    r = hi;
  } else {
    r = std::fmod(lo / ulp, 2.0) == 0 ? lo : hi;
  }
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.precision), f.max_exp);
  if (r > max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// Checks f.from_double(x) against the reference: same value, same sign
// (zeros included), NaN for NaN.
::testing::AssertionResult MatchesReference(const Format& f, double x) {
  const uint16_t got = f.from_double(x);
  const double value = f.to_float(got);
  const double want = RefRound(f, x);
  if (std::isnan(want) ? std::isnan(value)
                       : value == want && std::signbit(value) == std::signbit(want)) {
    return ::testing::AssertionSuccess();
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s of %a: got 0x%04X (%a), want %a", f.name, x, got, value,
                want);
  return ::testing::AssertionFailure() << buf;
}

// For every finite non-negative value a of the format and the next one up
// b (2^(max_exp + 1), i.e. Inf, past the largest): a itself, the midpoint
// m (exact in double), the doubles next to m, and m (1 -+ 2^-30), which
// FP32 would round to m. Both signs.
void CheckEveryMidpoint(const Format& f) {
  int failures = 0;
  for (uint32_t mag = 0; mag <= f.max_finite_bits; ++mag) {
    const double a = f.to_float(static_cast<uint16_t>(mag));
    const double b = mag == f.max_finite_bits ? std::ldexp(1.0, f.max_exp + 1)
                                              : f.to_float(static_cast<uint16_t>(mag + 1));
    const double m = (a + b) / 2;
    const uint16_t up = static_cast<uint16_t>(mag + 1);  // Inf past the largest
    const uint16_t even = (mag & 1u) == 0 ? static_cast<uint16_t>(mag) : up;
    const struct {
      double x;
      uint16_t want;
    } cases[] = {
        {a, static_cast<uint16_t>(mag)},
        {m, even},
        {std::nextafter(m, 0.0), static_cast<uint16_t>(mag)},
        {std::nextafter(m, INFINITY), up},
        {m - std::ldexp(m, -30), static_cast<uint16_t>(mag)},
        {m + std::ldexp(m, -30), up},
    };
    for (const auto& c : cases) {
      for (double sign : {1.0, -1.0}) {
        const uint16_t want = static_cast<uint16_t>(c.want | (sign < 0 ? 0x8000 : 0));
        const uint16_t got = f.from_double(sign * c.x);
        if (got != want && failures++ < 10) {
          ADD_FAILURE() << f.name << " of " << std::hexfloat << sign * c.x << ": got 0x" << std::hex
                        << got << ", want 0x" << want;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(RoundOnceTest, HalfEveryMidpointAndItsNeighbours) { CheckEveryMidpoint(kHalf); }
TEST(RoundOnceTest, Bf16EveryMidpointAndItsNeighbours) { CheckEveryMidpoint(kBf16); }

// The case: the exact mean 1 + 2^-11 + 2^-26 is 0x3C01.
TEST(RoundOnceTest, JustAboveAHalfMidpointRoundsUp) {
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -26);
  EXPECT_EQ(DoubleToHalfRne(x), 0x3C01);
  EXPECT_EQ(DoubleToHalfRne(-x), 0xBC01);
  const double y = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(DoubleToBf16Rne(y), 0x3F81);
  EXPECT_EQ(DoubleToBf16Rne(-y), 0xBF81);
}

// Random doubles: over each format's range (normal and subnormal, just
// past overflow and far below the smallest subnormal), then any bit pattern.
void CheckRandom(const Format& f, std::mt19937& rng) {
  std::uniform_int_distribution<int> exp(f.min_exp - f.precision - 4, f.max_exp + 2);
  std::uniform_int_distribution<uint64_t> frac(0, (uint64_t{1} << 52) - 1);
  std::uniform_int_distribution<uint64_t> any;
  int failures = 0;
  for (int i = 0; i < 2000000; ++i) {
    double x;
    if (i % 2 == 0) {
      x = std::ldexp(1.0 + std::ldexp(static_cast<double>(frac(rng)), -52), exp(rng));
      if (any(rng) & 1u) x = -x;
    } else {
      x = FromBits(any(rng) >> (i % 7));  // skewed toward small magnitudes
    }
    const auto r = MatchesReference(f, x);
    if (!r && failures++ < 10) ADD_FAILURE() << r.message();
  }
  EXPECT_EQ(failures, 0);
}

TEST(RoundOnceTest, HalfRandomDoublesMatchReference) {
  KVPAGE_SEEDED_RNG(rng);
  CheckRandom(kHalf, rng);
}
TEST(RoundOnceTest, Bf16RandomDoublesMatchReference) {
  KVPAGE_SEEDED_RNG(rng);
  CheckRandom(kBf16, rng);
}

// A double that is exactly a float rounds like the float conversion (one
// rounding either way), NaNs included.
TEST(RoundOnceTest, FloatValuedDoublesRoundLikeTheFloatConversions) {
  KVPAGE_SEEDED_RNG(rng);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = any(rng) >> (i % 5);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    ASSERT_EQ(DoubleToHalfRne(f), FloatToHalfRne(f)) << std::hexfloat << f;
    ASSERT_EQ(DoubleToBf16Rne(f), FloatToBf16Rne(f)) << std::hexfloat << f;
  }
}

#if defined(__FLT16_MAX__)
TEST(RoundOnceTest, HalfAgreesWithCompilerFloat16) {
  KVPAGE_SEEDED_RNG(rng);
  std::uniform_int_distribution<uint64_t> any;
  std::uniform_int_distribution<int> exp(-30, 17);
  for (int i = 0; i < 1000000; ++i) {
    // Half of them within binary16's range, the rest any bit pattern.
    const double x = i % 2 == 0
                         ? std::ldexp(1.0 + std::ldexp(double(any(rng) >> 12), -52), exp(rng))
                         : FromBits(any(rng) >> (i % 7));
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &h, sizeof(want));
    ASSERT_EQ(DoubleToHalfRne(x), want) << std::hexfloat << x;
  }
}
#endif

TEST(RoundOnceTest, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(DoubleToHalfRne(0.0), 0x0000);
  EXPECT_EQ(DoubleToHalfRne(-0.0), 0x8000);
  EXPECT_EQ(DoubleToHalfRne(inf), 0x7C00);
  EXPECT_EQ(DoubleToHalfRne(-inf), 0xFC00);
  EXPECT_EQ(DoubleToHalfRne(DBL_MAX), 0x7C00);
  EXPECT_EQ(DoubleToHalfRne(65504.0), 0x7BFF);
  EXPECT_EQ(DoubleToHalfRne(std::nextafter(65520.0, 0.0)), 0x7BFF);
  EXPECT_EQ(DoubleToHalfRne(65520.0), 0x7C00);  // the tie goes to the even "2^16": Inf
  EXPECT_EQ(DoubleToHalfRne(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(DoubleToHalfRne(std::ldexp(1.0, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(DoubleToHalfRne(std::nextafter(std::ldexp(1.0, -25), 1.0)), 0x0001);
  EXPECT_EQ(DoubleToHalfRne(std::ldexp(3.0, -26)), 0x0001);
  EXPECT_EQ(DoubleToHalfRne(std::ldexp(3.0, -25)), 0x0002);     // 1.5 ulps: tie to even 2
  EXPECT_EQ(DoubleToHalfRne(std::ldexp(1023.5, -24)), 0x0400);  // rounds up into normals
  EXPECT_EQ(DoubleToHalfRne(DBL_TRUE_MIN), 0x0000);
  EXPECT_EQ(DoubleToHalfRne(-DBL_TRUE_MIN), 0x8000);
  EXPECT_EQ(DoubleToHalfRne(std::numeric_limits<double>::quiet_NaN()) & 0x7FFF, 0x7E00);
  EXPECT_EQ(DoubleToHalfRne(-std::numeric_limits<double>::quiet_NaN()), 0xFE00);
  EXPECT_EQ(DoubleToHalfRne(std::numeric_limits<double>::signaling_NaN()) & 0x7FFF, 0x7E00);

  EXPECT_EQ(DoubleToBf16Rne(0.0), 0x0000);
  EXPECT_EQ(DoubleToBf16Rne(-0.0), 0x8000);
  EXPECT_EQ(DoubleToBf16Rne(inf), 0x7F80);
  EXPECT_EQ(DoubleToBf16Rne(-inf), 0xFF80);
  EXPECT_EQ(DoubleToBf16Rne(DBL_MAX), 0x7F80);
  EXPECT_EQ(DoubleToBf16Rne(FLT_MAX), 0x7F80);  // past the largest bfloat16's midpoint
  EXPECT_EQ(DoubleToBf16Rne(std::ldexp(255.0, 120)), 0x7F7F);
  EXPECT_EQ(DoubleToBf16Rne(std::ldexp(1.0, -133)), 0x0001);
  EXPECT_EQ(DoubleToBf16Rne(std::ldexp(1.0, -134)), 0x0000);
  EXPECT_EQ(DoubleToBf16Rne(std::nextafter(std::ldexp(1.0, -134), 1.0)), 0x0001);
  EXPECT_EQ(DoubleToBf16Rne(DBL_TRUE_MIN), 0x0000);
  EXPECT_EQ(DoubleToBf16Rne(std::numeric_limits<double>::quiet_NaN()) & 0x7FC0, 0x7FC0);
  EXPECT_EQ(DoubleToBf16Rne(std::numeric_limits<double>::signaling_NaN()) & 0x7FC0, 0x7FC0);
  EXPECT_EQ(DoubleToBf16Rne(-std::numeric_limits<double>::quiet_NaN()) & 0xFFC0, 0xFFC0);
}

TEST(RoundOnceTest, StoreFromDoubleRoundsOnce) {
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -26);
  uint16_t h = 0;
  StoreFromDouble(DType::kFP16, &h, 0, x);
  EXPECT_EQ(h, 0x3C01);
  const double y = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  uint16_t b = 0;
  StoreFromDouble(DType::kBF16, &b, 0, y);
  EXPECT_EQ(b, 0x3F81);
  float f = 0;
  const double z = 1.0 + std::ldexp(1.0, -24) + std::ldexp(1.0, -40);
  StoreFromDouble(DType::kFP32, &f, 0, z);
  EXPECT_EQ(f, 1.0f + std::ldexp(1.0f, -23));
}

// ---- The slot count ------------------------------------------------------------

// num_blocks * block_size < 2^31, decided by ValidateGeometry before
// anything is allocated: the largest products of each block size pass,
// 2^31 fails naming both fields and their values.
TEST(GeometryLimitTest, SlotCountBelow2To31) {
  for (int32_t bs : {8, 16, 32}) {
    SCOPED_TRACE(bs);
    CacheGeometry g;
    g.num_layers = 1;
    g.block_size = bs;
    g.num_kv_heads = 1;
    g.head_size = kManifestHeadSizes[0];  // any the build holds
    g.k_dtype = kManifestKvDtypes[0];
    g.v_dtype = kManifestKvDtypes[0];
    g.num_blocks = static_cast<int32_t>((int64_t{1} << 31) / bs - 1);
    EXPECT_TRUE(ValidateGeometry(g).ok()) << ValidateGeometry(g);
    g.num_blocks += 1;
    const absl::Status s = ValidateGeometry(g);
    EXPECT_EQ(CodeOf(s), ErrorCode::kInvalidArgument) << s;
    const std::string msg(s.message());
    EXPECT_NE(msg.find("num_blocks = " + std::to_string(g.num_blocks)), std::string::npos) << msg;
    EXPECT_NE(msg.find("block_size = " + std::to_string(bs)), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kvpage
