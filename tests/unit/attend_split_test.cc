// SPDX-License-Identifier: Apache-2.0
// kvp_attend's schedule arithmetic (kernels/attend_split.h), with no GPU:
// over random batches within a decoder's capacities, the query tiles fit
// the plan's max_tiles and the split-KV items fit split_items (the
// workspace of partial results is sized by them), every span is at least
// min_split_tokens, and the tile spans cover what causal masking and the
// sliding window let a tile's rows see.
#include "kernels/attend_split.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "src/decode_plan.h"
#include "tests/common/fresh_seed.h"
#include "tests/common/plan_geometry.h"

namespace kvpage {
namespace kernels {
namespace attend {
namespace {

struct Batch {
  std::vector<SequenceChunk> chunks;
  int32_t window = 0;
};

DecodeParams ParamsFor(const Batch& b) {
  DecodeParams p{};
  p.sliding_window = b.window;
  return p;
}

// The steps of every tile of the batch, as the schedule's passes see them.
std::vector<int32_t> TileSteps(const AttendPlan& plan, const Batch& b, int32_t group) {
  const DecodeParams p = ParamsFor(b);
  std::vector<int32_t> steps;
  for (const SequenceChunk& c : b.chunks) {
    for (int32_t t = 0; t < TilesOf(plan, c, group); ++t) {
      steps.push_back(StepsOf(plan, TileKvSpan(p, plan, c, group, t)));
    }
  }
  return steps;
}

long long ItemsWith(const std::vector<int32_t>& steps, int32_t chunk) {
  long long items = 0;
  for (int32_t s : steps) items += SplitsOf(s, chunk);
  return items;
}

// The chunk the schedule picks for the batch, and its items.
struct Split {
  int32_t chunk;
  long long items;
};
Split SplitFor(const AttendPlan& plan, const std::vector<int32_t>& steps) {
  long long total = 0;
  for (int32_t s : steps) total += s;
  const int32_t chunk = ChooseSplitSpan(plan, static_cast<long long>(steps.size()), total,
                                        [&](int32_t c) { return ItemsWith(steps, c); });
  return {chunk, ItemsWith(steps, chunk)};
}

TEST(AttendSplit, ItemsFitTheWorkspaceOverRandomBatches) {
  KVPAGE_SEEDED_RNG(rng);
  int split_batches = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int num_kv_heads = 1 << (rng() % 4);
    const int group = 1 << (rng() % 4);
    DecodeCapacity cap;
    cap.num_q_heads = num_kv_heads * group;
    cap.max_num_seqs = 1 + static_cast<int>(rng() % 64);
    cap.max_context_len = 1 + static_cast<int>(rng() % 40000);
    cap.max_query_tokens = 1 + static_cast<int>(rng() % 8192);
    DecodeTuning tuning;
    tuning.attend_decode_rows = rng() % 2 == 0;
    tuning.attend_items_per_sm = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 8) : 0;
    const DeviceProfile device = rng() % 2 ? DeviceProfile::H100() : DeviceProfile::A100();
    const AttendPlan plan = PlanAttend(
        PlanGeometry(DType::kBF16, DType::kBF16, rng() % 2 ? 128 : 256, 16, num_kv_heads), cap,
        device, tuning);
    // A batch within the capacities: sequences, query tokens, contexts.
    Batch b;
    b.window = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 3000) : 0;
    const int seqs = 1 + static_cast<int>(rng() % cap.max_num_seqs);
    int32_t tokens_left = cap.max_query_tokens;
    for (int s = 0; s < seqs; ++s) {
      SequenceChunk c;
      c.context = static_cast<int32_t>(rng() % (cap.max_context_len + 1));
      const int32_t most = std::min(c.context, tokens_left);
      c.count = most > 0 ? static_cast<int32_t>(rng() % (most + 1)) : 0;
      if (rng() % 4 == 0) c.count = std::min(most, 1);  // decode rows
      tokens_left -= c.count;
      b.chunks.push_back(c);
    }
    SCOPED_TRACE(testing::Message()
                 << "trial " << trial << ": kv heads " << num_kv_heads << ", group " << group
                 << ", seqs " << seqs << ", window " << b.window << ", split_items "
                 << plan.split_items << ", tile " << plan.tile_rows << "x" << plan.tile_tokens);
    const std::vector<int32_t> steps = TileSteps(plan, b, group);
    ASSERT_LE(static_cast<int64_t>(steps.size()), plan.max_tiles);
    const Split split = SplitFor(plan, steps);
    if (split.chunk == INT_MAX) {
      EXPECT_TRUE(steps.empty() || static_cast<int64_t>(steps.size()) >= plan.split_items);
      EXPECT_EQ(split.items, static_cast<long long>(steps.size()));
    } else {
      ++split_batches;
      EXPECT_LE(split.items, plan.split_items);
      EXPECT_GE(int64_t{split.chunk} * plan.tile_tokens, plan.min_split_tokens);
    }
    EXPECT_LE(split.items, plan.max_items);
  }
  EXPECT_GT(split_batches, 200);  // the split path is exercised, not skipped
}

// Equal tiles with room for two items each are cut in two (where the
// bound on the count alone leaves them whole): 8 sequences of 64 tokens
// over 8k contexts at a group of 4 are 16 tiles of 128 steps.
TEST(AttendSplit, EqualTilesUseTheRoomTheyHave) {
  AttendPlan plan;
  plan.tile_rows = 128;
  plan.tile_tokens = 64;
  plan.split_items = 16;
  plan.min_split_tokens = 512;
  Batch b;
  for (int s = 0; s < 8; ++s) b.chunks.push_back({0, 64, 8192});
  const std::vector<int32_t> steps = TileSteps(plan, b, 4);
  ASSERT_EQ(steps.size(), 16u);  // two tiles of 128 rows a sequence
  plan.split_items = 32;
  const Split split = SplitFor(plan, steps);
  EXPECT_EQ(split.chunk, 64);  // 128 steps a tile, two spans each
  EXPECT_EQ(split.items, 32);
  // Too little room to split: none.
  plan.split_items = 16;
  EXPECT_EQ(SplitFor(plan, steps).chunk, INT_MAX);
}

// A tile's span: from its first row's window start, rounded down to a
// step, to its last row's position; decode rows have no tiles.
TEST(AttendSplit, TileSpansFollowTheMasks) {
  AttendPlan plan;
  plan.tile_rows = 128;
  plan.tile_tokens = 64;
  const SequenceChunk c{0, 100, 5000};  // query tokens at positions 4900..4999
  DecodeParams p{};
  // Group 4: tile 0 holds tokens 0..31, tile 3 tokens 96..99.
  EXPECT_EQ(TilesOf(plan, c, 4), 4);
  TileSpan s = TileKvSpan(p, plan, c, 4, 0);
  EXPECT_EQ(s.begin, 0);
  EXPECT_EQ(s.end, 4900 + 31 + 1);
  s = TileKvSpan(p, plan, c, 4, 3);
  EXPECT_EQ(s.end, 5000);
  p.sliding_window = 1000;  // token 96 at 4996 sees 3997..4996
  s = TileKvSpan(p, plan, c, 4, 3);
  EXPECT_EQ(s.begin, 3997 / 64 * 64);
  EXPECT_EQ(StepsOf(plan, s), (5000 - 3968 + 63) / 64);
  plan.decode_rows = true;
  EXPECT_EQ(TilesOf(plan, SequenceChunk{7, 1, 300}, 4), 0);
  EXPECT_EQ(TilesOf(plan, SequenceChunk{7, 2, 300}, 4), 1);
  plan.decode_rows = false;
  EXPECT_EQ(TilesOf(plan, SequenceChunk{7, 1, 300}, 4), 1);
}

}  // namespace
}  // namespace attend
}  // namespace kernels
}  // namespace kvpage
