// SPDX-License-Identifier: Apache-2.0
// The warpgroup products of kernels/common/wgmma.cuh (the Hopper attention
// mainloop's): swizzled shared-memory tiles, descriptors, SS and RS forms,
// checked against double on random 16-bit inputs. Skips without an sm_90
// device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "src/backend.h"
#include "src/formats.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "tests/kernels/test_kernels.h"
#endif

namespace kvpage {
namespace {

#if KVPAGE_HAVE_CUDA
// 16-bit bits of x, round to nearest even (BF16 or FP16), and back.
uint16_t Round16(bool bf16, float x) { return bf16 ? FloatToBf16Rne(x) : FloatToHalfRne(x); }
double Value16(bool bf16, uint16_t b) { return bf16 ? Bf16ToFloat(b) : HalfToFloat(b); }

void CheckTile(bool bf16) {
  constexpr int kRows = 64, kD = 128, kTokens = 64;
  std::mt19937 rng(static_cast<uint32_t>(testing::UnitTest::GetInstance()->random_seed()) + bf16);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<uint16_t> q(kRows * kD), k(kTokens * kD), v(kD * kTokens);
  for (auto& x : q) x = Round16(bf16, uni(rng));
  for (auto& x : k) x = Round16(bf16, 0.25f * uni(rng));
  for (auto& x : v) x = Round16(bf16, uni(rng));
  uint16_t *dq, *dk, *dv;
  float *ds, *dout;
  ASSERT_EQ(cudaMalloc(&dq, q.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dk, k.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, v.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, kRows * kTokens * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, kRows * kD * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(ds, 0xFF, kRows * kTokens * 4), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(dout, 0xFF, kRows * kD * 4), cudaSuccess);
  ASSERT_EQ(kernels::LaunchWgmmaTileCheck(bf16, dq, dk, dv, ds, dout, nullptr), cudaSuccess);
  std::vector<float> s(kRows * kTokens), o(kRows * kD);
  ASSERT_EQ(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(ds);
  cudaFree(dout);
  // FP32 sums of 128 exact products: within 1e-5 relative of the sum of
  // magnitudes.
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kTokens; ++j) {
      double want = 0.0, mag = 0.0;
      for (int d = 0; d < kD; ++d) {
        const double x = Value16(bf16, q[r * kD + d]) * Value16(bf16, k[j * kD + d]);
        want += x;
        mag += std::fabs(x);
      }
      ASSERT_NEAR(s[r * kTokens + j], want, 1e-5 * mag + 1e-30) << "S row " << r << " token " << j;
    }
  }
  // O from P = the GPU's S rounded to 16 bits, exactly as the mainloop
  // rounds it.
  for (int r = 0; r < kRows; ++r) {
    for (int d = 0; d < kD; ++d) {
      double want = 0.0, mag = 0.0;
      for (int j = 0; j < kTokens; ++j) {
        const double x =
            Value16(bf16, Round16(bf16, s[r * kTokens + j])) * Value16(bf16, v[d * kTokens + j]);
        want += x;
        mag += std::fabs(x);
      }
      ASSERT_NEAR(o[r * kD + d], want, 1e-5 * mag + 1e-30) << "O row " << r << " channel " << d;
    }
  }
}
#endif

TEST(CudaWgmma, TileProductsMatchDouble) {
#if !KVPAGE_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (prop.major != 9) GTEST_SKIP() << "wgmma needs an sm_90 device";
  CheckTile(true);
  CheckTile(false);
#endif
}

}  // namespace
}  // namespace kvpage
