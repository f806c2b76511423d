// SPDX-License-Identifier: Apache-2.0
// The decode's partition size by the wave model (src/decode_partition.h),
// on the cases it was fitted to (an H200, 132 SMs: docs/archive.md,
// "Partition size and the wave model") and on its invariants.
#include "src/decode_partition.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace kvpage {
namespace {

constexpr int64_t kSms = 132;

// The seed shape (one KV head, 8192 tokens) at the measured batch sizes,
// with the tensor-core kernel's resident blocks (3 for 16/8-bit caches,
// 2 for INT4) and 2048-token partitions at most.
TEST(DecodePartition, SeedShapeChoicesMeasuredOnTheH200) {
  struct Case {
    int64_t seqs;
    int64_t blocks_per_sm;
    int32_t want;
  };
  const Case cases[] = {
      {32, 3, 1024},  {64, 3, 2048}, {128, 3, 1024}, {256, 3, 2048},
      {512, 3, 2048}, {32, 2, 1024}, {64, 2, 2048},  {512, 2, 2048},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrFormat("%d sequences, %d blocks per SM", c.seqs, c.blocks_per_sm));
    EXPECT_EQ(PartitionSizeByWaves(2048, c.seqs, 8192, kSms * c.blocks_per_sm), c.want);
  }
  // GQA 32/8 (8 KV heads, 64 sequences): 2048 blocks of 2048 tokens, kept.
  EXPECT_EQ(PartitionSizeByWaves(2048, 64 * 8, 8192, kSms * 3), 2048);
  // GQA 8/2 (group 4: 2 KV heads): 512 blocks on 396 slots, halved.
  EXPECT_EQ(PartitionSizeByWaves(2048, 64 * 2, 8192, kSms * 3), 1024);
}

// With thirds (the host passes a step for the tensor-core kernel with
// 8-bit codes: 32 tokens, 4096 at most; docs/archive.md, "Partition size and the wave model";
// 64 and 128 check the rounding): 8192 / 3 rounded up to the step from 128 rows
// on, where halves leave a partial wave; halves where a wave fills without
// them.
TEST(DecodePartition, ThirdsWhereTheyFillWaves) {
  struct Case {
    int64_t rows;
    int32_t step;
    int32_t want;
  };
  const Case cases[] = {
      {32, 64, 1024},  {64, 64, 2048},   {128, 64, 2752},  {256, 64, 2752},
      {512, 64, 2752}, {128, 128, 2816}, {512, 128, 2816}, {32, 128, 1024},
      {128, 32, 2752}, {512, 32, 2752},  {32, 32, 1024},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrFormat("%d rows, step %d", c.rows, c.step));
    EXPECT_EQ(PartitionSizeByWaves(4096, c.rows, 8192, kSms * 3, c.step), c.want);
  }
  // No step (the thread-group kernel): halves only, as before.
  EXPECT_EQ(PartitionSizeByWaves(4096, 128, 8192, kSms * 3), 1024);
  // A third at or above `largest` is not a candidate.
  EXPECT_EQ(PartitionSizeByWaves(2048, 128, 8192, kSms * 3, 64), 1024);
}

// 16-bit caches (docs/archive.md, "Partition size and the wave model"): halves up to 2048
// tokens, thirds rounded to 32 tokens up to 4096. The seed shape takes
// thirds from 128 rows on and halves below, the sizes measured fastest
// on the H100.
TEST(DecodePartition, SixteenBitThirdsPastTheHalves) {
  struct Case {
    int64_t rows;
    int32_t want;
  };
  const Case cases[] = {{32, 1024}, {64, 2048}, {128, 2752}, {256, 2752}, {512, 2752}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrFormat("%d rows", c.rows));
    EXPECT_EQ(PartitionSizeByWaves(2048, c.rows, 8192, kSms * 3, 32, 4096), c.want);
  }
  // A third past `largest_third` is not a candidate: 16384 / 3 > 4096;
  // one of exactly `largest_third` is (12288 / 3).
  EXPECT_EQ(PartitionSizeByWaves(2048, 128, 16384, kSms * 3, 32, 4096), 2048);
  EXPECT_EQ(PartitionSizeByWaves(2048, 128, 12288, kSms * 3, 32, 4096), 4096);
}

// Whatever the inputs: a power-of-two fraction of `largest` or the third
// of the context rounded up to the step (and under `largest` or
// `largest_third`), never under 64 unless `largest` is.
TEST(DecodePartition, Invariants) {
  std::mt19937 rng(std::random_device{}());
  int thirds = 0;  // draws that picked the third: the branch is exercised
  for (int i = 0; i < 20000; ++i) {
    const int32_t largest = int32_t{32} << (rng() % 7);  // 32 .. 2048
    const int64_t rows = 1 + rng() % 4096;
    const int32_t context = 1 + static_cast<int32_t>(rng() % 131072);
    const int64_t slots = static_cast<int64_t>(rng() % 2000);                  // 0 counts as 1
    const int32_t step = (rng() % 2) * (int32_t{16} << (rng() % 5));           // 0 or 16 .. 256
    const int32_t largest_third = (rng() % 2) * (int32_t{32} << (rng() % 8));  // 0 or 32 .. 4096
    SCOPED_TRACE(absl::StrFormat("largest %d rows %d context %d slots %d step %d third <= %d",
                                 largest, rows, context, slots, step, largest_third));
    const int32_t p = PartitionSizeByWaves(largest, rows, context, slots, step, largest_third);
    ASSERT_TRUE(p <= largest || (step > 0 && p <= largest_third && p % step == 0)) << p;
    const bool halved = largest % p == 0 && (p & (p - 1)) == 0;
    const int64_t third = std::max<int64_t>(
        64, ((context + 2) / 3 + step - 1) / std::max(step, 1) * std::max(step, 1));
    ASSERT_TRUE(halved || (step > 0 && p == third)) << p;
    thirds += !halved;
    if (largest >= 64) {
      ASSERT_GE(p, 64);
    } else {
      ASSERT_EQ(p, largest);
    }
  }
  EXPECT_GT(thirds, 0);
}

}  // namespace
}  // namespace kvpage
