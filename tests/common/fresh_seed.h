// SPDX-License-Identifier: Apache-2.0
// The seed of a test's random inputs: fresh each run, or the one named by
// KVPAGE_TEST_SEED=N, which replays the run that printed "seed=N".
#ifndef KVPAGE_TESTS_COMMON_FRESH_SEED_H_
#define KVPAGE_TESTS_COMMON_FRESH_SEED_H_

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kvpage {

inline uint32_t FreshTestSeed() {
  if (const char* env = std::getenv("KVPAGE_TEST_SEED")) {
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  return std::random_device{}();
}

}  // namespace kvpage

// In a test body: `seed` from FreshTestSeed(), named in every failure of
// the test as "seed=N", and a std::mt19937 `rng` seeded with it.
#define KVPAGE_SEEDED_RNG(rng)                     \
  const uint32_t seed = ::kvpage::FreshTestSeed(); \
  SCOPED_TRACE("seed=" + std::to_string(seed));    \
  std::mt19937 rng(seed)

#endif  // KVPAGE_TESTS_COMMON_FRESH_SEED_H_
