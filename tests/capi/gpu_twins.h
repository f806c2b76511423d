// SPDX-License-Identifier: Apache-2.0
// GPU test helpers shared by the CUDA-backend suites: a CPU cache and a
// CUDA cache fed the same inputs (Twins), device buffers, random paged
// layouts. Only with KVPAGE_HAVE_CUDA.
#ifndef KVPAGE_TESTS_CAPI_GPU_TWINS_H_
#define KVPAGE_TESTS_CAPI_GPU_TWINS_H_

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {

#define ASSERT_OK(expr)                        \
  do {                                         \
    std::string kvp_err_ = TakeError(expr);    \
    ASSERT_TRUE(kvp_err_.empty()) << kvp_err_; \
  } while (0)
#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

inline int GpuCount() {
  int32_t n = 0;
  TakeError(kvp_device_count(KVP_DEVICE_CUDA, &n));
  return n;
}

#define SKIP_WITHOUT_GPU() \
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device present"

// A device buffer holding a copy of a host vector.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(const std::vector<T>& host) { Assign(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Assign(const std::vector<T>& host) {
    if (host.size() > size_) {
      cudaFree(ptr_);
      cudaMalloc(&ptr_, std::max<size_t>(host.size(), 1) * sizeof(T));
      size_ = host.size();
    }
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  T* get() const { return ptr_; }
  std::vector<T> Read(size_t n) const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

struct Geometry {
  int k_dtype = KVP_DTYPE_INT8, v_dtype = KVP_DTYPE_INT8;
  int head_size = 128, block_size = 16, num_kv_heads = 2, num_layers = 2, num_blocks = 64;
  bool smoothing = false;
  int device_ordinal = 0;   // the GPU cache's device
  int calling_device = -1;  // the current device for calls on it (-1: the test's own)
};

// A CPU cache's configuration for a geometry (no key smoothing).
inline kvp_cache_config CpuConfig(const Geometry& g) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = g.num_layers;
  cfg.num_blocks = g.num_blocks;
  cfg.block_size = g.block_size;
  cfg.num_kv_heads = g.num_kv_heads;
  cfg.head_size = g.head_size;
  cfg.k_dtype = g.k_dtype;
  cfg.v_dtype = g.v_dtype;
  return cfg;
}

// A CPU cache and a CUDA cache of the same geometry, fed the same inputs.
class Twins {
 public:
  Twins(const Geometry& g, Rng& rng) : g_(g) {
    kvp_cache_config cfg = CpuConfig(g);
    if (g.smoothing) {
      for (int i = 0; i < g.num_kv_heads * g.head_size; ++i) {
        smoothing_.push_back(std::exp(rng.normal(0.7f)));
      }
      cfg.key_smoothing = smoothing_.data();
    }
    error_ = TakeError(kvp_cache_create(&cfg, &cpu_));
    cfg.device_kind = KVP_DEVICE_CUDA;
    cfg.device_ordinal = g.device_ordinal;
    if (error_.empty()) error_ = OnGpu([&] { return kvp_cache_create(&cfg, &gpu_); });
  }
  ~Twins() {
    kvp_cache_destroy(cpu_);
    kvp_cache_destroy(gpu_);
  }
  const std::string& error() const { return error_; }
  kvp_cache* cpu() const { return cpu_; }
  kvp_cache* gpu() const { return gpu_; }
  int64_t token_elems() const { return int64_t(g_.num_kv_heads) * g_.head_size; }

  // Makes one C API call that runs on the GPU cache, from the geometry's
  // calling device where it names one (the test's buffers stay on the
  // test's current device), and checks that the call left the calling
  // device current. The error's message, or "".
  template <typename Call>
  std::string OnGpu(Call call) const {
    int home = -1, now = -1;
    cudaGetDevice(&home);
    const int caller = g_.calling_device >= 0 ? g_.calling_device : home;
    if (cudaSetDevice(caller) != cudaSuccess) return absl::StrFormat("cudaSetDevice(%d)", caller);
    std::string err = TakeError(call());
    cudaGetDevice(&now);
    cudaSetDevice(home);
    if (err.empty() && now != caller) {
      err = absl::StrFormat("the call left device %d current instead of the caller's %d", now,
                            caller);
    }
    return err;
  }

  // Writes the same tokens into both caches.
  std::string Write(int layer, int input_dtype, const std::vector<int64_t>& slots,
                    const std::vector<float>& k, const std::vector<float>& v) {
    std::vector<uint8_t> kb, vb;
    StoreElements(input_dtype, k, &kb);
    StoreElements(input_dtype, v, &vb);
    kvp_write_args a;
    kvp_write_args_init(&a);
    a.layer = layer;
    a.num_tokens = static_cast<int32_t>(slots.size());
    a.input_dtype = input_dtype;
    a.key = kb.data();
    a.value = vb.data();
    a.slot_mapping = slots.data();
    std::string err = TakeError(kvp_cache_write(cpu_, &a, nullptr));
    if (!err.empty()) return "cpu: " + err;
    DeviceBuffer<uint8_t> dk(kb), dv(vb);
    DeviceBuffer<int64_t> ds(slots);
    a.key = dk.get();
    a.value = dv.get();
    a.slot_mapping = ds.get();
    err = OnGpu([&] { return kvp_cache_write(gpu_, &a, nullptr); });
    cudaDeviceSynchronize();
    return err.empty() ? "" : "gpu: " + err;
  }

  // Every byte of both caches' layers must agree.
  void ExpectSameBytes() const {
    for (int l = 0; l < g_.num_layers; ++l) {
      kvp_layer_layout a, b;
      kvp_layer_layout_init(&a);
      kvp_layer_layout_init(&b);
      ASSERT_OK(kvp_cache_get_layout(cpu_, l, &a));
      ASSERT_OK(kvp_cache_get_layout(gpu_, l, &b));
      const struct {
        const char* name;
        const void* h;
        const void* d;
        int64_t n;
      } regions[] = {{"K data", a.k_data, b.k_data, a.k_data_bytes},
                     {"V data", a.v_data, b.v_data, a.v_data_bytes},
                     {"K scales", a.k_scales, b.k_scales, a.k_scale_bytes},
                     {"V scales", a.v_scales, b.v_scales, a.v_scale_bytes}};
      for (const auto& r : regions) {
        if (r.n == 0) continue;
        std::vector<uint8_t> d(r.n);
        ASSERT_CUDA(cudaMemcpy(d.data(), r.d, r.n, cudaMemcpyDeviceToHost));
        const auto* h = static_cast<const uint8_t*>(r.h);
        const auto mismatch = std::mismatch(d.begin(), d.end(), h);
        ASSERT_TRUE(mismatch.first == d.end())
            << "layer " << l << " " << r.name << ": first difference at byte "
            << (mismatch.first - d.begin()) << " of " << r.n << ": gpu " << int(*mismatch.first)
            << ", cpu " << int(*mismatch.second);
      }
    }
    kvp_write_stats sa, sb;
    kvp_write_stats_init(&sa);
    kvp_write_stats_init(&sb);
    ASSERT_OK(kvp_cache_get_write_stats(cpu_, &sa));
    ASSERT_OK(kvp_cache_get_write_stats(gpu_, &sb));
    EXPECT_EQ(sa.non_finite, sb.non_finite);
    EXPECT_EQ(sa.saturated, sb.saturated);
  }

 private:
  Geometry g_;
  std::vector<float> smoothing_;
  kvp_cache* cpu_ = nullptr;
  kvp_cache* gpu_ = nullptr;
  std::string error_;
};

// Random ragged sequences laid out over a random permutation of blocks.
struct Layout {
  std::vector<int32_t> table, lens;
  std::vector<int64_t> slots;
  int width = 0;
};
inline Layout RandomLayout(Rng& rng, const std::vector<int>& lens, int block_size, int num_blocks) {
  Layout l;
  l.lens.assign(lens.begin(), lens.end());
  for (int len : lens) l.width = std::max(l.width, (len + block_size - 1) / block_size);
  l.width = std::max(l.width, 1);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  l.table.assign(lens.size() * l.width, 0);
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = 0; j < (lens[s] + block_size - 1) / block_size; ++j) {
      l.table[s * l.width + j] = perm[next++];
    }
    for (int t = 0; t < lens[s]; ++t) {
      l.slots.push_back(int64_t(l.table[s * l.width + t / block_size]) * block_size +
                        t % block_size);
    }
  }
  return l;
}

inline int BlocksFor(const std::vector<int>& lens, int bs) {
  int n = 0;
  for (int l : lens) n += (l + bs - 1) / bs;
  return n;
}

// Writes random K/V for a layout into both caches (layer `layer`).
inline void FillTwins(Twins& twins, Rng& rng, int layer, int input_dtype, const Layout& l) {
  ASSERT_EQ(
      twins.Write(layer, input_dtype, l.slots, rng.normals(l.slots.size() * twins.token_elems()),
                  rng.normals(l.slots.size() * twins.token_elems())),
      "");
}

}  // namespace testing
}  // namespace kvpage

#endif  // KVPAGE_HAVE_CUDA
#endif  // KVPAGE_TESTS_CAPI_GPU_TWINS_H_
