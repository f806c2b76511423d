// SPDX-License-Identifier: Apache-2.0
// Reliability on the CUDA backend (docs/RELIABILITY.md); every test skips
// itself where no GPU is present.
//
//  - Non-finite containment: the checks of nonfinite_suite.h (the same the
//    CPU backend passes in nonfinite_test.cc) on GPU caches, and the GPU's
//    bytes and statistics equal the CPU's for the same poisoned writes;
//    "stale tails" (NaN data, NaN/Inf scales past a sequence's end, in
//    unused blocks and in table entries past a row's blocks) must not reach
//    any output: the classic paged-attention bug where a masked-out
//    probability of 0 meets a NaN value (0 * NaN = NaN).
//  - Engine allocator: the decoder's workspace comes from the cache's
//    allocator; an allocator failing at its N-th call, for every N of a
//    scenario (cache, decoders, decode), fails that call with
//    KVP_ERR_OUT_OF_MEMORY, leaves its out-parameter alone and leaks
//    nothing; misaligned engine memory is refused and returned.
//  - Caller-owned workspaces that are too small are refused by name.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/capi/nonfinite_suite.h"
#include "tests/common/reference.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvpage {
namespace testing {
namespace {

#if KVPAGE_HAVE_CUDA

int GpuCount() {
  int32_t n = 0;
  TakeError(kvp_device_count(KVP_DEVICE_CUDA, &n));
  return n;
}

#define SKIP_WITHOUT_GPU() \
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device present"

uint64_t Seed() { return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}(); }

// Device memory of GPU 0 for the non-finite suite.
class CudaMemory final : public nonfinite::Memory {
 public:
  ~CudaMemory() override {
    for (void* p : buffers_) cudaFree(p);
  }
  int32_t device_kind() const override { return KVP_DEVICE_CUDA; }
  void* Put(const void* host, size_t bytes) override {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }
  void Upload(void* dst, const void* host, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Download(void* host, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void Sync() override { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

 private:
  std::vector<void*> buffers_;
};

using nonfinite::CacheSpec;
using nonfinite::DecodeSpec;
using nonfinite::kIoDtypes;
using nonfinite::kKvDtypes;

TEST(GpuNonFinite, WritesTouchOnlyTheirTokenCountEveryValueAndMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (int32_t kd : kKvDtypes) {
    for (int32_t vd : kKvDtypes) {
      CacheSpec spec;
      spec.k_dtype = kd;
      spec.v_dtype = vd;
      spec.block_size = (i % 3 == 0) ? 8 : (i % 3 == 1) ? 16 : 32;
      spec.head_size = (i % 4 == 0) ? 80 : (i % 4 == 1) ? 64 : (i % 4 == 2) ? 112 : 128;
      spec.smoothing = i % 2 == 1;
      const uint64_t seed = Seed();
      nonfinite::WriteOutcome cpu, gpu;
      {
        nonfinite::HostMemory host;
        nonfinite::WriteContainment(host, spec, kIoDtypes[i % 3], seed, &cpu);
      }
      {
        CudaMemory dev;
        nonfinite::WriteContainment(dev, spec, kIoDtypes[i % 3], seed, &gpu);
      }
      EXPECT_TRUE(gpu.bytes == cpu.bytes) << "seed " << seed << ": the GPU stored other bytes";
      EXPECT_EQ(gpu.non_finite, cpu.non_finite) << "seed " << seed;
      EXPECT_EQ(gpu.saturated, cpu.saturated) << "seed " << seed;
      ++i;
    }
  }
}

TEST(GpuNonFinite, OneSequencesNonFiniteQueryChangesNoOtherRow) {
  SKIP_WITHOUT_GPU();
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
      // GQA groups 1, 4 and 8: the tensor-core path for the large ones.
      d.num_q_heads = spec.num_kv_heads * (i % 3 == 0 ? 1 : i % 3 == 1 ? 4 : 8);
      d.query_len = 1 + i % 2;
      d.sliding_window = i % 4 == 1 ? 7 : 0;
      d.soft_cap = i % 5 == 2 ? 30.0f : 0.0f;
      d.alibi = i % 3 == 2;
      CudaMemory dev;
      nonfinite::DecodeIsolation(dev, spec, d, Seed());
      ++i;
    }
  }
}

TEST(GpuNonFinite, BytesPastASequencesEndNeverReachItsOutput) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (int32_t kd : kKvDtypes) {
    for (int32_t vd : kKvDtypes) {
      for (int group : {1, 4, 8}) {
        CacheSpec spec;
        spec.k_dtype = kd;
        spec.v_dtype = vd;
        spec.num_layers = 1;
        spec.num_blocks = 12;
        spec.block_size = (i % 3 == 0) ? 8 : (i % 3 == 1) ? 16 : 32;
        spec.head_size = (i % 4 == 0) ? 64 : (i % 4 == 1) ? 96 : (i % 4 == 2) ? 128 : 256;
        DecodeSpec d;
        d.q_dtype = kIoDtypes[i % 3];
        d.out_dtype = kIoDtypes[(i + 1) % 3];
        d.num_q_heads = spec.num_kv_heads * group;
        d.query_len = 1 + i % 2;
        d.alibi = i % 4 == 3;
        CudaMemory dev;
        nonfinite::StaleTails(dev, spec, d, Seed());
        ++i;
      }
    }
  }
}

// ---- The engine allocator on the GPU -------------------------------------------------

// cudaMalloc behind a counter that can fail its N-th call or misalign it.
struct EngineAllocator {
  std::map<void*, size_t> live;  // as handed out
  std::map<void*, void*> base;   // handed-out pointer -> cudaMalloc'ed one
  int calls = 0, frees = 0;
  int fail_at = 0, misalign_at = 0;  // 1-based call; 0 = never
  bool wrong_kind = false;
};

void* EngineAlloc(void* user, size_t bytes, size_t alignment, int32_t kind, int32_t ordinal) {
  auto* a = static_cast<EngineAllocator*>(user);
  ++a->calls;
  if (kind != KVP_DEVICE_CUDA || ordinal != 0 || alignment < 256) a->wrong_kind = true;
  if (a->calls == a->fail_at) return nullptr;
  const size_t extra = a->calls == a->misalign_at ? 16 : 0;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes + extra) != cudaSuccess) return nullptr;
  void* handed = static_cast<char*>(p) + extra;
  a->live[handed] = bytes;
  a->base[handed] = p;
  return handed;
}

void EngineFree(void* user, void* ptr, size_t bytes, int32_t kind, int32_t ordinal) {
  auto* a = static_cast<EngineAllocator*>(user);
  ++a->frees;
  auto it = a->live.find(ptr);
  if (it == a->live.end() || it->second != bytes || kind != KVP_DEVICE_CUDA || ordinal != 0) {
    a->wrong_kind = true;
    return;
  }
  cudaFree(a->base[ptr]);
  a->base.erase(ptr);
  a->live.erase(it);
}

kvp_cache_config GpuConfig(kvp_allocator* alloc) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.num_layers = 2;
  cfg.num_blocks = 32;
  cfg.block_size = 16;
  cfg.num_kv_heads = 2;
  cfg.head_size = 128;
  cfg.k_dtype = KVP_DTYPE_INT8;
  cfg.v_dtype = KVP_DTYPE_INT4;
  cfg.allocator = alloc;
  return cfg;
}

kvp_decode_config GpuDecodeConfig() {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = 8;
  dc.max_num_seqs = 8;
  dc.max_context_len = 4096;  // several split-K partitions: a real workspace
  return dc;
}

TEST(GpuFaultInjection, DecoderWorkspacesComeFromTheEngineAllocator) {
  SKIP_WITHOUT_GPU();
  EngineAllocator ea;
  kvp_allocator a;
  kvp_allocator_init(&a);
  a.user_data = &ea;
  a.alloc = EngineAlloc;
  a.free = EngineFree;
  kvp_cache_config cfg = GpuConfig(&a);
  kvp_cache* cache = nullptr;
  ASSERT_EQ(TakeError(kvp_cache_create(&cfg, &cache)), "");
  ASSERT_EQ(ea.calls, 1);
  kvp_decode_config dc = GpuDecodeConfig();
  uint64_t need = 0;
  ASSERT_EQ(TakeError(kvp_decode_workspace_size(cache, &dc, &need)), "");
  ASSERT_GT(need, 0u);
  kvp_decoder *d1 = nullptr, *d2 = nullptr;
  ASSERT_EQ(TakeError(kvp_decoder_create(cache, &dc, &d1)), "");
  ASSERT_EQ(TakeError(kvp_decoder_create(cache, &dc, &d2)), "");
  EXPECT_EQ(ea.calls, 3) << "each decoder's workspace from the engine allocator";
  size_t workspaces = 0;
  for (const auto& kv : ea.live) workspaces += kv.second == need;
  EXPECT_EQ(workspaces, 2u) << "two allocations of kvp_decode_workspace_size() bytes";
  kvp_decoder_destroy(d1);
  EXPECT_EQ(ea.frees, 1);
  kvp_decoder_destroy(d2);
  kvp_cache_destroy(cache);
  EXPECT_EQ(ea.frees, 3);
  EXPECT_TRUE(ea.live.empty());
  EXPECT_FALSE(ea.wrong_kind) << "an allocator call with a wrong size, device or alignment";
}

// Scenario: cache, two decoders, a decode on each. For N = 1, 2, ... the
// allocator fails its N-th call until a run reaches the end.
TEST(GpuFaultInjection, AllocatorFailingAtEveryCallLeaksNothing) {
  SKIP_WITHOUT_GPU();
  int points = 0;
  for (int n = 1; n < 50; ++n) {
    SCOPED_TRACE(::testing::Message() << "allocator call " << n << " fails");
    EngineAllocator ea;
    ea.fail_at = n;
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = &ea;
    a.alloc = EngineAlloc;
    a.free = EngineFree;
    kvp_cache_config cfg = GpuConfig(&a);
    kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
    kvp_error* e = kvp_cache_create(&cfg, &cache);
    bool failed = false;
    if (e != nullptr) {
      EXPECT_EQ(kvp_error_code(e), KVP_ERR_OUT_OF_MEMORY) << kvp_error_message(e);
      kvp_error_free(e);
      EXPECT_EQ(cache, reinterpret_cast<kvp_cache*>(0x1));
      EXPECT_EQ(ea.calls, n);
      failed = true;
    } else {
      kvp_decode_config dc = GpuDecodeConfig();
      kvp_decoder* decs[2] = {nullptr, nullptr};
      for (kvp_decoder*& d : decs) {
        d = reinterpret_cast<kvp_decoder*>(0x1);
        kvp_error* de = kvp_decoder_create(cache, &dc, &d);
        if (de != nullptr) {
          EXPECT_EQ(kvp_error_code(de), KVP_ERR_OUT_OF_MEMORY) << kvp_error_message(de);
          EXPECT_NE(std::string(kvp_error_message(de)).find("workspace"), std::string::npos)
              << kvp_error_message(de);
          kvp_error_free(de);
          EXPECT_EQ(d, reinterpret_cast<kvp_decoder*>(0x1));
          d = nullptr;
          failed = true;
          break;
        }
      }
      // The decoders that exist still work.
      for (kvp_decoder* d : decs) {
        if (d == nullptr) continue;
        int64_t seq = 0;
        ASSERT_EQ(TakeError(kvp_seq_create(cache, &seq)), "");
        ASSERT_EQ(TakeError(kvp_seq_append(cache, seq, 20, nullptr, nullptr)), "");
        int32_t table[2], len = 0;
        ASSERT_EQ(TakeError(kvp_cache_export_block_table(cache, &seq, 1, 2, 2, table, &len)), "");
        CudaMemory dev;
        std::vector<uint8_t> q(8 * 128 * 2);
        std::vector<uint8_t> out(8 * 128 * 2, 0xFF);
        Rng rng(n);
        StoreElements(KVP_DTYPE_BF16, rng.normals(8 * 128), &q);
        kvp_decode_args da;
        kvp_decode_args_init(&da);
        da.num_seqs = 1;
        da.q = dev.PutVector(q);
        da.block_table = dev.PutVector(std::vector<int32_t>{table[0], table[1]});
        da.block_table_width = 2;
        da.seq_lens = dev.PutVector(std::vector<int32_t>{len});
        void* dout = dev.PutVector(out);
        da.out = dout;
        ASSERT_EQ(TakeError(kvp_decode(d, &da, nullptr)), "");
        dev.Sync();
        dev.Download(out.data(), dout, out.size());
        for (size_t i = 0; i < out.size() / 2; ++i) {
          ASSERT_TRUE(std::isfinite(LoadElement(KVP_DTYPE_BF16, out.data(), i))) << i;
        }
        ASSERT_EQ(TakeError(kvp_seq_free(cache, seq)), "");
      }
      for (kvp_decoder* d : decs) kvp_decoder_destroy(d);
      kvp_cache_destroy(cache);
    }
    EXPECT_TRUE(ea.live.empty()) << ea.live.size() << " engine allocations leaked";
    EXPECT_EQ(ea.frees, static_cast<int>(ea.calls - (ea.calls >= n ? 1 : 0)))
        << "every successful allocation freed once";
    EXPECT_FALSE(ea.wrong_kind);
    if (!failed) break;
    ++points;
  }
  EXPECT_EQ(points, 3) << "the scenario allocates three times (cache, two workspaces)";
}

TEST(GpuFaultInjection, MisalignedWorkspaceMemoryIsRefusedAndReturned) {
  SKIP_WITHOUT_GPU();
  EngineAllocator ea;
  ea.misalign_at = 2;  // the decoder's workspace
  kvp_allocator a;
  kvp_allocator_init(&a);
  a.user_data = &ea;
  a.alloc = EngineAlloc;
  a.free = EngineFree;
  kvp_cache_config cfg = GpuConfig(&a);
  kvp_cache* cache = nullptr;
  ASSERT_EQ(TakeError(kvp_cache_create(&cfg, &cache)), "");
  kvp_decode_config dc = GpuDecodeConfig();
  kvp_decoder* d = reinterpret_cast<kvp_decoder*>(0x1);
  kvp_error* e = kvp_decoder_create(cache, &dc, &d);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(kvp_error_code(e), KVP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvp_error_message(e)).find("allocator"), std::string::npos)
      << kvp_error_message(e);
  kvp_error_free(e);
  EXPECT_EQ(d, reinterpret_cast<kvp_decoder*>(0x1));
  EXPECT_EQ(ea.calls, 2);
  EXPECT_EQ(ea.frees, 1) << "the misaligned block goes back to the engine";
  kvp_cache_destroy(cache);
  EXPECT_TRUE(ea.live.empty());
  EXPECT_FALSE(ea.wrong_kind);
}

TEST(GpuBadInput, CallerWorkspaceTooSmallOrMisaligned) {
  SKIP_WITHOUT_GPU();
  kvp_cache_config cfg = GpuConfig(nullptr);
  kvp_cache* cache = nullptr;
  ASSERT_EQ(TakeError(kvp_cache_create(&cfg, &cache)), "");
  kvp_decode_config dc = GpuDecodeConfig();
  uint64_t need = 0;
  ASSERT_EQ(TakeError(kvp_decode_workspace_size(cache, &dc, &need)), "");
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, need + 256), cudaSuccess);
  struct Case {
    void* ptr;
    uint64_t bytes;
    const char* name;
    std::string value;
  };
  const Case cases[] = {
      {ws, need - 1, "workspace_bytes", std::to_string(need - 1)},
      {ws, 1, "workspace_bytes", "1"},
      {static_cast<char*>(ws) + 16, need, "workspace", ""},
  };
  for (const Case& c : cases) {
    dc.workspace = c.ptr;
    dc.workspace_bytes = c.bytes;
    kvp_decoder* d = reinterpret_cast<kvp_decoder*>(0x1);
    kvp_error* e = kvp_decoder_create(cache, &dc, &d);
    ASSERT_NE(e, nullptr) << c.name;
    EXPECT_EQ(kvp_error_code(e), KVP_ERR_INVALID_ARGUMENT);
    const std::string msg = kvp_error_message(e);
    EXPECT_NE(msg.find(c.name), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.value), std::string::npos) << msg;
    kvp_error_free(e);
    EXPECT_EQ(d, reinterpret_cast<kvp_decoder*>(0x1));
  }
  dc.workspace = ws;
  dc.workspace_bytes = need;
  kvp_decoder* d = nullptr;
  EXPECT_EQ(TakeError(kvp_decoder_create(cache, &dc, &d)), "");  // exactly enough is enough
  kvp_decoder_destroy(d);
  kvp_cache_destroy(cache);
  cudaFree(ws);
}

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace testing
}  // namespace kvpage
