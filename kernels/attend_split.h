// SPDX-License-Identifier: Apache-2.0
// The arithmetic of kvp_attend's schedule (kernels/attend_schedule.cuh), on
// host and device: a sequence's query tiles, the KV span each tile sees,
// its mainloop steps, and the split span that keeps the work items within
// AttendPlan::split_items. The schedule kernel sums over the batch with the
// block's threads; tests/unit/attend_split_test.cc checks the same
// functions against the bounds the workspace is sized by, without a GPU.
#ifndef KVPAGE_KERNELS_ATTEND_SPLIT_H_
#define KVPAGE_KERNELS_ATTEND_SPLIT_H_

#include <climits>
#include <cstdint>

#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace attend {

// min and max, as the device's built-ins where there is one.
KVP_HOST_DEVICE inline long long MinOf(long long a, long long b) {
#ifdef __CUDA_ARCH__
  return min(a, b);
#else
  return a < b ? a : b;
#endif
}
KVP_HOST_DEVICE inline long long MaxOf(long long a, long long b) {
#ifdef __CUDA_ARCH__
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}
KVP_HOST_DEVICE inline int32_t MaxOf(int32_t a, int32_t b) {
#ifdef __CUDA_ARCH__
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}

// Sequence s as the schedule sees it: its query tokens and context, or no
// query tokens where the batch's values are out of range (reported in
// checked mode).
struct SequenceChunk {
  int32_t start = 0;
  int32_t count = 0;
  int32_t context = 0;
};

// The KV tokens query tile `tile` of a chunk can see: from the first one
// inside its earliest row's sliding window (rounded down to a step) to its
// last row's position.
struct TileSpan {
  int32_t begin;
  int32_t end;
};
KVP_HOST_DEVICE inline TileSpan TileKvSpan(const DecodeParams& p, const AttendPlan& plan,
                                           const SequenceChunk& c, int32_t group, int32_t tile) {
  const int64_t rows = int64_t{c.count} * group;
  const int64_t first_row = int64_t{tile} * plan.tile_rows;
  const int64_t last_row = MinOf(first_row + plan.tile_rows, rows) - 1;
  const int32_t first_pos = c.context - c.count + static_cast<int32_t>(first_row / group);
  const int32_t last_pos = c.context - c.count + static_cast<int32_t>(last_row / group);
  int32_t begin = p.sliding_window > 0 ? MaxOf(0, first_pos - p.sliding_window + 1) : 0;
  begin = begin / plan.tile_tokens * plan.tile_tokens;
  return {begin, last_pos + 1};
}

// A sequence the decode kernel serves (AttendPlan::decode_rows): one query
// token.
KVP_HOST_DEVICE inline bool IsDecodeRow(const AttendPlan& plan, const SequenceChunk& c) {
  return plan.decode_rows && c.count == 1;
}

// The query tiles of a chunk (none for a decode row).
KVP_HOST_DEVICE inline int32_t TilesOf(const AttendPlan& plan, const SequenceChunk& c,
                                       int32_t group) {
  if (IsDecodeRow(plan, c)) return 0;
  return static_cast<int32_t>((int64_t{c.count} * group + plan.tile_rows - 1) / plan.tile_rows);
}

KVP_HOST_DEVICE inline int32_t StepsOf(const AttendPlan& plan, TileSpan span) {
  return (span.end - span.begin + plan.tile_tokens - 1) / plan.tile_tokens;
}

// Items of a tile of `steps` mainloop steps cut into spans of `chunk`
// steps (at least one: a tile with nothing visible still writes its rows).
KVP_HOST_DEVICE inline int32_t SplitsOf(int32_t steps, int32_t chunk) {
  return steps <= chunk ? 1 : static_cast<int32_t>((int64_t{steps} + chunk - 1) / chunk);
}

// The span length (in steps) the split-KV schedule cuts contexts into, or
// INT_MAX for none, for a batch of `tiles` query tiles and `steps` steps in
// all; items_with(chunk) gives the batch's items with spans of `chunk`
// steps. Where the tiles are fewer than plan.split_items: the shortest span
// (of at least min_split_tokens) whose items fit split_items, tried from
// the even share of the steps and grown by the overshoot; else the bound
// sum over tiles of ceil(steps / chunk) <= tiles + steps / chunk gives one
// that fits. (Equal tiles of s steps with room for two items each get spans
// of s / 2, where the bound alone gives s and no split.) Either way the
// items fit split_items, which sizes the partial results' workspace.
template <class ItemsWith>
KVP_HOST_DEVICE inline int32_t ChooseSplitSpan(const AttendPlan& plan, long long tiles,
                                               long long steps, ItemsWith items_with) {
  if (plan.split_items <= tiles || tiles == 0) return INT_MAX;
  const long long free_items = plan.split_items - tiles;
  const long long min_steps = (plan.min_split_tokens + plan.tile_tokens - 1) / plan.tile_tokens;
  const long long bound = MaxOf(min_steps, (steps + free_items - 1) / free_items);
  long long tried = MaxOf(min_steps, (steps + plan.split_items - 1) / plan.split_items);
  for (int round = 0; round < 4 && tried < bound; ++round) {
    const long long items = items_with(static_cast<int32_t>(tried));
    if (items <= plan.split_items) return static_cast<int32_t>(tried);
    tried = (tried * items + plan.split_items - 1) / plan.split_items;
  }
  return static_cast<int32_t>(bound);
}

}  // namespace attend
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_ATTEND_SPLIT_H_
