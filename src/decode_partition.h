// SPDX-License-Identifier: Apache-2.0
// The split-K partition size of a decode, chosen by a wave model: plain
// host arithmetic, so that it is unit-tested on any machine (the CUDA
// backend calls it with its device's figures).
#ifndef KVPAGE_SRC_DECODE_PARTITION_H_
#define KVPAGE_SRC_DECODE_PARTITION_H_

#include <algorithm>
#include <cstdint>

namespace kvpage {

// A partition block's fixed cost (prologue, partial results), in tokens of
// partition, fitted to H200 runs (docs/archive.md, "Partition size and
// the wave model"): 128 picked 1024-token partitions at 5.2 waves of 2048 and lost
// 3%; 256 keeps every measured choice.
constexpr double kPartitionOverheadTokens = 256;

// Of `largest`, its halves down to 64 and, where `step` > 0, the size that
// cuts max_context_len into three partitions (rounded up to a multiple of
// `step`, the kernel's rounding: PartitionStepTokens), the partition
// size whose grid of grid_rows x ceil(max_context_len / p) blocks runs
// fastest when blocks run in waves of `slots` (SMs x the kernel's wave
// blocks, kernels/decode_traits.h), each wave as long as a partition plus the
// per-block cost: a grid that spills a few blocks into one more wave pays a
// whole wave (128 sequences of 8192 tokens in 2048-token partitions: 512
// blocks on 396 slots, two waves for 1.3 waves of work). Thirds fill the gap
// between two and four partitions a sequence that halving leaves: 128
// sequences of 8192 tokens in thirds are 384 blocks, one wave of 396 slots
// (measured 1-5% faster than halves at 128-512 sequences on an H100,
// docs/archive.md, "Partition size and the wave model"). A third may exceed `largest` up to and
// including `largest_third` (0: none past `largest`), where the kernel
// holds longer partitions than its halves are measured at (16-bit caches:
// halves up to 2048, thirds up to 4096). Ties keep the longer partition;
// `largest` under 64 is kept.
inline int32_t PartitionSizeByWaves(int32_t largest, int64_t grid_rows, int32_t max_context_len,
                                    int64_t slots, int32_t step = 0, int32_t largest_third = 0) {
  slots = std::max<int64_t>(1, slots);
  int32_t best = largest;
  double best_cost = 0;
  auto consider = [&](int32_t p) {
    const int64_t blocks = grid_rows * ((int64_t{max_context_len} + p - 1) / p);
    const int64_t waves = (blocks + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * (p + kPartitionOverheadTokens);
    if (p == largest || cost < best_cost || (cost == best_cost && p > best)) {
      best = p;
      best_cost = cost;
    }
  };
  for (int32_t p = largest; p >= 64; p /= 2) consider(p);
  if (step > 0 && largest >= 64) {
    const int64_t third = (int64_t{max_context_len} + 2) / 3;
    const int64_t p = std::max<int64_t>(64, (third + step - 1) / step * step);
    if (p < largest || p <= largest_third) consider(static_cast<int32_t>(p));
  }
  return best;
}

}  // namespace kvpage

#endif  // KVPAGE_SRC_DECODE_PARTITION_H_
