// SPDX-License-Identifier: Apache-2.0
// A minimal parallel loop for the CPU backend, on a persistent worker pool.
#ifndef KVPAGE_SRC_PARALLEL_H_
#define KVPAGE_SRC_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace kvpage {

// Threads the CPU backend may use: KVPAGE_CPU_THREADS (a positive integer,
// read at the first call) or else the hardware concurrency.
int CpuThreads();

// Runs fn(i) for i in [0, n) on up to min(n, CpuThreads()) threads: the
// calling thread and workers of a process-wide pool of CpuThreads() - 1
// threads, started at the first call that needs them. Each index runs
// exactly once, on one thread; threads take the next unclaimed index until
// none remain. An exception thrown by fn (std::bad_alloc) becomes an error
// status instead of terminating the process, and the remaining indices may
// not run; every thread has left fn when the call returns.
//
// Runs inline (on the calling thread alone) where n is 1, CpuThreads() is 1,
// the call is nested in another ParallelFor's fn, or the pool cannot start.
// Several threads may call it at once; they share the pool's workers.
absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn);

}  // namespace kvpage

#endif  // KVPAGE_SRC_PARALLEL_H_
