// SPDX-License-Identifier: Apache-2.0
// Conformance with what the header and docs/DECISIONS.md state, through the
// C API on the CPU backend: the ABI version kvp_build_info reports, decode
// outputs rounded once from double, key smoothing compared by
// kvp_cache_transfer_blocks, and the edge cases the header decides (the slot
// count, repeated slots in one write, a CPU cache's device_ordinal, writes
// of no tokens and decodes of no sequences).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/capi/nonfinite_suite.h"
#include "tests/common/fresh_seed.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {
namespace {

#define ASSERT_OK(expr)                        \
  do {                                         \
    std::string kvp_err_ = TakeError(expr);    \
    ASSERT_TRUE(kvp_err_.empty()) << kvp_err_; \
  } while (0)

// Checks that a call failed with `code` and a message containing every
// needle; frees the error.
void ExpectError(kvp_error* e, int32_t code, std::initializer_list<std::string> needles) {
  if (e == nullptr) {
    ADD_FAILURE() << "expected " << kvp_error_code_name(code) << ", the call succeeded";
    return;
  }
  const std::string msg = kvp_error_message(e);
  EXPECT_EQ(kvp_error_code(e), code) << kvp_error_code_name(kvp_error_code(e)) << ": " << msg;
  for (const std::string& n : needles) {
    EXPECT_NE(msg.find(n), std::string::npos) << "message \"" << msg << "\" lacks \"" << n << "\"";
  }
  kvp_error_free(e);
}

struct Spec {
  int k_dtype = KVP_DTYPE_FP16, v_dtype = KVP_DTYPE_FP16;
  int num_layers = 1, num_blocks = 8, block_size = 16, num_kv_heads = 1, head_size = 64;
  std::vector<float> smoothing;  // empty = none; [kv_head][channel]
};

kvp_error* CreateCache(const Spec& s, kvp_cache** cache) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = s.num_layers;
  cfg.num_blocks = s.num_blocks;
  cfg.block_size = s.block_size;
  cfg.num_kv_heads = s.num_kv_heads;
  cfg.head_size = s.head_size;
  cfg.k_dtype = s.k_dtype;
  cfg.v_dtype = s.v_dtype;
  cfg.key_smoothing = s.smoothing.empty() ? nullptr : s.smoothing.data();
  return kvp_cache_create(&cfg, cache);
}

std::vector<float> Normals(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

kvp_error* WriteFp32(kvp_cache* cache, int layer, const std::vector<int64_t>& slots,
                     const std::vector<float>& k, const std::vector<float>& v) {
  kvp_write_args a;
  kvp_write_args_init(&a);
  a.layer = layer;
  a.num_tokens = static_cast<int32_t>(slots.size());
  a.input_dtype = KVP_DTYPE_FP32;
  a.key = k.data();
  a.value = v.data();
  a.slot_mapping = slots.data();
  return kvp_cache_write(cache, &a, nullptr);
}

// Every byte of every layer's data and scales of a CPU cache
// (nonfinite_suite.h's Snapshot, over host memory).
// The smallest CPU cache's configuration: 4 blocks of the defaults, 1 KV
// head.
kvp_cache_config SmallCpuConfig() {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_blocks = 4;
  cfg.num_kv_heads = 1;
  return cfg;
}

std::vector<uint8_t> CacheBytes(const kvp_cache* cache) {
  nonfinite::HostMemory host;
  return nonfinite::Snapshot(host, cache);
}

// ---- kvp_build_info's ABI version --------------------------------------------

// The "abi=X.Y" item of kvp_build_info's "; "-separated key=value pairs.
bool ParseAbi(const std::string& info, uint32_t* major, uint32_t* minor, std::string* why) {
  int found = 0;
  for (size_t pos = 0; pos <= info.size();) {
    size_t end = info.find("; ", pos);
    if (end == std::string::npos) end = info.size();
    const std::string item = info.substr(pos, end - pos);
    if (item.rfind("abi=", 0) == 0) {
      ++found;
      const char* s = item.c_str() + 4;
      char* dot = nullptr;
      *major = static_cast<uint32_t>(std::strtoul(s, &dot, 10));
      if (dot == s || *dot != '.') {
        *why = "\"" + item + "\" is not abi=X.Y";
        return false;
      }
      char* tail = nullptr;
      *minor = static_cast<uint32_t>(std::strtoul(dot + 1, &tail, 10));
      if (tail == dot + 1 || *tail != '\0') {
        *why = "\"" + item + "\" is not abi=X.Y";
        return false;
      }
    }
    pos = end + 2;
  }
  if (found != 1) {
    *why = absl::StrFormat("%d abi= items", found);
    return false;
  }
  return true;
}

TEST(ConformanceBuildInfo, AbiVersionMatchesTheRuntimeQueryAndTheTable) {
  const std::string info = kvp_build_info();
  SCOPED_TRACE(info);
  uint32_t major = 0, minor = 0;
  std::string why;
  ASSERT_TRUE(ParseAbi(info, &major, &minor, &why)) << why;
  uint32_t rt_major = 0, rt_minor = 0;
  kvp_abi_version(&rt_major, &rt_minor);
  EXPECT_EQ(major, rt_major);
  EXPECT_EQ(minor, rt_minor);
  const kvp_api* api = kvp_get_api(rt_major);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(major, api->abi_major);
  EXPECT_EQ(minor, api->abi_minor);
  EXPECT_EQ(major, static_cast<uint32_t>(KVP_ABI_MAJOR));
  EXPECT_EQ(minor, static_cast<uint32_t>(KVP_ABI_MINOR));
  EXPECT_STREQ(api->build_info(), kvp_build_info());
}

// ---- One rounding of decode outputs ------------------------------------------

// One sequence of 4 tokens and q = 0: every weight is 1/4, so output
// channel 0 is the mean of V's channel 0, exact in double. Returns its bits
// in out_dtype (FP16/BF16). The other channels and K are random.
uint16_t MeanOfFourTokens(int cache_dtype, int out_dtype, const float (&v0)[4], std::mt19937& rng) {
  constexpr int D = 64;
  Spec s;
  s.k_dtype = s.v_dtype = cache_dtype;
  s.head_size = D;
  s.num_blocks = 1;
  kvp_cache* cache = nullptr;
  EXPECT_EQ(TakeError(CreateCache(s, &cache)), "");
  if (cache == nullptr) return 0;
  std::vector<float> k = Normals(rng, 4 * D), v = Normals(rng, 4 * D);
  for (int t = 0; t < 4; ++t) v[t * D] = v0[t];
  EXPECT_EQ(TakeError(WriteFp32(cache, 0, {0, 1, 2, 3}, k, v)), "");

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = 1;
  dc.max_num_seqs = 1;
  dc.max_context_len = 16;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = out_dtype;
  kvp_decoder* dec = nullptr;
  EXPECT_EQ(TakeError(kvp_decoder_create(cache, &dc, &dec)), "");
  const std::vector<float> q(D, 0.0f);
  const int32_t table[1] = {0}, lens[1] = {4};
  std::vector<uint16_t> out(D, 0xFFFF);
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = 1;
  a.q = q.data();
  a.block_table = table;
  a.block_table_width = 1;
  a.seq_lens = lens;
  a.out = out.data();
  if (dec != nullptr) EXPECT_EQ(TakeError(kvp_decode(dec, &a, nullptr)), "");
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
  return out[0];
}

// The exact mean 1 + 2^-11 + 2^-26 lies just above the midpoint between
// the FP16 values 1 and 1 + 2^-10: rounded once it is 0x3C01; through FP32
// (which drops the 2^-26) it would tie to the even 0x3C00.
TEST(ConformanceRoundOnce, Fp16OutputOfAnExactMeanJustAboveAMidpoint) {
  KVPAGE_SEEDED_RNG(rng);
  const float p = std::ldexp(1.0f, -9), tiny = std::ldexp(1.0f, -24);
  const float v0[4] = {2.0f, 2.0f + p, 0.0f, tiny};
  EXPECT_EQ(MeanOfFourTokens(KVP_DTYPE_FP16, KVP_DTYPE_FP16, v0, rng), 0x3C01);
  const float neg[4] = {-2.0f, -2.0f - p, 0.0f, -tiny};
  EXPECT_EQ(MeanOfFourTokens(KVP_DTYPE_FP16, KVP_DTYPE_FP16, neg, rng), 0xBC01);
}

// The same for BF16: 1 + 2^-8 + 2^-30 is 0x3F81 rounded once; through FP32
// it would tie to 0x3F80.
TEST(ConformanceRoundOnce, Bf16OutputOfAnExactMeanJustAboveAMidpoint) {
  KVPAGE_SEEDED_RNG(rng);
  const float p = std::ldexp(1.0f, -6), tiny = std::ldexp(1.0f, -28);
  const float v0[4] = {2.0f, 2.0f + p, 0.0f, tiny};
  EXPECT_EQ(MeanOfFourTokens(KVP_DTYPE_BF16, KVP_DTYPE_BF16, v0, rng), 0x3F81);
  const float neg[4] = {-2.0f, -2.0f - p, 0.0f, -tiny};
  EXPECT_EQ(MeanOfFourTokens(KVP_DTYPE_BF16, KVP_DTYPE_BF16, neg, rng), 0xBF81);
}

// A 16-bit pattern's place in value order (-0 and +0 share 0).
int32_t OrderKey(uint16_t bits) {
  const int32_t mag = bits & 0x7FFF;
  return (bits & 0x8000) != 0 ? -mag : mag;
}
uint16_t FromOrderKey(int32_t key) {
  return key >= 0 ? static_cast<uint16_t>(key) : static_cast<uint16_t>(0x8000 | -key);
}
double Value16(int dtype, uint16_t bits) { return LoadElement(dtype, &bits, 0); }

// Whether `got` is a nearest value of its format to `ref`: no neighbour is
// nearer by more than `slack` (an absolute allowance for near-ties, where
// the reference's own double rounding could decide). Exact ties are
// measure-zero with random data and are not told apart here.
bool IsNearest(int dtype, const void* out, int64_t i, double ref, double slack) {
  double got, below, above;
  if (dtype == KVP_DTYPE_FP32) {
    float f;
    std::memcpy(&f, static_cast<const uint8_t*>(out) + 4 * i, 4);
    got = f;
    below = std::nextafter(f, -INFINITY);
    above = std::nextafter(f, INFINITY);
  } else {
    uint16_t bits;
    std::memcpy(&bits, static_cast<const uint8_t*>(out) + 2 * i, 2);
    got = Value16(dtype, bits);
    below = Value16(dtype, FromOrderKey(OrderKey(bits) - 1));
    above = Value16(dtype, FromOrderKey(OrderKey(bits) + 1));
  }
  if (!std::isfinite(got)) return false;
  const double err = std::fabs(got - ref);
  return err <= std::fabs(below - ref) + slack && err <= std::fabs(above - ref) + slack;
}

// Random batches in every KV dtype: each FP32/FP16/BF16 output element is
// a nearest value to the float64 reference over the dequantized cache, and
// each LSE the nearest float. Rounding through FP32 first misses that on
// about 2^-14 of FP16 outputs and 2^-17 of BF16 ones (this test's 65536
// outputs per dtype catch FP16 most runs; the two tests above always).
TEST(ConformanceRoundOnce, RandomDecodesGiveTheNearestValueOfTheOutputDtype) {
  KVPAGE_SEEDED_RNG(rng);
  constexpr int D = 128, bs = 16, hkv = 4, group = 4, hq = hkv * group;
  constexpr int num_seqs = 8, query_len = 4;
  const int cache_dtypes[] = {KVP_DTYPE_FP16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_INT8,
                              KVP_DTYPE_INT4};
  for (int out_dtype : {KVP_DTYPE_FP32, KVP_DTYPE_FP16, KVP_DTYPE_BF16}) {
    const int kv_dtype = cache_dtypes[std::uniform_int_distribution<int>(0, 4)(rng)];
    SCOPED_TRACE(absl::StrFormat("cache %s, out %s", DtypeName(kv_dtype), DtypeName(out_dtype)));
    std::vector<int32_t> lens(num_seqs);
    int max_blocks = 0, total_blocks = 0;
    for (int32_t& l : lens) {
      l = std::uniform_int_distribution<int>(query_len, 300)(rng);
      max_blocks = std::max(max_blocks, (l + bs - 1) / bs);
      total_blocks += (l + bs - 1) / bs;
    }
    Spec s;
    s.k_dtype = s.v_dtype = kv_dtype;
    s.head_size = D;
    s.num_kv_heads = hkv;
    s.block_size = bs;
    s.num_blocks = total_blocks;
    kvp_cache* cache = nullptr;
    ASSERT_OK(CreateCache(s, &cache));
    // Sequences take consecutive blocks; one write of every token.
    DecodeProblem p;
    p.num_seqs = num_seqs;
    p.query_len = query_len;
    p.num_q_heads = hq;
    p.head_size = D;
    p.q_dtype = KVP_DTYPE_FP32;
    p.block_table_width = max_blocks;
    p.block_table.assign(size_t(num_seqs) * max_blocks, 0);
    p.seq_lens = lens;
    p.sm_scale = 0.125f;  // a power of two: the same value in both computations
    std::vector<int64_t> slots;
    int next_block = 0;
    for (int i = 0; i < num_seqs; ++i) {
      for (int j = 0; j < (lens[i] + bs - 1) / bs; ++j) {
        p.block_table[size_t(i) * max_blocks + j] = next_block++;
      }
      for (int t = 0; t < lens[i]; ++t) {
        slots.push_back(int64_t{p.block_table[size_t(i) * max_blocks + t / bs]} * bs + t % bs);
      }
    }
    const std::vector<float> k = Normals(rng, slots.size() * hkv * D),
                             v = Normals(rng, slots.size() * hkv * D);
    ASSERT_OK(WriteFp32(cache, 0, slots, k, v));
    const std::vector<float> q = Normals(rng, size_t(num_seqs) * query_len * hq * D);
    StoreElements(KVP_DTYPE_FP32, q, &p.q);

    std::vector<double> ref, ref_lse;
    ReferenceDecode(DequantizedLayer::Read(cache, 0), p, &ref, &ref_lse);

    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = hq;
    dc.max_num_seqs = num_seqs;
    dc.max_query_len = query_len;
    dc.max_context_len = max_blocks * bs;
    dc.q_dtype = KVP_DTYPE_FP32;
    dc.out_dtype = out_dtype;
    kvp_decoder* dec = nullptr;
    ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));
    std::vector<uint8_t> out(ref.size() * DtypeBytes(out_dtype), 0xFF);
    std::vector<float> lse(ref_lse.size(), std::numeric_limits<float>::quiet_NaN());
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.num_seqs = num_seqs;
    a.query_len = query_len;
    a.sm_scale = p.sm_scale;
    a.q = p.q.data();
    a.block_table = p.block_table.data();
    a.block_table_width = max_blocks;
    a.seq_lens = lens.data();
    a.out = out.data();
    a.lse = lse.data();
    ASSERT_OK(kvp_decode(dec, &a, nullptr));
    kvp_decoder_destroy(dec);
    kvp_cache_destroy(cache);

    // The library and the reference sum in different orders: allow
    // near-ties of 1e-13 (values are O(1)).
    constexpr double kSlack = 1e-13;
    int bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!IsNearest(out_dtype, out.data(), int64_t(i), ref[i], kSlack) && bad++ < 5) {
        ADD_FAILURE() << "out[" << i << "] = " << LoadElement(out_dtype, out.data(), int64_t(i))
                      << " is not the nearest " << DtypeName(out_dtype) << " to "
                      << absl::StrFormat("%.17g", ref[i]);
      }
    }
    EXPECT_EQ(bad, 0) << "of " << ref.size() << " outputs";
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      EXPECT_TRUE(IsNearest(KVP_DTYPE_FP32, lse.data(), int64_t(i), ref_lse[i], kSlack))
          << "lse[" << i << "] = " << lse[i] << ", reference " << ref_lse[i];
    }
  }
}

// ---- kvp_cache_transfer_blocks and key smoothing ----------------------------

TEST(ConformanceTransfer, RefusesAnotherKeySmoothingAndCopiesNothing) {
  KVPAGE_SEEDED_RNG(rng);
  Spec s;
  s.k_dtype = KVP_DTYPE_INT8;
  s.v_dtype = KVP_DTYPE_INT4;
  s.num_kv_heads = 2;
  s.num_layers = 2;
  const int n = s.num_kv_heads * s.head_size;
  std::uniform_real_distribution<float> positive(0.25f, 4.0f);
  s.smoothing.resize(n);
  for (float& l : s.smoothing) l = positive(rng);
  // The destination differs at one random channel (and, sometimes, later
  // ones too: the error names the first).
  Spec other = s;
  const int at = std::uniform_int_distribution<int>(0, n - 1)(rng);
  do {
    other.smoothing[at] = positive(rng);
  } while (other.smoothing[at] == s.smoothing[at]);
  if (at + 1 < n && rng() % 2 == 0) other.smoothing[n - 1] *= 2.0f;

  kvp_cache *src = nullptr, *dst = nullptr, *same = nullptr;
  ASSERT_OK(CreateCache(s, &src));
  ASSERT_OK(CreateCache(other, &dst));
  ASSERT_OK(CreateCache(s, &same));  // equal values in another allocation
  const int64_t te = int64_t{s.num_kv_heads} * s.head_size;
  std::vector<int64_t> slots(2 * s.block_size);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = int64_t(t);
  for (kvp_cache* c : {src, dst, same}) {
    for (int l = 0; l < s.num_layers; ++l) {
      ASSERT_OK(
          WriteFp32(c, l, slots, Normals(rng, slots.size() * te), Normals(rng, slots.size() * te)));
    }
  }
  const std::vector<uint8_t> dst_before = CacheBytes(dst);
  const int32_t pairs[4] = {0, 1, 1, 0};
  const std::string src_value = absl::StrFormat("%.9g", s.smoothing[at]);
  const std::string dst_value = absl::StrFormat("%.9g", other.smoothing[at]);
  const std::string where =
      absl::StrFormat("kv head %d channel %d", at / s.head_size, at % s.head_size);
  ExpectError(kvp_cache_transfer_blocks(dst, src, pairs, 2, nullptr), KVP_ERR_INVALID_ARGUMENT,
              {"key smoothing", where, "source " + src_value, "destination " + dst_value});
  EXPECT_TRUE(CacheBytes(dst) == dst_before) << "a refused transfer changed the destination";
  // Refused the other way round too, and with no pairs at all.
  ExpectError(kvp_cache_transfer_blocks(src, dst, pairs, 2, nullptr), KVP_ERR_INVALID_ARGUMENT,
              {"key smoothing", where, "source " + dst_value, "destination " + src_value});
  ExpectError(kvp_cache_transfer_blocks(dst, src, nullptr, 0, nullptr), KVP_ERR_INVALID_ARGUMENT,
              {"key smoothing", where});
  EXPECT_TRUE(CacheBytes(dst) == dst_before);

  // Equal vectors in two caches: accepted, and the blocks arrive whole
  // (every written block is moved to the same id, so the caches agree).
  const int32_t in_place[4] = {0, 0, 1, 1};
  ASSERT_OK(kvp_cache_transfer_blocks(same, src, in_place, 2, nullptr));
  EXPECT_TRUE(CacheBytes(same) == CacheBytes(src));

  // Present on one side only: refused as before.
  Spec plain = s;
  plain.smoothing.clear();
  kvp_cache* none = nullptr;
  ASSERT_OK(CreateCache(plain, &none));
  ExpectError(kvp_cache_transfer_blocks(none, src, pairs, 2, nullptr), KVP_ERR_INVALID_ARGUMENT,
              {"key smoothing"});
  ExpectError(kvp_cache_transfer_blocks(src, none, pairs, 2, nullptr), KVP_ERR_INVALID_ARGUMENT,
              {"key smoothing"});
  for (kvp_cache* c : {src, dst, same, none}) kvp_cache_destroy(c);
}

// ---- num_blocks * block_size < 2^31 ------------------------------------------

struct CountingAllocator {
  int calls = 0;
  static void* Alloc(void* user, size_t, size_t, int32_t, int32_t) {
    ++static_cast<CountingAllocator*>(user)->calls;
    return nullptr;
  }
  static void Free(void*, void*, size_t, int32_t, int32_t) {}
};

TEST(ConformanceCacheCreate, SlotCountOf2To31OrMoreIsRefusedBeforeAllocating) {
  struct Case {
    int32_t num_blocks, block_size;
  };
  const Case cases[] = {{1 << 28, 8},        {1 << 27, 16},   {1 << 26, 32},
                        {(1 << 26) + 1, 32}, {INT32_MAX, 32}, {INT32_MAX, 8}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrFormat("num_blocks %d, block_size %d", c.num_blocks, c.block_size));
    CountingAllocator counter;
    kvp_allocator alloc;
    kvp_allocator_init(&alloc);
    alloc.user_data = &counter;
    alloc.alloc = CountingAllocator::Alloc;
    alloc.free = CountingAllocator::Free;
    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.num_blocks = c.num_blocks;
    cfg.block_size = c.block_size;
    cfg.num_kv_heads = 1;
    cfg.head_size = 64;
    cfg.allocator = &alloc;
    kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
    ExpectError(kvp_cache_create(&cfg, &cache), KVP_ERR_INVALID_ARGUMENT,
                {"num_blocks = " + std::to_string(c.num_blocks),
                 "block_size = " + std::to_string(c.block_size), "2^31"});
    EXPECT_EQ(cache, reinterpret_cast<kvp_cache*>(0x1));
    EXPECT_EQ(counter.calls, 0);
  }
}

// ---- Repeated slots in one write ---------------------------------------------

// Tokens 0, 2 and 4 of one write share a slot. The CPU backend leaves that
// slot holding the K, V and scales of exactly one of them, whole, and every
// other byte of the cache as a write without the repeats leaves it: the
// INT4 V byte the slot shares with its neighbour included.
TEST(ConformanceWrite, RepeatedSlotHoldsOneTokenWholeAndTouchesNothingElse) {
  KVPAGE_SEEDED_RNG(rng);
  for (int k_dtype : {KVP_DTYPE_BF16, KVP_DTYPE_INT8}) {
    for (int v_dtype : {KVP_DTYPE_INT4, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP16}) {
      SCOPED_TRACE(absl::StrFormat("K %s, V %s", DtypeName(k_dtype), DtypeName(v_dtype)));
      Spec s;
      s.k_dtype = k_dtype;
      s.v_dtype = v_dtype;
      s.num_kv_heads = 2;
      s.num_blocks = 4;
      const int64_t te = int64_t{s.num_kv_heads} * s.head_size;
      // Earlier contents everywhere, so that a stray write shows.
      std::vector<int64_t> all(s.num_blocks * s.block_size);
      for (size_t t = 0; t < all.size(); ++t) all[t] = int64_t(t);
      const std::vector<float> k0 = Normals(rng, all.size() * te),
                               v0 = Normals(rng, all.size() * te);
      const int64_t dup = 2 * std::uniform_int_distribution<int64_t>(1, 18)(rng) + 1;  // odd, < 40
      const std::vector<int64_t> slots = {dup, 40, dup, dup - 1, dup, -1, 41};
      const std::vector<float> k = Normals(rng, slots.size() * te, 3.0f),
                               v = Normals(rng, slots.size() * te, 3.0f);
      kvp_cache* cache = nullptr;
      ASSERT_OK(CreateCache(s, &cache));
      ASSERT_OK(WriteFp32(cache, 0, all, k0, v0));
      ASSERT_OK(WriteFp32(cache, 0, slots, k, v));
      const std::vector<uint8_t> got = CacheBytes(cache);
      kvp_cache_destroy(cache);
      int matches = 0;
      for (int keep : {0, 2, 4}) {
        std::vector<int64_t> one = slots;
        for (int t : {0, 2, 4}) {
          if (t != keep) one[t] = -1;
        }
        kvp_cache* want = nullptr;
        ASSERT_OK(CreateCache(s, &want));
        ASSERT_OK(WriteFp32(want, 0, all, k0, v0));
        ASSERT_OK(WriteFp32(want, 0, one, k, v));
        if (CacheBytes(want) == got) ++matches;
        kvp_cache_destroy(want);
      }
      EXPECT_EQ(matches, 1) << "the cache is not what writing one of tokens 0, 2, 4 to slot " << dup
                            << " (and the others to theirs) gives";
    }
  }
}

// ---- A CPU cache's device_ordinal ----------------------------------------------

TEST(ConformanceCacheCreate, CpuCacheRefusesANonzeroDeviceOrdinal) {
  for (int32_t ordinal : {1, 7, INT32_MAX}) {
    SCOPED_TRACE(ordinal);
    kvp_cache_config cfg = SmallCpuConfig();
    cfg.device_ordinal = ordinal;
    kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
    ExpectError(kvp_cache_create(&cfg, &cache), KVP_ERR_INVALID_ARGUMENT,
                {"device_ordinal", std::to_string(ordinal), "KVP_DEVICE_CPU"});
    EXPECT_EQ(cache, reinterpret_cast<kvp_cache*>(0x1));
    if (cache != reinterpret_cast<kvp_cache*>(0x1)) kvp_cache_destroy(cache);
  }
  const kvp_cache_config cfg = SmallCpuConfig();
  kvp_cache* cache = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &cache));
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  ASSERT_OK(kvp_cache_get_info(cache, &info));
  EXPECT_EQ(info.device_kind, KVP_DEVICE_CPU);
  EXPECT_EQ(info.device_ordinal, 0);
  kvp_cache_destroy(cache);
}

// ---- Precise mode -------------------------------------------------------

// kvp_decode_config.precise is 0 or 1; anything else is refused by both
// calls that read a decode config, which then change nothing.
TEST(ConformancePrecise, OnlyZeroOrOne) {
  const kvp_cache_config cfg = SmallCpuConfig();
  kvp_cache* cache = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &cache));
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  EXPECT_EQ(dc.precise, 0);
  dc.num_query_heads = 8;
  dc.max_num_seqs = 2;
  dc.max_context_len = 64;
  for (int32_t bad : {2, -1, INT32_MAX}) {
    SCOPED_TRACE(bad);
    dc.precise = bad;
    kvp_decoder* dec = reinterpret_cast<kvp_decoder*>(0x1);
    ExpectError(kvp_decoder_create(cache, &dc, &dec), KVP_ERR_INVALID_ARGUMENT,
                {"config->precise", std::to_string(bad)});
    EXPECT_EQ(dec, reinterpret_cast<kvp_decoder*>(0x1));
    uint64_t bytes = 12345;
    ExpectError(kvp_decode_workspace_size(cache, &dc, &bytes), KVP_ERR_INVALID_ARGUMENT,
                {"config->precise"});
    EXPECT_EQ(bytes, 12345u);
  }
  for (int32_t ok : {0, 1}) {
    dc.precise = ok;
    kvp_decoder* dec = nullptr;
    ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));
    kvp_decoder_destroy(dec);
  }
  // A caller built against ABI 1.0 passes the shorter struct: precise off.
  dc.precise = 7;  // past the caller's struct_size: never read
  dc.struct_size = KVP_DECODE_CONFIG_STRUCT_SIZE_1_0;
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

// ---- Writes of no tokens, decodes of no sequences --------------------------------

TEST(ConformanceZeroCounts, WriteOfNoTokensSucceedsButChecksTheOtherArguments) {
  KVPAGE_SEEDED_RNG(rng);
  Spec s;
  s.k_dtype = KVP_DTYPE_INT8;
  s.num_layers = 2;
  kvp_cache* cache = nullptr;
  ASSERT_OK(CreateCache(s, &cache));
  std::vector<int64_t> slots = {3, 17};
  ASSERT_OK(WriteFp32(cache, 1, slots, Normals(rng, 2 * 64), Normals(rng, 2 * 64)));
  const std::vector<uint8_t> before = CacheBytes(cache);

  kvp_write_args a;
  kvp_write_args_init(&a);
  a.layer = 1;
  a.num_tokens = 0;  // key, value and slot_mapping NULL
  ASSERT_OK(kvp_cache_write(cache, &a, nullptr));
  a.input_dtype = KVP_DTYPE_FP16;
  a.key_token_stride = 64;
  ASSERT_OK(kvp_cache_write(cache, &a, nullptr));
  EXPECT_TRUE(CacheBytes(cache) == before);

  struct Bad {
    const char* what;
    void (*mutate)(kvp_write_args*);
    std::initializer_list<std::string> needles;
  };
  const Bad bad[] = {
      {"layer 2", [](kvp_write_args* w) { w->layer = 2; }, {"layer", "2"}},
      {"layer -1", [](kvp_write_args* w) { w->layer = -1; }, {"layer", "-1"}},
      {"num_tokens -1", [](kvp_write_args* w) { w->num_tokens = -1; }, {"num_tokens", "-1"}},
      {"input_dtype INT8",
       [](kvp_write_args* w) { w->input_dtype = KVP_DTYPE_INT8; },
       {"input_dtype", "4"}},
      {"key_token_stride 63",
       [](kvp_write_args* w) { w->key_token_stride = 63; },
       {"key_token_stride", "63"}},
      {"value_token_stride -5",
       [](kvp_write_args* w) { w->value_token_stride = -5; },
       {"value_token_stride", "-5"}},
      {"reserved0 1", [](kvp_write_args* w) { w->reserved0 = 1; }, {"reserved0", "1"}},
      {"struct_size 8", [](kvp_write_args* w) { w->struct_size = 8; }, {"struct_size", "8"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = 1;
    b.mutate(&w);
    ExpectError(kvp_cache_write(cache, &w, nullptr), KVP_ERR_INVALID_ARGUMENT, b.needles);
  }
  EXPECT_TRUE(CacheBytes(cache) == before);
  kvp_write_stats stats;
  kvp_write_stats_init(&stats);
  ASSERT_OK(kvp_cache_get_write_stats(cache, &stats));
  EXPECT_EQ(stats.non_finite, 0u);
  EXPECT_EQ(stats.saturated, 0u);
  kvp_cache_destroy(cache);
}

TEST(ConformanceZeroCounts, DecodeOfNoSequencesSucceedsButChecksTheOtherArguments) {
  Spec s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  kvp_cache* cache = nullptr;
  ASSERT_OK(CreateCache(s, &cache));
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = 4;
  dc.max_num_seqs = 4;
  dc.max_query_len = 2;
  dc.max_context_len = 64;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));

  // q, block_table, seq_lens, out and lse NULL: nothing is read or written.
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.layer = 1;
  a.num_seqs = 0;
  a.block_table_width = 4;
  ASSERT_OK(kvp_decode(dec, &a, nullptr));
  // With buffers, they stay as they were.
  std::vector<float> out(4 * 64, -7.0f), lse(4, -7.0f);
  const std::vector<float> q(2 * 4 * 64, 1.0f);
  const std::vector<int32_t> table(4, 0), lens(1, 16);
  a.q = q.data();
  a.out = out.data();
  a.lse = lse.data();
  a.block_table = table.data();
  a.seq_lens = lens.data();
  ASSERT_OK(kvp_decode(dec, &a, nullptr));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.0f; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -7.0f; }));

  struct Bad {
    const char* what;
    void (*mutate)(kvp_decode_args*);
    std::initializer_list<std::string> needles;
  };
  const Bad bad[] = {
      {"layer 2", [](kvp_decode_args* d) { d->layer = 2; }, {"layer", "2"}},
      {"num_seqs -1", [](kvp_decode_args* d) { d->num_seqs = -1; }, {"num_seqs", "-1"}},
      {"query_len 0", [](kvp_decode_args* d) { d->query_len = 0; }, {"query_len", "0"}},
      {"query_len 3", [](kvp_decode_args* d) { d->query_len = 3; }, {"query_len", "3"}},
      {"sliding_window -1",
       [](kvp_decode_args* d) { d->sliding_window = -1; },
       {"sliding_window", "-1"}},
      {"sm_scale -1", [](kvp_decode_args* d) { d->sm_scale = -1.0f; }, {"sm_scale", "-1"}},
      {"logits_soft_cap nan",
       [](kvp_decode_args* d) { d->logits_soft_cap = std::numeric_limits<float>::quiet_NaN(); },
       {"logits_soft_cap", "nan"}},
      {"q_token_stride 5",
       [](kvp_decode_args* d) { d->q_token_stride = 5; },
       {"q_token_stride", "5"}},
      {"out_token_stride 255",
       [](kvp_decode_args* d) { d->out_token_stride = 255; },
       {"out_token_stride", "255"}},
      {"block_table_width 0",
       [](kvp_decode_args* d) { d->block_table_width = 0; },
       {"block_table_width", "0"}},
      {"block_table_stride 3",
       [](kvp_decode_args* d) { d->block_table_stride = 3; },
       {"block_table_stride", "3"}},
      {"reserved0 2", [](kvp_decode_args* d) { d->reserved0 = 2; }, {"reserved0", "2"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    kvp_decode_args d;
    kvp_decode_args_init(&d);
    d.layer = 1;
    d.num_seqs = 0;
    d.block_table_width = 4;
    d.out = out.data();
    d.lse = lse.data();
    b.mutate(&d);
    ExpectError(kvp_decode(dec, &d, nullptr), KVP_ERR_INVALID_ARGUMENT, b.needles);
  }
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.0f; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -7.0f; }));
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
