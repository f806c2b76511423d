// SPDX-License-Identifier: Apache-2.0
// Decode on the CPU backend against the float64 reference over the
// dequantized cache, across KV dtypes x head sizes x block sizes x GQA
// ratios x options, with fresh random ragged batches and poisoned outputs.
//
// Tolerances: the CPU backend computes in double and rounds once to the
// output dtype, so |out - ref| <= 2^-8 |ref| (BF16: twice half an ulp),
// 2^-10 |ref| (FP16: the same), 2^-20 |ref| (FP32), plus 1e-6 absolute
// for results near zero (FP16 subnormals, sums that cancel). LSE is FP32:
// 1e-5 relative. That the rounding is the nearest value, once, is checked
// exactly in conformance_test.cc.
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
#include "src/formats.h"
#include "src/manifest.h"
#include "tests/common/reference.h"
#include "tests/common/test_matrix.h"

namespace kvpage {
namespace testing {
namespace {

struct Case {
  int k_dtype = KVP_DTYPE_BF16, v_dtype = KVP_DTYPE_BF16;
  int head_size = 128, block_size = 16;
  int num_kv_heads = 2, group = 4;
  int num_seqs = 4, max_len = 150, query_len = 1;
  int input_dtype = KVP_DTYPE_FP32, q_dtype = KVP_DTYPE_FP32, out_dtype = KVP_DTYPE_FP32;
  bool alibi = false, softcap = false, lse = true, smoothing = false;
  int sliding_window = 0;
  bool block_manager = false;                     // tables from kvp_seq_* or raw
  std::vector<int> lengths;                       // explicit lengths, else random
  int64_t q_pad = 0, out_pad = 0, table_pad = 0;  // extra stride elements

  std::string Describe() const {
    return absl::StrFormat(
        "K=%s V=%s D=%d bs=%d hkv=%d group=%d seqs=%d qlen=%d in=%s q=%s out=%s alibi=%d "
        "softcap=%d window=%d smooth=%d bm=%d pads=%d/%d/%d",
        DtypeName(k_dtype), DtypeName(v_dtype), head_size, block_size, num_kv_heads, group,
        num_seqs, query_len, DtypeName(input_dtype), DtypeName(q_dtype), DtypeName(out_dtype),
        alibi, softcap, sliding_window, smoothing, block_manager, q_pad, out_pad, table_pad);
  }
};

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

// Poison for outputs: NaN in every dtype.
void Poison(int dtype, std::vector<uint8_t>* buf) {
  if (dtype == KVP_DTYPE_FP32) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i + 4 <= buf->size(); i += 4) std::memcpy(buf->data() + i, &nan, 4);
  } else {
    const uint16_t nan = dtype == KVP_DTYPE_FP16 ? 0x7E00 : 0x7FC0;
    for (size_t i = 0; i + 2 <= buf->size(); i += 2) std::memcpy(buf->data() + i, &nan, 2);
  }
}

// The write stored exactly what the format definition makes of each input
// token: read back through the public layout and compared, value for value,
// with QuantizeVector applied to the same inputs. Catches misplaced bytes
// and nibbles that a decode-vs-reference comparison cannot see.
void ExpectCacheHoldsInputs(const kvp_cache* cache, int layer, const Case& c,
                            const std::vector<int64_t>& slots, const std::vector<uint8_t>& kbytes,
                            const std::vector<uint8_t>& vbytes,
                            const std::vector<float>& smoothing) {
  const DequantizedLayer L = DequantizedLayer::Read(cache, layer);
  const int D = c.head_size;
  std::vector<float> x(D);
  std::vector<uint16_t> codes(D);
  int bad = 0;
  for (size_t t = 0; t < slots.size() && bad < 5; ++t) {
    if (slots[t] < 0) continue;
    const int64_t b = slots[t] / c.block_size;
    const int off = static_cast<int>(slots[t] % c.block_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        const auto dtype = static_cast<DType>(kv == 0 ? c.k_dtype : c.v_dtype);
        const std::vector<uint8_t>& in = kv == 0 ? kbytes : vbytes;
        for (int d = 0; d < D; ++d) {
          x[d] = static_cast<float>(
              LoadElement(c.input_dtype, in.data(), (int64_t(t) * c.num_kv_heads + h) * D + d));
        }
        ScaleEntry scale;
        QuantStats stats;
        QuantizeVector(dtype, x.data(),
                       kv == 0 && !smoothing.empty() ? smoothing.data() + h * D : nullptr, D,
                       codes.data(), &scale, &stats);
        for (int d = 0; d < D; ++d) {
          const double want = DequantizeCode(dtype, codes[d], scale);
          const double got = kv == 0 ? L.k(b, h, off, d) : L.v(b, h, off, d);
          if (want != got && bad++ < 5) {
            ADD_FAILURE() << (kv == 0 ? "K" : "V") << " of token " << t << " (slot " << slots[t]
                          << ") head " << h << " channel " << d << ": cache holds " << got
                          << ", the format gives " << want;
          }
        }
      }
    }
  }
}

// Builds a cache with random contents for `c`, runs one decode and checks
// it against the reference. Returns the decode output for callers that
// compare runs.
void RunCase(const Case& c, Rng& rng) {
  SCOPED_TRACE(c.Describe() + absl::StrFormat(" seed=%d", rng.seed));
  const int D = c.head_size, bs = c.block_size, hkv = c.num_kv_heads;
  const int hq = hkv * c.group;
  std::vector<int> lens = c.lengths;
  if (lens.empty()) {
    for (int s = 0; s < c.num_seqs; ++s) lens.push_back(rng.uniform(1, c.max_len));
  }
  const int num_seqs = static_cast<int>(lens.size());
  int max_blocks = 1, total_blocks = 0;
  for (int l : lens) {
    max_blocks = std::max(max_blocks, (l + bs - 1) / bs);
    total_blocks += (l + bs - 1) / bs;
  }
  const int num_blocks = total_blocks + rng.uniform(1, 8);

  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = 2;
  cfg.num_blocks = num_blocks;
  cfg.block_size = bs;
  cfg.num_kv_heads = hkv;
  cfg.head_size = D;
  cfg.k_dtype = c.k_dtype;
  cfg.v_dtype = c.v_dtype;
  std::vector<float> smoothing;
  if (c.smoothing) {
    for (int i = 0; i < hkv * D; ++i) smoothing.push_back(std::exp(rng.normal(0.7f)));
    cfg.key_smoothing = smoothing.data();
  }
  kvp_cache* cache = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &cache));
  const int layer = rng.uniform(0, 1);

  // Tables: through the block manager, or a random permutation of blocks.
  const int width = max_blocks + static_cast<int>(c.table_pad);
  std::vector<int32_t> table(size_t(num_seqs) * width, 0);
  std::vector<int64_t> slots;
  if (c.block_manager) {
    std::vector<int64_t> ids(num_seqs);
    for (int s = 0; s < num_seqs; ++s) {
      ASSERT_OK(kvp_seq_create(cache, &ids[s]));
      std::vector<int64_t> seq_slots(lens[s]);
      ASSERT_OK(kvp_seq_append(cache, ids[s], lens[s], seq_slots.data(), nullptr));
      slots.insert(slots.end(), seq_slots.begin(), seq_slots.end());
    }
    std::vector<int32_t> got_lens(num_seqs);
    ASSERT_OK(kvp_cache_export_block_table(cache, ids.data(), num_seqs, width, width, table.data(),
                                           got_lens.data()));
    for (int s = 0; s < num_seqs; ++s) ASSERT_EQ(got_lens[s], lens[s]);
  } else {
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    int next = 0;
    for (int s = 0; s < num_seqs; ++s) {
      for (int j = 0; j < (lens[s] + bs - 1) / bs; ++j) table[size_t(s) * width + j] = perm[next++];
      for (int t = 0; t < lens[s]; ++t) {
        slots.push_back(int64_t(table[size_t(s) * width + t / bs]) * bs + t % bs);
      }
    }
  }
  // Padding tokens (-1) mixed in must be skipped.
  std::vector<int64_t> write_slots;
  std::vector<float> kv_k, kv_v;
  for (int64_t slot : slots) {
    if (rng.uniform(0, 9) == 0) {
      write_slots.push_back(-1);
      for (float x : rng.normals(size_t(hkv) * D, 3)) kv_k.push_back(x), kv_v.push_back(x);
    }
    write_slots.push_back(slot);
    for (float x : rng.normals(size_t(hkv) * D)) kv_k.push_back(x);
    for (float x : rng.normals(size_t(hkv) * D)) kv_v.push_back(x);
  }
  std::vector<uint8_t> kbytes, vbytes;
  StoreElements(c.input_dtype, kv_k, &kbytes);
  StoreElements(c.input_dtype, kv_v, &vbytes);
  kvp_write_args wa;
  kvp_write_args_init(&wa);
  wa.layer = layer;
  wa.num_tokens = static_cast<int32_t>(write_slots.size());
  wa.input_dtype = c.input_dtype;
  wa.key = kbytes.data();
  wa.value = vbytes.data();
  wa.slot_mapping = write_slots.data();
  ASSERT_OK(kvp_cache_write(cache, &wa, nullptr));
  ExpectCacheHoldsInputs(cache, layer, c, write_slots, kbytes, vbytes, smoothing);

  // The problem as the reference sees it.
  DecodeProblem p;
  p.num_seqs = num_seqs;
  p.query_len = c.query_len;
  p.num_q_heads = hq;
  p.head_size = D;
  p.q_dtype = c.q_dtype;
  StoreElements(c.q_dtype, rng.normals(size_t(num_seqs) * c.query_len * hq * D), &p.q);
  p.block_table = table;
  p.block_table_width = width;
  p.seq_lens.assign(lens.begin(), lens.end());
  if (c.alibi) {
    for (int h = 0; h < hq; ++h) p.alibi_slopes.push_back(std::ldexp(1.0f, -rng.uniform(0, 8)));
  }
  p.key_smoothing = smoothing;
  p.sliding_window = c.sliding_window;
  p.sm_scale = rng.uniform(0, 1) ? 0.0f : 0.05f + 0.2f * std::abs(rng.normal());
  p.logits_soft_cap = c.softcap ? 2.0f + 20.0f * std::abs(rng.normal()) : 0.0f;

  // Strided buffers as the engine would pass them.
  const int64_t dense = int64_t(hq) * D;
  const int64_t rows = int64_t(num_seqs) * c.query_len;
  const int64_t q_stride = dense + c.q_pad, out_stride = dense + c.out_pad;
  std::vector<uint8_t> q_strided(rows * q_stride * DtypeBytes(c.q_dtype));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(q_strided.data() + r * q_stride * DtypeBytes(c.q_dtype),
                p.q.data() + r * dense * DtypeBytes(c.q_dtype), dense * DtypeBytes(c.q_dtype));
  }
  const int64_t table_stride = width + 3 * (c.table_pad > 0);
  std::vector<int32_t> table_strided(size_t(num_seqs) * table_stride, -12345);
  for (int s = 0; s < num_seqs; ++s) {
    std::copy_n(table.begin() + size_t(s) * width, width, table_strided.begin() + s * table_stride);
  }
  std::vector<uint8_t> out(rows * out_stride * DtypeBytes(c.out_dtype));
  Poison(c.out_dtype, &out);
  std::vector<float> lse(rows * hq, std::numeric_limits<float>::quiet_NaN());

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = num_seqs + rng.uniform(0, 3);
  dc.max_context_len = *std::max_element(lens.begin(), lens.end()) + rng.uniform(0, 5);
  dc.max_query_len = std::max(c.query_len, 1 + rng.uniform(0, 2));
  dc.q_dtype = c.q_dtype;
  dc.out_dtype = c.out_dtype;
  dc.max_query_len = std::min(dc.max_query_len, dc.max_context_len);
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));
  kvp_decode_args da;
  kvp_decode_args_init(&da);
  da.layer = layer;
  da.num_seqs = num_seqs;
  da.query_len = c.query_len;
  da.sliding_window = p.sliding_window;
  da.sm_scale = p.sm_scale;
  da.logits_soft_cap = p.logits_soft_cap;
  da.q = q_strided.data();
  da.q_token_stride = c.q_pad ? q_stride : 0;
  da.block_table = table_strided.data();
  da.block_table_stride = c.table_pad ? table_stride : 0;
  da.block_table_width = width;
  da.seq_lens = p.seq_lens.data();
  da.alibi_slopes = c.alibi ? p.alibi_slopes.data() : nullptr;
  da.out = out.data();
  da.out_token_stride = c.out_pad ? out_stride : 0;
  da.lse = c.lse ? lse.data() : nullptr;
  ASSERT_OK(kvp_decode(dec, &da, nullptr));

  std::vector<double> ref_out, ref_lse;
  ReferenceDecode(DequantizedLayer::Read(cache, layer), p, &ref_out, &ref_lse);
  const double tol = OutTolerance(c.out_dtype);
  int bad = 0;
  for (int64_t r = 0; r < rows && bad < 5; ++r) {
    for (int h = 0; h < hq; ++h) {
      for (int d = 0; d < D; ++d) {
        const double want = ref_out[(r * hq + h) * D + d];
        const double got = LoadElement(c.out_dtype, out.data(), r * out_stride + h * D + d);
        if (!(std::abs(got - want) <= tol * std::abs(want) + 1e-6)) {
          ADD_FAILURE() << "out[row " << r << "][head " << h << "][" << d << "] = " << got
                        << ", reference " << want;
          if (++bad >= 5) break;
        }
      }
      if (c.lse) {
        const double want = ref_lse[r * hq + h];
        const double got = lse[r * hq + h];
        if (std::isinf(want)) {
          EXPECT_TRUE(std::isinf(got) && got < 0)
              << "lse row " << r << " head " << h << ": " << got;
        } else {
          EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)))
              << "lse row " << r << " head " << h;
        }
      }
    }
    // Stride gaps stay untouched (still poisoned).
    for (int64_t e = dense; e < out_stride; ++e) {
      EXPECT_TRUE(std::isnan(LoadElement(c.out_dtype, out.data(), r * out_stride + e)));
    }
  }
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

TEST(DecodeCpu, EveryKvDtypePair) {
  Rng rng;
  int i = 0;
  for (int kd : kKvDtypes) {
    for (int vd : kKvDtypes) {
      Case c;
      c.k_dtype = kd;
      c.v_dtype = vd;
      c.head_size = kHeadSizes[i % kNumHeadSizes];
      c.block_size = kBlockSizes[i % 3];
      c.input_dtype = kIoDtypes[i % 3];
      c.q_dtype = kIoDtypes[(i / 3) % 3];
      c.out_dtype = kIoDtypes[(i / 9) % 3];
      c.block_manager = i % 2;
      ++i;
      RunCase(c, rng);
    }
  }
}

TEST(DecodeCpu, EveryHeadSizeAndBlockSize) {
  Rng rng;
  for (int kd : kKvDtypes) {
    for (int D : kHeadSizes) {
      for (int bs : kBlockSizes) {
        Case c;
        c.k_dtype = kd;
        c.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
        c.head_size = D;
        c.block_size = bs;
        c.num_kv_heads = 1;
        c.group = 2;
        c.num_seqs = 2;
        c.max_len = 3 * bs + 2;
        RunCase(c, rng);
      }
    }
  }
}

TEST(DecodeCpu, GqaRatiosAndMqa) {
  Rng rng;
  for (int group : {1, 2, 4, 8, 16}) {
    for (int hkv : {1, 2, 4}) {
      Case c;
      c.k_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
      c.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
      c.head_size = kHeadSizes[rng.uniform(0, kNumHeadSizes - 1)];
      c.num_kv_heads = hkv;
      c.group = group;
      c.num_seqs = 3;
      c.max_len = 80;
      RunCase(c, rng);
    }
  }
}

TEST(DecodeCpu, Options) {
  Rng rng;
  for (int kd : kKvDtypes) {
    for (int option = 0; option < 8; ++option) {
      Case c;
      c.k_dtype = kd;
      c.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
      c.head_size = kHeadSizes[rng.uniform(0, kNumHeadSizes - 1)];
      c.block_size = kBlockSizes[rng.uniform(0, 2)];
      c.max_len = 120;
      switch (option) {
        case 0:
          c.alibi = true;
          break;
        case 1:
          c.softcap = true;
          break;
        case 2:
          c.sliding_window = rng.uniform(1, 40);
          break;
        case 3:
          c.query_len = rng.uniform(2, 5);
          break;
        case 4:
          c.smoothing = true;
          break;
        case 5:
          c.q_pad = 8;
          c.out_pad = 24;
          c.table_pad = 2;
          break;
        case 6:
          c.lse = false;
          c.sliding_window = 1;
          break;
        default:  // everything at once
          c.alibi = c.softcap = c.smoothing = true;
          c.sliding_window = rng.uniform(5, 60);
          c.query_len = rng.uniform(2, 4);
          c.q_pad = 16;
          c.block_manager = true;
      }
      RunCase(c, rng);
    }
  }
}

TEST(DecodeCpu, QueryAndOutputDtypes) {
  Rng rng;
  for (int qd : kIoDtypes) {
    for (int od : kIoDtypes) {
      Case c;
      c.q_dtype = qd;
      c.out_dtype = od;
      c.input_dtype = kIoDtypes[rng.uniform(0, 2)];
      c.k_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
      c.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
      RunCase(c, rng);
    }
  }
}

TEST(DecodeCpu, LengthEdgeCases) {
  Rng rng;
  for (int bs : kBlockSizes) {
    Case c;
    c.block_size = bs;
    c.k_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
    c.v_dtype = KVP_DTYPE_INT4;  // odd lengths split a packed byte
    // A padding row (length 0), single tokens, block boundaries +-1.
    c.lengths = {0, 1, 2, bs - 1, bs, bs + 1, 2 * bs - 1, 2 * bs, 2 * bs + 1};
    RunCase(c, rng);
    // More query tokens than a sequence holds: early queries see nothing.
    c.query_len = 3;
    c.lengths = {1, 2, 3, bs + 1};
    RunCase(c, rng);
  }
}

TEST(DecodeCpu, LongContext) {
  Rng rng;
  Case c;
  c.k_dtype = KVP_DTYPE_INT4;
  c.v_dtype = KVP_DTYPE_INT8;
  c.head_size = 64;
  c.num_kv_heads = 1;
  c.group = 8;
  c.lengths = {4099, 37};
  RunCase(c, rng);
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
