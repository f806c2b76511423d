// SPDX-License-Identifier: Apache-2.0
// kvp_attend (attention over query chunks) on the CPU backend: against the
// float64 reference over the dequantized cache for ragged batches (chunks
// of 0, 1, a few and many tokens, chunks as long as their context) across
// KV dtypes (mixed K/V too), head sizes, block sizes, GQA ratios and every
// option; bit for bit against kvp_decode where a batch is uniform; and the
// bad-input discipline (an error naming the argument, outputs untouched).
// Tolerances as decode_test.cc's: one rounding of the output dtype.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "src/manifest.h"
#include "tests/common/reference.h"
#include "tests/common/test_matrix.h"

namespace kvpage {
namespace testing {
namespace {

#define ASSERT_OK(expr)                        \
  do {                                         \
    std::string kvp_err_ = TakeError(expr);    \
    ASSERT_TRUE(kvp_err_.empty()) << kvp_err_; \
  } while (0)

double OutTolerance(int dtype) {
  return dtype == KVP_DTYPE_BF16   ? std::ldexp(1.0, -8)
         : dtype == KVP_DTYPE_FP16 ? std::ldexp(1.0, -10)
                                   : std::ldexp(1.0, -20);
}

// A CPU cache holding random K/V for `lens`, and the table that names it.
struct Filled {
  kvp_cache* cache = nullptr;
  std::vector<int32_t> table;
  int width = 0;
  std::vector<float> smoothing;
  ~Filled() { kvp_cache_destroy(cache); }
};

void Fill(Rng& rng, int k_dtype, int v_dtype, int D, int bs, int hkv, bool smoothing,
          const std::vector<int>& lens, Filled* f) {
  int blocks = 0;
  f->width = 1;
  for (int l : lens) {
    blocks += (l + bs - 1) / bs;
    f->width = std::max(f->width, (l + bs - 1) / bs);
  }
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_blocks = blocks + 2;
  cfg.block_size = bs;
  cfg.num_kv_heads = hkv;
  cfg.head_size = D;
  cfg.k_dtype = k_dtype;
  cfg.v_dtype = v_dtype;
  if (smoothing) {
    for (int i = 0; i < hkv * D; ++i) f->smoothing.push_back(std::exp(rng.normal(0.7f)));
    cfg.key_smoothing = f->smoothing.data();
  }
  ASSERT_OK(kvp_cache_create(&cfg, &f->cache));
  std::vector<int32_t> perm(blocks + 2);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  f->table.assign(lens.size() * f->width, 0);
  std::vector<int64_t> slots;
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = 0; j < (lens[s] + bs - 1) / bs; ++j) f->table[s * f->width + j] = perm[next++];
    for (int t = 0; t < lens[s]; ++t) {
      slots.push_back(int64_t(f->table[s * f->width + t / bs]) * bs + t % bs);
    }
  }
  std::vector<uint8_t> k, v;
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * hkv * D), &k);
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * hkv * D), &v);
  kvp_write_args wa;
  kvp_write_args_init(&wa);
  wa.num_tokens = static_cast<int32_t>(slots.size());
  wa.input_dtype = KVP_DTYPE_FP32;
  wa.key = k.data();
  wa.value = v.data();
  wa.slot_mapping = slots.data();
  ASSERT_OK(kvp_cache_write(f->cache, &wa, nullptr));
}

kvp_decoder* MakeDecoder(kvp_cache* cache, int hq, int max_seqs, int max_context, int max_tokens,
                         int q_dtype, int out_dtype) {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = max_seqs;
  dc.max_context_len = max_context;
  dc.max_query_tokens = max_tokens;
  dc.q_dtype = q_dtype;
  dc.out_dtype = out_dtype;
  kvp_decoder* d = nullptr;
  const std::string err = TakeError(kvp_decoder_create(cache, &dc, &d));
  EXPECT_EQ(err, "");
  return d;
}

// Query tokens per sequence: 0, 1, a few, many, and the whole context.
std::vector<int> RandomCounts(Rng& rng, const std::vector<int>& lens) {
  std::vector<int> counts;
  for (int len : lens) {
    switch (rng.uniform(0, 4)) {
      case 0:
        counts.push_back(0);
        break;
      case 1:
        counts.push_back(std::min(len, 1));
        break;
      case 2:
        counts.push_back(std::min(len, rng.uniform(2, 9)));
        break;
      case 3:
        counts.push_back(rng.uniform(0, len));
        break;
      default:
        counts.push_back(len);
    }
  }
  return counts;
}

TEST(CpuAttend, AgreesWithTheReferenceOnRaggedBatches) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int trial = 0; trial < 24; ++trial) {
    const int k_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
    const int v_dtype = trial % 3 == 0 ? kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)] : k_dtype;
    const int D = kHeadSizes[rng.uniform(0, kNumHeadSizes - 1)];
    const int bs = 8 << rng.uniform(0, 2);
    const int hkv = rng.uniform(1, 2), group = 1 << rng.uniform(0, 3);
    const int hq = hkv * group;
    const int q_dtype = kIoDtypes[rng.uniform(0, 2)], out_dtype = kIoDtypes[rng.uniform(0, 2)];
    const bool smoothing = rng.uniform(0, 3) == 0, alibi = rng.uniform(0, 2) == 0;
    const bool softcap = rng.uniform(0, 2) == 0;
    const int window = rng.uniform(0, 2) == 0 ? rng.uniform(1, 40) : 0;
    const int num_seqs = rng.uniform(1, 5);
    std::vector<int> lens;
    for (int s = 0; s < num_seqs; ++s) lens.push_back(rng.uniform(0, 90));
    const std::vector<int> counts = RandomCounts(rng, lens);
    SCOPED_TRACE(absl::StrFormat(
        "K=%s V=%s D=%d bs=%d hkv=%d group=%d q=%s out=%s smooth=%d alibi=%d softcap=%d "
        "window=%d",
        DtypeName(k_dtype), DtypeName(v_dtype), D, bs, hkv, group, DtypeName(q_dtype),
        DtypeName(out_dtype), smoothing, alibi, softcap, window));
    Filled f;
    Fill(rng, k_dtype, v_dtype, D, bs, hkv, smoothing, lens, &f);

    DecodeProblem p;
    p.num_seqs = num_seqs;
    p.num_q_heads = hq;
    p.head_size = D;
    p.q_dtype = q_dtype;
    p.query_starts.push_back(0);
    for (int c : counts) p.query_starts.push_back(p.query_starts.back() + c);
    const int tokens = p.query_starts.back();
    // At least one token's worth: q must not be NULL even where no
    // sequence brings a query token.
    StoreElements(q_dtype, rng.normals(size_t(std::max(tokens, 1)) * hq * D), &p.q);
    p.block_table = f.table;
    p.block_table_width = f.width;
    p.seq_lens.assign(lens.begin(), lens.end());
    if (alibi) {
      for (int h = 0; h < hq; ++h) p.alibi_slopes.push_back(std::ldexp(1.0f, -rng.uniform(0, 8)));
    }
    p.key_smoothing = f.smoothing;
    p.sliding_window = window;
    p.sm_scale = rng.uniform(0, 1) ? 0.0f : 0.05f + 0.2f * std::abs(rng.normal());
    p.logits_soft_cap = softcap ? 2.0f + 20.0f * std::abs(rng.normal()) : 0.0f;

    // Capacity above the batch: the call may use less.
    kvp_decoder* dec = MakeDecoder(f.cache, hq, num_seqs + 1, 100, tokens + 5, q_dtype, out_dtype);
    ASSERT_NE(dec, nullptr);
    std::vector<uint8_t> out(size_t(std::max(tokens, 1)) * hq * D * DtypeBytes(out_dtype), 0xFF);
    std::vector<float> lse(size_t(std::max(tokens, 1)) * hq,
                           std::numeric_limits<float>::quiet_NaN());
    kvp_attend_args a;
    kvp_attend_args_init(&a);
    a.num_seqs = num_seqs;
    a.sliding_window = window;
    a.sm_scale = p.sm_scale;
    a.logits_soft_cap = p.logits_soft_cap;
    a.query_starts = p.query_starts.data();
    a.q = p.q.data();
    a.block_table = f.table.data();
    a.block_table_width = f.width;
    a.seq_lens = p.seq_lens.data();
    a.alibi_slopes = alibi ? p.alibi_slopes.data() : nullptr;
    a.out = out.data();
    a.lse = lse.data();
    ASSERT_OK(kvp_attend(dec, &a, nullptr));
    kvp_decoder_destroy(dec);

    std::vector<double> want, want_lse;
    ReferenceDecode(DequantizedLayer::Read(f.cache, 0), p, &want, &want_lse);
    int bad = 0;
    for (int64_t r = 0; r < int64_t(tokens) * hq && bad < 5; ++r) {
      for (int d = 0; d < D; ++d) {
        const double got = LoadElement(out_dtype, out.data(), r * D + d);
        const double w = want[r * D + d];
        if (!(std::abs(got - w) <= OutTolerance(out_dtype) * std::abs(w) + 1e-6)) {
          ADD_FAILURE() << "token " << r / hq << " head " << r % hq << " d " << d << ": " << got
                        << " vs reference " << w;
          ++bad;
          break;
        }
      }
      if (std::isinf(want_lse[r])) {
        EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "lse " << r << " = " << lse[r];
      } else {
        EXPECT_NEAR(lse[r], want_lse[r], 1e-5 * (1 + std::abs(want_lse[r]))) << "lse " << r;
      }
    }
  }
}

// A uniform batch through kvp_attend is kvp_decode's batch: same bits.
TEST(CpuAttend, UniformBatchIsTheDecodeBitForBit) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  const int D = kHeadSizes[0], bs = 16, hkv = 2, hq = 8, qlen = 3;
  const std::vector<int> lens = {5, 40, 3, 17};
  Filled f;
  Fill(rng, kKvDtypes[0], kKvDtypes[kNumKvDtypes - 1], D, bs, hkv, false, lens, &f);
  const int n = static_cast<int>(lens.size()), tokens = n * qlen;
  std::vector<uint8_t> q;
  StoreElements(KVP_DTYPE_BF16, rng.normals(size_t(tokens) * hq * D), &q);
  std::vector<int32_t> lens32(lens.begin(), lens.end()), starts;
  for (int s = 0; s <= n; ++s) starts.push_back(s * qlen);
  std::vector<float> out_decode(size_t(tokens) * hq * D), out_attend(out_decode.size(), NAN);
  std::vector<float> lse_decode(size_t(tokens) * hq), lse_attend(lse_decode.size(), NAN);
  kvp_decode_args da;
  kvp_decode_args_init(&da);
  da.num_seqs = n;
  da.query_len = qlen;
  da.q = q.data();
  da.block_table = f.table.data();
  da.block_table_width = f.width;
  da.seq_lens = lens32.data();
  da.out = out_decode.data();
  da.lse = lse_decode.data();
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = n;
  dc.max_context_len = 64;
  dc.max_query_len = qlen;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(f.cache, &dc, &dec));
  ASSERT_OK(kvp_decode(dec, &da, nullptr));
  kvp_attend_args aa;
  kvp_attend_args_init(&aa);
  aa.num_seqs = n;
  aa.query_starts = starts.data();
  aa.q = q.data();
  aa.block_table = f.table.data();
  aa.block_table_width = f.width;
  aa.seq_lens = lens32.data();
  aa.out = out_attend.data();
  aa.lse = lse_attend.data();
  ASSERT_OK(kvp_attend(dec, &aa, nullptr));  // max_query_tokens 0 = 4 * 3
  kvp_decoder_destroy(dec);
  EXPECT_EQ(0, std::memcmp(out_decode.data(), out_attend.data(), out_decode.size() * 4));
  EXPECT_EQ(0, std::memcmp(lse_decode.data(), lse_attend.data(), lse_decode.size() * 4));
}

// Every bad argument is refused with its name and value, and nothing is
// written.
TEST(CpuAttend, BadInputIsRefusedAndChangesNothing) {
  Rng rng;
  const int D = kHeadSizes[0], bs = 16, hkv = 1, hq = 2;
  const std::vector<int> lens = {10, 4, 7};
  Filled f;
  Fill(rng, kKvDtypes[0], kKvDtypes[0], D, bs, hkv, false, lens, &f);
  kvp_decoder* dec = MakeDecoder(f.cache, hq, 3, 16, 12, KVP_DTYPE_FP32, KVP_DTYPE_FP32);
  ASSERT_NE(dec, nullptr);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  std::vector<float> q(size_t(16) * hq * D, 0.5f);
  struct Bad {
    std::vector<int32_t> starts;
    std::vector<int32_t> lens;
    const char* needle;
  } cases[] = {
      {{1, 3, 4, 6}, lens32, "query_starts[0] = 1"},
      {{0, 3, 2, 6}, lens32, "query_starts[2] = 2"},
      {{0, 3, 4, 13}, lens32, "query_starts[3] = 13"},
      {{0, 3, 9, 10}, lens32, "sequence 1 brings 6 query tokens"},
      {{0, 3, 4, 6}, {10, 4, 17}, "seq_lens[2] = 17"},
      {{0, 3, 4, 6}, {10, -1, 7}, "seq_lens[1] = -1"},
  };
  for (const Bad& c : cases) {
    std::vector<float> out(size_t(16) * hq * D, 7.0f), lse(size_t(16) * hq, 7.0f);
    kvp_attend_args a;
    kvp_attend_args_init(&a);
    a.num_seqs = 3;
    a.query_starts = c.starts.data();
    a.q = q.data();
    a.block_table = f.table.data();
    a.block_table_width = f.width;
    a.seq_lens = c.lens.data();
    a.out = out.data();
    a.lse = lse.data();
    kvp_error* e = kvp_attend(dec, &a, nullptr);
    ASSERT_NE(e, nullptr) << c.needle;
    EXPECT_EQ(kvp_error_code(e), KVP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvp_error_message(e)).find(c.needle), std::string::npos)
        << kvp_error_message(e);
    kvp_error_free(e);
    for (float x : out) ASSERT_EQ(x, 7.0f) << c.needle;
    for (float x : lse) ASSERT_EQ(x, 7.0f) << c.needle;
  }
  // Arguments checked before any data is read.
  std::vector<int32_t> starts = {0, 3, 4, 6};
  auto expect_error = [&](kvp_attend_args a, const char* needle) {
    kvp_error* e = kvp_attend(dec, &a, nullptr);
    ASSERT_NE(e, nullptr) << needle;
    EXPECT_NE(std::string(kvp_error_message(e)).find(needle), std::string::npos)
        << kvp_error_message(e);
    kvp_error_free(e);
  };
  std::vector<float> out(size_t(16) * hq * D);
  kvp_attend_args a;
  kvp_attend_args_init(&a);
  a.num_seqs = 3;
  a.query_starts = starts.data();
  a.q = q.data();
  a.block_table = f.table.data();
  a.block_table_width = f.width;
  a.seq_lens = lens32.data();
  a.out = out.data();
  kvp_attend_args b = a;
  b.query_starts = nullptr;
  expect_error(b, "args->query_starts is NULL");
  b = a;
  b.num_seqs = 4;
  expect_error(b, "args->num_seqs = 4");
  b = a;
  b.reserved0 = 1;
  expect_error(b, "args->reserved0 = 1");
  b = a;
  b.reserved1 = 2;
  expect_error(b, "args->reserved1 = 2");
  b = a;
  b.layer = 1;
  expect_error(b, "args->layer = 1");
  b = a;
  b.struct_size = 8;
  expect_error(b, "struct_size");
  b = a;
  b.q_token_stride = 3;
  expect_error(b, "args->q_token_stride = 3");
  // num_seqs = 0 succeeds without reading anything.
  b = a;
  b.num_seqs = 0;
  b.query_starts = nullptr;
  b.q = nullptr;
  b.out = nullptr;
  ASSERT_OK(kvp_attend(dec, &b, nullptr));
  kvp_decoder_destroy(dec);

  // The capacity itself.
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = 3;
  dc.max_context_len = 16;
  dc.max_query_tokens = -2;
  kvp_decoder* none = nullptr;
  kvp_error* e = kvp_decoder_create(f.cache, &dc, &none);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(std::string(kvp_error_message(e)).find("config->max_query_tokens = -2"),
            std::string::npos)
      << kvp_error_message(e);
  kvp_error_free(e);
  EXPECT_EQ(none, nullptr);
}

// Through the function table, as dlopen users reach it.
TEST(CpuAttend, FunctionTableCarriesTheEntry) {
  const kvp_api* api = kvp_get_api(KVP_ABI_MAJOR);
  ASSERT_NE(api, nullptr);
  ASSERT_GE(api->abi_minor, 3u);
  ASSERT_GE(api->struct_size, size_t{KVP_API_STRUCT_SIZE_1_3});
  EXPECT_EQ(api->attend, &kvp_attend);
  EXPECT_EQ(api->attend_args_init, &kvp_attend_args_init);
  kvp_attend_args a;
  std::memset(&a, 0x5A, sizeof(a));
  api->attend_args_init(&a);
  EXPECT_EQ(a.struct_size, sizeof(a));
  EXPECT_EQ(a.num_seqs, 0);
  EXPECT_EQ(a.query_starts, nullptr);
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
