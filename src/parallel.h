// SPDX-License-Identifier: Apache-2.0
// A minimal parallel loop for the CPU backend.
#ifndef KVPAGE_SRC_PARALLEL_H_
#define KVPAGE_SRC_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace kvpage {

// Threads the CPU backend may use: KVPAGE_CPU_THREADS (a positive integer,
// read at the first call) or else the hardware concurrency.
int CpuThreads();

// Runs fn(i) for i in [0, n) on up to CpuThreads() threads. An
// exception thrown by fn (std::bad_alloc) becomes an error status instead
// of terminating the process.
absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn);

}  // namespace kvpage

#endif  // KVPAGE_SRC_PARALLEL_H_
