// SPDX-License-Identifier: Apache-2.0
// The CPU backend's parallel loop (src/parallel.h).
#include "src/parallel.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "src/status.h"
#include "src/sync.h"

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

TEST(Parallel, OtherExceptionIsInternal) {
  const absl::Status s = ParallelFor(64, [](int64_t i) {
    if (i == 5) throw std::runtime_error("x");
  });
  EXPECT_EQ(CodeOf(s), ErrorCode::kInternal) << s;
}

// The kernel's id of the calling thread: a new thread gets a new one, so
// threads started per call would show as more ids than threads.
int64_t Tid() { return static_cast<int64_t>(syscall(SYS_gettid)); }

// Runs ParallelFor(n) with items that take `us` microseconds; returns the
// threads that ran them.
std::set<int64_t> ThreadsOf(int64_t n, int us) {
  std::mutex mu;
  std::set<int64_t> ids;
  EXPECT_TRUE(ParallelFor(n, [&](int64_t) {
                std::this_thread::sleep_for(std::chrono::microseconds(us));
                std::lock_guard<std::mutex> lock(mu);
                ids.insert(Tid());
              }).ok());
  return ids;
}

// The workers persist: many calls run on at most CpuThreads() threads in
// all, the caller included.
TEST(Parallel, WorkersPersistAcrossCalls) {
  std::set<int64_t> all;
  for (int call = 0; call < 20; ++call) {
    const std::set<int64_t> ids = ThreadsOf(4 * CpuThreads(), 100);
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_LE(all.size(), static_cast<size_t>(CpuThreads()));
  EXPECT_EQ(all.count(Tid()), 1u);
}

// n items run on at most n threads, and one item on the caller alone.
TEST(Parallel, SmallCountsUseFewThreads) {
  for (int call = 0; call < 20; ++call) {
    for (int64_t n : {1, 2, 3}) EXPECT_LE(ThreadsOf(n, 200).size(), static_cast<size_t>(n));
    EXPECT_EQ(ThreadsOf(1, 0), std::set<int64_t>{Tid()});
  }
}

// A failure on a worker thread is the call's status, and the pool serves
// the next call.
TEST(Parallel, FailureOnAWorker) {
  const int64_t caller = Tid();
  for (int call = 0; call < 20; ++call) {
    std::atomic<bool> on_worker{false};
    const absl::Status s = ParallelFor(64, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (Tid() != caller) {
        on_worker = true;
        throw std::bad_alloc();
      }
    });
    if (on_worker) {
      EXPECT_EQ(CodeOf(s), ErrorCode::kOutOfMemory) << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
    std::vector<std::atomic<int>> hits(100);
    ASSERT_TRUE(ParallelFor(100, [&](int64_t i) { hits[static_cast<size_t>(i)]++; }).ok());
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

// A call inside fn runs inline on the thread of the outer index.
TEST(Parallel, NestedCallsRunInline) {
  constexpr int64_t kOuter = 8, kInner = 16;
  std::vector<std::atomic<int>> hits(kOuter * kInner);
  std::atomic<int> foreign{0};
  ASSERT_TRUE(ParallelFor(kOuter, [&](int64_t o) {
                const int64_t tid = Tid();
                const absl::Status s = ParallelFor(kInner, [&](int64_t i) {
                  if (Tid() != tid) foreign++;
                  hits[static_cast<size_t>(o * kInner + i)]++;
                });
                if (!s.ok()) foreign += 1000;
              }).ok());
  EXPECT_EQ(foreign.load(), 0);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// Several threads call at once (caches are used from several threads).
TEST(Parallel, ConcurrentCallers) {
  constexpr int kCallers = 4, kCalls = 300;
  std::atomic<int> errors{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        const int64_t n = 1 + (call * 7 + c) % 37;
        std::vector<int> hits(static_cast<size_t>(n));  // each index written by one thread
        if (!ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)] += 1; }).ok()) errors++;
        for (int h : hits) {
          if (h != 1) errors++;
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(errors.load(), 0);
}

// A child made by fork() after the pool started: one that never calls
// ParallelFor exits normally (its static destructors must not wait for the
// parent's workers), and one that calls it gets every index run once.
TEST(Parallel, ForkedChild) {
  ASSERT_TRUE(ParallelFor(64, [](int64_t) {}).ok());  // the pool exists
  for (bool use : {false, true}) {
#if KVPAGE_TSAN
    if (use) continue;  // TSan does not support threads started after a multi-threaded fork
#endif
    std::fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(30);  // a hang fails the test by SIGALRM
      int code = 0;
      if (use) {
        std::vector<std::atomic<int>> hits(256);
        if (!ParallelFor(256, [&](int64_t i) { hits[static_cast<size_t>(i)]++; }).ok()) code = 1;
        for (auto& h : hits) {
          if (h.load() != 1) code = 2;
        }
      }
      std::exit(code);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "use " << use << ": status " << status;
    if (WIFEXITED(status)) EXPECT_EQ(WEXITSTATUS(status), 0) << "use " << use;
  }
  EXPECT_TRUE(ParallelFor(64, [](int64_t) {}).ok());
}

}  // namespace
}  // namespace kvpage
