// SPDX-License-Identifier: Apache-2.0
// Non-finite containment on the CPU backend (docs/RELIABILITY.md): the
// checks of nonfinite_suite.h over every K/V dtype pair, input, query and
// output dtype. gpu_reliability_test.cc runs the same checks on a GPU.
#include <random>

#include "gtest/gtest.h"
#include "tests/capi/nonfinite_suite.h"

namespace kvpage {
namespace testing {
namespace nonfinite {
namespace {

uint64_t Seed() { return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}(); }

TEST(NonFiniteCpu, WritesTouchOnlyTheirTokenAndCountEveryValue) {
  HostMemory mem;
  int i = 0;
  for (int32_t kd : kKvDtypes) {
    for (int32_t vd : kKvDtypes) {
      CacheSpec spec;
      spec.k_dtype = kd;
      spec.v_dtype = vd;
      spec.block_size = (i % 3 == 0) ? 8 : (i % 3 == 1) ? 16 : 32;
      spec.head_size = (i % 4 == 0) ? 80 : (i % 4 == 1) ? 64 : (i % 4 == 2) ? 112 : 128;
      spec.smoothing = i % 2 == 1;
      WriteContainment(mem, spec, kIoDtypes[i % 3], Seed(), nullptr);
      ++i;
    }
  }
}

TEST(NonFiniteCpu, OneSequencesNonFiniteQueryChangesNoOtherRow) {
  HostMemory mem;
  int i = 0;
  for (int32_t kd : kKvDtypes) {
    for (int32_t io : kIoDtypes) {
      CacheSpec spec;
      spec.k_dtype = kd;
      spec.v_dtype = kKvDtypes[(i + 2) % 5];
      spec.num_layers = 1;
      spec.num_blocks = 12;
      spec.head_size = i % 2 ? 128 : 64;
      spec.smoothing = i % 3 == 0;
      DecodeSpec d;
      d.q_dtype = io;
      d.out_dtype = kIoDtypes[(i + 1) % 3];
      d.num_q_heads = spec.num_kv_heads * (1 + i % 3);
      d.query_len = 1 + i % 2;
      d.sliding_window = i % 4 == 1 ? 7 : 0;
      d.soft_cap = i % 5 == 2 ? 30.0f : 0.0f;
      d.alibi = i % 3 == 2;
      DecodeIsolation(mem, spec, d, Seed());
      ++i;
    }
  }
}

TEST(NonFiniteCpu, BytesPastASequencesEndNeverReachItsOutput) {
  HostMemory mem;
  int i = 0;
  for (int32_t kd : kKvDtypes) {
    for (int32_t vd : kKvDtypes) {
      CacheSpec spec;
      spec.k_dtype = kd;
      spec.v_dtype = vd;
      spec.num_layers = 1;
      spec.num_blocks = 12;
      spec.block_size = (i % 3 == 0) ? 8 : (i % 3 == 1) ? 16 : 32;
      spec.head_size = i % 2 ? 96 : 64;
      DecodeSpec d;
      d.q_dtype = kIoDtypes[i % 3];
      d.out_dtype = kIoDtypes[(i + 1) % 3];
      d.query_len = 1 + i % 2;
      StaleTails(mem, spec, d, Seed());
      ++i;
    }
  }
}

}  // namespace
}  // namespace nonfinite
}  // namespace testing
}  // namespace kvpage
