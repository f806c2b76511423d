// SPDX-License-Identifier: Apache-2.0
// The CUDA toolchain probe: a kernel compiled from kernels/*.cu runs on the
// GPU and writes what the host expects. Skips where no GPU is present.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/backend.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "tests/kernels/test_kernels.h"
#endif

namespace kvpage {
namespace {

TEST(CudaProbe, FillPatternKernelRuns) {
#if !KVPAGE_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  const int64_t n = (1 << 20) + 37;  // not a multiple of the block size
  uint32_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0xFF, n * sizeof(uint32_t)), cudaSuccess);  // poison
  const uint32_t seed = static_cast<uint32_t>(testing::UnitTest::GetInstance()->random_seed()) | 1u;
  ASSERT_EQ(kernels::LaunchFillPattern(d, n, seed, nullptr), cudaSuccess);
  std::vector<uint32_t> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], seed * 2654435761u + static_cast<uint32_t>(i)) << "element " << i;
  }
#endif
}

// The write tests poison shared memory before each write so that a kernel
// reading bytes it never set sees set bits (tests/unit/cuda_write_test.cc):
// the poison must reach what the next kernel's blocks see: a kernel that
// reads its shared memory before writing any finds only 0xFF bytes. Run it
// with the GPU to itself: another process's kernels between the two
// launches leave their own bytes there (seen with six compute-sanitizer
// runs sharing one H100; alone, under memcheck and racecheck, it passes).
TEST(CudaProbe, PoisonSharedIsSeen) {
#if !KVPAGE_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  unsigned int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(unsigned int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, sizeof(unsigned int)), cudaSuccess);
  ASSERT_EQ(kernels::LaunchPoisonShared(nullptr), cudaSuccess);
  ASSERT_EQ(kernels::LaunchCountUnpoisonedShared(d, nullptr), cudaSuccess);
  unsigned int unpoisoned = 1;
  ASSERT_EQ(cudaMemcpy(&unpoisoned, d, sizeof(unpoisoned), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(unpoisoned, 0u) << "32-bit words of shared memory the poison did not reach";
#endif
}

}  // namespace
}  // namespace kvpage
