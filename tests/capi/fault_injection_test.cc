// SPDX-License-Identifier: Apache-2.0
// The engine allocator failing (docs/RELIABILITY.md, "Fault injection"), on
// the CPU backend: an allocator that fails its N-th call, for every N of a
// scenario that creates two caches (one with key smoothing), decoders on
// both, writes, decodes and transfers between them, then destroys
// everything. The failing call returns KVP_ERR_OUT_OF_MEMORY naming the
// size it asked for, leaves its out-parameter alone and changes nothing
// else (the other cache decodes to the same bits); every block the
// allocator handed out comes back exactly once, with its size, device and
// alignment. Decoders on the CPU backend take nothing from the allocator.
// (Host allocation failures inside the library: tests/fault/host_oom_test.cc;
// the same on a GPU, where decoders do take their workspace from it:
// gpu_reliability_test.cc.)
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {
namespace {

struct FailingAllocator {
  std::map<void*, size_t> live;
  int calls = 0, frees = 0;
  int fail_at = 0;      // 1-based call that returns NULL; 0 = never
  int misalign_at = 0;  // 1-based call that returns memory 16 bytes off
  std::vector<std::string> misuse;
};

void* Alloc(void* user, size_t bytes, size_t alignment, int32_t kind, int32_t ordinal) {
  auto* a = static_cast<FailingAllocator*>(user);
  ++a->calls;
  if (kind != KVP_DEVICE_CPU || ordinal != 0) a->misuse.push_back("alloc for another device");
  if (alignment < 256 || (alignment & (alignment - 1)) != 0) {
    a->misuse.push_back("alignment " + std::to_string(alignment));
  }
  if (a->calls == a->fail_at) return nullptr;
  const size_t off = a->calls == a->misalign_at ? 16 : 0;
  char* p = static_cast<char*>(std::aligned_alloc(256, (bytes + off + 255) / 256 * 256));
  a->live[p + off] = bytes;
  return p + off;
}

void Free(void* user, void* ptr, size_t bytes, int32_t kind, int32_t ordinal) {
  auto* a = static_cast<FailingAllocator*>(user);
  ++a->frees;
  auto it = a->live.find(ptr);
  if (it == a->live.end()) {
    a->misuse.push_back("free of a pointer never handed out (or freed twice)");
    return;
  }
  if (it->second != bytes) a->misuse.push_back("free with another size");
  if (kind != KVP_DEVICE_CPU || ordinal != 0) a->misuse.push_back("free for another device");
  const size_t off = reinterpret_cast<uintptr_t>(ptr) % 256;
  std::free(static_cast<char*>(ptr) - off);
  a->live.erase(it);
}

kvp_cache_config Config(kvp_allocator* alloc, const std::vector<float>* lambda) {
  kvp_cache_config c;
  kvp_cache_config_init(&c);
  c.num_layers = 2;
  c.num_blocks = 8;
  c.block_size = 16;
  c.num_kv_heads = 2;
  c.head_size = 64;
  c.k_dtype = KVP_DTYPE_FP8_E4M3;
  c.v_dtype = KVP_DTYPE_INT4;
  c.key_smoothing = lambda ? lambda->data() : nullptr;
  c.allocator = alloc;
  return c;
}

// Decodes sequence `seq` of `cache` (layer 1) with fresh decoders; the
// output bits.
std::vector<float> DecodeOne(kvp_cache* cache, int64_t seq, const std::vector<float>& q) {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = 4;
  dc.max_num_seqs = 1;
  dc.max_context_len = 64;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  EXPECT_EQ(TakeError(kvp_decoder_create(cache, &dc, &dec)), "");
  int32_t table[4], len = 0;
  EXPECT_EQ(TakeError(kvp_cache_export_block_table(cache, &seq, 1, 4, 4, table, &len)), "");
  std::vector<float> out(4 * 64, std::numeric_limits<float>::quiet_NaN());
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.layer = 1;
  a.num_seqs = 1;
  a.q = q.data();
  a.block_table = table;
  a.block_table_width = 4;
  a.seq_lens = &len;
  a.out = out.data();
  EXPECT_EQ(TakeError(kvp_decode(dec, &a, nullptr)), "");
  kvp_decoder_destroy(dec);
  return out;
}

int64_t Populate(kvp_cache* cache, Rng& rng, int32_t n) {
  int64_t seq = 0;
  std::vector<int64_t> slots(n);
  EXPECT_EQ(TakeError(kvp_seq_create(cache, &seq)), "");
  EXPECT_EQ(TakeError(kvp_seq_append(cache, seq, n, slots.data(), nullptr)), "");
  for (int32_t l = 0; l < 2; ++l) {
    const std::vector<float> k = rng.normals(n * 128), v = rng.normals(n * 128);
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = l;
    w.num_tokens = n;
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = k.data();
    w.value = v.data();
    w.slot_mapping = slots.data();
    EXPECT_EQ(TakeError(kvp_cache_write(cache, &w, nullptr)), "");
  }
  return seq;
}

TEST(FaultInjection, EngineAllocatorFailingAtEveryCall) {
  Rng seed_rng;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_rng.seed);
  int points = 0;
  for (int n = 1; n < 20; ++n) {
    SCOPED_TRACE(::testing::Message() << "allocator call " << n << " fails");
    Rng rng(seed_rng.seed);
    FailingAllocator fa;
    fa.fail_at = n;
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = &fa;
    a.alloc = Alloc;
    a.free = Free;
    std::vector<float> lambda(128);
    for (float& l : lambda) l = std::exp(rng.normal(0.3f));
    bool failed = false;

    kvp_cache_config cfg_a = Config(&a, &lambda);
    kvp_cache* ca = reinterpret_cast<kvp_cache*>(0x1);
    kvp_error* e = kvp_cache_create(&cfg_a, &ca);
    if (e != nullptr) {
      EXPECT_EQ(kvp_error_code(e), KVP_ERR_OUT_OF_MEMORY) << kvp_error_message(e);
      kvp_error_free(e);
      EXPECT_EQ(ca, reinterpret_cast<kvp_cache*>(0x1)) << "out-parameter written";
      failed = true;
    } else {
      const int64_t sa = Populate(ca, rng, 21);
      const std::vector<float> q = rng.normals(4 * 64);
      const std::vector<float> before = DecodeOne(ca, sa, q);
      EXPECT_EQ(fa.calls, 1) << "a CPU decoder took memory from the engine allocator";
      kvp_cache_config cfg_b = Config(&a, &lambda);
      kvp_cache* cb = reinterpret_cast<kvp_cache*>(0x1);
      e = kvp_cache_create(&cfg_b, &cb);
      if (e != nullptr) {
        const std::string msg = kvp_error_message(e);
        EXPECT_EQ(kvp_error_code(e), KVP_ERR_OUT_OF_MEMORY) << msg;
        kvp_error_free(e);
        EXPECT_EQ(cb, reinterpret_cast<kvp_cache*>(0x1)) << "out-parameter written";
        failed = true;
        // The first cache is untouched by the second one's failure.
        EXPECT_TRUE(DecodeOne(ca, sa, q) == before);
      } else {
        // Swap sa's blocks into the second cache and decode them there.
        int32_t table[4], len = 0;
        ASSERT_EQ(TakeError(kvp_cache_export_block_table(ca, &sa, 1, 4, 4, table, &len)), "");
        int64_t sb = 0;
        ASSERT_EQ(TakeError(kvp_seq_create(cb, &sb)), "");
        std::vector<int64_t> slots(len);
        ASSERT_EQ(TakeError(kvp_seq_append(cb, sb, len, slots.data(), nullptr)), "");
        int32_t tb[4], lb = 0;
        ASSERT_EQ(TakeError(kvp_cache_export_block_table(cb, &sb, 1, 4, 4, tb, &lb)), "");
        const int32_t pairs[4] = {table[0], tb[0], table[1], tb[1]};
        ASSERT_EQ(TakeError(kvp_cache_transfer_blocks(cb, ca, pairs, 2, nullptr)), "");
        EXPECT_TRUE(DecodeOne(cb, sb, q) == before);
        kvp_cache_destroy(cb);
      }
      kvp_cache_destroy(ca);
    }
    EXPECT_TRUE(fa.live.empty()) << fa.live.size() << " engine allocations leaked";
    EXPECT_EQ(fa.frees, fa.calls - (fa.calls >= n ? 1 : 0)) << "every block freed once";
    for (const std::string& m : fa.misuse) ADD_FAILURE() << m;
    if (!failed) break;
    ++points;
  }
  EXPECT_EQ(points, 2) << "the scenario allocates twice (two caches)";
}

TEST(FaultInjection, MisalignedEngineMemoryIsRefusedAtEveryCall) {
  for (int n = 1; n <= 2; ++n) {
    SCOPED_TRACE(::testing::Message() << "allocator call " << n << " misaligned");
    FailingAllocator fa;
    fa.misalign_at = n;
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = &fa;
    a.alloc = Alloc;
    a.free = Free;
    kvp_cache_config cfg = Config(&a, nullptr);
    kvp_cache* c1 = nullptr;
    kvp_cache* c2 = reinterpret_cast<kvp_cache*>(0x1);
    kvp_error* e1 = kvp_cache_create(&cfg, &c1);
    kvp_error* e2 = e1 ? nullptr : kvp_cache_create(&cfg, &c2);
    kvp_error* e = n == 1 ? e1 : e2;
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(kvp_error_code(e), KVP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvp_error_message(e)).find("allocator"), std::string::npos)
        << kvp_error_message(e);
    kvp_error_free(e);
    if (n == 2) {
      EXPECT_EQ(c2, reinterpret_cast<kvp_cache*>(0x1));
      kvp_cache_destroy(c1);
    }
    EXPECT_TRUE(fa.live.empty()) << "the misaligned block was not given back";
    EXPECT_EQ(fa.frees, fa.calls);
    for (const std::string& m : fa.misuse) ADD_FAILURE() << m;
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
