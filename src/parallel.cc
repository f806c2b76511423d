// SPDX-License-Identifier: Apache-2.0
#include "src/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "src/status.h"

namespace kvpage {

int CpuThreads() {
  // Read once: an engine sets it before its first decode.
  static const int threads = [] {
    int n = 0;
    const char* env = std::getenv("KVPAGE_CPU_THREADS");
    if (env != nullptr && absl::SimpleAtoi(env, &n) && n >= 1) return n;
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return threads;
}

absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return absl::OkStatus();
  const int64_t num_threads = std::min<int64_t>(CpuThreads(), n);
  std::atomic<int64_t> next{0};
  std::atomic<int> failure{0};  // 1 = out of memory, 2 = other exception
  auto worker = [&]() {
    try {
      for (int64_t i = next++; i < n && failure.load() == 0; i = next++) fn(i);
    } catch (const std::bad_alloc&) {
      failure = 1;
    } catch (...) {
      failure = 2;
    }
  };
  std::vector<std::thread> threads;
  try {
    threads.reserve(num_threads - 1);
    for (int64_t t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  } catch (...) {
    // Could not start more threads: the ones running plus this one suffice.
  }
  worker();
  for (auto& t : threads) t.join();
  if (failure == 1) return OutOfMemory("host allocation failed in the CPU backend");
  if (failure == 2) return Internal("unexpected exception in the CPU backend");
  return absl::OkStatus();
}

}  // namespace kvpage
