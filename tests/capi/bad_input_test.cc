// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix of the C API: every entry that takes pointers, ids,
// sizes or structs, fed NULLs, out-of-range values and inconsistent
// arguments one at a time, through the public header only.
//
// For every case: an error object comes back with the documented code, its
// message names the argument (and the bad value where there is one), the
// out-parameters keep the sentinels they were filled with, and a cache the
// call could have touched is unchanged (free blocks, sequence lengths, the
// exported block table, the write statistics and every byte of every layer).
//
// Suites are named BadInput* and Api* so that --gtest_filter selects them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvpage/kvpage.h"

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// ---- Counting and checking error cases ------------------------------------

int g_num_cases = 0;  // bad-input cases checked in this run

class CaseCountReporter : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_num_cases > 0) {
      std::printf("[ BadInput ] %d bad-input cases checked\n", g_num_cases);
    }
  }
};
::testing::Environment* const kReporter =
    ::testing::AddGlobalTestEnvironment(new CaseCountReporter);

std::mt19937& Rng() {
  static std::mt19937 rng{std::random_device{}()};
  return rng;
}

std::vector<float> Randn(size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(Rng());
  return v;
}

// What a message must contain. Each needle is matched case-insensitively as
// a whole token: "block_table" does not match inside "block_table_width",
// "1" does not match inside "12".
using Needles = std::vector<std::string>;
template <typename... A>
Needles Msg(const A&... a) {
  return Needles{std::string(a)...};
}
std::string S(int64_t v) { return std::to_string(v); }

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool ContainsToken(const std::string& hay, const std::string& needle) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string h = lower(hay), n = lower(needle);
  for (size_t pos = h.find(n); pos != std::string::npos; pos = h.find(n, pos + 1)) {
    const bool left_ok = pos == 0 || !IsWordChar(h[pos - 1]) || !IsWordChar(n.front());
    const size_t end = pos + n.size();
    const bool right_ok = end == h.size() || !IsWordChar(h[end]) || !IsWordChar(n.back());
    if (left_ok && right_ok) return true;
  }
  return false;
}

// Checks an error returned by a call and frees it.
void CheckError(kvp_error* e, int32_t code, const Needles& needles) {
  ++g_num_cases;
  if (e == nullptr) {
    ADD_FAILURE() << "expected " << kvp_error_code_name(code) << ", the call succeeded";
    return;
  }
  const std::string msg = kvp_error_message(e);
  EXPECT_EQ(kvp_error_code(e), code)
      << "got " << kvp_error_code_name(kvp_error_code(e)) << ": " << msg;
  EXPECT_FALSE(msg.empty());
  for (const std::string& n : needles) {
    EXPECT_TRUE(ContainsToken(msg, n)) << "message \"" << msg << "\" does not name \"" << n << "\"";
  }
  kvp_error_free(e);
}

#define EXPECT_KVP_ERROR(code, needles, ...)      \
  do {                                            \
    SCOPED_TRACE(#__VA_ARGS__);                   \
    CheckError((__VA_ARGS__), (code), (needles)); \
  } while (0)

#define ASSERT_KVP_OK(...)                                                              \
  do {                                                                                  \
    kvp_error* ok_err_ = (__VA_ARGS__);                                                 \
    ASSERT_EQ(ok_err_, nullptr) << #__VA_ARGS__ << ": "                                 \
                                << kvp_error_code_name(kvp_error_code(ok_err_)) << ": " \
                                << kvp_error_message(ok_err_);                          \
  } while (0)

// ---- Snapshots of a cache's whole state ------------------------------------

struct CacheState {
  int32_t num_free = -1;
  std::vector<int32_t> lengths;
  std::vector<int32_t> table;
  std::vector<int32_t> table_lens;
  uint64_t non_finite = 0, saturated = 0;
  std::vector<std::vector<uint8_t>> regions;  // per layer: K, V, K scales, V scales
};

CacheState Snapshot(const kvp_cache* cache, const std::vector<int64_t>& live) {
  CacheState s;
  EXPECT_EQ(kvp_cache_num_free_blocks(cache, &s.num_free), nullptr);
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  EXPECT_EQ(kvp_cache_get_info(cache, &info), nullptr);
  for (int64_t id : live) {
    int32_t len = -1;
    EXPECT_EQ(kvp_seq_length(cache, id, &len), nullptr);
    s.lengths.push_back(len);
  }
  if (!live.empty()) {
    const int32_t width = info.num_blocks;
    s.table.assign(live.size() * width, -3);
    s.table_lens.assign(live.size(), -3);
    EXPECT_EQ(kvp_cache_export_block_table(cache, live.data(), static_cast<int32_t>(live.size()),
                                           width, width, s.table.data(), s.table_lens.data()),
              nullptr);
  }
  kvp_write_stats stats;
  kvp_write_stats_init(&stats);
  EXPECT_EQ(kvp_cache_get_write_stats(cache, &stats), nullptr);
  s.non_finite = stats.non_finite;
  s.saturated = stats.saturated;
  for (int32_t l = 0; l < info.num_layers; ++l) {
    kvp_layer_layout lay;
    kvp_layer_layout_init(&lay);
    EXPECT_EQ(kvp_cache_get_layout(cache, l, &lay), nullptr);
    auto add = [&](const void* p, int64_t bytes) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      s.regions.emplace_back(b, b + (p != nullptr ? bytes : 0));
    };
    add(lay.k_data, lay.k_data_bytes);
    add(lay.v_data, lay.v_data_bytes);
    add(lay.k_scales, lay.k_scale_bytes);
    add(lay.v_scales, lay.v_scale_bytes);
  }
  return s;
}

void ExpectSameState(const CacheState& a, const CacheState& b, const char* which) {
  EXPECT_EQ(a.num_free, b.num_free) << which << ": free block count changed";
  EXPECT_EQ(a.lengths, b.lengths) << which << ": a sequence length changed";
  EXPECT_EQ(a.table, b.table) << which << ": the block table changed";
  EXPECT_EQ(a.table_lens, b.table_lens) << which << ": exported lengths changed";
  EXPECT_EQ(a.non_finite, b.non_finite) << which << ": write stats changed";
  EXPECT_EQ(a.saturated, b.saturated) << which << ": write stats changed";
  ASSERT_EQ(a.regions.size(), b.regions.size());
  for (size_t i = 0; i < a.regions.size(); ++i) {
    EXPECT_TRUE(a.regions[i] == b.regions[i]) << which << ": bytes of layer " << i / 4 << " region "
                                              << i % 4 << " (K, V, K scales, V scales) changed";
  }
}

kvp_cache_config SmallConfig() {
  kvp_cache_config c;
  kvp_cache_config_init(&c);
  c.num_layers = 1;
  c.num_blocks = 4;
  c.block_size = 16;
  c.num_kv_heads = 2;
  c.head_size = 64;
  c.k_dtype = KVP_DTYPE_INT8;
  c.v_dtype = KVP_DTYPE_INT4;
  return c;
}

// ---- Errors, versions and the function table ---------------------------------

TEST(ApiErrors, NullErrorObject) {
  EXPECT_EQ(kvp_error_code(nullptr), KVP_OK);
  ASSERT_NE(kvp_error_message(nullptr), nullptr);
  EXPECT_STREQ(kvp_error_message(nullptr), "");
  kvp_error_free(nullptr);
  kvp_cache_destroy(nullptr);
  kvp_decoder_destroy(nullptr);
}

TEST(ApiErrors, CodeNames) {
  const struct {
    int32_t code;
    const char* name;
  } kNames[] = {
      {KVP_OK, "OK"},
      {KVP_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT"},
      {KVP_ERR_OUT_OF_BLOCKS, "OUT_OF_BLOCKS"},
      {KVP_ERR_OUT_OF_MEMORY, "OUT_OF_MEMORY"},
      {KVP_ERR_UNSUPPORTED, "UNSUPPORTED"},
      {KVP_ERR_DEVICE, "DEVICE"},
      {KVP_ERR_INTERNAL, "INTERNAL"},
      {7, "UNKNOWN"},
      {-1, "UNKNOWN"},
      {1000, "UNKNOWN"},
      {kI32Min, "UNKNOWN"},
  };
  for (const auto& n : kNames) {
    ASSERT_NE(kvp_error_code_name(n.code), nullptr) << n.code;
    EXPECT_STREQ(kvp_error_code_name(n.code), n.name) << n.code;
  }
  // Stable numbering.
  EXPECT_EQ(KVP_OK, 0);
  EXPECT_EQ(KVP_ERR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(KVP_ERR_OUT_OF_BLOCKS, 2);
  EXPECT_EQ(KVP_ERR_OUT_OF_MEMORY, 3);
  EXPECT_EQ(KVP_ERR_UNSUPPORTED, 4);
  EXPECT_EQ(KVP_ERR_DEVICE, 5);
  EXPECT_EQ(KVP_ERR_INTERNAL, 6);
}

TEST(ApiErrors, ErrorsAreIndependentValues) {
  kvp_error* a = kvp_device_count(7, nullptr);
  kvp_error* b = kvp_device_count(7, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string msg_b = kvp_error_message(b);
  kvp_error_free(a);
  EXPECT_EQ(std::string(kvp_error_message(b)), msg_b);
  kvp_error_free(b);
}

TEST(ApiVersion, VersionAndAbi) {
  EXPECT_STREQ(kvp_version_string(), KVP_VERSION_STRING);
  uint32_t major = 99, minor = 99;
  kvp_abi_version(&major, &minor);
  EXPECT_EQ(major, static_cast<uint32_t>(KVP_ABI_MAJOR));
  EXPECT_EQ(minor, static_cast<uint32_t>(KVP_ABI_MINOR));
  ASSERT_NE(kvp_build_info(), nullptr);
  EXPECT_NE(std::string(kvp_build_info()).find("cpu"), std::string::npos);
}

TEST(ApiTable, UnknownMajorsGiveNull) {
  EXPECT_EQ(kvp_get_api(0), nullptr);
  EXPECT_EQ(kvp_get_api(KVP_ABI_MAJOR + 1), nullptr);
  EXPECT_EQ(kvp_get_api(2), nullptr);
  EXPECT_EQ(kvp_get_api(std::numeric_limits<uint32_t>::max()), nullptr);
}

TEST(ApiTable, CurrentMajorIsComplete) {
  const kvp_api* api = kvp_get_api(KVP_ABI_MAJOR);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->struct_size, sizeof(kvp_api));
  EXPECT_EQ(api->abi_major, static_cast<uint32_t>(KVP_ABI_MAJOR));
  EXPECT_EQ(api->abi_minor, static_cast<uint32_t>(KVP_ABI_MINOR));
  // Every field after the header is a function pointer; none may be NULL.
  const size_t first = offsetof(kvp_api, version_string);
  ASSERT_EQ((sizeof(kvp_api) - first) % sizeof(void (*)(void)), 0u);
  int num_fns = 0;
  for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof(kvp_api);
       off += sizeof(void (*)(void))) {
    void (*fn)(void) = nullptr;
    std::memcpy(&fn, reinterpret_cast<const char*>(api) + off, sizeof(fn));
    EXPECT_NE(fn, nullptr) << "function pointer at byte offset " << off;
    ++num_fns;
  }
  EXPECT_EQ(num_fns, 45);
  EXPECT_EQ(offsetof(kvp_api, cache_check_signature) + sizeof(api->cache_check_signature),
            sizeof(kvp_api));
  // The table's entries behave like the exported ones.
  EXPECT_STREQ(api->version_string(), KVP_VERSION_STRING);
  EXPECT_STREQ(api->error_code_name(KVP_ERR_OUT_OF_BLOCKS), "OUT_OF_BLOCKS");
  int32_t count = -1;
  kvp_error* e = api->device_count(7, &count);
  EXPECT_EQ(api->error_code(e), KVP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(count, -1);
  api->error_free(e);
  EXPECT_EQ(kvp_get_api(KVP_ABI_MAJOR), api);  // one table, stable
}

// A caller built against a newer header passes bigger structs: the library
// reads the fields it knows and ignores (never writes) the tail.
template <typename T>
struct Bigger {
  T s;
  unsigned char tail[16];
};

TEST(ApiStructs, LargerInputStructsAreAccepted) {
  Bigger<kvp_cache_config> cfg;
  std::memset(&cfg, 0xA5, sizeof(cfg));
  cfg.s = SmallConfig();
  cfg.s.struct_size = sizeof(kvp_cache_config) + 16;
  kvp_cache* cache = nullptr;
  ASSERT_KVP_OK(kvp_cache_create(&cfg.s, &cache));
  ASSERT_NE(cache, nullptr);

  Bigger<kvp_allocator> alloc;
  std::memset(&alloc, 0x5A, sizeof(alloc));
  kvp_allocator_init(&alloc.s);
  alloc.s.struct_size = sizeof(kvp_allocator) + 16;
  kvp_cache_config c2 = SmallConfig();
  c2.allocator = &alloc.s;
  kvp_cache* cache2 = nullptr;
  ASSERT_KVP_OK(kvp_cache_create(&c2, &cache2));
  kvp_cache_destroy(cache2);

  int64_t seq = -777;
  ASSERT_KVP_OK(kvp_seq_create(cache, &seq));
  std::vector<int64_t> slots(5, -777);
  ASSERT_KVP_OK(kvp_seq_append(cache, seq, 5, slots.data(), nullptr));
  const std::vector<float> k = Randn(5 * 2 * 64), v = Randn(5 * 2 * 64);
  Bigger<kvp_write_args> w;
  std::memset(&w, 0xA5, sizeof(w));
  kvp_write_args_init(&w.s);
  w.s.struct_size = sizeof(kvp_write_args) + 16;
  w.s.num_tokens = 5;
  w.s.input_dtype = KVP_DTYPE_FP32;
  w.s.key = k.data();
  w.s.value = v.data();
  w.s.slot_mapping = slots.data();
  ASSERT_KVP_OK(kvp_cache_write(cache, &w.s, nullptr));

  Bigger<kvp_decode_config> dc;
  std::memset(&dc, 0xA5, sizeof(dc));
  kvp_decode_config_init(&dc.s);
  dc.s.struct_size = sizeof(kvp_decode_config) + 16;
  dc.s.num_query_heads = 4;
  dc.s.max_num_seqs = 1;
  dc.s.max_context_len = 64;
  dc.s.q_dtype = KVP_DTYPE_FP32;
  dc.s.out_dtype = KVP_DTYPE_FP32;
  uint64_t ws = 12345;
  ASSERT_KVP_OK(kvp_decode_workspace_size(cache, &dc.s, &ws));
  kvp_decoder* dec = nullptr;
  ASSERT_KVP_OK(kvp_decoder_create(cache, &dc.s, &dec));

  int32_t table[4] = {0, 0, 0, 0};
  int32_t len = -1;
  ASSERT_KVP_OK(kvp_cache_export_block_table(cache, &seq, 1, 4, 4, table, &len));
  const std::vector<float> q = Randn(4 * 64);
  std::vector<float> out(4 * 64, kNaN);
  Bigger<kvp_decode_args> da;
  std::memset(&da, 0xA5, sizeof(da));
  kvp_decode_args_init(&da.s);
  da.s.struct_size = sizeof(kvp_decode_args) + 16;
  da.s.num_seqs = 1;
  da.s.q = q.data();
  da.s.block_table = table;
  da.s.block_table_width = 4;
  da.s.seq_lens = &len;
  da.s.out = out.data();
  ASSERT_KVP_OK(kvp_decode(dec, &da.s, nullptr));
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

TEST(ApiStructs, LargerOutputStructsKeepTheirTail) {
  kvp_cache_config cfg = SmallConfig();
  kvp_cache* cache = nullptr;
  ASSERT_KVP_OK(kvp_cache_create(&cfg, &cache));

  Bigger<kvp_layer_layout> lay;
  std::memset(&lay, 0xEE, sizeof(lay));
  lay.s.struct_size = sizeof(kvp_layer_layout) + 16;
  ASSERT_KVP_OK(kvp_cache_get_layout(cache, 0, &lay.s));
  EXPECT_EQ(lay.s.struct_size, sizeof(kvp_layer_layout) + 16);
  EXPECT_NE(lay.s.k_data, nullptr);
  EXPECT_EQ(lay.s.k_bits, 8);
  EXPECT_EQ(lay.s.v_bits, 4);
  for (unsigned char c : lay.tail) EXPECT_EQ(c, 0xEE);

  Bigger<kvp_cache_info> info;
  std::memset(&info, 0xEE, sizeof(info));
  info.s.struct_size = sizeof(kvp_cache_info) + 16;
  ASSERT_KVP_OK(kvp_cache_get_info(cache, &info.s));
  EXPECT_EQ(info.s.num_blocks, 4);
  EXPECT_EQ(info.s.head_size, 64);
  for (unsigned char c : info.tail) EXPECT_EQ(c, 0xEE);

  Bigger<kvp_write_stats> st;
  std::memset(&st, 0xEE, sizeof(st));
  st.s.struct_size = sizeof(kvp_write_stats) + 16;
  ASSERT_KVP_OK(kvp_cache_get_write_stats(cache, &st.s));
  EXPECT_EQ(st.s.non_finite, 0u);
  EXPECT_EQ(st.s.saturated, 0u);
  for (unsigned char c : st.tail) EXPECT_EQ(c, 0xEE);
  kvp_cache_destroy(cache);
}

// ---- Devices --------------------------------------------------------------------

TEST(BadInputDevice, DeviceCount) {
  int32_t count = -777;
  EXPECT_KVP_ERROR(KVP_ERR_INVALID_ARGUMENT, Msg("count"),
                   kvp_device_count(KVP_DEVICE_CPU, nullptr));
  EXPECT_KVP_ERROR(KVP_ERR_INVALID_ARGUMENT, Msg("count"),
                   kvp_device_count(KVP_DEVICE_CUDA, nullptr));
  for (int32_t kind : {7, -1, 2, kI32Max, kI32Min}) {
    EXPECT_KVP_ERROR(KVP_ERR_INVALID_ARGUMENT, Msg("device_kind", S(kind)),
                     kvp_device_count(kind, &count));
    EXPECT_EQ(count, -777);
  }
  ASSERT_KVP_OK(kvp_device_count(KVP_DEVICE_CPU, &count));
  EXPECT_EQ(count, 1);
  count = -777;
  ASSERT_KVP_OK(kvp_device_count(KVP_DEVICE_CUDA, &count));  // 0 is not an error
  EXPECT_GE(count, 0);
}

// ---- Cache creation ------------------------------------------------------------------

struct ConfigCase {
  const char* what;
  std::function<void(kvp_cache_config*)> mutate;
  Needles needles;
};

TEST(BadInputCacheCreate, NullPointers) {
  kvp_cache_config cfg = SmallConfig();
  kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
  EXPECT_KVP_ERROR(KVP_ERR_INVALID_ARGUMENT, Msg("config"), kvp_cache_create(nullptr, &out));
  EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  EXPECT_KVP_ERROR(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_cache_create(&cfg, nullptr));
}

TEST(BadInputCacheCreate, ConfigMatrix) {
  {
    kvp_cache_config ok = SmallConfig();
    kvp_cache* cache = nullptr;
    ASSERT_KVP_OK(kvp_cache_create(&ok, &cache));  // the baseline is valid
    kvp_cache_destroy(cache);
  }
  const std::vector<ConfigCase> cases = {
      {"struct_size 0", [](kvp_cache_config* c) { c->struct_size = 0; }, Msg("struct_size", "0")},
      {"struct_size 8", [](kvp_cache_config* c) { c->struct_size = 8; }, Msg("struct_size", "8")},
      {"struct_size first-released-8",
       [](kvp_cache_config* c) { c->struct_size = offsetof(kvp_cache_config, checked) - 8; },
       Msg("struct_size", S(offsetof(kvp_cache_config, checked) - 8))},
      {"checked 2", [](kvp_cache_config* c) { c->checked = 2; }, Msg("checked", "2")},
      {"checked -1", [](kvp_cache_config* c) { c->checked = -1; }, Msg("checked", "-1")},
      {"num_layers 0", [](kvp_cache_config* c) { c->num_layers = 0; }, Msg("num_layers", "0")},
      {"num_layers -1", [](kvp_cache_config* c) { c->num_layers = -1; }, Msg("num_layers", "-1")},
      {"num_blocks 0", [](kvp_cache_config* c) { c->num_blocks = 0; }, Msg("num_blocks", "0")},
      {"num_blocks -5", [](kvp_cache_config* c) { c->num_blocks = -5; }, Msg("num_blocks", "-5")},
      {"num_blocks * block_size >= 2^31", [](kvp_cache_config* c) { c->num_blocks = kI32Max / 8; },
       Msg("num_blocks", S(kI32Max / 8))},
      {"block_size 12", [](kvp_cache_config* c) { c->block_size = 12; }, Msg("block_size", "12")},
      {"block_size 0", [](kvp_cache_config* c) { c->block_size = 0; }, Msg("block_size", "0")},
      {"block_size 64", [](kvp_cache_config* c) { c->block_size = 64; }, Msg("block_size", "64")},
      {"block_size -16", [](kvp_cache_config* c) { c->block_size = -16; },
       Msg("block_size", "-16")},
      {"num_kv_heads 0", [](kvp_cache_config* c) { c->num_kv_heads = 0; },
       Msg("num_kv_heads", "0")},
      {"num_kv_heads -2", [](kvp_cache_config* c) { c->num_kv_heads = -2; },
       Msg("num_kv_heads", "-2")},
      {"num_kv_heads 65536", [](kvp_cache_config* c) { c->num_kv_heads = 65536; },
       Msg("num_kv_heads", "65536")},
      {"head_size 72", [](kvp_cache_config* c) { c->head_size = 72; }, Msg("head_size", "72")},
      {"head_size 0", [](kvp_cache_config* c) { c->head_size = 0; }, Msg("head_size", "0")},
      {"head_size 512", [](kvp_cache_config* c) { c->head_size = 512; }, Msg("head_size", "512")},
      {"head_size -128", [](kvp_cache_config* c) { c->head_size = -128; },
       Msg("head_size", "-128")},
      {"k_dtype 99", [](kvp_cache_config* c) { c->k_dtype = 99; }, Msg("k_dtype", "99")},
      {"k_dtype FP32", [](kvp_cache_config* c) { c->k_dtype = KVP_DTYPE_FP32; },
       Msg("k_dtype", "0")},
      {"k_dtype -1", [](kvp_cache_config* c) { c->k_dtype = -1; }, Msg("k_dtype", "-1")},
      {"v_dtype 99", [](kvp_cache_config* c) { c->v_dtype = 99; }, Msg("v_dtype", "99")},
      {"v_dtype FP32", [](kvp_cache_config* c) { c->v_dtype = KVP_DTYPE_FP32; },
       Msg("v_dtype", "0")},
      {"v_dtype 6", [](kvp_cache_config* c) { c->v_dtype = 6; }, Msg("v_dtype", "6")},
      {"device_kind 7", [](kvp_cache_config* c) { c->device_kind = 7; }, Msg("device_kind", "7")},
      {"device_kind -1", [](kvp_cache_config* c) { c->device_kind = -1; },
       Msg("device_kind", "-1")},
      {"device_ordinal -1", [](kvp_cache_config* c) { c->device_ordinal = -1; },
       Msg("device_ordinal", "-1")},
      {"reserved0 1", [](kvp_cache_config* c) { c->reserved0 = 1; }, Msg("reserved0", "1")},
      {"reserved0 -9", [](kvp_cache_config* c) { c->reserved0 = -9; }, Msg("reserved0", "-9")},
  };
  for (const ConfigCase& cc : cases) {
    SCOPED_TRACE(cc.what);
    kvp_cache_config cfg = SmallConfig();
    cc.mutate(&cfg);
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT, cc.needles);
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  }
}

TEST(BadInputCacheCreate, CudaOnThisMachine) {
  int32_t count = -1;
  ASSERT_KVP_OK(kvp_device_count(KVP_DEVICE_CUDA, &count));
  if (count > 0) GTEST_SKIP() << "a CUDA device is present";
  kvp_cache_config cfg = SmallConfig();
  cfg.device_kind = KVP_DEVICE_CUDA;
  kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
  kvp_error* e = kvp_cache_create(&cfg, &out);
  ++g_num_cases;
  ASSERT_NE(e, nullptr);
  const int32_t code = kvp_error_code(e);
  EXPECT_TRUE(code == KVP_ERR_UNSUPPORTED || code == KVP_ERR_INVALID_ARGUMENT)
      << kvp_error_code_name(code);
  const std::string msg = kvp_error_message(e);
  EXPECT_FALSE(msg.empty());
  std::string lower = msg;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  EXPECT_TRUE(lower.find("cuda") != std::string::npos || lower.find("device") != std::string::npos)
      << msg;
  EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  kvp_error_free(e);
}

TEST(BadInputCacheCreate, KeySmoothingMustBePositiveFinite) {
  const int n = 2 * 64;
  const struct {
    float value;
    const char* text;
  } kBad[] = {{0.0f, "0"},   {-1.0f, "-1"},   {kNaN, "nan"},
              {kInf, "inf"}, {-kInf, "-inf"}, {-0.0f, "-0"}};
  std::uniform_int_distribution<int> pick(0, n - 1);
  for (const auto& bad : kBad) {
    SCOPED_TRACE(bad.text);
    std::vector<float> lambda(n);
    std::uniform_real_distribution<float> pos(0.25f, 4.0f);
    for (float& l : lambda) l = pos(Rng());
    const int at = pick(Rng());
    lambda[at] = bad.value;
    kvp_cache_config cfg = SmallConfig();
    cfg.key_smoothing = lambda.data();
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT,
               Msg("key_smoothing", bad.text, S(at)));
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  }
}

// An engine allocator that logs its calls.
struct AllocLog {
  int allocs = 0, frees = 0;
  size_t alloc_bytes = 0, free_bytes = 0, alignment = 0;
  void* returned = nullptr;  // what alloc handed out
  void* freed = nullptr;
  int32_t kind = -1, ordinal = -1, free_kind = -1, free_ordinal = -1;
  bool fail = false;
  size_t misalign = 0;
};

void* LogAlloc(void* user, size_t bytes, size_t alignment, int32_t kind, int32_t ordinal) {
  AllocLog* log = static_cast<AllocLog*>(user);
  ++log->allocs;
  log->alloc_bytes = bytes;
  log->alignment = alignment;
  log->kind = kind;
  log->ordinal = ordinal;
  if (log->fail) return nullptr;
  const size_t a = std::max<size_t>(alignment, 256);
  const size_t rounded = (bytes + log->misalign + a - 1) / a * a;
  char* p = static_cast<char*>(std::aligned_alloc(a, rounded));
  log->returned = p + log->misalign;
  return log->returned;
}

void LogFree(void* user, void* ptr, size_t bytes, int32_t kind, int32_t ordinal) {
  AllocLog* log = static_cast<AllocLog*>(user);
  ++log->frees;
  log->freed = ptr;
  log->free_bytes = bytes;
  log->free_kind = kind;
  log->free_ordinal = ordinal;
  std::free(static_cast<char*>(ptr) - log->misalign);
}

TEST(BadInputAllocator, HalfSetAllocator) {
  kvp_allocator only_alloc;
  kvp_allocator_init(&only_alloc);
  only_alloc.alloc = LogAlloc;
  kvp_allocator only_free;
  kvp_allocator_init(&only_free);
  only_free.free = LogFree;
  AllocLog log;
  only_alloc.user_data = &log;
  only_free.user_data = &log;
  for (const kvp_allocator* a : {&only_alloc, &only_free}) {
    kvp_cache_config cfg = SmallConfig();
    cfg.allocator = a;
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT,
               Msg("allocator", a == &only_alloc ? "free" : "alloc"));
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  }
  EXPECT_EQ(log.allocs, 0);
  EXPECT_EQ(log.frees, 0);
}

TEST(BadInputAllocator, StructSizeTooSmall) {
  for (size_t size : {size_t{0}, size_t{8}, sizeof(kvp_allocator) - 8}) {
    AllocLog log;
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = &log;
    a.alloc = LogAlloc;
    a.free = LogFree;
    a.struct_size = size;
    kvp_cache_config cfg = SmallConfig();
    cfg.allocator = &a;
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT,
               Msg("allocator", "struct_size", S(size)));
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
    EXPECT_EQ(log.allocs, 0);
  }
}

TEST(BadInputAllocator, FailingAllocatorIsOutOfMemory) {
  AllocLog log;
  log.fail = true;
  kvp_allocator a;
  kvp_allocator_init(&a);
  a.user_data = &log;
  a.alloc = LogAlloc;
  a.free = LogFree;
  kvp_cache_config cfg = SmallConfig();
  cfg.allocator = &a;
  kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
  kvp_error* e = kvp_cache_create(&cfg, &out);
  CheckError(e, KVP_ERR_OUT_OF_MEMORY, Msg(S(log.alloc_bytes)));  // names the size asked for
  EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  EXPECT_EQ(log.allocs, 1);
  EXPECT_EQ(log.frees, 0);  // nothing was handed out, nothing to give back
}

TEST(BadInputAllocator, MisalignedMemoryIsRejectedAndReturned) {
  AllocLog log;
  log.misalign = 16;
  kvp_allocator a;
  kvp_allocator_init(&a);
  a.user_data = &log;
  a.alloc = LogAlloc;
  a.free = LogFree;
  kvp_cache_config cfg = SmallConfig();
  cfg.allocator = &a;
  kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
  CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT, Msg("allocator"));
  EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  EXPECT_EQ(log.allocs, 1);
  EXPECT_EQ(log.frees, 1);
  EXPECT_EQ(log.freed, log.returned);
}

// Regression: the byte counts of src/geometry.h are int64 products; before
// ValidateGeometry bounded the whole cache they wrapped, and Cache::Create
// asked for the wrapped size (16 bytes for the first case below).
// Sizes each valid on its own whose byte count does not fit in 64 bits (or
// in any address space). The library must refuse them (INVALID_ARGUMENT) or
// fail to allocate them (OUT_OF_MEMORY); it must never ask for fewer bytes
// than the cache needs. The allocator refuses everything, so that a library
// that asks for a huge size cannot take this machine down with a memset.
TEST(BadInputCacheCreate, ByteCountOverflow) {
  struct Case {
    int32_t num_layers, num_blocks, block_size, num_kv_heads, head_size;
  };
  const Case kCases[] = {
      {256, 1 << 21, 32, 1 << 20, 256},  // 2^64 bytes: wraps to ~0 in int64
      {kI32Max, (1 << 26) - 1, 32, kI32Max, 256},
      {1, (1 << 26) - 1, 32, kI32Max, 256},
      {kI32Max, 4, 16, 2, 64},  // about 2^45 bytes, no overflow
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "layers " << c.num_layers << " blocks " << c.num_blocks
                                    << " kv_heads " << c.num_kv_heads);
    AllocLog log;
    log.fail = true;
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = &log;
    a.alloc = LogAlloc;
    a.free = LogFree;
    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.num_layers = c.num_layers;
    cfg.num_blocks = c.num_blocks;
    cfg.block_size = c.block_size;
    cfg.num_kv_heads = c.num_kv_heads;
    cfg.head_size = c.head_size;
    cfg.k_dtype = KVP_DTYPE_FP16;
    cfg.v_dtype = KVP_DTYPE_FP16;
    cfg.allocator = &a;
    // K and V data alone: 2 bytes each per element.
    const long double need =
        4.0L * c.num_layers * c.num_blocks * c.block_size * c.num_kv_heads * c.head_size;
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    kvp_error* e = kvp_cache_create(&cfg, &out);
    ++g_num_cases;
    ASSERT_NE(e, nullptr);
    const int32_t code = kvp_error_code(e);
    EXPECT_TRUE(code == KVP_ERR_INVALID_ARGUMENT || code == KVP_ERR_OUT_OF_MEMORY)
        << kvp_error_code_name(code) << ": " << kvp_error_message(e);
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
    if (log.allocs > 0) {
      EXPECT_GE(static_cast<long double>(log.alloc_bytes), need)
          << "the library asked for " << log.alloc_bytes << " bytes for a cache of at least "
          << static_cast<double>(need) << " bytes: its size computation overflowed";
    }
    kvp_error_free(e);
  }
}

// Regression (see ByteCountOverflow). 256 layers x 2^21 blocks x 32 tokens x 2^20
// heads x 256 channels x 4 bytes is exactly 2^64 bytes: the size wraps to 0
// and the library allocates a few bytes for it. (Safe to run: a library that
// gets it right refuses, one that does not allocates almost nothing.)
TEST(BadInputCacheCreate, ByteCountOverflowWithoutAllocator) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = 256;
  cfg.num_blocks = 1 << 21;
  cfg.block_size = 32;
  cfg.num_kv_heads = 1 << 20;
  cfg.head_size = 256;
  cfg.k_dtype = KVP_DTYPE_FP16;
  cfg.v_dtype = KVP_DTYPE_FP16;
  kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
  kvp_error* e = kvp_cache_create(&cfg, &out);
  ++g_num_cases;
  EXPECT_NE(e, nullptr) << "a cache of 2^64 bytes was created";
  if (e == nullptr) {
    kvp_cache_info info;
    kvp_cache_info_init(&info);
    if (kvp_cache_get_info(out, &info) == nullptr) {
      ADD_FAILURE() << "it reports total_bytes = " << info.total_bytes;
    }
    kvp_cache_destroy(out);
    return;
  }
  const int32_t code = kvp_error_code(e);
  EXPECT_TRUE(code == KVP_ERR_INVALID_ARGUMENT || code == KVP_ERR_OUT_OF_MEMORY)
      << kvp_error_code_name(code) << ": " << kvp_error_message(e);
  EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  kvp_error_free(e);
}

TEST(ApiAllocator, OneAllocAndOneFreeWithMatchingSize) {
  AllocLog log;
  kvp_allocator a;
  kvp_allocator_init(&a);
  a.user_data = &log;
  a.alloc = LogAlloc;
  a.free = LogFree;
  kvp_cache_config cfg = SmallConfig();
  cfg.num_layers = 2;
  cfg.allocator = &a;
  kvp_cache* cache = nullptr;
  ASSERT_KVP_OK(kvp_cache_create(&cfg, &cache));
  EXPECT_EQ(log.allocs, 1);
  EXPECT_EQ(log.frees, 0);
  EXPECT_GE(log.alignment, 16u);
  EXPECT_EQ(log.kind, KVP_DEVICE_CPU);
  EXPECT_EQ(log.ordinal, 0);
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  ASSERT_KVP_OK(kvp_cache_get_info(cache, &info));
  EXPECT_GE(log.alloc_bytes, static_cast<size_t>(info.total_bytes));
  kvp_layer_layout lay;
  kvp_layer_layout_init(&lay);
  ASSERT_KVP_OK(kvp_cache_get_layout(cache, 1, &lay));
  const char* base = static_cast<const char*>(log.returned);
  EXPECT_GE(static_cast<const char*>(lay.k_data), base);
  EXPECT_LT(static_cast<const char*>(lay.k_data), base + log.alloc_bytes);
  kvp_cache_destroy(cache);
  EXPECT_EQ(log.allocs, 1);
  EXPECT_EQ(log.frees, 1);
  EXPECT_EQ(log.freed, log.returned);
  EXPECT_EQ(log.free_bytes, log.alloc_bytes);
  EXPECT_EQ(log.free_kind, KVP_DEVICE_CPU);
  EXPECT_EQ(log.free_ordinal, 0);
}

// ---- A populated cache for everything that takes one -----------------------------

class BadInputCache : public ::testing::Test {
 protected:
  static constexpr int32_t kLayers = 2, kBlocks = 8, kBlockSize = 16, kKvHeads = 2, kHead = 64;
  static constexpr int32_t kQHeads = 4, kMaxSeqs = 2, kMaxContext = 64, kMaxQueryLen = 2;
  static constexpr int32_t kWidth = 5;  // table width: 80 tokens > kMaxContext
  static constexpr int64_t kDense = int64_t{kKvHeads} * kHead;
  static constexpr int64_t kQDense = int64_t{kQHeads} * kHead;

  static kvp_cache_config Config() {
    kvp_cache_config c;
    kvp_cache_config_init(&c);
    c.num_layers = kLayers;
    c.num_blocks = kBlocks;
    c.block_size = kBlockSize;
    c.num_kv_heads = kKvHeads;
    c.head_size = kHead;
    c.k_dtype = KVP_DTYPE_INT8;
    c.v_dtype = KVP_DTYPE_INT4;  // both scale regions exist
    return c;
  }

  static kvp_decode_config DecodeConfig() {
    kvp_decode_config c;
    kvp_decode_config_init(&c);
    c.num_query_heads = kQHeads;
    c.max_num_seqs = kMaxSeqs;
    c.max_context_len = kMaxContext;
    c.max_query_len = kMaxQueryLen;
    c.q_dtype = KVP_DTYPE_FP32;
    c.out_dtype = KVP_DTYPE_FP32;
    return c;
  }

  void SetUp() override {
    kvp_cache_config cfg = Config();
    ASSERT_KVP_OK(kvp_cache_create(&cfg, &cache_));
    ASSERT_KVP_OK(kvp_seq_create(cache_, &a_));
    ASSERT_KVP_OK(kvp_seq_create(cache_, &b_));
    ASSERT_KVP_OK(kvp_seq_create(cache_, &stale_));
    ASSERT_KVP_OK(kvp_seq_append(cache_, stale_, 3, nullptr, nullptr));
    ASSERT_KVP_OK(kvp_seq_free(cache_, stale_));
    AppendAndWrite(cache_, a_, 20);
    AppendAndWrite(cache_, b_, 7);
    live_ = {a_, b_};

    kvp_decode_config dc = DecodeConfig();
    ASSERT_KVP_OK(kvp_decoder_create(cache_, &dc, &decoder_));
    q_ = Randn(static_cast<size_t>(kMaxSeqs) * kMaxQueryLen * kQDense);
    out_.assign(q_.size(), 0.0f);
    lse_.assign(static_cast<size_t>(kMaxSeqs) * kMaxQueryLen * kQHeads, 0.0f);
    table_.assign(kMaxSeqs * kWidth, 0);
    lens_.assign(kMaxSeqs, 0);
    ASSERT_KVP_OK(kvp_cache_export_block_table(cache_, live_.data(), 2, kWidth, kWidth,
                                               table_.data(), lens_.data()));
    ASSERT_EQ(lens_, (std::vector<int32_t>{20, 7}));
    // The baseline decode is valid; every case below changes one thing.
    kvp_decode_args args = Args();
    ASSERT_KVP_OK(kvp_decode(decoder_, &args, nullptr));
    for (size_t i = 0; i < static_cast<size_t>(args.num_seqs) * kQDense; ++i) {
      ASSERT_TRUE(std::isfinite(out_[i])) << i;
    }
    PoisonOut();
  }

  void TearDown() override {
    kvp_decoder_destroy(decoder_);
    for (kvp_cache* c : extra_) kvp_cache_destroy(c);
    kvp_cache_destroy(cache_);
  }

  // Appends `n` tokens to `seq` and writes random K/V to them in every layer.
  static void AppendAndWrite(kvp_cache* cache, int64_t seq, int32_t n) {
    std::vector<int64_t> slots(n, -777);
    ASSERT_KVP_OK(kvp_seq_append(cache, seq, n, slots.data(), nullptr));
    kvp_cache_info info;
    kvp_cache_info_init(&info);
    ASSERT_KVP_OK(kvp_cache_get_info(cache, &info));
    const size_t dense = static_cast<size_t>(info.num_kv_heads) * info.head_size;
    for (int32_t l = 0; l < info.num_layers; ++l) {
      const std::vector<float> k = Randn(n * dense), v = Randn(n * dense);
      kvp_write_args w;
      kvp_write_args_init(&w);
      w.layer = l;
      w.num_tokens = n;
      w.input_dtype = KVP_DTYPE_FP32;
      w.key = k.data();
      w.value = v.data();
      w.slot_mapping = slots.data();
      ASSERT_KVP_OK(kvp_cache_write(cache, &w, nullptr));
    }
  }

  // Another cache this test owns; its state is checked with the main one's.
  kvp_cache* Extra(const kvp_cache_config& cfg, bool populate) {
    kvp_cache* c = nullptr;
    kvp_error* e = kvp_cache_create(&cfg, &c);
    EXPECT_EQ(e, nullptr) << kvp_error_message(e);
    kvp_error_free(e);
    if (c == nullptr) return nullptr;
    extra_.push_back(c);
    if (populate) {
      int64_t s = -1;
      EXPECT_EQ(kvp_seq_create(c, &s), nullptr);
      AppendAndWrite(c, s, 2 * cfg.block_size + 3);
      extra_live_.push_back({s});
    } else {
      extra_live_.push_back({});
    }
    return c;
  }

  struct State {
    CacheState main;
    std::vector<CacheState> extra;
    std::vector<float> out, lse;
  };

  State Snap() const {
    State s;
    s.main = Snapshot(cache_, live_);
    for (size_t i = 0; i < extra_.size(); ++i)
      s.extra.push_back(Snapshot(extra_[i], extra_live_[i]));
    s.out = out_;
    s.lse = lse_;
    return s;
  }

  void ExpectUnchanged(const State& before) const {
    const State after = Snap();
    ExpectSameState(before.main, after.main, "cache");
    for (size_t i = 0; i < before.extra.size(); ++i) {
      ExpectSameState(before.extra[i], after.extra[i], "other cache");
    }
    EXPECT_EQ(0, std::memcmp(before.out.data(), after.out.data(), out_.size() * sizeof(float)))
        << "decode output written by a failed call";
    EXPECT_EQ(0, std::memcmp(before.lse.data(), after.lse.data(), lse_.size() * sizeof(float)))
        << "lse written by a failed call";
  }

  void PoisonOut() {
    const uint32_t poison = 0x7FC0DEADu;  // a NaN with a payload
    for (float& x : out_) std::memcpy(&x, &poison, sizeof(x));
    for (float& x : lse_) std::memcpy(&x, &poison, sizeof(x));
  }

  kvp_decode_args Args() {
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.layer = 1;
    a.num_seqs = 2;
    a.query_len = 1;
    a.q = q_.data();
    a.block_table = table_.data();
    a.block_table_stride = kWidth;
    a.block_table_width = kWidth;
    a.seq_lens = lens_.data();
    a.out = out_.data();
    a.lse = lse_.data();
    return a;
  }

  kvp_cache* cache_ = nullptr;
  kvp_decoder* decoder_ = nullptr;
  int64_t a_ = -1, b_ = -1, stale_ = -1;
  std::vector<int64_t> live_;
  std::vector<kvp_cache*> extra_;
  std::vector<std::vector<int64_t>> extra_live_;
  std::vector<float> q_, out_, lse_;
  std::vector<int32_t> table_, lens_;
};

// A failing call that must leave every cache (and decode output) unchanged.
#define EXPECT_FAILS_UNCHANGED(code, needles, ...) \
  do {                                             \
    SCOPED_TRACE(#__VA_ARGS__);                    \
    const State before_ = Snap();                  \
    CheckError((__VA_ARGS__), (code), (needles));  \
    ExpectUnchanged(before_);                      \
  } while (0)

// Ids that never named a sequence, or no longer do.
std::vector<int64_t> UnknownIds(int64_t stale) {
  return {stale, 0, -1, 987654321, kI64Max, kI64Min};
}

TEST_F(BadInputCache, LayoutAndInfo) {
  kvp_layer_layout lay;
  std::memset(&lay, 0xCD, sizeof(lay));
  lay.struct_size = sizeof(lay);
  const kvp_layer_layout lay0 = lay;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_get_layout(nullptr, 0, &lay));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("layout"),
                         kvp_cache_get_layout(cache_, 0, nullptr));
  for (int32_t layer : {-1, kLayers, 1000, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("layer", S(layer)),
                           kvp_cache_get_layout(cache_, layer, &lay));
  }
  EXPECT_EQ(0, std::memcmp(&lay, &lay0, sizeof(lay)));
  for (size_t size : {size_t{0}, size_t{8}, sizeof(kvp_layer_layout) - 8}) {
    lay.struct_size = size;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("layout", "struct_size", S(size)),
                           kvp_cache_get_layout(cache_, 0, &lay));
    lay.struct_size = lay0.struct_size;
    EXPECT_EQ(0, std::memcmp(&lay, &lay0, sizeof(lay)));
  }

  kvp_cache_info info;
  std::memset(&info, 0xCD, sizeof(info));
  info.struct_size = sizeof(info);
  const kvp_cache_info info0 = info;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_get_info(nullptr, &info));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("info"),
                         kvp_cache_get_info(cache_, nullptr));
  for (size_t size : {size_t{0}, size_t{8}}) {
    info.struct_size = size;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("info", "struct_size", S(size)),
                           kvp_cache_get_info(cache_, &info));
    info.struct_size = info0.struct_size;
    EXPECT_EQ(0, std::memcmp(&info, &info0, sizeof(info)));
  }
}

TEST_F(BadInputCache, WriteStats) {
  kvp_write_stats st;
  std::memset(&st, 0xCD, sizeof(st));
  st.struct_size = sizeof(st);
  const kvp_write_stats st0 = st;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_get_write_stats(nullptr, &st));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("stats"),
                         kvp_cache_get_write_stats(cache_, nullptr));
  for (size_t size : {size_t{0}, size_t{8}}) {
    st.struct_size = size;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("stats", "struct_size", S(size)),
                           kvp_cache_get_write_stats(cache_, &st));
    st.struct_size = st0.struct_size;
    EXPECT_EQ(0, std::memcmp(&st, &st0, sizeof(st)));
  }
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_reset_write_stats(nullptr));
}

TEST_F(BadInputCache, SequenceCreateAndFork) {
  int64_t id = -777;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_seq_create(nullptr, &id));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("seq_id"), kvp_seq_create(cache_, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_seq_fork(nullptr, a_, &id));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("child"), kvp_seq_fork(cache_, a_, nullptr));
  for (int64_t bad : UnknownIds(stale_)) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)), kvp_seq_fork(cache_, bad, &id));
  }
  EXPECT_EQ(id, -777);
}

TEST_F(BadInputCache, SequenceAppend) {
  std::vector<int64_t> slots(8, -777);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_seq_append(nullptr, a_, 1, slots.data(), nullptr));
  for (int64_t bad : UnknownIds(stale_)) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)),
                           kvp_seq_append(cache_, bad, 1, slots.data(), nullptr));
  }
  for (int32_t n : {-1, -16, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_tokens", S(n)),
                           kvp_seq_append(cache_, a_, n, slots.data(), nullptr));
  }
  // A length past INT32_MAX can never be represented.
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(kI32Max)),
                         kvp_seq_append(cache_, a_, kI32Max, slots.data(), nullptr));
  EXPECT_EQ(slots, std::vector<int64_t>(8, -777));
}

TEST_F(BadInputCache, OutOfBlocks) {
  // a: 20 tokens (2 blocks), b: 7 tokens (1 block); 5 blocks are free.
  int32_t num_free = -1;
  ASSERT_KVP_OK(kvp_cache_num_free_blocks(cache_, &num_free));
  ASSERT_EQ(num_free, kBlocks - 3);
  std::vector<int64_t> slots(200, -777);
  // b has 9 free slots in its block; 9 + 5 * 16 fit, one more does not.
  const int32_t fits = 9 + num_free * kBlockSize;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(S(fits + 1)),
                         kvp_seq_append(cache_, b_, fits + 1, slots.data(), nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(S(kBlocks * kBlockSize)),
                         kvp_seq_append(cache_, a_, kBlocks * kBlockSize, slots.data(), nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(S(kI32Max - 20)),
                         kvp_seq_append(cache_, a_, kI32Max - 20, nullptr, nullptr));
  EXPECT_EQ(slots, std::vector<int64_t>(200, -777));

  // Copy-on-write needs a block too: fork b (its last block is shared and
  // partly filled), use up every free block, then append to either side.
  int64_t child = -1, filler = -1;
  ASSERT_KVP_OK(kvp_seq_fork(cache_, b_, &child));
  ASSERT_KVP_OK(kvp_seq_create(cache_, &filler));
  live_ = {a_, b_, child, filler};
  ASSERT_KVP_OK(kvp_seq_append(cache_, filler, num_free * kBlockSize, nullptr, nullptr));
  ASSERT_KVP_OK(kvp_cache_num_free_blocks(cache_, &num_free));
  ASSERT_EQ(num_free, 0);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(),
                         kvp_seq_append(cache_, child, 1, slots.data(), nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(),
                         kvp_seq_append(cache_, b_, 1, slots.data(), nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(),
                         kvp_seq_append(cache_, filler, 1, slots.data(), nullptr));
  EXPECT_EQ(slots, std::vector<int64_t>(200, -777));
  // A zero-token append needs nothing and succeeds even now.
  ASSERT_KVP_OK(kvp_seq_append(cache_, child, 0, slots.data(), nullptr));
}

TEST_F(BadInputCache, SequenceTruncateFreeLength) {
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_seq_truncate(nullptr, a_, 1));
  for (int64_t bad : UnknownIds(stale_)) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)), kvp_seq_truncate(cache_, bad, 0));
  }
  for (int32_t len : {21, 1000, kI32Max, -1, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("length", S(len)),
                           kvp_seq_truncate(cache_, a_, len));
  }

  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_seq_free(nullptr, a_));
  for (int64_t bad : UnknownIds(stale_)) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)), kvp_seq_free(cache_, bad));
  }

  int32_t len = -777;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"), kvp_seq_length(nullptr, a_, &len));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("length"),
                         kvp_seq_length(cache_, a_, nullptr));
  for (int64_t bad : UnknownIds(stale_)) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)),
                           kvp_seq_length(cache_, bad, &len));
  }
  EXPECT_EQ(len, -777);

  int32_t num_free = -777;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_num_free_blocks(nullptr, &num_free));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_free"),
                         kvp_cache_num_free_blocks(cache_, nullptr));
  EXPECT_EQ(num_free, -777);

  // An id freed during this test is stale everywhere at once.
  int64_t gone = -1;
  ASSERT_KVP_OK(kvp_seq_fork(cache_, a_, &gone));
  ASSERT_KVP_OK(kvp_seq_free(cache_, gone));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(gone)), kvp_seq_free(cache_, gone));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(gone)),
                         kvp_seq_append(cache_, gone, 1, nullptr, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(gone)),
                         kvp_seq_length(cache_, gone, &len));
}

TEST_F(BadInputCache, ExportBlockTable) {
  std::vector<int32_t> table(3 * 4, -555), lens(3, -555);
  const std::vector<int32_t> table0 = table, lens0 = lens;
  int64_t ids[3] = {a_, b_, a_};
  auto untouched = [&] {
    EXPECT_EQ(table, table0);
    EXPECT_EQ(lens, lens0);
  };
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
      kvp_cache_export_block_table(nullptr, ids, 2, 4, 4, table.data(), lens.data()));
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("seq_ids"),
      kvp_cache_export_block_table(cache_, nullptr, 2, 4, 4, table.data(), lens.data()));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("table"),
                         kvp_cache_export_block_table(cache_, ids, 2, 4, 4, nullptr, lens.data()));
  for (int32_t n : {-1, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(
        KVP_ERR_INVALID_ARGUMENT, Msg("num_seqs", S(n)),
        kvp_cache_export_block_table(cache_, ids, n, 4, 4, table.data(), lens.data()));
  }
  for (int32_t m : {0, -1}) {
    EXPECT_FAILS_UNCHANGED(
        KVP_ERR_INVALID_ARGUMENT, Msg("max_blocks_per_seq", S(m)),
        kvp_cache_export_block_table(cache_, ids, 2, m, 4, table.data(), lens.data()));
  }
  for (int64_t stride : {int64_t{3}, int64_t{0}, int64_t{-4}}) {
    EXPECT_FAILS_UNCHANGED(
        KVP_ERR_INVALID_ARGUMENT, Msg("row_stride", S(stride)),
        kvp_cache_export_block_table(cache_, ids, 2, 4, stride, table.data(), lens.data()));
  }
  // An unknown id anywhere in the batch: nothing written, not even the rows before it.
  for (int64_t bad : UnknownIds(stale_)) {
    ids[2] = bad;
    EXPECT_FAILS_UNCHANGED(
        KVP_ERR_INVALID_ARGUMENT, Msg(S(bad)),
        kvp_cache_export_block_table(cache_, ids, 3, 4, 4, table.data(), lens.data()));
  }
  // a has 2 blocks; a table one block wide cannot hold it (b fits, and comes first).
  ids[0] = b_;
  ids[1] = a_;
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("max_blocks_per_seq", S(a_)),
      kvp_cache_export_block_table(cache_, ids, 2, 1, 4, table.data(), lens.data()));
  untouched();
}

TEST_F(BadInputCache, Write) {
  // Baseline: three tokens of a in layer 0, new random data, slots known valid.
  const int32_t n = 3;
  const std::vector<float> k = Randn(n * kDense), v = Randn(n * kDense);
  std::vector<int64_t> slots = {5, 17, 3};
  auto args = [&] {
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = 0;
    w.num_tokens = n;
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = k.data();
    w.value = v.data();
    w.slot_mapping = slots.data();
    return w;
  };
  kvp_write_args w = args();
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_write(nullptr, &w, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("args"),
                         kvp_cache_write(cache_, nullptr, nullptr));

  struct Case {
    const char* what;
    std::function<void(kvp_write_args*)> mutate;
    Needles needles;
  };
  const std::vector<Case> cases = {
      {"struct_size 0", [](kvp_write_args* a) { a->struct_size = 0; }, Msg("struct_size", "0")},
      {"struct_size 8", [](kvp_write_args* a) { a->struct_size = 8; }, Msg("struct_size", "8")},
      {"struct_size sizeof-8",
       [](kvp_write_args* a) { a->struct_size = sizeof(kvp_write_args) - 8; },
       Msg("struct_size", S(sizeof(kvp_write_args) - 8))},
      {"reserved0", [](kvp_write_args* a) { a->reserved0 = 1; }, Msg("reserved0", "1")},
      {"layer -1", [](kvp_write_args* a) { a->layer = -1; }, Msg("layer", "-1")},
      {"layer num_layers", [](kvp_write_args* a) { a->layer = kLayers; }, Msg("layer", S(kLayers))},
      {"num_tokens -1", [](kvp_write_args* a) { a->num_tokens = -1; }, Msg("num_tokens", "-1")},
      {"input_dtype 99", [](kvp_write_args* a) { a->input_dtype = 99; }, Msg("input_dtype", "99")},
      {"input_dtype FP8", [](kvp_write_args* a) { a->input_dtype = KVP_DTYPE_FP8_E4M3; },
       Msg("input_dtype", "3")},
      {"input_dtype INT8", [](kvp_write_args* a) { a->input_dtype = KVP_DTYPE_INT8; },
       Msg("input_dtype", "4")},
      {"input_dtype INT4", [](kvp_write_args* a) { a->input_dtype = KVP_DTYPE_INT4; },
       Msg("input_dtype", "5")},
      {"input_dtype -1", [](kvp_write_args* a) { a->input_dtype = -1; }, Msg("input_dtype", "-1")},
      {"key stride < dense", [](kvp_write_args* a) { a->key_token_stride = kDense - 1; },
       Msg("key_token_stride", S(kDense - 1))},
      {"key stride -1", [](kvp_write_args* a) { a->key_token_stride = -1; },
       Msg("key_token_stride", "-1")},
      {"value stride < dense", [](kvp_write_args* a) { a->value_token_stride = kDense - 1; },
       Msg("value_token_stride", S(kDense - 1))},
      {"value stride -dense", [](kvp_write_args* a) { a->value_token_stride = -kDense; },
       Msg("value_token_stride", S(-kDense))},
      {"key NULL", [](kvp_write_args* a) { a->key = nullptr; }, Msg("key")},
      {"value NULL", [](kvp_write_args* a) { a->value = nullptr; }, Msg("value")},
      {"slot_mapping NULL", [](kvp_write_args* a) { a->slot_mapping = nullptr; },
       Msg("slot_mapping")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    w = args();
    c.mutate(&w);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_cache_write(cache_, &w, nullptr));
  }
  // Slots out of range, placed last so that a write that does not check
  // everything first would already have changed the valid tokens before it.
  const int64_t num_slots = int64_t{kBlocks} * kBlockSize;
  for (int64_t bad : {int64_t{-2}, num_slots, num_slots + 1, kI64Max, kI64Min}) {
    slots = {5, 17, bad};
    w = args();
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("slot_mapping", S(bad)),
                           kvp_cache_write(cache_, &w, nullptr));
    slots = {bad, 5, 17};
    w = args();
    w.layer = 1;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("slot_mapping", S(bad)),
                           kvp_cache_write(cache_, &w, nullptr));
  }
  // The baseline itself is valid (and does change the cache).
  slots = {5, 17, 3};
  w = args();
  const CacheState before = Snapshot(cache_, live_);
  ASSERT_KVP_OK(kvp_cache_write(cache_, &w, nullptr));
  EXPECT_FALSE(before.regions == Snapshot(cache_, live_).regions);
}

TEST_F(BadInputCache, CopyBlocks) {
  // Blocks 0, 1 (a) and 2 (b) hold data; 3..7 are free and zero. Two good
  // pairs first, then the bad one: a partial copy would show in the bytes.
  auto with = [](int32_t src, int32_t dst) { return std::vector<int32_t>{0, 5, 1, 6, src, dst}; };
  std::vector<int32_t> p = with(2, 7);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_copy_blocks(nullptr, p.data(), 3, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("pairs"),
                         kvp_cache_copy_blocks(cache_, nullptr, 3, nullptr));
  for (int32_t n : {-1, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_pairs", S(n)),
                           kvp_cache_copy_blocks(cache_, p.data(), n, nullptr));
  }
  const struct {
    int32_t src, dst;
    Needles needles;
  } kBad[] = {
      {2, -1, Msg("pairs", "-1")},
      {2, kBlocks, Msg("pairs", S(kBlocks))},
      {2, kI32Min, Msg("pairs", S(kI32Min))},
      {-1, 7, Msg("pairs", "-1")},
      {kBlocks, 7, Msg("pairs", S(kBlocks))},
      {kI32Max, 7, Msg("pairs", S(kI32Max))},
      {2, 5, Msg("pairs", "5")},  // 5 is already a destination
      {5, 7, Msg("pairs", "5")},  // 5 is a destination and now a source
      {7, 7, Msg("pairs", "7")},  // a block copied onto itself
      {2, 0, Msg("pairs", "0")},  // 0 is a source and now a destination
  };
  for (const auto& bad : kBad) {
    p = with(bad.src, bad.dst);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, bad.needles,
                           kvp_cache_copy_blocks(cache_, p.data(), 3, nullptr));
  }
  p = with(2, 7);
  ASSERT_KVP_OK(kvp_cache_copy_blocks(cache_, p.data(), 3, nullptr));  // the baseline is valid
}

TEST_F(BadInputCache, TransferBlocks) {
  const std::vector<int32_t> good = {0, 1, 2, 3};
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("dst"),
                         kvp_cache_transfer_blocks(nullptr, cache_, good.data(), 2, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("src"),
                         kvp_cache_transfer_blocks(cache_, nullptr, good.data(), 2, nullptr));

  // Caches that differ from the main one in one property each.
  struct Variant {
    const char* what;
    std::function<void(kvp_cache_config*)> mutate;
  };
  std::vector<float> lambda(kKvHeads * kHead);
  std::uniform_real_distribution<float> pos(0.5f, 2.0f);
  for (float& l : lambda) l = pos(Rng());
  const std::vector<Variant> variants = {
      {"num_layers", [](kvp_cache_config* c) { c->num_layers = 1; }},
      {"block_size", [](kvp_cache_config* c) { c->block_size = 32; }},
      {"num_kv_heads", [](kvp_cache_config* c) { c->num_kv_heads = 1; }},
      {"head_size", [](kvp_cache_config* c) { c->head_size = 128; }},
      {"k_dtype", [](kvp_cache_config* c) { c->k_dtype = KVP_DTYPE_FP8_E4M3; }},
      {"v_dtype", [](kvp_cache_config* c) { c->v_dtype = KVP_DTYPE_INT8; }},
      {"key_smoothing", [&](kvp_cache_config* c) { c->key_smoothing = lambda.data(); }},
  };
  for (const Variant& var : variants) {
    SCOPED_TRACE(var.what);
    kvp_cache_config cfg = Config();
    var.mutate(&cfg);
    kvp_cache* other = Extra(cfg, true);
    ASSERT_NE(other, nullptr);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("geometry"),
                           kvp_cache_transfer_blocks(cache_, other, good.data(), 2, nullptr));
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("geometry"),
                           kvp_cache_transfer_blocks(other, cache_, good.data(), 2, nullptr));
  }

  // Same geometry, fewer blocks: pair ranges are per cache.
  kvp_cache_config small = Config();
  small.num_blocks = 4;
  kvp_cache* peer = Extra(small, true);
  ASSERT_NE(peer, nullptr);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("pairs"),
                         kvp_cache_transfer_blocks(peer, cache_, nullptr, 2, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_pairs", "-1"),
                         kvp_cache_transfer_blocks(peer, cache_, good.data(), -1, nullptr));
  const struct {
    int32_t src, dst;
    Needles needles;
  } kBad[] = {
      {2, 4, Msg("pairs", "4")},                                            // peer has 4 blocks
      {2, -1, Msg("pairs", "-1")}, {kBlocks, 3, Msg("pairs", S(kBlocks))},  // main has 8 blocks
      {-1, 3, Msg("pairs", "-1")}, {2, 1, Msg("pairs", "1")},  // 1 is already a destination
  };
  for (const auto& bad : kBad) {
    const std::vector<int32_t> p = {0, 0, 1, 1, bad.src, bad.dst};
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, bad.needles,
                           kvp_cache_transfer_blocks(peer, cache_, p.data(), 3, nullptr));
  }
  // From the small cache into the big one: source 4 is out of range there.
  {
    const std::vector<int32_t> p = {0, 3, 4, 5};
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("pairs", "4"),
                           kvp_cache_transfer_blocks(cache_, peer, p.data(), 2, nullptr));
  }
  // Within one cache the copy_blocks rules hold.
  {
    const std::vector<int32_t> p = {0, 5, 5, 6};
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("pairs", "5"),
                           kvp_cache_transfer_blocks(cache_, cache_, p.data(), 2, nullptr));
  }
  ASSERT_KVP_OK(kvp_cache_transfer_blocks(peer, cache_, good.data(), 2, nullptr));  // baseline
}

// ---- Pack and unpack ---------------------------------------------------------------

TEST_F(BadInputCache, PackSize) {
  uint64_t bytes = 77;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_pack_size(nullptr, 2, 1, &bytes));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("bytes"),
                         kvp_cache_pack_size(cache_, 2, 1, nullptr));
  for (int32_t n : {-1, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_blocks", S(n)),
                           kvp_cache_pack_size(cache_, n, 1, &bytes));
  }
  for (int32_t layers : {-1, kLayers + 1, kI32Max, kI32Min}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_layers", S(layers)),
                           kvp_cache_pack_size(cache_, 2, layers, &bytes));
  }
  EXPECT_EQ(bytes, 77u);
  ASSERT_KVP_OK(kvp_cache_pack_size(cache_, 2, 1, &bytes));
}

// One bad argument of kvp_pack_args each; `ids` holds three ids.
struct PackCase {
  const char* what;
  std::function<void(kvp_pack_args*, std::vector<int32_t>*)> mutate;
  Needles needles;
};

std::vector<PackCase> PackCases(int32_t layers, int32_t blocks, uint64_t need,
                                const void* other_signature, const void* cache_memory) {
  std::vector<PackCase> cases = {
      {"struct_size 0", [](kvp_pack_args* a, std::vector<int32_t>*) { a->struct_size = 0; },
       Msg("struct_size", "0")},
      {"struct_size first released - 8",
       [](kvp_pack_args* a, std::vector<int32_t>*) {
         a->struct_size = KVP_PACK_ARGS_STRUCT_SIZE_1_4 - 8;
       },
       Msg("struct_size", S(KVP_PACK_ARGS_STRUCT_SIZE_1_4 - 8))},
      {"reserved0", [](kvp_pack_args* a, std::vector<int32_t>*) { a->reserved0 = kI32Min; },
       Msg("reserved0", S(kI32Min))},
      {"num_layers past the cache",
       [=](kvp_pack_args* a, std::vector<int32_t>*) { a->num_layers = layers + 1; },
       Msg("num_layers", S(layers + 1))},
      {"num_layers past the cache from layer 1",
       [=](kvp_pack_args* a, std::vector<int32_t>*) {
         a->first_layer = 1;
         a->num_layers = layers;
       },
       Msg("num_layers", S(layers), "first_layer", "1")},
      {"block_ids NULL", [](kvp_pack_args* a, std::vector<int32_t>*) { a->block_ids = nullptr; },
       Msg("block_ids", "NULL")},
      {"buffer NULL", [](kvp_pack_args* a, std::vector<int32_t>*) { a->buffer = nullptr; },
       Msg("buffer", "NULL")},
      {"buffer misaligned",
       [](kvp_pack_args* a, std::vector<int32_t>*) {
         a->buffer = static_cast<uint8_t*>(a->buffer) + 8;
       },
       Msg("buffer", "aligned")},
      {"buffer_bytes one short",
       [=](kvp_pack_args* a, std::vector<int32_t>*) { a->buffer_bytes = need - 1; },
       Msg("buffer_bytes", S(need - 1), S(need))},
      {"buffer_bytes 0", [](kvp_pack_args* a, std::vector<int32_t>*) { a->buffer_bytes = 0; },
       Msg("buffer_bytes", "0")},
      {"buffer inside the cache",
       [=](kvp_pack_args* a, std::vector<int32_t>*) {
         a->buffer = const_cast<void*>(cache_memory);
       },
       Msg("buffer", "overlaps")},
      {"another format's signature",
       [=](kvp_pack_args* a, std::vector<int32_t>*) { a->signature = other_signature; },
       Msg("signature", "format")},
      {"not a signature",
       [](kvp_pack_args* a, std::vector<int32_t>*) {
         static const uint8_t garbage[KVP_FORMAT_SIGNATURE_BYTES] = {1, 2, 3};
         a->signature = garbage;
       },
       Msg("signature", "magic")},
  };
  for (int32_t n : {-1, kI32Min}) {
    cases.push_back({"num_blocks negative",
                     [=](kvp_pack_args* a, std::vector<int32_t>*) { a->num_blocks = n; },
                     Msg("num_blocks", S(n))});
  }
  for (int32_t first : {-1, layers, kI32Max, kI32Min}) {
    cases.push_back({"first_layer out of range",
                     [=](kvp_pack_args* a, std::vector<int32_t>*) { a->first_layer = first; },
                     Msg("first_layer", S(first))});
  }
  for (int32_t count : {-1, kI32Min, kI32Max}) {
    cases.push_back({"num_layers out of range",
                     [=](kvp_pack_args* a, std::vector<int32_t>*) { a->num_layers = count; },
                     Msg("num_layers", S(count))});
  }
  // The last id out of range: a partial move would show in the bytes.
  for (int32_t id : {-1, blocks, kI32Max, kI32Min}) {
    cases.push_back({"block id out of range",
                     [=](kvp_pack_args*, std::vector<int32_t>* ids) { (*ids)[2] = id; },
                     Msg("block_ids[2]", S(id), S(blocks))});
  }
  return cases;
}

// `bytes` bytes at a 16-byte aligned address inside `raw`, filled with `fill`.
uint8_t* Aligned16(std::vector<uint8_t>* raw, uint64_t bytes, uint8_t fill) {
  raw->assign(bytes + 16, fill);
  return raw->data() + (16 - reinterpret_cast<uintptr_t>(raw->data()) % 16) % 16;
}

std::vector<uint8_t> SignatureOf(const kvp_cache* cache) {
  std::vector<uint8_t> sig(KVP_FORMAT_SIGNATURE_BYTES);
  EXPECT_EQ(kvp_cache_format_signature(cache, sig.data(), sig.size()), nullptr);
  return sig;
}

// The cache's own memory (layer 1's V data), as a buffer that overlaps it.
const void* CacheMemory(const kvp_cache* cache) {
  kvp_layer_layout lay;
  kvp_layer_layout_init(&lay);
  EXPECT_EQ(kvp_cache_get_layout(cache, 1, &lay), nullptr);
  return lay.v_data;
}

// Every bad argument of kvp_cache_pack alone: the caller's buffer (poisoned)
// and every cache keep their bytes.
TEST_F(BadInputCache, Pack) {
  uint64_t need = 0;
  ASSERT_KVP_OK(kvp_cache_pack_size(cache_, 3, 0, &need));
  std::vector<uint8_t> raw;
  uint8_t* const buf = Aligned16(&raw, need + 32, 0x5C);
  kvp_cache_config other = Config();
  other.k_dtype = KVP_DTYPE_FP8_E4M3;
  const std::vector<uint8_t> peer_sig = SignatureOf(Extra(other, false));
  auto args = [&](const std::vector<int32_t>& ids) {
    kvp_pack_args a;
    kvp_pack_args_init(&a);
    a.block_ids = ids.data();
    a.num_blocks = static_cast<int32_t>(ids.size());
    a.buffer = buf;
    a.buffer_bytes = need;
    return a;
  };
  const std::vector<uint8_t> poisoned = raw;
  for (const PackCase& c :
       PackCases(kLayers, kBlocks, need, peer_sig.data(), CacheMemory(cache_))) {
    SCOPED_TRACE(c.what);
    std::vector<int32_t> ids = {0, 1, 2};
    kvp_pack_args a = args(ids);
    c.mutate(&a, &ids);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_cache_pack(cache_, &a, nullptr));
    EXPECT_TRUE(raw == poisoned) << "a failed pack wrote into the buffer";
  }
  const std::vector<int32_t> ids = {0, 1, 2};
  kvp_pack_args a = args(ids);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_pack(nullptr, &a, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("args"),
                         kvp_cache_pack(cache_, nullptr, nullptr));
  EXPECT_TRUE(raw == poisoned);
  // The baseline is valid, and sources may repeat.
  ASSERT_KVP_OK(kvp_cache_pack(cache_, &a, nullptr));
  EXPECT_TRUE(raw != poisoned);
  const std::vector<int32_t> repeated = {2, 2, 0};
  a = args(repeated);
  ASSERT_KVP_OK(kvp_cache_pack(cache_, &a, nullptr));
}

// Every bad argument of kvp_cache_unpack alone, and destinations listed
// twice: no cache changes (free blocks 3..5 would show a partial unpack).
TEST_F(BadInputCache, Unpack) {
  uint64_t need = 0;
  ASSERT_KVP_OK(kvp_cache_pack_size(cache_, 3, 0, &need));
  std::vector<uint8_t> raw;
  uint8_t* const buf = Aligned16(&raw, need + 32, 0);
  const std::vector<int32_t> sources = {0, 1, 2};
  kvp_pack_args a;
  kvp_pack_args_init(&a);
  a.block_ids = sources.data();
  a.num_blocks = 3;
  a.buffer = buf;
  a.buffer_bytes = need;
  ASSERT_KVP_OK(kvp_cache_pack(cache_, &a, nullptr));  // real blocks to unpack
  kvp_cache_config other = Config();
  other.v_dtype = KVP_DTYPE_INT8;
  const std::vector<uint8_t> peer_sig = SignatureOf(Extra(other, false));
  std::vector<PackCase> cases =
      PackCases(kLayers, kBlocks, need, peer_sig.data(), CacheMemory(cache_));
  cases.push_back({"a destination twice",
                   [](kvp_pack_args*, std::vector<int32_t>* ids) { (*ids)[2] = (*ids)[0]; },
                   Msg("block_ids[2]", "3", "block_ids[0]")});
  cases.push_back({"a destination twice, adjacent",
                   [](kvp_pack_args*, std::vector<int32_t>* ids) { (*ids)[2] = (*ids)[1]; },
                   Msg("block_ids[2]", "4", "block_ids[1]")});
  for (const PackCase& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<int32_t> ids = {3, 4, 5};
    a.block_ids = ids.data();
    kvp_pack_args bad = a;
    c.mutate(&bad, &ids);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_cache_unpack(cache_, &bad, nullptr));
  }
  const std::vector<int32_t> ids = {3, 4, 5};
  a.block_ids = ids.data();
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_unpack(nullptr, &a, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("args"),
                         kvp_cache_unpack(cache_, nullptr, nullptr));
  ASSERT_KVP_OK(kvp_cache_unpack(cache_, &a, nullptr));  // the baseline is valid
}

TEST_F(BadInputCache, FormatSignature) {
  std::vector<uint8_t> sig(KVP_FORMAT_SIGNATURE_BYTES + 8, 0x77);
  const std::vector<uint8_t> untouched = sig;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_cache_format_signature(nullptr, sig.data(), sig.size()));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("signature"),
                         kvp_cache_format_signature(cache_, nullptr, sig.size()));
  for (size_t n : {size_t{0}, size_t{KVP_FORMAT_SIGNATURE_BYTES - 1}}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("signature_bytes", S(int64_t(n))),
                           kvp_cache_format_signature(cache_, sig.data(), n));
  }
  EXPECT_TRUE(sig == untouched);
  ASSERT_KVP_OK(kvp_cache_format_signature(cache_, sig.data(), KVP_FORMAT_SIGNATURE_BYTES));
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
      kvp_cache_check_signature(nullptr, sig.data(), KVP_FORMAT_SIGNATURE_BYTES));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("signature"),
                         kvp_cache_check_signature(cache_, nullptr, KVP_FORMAT_SIGNATURE_BYTES));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("signature_bytes", "3"),
                         kvp_cache_check_signature(cache_, sig.data(), 3));
  ASSERT_KVP_OK(kvp_cache_check_signature(cache_, sig.data(), KVP_FORMAT_SIGNATURE_BYTES));
}

// The decode configuration matrix, for kvp_decode_workspace_size and
// kvp_decoder_create alike.
struct DecodeConfigCase {
  const char* what;
  std::function<void(kvp_decode_config*)> mutate;
  Needles needles;
};

std::vector<DecodeConfigCase> DecodeConfigCases(int32_t max_context) {
  return {
      {"struct_size 0", [](kvp_decode_config* c) { c->struct_size = 0; }, Msg("struct_size", "0")},
      {"struct_size 8", [](kvp_decode_config* c) { c->struct_size = 8; }, Msg("struct_size", "8")},
      {"struct_size first released - 8",
       [](kvp_decode_config* c) { c->struct_size = KVP_DECODE_CONFIG_STRUCT_SIZE_1_0 - 8; },
       Msg("struct_size", S(KVP_DECODE_CONFIG_STRUCT_SIZE_1_0 - 8))},
      {"num_query_heads 0", [](kvp_decode_config* c) { c->num_query_heads = 0; },
       Msg("num_query_heads", "0")},
      {"num_query_heads -4", [](kvp_decode_config* c) { c->num_query_heads = -4; },
       Msg("num_query_heads", "-4")},
      {"num_query_heads 3 (kv heads 2)", [](kvp_decode_config* c) { c->num_query_heads = 3; },
       Msg("num_query_heads", "3")},
      {"num_query_heads 5 (kv heads 2)", [](kvp_decode_config* c) { c->num_query_heads = 5; },
       Msg("num_query_heads", "5")},
      {"max_num_seqs 0", [](kvp_decode_config* c) { c->max_num_seqs = 0; },
       Msg("max_num_seqs", "0")},
      {"max_num_seqs -1", [](kvp_decode_config* c) { c->max_num_seqs = -1; },
       Msg("max_num_seqs", "-1")},
      {"max_context_len 0", [](kvp_decode_config* c) { c->max_context_len = 0; },
       Msg("max_context_len", "0")},
      {"max_context_len -5", [](kvp_decode_config* c) { c->max_context_len = -5; },
       Msg("max_context_len", "-5")},
      {"max_query_len 0", [](kvp_decode_config* c) { c->max_query_len = 0; },
       Msg("max_query_len", "0")},
      {"max_query_len > max_context_len",
       [max_context](kvp_decode_config* c) { c->max_query_len = max_context + 1; },
       Msg("max_query_len", S(max_context + 1))},
      {"q_dtype 99", [](kvp_decode_config* c) { c->q_dtype = 99; }, Msg("q_dtype", "99")},
      {"q_dtype INT8", [](kvp_decode_config* c) { c->q_dtype = KVP_DTYPE_INT8; },
       Msg("q_dtype", "4")},
      {"q_dtype FP8", [](kvp_decode_config* c) { c->q_dtype = KVP_DTYPE_FP8_E4M3; },
       Msg("q_dtype", "3")},
      {"out_dtype 99", [](kvp_decode_config* c) { c->out_dtype = 99; }, Msg("out_dtype", "99")},
      {"out_dtype INT4", [](kvp_decode_config* c) { c->out_dtype = KVP_DTYPE_INT4; },
       Msg("out_dtype", "5")},
      {"out_dtype -1", [](kvp_decode_config* c) { c->out_dtype = -1; }, Msg("out_dtype", "-1")},
      {"precise 2", [](kvp_decode_config* c) { c->precise = 2; }, Msg("precise", "2")},
      {"precise -1", [](kvp_decode_config* c) { c->precise = -1; }, Msg("precise", "-1")},
  };
}

TEST_F(BadInputCache, DecodeWorkspaceSize) {
  kvp_decode_config dc = DecodeConfig();
  uint64_t bytes = 0xDEADBEEFull;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_decode_workspace_size(nullptr, &dc, &bytes));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("config"),
                         kvp_decode_workspace_size(cache_, nullptr, &bytes));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("bytes"),
                         kvp_decode_workspace_size(cache_, &dc, nullptr));
  for (const DecodeConfigCase& c : DecodeConfigCases(kMaxContext)) {
    SCOPED_TRACE(c.what);
    dc = DecodeConfig();
    c.mutate(&dc);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_decode_workspace_size(cache_, &dc, &bytes));
  }
  EXPECT_EQ(bytes, 0xDEADBEEFull);
}

TEST_F(BadInputCache, DecoderCreate) {
  kvp_decode_config dc = DecodeConfig();
  kvp_decoder* out = reinterpret_cast<kvp_decoder*>(0x1);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("cache"),
                         kvp_decoder_create(nullptr, &dc, &out));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("config"),
                         kvp_decoder_create(cache_, nullptr, &out));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("decoder"),
                         kvp_decoder_create(cache_, &dc, nullptr));
  for (const DecodeConfigCase& c : DecodeConfigCases(kMaxContext)) {
    SCOPED_TRACE(c.what);
    dc = DecodeConfig();
    c.mutate(&dc);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_decoder_create(cache_, &dc, &out));
  }
  // A caller workspace that is not 256-byte aligned.
  alignas(256) static unsigned char workspace[4096];
  dc = DecodeConfig();
  dc.workspace = workspace + 8;
  dc.workspace_bytes = sizeof(workspace) - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("workspace"),
                         kvp_decoder_create(cache_, &dc, &out));
  EXPECT_EQ(out, reinterpret_cast<kvp_decoder*>(0x1));
}

TEST_F(BadInputCache, Decode) {
  kvp_decode_args a = Args();
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("decoder"),
                         kvp_decode(nullptr, &a, nullptr));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("args"),
                         kvp_decode(decoder_, nullptr, nullptr));

  struct Case {
    const char* what;
    std::function<void(kvp_decode_args*)> mutate;
    Needles needles;
  };
  const std::vector<Case> cases = {
      {"struct_size 0", [](kvp_decode_args* d) { d->struct_size = 0; }, Msg("struct_size", "0")},
      {"struct_size 8", [](kvp_decode_args* d) { d->struct_size = 8; }, Msg("struct_size", "8")},
      {"struct_size sizeof-8",
       [](kvp_decode_args* d) { d->struct_size = sizeof(kvp_decode_args) - 8; },
       Msg("struct_size", S(sizeof(kvp_decode_args) - 8))},
      {"reserved0", [](kvp_decode_args* d) { d->reserved0 = 3; }, Msg("reserved0", "3")},
      {"layer -1", [](kvp_decode_args* d) { d->layer = -1; }, Msg("layer", "-1")},
      {"layer num_layers", [](kvp_decode_args* d) { d->layer = kLayers; },
       Msg("layer", S(kLayers))},
      {"num_seqs -1", [](kvp_decode_args* d) { d->num_seqs = -1; }, Msg("num_seqs", "-1")},
      {"num_seqs > max_num_seqs", [](kvp_decode_args* d) { d->num_seqs = kMaxSeqs + 1; },
       Msg("num_seqs", S(kMaxSeqs + 1))},
      {"query_len 0", [](kvp_decode_args* d) { d->query_len = 0; }, Msg("query_len", "0")},
      {"query_len -1", [](kvp_decode_args* d) { d->query_len = -1; }, Msg("query_len", "-1")},
      {"query_len > max_query_len", [](kvp_decode_args* d) { d->query_len = kMaxQueryLen + 1; },
       Msg("query_len", S(kMaxQueryLen + 1))},
      {"sliding_window -1", [](kvp_decode_args* d) { d->sliding_window = -1; },
       Msg("sliding_window", "-1")},
      {"sm_scale NaN", [](kvp_decode_args* d) { d->sm_scale = kNaN; }, Msg("sm_scale", "nan")},
      {"sm_scale -1", [](kvp_decode_args* d) { d->sm_scale = -1.0f; }, Msg("sm_scale", "-1")},
      {"sm_scale +Inf", [](kvp_decode_args* d) { d->sm_scale = kInf; }, Msg("sm_scale", "inf")},
      {"soft cap NaN", [](kvp_decode_args* d) { d->logits_soft_cap = kNaN; },
       Msg("logits_soft_cap", "nan")},
      {"soft cap -1", [](kvp_decode_args* d) { d->logits_soft_cap = -1.0f; },
       Msg("logits_soft_cap", "-1")},
      {"soft cap +Inf", [](kvp_decode_args* d) { d->logits_soft_cap = kInf; },
       Msg("logits_soft_cap", "inf")},
      {"soft cap -Inf", [](kvp_decode_args* d) { d->logits_soft_cap = -kInf; },
       Msg("logits_soft_cap", "-inf")},
      {"q stride < dense", [](kvp_decode_args* d) { d->q_token_stride = kQDense - 1; },
       Msg("q_token_stride", S(kQDense - 1))},
      {"q stride -1", [](kvp_decode_args* d) { d->q_token_stride = -1; },
       Msg("q_token_stride", "-1")},
      {"out stride < dense", [](kvp_decode_args* d) { d->out_token_stride = kQDense - 1; },
       Msg("out_token_stride", S(kQDense - 1))},
      {"out stride -1", [](kvp_decode_args* d) { d->out_token_stride = -1; },
       Msg("out_token_stride", "-1")},
      {"block_table_width 0", [](kvp_decode_args* d) { d->block_table_width = 0; },
       Msg("block_table_width", "0")},
      {"block_table_width -1", [](kvp_decode_args* d) { d->block_table_width = -1; },
       Msg("block_table_width", "-1")},
      {"block_table_stride < width", [](kvp_decode_args* d) { d->block_table_stride = kWidth - 2; },
       Msg("block_table_stride", S(kWidth - 2))},
      {"block_table_stride -1", [](kvp_decode_args* d) { d->block_table_stride = -1; },
       Msg("block_table_stride", "-1")},
      {"q NULL", [](kvp_decode_args* d) { d->q = nullptr; }, Msg("q")},
      {"block_table NULL", [](kvp_decode_args* d) { d->block_table = nullptr; },
       Msg("block_table")},
      {"seq_lens NULL", [](kvp_decode_args* d) { d->seq_lens = nullptr; }, Msg("seq_lens")},
      {"out NULL", [](kvp_decode_args* d) { d->out = nullptr; }, Msg("out")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    a = Args();
    c.mutate(&a);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles, kvp_decode(decoder_, &a, nullptr));
  }

  // Lengths: past max_context_len (the table is wide enough), past the
  // table's width (max_context_len is large enough), negative. The bad entry
  // is in the last sequence so that earlier sequences would already be output.
  const std::vector<int32_t> good_lens = lens_;
  const struct {
    const char* what;
    int32_t len;
    int32_t width;
  } kBadLens[] = {
      {"seq_lens > max_context_len", kMaxContext + 1, kWidth},
      {"seq_lens > width * block_size", kBlockSize + 1, 1},
      {"seq_lens > width * block_size (2)", 2 * kBlockSize + 1, 2},
      {"seq_lens -1", -1, kWidth},
      {"seq_lens INT32_MIN", kI32Min, kWidth},
      {"seq_lens INT32_MAX", kI32Max, kWidth},
  };
  for (const auto& bad : kBadLens) {
    SCOPED_TRACE(bad.what);
    lens_ = {std::min(good_lens[0], bad.width * kBlockSize), bad.len};
    a = Args();
    a.block_table_width = bad.width;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("seq_lens", S(bad.len)),
                           kvp_decode(decoder_, &a, nullptr));
  }
  lens_ = good_lens;

  // Block ids out of range, among the blocks a sequence's length uses.
  const std::vector<int32_t> good_table = table_;
  const struct {
    int32_t index;  // into table_
    int32_t id;
  } kBadIds[] = {
      {1, -1},            // a's second block
      {0, kBlocks},       // a's first block
      {kWidth, kI32Min},  // b's only block
      {kWidth, kBlocks + 100},
      {1, kI32Max},
  };
  for (const auto& bad : kBadIds) {
    table_ = good_table;
    table_[bad.index] = bad.id;
    a = Args();
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("block_table", S(bad.id)),
                           kvp_decode(decoder_, &a, nullptr));
  }
  // Entries past a sequence's blocks are never read, whatever they hold.
  table_ = good_table;
  table_[4] = -1;
  table_[kWidth + 3] = kBlocks + 7;
  a = Args();
  ASSERT_KVP_OK(kvp_decode(decoder_, &a, nullptr));
  for (size_t i = 0; i < static_cast<size_t>(a.num_seqs) * kQDense; ++i) {
    EXPECT_TRUE(std::isfinite(out_[i])) << i;
  }
}

// ---- The rest of the matrix: extreme values of every integer parameter, ----
// ---- struct sizes just below the first released ones, strides whose     ----
// ---- rows would overflow, capacities whose workspace would (issue 7)    ----

// ABI 1.0 sizes: a struct smaller than its first release is refused,
// whatever later minors append.
constexpr size_t kFirstCacheInfo = 64, kFirstWriteStats = 24, kFirstLayout = 176;
constexpr size_t kFirstWriteArgs = 64, kFirstDecodeConfig = 48, kFirstDecodeArgs = 112;

TEST(ApiStructs, InitFunctionsAndVersionQueriesAcceptNull) {
  kvp_allocator_init(nullptr);
  kvp_cache_config_init(nullptr);
  kvp_layer_layout_init(nullptr);
  kvp_cache_info_init(nullptr);
  kvp_write_args_init(nullptr);
  kvp_write_stats_init(nullptr);
  kvp_decode_config_init(nullptr);
  kvp_decode_args_init(nullptr);
  kvp_attend_args_init(nullptr);
  kvp_pack_args_init(nullptr);
  kvp_abi_version(nullptr, nullptr);
  uint32_t major = 99;
  kvp_abi_version(&major, nullptr);
  EXPECT_EQ(major, static_cast<uint32_t>(KVP_ABI_MAJOR));
  uint32_t minor = 99;
  kvp_abi_version(nullptr, &minor);
  EXPECT_EQ(minor, static_cast<uint32_t>(KVP_ABI_MINOR));
}

TEST(BadInputCacheCreate, ExtremeValuesOfEveryField) {
  const std::vector<ConfigCase> cases = {
      {"struct_size 1", [](kvp_cache_config* c) { c->struct_size = 1; }, Msg("struct_size", "1")},
      {"num_layers INT32_MIN", [](kvp_cache_config* c) { c->num_layers = kI32Min; },
       Msg("num_layers", S(kI32Min))},
      {"num_blocks INT32_MIN", [](kvp_cache_config* c) { c->num_blocks = kI32Min; },
       Msg("num_blocks", S(kI32Min))},
      {"num_blocks INT32_MAX", [](kvp_cache_config* c) { c->num_blocks = kI32Max; },
       Msg("num_blocks", S(kI32Max))},
      {"block_size INT32_MIN", [](kvp_cache_config* c) { c->block_size = kI32Min; },
       Msg("block_size", S(kI32Min))},
      {"block_size INT32_MAX", [](kvp_cache_config* c) { c->block_size = kI32Max; },
       Msg("block_size", S(kI32Max))},
      {"block_size 1", [](kvp_cache_config* c) { c->block_size = 1; }, Msg("block_size", "1")},
      {"num_kv_heads INT32_MIN", [](kvp_cache_config* c) { c->num_kv_heads = kI32Min; },
       Msg("num_kv_heads", S(kI32Min))},
      {"num_kv_heads INT32_MAX", [](kvp_cache_config* c) { c->num_kv_heads = kI32Max; },
       Msg("num_kv_heads", S(kI32Max))},
      {"head_size INT32_MIN", [](kvp_cache_config* c) { c->head_size = kI32Min; },
       Msg("head_size", S(kI32Min))},
      {"head_size INT32_MAX", [](kvp_cache_config* c) { c->head_size = kI32Max; },
       Msg("head_size", S(kI32Max))},
      {"head_size 65", [](kvp_cache_config* c) { c->head_size = 65; }, Msg("head_size", "65")},
      {"k_dtype INT32_MIN", [](kvp_cache_config* c) { c->k_dtype = kI32Min; },
       Msg("k_dtype", S(kI32Min))},
      {"k_dtype INT32_MAX", [](kvp_cache_config* c) { c->k_dtype = kI32Max; },
       Msg("k_dtype", S(kI32Max))},
      {"v_dtype INT32_MIN", [](kvp_cache_config* c) { c->v_dtype = kI32Min; },
       Msg("v_dtype", S(kI32Min))},
      {"v_dtype INT32_MAX", [](kvp_cache_config* c) { c->v_dtype = kI32Max; },
       Msg("v_dtype", S(kI32Max))},
      {"device_kind INT32_MIN", [](kvp_cache_config* c) { c->device_kind = kI32Min; },
       Msg("device_kind", S(kI32Min))},
      {"device_kind INT32_MAX", [](kvp_cache_config* c) { c->device_kind = kI32Max; },
       Msg("device_kind", S(kI32Max))},
      {"device_ordinal INT32_MIN", [](kvp_cache_config* c) { c->device_ordinal = kI32Min; },
       Msg("device_ordinal", S(kI32Min))},
      {"reserved0 INT32_MAX", [](kvp_cache_config* c) { c->reserved0 = kI32Max; },
       Msg("reserved0", S(kI32Max))},
      {"reserved0 INT32_MIN", [](kvp_cache_config* c) { c->reserved0 = kI32Min; },
       Msg("reserved0", S(kI32Min))},
  };
  for (const ConfigCase& cc : cases) {
    SCOPED_TRACE(cc.what);
    kvp_cache_config cfg = SmallConfig();
    cc.mutate(&cfg);
    kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
    CheckError(kvp_cache_create(&cfg, &out), KVP_ERR_INVALID_ARGUMENT, cc.needles);
    EXPECT_EQ(out, reinterpret_cast<kvp_cache*>(0x1));
  }
}

TEST_F(BadInputCache, StructSizesJustBelowTheFirstRelease) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  info.struct_size = kFirstCacheInfo - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT,
                         Msg("info", "struct_size", S(kFirstCacheInfo - 8)),
                         kvp_cache_get_info(cache_, &info));
  kvp_write_stats st;
  kvp_write_stats_init(&st);
  st.struct_size = kFirstWriteStats - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT,
                         Msg("stats", "struct_size", S(kFirstWriteStats - 8)),
                         kvp_cache_get_write_stats(cache_, &st));
  kvp_layer_layout lay;
  kvp_layer_layout_init(&lay);
  lay.struct_size = kFirstLayout - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT,
                         Msg("layout", "struct_size", S(kFirstLayout - 8)),
                         kvp_cache_get_layout(cache_, 0, &lay));
  for (int32_t layer : {kI32Max, -2}) {
    kvp_layer_layout_init(&lay);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("layer", S(layer)),
                           kvp_cache_get_layout(cache_, layer, &lay));
  }
  kvp_write_args w;
  kvp_write_args_init(&w);
  w.struct_size = kFirstWriteArgs - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("struct_size", S(kFirstWriteArgs - 8)),
                         kvp_cache_write(cache_, &w, nullptr));
  kvp_decode_config dc = DecodeConfig();
  dc.struct_size = kFirstDecodeConfig - 8;
  uint64_t bytes = 77;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("struct_size", S(kFirstDecodeConfig - 8)),
                         kvp_decode_workspace_size(cache_, &dc, &bytes));
  kvp_decoder* dec = reinterpret_cast<kvp_decoder*>(0x1);
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("struct_size", S(kFirstDecodeConfig - 8)),
                         kvp_decoder_create(cache_, &dc, &dec));
  EXPECT_EQ(bytes, 77u);
  EXPECT_EQ(dec, reinterpret_cast<kvp_decoder*>(0x1));
  kvp_decode_args a = Args();
  a.struct_size = kFirstDecodeArgs - 8;
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("struct_size", S(kFirstDecodeArgs - 8)),
                         kvp_decode(decoder_, &a, nullptr));
}

TEST_F(BadInputCache, SequenceAndTableExtremes) {
  // b holds 7 tokens: these reach INT32_MAX exactly, or not quite, and
  // need more blocks than the cache has.
  for (int32_t n : {kI32Max - 7, kI32Max - 100}) {
    EXPECT_FAILS_UNCHANGED(KVP_ERR_OUT_OF_BLOCKS, Msg(S(n)),
                           kvp_seq_append(cache_, b_, n, nullptr, nullptr));
  }
  // One more token than INT32_MAX can hold.
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg(S(kI32Max - 6)),
                         kvp_seq_append(cache_, b_, kI32Max - 6, nullptr, nullptr));
  std::vector<int32_t> table(2 * 4, -555), lens(2, -555);
  const int64_t ids[2] = {a_, b_};
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("max_blocks_per_seq", S(kI32Min)),
      kvp_cache_export_block_table(cache_, ids, 2, kI32Min, 4, table.data(), lens.data()));
  EXPECT_FAILS_UNCHANGED(
      KVP_ERR_INVALID_ARGUMENT, Msg("row_stride", S(kI64Min)),
      kvp_cache_export_block_table(cache_, ids, 2, 4, kI64Min, table.data(), lens.data()));
  EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, Msg("num_pairs", S(kI32Min)),
                         kvp_cache_transfer_blocks(cache_, cache_, nullptr, kI32Min, nullptr));
  EXPECT_EQ(table, std::vector<int32_t>(8, -555));
  EXPECT_EQ(lens, std::vector<int32_t>(2, -555));
}

TEST_F(BadInputCache, WriteExtremesAndOverflowingStrides) {
  const int32_t n = 3;
  const std::vector<float> k = Randn(n * kDense), v = Randn(n * kDense);
  const std::vector<int64_t> slots = {5, 17, 3};
  auto args = [&] {
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.num_tokens = n;
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = k.data();
    w.value = v.data();
    w.slot_mapping = slots.data();
    return w;
  };
  struct Case {
    const char* what;
    std::function<void(kvp_write_args*)> mutate;
    Needles needles;
  };
  const std::vector<Case> cases = {
      {"layer INT32_MIN", [](kvp_write_args* a) { a->layer = kI32Min; }, Msg("layer", S(kI32Min))},
      {"layer INT32_MAX", [](kvp_write_args* a) { a->layer = kI32Max; }, Msg("layer", S(kI32Max))},
      {"num_tokens INT32_MIN", [](kvp_write_args* a) { a->num_tokens = kI32Min; },
       Msg("num_tokens", S(kI32Min))},
      {"input_dtype INT32_MIN", [](kvp_write_args* a) { a->input_dtype = kI32Min; },
       Msg("input_dtype", S(kI32Min))},
      {"input_dtype INT32_MAX", [](kvp_write_args* a) { a->input_dtype = kI32Max; },
       Msg("input_dtype", S(kI32Max))},
      {"reserved0 INT32_MIN", [](kvp_write_args* a) { a->reserved0 = kI32Min; },
       Msg("reserved0", S(kI32Min))},
      {"key_token_stride INT64_MIN", [](kvp_write_args* a) { a->key_token_stride = kI64Min; },
       Msg("key_token_stride", S(kI64Min))},
      {"value_token_stride INT64_MIN", [](kvp_write_args* a) { a->value_token_stride = kI64Min; },
       Msg("value_token_stride", S(kI64Min))},
      // Strides each valid alone whose last row lies beyond any address.
      {"key_token_stride INT64_MAX", [](kvp_write_args* a) { a->key_token_stride = kI64Max; },
       Msg("key_token_stride", S(kI64Max))},
      {"key_token_stride 2^62", [](kvp_write_args* a) { a->key_token_stride = int64_t{1} << 62; },
       Msg("key_token_stride", S(int64_t{1} << 62))},
      {"value_token_stride 2^56",
       [](kvp_write_args* a) { a->value_token_stride = int64_t{1} << 56; },
       Msg("value_token_stride", S(int64_t{1} << 56))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    kvp_write_args w = args();
    c.mutate(&w);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_cache_write(cache_, &w, nullptr));
  }
  kvp_write_args w = args();
  ASSERT_KVP_OK(kvp_cache_write(cache_, &w, nullptr));  // the baseline is valid
}

TEST_F(BadInputCache, DecodeConfigExtremesAndOverflowingCapacities) {
  const std::vector<DecodeConfigCase> cases = {
      {"num_query_heads INT32_MIN", [](kvp_decode_config* c) { c->num_query_heads = kI32Min; },
       Msg("num_query_heads", S(kI32Min))},
      {"num_query_heads INT32_MAX", [](kvp_decode_config* c) { c->num_query_heads = kI32Max; },
       Msg("num_query_heads", S(kI32Max))},
      {"max_num_seqs INT32_MIN", [](kvp_decode_config* c) { c->max_num_seqs = kI32Min; },
       Msg("max_num_seqs", S(kI32Min))},
      {"max_context_len INT32_MIN", [](kvp_decode_config* c) { c->max_context_len = kI32Min; },
       Msg("max_context_len", S(kI32Min))},
      {"max_query_len INT32_MIN", [](kvp_decode_config* c) { c->max_query_len = kI32Min; },
       Msg("max_query_len", S(kI32Min))},
      {"max_query_len INT32_MAX", [](kvp_decode_config* c) { c->max_query_len = kI32Max; },
       Msg("max_query_len", S(kI32Max))},
      {"q_dtype INT32_MIN", [](kvp_decode_config* c) { c->q_dtype = kI32Min; },
       Msg("q_dtype", S(kI32Min))},
      {"out_dtype INT32_MAX", [](kvp_decode_config* c) { c->out_dtype = kI32Max; },
       Msg("out_dtype", S(kI32Max))},
      // Each capacity valid alone; together a workspace past 2^56 bytes.
      {"capacities overflow (seqs x context)",
       [](kvp_decode_config* c) {
         c->max_num_seqs = kI32Max;
         c->max_context_len = kI32Max;
       },
       Msg("max_num_seqs", S(kI32Max), "max_context_len")},
      {"capacities overflow (heads x queries)",
       [](kvp_decode_config* c) {
         c->num_query_heads = 1 << 30;
         c->max_context_len = 1 << 30;
         c->max_query_len = 1 << 20;
       },
       Msg("num_query_heads", S(1 << 30), "max_query_len", S(1 << 20))},
  };
  for (const DecodeConfigCase& c : cases) {
    SCOPED_TRACE(c.what);
    kvp_decode_config dc = DecodeConfig();
    c.mutate(&dc);
    uint64_t bytes = 0xDEADBEEFull;
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_decode_workspace_size(cache_, &dc, &bytes));
    EXPECT_EQ(bytes, 0xDEADBEEFull);
    kvp_decoder* out = reinterpret_cast<kvp_decoder*>(0x1);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles,
                           kvp_decoder_create(cache_, &dc, &out));
    EXPECT_EQ(out, reinterpret_cast<kvp_decoder*>(0x1));
  }
}

TEST_F(BadInputCache, DecodeExtremesAndOverflowingStrides) {
  struct Case {
    const char* what;
    std::function<void(kvp_decode_args*)> mutate;
    Needles needles;
  };
  const std::vector<Case> cases = {
      {"layer INT32_MIN", [](kvp_decode_args* d) { d->layer = kI32Min; }, Msg("layer", S(kI32Min))},
      {"layer INT32_MAX", [](kvp_decode_args* d) { d->layer = kI32Max; }, Msg("layer", S(kI32Max))},
      {"num_seqs INT32_MIN", [](kvp_decode_args* d) { d->num_seqs = kI32Min; },
       Msg("num_seqs", S(kI32Min))},
      {"num_seqs INT32_MAX", [](kvp_decode_args* d) { d->num_seqs = kI32Max; },
       Msg("num_seqs", S(kI32Max))},
      {"query_len INT32_MIN", [](kvp_decode_args* d) { d->query_len = kI32Min; },
       Msg("query_len", S(kI32Min))},
      {"query_len INT32_MAX", [](kvp_decode_args* d) { d->query_len = kI32Max; },
       Msg("query_len", S(kI32Max))},
      {"sliding_window INT32_MIN", [](kvp_decode_args* d) { d->sliding_window = kI32Min; },
       Msg("sliding_window", S(kI32Min))},
      {"sm_scale -Inf", [](kvp_decode_args* d) { d->sm_scale = -kInf; }, Msg("sm_scale", "-inf")},
      {"sm_scale -FLT_MAX",
       [](kvp_decode_args* d) { d->sm_scale = -std::numeric_limits<float>::max(); },
       Msg("sm_scale")},
      {"logits_soft_cap -FLT_MIN", [](kvp_decode_args* d) { d->logits_soft_cap = -1e-30f; },
       Msg("logits_soft_cap", "-1e-30")},
      {"reserved0 INT32_MIN", [](kvp_decode_args* d) { d->reserved0 = kI32Min; },
       Msg("reserved0", S(kI32Min))},
      {"q_token_stride INT64_MIN", [](kvp_decode_args* d) { d->q_token_stride = kI64Min; },
       Msg("q_token_stride", S(kI64Min))},
      {"out_token_stride INT64_MIN", [](kvp_decode_args* d) { d->out_token_stride = kI64Min; },
       Msg("out_token_stride", S(kI64Min))},
      {"block_table_width INT32_MIN", [](kvp_decode_args* d) { d->block_table_width = kI32Min; },
       Msg("block_table_width", S(kI32Min))},
      {"block_table_stride INT64_MIN", [](kvp_decode_args* d) { d->block_table_stride = kI64Min; },
       Msg("block_table_stride", S(kI64Min))},
      // Strides each valid alone whose second row lies beyond any address.
      {"q_token_stride INT64_MAX", [](kvp_decode_args* d) { d->q_token_stride = kI64Max; },
       Msg("q_token_stride", S(kI64Max))},
      {"q_token_stride 2^57", [](kvp_decode_args* d) { d->q_token_stride = int64_t{1} << 57; },
       Msg("q_token_stride", S(int64_t{1} << 57))},
      {"out_token_stride INT64_MAX", [](kvp_decode_args* d) { d->out_token_stride = kI64Max; },
       Msg("out_token_stride", S(kI64Max))},
      {"block_table_stride INT64_MAX", [](kvp_decode_args* d) { d->block_table_stride = kI64Max; },
       Msg("block_table_stride", S(kI64Max))},
      {"block_table_stride 2^60",
       [](kvp_decode_args* d) { d->block_table_stride = int64_t{1} << 60; },
       Msg("block_table_stride", S(int64_t{1} << 60))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    kvp_decode_args a = Args();
    c.mutate(&a);
    EXPECT_FAILS_UNCHANGED(KVP_ERR_INVALID_ARGUMENT, c.needles, kvp_decode(decoder_, &a, nullptr));
  }
  kvp_decode_args a = Args();
  ASSERT_KVP_OK(kvp_decode(decoder_, &a, nullptr));  // the baseline is valid
}

}  // namespace
