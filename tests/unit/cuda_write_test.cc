// SPDX-License-Identifier: Apache-2.0
// The CUDA cache write and block copy against the CPU backend, byte for
// byte: both run on identically poisoned buffers, and every byte of the
// cache (all layers, data, scales, padding) and the write counters must
// match. Inputs are fresh random vectors mixed with edge cases (zeros,
// outliers, NaN/Inf, values near FLT_MAX, subnormals, constants, FP16
// boundaries). Skips where no GPU is present.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "src/backend.h"
#include "src/formats.h"
#include "src/geometry.h"
#include "src/params.h"
#include "tests/common/fresh_seed.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "tests/kernels/test_kernels.h"
#endif

namespace kvpage {
namespace {

#if KVPAGE_HAVE_CUDA

constexpr DType kCacheDTypes[] = {DType::kFP16, DType::kBF16, DType::kFP8E4M3, DType::kINT8,
                                  DType::kINT4};
constexpr int kHeadSizes[] = {64, 80, 112, 128, 256};
constexpr int kBlockSizes[] = {8, 16, 32};
constexpr DType kInputDTypes[] = {DType::kFP32, DType::kFP16, DType::kBF16};

int InputBytes(DType t) { return t == DType::kFP32 ? 4 : 2; }

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  bool ok() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

bool SkipWithoutGpu() { return CudaDeviceCount() == 0; }

// ---- Inputs ----------------------------------------------------------------

// One token-head vector of n floats: plain random data most of the time,
// otherwise one of the edge cases the quantizer must agree on.
void FillVector(std::mt19937& rng, int n, float* out) {
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, n - 1);
  const float scale = std::ldexp(1.0f, std::uniform_int_distribution<int>(-14, 14)(rng));
  const int kind = std::uniform_int_distribution<int>(0, 19)(rng);
  for (int i = 0; i < n; ++i) out[i] = normal(rng) * scale;
  switch (kind) {
    case 0:  // zeros of either sign
      for (int i = 0; i < n; ++i) out[i] = (rng() & 1) ? 0.0f : -0.0f;
      break;
    case 1: {  // one huge outlier
      const float big[] = {1e4f, -7e5f, 3e7f, -9e6f, 1e12f, 3e38f, -FLT_MAX};
      out[pick(rng)] = big[rng() % 7];
      break;
    }
    case 2:  // NaN / Inf sprinkled in
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
        const float bad[] = {NAN, INFINITY, -INFINITY, -NAN};
        out[pick(rng)] = bad[rng() % 4];
      }
      break;
    case 3:  // near the top of FP32
      for (int i = 0; i < n; ++i) {
        const float top[] = {3e38f, -3e38f, FLT_MAX, -FLT_MAX, 1e38f};
        if (rng() % 3 == 0) out[i] = top[rng() % 5];
      }
      break;
    case 4:  // FP32 subnormals only
      for (int i = 0; i < n; ++i) {
        out[i] = FromBits((rng() & 0x807FFFFFu));
      }
      break;
    case 5:  // subnormals next to one ordinary value
      for (int i = 0; i < n; ++i) out[i] = FromBits((rng() & 0x807FFFFFu));
      out[pick(rng)] = normal(rng) * 1e-3f;
      break;
    case 6: {  // constant vector (FP16-representable or not)
      const float c[] = {1.0f, -3.5f, 0.1f, -1e-6f, 7e4f, -7e4f, -1e6f, 65504.0f, -65504.0f};
      const float v = c[rng() % 9];
      for (int i = 0; i < n; ++i) out[i] = v;
      break;
    }
    case 7:  // FP16 and FP8 boundaries, exact and one ulp off
      for (int i = 0; i < n; ++i) {
        const float edge[] = {65504.0f,
                              65519.0f,
                              65520.0f,
                              -65520.0f,
                              65536.0f,
                              1e5f,
                              std::ldexp(1.0f, -24),
                              std::ldexp(1.0f, -25),
                              448.0f,
                              464.0f,
                              -480.0f,
                              std::ldexp(1.0f, -14)};
        float e = edge[rng() % 12];
        if (rng() % 3 == 0) e = std::nextafter(e, (rng() & 1) ? INFINITY : -INFINITY);
        if (rng() % 2 == 0) out[i] = e;
      }
      break;
    case 8:  // every element non-finite
      for (int i = 0; i < n; ++i) out[i] = (rng() & 1) ? NAN : -INFINITY;
      break;
    case 9:  // tiny: scales that underflow or become FP16 subnormals
      for (int i = 0; i < n; ++i) out[i] = normal(rng) * std::ldexp(1.0f, -(100 + rng() % 50));
      break;
    case 10:  // large negative values: INT4 min clipped to -65504
      for (int i = 0; i < n; ++i) out[i] = -1e6f - u01(rng) * 1e7f;
      if (rng() & 1) out[pick(rng)] = 1e3f;
      break;
    case 11:  // arbitrary bit patterns (NaN, Inf, everything)
      for (int i = 0; i < n; ++i) out[i] = FromBits(rng());
      break;
    case 12:  // large range spans that clip INT8/FP8 scales
      for (int i = 0; i < n; ++i) out[i] = normal(rng) * 1e8f;
      break;
    case 13:  // all-positive (INT4 min > 0) and ties of code rounding
      for (int i = 0; i < n; ++i) out[i] = 1.0f + static_cast<float>(rng() % 31) * 0.5f;
      break;
    default:  // plain random data
      break;
  }
}

// Key smoothing divisors: mostly moderate powers, some extreme ones that
// overflow (x / 1e-38) or shrink values to subnormals.
std::vector<float> MakeSmoothing(std::mt19937& rng, int count) {
  std::vector<float> s(count);
  std::uniform_real_distribution<float> expo(-6.0f, 6.0f);
  for (float& v : s) {
    v = std::exp2(expo(rng));
    const unsigned r = rng() % 64;
    if (r == 0) v = 1e-38f;
    if (r == 1) v = 1e30f;
    if (r == 2) v = std::ldexp(1.0f, -140);  // subnormal divisor
  }
  return s;
}

// Distinct slots for num_tokens tokens, some -1, in one of four shapes:
//   - scattered: the first block_size tokens cover one block's slots in
//     random order (tokens 2i and 2i+1 of a block, which share INT4 V
//     bytes, are written by different warps of one call), the rest random;
//   - a prefill as vLLM lays it out: consecutive tokens fill blocks taken
//     in random order, from a random offset in the first block (the
//     kernel's whole-word V path);
//   - the same with holes (-1), which break some words' runs;
//   - several sequences' prefills one after another, each from the start
//     of its own blocks (runs start off the tile's word grid, runs cut by
//     a tile's edge, two sequences in one tile).
std::vector<int64_t> MakeSlots(std::mt19937& rng, const CacheGeometry& g, int num_tokens) {
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;
  const int shape = static_cast<int>(rng() % 4);
  std::vector<int64_t> slots;
  if (shape == 3) {
    std::vector<int64_t> blocks(g.num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    size_t next_block = 0;
    while (static_cast<int>(slots.size()) < num_tokens && next_block < blocks.size()) {
      const int len = 1 + static_cast<int>(rng() % (3 * g.block_size));
      for (int t = 0; t < len && static_cast<int>(slots.size()) < num_tokens; ++t) {
        if (t % g.block_size == 0 && next_block == blocks.size()) break;
        if (t % g.block_size == 0) ++next_block;
        slots.push_back(blocks[next_block - 1] * g.block_size + t % g.block_size);
      }
    }
    while (static_cast<int>(slots.size()) < num_tokens) slots.push_back(-1);
    return slots;
  }
  if (shape == 0) {
    const int64_t b0 = rng() % g.num_blocks;
    std::vector<int64_t> rest;
    for (int64_t s = 0; s < num_slots; ++s) {
      if (s / g.block_size != b0) rest.push_back(s);
    }
    std::shuffle(rest.begin(), rest.end(), rng);
    for (int i = 0; i < num_tokens; ++i) {
      slots.push_back(i < g.block_size ? b0 * g.block_size + i : rest[i - g.block_size]);
    }
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int64_t& s : slots) {
      if (rng() % 8 == 0) s = -1;
    }
    return slots;
  }
  std::vector<int64_t> blocks(g.num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  // Start late enough in the first block that the tokens fit.
  const int64_t room = num_slots - num_tokens;
  const int64_t start = room <= 0 ? 0 : rng() % std::min<int64_t>(room + 1, g.block_size);
  for (int i = 0; i < num_tokens; ++i) {
    const int64_t pos = start + i;
    slots.push_back(blocks[pos / g.block_size] * g.block_size + pos % g.block_size);
  }
  if (shape == 2) {
    for (int64_t& s : slots) {
      if (rng() % 6 == 0) s = -1;
    }
  }
  return slots;
}

std::vector<uint8_t> RandomBytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Where byte `off` of a cache lies, for failure messages.
std::string Describe(const CacheGeometry& g, int64_t off) {
  const int64_t layer = off / g.layer_bytes();
  int64_t o = off % g.layer_bytes();
  const char* names[] = {"K data", "V data", "K scales", "V scales"};
  for (int r = CacheGeometry::kNumBlockRegions - 1; r >= 0; --r) {
    const CacheGeometry::BlockRegion region = g.block_region(r);
    if (o >= region.offset && region.block_stride > 0 &&
        o < region.offset + g.num_blocks * region.block_stride) {
      o -= region.offset;
      return absl::StrFormat("layer %d, %s, block %d, byte %d of the block", layer, names[r],
                             o / region.block_stride, o % region.block_stride);
    }
  }
  return absl::StrFormat("layer %d, padding byte %d", layer, o);
}

// Compares two caches byte for byte; reports the first differences.
void ExpectSameBytes(const CacheGeometry& g, const std::vector<uint8_t>& want,
                     const std::vector<uint8_t>& got) {
  ASSERT_EQ(want.size(), got.size());
  if (std::memcmp(want.data(), got.data(), want.size()) == 0) return;
  int shown = 0;
  int64_t differing = 0;
  std::string msg;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    ++differing;
    if (shown++ < 8) {
      msg += absl::StrFormat("  byte %d (%s): cpu %02x gpu %02x\n", i,
                             Describe(g, static_cast<int64_t>(i)), want[i], got[i]);
    }
  }
  ADD_FAILURE() << differing << " bytes differ:\n" << msg;
}

// ---- Write -----------------------------------------------------------------

struct WriteCase {
  CacheGeometry geo;
  DType input_dtype;
  bool smoothing;
};

// A case of two layers (the write names the second one).
WriteCase MakeWriteCase(DType k_dtype, DType v_dtype, int head_size, int block_size,
                        int num_kv_heads, int num_blocks, DType input_dtype, bool smoothing) {
  WriteCase c;
  c.geo.num_layers = 2;
  c.geo.num_blocks = num_blocks;
  c.geo.block_size = block_size;
  c.geo.num_kv_heads = num_kv_heads;
  c.geo.head_size = head_size;
  c.geo.k_dtype = k_dtype;
  c.geo.v_dtype = v_dtype;
  c.input_dtype = input_dtype;
  c.smoothing = smoothing;
  return c;
}

// Runs one write on the CPU backend and on the GPU and compares.
// `num_tokens` 0 picks a random count up to a few blocks' worth.
void RunWriteCase(std::mt19937& rng, const WriteCase& c, int num_tokens = 0,
                  const std::vector<int64_t>* forced_gpu_slots = nullptr,
                  const std::vector<int64_t>* given_slots = nullptr) {
  const CacheGeometry& g = c.geo;
  const int H = g.num_kv_heads;
  const int D = g.head_size;
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;
  if (num_tokens == 0) num_tokens = static_cast<int>(1 + rng() % (2 * g.block_size + 5));
  num_tokens = static_cast<int>(std::min<int64_t>(num_slots, num_tokens));
  std::vector<int64_t> slots =
      given_slots != nullptr ? *given_slots : MakeSlots(rng, g, num_tokens);
  std::vector<int64_t> gpu_slots = slots;
  if (forced_gpu_slots != nullptr) {
    // Out-of-range slots on the GPU side; the CPU (which rejects them) gets
    // -1 there: the GPU must write nothing for them.
    for (size_t i = 0; i < forced_gpu_slots->size() && i < slots.size(); ++i) {
      gpu_slots[i] = (*forced_gpu_slots)[i];
      slots[i] = -1;
    }
  }

  // Inputs, with padding between tokens (odd padding forbids vector loads)
  // and sometimes a base one or four elements past an aligned address.
  const int pads[] = {0, 0, 4, 8, 3, 16};
  const int in_bytes = InputBytes(c.input_dtype);
  const int64_t key_stride = int64_t{H} * D + pads[rng() % 6];
  const int64_t value_stride = int64_t{H} * D + pads[rng() % 6];
  const int64_t shifts[] = {0, 0, 0, 1, 4};
  const int64_t key_shift = shifts[rng() % 5];
  const int64_t value_shift = shifts[rng() % 5];
  auto make_input = [&](int64_t stride, int64_t shift) {
    std::vector<uint8_t> buf = RandomBytes(rng, (num_tokens * stride + shift + 16) * in_bytes);
    std::vector<float> v(D);
    for (int t = 0; t < num_tokens; ++t) {
      for (int h = 0; h < H; ++h) {
        FillVector(rng, D, v.data());
        for (int d = 0; d < D; ++d) {
          StoreFromFloat(c.input_dtype, buf.data(), shift + t * stride + int64_t{h} * D + d, v[d]);
        }
      }
    }
    return buf;
  };
  const std::vector<uint8_t> key = make_input(key_stride, key_shift);
  const std::vector<uint8_t> value = make_input(value_stride, value_shift);
  const std::vector<float> smoothing =
      c.smoothing ? MakeSmoothing(rng, H * D) : std::vector<float>();

  // The cache: two layers, the write goes to layer 1; poisoned identically.
  const std::vector<uint8_t> poison = RandomBytes(rng, g.total_bytes());
  std::vector<uint8_t> cpu_cache = poison;
  const WriteCounters start = {rng() % 1000, rng() % 1000};
  WriteCounters cpu_counters = start;

  WriteParams p{};
  p.geo = g;
  p.input_dtype = c.input_dtype;
  p.num_tokens = num_tokens;
  p.key_stride = key_stride;
  p.value_stride = value_stride;

  WriteParams cpu = p;
  cpu.layer = cpu_cache.data() + g.layer_bytes();
  cpu.key = key.data() + key_shift * in_bytes;
  cpu.value = value.data() + value_shift * in_bytes;
  cpu.slot_mapping = slots.data();
  cpu.key_smoothing = c.smoothing ? smoothing.data() : nullptr;
  cpu.counters = &cpu_counters;
  const absl::Status st = MakeCpuBackend()->Write(cpu, nullptr);
  ASSERT_TRUE(st.ok()) << st;

  // V reaches d_value through a kernel right before the write (below);
  // until then d_value holds NaN.
  DeviceBuffer d_cache(poison.size()), d_key(key.size()), d_value(value.size()),
      d_value_src(value.size()), d_slots(gpu_slots.size() * sizeof(int64_t)),
      d_smoothing(smoothing.size() * sizeof(float)), d_counters(sizeof(WriteCounters));
  ASSERT_TRUE(d_cache.ok() && d_key.ok() && d_value.ok() && d_value_src.ok() && d_slots.ok() &&
              d_smoothing.ok() && d_counters.ok());
  ASSERT_EQ(cudaMemcpy(d_cache.get(), poison.data(), poison.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_key.get(), key.data(), key.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_value.get(), 0xFF, value.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_value_src.get(), value.data(), value.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_slots.get(), gpu_slots.data(), gpu_slots.size() * sizeof(int64_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  if (c.smoothing) {
    ASSERT_EQ(cudaMemcpy(d_smoothing.get(), smoothing.data(), smoothing.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ASSERT_EQ(cudaMemcpy(d_counters.get(), &start, sizeof(start), cudaMemcpyHostToDevice),
            cudaSuccess);

  WriteParams gpu = p;
  gpu.layer = d_cache.get() + g.layer_bytes();
  gpu.key = d_key.get() + key_shift * in_bytes;
  gpu.value = d_value.get() + value_shift * in_bytes;
  gpu.slot_mapping = reinterpret_cast<const int64_t*>(d_slots.get());
  gpu.key_smoothing = c.smoothing ? reinterpret_cast<const float*>(d_smoothing.get()) : nullptr;
  gpu.counters = reinterpret_cast<WriteCounters*>(d_counters.get());
  // Shared memory the write leaves unset must not reach the cache: the
  // stage bytes of tokens that write nothing were once folded into a
  // neighbour's INT4 code (docs/archive.md, "Cache write").
  ASSERT_EQ(kernels::LaunchPoisonShared(nullptr), cudaSuccess);
  // Mostly as the host launches it on sm_90+: a programmatic dependent of
  // the kernel before it, here one that lets it start at once and writes V
  // 20 us later; it must wait for that kernel before reading. Otherwise in
  // plain stream order.
  const bool dependent = rng() % 4 != 0;
  SCOPED_TRACE(dependent ? "dependent launch" : "launch in stream order");
  ASSERT_EQ(kernels::LaunchDelayedCopy(d_value.get(), d_value_src.get(),
                                       static_cast<int64_t>(value.size()), 20000, nullptr),
            cudaSuccess);
  ASSERT_EQ(kernels::LaunchCacheWrite(gpu, dependent, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> gpu_cache(poison.size());
  WriteCounters gpu_counters;
  ASSERT_EQ(cudaMemcpy(gpu_cache.data(), d_cache.get(), gpu_cache.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(&gpu_counters, d_counters.get(), sizeof(gpu_counters), cudaMemcpyDeviceToHost),
      cudaSuccess);
  ExpectSameBytes(g, cpu_cache, gpu_cache);
  EXPECT_EQ(gpu_counters.non_finite, cpu_counters.non_finite);
  EXPECT_EQ(gpu_counters.saturated, cpu_counters.saturated);
}

class CudaWriteTest : public testing::TestWithParam<std::tuple<DType, DType>> {};

// Every (head size, block size, input dtype, smoothing) for one (K, V) pair.
TEST_P(CudaWriteTest, MatchesCpuBytes) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  const auto [k_dtype, v_dtype] = GetParam();
  KVPAGE_SEEDED_RNG(rng);
  for (int head_size : kHeadSizes) {
    for (int block_size : kBlockSizes) {
      for (DType input : kInputDTypes) {
        for (bool smoothing : {false, true}) {
          const int blocks = 3 + static_cast<int>(rng() % 4);
          const int heads = 1 + static_cast<int>(rng() % 4);
          const WriteCase c = MakeWriteCase(k_dtype, v_dtype, head_size, block_size, heads, blocks,
                                            input, smoothing);
          SCOPED_TRACE(absl::StrFormat(
              "K %s V %s head_size %d block_size %d heads %d blocks %d input %s smoothing %d",
              DTypeName(k_dtype), DTypeName(v_dtype), head_size, block_size, c.geo.num_kv_heads,
              c.geo.num_blocks, DTypeName(input), smoothing));
          RunWriteCase(rng, c);
          if (HasFailure()) return;  // one detailed failure is enough
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CudaWrite, CudaWriteTest,
                         testing::Combine(testing::ValuesIn(kCacheDTypes),
                                          testing::ValuesIn(kCacheDTypes)),
                         [](const testing::TestParamInfo<std::tuple<DType, DType>>& info) {
                           return std::string("K") + DTypeName(std::get<0>(info.param)) + "_V" +
                                  DTypeName(std::get<1>(info.param));
                         });

// A prefill from every offset in its first block (blocks in random
// order): the V units (16 bytes of a channel row, or the block's row)
// then start at every place in the tile, on and off the V word grid, and
// the tokens around them go to word groups, whole and cut, for every V
// width and block size. Two tiles of tokens.
TEST(CudaWriteSlots, PrefillFromEveryOffsetMatchesCpu) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  KVPAGE_SEEDED_RNG(rng);
  for (DType v_dtype : kCacheDTypes) {
    for (int block_size : kBlockSizes) {
      for (int start = 0; start < block_size; ++start) {
        const int num_tokens = 64;
        const int num_blocks = (start + num_tokens + block_size - 1) / block_size + 1;
        const WriteCase c = MakeWriteCase(DType::kINT8, v_dtype, 128, block_size, 2, num_blocks,
                                          DType::kBF16, false);
        std::vector<int64_t> blocks(c.geo.num_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), rng);
        std::vector<int64_t> slots;
        for (int i = 0; i < num_tokens; ++i) {
          const int pos = start + i;
          slots.push_back(blocks[pos / block_size] * block_size + pos % block_size);
        }
        SCOPED_TRACE(
            absl::StrFormat("V %s block_size %d start %d", DTypeName(v_dtype), block_size, start));
        RunWriteCase(rng, c, num_tokens, nullptr, &slots);
        if (HasFailure()) return;
      }
    }
  }
}

// Many tokens (more items than one grid wave) in one call: the INT4 V pair
// bytes and the counters' per-warp atomics under real concurrency.
TEST(CudaWriteLarge, ManyTokensMatchCpu) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  KVPAGE_SEEDED_RNG(rng);
  for (DType v_dtype : {DType::kINT4, DType::kINT4, DType::kINT8, DType::kFP16}) {
    const WriteCase c = MakeWriteCase(DType::kINT4, v_dtype, 128, 16, 8, 64, DType::kBF16, true);
    SCOPED_TRACE(DTypeName(v_dtype));
    RunWriteCase(rng, c, c.geo.num_blocks * c.geo.block_size - 3);
  }
}

// The quantizer's fast division by a scale against __fdiv_rn: every pair
// of significands, and random scales and values of every exponent; the
// scales' divisions by their constant divisors for every positive value;
// the reciprocal of every positive finite FP16 scale.
TEST(CudaQuantizer, ScaleDivisionIsExact) {
  constexpr unsigned long long kPositiveFiniteHalves = 0x7BFF;
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  const uint32_t seed = FreshTestSeed();
  SCOPED_TRACE(absl::StrFormat("seed=%u", seed));
  constexpr int64_t kRandomPairs = int64_t{1} << 30;
  DeviceBuffer counts(5 * sizeof(unsigned long long));
  ASSERT_TRUE(counts.ok());
  unsigned long long* d = reinterpret_cast<unsigned long long*>(counts.get());
  ASSERT_EQ(cudaMemset(d, 0, 5 * sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(kernels::LaunchScaleDivisionCheck(d, kRandomPairs, seed, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long got[5];
  ASSERT_EQ(cudaMemcpy(got, d, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got[0], 0u) << "significand pairs where the fast division differs";
  EXPECT_EQ(got[1], 0u) << "random pairs where the fast division differs";
  EXPECT_EQ(got[2], (1ull << 33) + kRandomPairs) << "pairs compared";
  EXPECT_EQ(got[3], 0u)
      << "reciprocals, or scales of a division by a constant divisor, that differ";
  EXPECT_EQ(got[4], 3ull * 0x7F800000u + kPositiveFiniteHalves) << "values compared";
}

// Slots outside [0, num_blocks * block_size) are skipped on the GPU (the
// host validates them where it can; the kernel must never write there).
TEST(CudaWriteSlots, OutOfRangeSlotsWriteNothing) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  KVPAGE_SEEDED_RNG(rng);
  const WriteCase c = MakeWriteCase(DType::kINT8, DType::kINT4, 128, 16, 2, 4, DType::kFP32, false);
  const int64_t num_slots = int64_t{c.geo.num_blocks} * c.geo.block_size;
  const std::vector<int64_t> bad = {num_slots, -2, num_slots + 7, int64_t{1} << 40,
                                    -(int64_t{1} << 40)};
  RunWriteCase(rng, c, 24, &bad);
}

TEST(CudaWriteSlots, NoTokensIsANoOp) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  WriteParams p{};
  p.geo.num_layers = 1;
  p.geo.num_blocks = 1;
  p.geo.block_size = 16;
  p.geo.num_kv_heads = 1;
  p.geo.head_size = 128;
  p.input_dtype = DType::kFP16;
  p.num_tokens = 0;
  EXPECT_EQ(kernels::LaunchCacheWrite(p, false, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Times one write of num_tokens FP16 tokens (8 KV heads, head_size 128,
// block_size 16) in slot order or shuffled; prints microseconds and GB/s
// (input read + cache bytes written).
void BenchWrite(DType k_dtype, DType v_dtype, bool shuffled) {
  CacheGeometry g;
  g.num_layers = 1;
  g.block_size = 16;
  g.num_kv_heads = 8;
  g.head_size = 128;
  g.k_dtype = k_dtype;
  g.v_dtype = v_dtype;
  const int num_tokens = 16384;
  g.num_blocks = num_tokens / g.block_size;
  const int64_t row = int64_t{g.num_kv_heads} * g.head_size;
  DeviceBuffer cache(g.total_bytes()), key(num_tokens * row * 2), value(num_tokens * row * 2),
      slots(num_tokens * sizeof(int64_t)), counters(sizeof(WriteCounters));
  ASSERT_TRUE(cache.ok() && key.ok() && value.ok() && slots.ok() && counters.ok());
  std::mt19937 rng(1);
  std::vector<int64_t> h_slots(num_tokens);
  std::iota(h_slots.begin(), h_slots.end(), 0);
  if (shuffled) std::shuffle(h_slots.begin(), h_slots.end(), rng);
  std::vector<uint16_t> h_in(num_tokens * row);
  std::normal_distribution<float> normal;
  for (uint16_t& x : h_in) x = FloatToHalfRne(normal(rng));
  ASSERT_EQ(
      cudaMemcpy(slots.get(), h_slots.data(), num_tokens * sizeof(int64_t), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpy(key.get(), h_in.data(), h_in.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(value.get(), h_in.data(), h_in.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(counters.get(), 0, sizeof(WriteCounters)), cudaSuccess);
  WriteParams p{};
  p.geo = g;
  p.layer = cache.get();
  p.input_dtype = DType::kFP16;
  p.num_tokens = num_tokens;
  p.key = key.get();
  p.value = value.get();
  p.key_stride = row;
  p.value_stride = row;
  p.slot_mapping = reinterpret_cast<const int64_t*>(slots.get());
  p.counters = reinterpret_cast<WriteCounters*>(counters.get());
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(kernels::LaunchCacheWrite(p, false, nullptr), cudaSuccess);  // warm-up
  const int reps = 20;
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) kernels::LaunchCacheWrite(p, false, nullptr);
  cudaEventRecord(stop);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double bytes =
      2.0 * num_tokens * row * 2 + double(num_tokens) * g.bytes_per_token_per_layer();
  const double us = ms * 1000.0 / reps;
  std::printf("write K %-4s V %-4s %-10s slots: %d tokens x %d heads x %d: %7.1f us, %5.0f GB/s\n",
              DTypeName(k_dtype), DTypeName(v_dtype), shuffled ? "shuffled" : "sequential",
              num_tokens, g.num_kv_heads, g.head_size, us, bytes / us / 1e3);
}

// Not a test: write bandwidth (run with --gtest_also_run_disabled_tests).
TEST(CudaWriteBench, DISABLED_Bandwidth) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  const std::pair<DType, DType> pairs[] = {{DType::kFP16, DType::kFP16},
                                           {DType::kINT8, DType::kINT8},
                                           {DType::kFP8E4M3, DType::kFP8E4M3},
                                           {DType::kINT8, DType::kINT4},
                                           {DType::kINT4, DType::kINT4}};
  for (const auto& [k_dtype, v_dtype] : pairs) {
    for (bool shuffled : {false, true}) BenchWrite(k_dtype, v_dtype, shuffled);
  }
}

// ---- Block moves: copy, pack, unpack ---------------------------------------

CacheGeometry RandomMoveGeometry(std::mt19937& rng) {
  CacheGeometry g;
  g.num_layers = 1 + static_cast<int>(rng() % 4);
  // Up to ~100 pairs: the host-pairs path launches 32 at a time.
  g.num_blocks = 8 + static_cast<int>(rng() % 200);
  g.block_size = kBlockSizes[rng() % 3];
  g.num_kv_heads = 1 + static_cast<int>(rng() % 8);
  g.head_size = kHeadSizes[rng() % 5];
  g.k_dtype = kCacheDTypes[rng() % 5];
  g.v_dtype = kCacheDTypes[rng() % 5];
  return g;
}

std::string DescribeGeometry(const CacheGeometry& g) {
  return absl::StrFormat("layers %d blocks %d block_size %d heads %d head_size %d K %s V %s",
                         g.num_layers, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size,
                         DTypeName(g.k_dtype), DTypeName(g.v_dtype));
}

// Runs `p` (host pointers) on the CPU backend and, on copies of the same
// bytes, on the GPU (ids in device memory unless p.ids_on_host); the cache
// and the buffer must come out the same.
void ExpectMoveMatchesCpu(const BlockMoveParams& p, std::vector<uint8_t> cache,
                          std::vector<uint8_t> buffer, size_t num_ids) {
  const std::vector<uint8_t> cache_before = cache, buffer_before = buffer;
  DeviceBuffer d_cache(cache.size()), d_buffer(buffer.size()), d_ids(num_ids * sizeof(int32_t));
  ASSERT_TRUE(d_cache.ok() && d_buffer.ok() && d_ids.ok());
  ASSERT_EQ(cudaMemcpy(d_cache.get(), cache.data(), cache.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_buffer.get(), buffer.data(), buffer.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_ids.get(), p.ids, num_ids * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  BlockMoveParams cpu = p;
  cpu.cache = cache.data();
  cpu.buffer = buffer.data();
  ASSERT_TRUE(MakeCpuBackend()->MoveBlocks(cpu, nullptr).ok());
  BlockMoveParams gpu = p;
  gpu.cache = d_cache.get();
  gpu.buffer = d_buffer.get();
  if (!p.ids_on_host) gpu.ids = reinterpret_cast<const int32_t*>(d_ids.get());
  ASSERT_EQ(kernels::LaunchMoveBlocks(gpu, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> gpu_cache(cache.size()), gpu_buffer(buffer.size());
  ASSERT_EQ(cudaMemcpy(gpu_cache.data(), d_cache.get(), cache.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gpu_buffer.data(), d_buffer.get(), buffer.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ExpectSameBytes(p.geo, cache, gpu_cache);
  EXPECT_TRUE(buffer == gpu_buffer) << "the packed buffers differ";
  // The move did something (the inputs are random bytes).
  if (p.move == BlockMove::kPack) {
    EXPECT_TRUE(buffer != buffer_before);
  } else {
    EXPECT_TRUE(cache != cache_before);
  }
}

TEST(CudaMoveBlocks, CopyMatchesCpu) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  KVPAGE_SEEDED_RNG(rng);
  for (int iter = 0; iter < 60; ++iter) {
    const CacheGeometry g = RandomMoveGeometry(rng);
    const bool pairs_on_host = iter % 2 == 1;
    SCOPED_TRACE(absl::StrFormat("iter %d (pairs on host %d): %s", iter, pairs_on_host,
                                 DescribeGeometry(g)));
    // Sources and destinations disjoint (a block copied within one call is
    // never also overwritten by it); a source may feed several copies.
    std::vector<int32_t> ids(g.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const int num_src = 1 + static_cast<int>(rng() % (g.num_blocks / 2));
    const int num_pairs = 1 + static_cast<int>(rng() % (g.num_blocks - num_src));
    std::vector<int32_t> pairs;
    for (int i = 0; i < num_pairs; ++i) {
      pairs.push_back(ids[rng() % num_src]);
      pairs.push_back(ids[num_src + i]);
    }
    BlockMoveParams p{};
    p.geo = g;
    p.move = BlockMove::kCopy;
    p.num_layers = g.num_layers;
    p.ids = pairs.data();
    p.num_items = num_pairs;
    p.ids_on_host = pairs_on_host;
    ExpectMoveMatchesCpu(p, RandomBytes(rng, g.total_bytes()), {}, pairs.size());
    if (HasFailure()) return;
  }
}

// Packs (sources may repeat) and unpacks (destinations distinct) of random
// layer ranges, each against the CPU backend's bytes.
TEST(CudaMoveBlocks, PackAndUnpackMatchCpu) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  KVPAGE_SEEDED_RNG(rng);
  for (int iter = 0; iter < 80; ++iter) {
    const CacheGeometry g = RandomMoveGeometry(rng);
    BlockMoveParams p{};
    p.geo = g;
    p.move = iter % 2 == 0 ? BlockMove::kPack : BlockMove::kUnpack;
    p.first_layer = static_cast<int32_t>(rng() % g.num_layers);
    p.num_layers = 1 + static_cast<int32_t>(rng() % (g.num_layers - p.first_layer));
    p.num_items = 1 + static_cast<int32_t>(rng() % g.num_blocks);
    SCOPED_TRACE(absl::StrFormat("iter %d (%s, layers %d+%d, %d blocks): %s", iter,
                                 p.move == BlockMove::kPack ? "pack" : "unpack", p.first_layer,
                                 p.num_layers, p.num_items, DescribeGeometry(g)));
    std::vector<int32_t> ids(g.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(p.num_items);
    if (p.move == BlockMove::kPack) {
      for (int32_t& id : ids) {
        if (rng() % 4 == 0) id = ids[0];  // repeated sources
      }
    }
    p.ids = ids.data();
    const size_t buffer_bytes =
        static_cast<size_t>(int64_t{p.num_layers} * p.num_items * g.packed_block_bytes());
    ExpectMoveMatchesCpu(p, RandomBytes(rng, g.total_bytes()), RandomBytes(rng, buffer_bytes),
                         ids.size());
    if (HasFailure()) return;
  }
}

TEST(CudaMoveBlocks, NothingToMoveIsANoOp) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "no CUDA device present";
  BlockMoveParams p{};
  p.geo.num_layers = 1;
  p.geo.num_blocks = 2;
  p.geo.block_size = 16;
  p.geo.num_kv_heads = 1;
  p.geo.head_size = 64;
  p.num_layers = 1;
  for (BlockMove move : {BlockMove::kCopy, BlockMove::kPack, BlockMove::kUnpack}) {
    p.move = move;
    EXPECT_EQ(kernels::LaunchMoveBlocks(p, nullptr), cudaSuccess);
  }
  p.ids_on_host = true;
  p.move = BlockMove::kCopy;
  EXPECT_EQ(kernels::LaunchMoveBlocks(p, nullptr), cudaSuccess);
}

#else  // !KVPAGE_HAVE_CUDA

TEST(CudaWriteTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace kvpage
