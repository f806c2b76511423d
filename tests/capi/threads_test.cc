// SPDX-License-Identifier: Apache-2.0
// Several threads working one CPU cache through the C API at once, the way
// an engine's scheduler threads would (docs/RELIABILITY.md; run under
// ThreadSanitizer by scripts/test_sanitizers.sh). Each worker creates,
// forks, appends to (with copy-on-write), truncates and frees its own
// sequences, writes K/V into their slots (some of it NaN), exports their
// tables and decodes them with its own decoder, while a monitor thread reads
// the free-block count, the write statistics, the cache's info and layout.
// Blocks move between threads as they are freed and taken again.
//
// Checks: every call succeeds (or runs out of blocks); decodes give finite
// outputs; the last batch of each worker, decoded again once every thread
// has stopped, gives the same bits (no thread disturbed another's blocks);
// the non-finite counter equals the NaNs all threads wrote (no lost
// update); every block is free at the end.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {
namespace {

constexpr int32_t kBlocks = 160, kBlockSize = 16, kKvHeads = 2, kHead = 64, kLayers = 2;
constexpr int32_t kQHeads = 4, kMaxSeqs = 4, kMaxContext = 256, kWidth = kMaxContext / kBlockSize;
constexpr int64_t kDense = int64_t{kKvHeads} * kHead;

struct Batch {
  std::vector<int64_t> ids;
  std::vector<int32_t> table, lens;
  std::vector<float> q, out, lse;
};

// Decodes `b` (ids, table, lens, q set) with `dec` into b->out and b->lse.
std::string Decode(kvp_decoder* dec, Batch* b, int32_t layer) {
  const size_t n = b->lens.size();
  b->out.assign(n * kQHeads * kHead, std::numeric_limits<float>::quiet_NaN());
  b->lse.assign(n * kQHeads, std::numeric_limits<float>::quiet_NaN());
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.layer = layer;
  a.num_seqs = static_cast<int32_t>(n);
  a.q = b->q.data();
  a.block_table = b->table.data();
  a.block_table_width = kWidth;
  a.seq_lens = b->lens.data();
  a.out = b->out.data();
  a.lse = b->lse.data();
  return TakeError(kvp_decode(dec, &a, nullptr));
}

kvp_decoder* NewDecoder(kvp_cache* cache) {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = kQHeads;
  dc.max_num_seqs = kMaxSeqs;
  dc.max_context_len = kMaxContext;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  const std::string err = TakeError(kvp_decoder_create(cache, &dc, &dec));
  EXPECT_EQ(err, "");
  return dec;
}

struct WorkerResult {
  std::vector<std::string> errors;
  uint64_t nans_written = 0;
  Batch last;
  int32_t last_layer = 0;
  int decodes = 0, writes = 0, appends = 0;
};

// Exports and decodes up to kMaxSeqs of `mine`; the batch becomes r->last.
template <typename Fail>
void DecodeMine(kvp_cache* cache, kvp_decoder* dec, const std::vector<int64_t>& mine, Rng& rng,
                WorkerResult* r, Fail& fail) {
  Batch b;
  for (size_t i = 0; i < mine.size() && b.ids.size() < kMaxSeqs; ++i) b.ids.push_back(mine[i]);
  if (b.ids.empty()) return;
  b.table.assign(b.ids.size() * kWidth, -1);
  b.lens.assign(b.ids.size(), -1);
  std::string e = TakeError(kvp_cache_export_block_table(cache, b.ids.data(),
                                                         static_cast<int32_t>(b.ids.size()), kWidth,
                                                         kWidth, b.table.data(), b.lens.data()));
  if (!e.empty()) return fail("export: " + e);
  b.q = rng.normals(b.ids.size() * kQHeads * kHead);
  const int32_t layer = rng.uniform(0, kLayers - 1);
  e = Decode(dec, &b, layer);
  if (!e.empty()) return fail("decode: " + e);
  ++r->decodes;
  for (float x : b.out) {
    if (!std::isfinite(x)) return fail("decode output not finite");
  }
  r->last = b;
  r->last_layer = layer;
}

void Worker(kvp_cache* cache, uint64_t seed, int steps, std::atomic<int>* start, WorkerResult* r) {
  Rng rng(seed);
  kvp_decoder* dec = NewDecoder(cache);
  std::vector<int64_t> mine;
  auto fail = [&](const std::string& what) {
    if (r->errors.size() < 5) r->errors.push_back(what);
  };
  start->fetch_sub(1);
  while (start->load() > 0) std::this_thread::yield();  // overlap for real

  for (int step = 0; step < steps; ++step) {
    const int op = rng.uniform(0, 9);
    if (mine.empty() || op == 0) {
      int64_t id = 0;
      const std::string e = TakeError(kvp_seq_create(cache, &id));
      if (!e.empty())
        fail("create: " + e);
      else
        mine.push_back(id);
    } else if (op == 1 && mine.size() < 6) {
      int64_t child = 0;
      const std::string e =
          TakeError(kvp_seq_fork(cache, mine[rng.uniform(0, int(mine.size()) - 1)], &child));
      if (!e.empty())
        fail("fork: " + e);
      else
        mine.push_back(child);
    } else if (op <= 4) {
      // Append and write the new tokens in both layers; one NaN per write.
      const int64_t id = mine[rng.uniform(0, int(mine.size()) - 1)];
      int32_t len = 0;
      TakeError(kvp_seq_length(cache, id, &len));
      const int32_t n = std::min(rng.uniform(1, 24), kMaxContext - len);
      if (n <= 0) continue;
      std::vector<int64_t> slots(n);
      kvp_error* e = kvp_seq_append(cache, id, n, slots.data(), nullptr);
      if (e != nullptr) {
        if (kvp_error_code(e) != KVP_ERR_OUT_OF_BLOCKS)
          fail("append: " + TakeError(e));
        else
          kvp_error_free(e);
        continue;
      }
      ++r->appends;
      for (int32_t l = 0; l < kLayers; ++l) {
        std::vector<float> k = rng.normals(n * kDense), v = rng.normals(n * kDense);
        k[rng.uniform(0, int(k.size()) - 1)] = std::numeric_limits<float>::quiet_NaN();
        kvp_write_args w;
        kvp_write_args_init(&w);
        w.layer = l;
        w.num_tokens = n;
        w.input_dtype = KVP_DTYPE_FP32;
        w.key = k.data();
        w.value = v.data();
        w.slot_mapping = slots.data();
        const std::string we = TakeError(kvp_cache_write(cache, &w, nullptr));
        if (!we.empty())
          fail("write: " + we);
        else {
          ++r->nans_written;
          ++r->writes;
        }
      }
    } else if (op == 5) {
      const size_t i = rng.uniform(0, int(mine.size()) - 1);
      int32_t len = 0;
      TakeError(kvp_seq_length(cache, mine[i], &len));
      const std::string e = TakeError(kvp_seq_truncate(cache, mine[i], rng.uniform(0, len)));
      if (!e.empty()) fail("truncate: " + e);
    } else if (op == 6 && mine.size() > 1) {
      const size_t i = rng.uniform(0, int(mine.size()) - 1);
      const std::string e = TakeError(kvp_seq_free(cache, mine[i]));
      if (!e.empty()) fail("free: " + e);
      mine.erase(mine.begin() + i);
    } else {
      DecodeMine(cache, dec, mine, rng, r, fail);
    }
  }
  // A last decode (other threads may still be running); its sequences stay
  // alive and unchanged for the re-decode, the others are freed.
  DecodeMine(cache, dec, mine, rng, r, fail);
  for (int64_t id : mine) {
    if (std::find(r->last.ids.begin(), r->last.ids.end(), id) != r->last.ids.end()) continue;
    const std::string e = TakeError(kvp_seq_free(cache, id));
    if (!e.empty()) fail("final free: " + e);
  }
  kvp_decoder_destroy(dec);
}

TEST(Threads, SeveralThreadsWorkOneCache) {
  Rng seeds;
  SCOPED_TRACE(::testing::Message() << "seed " << seeds.seed);
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = kLayers;
  cfg.num_blocks = kBlocks;
  cfg.block_size = kBlockSize;
  cfg.num_kv_heads = kKvHeads;
  cfg.head_size = kHead;
  cfg.k_dtype = KVP_DTYPE_INT8;
  cfg.v_dtype = KVP_DTYPE_INT4;
  kvp_cache* cache = nullptr;
  ASSERT_EQ(TakeError(kvp_cache_create(&cfg, &cache)), "");

  const int kWorkers = 4, kSteps = 150;
  std::vector<WorkerResult> results(kWorkers);
  std::atomic<int> start{kWorkers + 1};
  std::atomic<bool> done{false};
  std::vector<std::string> monitor_errors;
  uint64_t last_non_finite = 0;
  std::thread monitor([&] {
    start.fetch_sub(1);
    while (!done.load()) {
      int32_t num_free = -1;
      kvp_write_stats st;
      kvp_write_stats_init(&st);
      kvp_cache_info info;
      kvp_cache_info_init(&info);
      kvp_layer_layout lay;
      kvp_layer_layout_init(&lay);
      const std::string e = TakeError(kvp_cache_num_free_blocks(cache, &num_free)) +
                            TakeError(kvp_cache_get_write_stats(cache, &st)) +
                            TakeError(kvp_cache_get_info(cache, &info)) +
                            TakeError(kvp_cache_get_layout(cache, 1, &lay));
      if (!e.empty() && monitor_errors.size() < 5) monitor_errors.push_back(e);
      if (num_free < 0 || num_free > kBlocks) monitor_errors.push_back("free count out of range");
      if (st.non_finite < last_non_finite) monitor_errors.push_back("non_finite went down");
      last_non_finite = st.non_finite;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t) {
    threads.emplace_back(Worker, cache, seeds.seed + 1000 * (t + 1), kSteps, &start, &results[t]);
  }
  for (std::thread& t : threads) t.join();
  done = true;
  monitor.join();
  EXPECT_TRUE(monitor_errors.empty()) << monitor_errors.front();

  uint64_t nans = 0;
  for (int t = 0; t < kWorkers; ++t) {
    SCOPED_TRACE(::testing::Message() << "worker " << t);
    for (const std::string& e : results[t].errors) ADD_FAILURE() << e;
    nans += results[t].nans_written;
    EXPECT_GT(results[t].writes, 0);
    EXPECT_GT(results[t].decodes, 0);
    // The last batch again, alone: the same bits.
    Batch again = results[t].last;
    if (again.ids.empty()) continue;
    kvp_decoder* dec = NewDecoder(cache);
    ASSERT_EQ(Decode(dec, &again, results[t].last_layer), "");
    EXPECT_EQ(0, std::memcmp(again.out.data(), results[t].last.out.data(),
                             again.out.size() * sizeof(float)))
        << "another thread changed the blocks of this one's sequences";
    EXPECT_EQ(0, std::memcmp(again.lse.data(), results[t].last.lse.data(),
                             again.lse.size() * sizeof(float)));
    kvp_decoder_destroy(dec);
    for (int64_t id : again.ids) EXPECT_EQ(TakeError(kvp_seq_free(cache, id)), "");
  }
  kvp_write_stats st;
  kvp_write_stats_init(&st);
  ASSERT_EQ(TakeError(kvp_cache_get_write_stats(cache, &st)), "");
  EXPECT_EQ(st.non_finite, nans) << "write statistics lost updates";
  int32_t num_free = -1;
  ASSERT_EQ(TakeError(kvp_cache_num_free_blocks(cache, &num_free)), "");
  EXPECT_EQ(num_free, kBlocks);
  kvp_cache_destroy(cache);
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
