// SPDX-License-Identifier: Apache-2.0
// Host allocation failures (std::bad_alloc) inside the library
// (docs/RELIABILITY.md, "Fault injection").
//
// This program replaces the global operator new (every variant), so it is
// an executable of its own. While armed, the N-th allocation anywhere in the
// process throws std::bad_alloc; the library's firewall must turn that into
// KVP_ERR_OUT_OF_MEMORY. For each C API call of each scenario, N runs over
// every allocation the call makes (from 1 until a run in which the armed
// failure is never reached), each time on a freshly built cache:
//  - the call returns KVP_OK (the failure was absorbed, e.g. a worker
//    thread that could not start) or KVP_ERR_OUT_OF_MEMORY, nothing else;
//  - a failed call leaves its out-parameters, the caller's buffers and the
//    cache unchanged (free blocks, lengths, block tables, statistics, every
//    byte of every layer); one that absorbed the failure produced the same
//    result as a run without injection;
//  - after destroying everything, every allocation made since the
//    scenario began has been released (the live count returns to its
//    value before; LeakSanitizer checks the same in sanitizer builds).
// No hook in the public ABI is involved.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"

// ---- The failing allocator -----------------------------------------------------------------

namespace {

std::atomic<int64_t> g_countdown{0};  // > 0: armed; the allocation taking it to 0 fails
std::atomic<bool> g_fired{false};     // the armed failure happened
std::atomic<int64_t> g_live{0};       // allocations not yet released
std::atomic<int64_t> g_total{0};      // allocations ever made

void* Allocate(std::size_t n, std::size_t align, bool nothrow) {
  if (g_countdown.load(std::memory_order_relaxed) > 0 && g_countdown.fetch_sub(1) == 1) {
    g_fired = true;
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  if (n == 0) n = 1;
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n);
  } else if (posix_memalign(&p, align, n) != 0) {
    p = nullptr;
  }
  if (p == nullptr) {
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  ++g_live;
  ++g_total;
  return p;
}

void Release(void* p) {
  if (p == nullptr) return;
  --g_live;
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return Allocate(n, 0, false); }
void* operator new[](std::size_t n) { return Allocate(n, 0, false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 0, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 0, true); }
void* operator new(std::size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<std::size_t>(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<std::size_t>(a), true);
}
void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete(void* p, std::size_t) noexcept { Release(p); }
void operator delete[](void* p, std::size_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { Release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { Release(p); }

namespace {

void Arm(int64_t n) {
  g_fired = false;
  g_countdown = n;
}
bool Disarm() {
  g_countdown = 0;
  return g_fired.load();
}

// The allocation to fail inside the next Armed() call (0: none), and
// whether it did.
int64_t g_fail_at = 0;
bool g_last_fired = false;
// The caller memory of the operation under test, and its bytes just before
// the call.
std::vector<uint8_t>* g_out = nullptr;
std::vector<uint8_t> g_out_before;

// Runs one library call with the g_fail_at-th allocation failing; the
// test's own allocations happen outside.
template <typename F>
kvp_error* Armed(F&& call) {
  if (g_out != nullptr) g_out_before = *g_out;
  Arm(g_fail_at);
  kvp_error* e = call();
  g_last_fired = Disarm();
  return e;
}

// ---- Scenario state ----------------------------------------------------------------------

std::string Take(kvp_error* e, int32_t* code) {
  *code = kvp_error_code(e);
  std::string m = e ? kvp_error_message(e) : "";
  kvp_error_free(e);
  return m;
}

#define ASSERT_KVP_OK(expr)                       \
  do {                                            \
    int32_t c_;                                   \
    const std::string m_ = Take((expr), &c_);     \
    ASSERT_EQ(c_, KVP_OK) << #expr << ": " << m_; \
  } while (0)

constexpr int32_t kLayers = 2, kBlocks = 12, kBlockSize = 16, kKvHeads = 2, kHead = 64;
constexpr int32_t kQHeads = 4;
constexpr int64_t kDense = int64_t{kKvHeads} * kHead;

// A small populated cache with key smoothing: sequences a (20 tokens) and
// b (7 tokens) of random K/V in both layers, c a fork of a (sharing its
// partly filled last block); a peer cache of the same geometry; a decoder.
struct World {
  kvp_cache* cache = nullptr;
  kvp_cache* peer = nullptr;  // same geometry, for transfers
  kvp_decoder* decoder = nullptr;
  int64_t a = 0, b = 0, c = 0;
  std::vector<float> lambda;
};

std::vector<float> Randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

kvp_cache_config Config(const std::vector<float>* lambda) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = kLayers;
  cfg.num_blocks = kBlocks;
  cfg.block_size = kBlockSize;
  cfg.num_kv_heads = kKvHeads;
  cfg.head_size = kHead;
  cfg.k_dtype = KVP_DTYPE_INT8;
  cfg.v_dtype = KVP_DTYPE_INT4;
  cfg.key_smoothing = lambda ? lambda->data() : nullptr;
  return cfg;
}

void Write(kvp_cache* cache, std::mt19937& rng, const std::vector<int64_t>& slots) {
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> k = Randn(rng, slots.size() * kDense),
                             v = Randn(rng, slots.size() * kDense);
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = l;
    w.num_tokens = static_cast<int32_t>(slots.size());
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = k.data();
    w.value = v.data();
    w.slot_mapping = slots.data();
    ASSERT_KVP_OK(kvp_cache_write(cache, &w, nullptr));
  }
}

void Build(World* w, uint32_t seed) {
  std::mt19937 rng(seed);
  w->lambda.clear();
  for (int i = 0; i < kKvHeads * kHead; ++i) w->lambda.push_back(0.5f + (rng() % 1000) / 1000.0f);
  kvp_cache_config cfg = Config(&w->lambda);
  ASSERT_KVP_OK(kvp_cache_create(&cfg, &w->cache));
  ASSERT_KVP_OK(kvp_cache_create(&cfg, &w->peer));
  std::vector<int64_t> slots(20);
  ASSERT_KVP_OK(kvp_seq_create(w->cache, &w->a));
  ASSERT_KVP_OK(kvp_seq_append(w->cache, w->a, 20, slots.data(), nullptr));
  Write(w->cache, rng, slots);
  ASSERT_KVP_OK(kvp_seq_create(w->cache, &w->b));
  slots.resize(7);
  ASSERT_KVP_OK(kvp_seq_append(w->cache, w->b, 7, slots.data(), nullptr));
  Write(w->cache, rng, slots);
  ASSERT_KVP_OK(kvp_seq_fork(w->cache, w->a, &w->c));  // shares a's partly filled last block
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = kQHeads;
  dc.max_num_seqs = 4;
  dc.max_context_len = 64;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  ASSERT_KVP_OK(kvp_decoder_create(w->cache, &dc, &w->decoder));
}

void Destroy(World* w) {
  kvp_decoder_destroy(w->decoder);
  kvp_cache_destroy(w->cache);
  kvp_cache_destroy(w->peer);
  *w = World();
}

// Everything observable about a cache.
struct State {
  int32_t num_free = -1;
  std::vector<int32_t> table, lens;
  uint64_t non_finite = 0, saturated = 0;
  std::vector<uint8_t> bytes;
  bool operator==(const State& o) const {
    return num_free == o.num_free && table == o.table && lens == o.lens &&
           non_finite == o.non_finite && saturated == o.saturated && bytes == o.bytes;
  }
};

State Observe(const kvp_cache* cache, const std::vector<int64_t>& ids) {
  State s;
  int32_t code;
  Take(kvp_cache_num_free_blocks(cache, &s.num_free), &code);
  s.table.assign(ids.size() * kBlocks, -1);
  s.lens.assign(ids.size(), -1);
  Take(kvp_cache_export_block_table(cache, ids.data(), static_cast<int32_t>(ids.size()), kBlocks,
                                    kBlocks, s.table.data(), s.lens.data()),
       &code);
  kvp_write_stats st;
  kvp_write_stats_init(&st);
  Take(kvp_cache_get_write_stats(cache, &st), &code);
  s.non_finite = st.non_finite;
  s.saturated = st.saturated;
  for (int32_t l = 0; l < kLayers; ++l) {
    kvp_layer_layout lay;
    kvp_layer_layout_init(&lay);
    Take(kvp_cache_get_layout(cache, l, &lay), &code);
    for (auto r : {std::make_pair(lay.k_data, lay.k_data_bytes),
                   std::make_pair(lay.v_data, lay.v_data_bytes),
                   std::make_pair(lay.k_scales, lay.k_scale_bytes),
                   std::make_pair(lay.v_scales, lay.v_scale_bytes)}) {
      const auto* p = static_cast<const uint8_t*>(r.first);
      if (p) s.bytes.insert(s.bytes.end(), p, p + r.second);
    }
  }
  return s;
}

// An operation under test: on a built world, prepares its buffers (in
// `out`: what a failed call must leave as they were) and makes one C API
// call through Armed().
using Op = std::function<kvp_error*(World&, std::vector<uint8_t>* out)>;

struct Figures {
  int points = 0;    // allocation points exercised (runs in which the failure fired)
  int absorbed = 0;  // of which the call still succeeded
};
Figures g_figures;
int32_t g_free_after_drain = -1;  // free blocks once the world's sequences are freed

// One run of `op` with the n-th allocation failing (0: none), on a fresh
// world. Returns whether the failure fired; checks everything else.
bool RunOnce(const char* name, const Op& op, int64_t n, std::vector<uint8_t>* result,
             State* result_state, State* result_peer) {
  World w;
  Build(&w, 7);
  if (::testing::Test::HasFatalFailure()) return false;
  const std::vector<int64_t> ids = {w.a, w.b, w.c};
  const State before = Observe(w.cache, ids);
  const State before_peer = Observe(w.peer, {});
  std::vector<uint8_t> out;
  g_out = &out;
  g_fail_at = n;
  kvp_error* e = op(w, &out);
  g_fail_at = 0;
  g_out = nullptr;
  const bool fired = g_last_fired;
  int32_t code;
  const std::string m = Take(e, &code);
  if (n == 0) {
    EXPECT_EQ(code, KVP_OK) << name << ": " << m;
    *result = out;
    *result_state = Observe(w.cache, ids);
    *result_peer = Observe(w.peer, {});
  } else if (fired) {
    ++g_figures.points;
    if (code == KVP_OK) ++g_figures.absorbed;
    EXPECT_TRUE(code == KVP_OK || code == KVP_ERR_OUT_OF_MEMORY)
        << name << ", allocation " << n << " failed: the call returned "
        << kvp_error_code_name(code) << ": " << m;
    if (code == KVP_OK) {
      EXPECT_TRUE(out == *result) << name << ", allocation " << n
                                  << ": a call that absorbed the failure gave another result";
      EXPECT_TRUE(Observe(w.cache, ids) == *result_state) << name << ", allocation " << n;
      EXPECT_TRUE(Observe(w.peer, {}) == *result_peer) << name << ", allocation " << n;
    } else {
      EXPECT_FALSE(m.empty());
      EXPECT_TRUE(out == g_out_before)
          << name << ", allocation " << n << ": a failed call wrote caller memory";
      EXPECT_TRUE(Observe(w.cache, ids) == before)
          << name << ", allocation " << n << ": a failed call changed the cache";
      EXPECT_TRUE(Observe(w.peer, {}) == before_peer)
          << name << ", allocation " << n << ": a failed call changed the other cache";
    }
  }
  // Reference counts: freeing the world's sequences must give back every
  // block a failed call left alone (a count raised by a failed fork would
  // keep one), and as many as in the run without injection otherwise.
  int32_t code2;
  for (int64_t id : ids) Take(kvp_seq_free(w.cache, id), &code2);
  int32_t num_free = -1;
  Take(kvp_cache_num_free_blocks(w.cache, &num_free), &code2);
  if (n == 0) {
    g_free_after_drain = num_free;
  } else if (fired) {
    EXPECT_EQ(num_free, code == KVP_OK ? g_free_after_drain : kBlocks)
        << name << ", allocation " << n << ": blocks still referenced after freeing every sequence";
  }
  Destroy(&w);
  return fired;
}

// Runs `op` with the n-th allocation failing, for n = 1, 2, ... until a run
// in which the failure is never reached; every run releases all it took.
void ExerciseEveryAllocation(const char* name, const Op& op) {
  std::vector<uint8_t> result;
  State result_state, result_peer;
  RunOnce(name, op, 0, &result, &result_state, &result_peer);
  const Figures start = g_figures;
  for (int64_t n = 1; n < 100000; ++n) {
    const int64_t live_before = g_live.load();
    const bool fired = RunOnce(name, op, n, &result, &result_state, &result_peer);
    EXPECT_EQ(g_live.load(), live_before) << name << ", allocation " << n << ": memory leaked";
    if (!fired || ::testing::Test::HasFatalFailure()) {
      std::printf("[ HostOom ] %s: %d allocation points, %d absorbed\n", name,
                  g_figures.points - start.points, g_figures.absorbed - start.absorbed);
      return;
    }
  }
  ADD_FAILURE() << name << ": no end to the allocations";
}

// Caller buffers start as 0xA5 bytes.
template <typename T>
T* Buffer(std::vector<uint8_t>* out, size_t count) {
  out->assign(count * sizeof(T), 0xA5);
  return reinterpret_cast<T*>(out->data());
}

class HostOom : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Warm up lazily initialized library state (Abseil, libstdc++), so
    // that allocations that live for the whole process are not counted.
    World w;
    Build(&w, 1);
    Destroy(&w);
  }
  static void TearDownTestSuite() {
    std::printf("[ HostOom ] %d allocation points failed, %d of them absorbed\n", g_figures.points,
                g_figures.absorbed);
  }
};

TEST_F(HostOom, CacheCreate) {
  // Created from nothing: each allocation of kvp_cache_create fails once.
  const Figures start = g_figures;
  for (int variant = 0; variant < 3; ++variant) {  // plain, key smoothing, checked mode
    std::vector<float> lambda(kKvHeads * kHead, 1.5f);
    kvp_cache_config cfg = Config(variant == 1 ? &lambda : nullptr);
    cfg.checked = variant == 2 ? 1 : 0;
    for (int64_t n = 1;; ++n) {
      ASSERT_LT(n, 10000);
      const int64_t live_before = g_live.load();
      bool fired = false;
      {
        kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
        g_fail_at = n;
        kvp_error* e = Armed([&] { return kvp_cache_create(&cfg, &cache); });
        fired = g_last_fired;
        int32_t code;
        const std::string m = Take(e, &code);
        if (fired) {
          ++g_figures.points;
          ASSERT_EQ(code, KVP_ERR_OUT_OF_MEMORY) << "allocation " << n << ": " << m;
          EXPECT_EQ(cache, reinterpret_cast<kvp_cache*>(0x1)) << "out-parameter written";
        } else {
          ASSERT_EQ(code, KVP_OK) << m;
          kvp_cache_destroy(cache);
        }
      }
      EXPECT_EQ(g_live.load(), live_before) << "allocation " << n << ": memory leaked";
      if (!fired) break;
    }
  }
  std::printf(
      "[ HostOom ] kvp_cache_create (plain, key smoothing, checked): %d allocation points\n",
      g_figures.points - start.points);
}

TEST_F(HostOom, DecoderCreate) {
  ExerciseEveryAllocation("kvp_decoder_create", [](World& w, std::vector<uint8_t>* out) {
    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = kQHeads;
    dc.max_num_seqs = 2;
    dc.max_context_len = 32;
    kvp_decoder** d = Buffer<kvp_decoder*>(out, 1);
    kvp_error* e = Armed([&] { return kvp_decoder_create(w.cache, &dc, d); });
    if (e == nullptr) {
      // A handle differs from run to run: release it and compare as the
      // untouched pattern.
      kvp_decoder_destroy(*d);
      std::memset(d, 0xA5, sizeof(*d));
    }
    return e;
  });
}

TEST_F(HostOom, SequenceOperations) {
  ExerciseEveryAllocation("kvp_seq_create", [](World& w, std::vector<uint8_t>* out) {
    int64_t* id = Buffer<int64_t>(out, 1);
    return Armed([&] { return kvp_seq_create(w.cache, id); });
  });
  ExerciseEveryAllocation("kvp_seq_fork", [](World& w, std::vector<uint8_t>* out) {
    int64_t* id = Buffer<int64_t>(out, 1);
    return Armed([&] { return kvp_seq_fork(w.cache, w.a, id); });
  });
  ExerciseEveryAllocation("kvp_seq_append (new blocks)", [](World& w, std::vector<uint8_t>* out) {
    int64_t* slots = Buffer<int64_t>(out, 40);
    return Armed([&] { return kvp_seq_append(w.cache, w.b, 40, slots, nullptr); });
  });
  ExerciseEveryAllocation(
      "kvp_seq_append (copy-on-write)", [](World& w, std::vector<uint8_t>* out) {
        int64_t* slots = Buffer<int64_t>(out, 3);
        return Armed([&] { return kvp_seq_append(w.cache, w.c, 3, slots, nullptr); });
      });
  ExerciseEveryAllocation("kvp_seq_truncate", [](World& w, std::vector<uint8_t>*) {
    return Armed([&] { return kvp_seq_truncate(w.cache, w.a, 5); });
  });
  ExerciseEveryAllocation("kvp_seq_free", [](World& w, std::vector<uint8_t>*) {
    return Armed([&] { return kvp_seq_free(w.cache, w.a); });
  });
  ExerciseEveryAllocation("kvp_seq_length", [](World& w, std::vector<uint8_t>* out) {
    int32_t* len = Buffer<int32_t>(out, 1);
    return Armed([&] { return kvp_seq_length(w.cache, w.a, len); });
  });
  ExerciseEveryAllocation("kvp_cache_export_block_table", [](World& w, std::vector<uint8_t>* out) {
    const int64_t ids[3] = {w.a, w.b, w.c};
    int32_t* buf = Buffer<int32_t>(out, 3 * 4 + 3);
    return Armed(
        [&] { return kvp_cache_export_block_table(w.cache, ids, 3, 4, 4, buf, buf + 12); });
  });
}

TEST_F(HostOom, WriteCopyTransferPack) {
  ExerciseEveryAllocation("kvp_cache_write", [](World& w, std::vector<uint8_t>*) {
    std::mt19937 rng(99);
    const std::vector<float> k = Randn(rng, 3 * kDense), v = Randn(rng, 3 * kDense);
    const int64_t slots[3] = {2, -1, 21};
    kvp_write_args a;
    kvp_write_args_init(&a);
    a.layer = 1;
    a.num_tokens = 3;
    a.input_dtype = KVP_DTYPE_FP32;
    a.key = k.data();
    a.value = v.data();
    a.slot_mapping = slots;
    return Armed([&] { return kvp_cache_write(w.cache, &a, nullptr); });
  });
  ExerciseEveryAllocation("kvp_cache_copy_blocks", [](World& w, std::vector<uint8_t>*) {
    const int32_t pairs[4] = {0, 7, 2, 8};
    return Armed([&] { return kvp_cache_copy_blocks(w.cache, pairs, 2, nullptr); });
  });
  ExerciseEveryAllocation("kvp_cache_transfer_blocks", [](World& w, std::vector<uint8_t>*) {
    const int32_t pairs[4] = {0, 5, 1, 6};
    return Armed([&] { return kvp_cache_transfer_blocks(w.peer, w.cache, pairs, 2, nullptr); });
  });
  ExerciseEveryAllocation("kvp_cache_pack", [](World& w, std::vector<uint8_t>* out) {
    const int32_t ids[3] = {0, 2, 0};
    uint64_t need = 0;
    kvp_error* e = kvp_cache_pack_size(w.cache, 3, 0, &need);
    if (e != nullptr) return e;
    kvp_pack_args a;
    kvp_pack_args_init(&a);
    a.block_ids = ids;
    a.num_blocks = 3;
    a.buffer = Buffer<uint8_t>(out, need);  // malloc'd: 16-byte aligned
    a.buffer_bytes = need;
    return Armed([&] { return kvp_cache_pack(w.cache, &a, nullptr); });
  });
  ExerciseEveryAllocation("kvp_cache_unpack", [](World& w, std::vector<uint8_t>* out) {
    const int32_t ids[2] = {9, 3};
    uint64_t need = 0;
    kvp_error* e = kvp_cache_pack_size(w.cache, 2, 1, &need);
    if (e != nullptr) return e;
    uint8_t signature[KVP_FORMAT_SIGNATURE_BYTES];
    e = kvp_cache_format_signature(w.peer, signature, sizeof(signature));
    if (e != nullptr) return e;
    kvp_pack_args a;
    kvp_pack_args_init(&a);
    a.block_ids = ids;
    a.num_blocks = 2;
    a.first_layer = 1;
    a.buffer = Buffer<uint8_t>(out, need);
    a.buffer_bytes = need;
    a.signature = signature;
    return Armed([&] { return kvp_cache_unpack(w.cache, &a, nullptr); });
  });
  ExerciseEveryAllocation("kvp_cache_reset_write_stats", [](World& w, std::vector<uint8_t>*) {
    return Armed([&] { return kvp_cache_reset_write_stats(w.cache); });
  });
}

TEST_F(HostOom, Decode) {
  ExerciseEveryAllocation("kvp_decode", [](World& w, std::vector<uint8_t>* out) {
    std::mt19937 rng(5);
    const std::vector<float> q = Randn(rng, 3 * kQHeads * kHead);
    int32_t table[3 * 2];
    int32_t lens[3];
    const int64_t ids[3] = {w.a, w.b, w.c};
    kvp_error* e = kvp_cache_export_block_table(w.cache, ids, 3, 2, 2, table, lens);
    if (e != nullptr) return e;
    float* o = Buffer<float>(out, 3 * kQHeads * kHead + 3 * kQHeads);
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.num_seqs = 3;
    a.q = q.data();
    a.block_table = table;
    a.block_table_width = 2;
    a.seq_lens = lens;
    a.out = o;
    a.lse = o + 3 * kQHeads * kHead;
    return Armed([&] { return kvp_decode(w.decoder, &a, nullptr); });
  });
}

TEST_F(HostOom, Queries) {
  ExerciseEveryAllocation("kvp_cache_get_layout", [](World& w, std::vector<uint8_t>* out) {
    kvp_layer_layout* l = Buffer<kvp_layer_layout>(out, 1);
    l->struct_size = sizeof(*l);
    return Armed([&] { return kvp_cache_get_layout(w.cache, 1, l); });
  });
  ExerciseEveryAllocation("kvp_cache_get_info", [](World& w, std::vector<uint8_t>* out) {
    kvp_cache_info* i = Buffer<kvp_cache_info>(out, 1);
    i->struct_size = sizeof(*i);
    return Armed([&] { return kvp_cache_get_info(w.cache, i); });
  });
  ExerciseEveryAllocation("kvp_cache_get_write_stats", [](World& w, std::vector<uint8_t>* out) {
    kvp_write_stats* st = Buffer<kvp_write_stats>(out, 1);
    st->struct_size = sizeof(*st);
    return Armed([&] { return kvp_cache_get_write_stats(w.cache, st); });
  });
  ExerciseEveryAllocation("kvp_cache_num_free_blocks", [](World& w, std::vector<uint8_t>* out) {
    int32_t* n = Buffer<int32_t>(out, 1);
    return Armed([&] { return kvp_cache_num_free_blocks(w.cache, n); });
  });
  ExerciseEveryAllocation("kvp_decode_workspace_size", [](World& w, std::vector<uint8_t>* out) {
    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = kQHeads;
    dc.max_num_seqs = 8;
    dc.max_context_len = 4096;
    uint64_t* bytes = Buffer<uint64_t>(out, 1);
    return Armed([&] { return kvp_decode_workspace_size(w.cache, &dc, bytes); });
  });
}

// Errors about bad arguments need an error object: when even that cannot
// be allocated, the caller still gets an error (OUT_OF_MEMORY), never NULL.
TEST_F(HostOom, ErrorObjectsThemselves) {
  const Figures start = g_figures;
  for (int64_t n = 1;; ++n) {
    ASSERT_LT(n, 1000);
    int32_t count = -7;
    g_fail_at = n;
    kvp_error* e = Armed([&] { return kvp_device_count(9, &count); });
    const bool fired = g_last_fired;
    ASSERT_NE(e, nullptr) << "a bad argument went unreported";
    const int32_t code = kvp_error_code(e);
    EXPECT_TRUE(code == KVP_ERR_INVALID_ARGUMENT || (fired && code == KVP_ERR_OUT_OF_MEMORY))
        << kvp_error_code_name(code);
    EXPECT_EQ(count, -7);
    EXPECT_NE(std::strlen(kvp_error_message(e)), 0u);
    kvp_error_free(e);
    if (fired) ++g_figures.points;
    if (!fired) break;
  }
  std::printf("[ HostOom ] an error object (kvp_device_count): %d allocation points\n",
              g_figures.points - start.points);
}

}  // namespace
