// SPDX-License-Identifier: Apache-2.0
// Non-finite containment checks (docs/RELIABILITY.md, "Non-finite
// containment"), written once against a memory space so that the CPU
// backend (nonfinite_test.cc) and the CUDA backend (gpu_reliability_test.cc)
// run the very same checks:
//
//  - WriteContainment: a write whose K/V rows hold NaN, +Inf and -Inf
//    changes only the bytes of the slots it names (INT4 V: only their
//    nibble), stores exactly what the same write with those values replaced
//    by 0 stores, and adds exactly the number of non-finite inputs to the
//    write statistics (a padding token, slot -1, counts nothing and
//    changes nothing);
//  - DecodeIsolation: a NaN or Inf in one sequence's query changes no
//    other sequence's output or log-sum-exp, bit for bit, and a batch whose
//    cache received non-finite inputs still decodes to finite values;
//  - StaleTails: whatever lies in a sequence's last block past its length,
//    in blocks no sequence uses and in table entries past a row's blocks
//    (NaN data, NaN and Inf scales) never reaches an output.
//
// Every buffer is fresh random data; outputs are poisoned before each call.
#ifndef KVPAGE_TESTS_CAPI_NONFINITE_SUITE_H_
#define KVPAGE_TESTS_CAPI_NONFINITE_SUITE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {
namespace nonfinite {

// Where a cache's buffers live (host memory or one GPU).
class Memory {
 public:
  virtual ~Memory() = default;
  virtual int32_t device_kind() const = 0;
  // A new buffer in this space holding a copy of `bytes` host bytes; it
  // lives as long as this object.
  virtual void* Put(const void* host, size_t bytes) = 0;
  virtual void Upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void Download(void* host, const void* src, size_t bytes) = 0;
  virtual void Sync() = 0;

  template <typename T>
  T* PutVector(const std::vector<T>& v) {
    return static_cast<T*>(Put(v.data(), v.size() * sizeof(T)));
  }
};

class HostMemory final : public Memory {
 public:
  int32_t device_kind() const override { return KVP_DEVICE_CPU; }
  void* Put(const void* host, size_t bytes) override {
    buffers_.emplace_back(std::max<size_t>(bytes, 1));
    std::memcpy(buffers_.back().data(), host, bytes);
    return buffers_.back().data();
  }
  void Upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void Download(void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
  }
  void Sync() override {}

 private:
  struct Buffer {
    explicit Buffer(size_t bytes) : words((bytes + 7) / 8) {}
    uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
    std::vector<uint64_t> words;  // 8-byte aligned
  };
  std::vector<Buffer> buffers_;
};

#define KVP_NF_OK(expr)                                       \
  do {                                                        \
    const std::string nf_err_ = TakeError(expr);              \
    ASSERT_TRUE(nf_err_.empty()) << #expr << ": " << nf_err_; \
  } while (0)

struct CacheSpec {
  int32_t k_dtype = KVP_DTYPE_INT8, v_dtype = KVP_DTYPE_INT8;
  int32_t num_layers = 2, num_blocks = 8, block_size = 16, num_kv_heads = 2, head_size = 64;
  bool smoothing = false;
};

// A cache in `mem`'s space (with key smoothing drawn from `rng`).
inline kvp_cache* MakeCache(Memory& mem, const CacheSpec& s, Rng& rng,
                            std::vector<float>* smoothing) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = mem.device_kind();
  cfg.num_layers = s.num_layers;
  cfg.num_blocks = s.num_blocks;
  cfg.block_size = s.block_size;
  cfg.num_kv_heads = s.num_kv_heads;
  cfg.head_size = s.head_size;
  cfg.k_dtype = s.k_dtype;
  cfg.v_dtype = s.v_dtype;
  if (s.smoothing) {
    if (smoothing->empty()) {
      for (int i = 0; i < s.num_kv_heads * s.head_size; ++i) {
        smoothing->push_back(std::exp(rng.normal(0.5f)));
      }
    }
    cfg.key_smoothing = smoothing->data();
  }
  kvp_cache* cache = nullptr;
  const std::string err = TakeError(kvp_cache_create(&cfg, &cache));
  EXPECT_TRUE(err.empty()) << err;
  return cache;
}

// Every byte of every layer (K, V, K scales, V scales), in host memory.
inline std::vector<uint8_t> Snapshot(Memory& mem, const kvp_cache* cache) {
  mem.Sync();
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  EXPECT_EQ(TakeError(kvp_cache_get_info(cache, &info)), "");
  std::vector<uint8_t> out;
  for (int32_t l = 0; l < info.num_layers; ++l) {
    kvp_layer_layout lay;
    kvp_layer_layout_init(&lay);
    EXPECT_EQ(TakeError(kvp_cache_get_layout(cache, l, &lay)), "");
    const std::pair<const void*, int64_t> regions[] = {{lay.k_data, lay.k_data_bytes},
                                                       {lay.v_data, lay.v_data_bytes},
                                                       {lay.k_scales, lay.k_scale_bytes},
                                                       {lay.v_scales, lay.v_scale_bytes}};
    for (const auto& r : regions) {
      if (r.first == nullptr) continue;
      const size_t at = out.size();
      out.resize(at + r.second);
      mem.Download(out.data() + at, r.first, r.second);
    }
  }
  return out;
}

// Which bits of Snapshot() a write of `slots` in `layer` may change (the
// slots' bytes; INT4 V: their nibbles).
inline std::vector<uint8_t> WritableBits(const kvp_cache* cache, int32_t layer,
                                         const std::vector<int64_t>& slots) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  EXPECT_EQ(TakeError(kvp_cache_get_info(cache, &info)), "");
  std::vector<kvp_layer_layout> lays(info.num_layers);
  int64_t total = 0, base = 0;
  for (int32_t l = 0; l < info.num_layers; ++l) {
    kvp_layer_layout_init(&lays[l]);
    EXPECT_EQ(TakeError(kvp_cache_get_layout(cache, l, &lays[l])), "");
    if (l == layer) base = total;
    total += lays[l].k_data_bytes + lays[l].v_data_bytes +
             (lays[l].k_scales ? lays[l].k_scale_bytes : 0) +
             (lays[l].v_scales ? lays[l].v_scale_bytes : 0);
  }
  std::vector<uint8_t> mask(total, 0);
  const kvp_layer_layout& L = lays[layer];
  uint8_t* k = mask.data() + base;
  uint8_t* v = k + L.k_data_bytes;
  uint8_t* ks = v + L.v_data_bytes;
  uint8_t* vs = ks + (L.k_scales ? L.k_scale_bytes : 0);
  for (int64_t slot : slots) {
    if (slot < 0) continue;
    const int64_t b = slot / info.block_size, t = slot % info.block_size;
    for (int h = 0; h < info.num_kv_heads; ++h) {
      for (int c = 0; c < L.k_chunks; ++c) {
        std::memset(k + b * L.k_block_stride + h * L.k_head_stride + c * L.k_chunk_stride + t * 16,
                    0xFF, 16);
      }
      for (int d = 0; d < info.head_size; ++d) {
        const int64_t bit = t * L.v_bits;
        uint8_t* p =
            v + b * L.v_block_stride + h * L.v_head_stride + d * L.v_channel_stride + bit / 8;
        if (L.v_bits == 4) {
          *p |= static_cast<uint8_t>(0xF << (bit % 8));
        } else {
          std::memset(p, 0xFF, L.v_bits / 8);
        }
      }
      if (L.k_scales) {
        std::memset(
            ks + b * L.k_scale_block_stride + h * L.k_scale_head_stride + t * L.k_scale_entry_bytes,
            0xFF, L.k_scale_entry_bytes);
      }
      if (L.v_scales) {
        std::memset(
            vs + b * L.v_scale_block_stride + h * L.v_scale_head_stride + t * L.v_scale_entry_bytes,
            0xFF, L.v_scale_entry_bytes);
      }
    }
  }
  return mask;
}

// NaN, +Inf or -Inf (kind 0, 1, 2) as a bit pattern of an input dtype.
inline void PutSpecial(int32_t dtype, std::vector<uint8_t>* buf, int64_t i, int kind) {
  if (dtype == KVP_DTYPE_FP32) {
    const uint32_t bits[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u};
    std::memcpy(buf->data() + 4 * i, &bits[kind], 4);
  } else {
    const uint16_t f16[] = {0x7E00, 0x7C00, 0xFC00};
    const uint16_t bf16[] = {0x7FC0, 0x7F80, 0xFF80};
    const uint16_t h = dtype == KVP_DTYPE_FP16 ? f16[kind] : bf16[kind];
    std::memcpy(buf->data() + 2 * i, &h, 2);
  }
}

inline void PutZero(int32_t dtype, std::vector<uint8_t>* buf, int64_t i) {
  std::memset(buf->data() + i * DtypeBytes(dtype), 0, DtypeBytes(dtype));
}

inline std::string Write(Memory& mem, kvp_cache* cache, int32_t layer, int32_t input_dtype,
                         const std::vector<int64_t>& slots, const std::vector<uint8_t>& k,
                         const std::vector<uint8_t>& v) {
  kvp_write_args a;
  kvp_write_args_init(&a);
  a.layer = layer;
  a.num_tokens = static_cast<int32_t>(slots.size());
  a.input_dtype = input_dtype;
  a.key = mem.PutVector(k);
  a.value = mem.PutVector(v);
  a.slot_mapping = mem.PutVector(slots);
  std::string err = TakeError(kvp_cache_write(cache, &a, nullptr));
  mem.Sync();
  return err;
}

inline kvp_write_stats Stats(const kvp_cache* cache) {
  kvp_write_stats s;
  kvp_write_stats_init(&s);
  EXPECT_EQ(TakeError(kvp_cache_get_write_stats(cache, &s)), "");
  return s;
}

// What WriteContainment saw, for comparisons between backends.
struct WriteOutcome {
  std::vector<uint8_t> bytes;
  uint64_t non_finite = 0, saturated = 0;
};

// Two sequences (A: 20 tokens, B: 20 tokens) of clean data in both layers;
// then one write call holding a poisoned token of A, a padding token full of
// NaN, and a token of B rewritten with its own values.
inline void WriteContainment(Memory& mem, const CacheSpec& spec, int32_t input_dtype, uint64_t seed,
                             WriteOutcome* outcome) {
  Rng rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " K " << DtypeName(spec.k_dtype) << " V "
                                    << DtypeName(spec.v_dtype) << " input "
                                    << DtypeName(input_dtype) << " smoothing " << spec.smoothing);
  std::vector<float> lambda;
  kvp_cache* cache = MakeCache(mem, spec, rng, &lambda);
  kvp_cache* twin = MakeCache(mem, spec, rng, &lambda);
  ASSERT_NE(cache, nullptr);
  ASSERT_NE(twin, nullptr);
  const int64_t dense = int64_t{spec.num_kv_heads} * spec.head_size;
  const int32_t len = 20;
  std::vector<int64_t> slots_a(len), slots_b(len);
  for (kvp_cache* c : {cache, twin}) {
    int64_t a = 0, b = 0;
    KVP_NF_OK(kvp_seq_create(c, &a));
    KVP_NF_OK(kvp_seq_create(c, &b));
    KVP_NF_OK(kvp_seq_append(c, a, len, slots_a.data(), nullptr));
    KVP_NF_OK(kvp_seq_append(c, b, len, slots_b.data(), nullptr));
  }
  std::vector<int64_t> all = slots_a;
  all.insert(all.end(), slots_b.begin(), slots_b.end());
  std::vector<std::vector<uint8_t>> clean_k(spec.num_layers), clean_v(spec.num_layers);
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    StoreElements(input_dtype, rng.normals(all.size() * dense), &clean_k[l]);
    StoreElements(input_dtype, rng.normals(all.size() * dense), &clean_v[l]);
    for (kvp_cache* c : {cache, twin}) {
      ASSERT_EQ(Write(mem, c, l, input_dtype, all, clean_k[l], clean_v[l]), "");
    }
  }
  KVP_NF_OK(kvp_cache_reset_write_stats(cache));
  const std::vector<uint8_t> before = Snapshot(mem, cache);

  // The call: token t of A poisoned, a padding token, token u of B as it was.
  const int32_t layer = rng.uniform(0, spec.num_layers - 1);
  const int32_t t = rng.uniform(0, len - 1), u = rng.uniform(0, len - 1);
  const int eb = DtypeBytes(input_dtype);
  std::vector<uint8_t> k(3 * dense * eb), v(3 * dense * eb);
  std::memcpy(k.data(), clean_k[layer].data() + t * dense * eb, dense * eb);
  std::memcpy(v.data(), clean_v[layer].data() + t * dense * eb, dense * eb);
  std::vector<uint8_t> noise;
  StoreElements(input_dtype, rng.normals(dense), &noise);  // the padding token: fresh values
  std::memcpy(k.data() + dense * eb, noise.data(), dense * eb);
  std::memcpy(v.data() + dense * eb, noise.data(), dense * eb);
  for (int64_t e = 0; e < dense; e += 3) PutSpecial(input_dtype, &k, dense + e, e % 3);
  for (int64_t e = 1; e < dense; e += 3) PutSpecial(input_dtype, &v, dense + e, e % 3);
  std::memcpy(k.data() + 2 * dense * eb, clean_k[layer].data() + (len + u) * dense * eb,
              dense * eb);
  std::memcpy(v.data() + 2 * dense * eb, clean_v[layer].data() + (len + u) * dense * eb,
              dense * eb);
  std::vector<uint8_t> k_zeroed = k, v_zeroed = v;
  uint64_t specials = 0;
  for (std::vector<uint8_t>* buf : {&k, &v}) {
    std::vector<uint8_t>* zeroed = buf == &k ? &k_zeroed : &v_zeroed;
    const int n = rng.uniform(1, 6);
    std::vector<int64_t> channels(dense);
    std::iota(channels.begin(), channels.end(), 0);
    std::shuffle(channels.begin(), channels.end(), rng.gen);
    for (int i = 0; i < n; ++i) {
      PutSpecial(input_dtype, buf, channels[i], rng.uniform(0, 2));
      PutZero(input_dtype, zeroed, channels[i]);
      ++specials;
    }
  }
  const std::vector<int64_t> slots = {slots_a[t], -1, slots_b[u]};
  ASSERT_EQ(Write(mem, cache, layer, input_dtype, slots, k, v), "");
  const kvp_write_stats stats = Stats(cache);
  EXPECT_EQ(stats.non_finite, specials) << "every NaN/Inf of the written tokens, and only those";
  EXPECT_EQ(stats.saturated, 0u);

  // Only token t's bytes (and, rewritten with its own values, token u's).
  const std::vector<uint8_t> after = Snapshot(mem, cache);
  const std::vector<uint8_t> mask = WritableBits(cache, layer, {slots_a[t]});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ((after[i] ^ before[i]) & ~mask[i], 0)
        << "byte " << i << " outside the poisoned token changed";
  }
  // Exactly the bytes of the same write with NaN/Inf replaced by 0.
  ASSERT_EQ(Write(mem, twin, layer, input_dtype, slots, k_zeroed, v_zeroed), "");
  EXPECT_TRUE(Snapshot(mem, twin) == after)
      << "a NaN/Inf input is not stored as a 0 would be (it changed the token's other channels)";
  EXPECT_EQ(Stats(twin).non_finite, 0u);

  // A write of padding tokens only (NaN everywhere) changes and counts nothing.
  std::vector<uint8_t> all_nan(2 * dense * eb);
  for (int64_t e = 0; e < 2 * dense; ++e) PutSpecial(input_dtype, &all_nan, e, 0);
  ASSERT_EQ(Write(mem, cache, layer, input_dtype, {-1, -1}, all_nan, all_nan), "");
  EXPECT_EQ(Stats(cache).non_finite, specials);
  EXPECT_TRUE(Snapshot(mem, cache) == after) << "a padding token changed the cache";

  if (outcome != nullptr) {
    outcome->bytes = after;
    outcome->non_finite = stats.non_finite;
    outcome->saturated = stats.saturated;
  }
  kvp_cache_destroy(cache);
  kvp_cache_destroy(twin);
}

struct DecodeSpec {
  int32_t q_dtype = KVP_DTYPE_FP32, out_dtype = KVP_DTYPE_FP32;
  int32_t num_q_heads = 4, query_len = 1;
  int32_t sliding_window = 0;
  float soft_cap = 0;
  bool alibi = false;
};

// A decode call with everything in `mem`; outputs come back poisoned where
// the call did not write them.
struct DecodeRun {
  std::vector<uint8_t> out;
  std::vector<float> lse;
};

inline DecodeRun RunDecode(Memory& mem, kvp_decoder* dec, const DecodeSpec& d, int32_t head_size,
                           const std::vector<uint8_t>& q, const std::vector<int32_t>& table,
                           int32_t width, const std::vector<int32_t>& lens,
                           const std::vector<float>& alibi) {
  const int64_t rows = static_cast<int64_t>(lens.size()) * d.query_len;
  DecodeRun r;
  r.out.assign(rows * d.num_q_heads * head_size * DtypeBytes(d.out_dtype), 0xA5);
  r.lse.assign(rows * d.num_q_heads, 0.0f);
  std::memset(r.lse.data(), 0xA5, r.lse.size() * sizeof(float));
  void* out = mem.PutVector(r.out);
  float* lse = mem.PutVector(r.lse);
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = static_cast<int32_t>(lens.size());
  a.query_len = d.query_len;
  a.sliding_window = d.sliding_window;
  a.logits_soft_cap = d.soft_cap;
  a.q = mem.PutVector(q);
  a.block_table = mem.PutVector(table);
  a.block_table_width = width;
  a.seq_lens = mem.PutVector(lens);
  a.alibi_slopes = alibi.empty() ? nullptr : mem.PutVector(alibi);
  a.out = out;
  a.lse = lse;
  const std::string err = TakeError(kvp_decode(dec, &a, nullptr));
  EXPECT_EQ(err, "");
  mem.Sync();
  mem.Download(r.out.data(), out, r.out.size());
  mem.Download(r.lse.data(), lse, r.lse.size() * sizeof(float));
  return r;
}

// Sequences of random lengths over distinct blocks, clean K/V written; one
// token of the first sequence written with NaN/Inf in K and V; a padding
// row. Then the batch is decoded with one sequence's query poisoned at a
// time (NaN, +Inf, -Inf): every other row keeps its bits.
inline void DecodeIsolation(Memory& mem, const CacheSpec& spec, const DecodeSpec& d,
                            uint64_t seed) {
  Rng rng(seed);
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " K " << DtypeName(spec.k_dtype) << " V "
               << DtypeName(spec.v_dtype) << " q " << DtypeName(d.q_dtype) << " out "
               << DtypeName(d.out_dtype) << " query_len " << d.query_len);
  std::vector<float> lambda;
  kvp_cache* cache = MakeCache(mem, spec, rng, &lambda);
  ASSERT_NE(cache, nullptr);
  const int32_t bs = spec.block_size, D = spec.head_size;
  const int64_t dense = int64_t{spec.num_kv_heads} * D;
  std::vector<int32_t> lens = {rng.uniform(d.query_len, 3 * bs), rng.uniform(d.query_len, 3 * bs),
                               0, rng.uniform(d.query_len, 2 * bs), rng.uniform(1, bs)};
  const int32_t width = 3;
  std::vector<int32_t> table(lens.size() * width, 0);
  std::vector<int64_t> slots;
  std::vector<int32_t> perm(spec.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = 0; j < (lens[s] + bs - 1) / bs; ++j) table[s * width + j] = perm[next++];
    for (int t = 0; t < lens[s]; ++t) {
      slots.push_back(int64_t{table[s * width + t / bs]} * bs + t % bs);
    }
  }
  ASSERT_LE(next, spec.num_blocks);
  std::vector<uint8_t> k, v;
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * dense), &k);
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * dense), &v);
  ASSERT_EQ(Write(mem, cache, 0, KVP_DTYPE_FP32, slots, k, v), "");
  // Token 1 of sequence 0 again, with non-finite values in K and V.
  std::vector<uint8_t> bad_k(k.begin() + dense * 4, k.begin() + 2 * dense * 4);
  std::vector<uint8_t> bad_v(v.begin() + dense * 4, v.begin() + 2 * dense * 4);
  PutSpecial(KVP_DTYPE_FP32, &bad_k, rng.uniform(0, static_cast<int>(dense) - 1), 0);
  PutSpecial(KVP_DTYPE_FP32, &bad_v, rng.uniform(0, static_cast<int>(dense) - 1), 1);
  ASSERT_EQ(Write(mem, cache, 0, KVP_DTYPE_FP32, {slots[1]}, bad_k, bad_v), "");
  EXPECT_EQ(Stats(cache).non_finite, 2u);

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = d.num_q_heads;
  dc.max_num_seqs = static_cast<int32_t>(lens.size());
  dc.max_context_len = width * bs;
  dc.max_query_len = d.query_len;
  dc.q_dtype = d.q_dtype;
  dc.out_dtype = d.out_dtype;
  kvp_decoder* dec = nullptr;
  KVP_NF_OK(kvp_decoder_create(cache, &dc, &dec));
  std::vector<float> alibi;
  if (d.alibi) {
    for (int h = 0; h < d.num_q_heads; ++h) alibi.push_back(std::ldexp(1.0f, -(h % 8) - 1));
  }
  const int64_t rows = static_cast<int64_t>(lens.size()) * d.query_len;
  const int64_t qdense = int64_t{d.num_q_heads} * D;
  std::vector<uint8_t> q;
  StoreElements(d.q_dtype, rng.normals(rows * qdense), &q);
  const DecodeRun clean = RunDecode(mem, dec, d, D, q, table, width, lens, alibi);
  const int ob = DtypeBytes(d.out_dtype);
  const int64_t row_bytes = qdense * ob;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int i = 0; i < d.query_len; ++i) {
      const int64_t row = static_cast<int64_t>(s) * d.query_len + i;
      const bool sees_nothing = lens[s] - d.query_len + i < 0;
      for (int64_t e = 0; e < qdense; ++e) {
        const double x = LoadElement(d.out_dtype, clean.out.data(), row * qdense + e);
        if (sees_nothing) {
          ASSERT_EQ(x, 0.0) << "row " << row << " sees no token";
        } else {
          ASSERT_TRUE(std::isfinite(x)) << "row " << row << " element " << e << ": " << x;
        }
      }
      for (int h = 0; h < d.num_q_heads; ++h) {
        const float l = clean.lse[row * d.num_q_heads + h];
        if (sees_nothing) {
          ASSERT_TRUE(std::isinf(l) && l < 0) << "row " << row << ": lse " << l;
        } else {
          ASSERT_TRUE(std::isfinite(l)) << "row " << row << ": lse " << l;
        }
      }
    }
  }
  for (size_t victim = 0; victim < lens.size(); ++victim) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<uint8_t> bad_q = q;
      const int64_t row =
          static_cast<int64_t>(victim) * d.query_len + rng.uniform(0, d.query_len - 1);
      PutSpecial(d.q_dtype, &bad_q, row * qdense + rng.uniform(0, static_cast<int>(qdense) - 1),
                 kind);
      const DecodeRun dirty = RunDecode(mem, dec, d, D, bad_q, table, width, lens, alibi);
      for (size_t s = 0; s < lens.size(); ++s) {
        if (s == victim) continue;
        for (int i = 0; i < d.query_len; ++i) {
          const int64_t r = static_cast<int64_t>(s) * d.query_len + i;
          ASSERT_EQ(0, std::memcmp(clean.out.data() + r * row_bytes,
                                   dirty.out.data() + r * row_bytes, row_bytes))
              << "a non-finite query (kind " << kind << ") in sequence " << victim
              << " changed the output of sequence " << s;
          ASSERT_EQ(0, std::memcmp(&clean.lse[r * d.num_q_heads], &dirty.lse[r * d.num_q_heads],
                                   d.num_q_heads * sizeof(float)))
              << "a non-finite query in sequence " << victim << " changed the lse of sequence "
              << s;
        }
      }
    }
  }
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

// Sequences whose last block is partly filled; then the tail of every last
// block, every block no sequence uses, and the table entries past each
// row's blocks (pointing at such a block) are filled with NaN bit patterns
// (data 0xFF, scales FP16 NaN or Inf): the decode's bits do not change.
inline void StaleTails(Memory& mem, const CacheSpec& spec, const DecodeSpec& d, uint64_t seed) {
  Rng rng(seed);
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " K " << DtypeName(spec.k_dtype) << " V "
               << DtypeName(spec.v_dtype) << " block_size " << spec.block_size);
  std::vector<float> lambda;
  kvp_cache* cache = MakeCache(mem, spec, rng, &lambda);
  ASSERT_NE(cache, nullptr);
  const int32_t bs = spec.block_size, D = spec.head_size;
  const int64_t dense = int64_t{spec.num_kv_heads} * D;
  // Lengths that end inside a block (and one that ends on a boundary).
  std::vector<int32_t> lens = {bs + rng.uniform(1, bs - 1), rng.uniform(1, bs - 1), 2 * bs,
                               2 * bs + 1, rng.uniform(d.query_len, bs - 1)};
  const int32_t width = 4;
  std::vector<int32_t> perm(spec.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  std::vector<int32_t> table(lens.size() * width, 0);
  std::vector<int64_t> slots;
  std::vector<bool> used(spec.num_blocks, false);
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = 0; j < (lens[s] + bs - 1) / bs; ++j) {
      table[s * width + j] = perm[next];
      used[perm[next++]] = true;
    }
    for (int t = 0; t < lens[s]; ++t)
      slots.push_back(int64_t{table[s * width + t / bs]} * bs + t % bs);
  }
  ASSERT_LT(next, spec.num_blocks) << "need an unused block";
  const int32_t spare = perm[next];
  std::vector<uint8_t> k, v;
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * dense), &k);
  StoreElements(KVP_DTYPE_FP32, rng.normals(slots.size() * dense), &v);
  ASSERT_EQ(Write(mem, cache, 0, KVP_DTYPE_FP32, slots, k, v), "");

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = d.num_q_heads;
  dc.max_num_seqs = static_cast<int32_t>(lens.size());
  dc.max_context_len = width * bs;
  dc.max_query_len = d.query_len;
  dc.q_dtype = d.q_dtype;
  dc.out_dtype = d.out_dtype;
  kvp_decoder* dec = nullptr;
  KVP_NF_OK(kvp_decoder_create(cache, &dc, &dec));
  std::vector<float> alibi;
  if (d.alibi) {
    for (int h = 0; h < d.num_q_heads; ++h) alibi.push_back(std::ldexp(1.0f, -(h % 8) - 1));
  }
  std::vector<uint8_t> q;
  StoreElements(d.q_dtype, rng.normals(lens.size() * d.query_len * d.num_q_heads * D), &q);
  // Entries past each row's blocks name the spare block (to be poisoned).
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = (lens[s] + bs - 1) / bs; j < width; ++j) table[s * width + j] = spare;
  }
  const DecodeRun clean = RunDecode(mem, dec, d, D, q, table, width, lens, alibi);

  // Poison through the layout, on the host side of the memory space.
  kvp_layer_layout L;
  kvp_layer_layout_init(&L);
  KVP_NF_OK(kvp_cache_get_layout(cache, 0, &L));
  std::vector<uint8_t> kd(L.k_data_bytes), vd(L.v_data_bytes);
  std::vector<uint8_t> ksc(L.k_scales ? L.k_scale_bytes : 0), vsc(L.v_scales ? L.v_scale_bytes : 0);
  mem.Download(kd.data(), L.k_data, kd.size());
  mem.Download(vd.data(), L.v_data, vd.size());
  if (L.k_scales) mem.Download(ksc.data(), L.k_scales, ksc.size());
  if (L.v_scales) mem.Download(vsc.data(), L.v_scales, vsc.size());
  const uint16_t kNanOrInf[] = {0x7E00, 0x7C00, 0xFC00, 0xFFFF};
  auto poison_token = [&](int64_t b, int t) {
    for (int h = 0; h < spec.num_kv_heads; ++h) {
      for (int c = 0; c < L.k_chunks; ++c) {
        std::memset(&kd[b * L.k_block_stride + h * L.k_head_stride + c * L.k_chunk_stride + t * 16],
                    0xFF, 16);
      }
      for (int dd = 0; dd < D; ++dd) {
        const int64_t bit = int64_t{t} * L.v_bits;
        uint8_t* p =
            &vd[b * L.v_block_stride + h * L.v_head_stride + dd * L.v_channel_stride + bit / 8];
        if (L.v_bits == 4) {
          *p |= static_cast<uint8_t>(0xF << (bit % 8));
        } else {
          std::memset(p, 0xFF, L.v_bits / 8);
        }
      }
      for (int side = 0; side < 2; ++side) {
        std::vector<uint8_t>& sc = side == 0 ? ksc : vsc;
        if (sc.empty()) continue;
        const int64_t entry = side == 0 ? L.k_scale_entry_bytes : L.v_scale_entry_bytes;
        const int64_t at = b * (side == 0 ? L.k_scale_block_stride : L.v_scale_block_stride) +
                           h * (side == 0 ? L.k_scale_head_stride : L.v_scale_head_stride) +
                           t * entry;
        for (int64_t e = 0; e < entry; e += 2) {
          const uint16_t bits = kNanOrInf[rng.uniform(0, 3)];
          std::memcpy(&sc[at + e], &bits, 2);
        }
      }
    }
  };
  for (size_t s = 0; s < lens.size(); ++s) {
    if (lens[s] % bs == 0) continue;
    const int32_t last = table[s * width + (lens[s] - 1) / bs];
    for (int t = lens[s] % bs; t < bs; ++t) poison_token(last, t);
  }
  for (int32_t b = 0; b < spec.num_blocks; ++b) {
    if (used[b]) continue;
    for (int t = 0; t < bs; ++t) poison_token(b, t);
  }
  mem.Upload(L.k_data, kd.data(), kd.size());
  mem.Upload(L.v_data, vd.data(), vd.size());
  if (L.k_scales) mem.Upload(L.k_scales, ksc.data(), ksc.size());
  if (L.v_scales) mem.Upload(L.v_scales, vsc.data(), vsc.size());
  mem.Sync();

  const DecodeRun stale = RunDecode(mem, dec, d, D, q, table, width, lens, alibi);
  EXPECT_TRUE(stale.out == clean.out) << "bytes past a sequence's end reached its output";
  EXPECT_EQ(0, std::memcmp(stale.lse.data(), clean.lse.data(), clean.lse.size() * sizeof(float)))
      << "bytes past a sequence's end reached its log-sum-exp";
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

constexpr int32_t kKvDtypes[] = {KVP_DTYPE_FP16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_INT8,
                                 KVP_DTYPE_INT4};
constexpr int32_t kIoDtypes[] = {KVP_DTYPE_FP32, KVP_DTYPE_FP16, KVP_DTYPE_BF16};

}  // namespace nonfinite
}  // namespace testing
}  // namespace kvpage

#endif  // KVPAGE_TESTS_CAPI_NONFINITE_SUITE_H_
