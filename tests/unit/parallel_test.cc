// SPDX-License-Identifier: Apache-2.0
// The CPU backend's parallel loop (src/parallel.h).
#include "src/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "src/status.h"

namespace kvpage {
namespace {

TEST(Parallel, EveryIndexRunsOnce) {
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    ASSERT_TRUE(ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)]++; }).ok());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n;
  }
}

TEST(Parallel, AllocationFailureIsAnError) {
  const absl::Status s = ParallelFor(64, [](int64_t i) {
    if (i == 37) throw std::bad_alloc();
  });
  EXPECT_EQ(CodeOf(s), ErrorCode::kOutOfMemory) << s;
}

// KVPAGE_CPU_THREADS caps the threads (ctest runs this test with it set to
// 1 and to 3, "parallel_cpu_threads_*"); unset or invalid, the hardware's.
TEST(Parallel, ThreadsFromTheEnvironment) {
  const char* env = std::getenv("KVPAGE_CPU_THREADS");
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int want = env != nullptr && std::atoi(env) >= 1 ? std::atoi(env) : hw;
  EXPECT_EQ(CpuThreads(), want);
  std::mutex mu;
  std::set<std::thread::id> ids;
  ASSERT_TRUE(ParallelFor(256, [&](int64_t) {
                std::this_thread::sleep_for(std::chrono::microseconds(200));
                std::lock_guard<std::mutex> lock(mu);
                ids.insert(std::this_thread::get_id());
              }).ok());
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), static_cast<size_t>(want));
  if (want == 1) EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

}  // namespace
}  // namespace kvpage
