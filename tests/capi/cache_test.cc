// SPDX-License-Identifier: Apache-2.0
// Cache behaviour through the C API on the CPU backend: non-finite
// containment and telemetry, fork + copy-on-write, block copies and
// transfers, concurrent sequence operations, and the end-to-end error of
// each KV dtype against float64 attention over the unquantized inputs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {
namespace {

#define ASSERT_OK(expr)                        \
  do {                                         \
    std::string kvp_err_ = TakeError(expr);    \
    ASSERT_TRUE(kvp_err_.empty()) << kvp_err_; \
  } while (0)

// A small CPU cache with FP32 I/O helpers for the scenarios below.
class SmallCache {
 public:
  SmallCache(int k_dtype, int v_dtype, int num_blocks = 64, int block_size = 16,
             int num_kv_heads = 2, int head_size = 64, int num_layers = 2) {
    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.num_layers = num_layers;
    cfg.num_blocks = num_blocks;
    cfg.block_size = block_size;
    cfg.num_kv_heads = num_kv_heads;
    cfg.head_size = head_size;
    cfg.k_dtype = k_dtype;
    cfg.v_dtype = v_dtype;
    error_ = TakeError(kvp_cache_create(&cfg, &cache_));
    hkv_ = num_kv_heads;
    d_ = head_size;
    bs_ = block_size;
  }
  ~SmallCache() { kvp_cache_destroy(cache_); }
  kvp_cache* get() const { return cache_; }
  const std::string& error() const { return error_; }
  int64_t token_elems() const { return int64_t(hkv_) * d_; }

  std::string Write(int layer, const std::vector<int64_t>& slots, const std::vector<float>& k,
                    const std::vector<float>& v) {
    kvp_write_args a;
    kvp_write_args_init(&a);
    a.layer = layer;
    a.num_tokens = static_cast<int32_t>(slots.size());
    a.input_dtype = KVP_DTYPE_FP32;
    a.key = k.data();
    a.value = v.data();
    a.slot_mapping = slots.data();
    return TakeError(kvp_cache_write(cache_, &a, nullptr));
  }

  // Decodes every sequence (one query token each) with FP32 q/out.
  std::string Decode(int layer, int hq, const std::vector<float>& q,
                     const std::vector<int32_t>& table, int width, const std::vector<int32_t>& lens,
                     std::vector<float>* out) {
    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = hq;
    dc.max_num_seqs = static_cast<int32_t>(lens.size());
    dc.max_context_len = width * bs_;
    dc.q_dtype = KVP_DTYPE_FP32;
    dc.out_dtype = KVP_DTYPE_FP32;
    kvp_decoder* dec = nullptr;
    std::string err = TakeError(kvp_decoder_create(cache_, &dc, &dec));
    if (!err.empty()) return err;
    out->assign(lens.size() * size_t(hq) * d_, std::numeric_limits<float>::quiet_NaN());
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.layer = layer;
    a.num_seqs = static_cast<int32_t>(lens.size());
    a.q = q.data();
    a.block_table = table.data();
    a.block_table_width = width;
    a.seq_lens = lens.data();
    a.out = out->data();
    err = TakeError(kvp_decode(dec, &a, nullptr));
    kvp_decoder_destroy(dec);
    return err;
  }

  // Every byte of every layer's data and scales.
  std::vector<uint8_t> Snapshot() const {
    kvp_cache_info info;
    kvp_cache_info_init(&info);
    TakeError(kvp_cache_get_info(cache_, &info));
    std::vector<uint8_t> bytes;
    for (int l = 0; l < info.num_layers; ++l) {
      kvp_layer_layout lay;
      kvp_layer_layout_init(&lay);
      TakeError(kvp_cache_get_layout(cache_, l, &lay));
      auto append = [&](const void* p, int64_t n) {
        if (p)
          bytes.insert(bytes.end(), static_cast<const uint8_t*>(p),
                       static_cast<const uint8_t*>(p) + n);
      };
      append(lay.k_data, lay.k_data_bytes);
      append(lay.v_data, lay.v_data_bytes);
      append(lay.k_scales, lay.k_scale_bytes);
      append(lay.v_scales, lay.v_scale_bytes);
    }
    return bytes;
  }

 private:
  kvp_cache* cache_ = nullptr;
  std::string error_;
  int hkv_ = 0, d_ = 0, bs_ = 0;
};

constexpr int kKvDtypes[] = {KVP_DTYPE_FP16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_INT8,
                             KVP_DTYPE_INT4};

TEST(NonFinite, OneSequenceNeverChangesAnother) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int dtype : kKvDtypes) {
    SCOPED_TRACE(DtypeName(dtype));
    SmallCache cache(dtype, dtype);
    ASSERT_EQ(cache.error(), "");
    // Two sequences of 20 tokens: blocks {0,1} and {2,3}.
    const int len = 20, hq = 4;
    std::vector<int32_t> table = {0, 1, 2, 3};
    std::vector<int32_t> lens = {len, len};
    std::vector<int64_t> slots;
    for (int s = 0; s < 2; ++s) {
      for (int t = 0; t < len; ++t) slots.push_back(int64_t(table[s * 2 + t / 16]) * 16 + t % 16);
    }
    std::vector<float> k = rng.normals(slots.size() * cache.token_elems());
    std::vector<float> v = rng.normals(slots.size() * cache.token_elems());
    ASSERT_EQ(cache.Write(0, slots, k, v), "");
    std::vector<float> q = rng.normals(2 * hq * 64), clean;
    ASSERT_EQ(cache.Decode(0, hq, q, table, 2, lens, &clean), "");
    const std::vector<uint8_t> before = cache.Snapshot();

    // Rewrite token 5 of sequence 0 with NaN, +Inf and -Inf in K and V.
    std::vector<float> k5(k.begin() + 5 * cache.token_elems(), k.begin() + 6 * cache.token_elems());
    std::vector<float> v5(v.begin() + 5 * cache.token_elems(), v.begin() + 6 * cache.token_elems());
    k5[3] = std::numeric_limits<float>::quiet_NaN();
    k5[70] = std::numeric_limits<float>::infinity();
    v5[9] = -std::numeric_limits<float>::infinity();
    v5[100] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_OK(kvp_cache_reset_write_stats(cache.get()));
    ASSERT_EQ(cache.Write(0, {slots[5]}, k5, v5), "");
    kvp_write_stats stats;
    kvp_write_stats_init(&stats);
    ASSERT_OK(kvp_cache_get_write_stats(cache.get(), &stats));
    EXPECT_EQ(stats.non_finite, 4u);
    EXPECT_EQ(stats.saturated, 0u);

    // Only the bytes of that token changed: sequence 1 (blocks 2, 3) and
    // every other token of sequence 0 are untouched.
    const std::vector<uint8_t> after = cache.Snapshot();
    ASSERT_EQ(before.size(), after.size());
    SmallCache reference(dtype, dtype);
    ASSERT_EQ(reference.Write(0, slots, k, v), "");
    ASSERT_EQ(reference.Write(0, {slots[5]}, k5, v5), "");
    EXPECT_EQ(reference.Snapshot(), after) << "the write is not deterministic";

    std::vector<float> dirty;
    ASSERT_EQ(cache.Decode(0, hq, q, table, 2, lens, &dirty), "");
    for (size_t i = 0; i < dirty.size(); ++i) ASSERT_TRUE(std::isfinite(dirty[i])) << i;
    // Sequence 1's output is bit-identical.
    for (size_t i = hq * 64; i < dirty.size(); ++i) ASSERT_EQ(dirty[i], clean[i]) << i;

    // A NaN query in sequence 0 poisons only sequence 0's output.
    std::vector<float> qn = q;
    qn[7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out_nan;
    ASSERT_EQ(cache.Decode(0, hq, qn, table, 2, lens, &out_nan), "");
    for (size_t i = hq * 64; i < out_nan.size(); ++i) ASSERT_EQ(out_nan[i], dirty[i]) << i;
    EXPECT_TRUE(std::isnan(out_nan[0]));
  }
}

TEST(NonFinite, HugeFiniteValuesSaturateAndAreCounted) {
  Rng rng;
  for (int dtype : kKvDtypes) {
    SCOPED_TRACE(DtypeName(dtype));
    SmallCache cache(dtype, dtype);
    std::vector<float> k = rng.normals(cache.token_elems()), v = rng.normals(cache.token_elems());
    k[0] = std::numeric_limits<float>::max();  // rounds past BF16 max; FP16 scale caps at 65504
    ASSERT_EQ(cache.Write(1, {17}, k, v), "");
    kvp_write_stats stats;
    kvp_write_stats_init(&stats);
    ASSERT_OK(kvp_cache_get_write_stats(cache.get(), &stats));
    EXPECT_EQ(stats.non_finite, 0u);
    EXPECT_GE(stats.saturated, 1u);
    const DequantizedLayer L = DequantizedLayer::Read(cache.get(), 1);
    for (int d = 0; d < 64; ++d) ASSERT_TRUE(std::isfinite(L.k(1, 0, 1, d))) << d;
  }
}

TEST(Sequences, ForkCopyOnWriteKeepsTheParentIntact) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int dtype : kKvDtypes) {
    SCOPED_TRACE(DtypeName(dtype));
    SmallCache cache(dtype, KVP_DTYPE_INT4, 16, 8);
    int64_t parent = 0, child = 0;
    ASSERT_OK(kvp_seq_create(cache.get(), &parent));
    std::vector<int64_t> slots(13);  // one full block of 8 and 5 tokens
    ASSERT_OK(kvp_seq_append(cache.get(), parent, 13, slots.data(), nullptr));
    for (int layer = 0; layer < 2; ++layer) {
      ASSERT_EQ(cache.Write(layer, slots, rng.normals(13 * cache.token_elems()),
                            rng.normals(13 * cache.token_elems())),
                "");
    }
    ASSERT_OK(kvp_seq_fork(cache.get(), parent, &child));
    int32_t free_before = 0;
    ASSERT_OK(kvp_cache_num_free_blocks(cache.get(), &free_before));

    // The parent's view before the child writes.
    std::vector<int32_t> table(2), lens(1);
    ASSERT_OK(
        kvp_cache_export_block_table(cache.get(), &parent, 1, 2, 2, table.data(), lens.data()));
    std::vector<float> q = rng.normals(4 * 64), parent_before;
    ASSERT_EQ(cache.Decode(1, 4, q, table, 2, lens, &parent_before), "");

    // The child appends 2 tokens into the shared half-full block: copied.
    std::vector<int64_t> child_slots(2);
    ASSERT_OK(kvp_seq_append(cache.get(), child, 2, child_slots.data(), nullptr));
    int32_t free_after = 0;
    ASSERT_OK(kvp_cache_num_free_blocks(cache.get(), &free_after));
    EXPECT_EQ(free_after, free_before - 1);
    EXPECT_NE(child_slots[0] / 8, slots[12] / 8) << "the shared block was not copied";
    EXPECT_EQ(child_slots[0] % 8, 5);
    for (int layer = 0; layer < 2; ++layer) {
      ASSERT_EQ(cache.Write(layer, child_slots, rng.normals(2 * cache.token_elems()),
                            rng.normals(2 * cache.token_elems())),
                "");
    }
    std::vector<float> parent_after;
    ASSERT_EQ(cache.Decode(1, 4, q, table, 2, lens, &parent_after), "");
    EXPECT_EQ(parent_after, parent_before);

    // The child's first 13 tokens equal the parent's (copied with scales):
    // decoding the child's first 13 tokens matches the parent.
    std::vector<int32_t> ctable(2), clens(1);
    ASSERT_OK(
        kvp_cache_export_block_table(cache.get(), &child, 1, 2, 2, ctable.data(), clens.data()));
    EXPECT_EQ(clens[0], 15);
    EXPECT_EQ(ctable[0], table[0]);  // the full block stays shared
    std::vector<int32_t> clens13 = {13};
    std::vector<float> child13;
    ASSERT_EQ(cache.Decode(1, 4, q, ctable, 2, clens13, &child13), "");
    EXPECT_EQ(child13, parent_before);

    ASSERT_OK(kvp_seq_free(cache.get(), child));
    ASSERT_OK(kvp_seq_free(cache.get(), parent));
    int32_t free_end = 0;
    ASSERT_OK(kvp_cache_num_free_blocks(cache.get(), &free_end));
    EXPECT_EQ(free_end, 16);
  }
}

TEST(Blocks, CopyAndTransferCarryDataAndScales) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int dtype : kKvDtypes) {
    SCOPED_TRACE(DtypeName(dtype));
    SmallCache a(dtype, KVP_DTYPE_INT8, 32, 16, 2, 128, 3);
    SmallCache b(dtype, KVP_DTYPE_INT8, 8, 16, 2, 128, 3);
    ASSERT_EQ(a.error(), "");
    ASSERT_EQ(b.error(), "");
    std::vector<int64_t> slots;
    for (int t = 0; t < 32; ++t) slots.push_back(3 * 16 + t);  // blocks 3 and 4
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_EQ(a.Write(layer, slots, rng.normals(32 * a.token_elems()),
                        rng.normals(32 * a.token_elems())),
                "");
    }
    std::vector<float> q = rng.normals(8 * 128), want, got, got_b;
    ASSERT_EQ(a.Decode(2, 8, q, {3, 4}, 2, {29}, &want), "");
    const int32_t pairs[] = {3, 10, 4, 20};
    ASSERT_OK(kvp_cache_copy_blocks(a.get(), pairs, 2, nullptr));
    ASSERT_EQ(a.Decode(2, 8, q, {10, 20}, 2, {29}, &got), "");
    EXPECT_EQ(got, want);
    // Swap out to a second cache and decode from there: same bytes.
    const int32_t out_pairs[] = {10, 6, 20, 1};
    ASSERT_OK(kvp_cache_transfer_blocks(b.get(), a.get(), out_pairs, 2, nullptr));
    ASSERT_EQ(b.Decode(2, 8, q, {6, 1}, 2, {29}, &got_b), "");
    EXPECT_EQ(got_b, want);
  }
}

TEST(Sequences, ConcurrentUseOfOneCache) {
  SmallCache cache(KVP_DTYPE_INT8, KVP_DTYPE_INT8, 256, 16);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      Rng rng(1000 + t);
      std::vector<int64_t> mine;
      for (int step = 0; step < 1500; ++step) {
        const int op = rng.uniform(0, 4);
        if (op == 0 || mine.empty()) {
          int64_t id = 0;
          if (kvp_error* e = kvp_seq_create(cache.get(), &id)) {
            kvp_error_free(e);
            ++failures;
          } else {
            mine.push_back(id);
          }
        } else if (op == 1) {
          int64_t child = 0;
          kvp_error* e =
              kvp_seq_fork(cache.get(), mine[rng.uniform(0, int(mine.size()) - 1)], &child);
          if (e == nullptr)
            mine.push_back(child);
          else {
            kvp_error_free(e);
            ++failures;
          }
        } else if (op == 2) {
          std::vector<int64_t> slots(40);
          kvp_error* e = kvp_seq_append(cache.get(), mine[rng.uniform(0, int(mine.size()) - 1)],
                                        rng.uniform(0, 40), slots.data(), nullptr);
          if (e != nullptr) {
            if (kvp_error_code(e) != KVP_ERR_OUT_OF_BLOCKS) ++failures;
            kvp_error_free(e);
          }
        } else if (op == 3) {
          const size_t i = rng.uniform(0, int(mine.size()) - 1);
          int32_t len = 0;
          TakeError(kvp_seq_length(cache.get(), mine[i], &len));
          if (kvp_error* e = kvp_seq_truncate(cache.get(), mine[i], len / 2)) {
            kvp_error_free(e);
            ++failures;
          }
        } else {
          const size_t i = rng.uniform(0, int(mine.size()) - 1);
          if (kvp_error* e = kvp_seq_free(cache.get(), mine[i])) {
            kvp_error_free(e);
            ++failures;
          }
          mine.erase(mine.begin() + i);
        }
      }
      for (int64_t id : mine) {
        if (kvp_error* e = kvp_seq_free(cache.get(), id)) {
          kvp_error_free(e);
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  int32_t free_blocks = 0;
  ASSERT_OK(kvp_cache_num_free_blocks(cache.get(), &free_blocks));
  EXPECT_EQ(free_blocks, 256);
}

// The error each KV dtype adds, against float64 attention over the inputs
// themselves, on N(0,1) K/V (a sanity bound; docs/ACCURACY.md has the
// measured figures). Bounds are ~3x the errors seen when they were set.
TEST(Accuracy, EndToEndErrorAgainstUnquantizedAttention) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  struct Bound {
    int dtype;
    double rel_l2;
  };
  const Bound bounds[] = {{KVP_DTYPE_FP16, 2e-3},
                          {KVP_DTYPE_BF16, 1e-2},
                          {KVP_DTYPE_FP8_E4M3, 8e-2},
                          {KVP_DTYPE_INT8, 2e-2},
                          {KVP_DTYPE_INT4, 0.3}};
  for (const Bound& bound : bounds) {
    SCOPED_TRACE(DtypeName(bound.dtype));
    const int len = 200, hq = 8, D = 128;
    SmallCache cache(bound.dtype, bound.dtype, 16, 16, 1, D, 1);
    std::vector<int64_t> slots(len);
    std::vector<int32_t> table(13);
    for (int j = 0; j < 13; ++j) table[j] = 12 - j;
    for (int t = 0; t < len; ++t) slots[t] = int64_t(table[t / 16]) * 16 + t % 16;
    std::vector<float> k = rng.normals(len * D), v = rng.normals(len * D), q = rng.normals(hq * D);
    ASSERT_EQ(cache.Write(0, slots, k, v), "");
    std::vector<float> out;
    ASSERT_EQ(cache.Decode(0, hq, q, table, 13, {len}, &out), "");
    double err2 = 0, ref2 = 0;
    for (int h = 0; h < hq; ++h) {
      std::vector<double> logit(len);
      double m = -1e300, sum = 0;
      for (int j = 0; j < len; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[h * D + d]) * k[j * D + d];
        logit[j] = dot / std::sqrt(double(D));
        m = std::max(m, logit[j]);
      }
      for (double& l : logit) sum += (l = std::exp(l - m));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < len; ++j) o += logit[j] / sum * v[j * D + d];
        err2 += (out[h * D + d] - o) * (out[h * D + d] - o);
        ref2 += o * o;
      }
    }
    const double rel = std::sqrt(err2 / ref2);
    RecordProperty(std::string("rel_l2_") + DtypeName(bound.dtype), std::to_string(rel));
    EXPECT_LT(rel, bound.rel_l2);
    EXPECT_GT(rel, 0.0);
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
