// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness of the C API (docs/RELIABILITY.md, "Fuzzing").
//
// The input bytes drive a sequence of C API calls on one or two CPU caches
// of random geometry: create, fork, append, truncate and free sequences,
// export block tables, write K/V (with NaN, Inf and huge values mixed in),
// decode, copy and transfer blocks, query layouts and statistics, create
// and destroy decoders and caches (through an engine allocator that may
// fail), with bad arguments mixed into every kind of call.
//
// A simple model predicts each call: which calls must fail and with which
// code, and what a successful one leaves behind. After every call the
// harness checks the library against the model:
//   - the error code is the predicted one (success included); an error has
//     a message;
//   - sequence lengths, block tables and reference counts (every block is
//     free or referenced by the sequences that hold it), the free-block
//     count; new blocks came from the free ones; ids are never reused;
//   - every byte of every layer: unchanged, except the bytes of the slots a
//     write names (INT4 V: the nibble), the blocks a copy or transfer
//     targets (equal to their sources afterwards) and the copy-on-write
//     block (equal to the block it replaces);
//   - write statistics: the non-finite count is exactly the number of
//     NaN/Inf inputs in written tokens, the saturated count never falls;
//   - a failed call writes nothing: out-parameters, caller buffers and
//     the cache keep their values;
//   - decode: finite outputs for finite queries, zeros and lse = -inf for
//     queries that see nothing, padding between strided rows untouched,
//     and a NaN or Inf in one sequence's query changes no other row;
//   - at the end: every sequence freed gives back every block; destroying
//     decoders and caches returns every byte to the engine allocator
//     (LeakSanitizer checks host memory).
// Any violation aborts with a message (libFuzzer saves the input).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvpage/kvpage.h"

namespace {

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int kMaxOps = 48;
// Sizes of the structs as first released (ABI 1.0): anything smaller is
// rejected, whatever later minors append.
constexpr size_t kCacheConfig10 = 64, kWriteArgs10 = 64, kDecodeArgs10 = 112;

std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

[[noreturn]] void Fail(int line, const std::string& what) {
  std::fprintf(stderr, "\nkvpage fuzz: invariant violated (capi_fuzz.cc:%d): %s\n", line,
               what.c_str());
  std::abort();
}

#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) Fail(__LINE__, #cond " -- " + Format(__VA_ARGS__)); \
  } while (0)

// Consumes an error object: its code (KVP_OK for NULL). An error carries a
// known code and a message.
int32_t Code(kvp_error* e) {
  if (e == nullptr) return KVP_OK;
  const int32_t code = kvp_error_code(e);
  const char* msg = kvp_error_message(e);
  const bool has_msg = msg != nullptr && msg[0] != '\0';
  const bool known = std::strcmp(kvp_error_code_name(code), "UNKNOWN") != 0 && code != KVP_OK;
  kvp_error_free(e);
  CHECK(has_msg, "error %d without a message", code);
  CHECK(known, "error with code %d", code);
  return code;
}

// The predicted outcome of a call.
void Expect(int line, const char* call, int32_t got, int32_t want) {
  if (got != want) {
    Fail(line, Format("%s returned %s, the model expected %s", call, kvp_error_code_name(got),
                      kvp_error_code_name(want)));
  }
}
#define EXPECT_CODE(call, got, want) Expect(__LINE__, call, got, want)

// ---- Engine allocator that counts, checks and may fail --------------------------------

struct TrackingAllocator {
  std::map<void*, size_t> live;
  int64_t calls = 0;
  int64_t fail_at = 0;  // 1-based call that returns NULL; 0 = never
};

void* TrackAlloc(void* user, size_t bytes, size_t alignment, int32_t kind, int32_t ordinal) {
  auto* t = static_cast<TrackingAllocator*>(user);
  ++t->calls;
  CHECK(kind == KVP_DEVICE_CPU && ordinal == 0, "allocation for device %d:%d", kind, ordinal);
  CHECK(alignment >= 16 && (alignment & (alignment - 1)) == 0, "alignment %zu", alignment);
  CHECK(bytes > 0 && bytes < (size_t{1} << 40), "allocation of %zu bytes", bytes);
  if (t->calls == t->fail_at) return nullptr;
  const size_t a = std::max<size_t>(alignment, 64);
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  CHECK(p != nullptr, "host out of memory in the test allocator");
  t->live[p] = bytes;
  return p;
}

void TrackFree(void* user, void* ptr, size_t bytes, int32_t kind, int32_t ordinal) {
  auto* t = static_cast<TrackingAllocator*>(user);
  auto it = t->live.find(ptr);
  CHECK(it != t->live.end(), "free of %p, which the allocator never handed out (or twice)", ptr);
  CHECK(it->second == bytes, "free of %zu bytes at %p, allocated as %zu", bytes, ptr, it->second);
  CHECK(kind == KVP_DEVICE_CPU && ordinal == 0, "free for device %d:%d", kind, ordinal);
  t->live.erase(it);
  std::free(ptr);
}

// ---- Numbers -----------------------------------------------------------------------------

uint16_t HalfBits(float f) {  // round to nearest; inputs stay well inside FP16
  const float a = std::fabs(f);
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a < 6.2e-5f) return sign;
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = e - 1 + 15;
  if (exp >= 31) return sign | 0x7BFF;
  const uint32_t mant = static_cast<uint32_t>(std::lround((m * 2 - 1) * 1024));
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10)) + mant;
}

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

int ElemBytes(int32_t dtype) { return dtype == KVP_DTYPE_FP32 ? 4 : 2; }

bool IsNonFinite(int32_t dtype, const std::vector<uint8_t>& buf, int64_t i) {
  if (dtype == KVP_DTYPE_FP32) {
    float f;
    std::memcpy(&f, buf.data() + i * 4, 4);
    return !std::isfinite(f);
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + i * 2, 2);
  return dtype == KVP_DTYPE_FP16 ? (h & 0x7C00) == 0x7C00 : (h & 0x7F80) == 0x7F80;
}

double Load(int32_t dtype, const std::vector<uint8_t>& buf, int64_t i) {
  if (dtype == KVP_DTYPE_FP32) {
    float f;
    std::memcpy(&f, buf.data() + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + i * 2, 2);
  if (dtype == KVP_DTYPE_BF16) {
    const uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1 : 1;
  if (exp == 31) return mant ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Random values in a dtype, with specials (NaN, +-Inf, the largest finite
// values, subnormals, -0) at positions the input chooses.
class Values {
 public:
  explicit Values(uint64_t seed) : rng_(seed), state_(seed ^ 0x9E3779B97F4A7C15ull) {}
  std::mt19937_64& rng() { return rng_; }
  // Uniform in [-4, 4) (a fast generator: this is the harness's inner loop).
  float Normal() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<int32_t>(z >> 32)) * (4.0f / 2147483648.0f);
  }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::vector<uint8_t> Make(int32_t dtype, int64_t count) {
    std::vector<uint8_t> buf(static_cast<size_t>(count) * ElemBytes(dtype));
    for (int64_t i = 0; i < count; ++i) Put(dtype, &buf, i, Normal());
    return buf;
  }
  void Put(int32_t dtype, std::vector<uint8_t>* buf, int64_t i, float f) {
    if (dtype == KVP_DTYPE_FP32) {
      std::memcpy(buf->data() + i * 4, &f, 4);
    } else {
      const uint16_t h = dtype == KVP_DTYPE_FP16 ? HalfBits(f) : Bf16Bits(f);
      std::memcpy(buf->data() + i * 2, &h, 2);
    }
  }
  void PutBits(int32_t dtype, std::vector<uint8_t>* buf, int64_t i, uint32_t bits) {
    if (dtype == KVP_DTYPE_FP32) {
      std::memcpy(buf->data() + i * 4, &bits, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(bits);
      std::memcpy(buf->data() + i * 2, &h, 2);
    }
  }
  // One special value of `kind` (0..7) at element i.
  void Special(int32_t dtype, std::vector<uint8_t>* buf, int64_t i, int kind) {
    static const uint32_t kF32[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu,
                                    0xFF7FFFFFu, 0x00000001u, 0x80000000u, 0x7FA5A5A5u};
    static const uint32_t kF16[] = {0x7E00, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001, 0x8000, 0x7D01};
    static const uint32_t kBf16[] = {0x7FC0, 0x7F80, 0xFF80, 0x7F7F,
                                     0xFF7F, 0x0001, 0x8000, 0xFFA5};
    const uint32_t* table = dtype == KVP_DTYPE_FP32 ? kF32 : dtype == KVP_DTYPE_FP16 ? kF16 : kBf16;
    PutBits(dtype, buf, i, table[kind & 7]);
  }

 private:
  std::mt19937_64 rng_;
  uint64_t state_;
};

// ---- The model of one cache -----------------------------------------------------------

struct Seq {
  int32_t len = 0;
  std::vector<int32_t> blocks;
};

struct DecoderModel {
  kvp_decoder* dec = nullptr;
  kvp_decode_config cfg;
};

struct Geometry {
  int32_t layers = 1, blocks = 1, block_size = 16, kv_heads = 1, head_size = 64;
  int32_t k_dtype = KVP_DTYPE_BF16, v_dtype = KVP_DTYPE_BF16;
  bool smoothing = false;
  // The key-smoothing vector when `smoothing`: transfers need equal ones.
  std::vector<float> lambda;
  int64_t dense() const { return int64_t{kv_heads} * head_size; }
  int64_t slots() const { return int64_t{blocks} * block_size; }
};

struct Region {
  uint8_t* ptr;
  int64_t bytes;
  int64_t block_stride;
};

struct CacheModel {
  kvp_cache* cache = nullptr;
  Geometry g;
  std::unique_ptr<TrackingAllocator> alloc;
  std::map<int64_t, Seq> seqs;
  std::vector<int64_t> stale;
  int64_t max_id = 0;
  std::vector<kvp_layer_layout> layouts;  // per layer
  std::vector<Region> regions;            // per layer: K, V, K scales, V scales
  std::vector<uint8_t> shadow;            // what every region should hold, back to back
  uint64_t non_finite = 0, saturated = 0;
  std::vector<DecoderModel> decoders;

  std::vector<int32_t> RefCounts() const {
    std::vector<int32_t> refs(g.blocks, 0);
    for (const auto& kv : seqs) {
      for (int32_t b : kv.second.blocks) ++refs[b];
    }
    return refs;
  }
  int32_t NumFree() const {
    int32_t n = 0;
    for (int32_t r : RefCounts()) n += r == 0;
    return n;
  }
  // Offset in the shadow of region r of layer l.
  int64_t RegionOffset(int l, int r) const {
    int64_t off = 0;
    for (int i = 0; i < l * 4 + r; ++i) off += regions[i].bytes;
    return off;
  }
};

// ---- The harness ----------------------------------------------------------------------

class Harness {
 public:
  explicit Harness(FuzzedDataProvider& in) : in_(in), values_(in.ConsumeIntegral<uint64_t>()) {}

  void Run() {
    // The first cache always exists (unless the allocator fails it: then
    // the rest of the input works on a second attempt).
    NewCache(0);
    if (caches_[0].cache == nullptr) NewCache(0);
    if (caches_[0].cache == nullptr) return;
    for (int op = 0; op < kMaxOps && in_.remaining_bytes() > 0; ++op) {
      Step();
      for (CacheModel& c : caches_) {
        if (c.cache != nullptr) CheckCache(c);
      }
    }
    for (CacheModel& c : caches_) Teardown(c);
  }

 private:
  // ---- Choosing things -------------------------------------------------------------------

  bool OneIn(int n) { return in_.ConsumeIntegralInRange<int>(0, n - 1) == 0; }
  int Pick(int lo, int hi) { return in_.ConsumeIntegralInRange<int>(lo, hi); }

  CacheModel* AnyCache() {
    std::vector<CacheModel*> live;
    for (CacheModel& c : caches_) {
      if (c.cache != nullptr) live.push_back(&c);
    }
    if (live.empty()) return nullptr;
    return live[Pick(0, static_cast<int>(live.size()) - 1)];
  }

  // A sequence id: live (mostly), stale, or one that never existed.
  int64_t PickId(const CacheModel& c) {
    const int kind = Pick(0, 9);
    if (kind < 7 && !c.seqs.empty()) {
      auto it = c.seqs.begin();
      std::advance(it, Pick(0, static_cast<int>(c.seqs.size()) - 1));
      return it->first;
    }
    if (kind < 9 && !c.stale.empty()) return c.stale[Pick(0, static_cast<int>(c.stale.size()) - 1)];
    static const int64_t kBad[] = {0, -1, 987654321, std::numeric_limits<int64_t>::max(),
                                   std::numeric_limits<int64_t>::min()};
    return kBad[Pick(0, 4)];
  }

  // ---- Caches ----------------------------------------------------------------------------

  void NewCache(int index) {
    CacheModel& c = caches_[index];
    static const int32_t kHeadSizes[] = {64, 64, 64, 80, 96, 112, 128, 256};
    static const int32_t kBlockSizes[] = {8, 16, 32};
    Geometry g;
    g.layers = Pick(1, 2);
    g.blocks = Pick(1, 10);
    g.block_size = kBlockSizes[Pick(0, 2)];
    g.kv_heads = Pick(1, 2);
    g.head_size = kHeadSizes[Pick(0, 7)];
    g.k_dtype = Pick(KVP_DTYPE_FP16, KVP_DTYPE_INT4);
    g.v_dtype = Pick(KVP_DTYPE_FP16, KVP_DTYPE_INT4);
    g.smoothing = OneIn(4);
    // A second cache often shares the first one's geometry, so that
    // transfers between them can succeed.
    if (g.smoothing) {
      for (int64_t i = 0; i < g.dense(); ++i) g.lambda.push_back(std::exp(0.5f * values_.Normal()));
    }
    if (index == 1 && caches_[0].cache != nullptr && !OneIn(3)) {
      const int32_t blocks = g.blocks;
      std::vector<float> own = std::move(g.lambda);
      g = caches_[0].g;
      g.blocks = blocks;
      // Now and then another smoothing vector of the same shape: the
      // transfer is refused.
      if (g.smoothing && OneIn(4)) {
        own.resize(static_cast<size_t>(g.dense()), 1.0f);
        g.lambda = own;
      }
    }

    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.num_layers = g.layers;
    cfg.num_blocks = g.blocks;
    cfg.block_size = g.block_size;
    cfg.num_kv_heads = g.kv_heads;
    cfg.head_size = g.head_size;
    cfg.k_dtype = g.k_dtype;
    cfg.v_dtype = g.v_dtype;
    cfg.checked = OneIn(2) ? 1 : 0;  // the CPU backend checks on the host in both modes
    if (g.smoothing) cfg.key_smoothing = g.lambda.data();
    auto alloc = std::make_unique<TrackingAllocator>();
    kvp_allocator a;
    kvp_allocator_init(&a);
    a.user_data = alloc.get();
    a.alloc = TrackAlloc;
    a.free = TrackFree;
    const bool use_alloc = OneIn(2);
    if (use_alloc) {
      cfg.allocator = &a;
      alloc->fail_at = OneIn(6) ? 1 : 0;
    }

    // One bad field first, sometimes: the call fails and leaves no trace.
    int32_t want = KVP_OK;
    kvp_cache_config bad = cfg;
    const std::vector<float> lambda_before = g.lambda;
    switch (OneIn(3) ? Pick(1, 13) : 0) {
      case 1:
        bad.struct_size = Pick(0, 1) ? 0 : kCacheConfig10 - 8;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 2:
        bad.num_layers = Pick(0, 1) ? 0 : kI32Min;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 3:
        bad.num_blocks = -Pick(0, 3);
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 4:
        bad.block_size = Pick(0, 1) ? 12 : 64;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 5:
        bad.num_kv_heads = -Pick(0, 2);
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 6:
        bad.head_size = Pick(0, 1) ? 72 : 0;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 7:
        bad.k_dtype = Pick(0, 1) ? KVP_DTYPE_FP32 : 6;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 8:
        bad.v_dtype = Pick(0, 1) ? -1 : 99;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 9:
        bad.reserved0 = 1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 10:
        bad.device_kind = Pick(0, 1) ? 2 : -1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 11:
        if (g.smoothing) {
          g.lambda[Pick(0, static_cast<int>(g.lambda.size()) - 1)] = Pick(0, 1) ? 0.0f : NAN;
          want = KVP_ERR_INVALID_ARGUMENT;
        }
        break;
      case 12:
        bad.num_blocks = kI32Max / bad.block_size + 1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 13:
        bad.checked = Pick(0, 1) ? 2 : -1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      default:
        break;
    }
    if (want != KVP_OK) {
      kvp_cache* out = reinterpret_cast<kvp_cache*>(0x1);
      EXPECT_CODE("kvp_cache_create(bad config)", Code(kvp_cache_create(&bad, &out)), want);
      CHECK(out == reinterpret_cast<kvp_cache*>(0x1), "a failed create wrote its out-parameter");
      CHECK(alloc->live.empty(), "a failed create kept engine memory");
      g.lambda = lambda_before;  // the mutated vector was only for the bad config
    }

    kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
    const int32_t got = Code(kvp_cache_create(&cfg, &cache));
    if (use_alloc && alloc->fail_at == 1) {
      EXPECT_CODE("kvp_cache_create(failing allocator)", got, KVP_ERR_OUT_OF_MEMORY);
      CHECK(cache == reinterpret_cast<kvp_cache*>(0x1), "a failed create wrote its out-parameter");
      CHECK(alloc->live.empty() && alloc->calls == 1, "allocator: %zu live, %lld calls",
            alloc->live.size(), static_cast<long long>(alloc->calls));
      return;
    }
    EXPECT_CODE("kvp_cache_create", got, KVP_OK);
    if (use_alloc) CHECK(alloc->live.size() == 1, "%zu engine allocations", alloc->live.size());

    c = CacheModel();
    c.cache = cache;
    c.g = g;
    if (use_alloc) c.alloc = std::move(alloc);
    for (int32_t l = 0; l < g.layers; ++l) {
      kvp_layer_layout lay;
      kvp_layer_layout_init(&lay);
      EXPECT_CODE("kvp_cache_get_layout", Code(kvp_cache_get_layout(cache, l, &lay)), KVP_OK);
      c.layouts.push_back(lay);
      c.regions.push_back(
          {static_cast<uint8_t*>(lay.k_data), lay.k_data_bytes, lay.k_block_stride});
      c.regions.push_back(
          {static_cast<uint8_t*>(lay.v_data), lay.v_data_bytes, lay.v_block_stride});
      c.regions.push_back({static_cast<uint8_t*>(lay.k_scales),
                           lay.k_scales ? lay.k_scale_bytes : 0, lay.k_scale_block_stride});
      c.regions.push_back({static_cast<uint8_t*>(lay.v_scales),
                           lay.v_scales ? lay.v_scale_bytes : 0, lay.v_scale_block_stride});
      CHECK(lay.k_data_bytes == lay.k_block_stride * g.blocks, "K region size");
      CHECK(lay.v_data_bytes == lay.v_block_stride * g.blocks, "V region size");
      if (c.alloc) {
        const auto& mem = *c.alloc->live.begin();
        const uint8_t* lo = static_cast<uint8_t*>(mem.first);
        for (int r = 0; r < 4; ++r) {
          const Region& reg = c.regions[l * 4 + r];
          if (reg.bytes == 0) continue;
          CHECK(reg.ptr >= lo && reg.ptr + reg.bytes <= lo + mem.second,
                "layer %d region %d lies outside the engine's allocation", l, r);
        }
      }
    }
    int64_t total = 0;
    for (const Region& r : c.regions) total += r.bytes;
    c.shadow.assign(static_cast<size_t>(total), 0);  // a new cache is zeroed
    CheckBytes(c, nullptr);
  }

  void Teardown(CacheModel& c) {
    if (c.cache == nullptr) return;
    // Free every sequence in an order the input picks: every block returns.
    while (!c.seqs.empty()) {
      auto it = c.seqs.begin();
      std::advance(it, in_.remaining_bytes() ? Pick(0, static_cast<int>(c.seqs.size()) - 1) : 0);
      EXPECT_CODE("kvp_seq_free", Code(kvp_seq_free(c.cache, it->first)), KVP_OK);
      c.seqs.erase(it);
    }
    int32_t num_free = -1;
    EXPECT_CODE("kvp_cache_num_free_blocks", Code(kvp_cache_num_free_blocks(c.cache, &num_free)),
                KVP_OK);
    CHECK(num_free == c.g.blocks, "%d of %d blocks free after freeing every sequence", num_free,
          c.g.blocks);
    Destroy(c);
  }

  void Destroy(CacheModel& c) {
    for (DecoderModel& d : c.decoders) kvp_decoder_destroy(d.dec);
    c.decoders.clear();
    kvp_cache_destroy(c.cache);
    c.cache = nullptr;
    if (c.alloc) {
      CHECK(c.alloc->live.empty(), "%zu engine allocations outlive their cache",
            c.alloc->live.size());
    }
    c = CacheModel();
  }

  // ---- The invariants, after every step ----------------------------------------------

  void CheckCache(CacheModel& c) {
    int32_t num_free = -1;
    EXPECT_CODE("kvp_cache_num_free_blocks", Code(kvp_cache_num_free_blocks(c.cache, &num_free)),
                KVP_OK);
    CHECK(num_free == c.NumFree(), "free blocks: library %d, model %d", num_free, c.NumFree());
    if (!c.seqs.empty()) {
      std::vector<int64_t> ids;
      for (const auto& kv : c.seqs) ids.push_back(kv.first);
      const int32_t w = c.g.blocks;
      std::vector<int32_t> table(ids.size() * w, -7), lens(ids.size(), -7);
      EXPECT_CODE(
          "kvp_cache_export_block_table",
          Code(kvp_cache_export_block_table(c.cache, ids.data(), static_cast<int32_t>(ids.size()),
                                            w, w, table.data(), lens.data())),
          KVP_OK);
      size_t i = 0;
      for (const auto& kv : c.seqs) {
        const Seq& s = kv.second;
        CHECK(lens[i] == s.len, "seq %lld: length %d, model %d", static_cast<long long>(kv.first),
              lens[i], s.len);
        CHECK(static_cast<int64_t>(s.blocks.size()) ==
                  (int64_t{s.len} + c.g.block_size - 1) / c.g.block_size,
              "model: seq %lld holds %zu blocks for %d tokens", static_cast<long long>(kv.first),
              s.blocks.size(), s.len);
        for (int32_t j = 0; j < w; ++j) {
          const int32_t want = j < static_cast<int32_t>(s.blocks.size()) ? s.blocks[j] : 0;
          CHECK(table[i * w + j] == want, "seq %lld: block %d is %d, model %d",
                static_cast<long long>(kv.first), j, table[i * w + j], want);
        }
        int32_t len = -7;
        EXPECT_CODE("kvp_seq_length", Code(kvp_seq_length(c.cache, kv.first, &len)), KVP_OK);
        CHECK(len == s.len, "kvp_seq_length %d, model %d", len, s.len);
        ++i;
      }
    }
    kvp_write_stats st;
    kvp_write_stats_init(&st);
    EXPECT_CODE("kvp_cache_get_write_stats", Code(kvp_cache_get_write_stats(c.cache, &st)), KVP_OK);
    CHECK(st.non_finite == c.non_finite, "non_finite %llu, model %llu",
          static_cast<unsigned long long>(st.non_finite),
          static_cast<unsigned long long>(c.non_finite));
    CHECK(st.saturated >= c.saturated, "saturated fell from %llu to %llu",
          static_cast<unsigned long long>(c.saturated),
          static_cast<unsigned long long>(st.saturated));
    c.saturated = st.saturated;
    CheckBytes(c, nullptr);
  }

  // Every byte equals the shadow, except where `may_change` has bits set;
  // those bits are then taken over into the shadow.
  void CheckBytes(CacheModel& c, const std::vector<uint8_t>* may_change) {
    int64_t off = 0;
    for (size_t r = 0; r < c.regions.size(); ++r) {
      const Region& reg = c.regions[r];
      uint8_t* shadow = c.shadow.data() + off;
      const uint8_t* mask = may_change ? may_change->data() + off : nullptr;
      off += reg.bytes;
      if (reg.bytes == 0 || std::memcmp(reg.ptr, shadow, reg.bytes) == 0) continue;
      const size_t bad = FirstForbiddenChange(reg.ptr, shadow, mask, reg.bytes);
      if (bad < static_cast<size_t>(reg.bytes)) {
        Fail(__LINE__, Format("byte %zu of layer %zu region %zu (K, V, K scales, V scales; block "
                              "%lld) is 0x%02x, the model expects 0x%02x (bits 0x%02x may change)",
                              bad, r / 4, r % 4, static_cast<long long>(bad / reg.block_stride),
                              reg.ptr[bad], shadow[bad], mask ? mask[bad] : 0));
      }
      std::memcpy(shadow, reg.ptr, reg.bytes);
    }
  }

  // The first byte of `now` that differs from `was` in bits `mask` (NULL:
  // none) does not allow to change; n if there is none. Kept out of the
  // coverage instrumentation: it is the harness's hot loop.
  __attribute__((no_sanitize("coverage"))) static size_t FirstForbiddenChange(const uint8_t* now,
                                                                              const uint8_t* was,
                                                                              const uint8_t* mask,
                                                                              size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t a, b, m = 0;
      std::memcpy(&a, now + i, 8);
      std::memcpy(&b, was + i, 8);
      if (mask) std::memcpy(&m, mask + i, 8);
      if (((a ^ b) & ~m) != 0) break;
    }
    for (; i < n; ++i) {
      if (((now[i] ^ was[i]) & ~(mask ? mask[i] : 0)) != 0) return i;
    }
    return n;
  }

  // Block `dst` of cache `to` must now hold what block `src` of `from` held.
  static void ShadowCopyBlock(CacheModel& to, int32_t dst, const std::vector<uint8_t>& from_shadow,
                              const CacheModel& from, int32_t src) {
    for (int32_t l = 0; l < to.g.layers; ++l) {
      for (int r = 0; r < 4; ++r) {
        const int64_t stride = to.regions[l * 4 + r].block_stride;
        if (to.regions[l * 4 + r].bytes == 0) continue;
        std::memcpy(to.shadow.data() + to.RegionOffset(l, r) + dst * stride,
                    from_shadow.data() + from.RegionOffset(l, r) + src * stride, stride);
      }
    }
  }

  // ---- One step --------------------------------------------------------------------------

  void Step() {
    CacheModel* c = AnyCache();
    if (c == nullptr) return;
    switch (Pick(0, 15)) {
      case 0:
        Create(*c);
        break;
      case 1:
        Fork(*c);
        break;
      case 2:
      case 3:
        Append(*c);
        break;
      case 4:
        Truncate(*c);
        break;
      case 5:
        FreeSeq(*c);
        break;
      case 6:
        Export(*c);
        break;
      case 7:
      case 8:
        Write(*c);
        break;
      case 9:
      case 10:
        Decode(*c);
        break;
      case 11:
        Copy(*c);
        break;
      case 12:
        Transfer();
        break;
      case 13:
        Queries(*c);
        break;
      case 14:
        BadCalls(*c);
        break;
      case 15:
        Lifecycle();
        break;
    }
  }

  void Create(CacheModel& c) {
    int64_t id = -7;
    EXPECT_CODE("kvp_seq_create", Code(kvp_seq_create(c.cache, &id)), KVP_OK);
    CHECK(id > c.max_id, "new id %lld after %lld", static_cast<long long>(id),
          static_cast<long long>(c.max_id));
    c.max_id = id;
    c.seqs[id] = Seq();
  }

  void Fork(CacheModel& c) {
    const int64_t parent = PickId(c);
    int64_t child = -7;
    const bool known = c.seqs.count(parent) > 0;
    EXPECT_CODE("kvp_seq_fork", Code(kvp_seq_fork(c.cache, parent, &child)),
                known ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!known) {
      CHECK(child == -7, "a failed fork wrote its out-parameter");
      return;
    }
    CHECK(child > c.max_id, "fork id %lld after %lld", static_cast<long long>(child),
          static_cast<long long>(c.max_id));
    c.max_id = child;
    c.seqs[child] = c.seqs[parent];
  }

  void Append(CacheModel& c) {
    const int64_t id = PickId(c);
    int32_t n;
    switch (Pick(0, 15)) {
      case 0:
        n = -Pick(1, 3);
        break;
      case 1:
        n = kI32Max - Pick(0, 20);
        break;
      case 2:
        n = Pick(0, 1) ? kI32Min : 0;
        break;
      case 3:
        n = Pick(c.g.block_size, 4 * c.g.block_size);
        break;
      default:
        n = Pick(1, c.g.block_size + 3);
        break;
    }
    // Predict.
    int32_t want = KVP_OK;
    const auto it = c.seqs.find(id);
    bool cow = false;
    int64_t new_blocks = 0;
    if (n < 0 || it == c.seqs.end()) {
      want = KVP_ERR_INVALID_ARGUMENT;
    } else if (n > 0) {
      const Seq& s = it->second;
      const std::vector<int32_t> refs = c.RefCounts();
      if (int64_t{s.len} + n > kI32Max) {
        want = KVP_ERR_INVALID_ARGUMENT;
      } else {
        cow = s.len % c.g.block_size != 0 && refs[s.blocks.back()] > 1;
        new_blocks = (int64_t{s.len} + n + c.g.block_size - 1) / c.g.block_size -
                     static_cast<int64_t>(s.blocks.size());
        if (new_blocks + (cow ? 1 : 0) > c.NumFree()) want = KVP_ERR_OUT_OF_BLOCKS;
      }
    }
    const bool with_slots = n >= 0 && n <= 4096 && !OneIn(4);
    std::vector<int64_t> slots(with_slots ? n + 1 : 0, -77);
    const int32_t got =
        Code(kvp_seq_append(c.cache, id, n, with_slots ? slots.data() : nullptr, nullptr));
    EXPECT_CODE("kvp_seq_append", got, want);
    if (with_slots) {
      CHECK(slots[n] == -77, "kvp_seq_append wrote past num_tokens slots");
      if (want != KVP_OK || n == 0) {
        for (int64_t v : slots) CHECK(v == -77, "a failed or empty append wrote slots");
      }
    }
    if (want != KVP_OK || n == 0) return;

    // What the library did: read the new table back.
    Seq& s = it->second;
    const Seq before = s;
    const std::vector<int32_t> refs = c.RefCounts();
    const int32_t w = c.g.blocks;
    std::vector<int32_t> table(w, -7);
    int32_t len = -7;
    EXPECT_CODE("kvp_cache_export_block_table",
                Code(kvp_cache_export_block_table(c.cache, &id, 1, w, w, table.data(), &len)),
                KVP_OK);
    CHECK(len == before.len + n, "length %d after appending %d to %d", len, n, before.len);
    const size_t nb = static_cast<size_t>((int64_t{len} + c.g.block_size - 1) / c.g.block_size);
    CHECK(nb == before.blocks.size() + new_blocks, "block count");
    s.len = len;
    s.blocks.assign(table.begin(), table.begin() + nb);
    std::set<int32_t> fresh;
    for (size_t j = 0; j < nb; ++j) {
      const bool replaced = j >= before.blocks.size() || (cow && j + 1 == before.blocks.size());
      if (!replaced) {
        CHECK(s.blocks[j] == before.blocks[j], "append changed block %zu of the sequence", j);
        continue;
      }
      const int32_t b = s.blocks[j];
      CHECK(b >= 0 && b < c.g.blocks && refs[b] == 0 && fresh.insert(b).second,
            "append took block %d, which was not free", b);
    }
    if (cow) {
      // The copy carries every layer's data and scales.
      const int32_t old_b = before.blocks.back(), new_b = s.blocks[before.blocks.size() - 1];
      CHECK(old_b != new_b, "copy-on-write kept the shared block");
      const std::vector<uint8_t> shadow = c.shadow;
      ShadowCopyBlock(c, new_b, shadow, c, old_b);
    }
    if (with_slots) {
      for (int32_t t = 0; t < n; ++t) {
        const int64_t pos = int64_t{before.len} + t;
        const int64_t want_slot =
            int64_t{s.blocks[pos / c.g.block_size]} * c.g.block_size + pos % c.g.block_size;
        CHECK(slots[t] == want_slot, "slot %d is %lld, the table says %lld", t,
              static_cast<long long>(slots[t]), static_cast<long long>(want_slot));
      }
    }
  }

  void Truncate(CacheModel& c) {
    const int64_t id = PickId(c);
    const auto it = c.seqs.find(id);
    const int32_t cur = it == c.seqs.end() ? 0 : it->second.len;
    int32_t len;
    switch (Pick(0, 7)) {
      case 0:
        len = cur + Pick(1, 40);
        break;
      case 1:
        len = Pick(0, 1) ? -1 : kI32Min;
        break;
      case 2:
        len = cur;
        break;
      default:
        len = Pick(0, std::max(cur, 0));
        break;
    }
    const bool ok = it != c.seqs.end() && len >= 0 && len <= cur;
    EXPECT_CODE("kvp_seq_truncate", Code(kvp_seq_truncate(c.cache, id, len)),
                ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!ok) return;
    it->second.len = len;
    it->second.blocks.resize(
        static_cast<size_t>((int64_t{len} + c.g.block_size - 1) / c.g.block_size));
  }

  void FreeSeq(CacheModel& c) {
    const int64_t id = PickId(c);
    const bool ok = c.seqs.count(id) > 0;
    EXPECT_CODE("kvp_seq_free", Code(kvp_seq_free(c.cache, id)),
                ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!ok) return;
    c.seqs.erase(id);
    c.stale.push_back(id);
  }

  void Export(CacheModel& c) {
    const int n = Pick(0, 4);
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(PickId(c));
    int32_t num = n;
    if (OneIn(12)) num = Pick(0, 1) ? -1 : kI32Min;
    int32_t width = Pick(0, c.g.blocks + 1);
    if (OneIn(10)) width = -Pick(1, 3);
    int64_t stride = width + Pick(-1, 3);
    if (!OneIn(5)) stride = std::max<int64_t>(stride, width);
    const bool table_null = OneIn(12), lens_null = OneIn(6), ids_null = OneIn(12);
    const size_t table_size = n * static_cast<size_t>(std::max<int64_t>(stride, 1)) + 4;
    std::vector<int32_t> table(table_size, -55), lens(n + 1, -55);

    bool ok = num >= 0 && width >= 1 && stride >= width && !(num > 0 && (table_null || ids_null));
    if (ok) {
      for (int64_t id : ids) {
        const auto it = c.seqs.find(id);
        if (it == c.seqs.end() || static_cast<int64_t>(it->second.blocks.size()) > width)
          ok = false;
      }
    }
    const int32_t got = Code(kvp_cache_export_block_table(
        c.cache, ids_null ? nullptr : ids.data(), num, width, stride,
        table_null ? nullptr : table.data(), lens_null ? nullptr : lens.data()));
    EXPECT_CODE("kvp_cache_export_block_table", got, ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < table.size(); ++i) {
      const int64_t row = stride > 0 ? static_cast<int64_t>(i) / stride : -1;
      const int64_t col = stride > 0 ? static_cast<int64_t>(i) % stride : -1;
      const bool written = ok && !table_null && row < n && col < width;
      if (!written) {
        CHECK(table[i] == -55, "export wrote table entry %zu outside its rows", i);
        continue;
      }
      const Seq& s = c.seqs.at(ids[row]);
      const int32_t want = col < static_cast<int64_t>(s.blocks.size()) ? s.blocks[col] : 0;
      CHECK(table[i] == want, "export: row %lld col %lld is %d, model %d",
            static_cast<long long>(row), static_cast<long long>(col), table[i], want);
    }
    for (int i = 0; i <= n; ++i) {
      if (ok && !lens_null && i < n) {
        CHECK(lens[i] == c.seqs.at(ids[i]).len, "export: length %d", lens[i]);
      } else {
        CHECK(lens[i] == -55, "export wrote lengths it should not have");
      }
    }
  }

  // A slot: of a live token (mostly), padding (-1), any slot, or out of range.
  int64_t PickSlot(const CacheModel& c, bool* bad) {
    const int kind = Pick(0, 19);
    if (kind == 0) {
      static const int64_t kBad[] = {-2, std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max()};
      *bad = true;
      const int which = Pick(0, 3);
      return which < 3 ? kBad[which] : c.g.slots();
    }
    if (kind < 3) return -1;
    if (kind < 6) return Pick(0, static_cast<int>(c.g.slots() - 1));
    std::vector<const Seq*> with_tokens;
    for (const auto& kv : c.seqs) {
      if (kv.second.len > 0) with_tokens.push_back(&kv.second);
    }
    if (with_tokens.empty()) return Pick(0, static_cast<int>(c.g.slots() - 1));
    const Seq& s = *with_tokens[Pick(0, static_cast<int>(with_tokens.size()) - 1)];
    const int32_t pos = Pick(0, s.len - 1);
    return int64_t{s.blocks[pos / c.g.block_size]} * c.g.block_size + pos % c.g.block_size;
  }

  void Write(CacheModel& c) {
    const Geometry& g = c.g;
    const int32_t n = Pick(0, 6);
    const int32_t dtype = Pick(KVP_DTYPE_FP32, KVP_DTYPE_BF16);
    const int64_t dense = g.dense();
    const int64_t k_stride = OneIn(3) ? dense + Pick(1, 9) : 0;
    const int64_t v_stride = OneIn(3) ? dense + Pick(1, 9) : 0;
    const int64_t k_elems = n == 0 ? 0 : (n - 1) * (k_stride ? k_stride : dense) + dense;
    const int64_t v_elems = n == 0 ? 0 : (n - 1) * (v_stride ? v_stride : dense) + dense;
    std::vector<uint8_t> k = values_.Make(dtype, k_elems), v = values_.Make(dtype, v_elems);
    for (int i = Pick(0, 3); i > 0 && k_elems > 0; --i) {
      values_.Special(dtype, &k, Pick(0, static_cast<int>(k_elems - 1)), Pick(0, 7));
    }
    for (int i = Pick(0, 3); i > 0 && v_elems > 0; --i) {
      values_.Special(dtype, &v, Pick(0, static_cast<int>(v_elems - 1)), Pick(0, 7));
    }
    bool bad_slot = false;
    std::vector<int64_t> slots(n + 1, 0);
    for (int32_t t = 0; t < n; ++t) slots[t] = PickSlot(c, &bad_slot);

    kvp_write_args a;
    kvp_write_args_init(&a);
    a.layer = Pick(0, g.layers - 1);
    a.num_tokens = n;
    a.input_dtype = dtype;
    a.key = k.empty() ? nullptr : k.data();
    a.value = v.empty() ? nullptr : v.data();
    a.key_token_stride = k_stride;
    a.value_token_stride = v_stride;
    a.slot_mapping = slots.data();
    bool ok = !bad_slot;
    if (n > 0 && (a.key == nullptr || a.value == nullptr)) ok = false;
    switch (OneIn(4) ? Pick(1, 10) : 0) {
      case 1:
        a.struct_size = Pick(0, 1) ? 0 : kWriteArgs10 - 8;
        ok = false;
        break;
      case 2:
        a.layer = Pick(0, 1) ? -1 : g.layers;
        ok = false;
        break;
      case 3:
        a.num_tokens = -Pick(1, 2);
        ok = false;
        break;
      case 4:
        a.input_dtype = Pick(KVP_DTYPE_FP8_E4M3, 9);
        ok = false;
        break;
      case 5:
        a.reserved0 = Pick(1, 5);
        ok = false;
        break;
      case 6:
        a.key_token_stride = dense - Pick(1, 2);
        ok = false;
        break;
      case 7:
        a.value_token_stride = -Pick(1, 2);
        ok = false;
        break;
      case 8:
        if (n > 0) {
          a.key = nullptr;
          ok = false;
        }
        break;
      case 9:
        if (n > 0) {
          a.slot_mapping = nullptr;
          ok = false;
        }
        break;
      case 10:
        if (n > 1) {
          a.key_token_stride = std::numeric_limits<int64_t>::max() / 2;
          ok = false;
        }
        break;
      default:
        break;
    }
    const int32_t got = Code(kvp_cache_write(c.cache, &a, nullptr));
    EXPECT_CODE("kvp_cache_write", got, ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!ok || n == 0) return;  // CheckCache compares every byte with the shadow

    // Only the written slots' bytes may change; non-finite inputs count.
    std::vector<uint8_t> may_change(c.shadow.size(), 0);
    const kvp_layer_layout& L = c.layouts[a.layer];
    const int64_t k_off = c.RegionOffset(a.layer, 0), v_off = c.RegionOffset(a.layer, 1);
    const int64_t ks_off = c.RegionOffset(a.layer, 2), vs_off = c.RegionOffset(a.layer, 3);
    for (int32_t t = 0; t < n; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const int64_t b = slot / g.block_size, off = slot % g.block_size;
      for (int32_t h = 0; h < g.kv_heads; ++h) {
        for (int32_t ch = 0; ch < L.k_chunks; ++ch) {
          std::memset(may_change.data() + k_off + b * L.k_block_stride + h * L.k_head_stride +
                          ch * L.k_chunk_stride + off * 16,
                      0xFF, 16);
        }
        for (int32_t d = 0; d < g.head_size; ++d) {
          const int64_t bit = off * L.v_bits;
          uint8_t* m = may_change.data() + v_off + b * L.v_block_stride + h * L.v_head_stride +
                       d * L.v_channel_stride + bit / 8;
          if (L.v_bits == 4) {
            *m |= static_cast<uint8_t>(0xF << (bit % 8));
          } else {
            std::memset(m, 0xFF, L.v_bits / 8);
          }
        }
        if (L.k_scale_entry_bytes) {
          std::memset(may_change.data() + ks_off + b * L.k_scale_block_stride +
                          h * L.k_scale_head_stride + off * L.k_scale_entry_bytes,
                      0xFF, L.k_scale_entry_bytes);
        }
        if (L.v_scale_entry_bytes) {
          std::memset(may_change.data() + vs_off + b * L.v_scale_block_stride +
                          h * L.v_scale_head_stride + off * L.v_scale_entry_bytes,
                      0xFF, L.v_scale_entry_bytes);
        }
      }
      const int64_t ks = k_stride ? k_stride : dense, vs = v_stride ? v_stride : dense;
      for (int64_t e = 0; e < dense; ++e) {
        c.non_finite += IsNonFinite(dtype, k, t * ks + e);
        c.non_finite += IsNonFinite(dtype, v, t * vs + e);
      }
    }
    CheckBytes(c, &may_change);
  }

  DecoderModel* GetDecoder(CacheModel& c) {
    if (!c.decoders.empty() && !OneIn(4)) {
      return &c.decoders[Pick(0, static_cast<int>(c.decoders.size()) - 1)];
    }
    if (c.decoders.size() >= 3) {
      kvp_decoder_destroy(c.decoders.front().dec);
      c.decoders.erase(c.decoders.begin());
    }
    kvp_decode_config cfg;
    kvp_decode_config_init(&cfg);
    cfg.num_query_heads = c.g.kv_heads * Pick(1, 4);
    cfg.max_num_seqs = Pick(1, 4);
    // Short contexts keep a decode cheap (its loops do not care about length).
    cfg.max_context_len = Pick(1, std::min(static_cast<int>(c.g.slots()) + 8, 72));
    cfg.max_query_len = Pick(1, std::min(3, cfg.max_context_len));
    cfg.q_dtype = Pick(KVP_DTYPE_FP32, KVP_DTYPE_BF16);
    cfg.out_dtype = Pick(KVP_DTYPE_FP32, KVP_DTYPE_BF16);
    cfg.precise = Pick(0, 1);  // the CPU backend is precise either way
    kvp_decode_config bad = cfg;
    int32_t want = KVP_OK;
    switch (OneIn(4) ? Pick(1, 10) : 0) {
      case 1:
        bad.struct_size = Pick(0, 1) ? 0 : 16;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 2:
        bad.num_query_heads = Pick(0, 1) ? 0 : -c.g.kv_heads;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 3:
        if (c.g.kv_heads > 1) {
          bad.num_query_heads = c.g.kv_heads + 1;
          want = KVP_ERR_INVALID_ARGUMENT;
        }
        break;
      case 4:
        bad.max_num_seqs = -Pick(0, 1);
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 5:
        bad.max_context_len = Pick(0, 1) ? 0 : kI32Min;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 6:
        bad.max_query_len = Pick(0, 1) ? 0 : cfg.max_context_len + 1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 7:
        bad.q_dtype = Pick(KVP_DTYPE_FP8_E4M3, 7);
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 8:
        bad.out_dtype = Pick(0, 1) ? -1 : KVP_DTYPE_INT8;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 9:
        bad.max_num_seqs = kI32Max;
        bad.max_context_len = kI32Max;
        bad.max_query_len = kI32Max;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      case 10:
        bad.precise = Pick(0, 1) ? 2 : -1;
        want = KVP_ERR_INVALID_ARGUMENT;
        break;
      default:
        break;
    }
    if (want != KVP_OK) {
      kvp_decoder* out = reinterpret_cast<kvp_decoder*>(0x1);
      uint64_t bytes = 12345;
      EXPECT_CODE("kvp_decode_workspace_size",
                  Code(kvp_decode_workspace_size(c.cache, &bad, &bytes)), want);
      EXPECT_CODE("kvp_decoder_create", Code(kvp_decoder_create(c.cache, &bad, &out)), want);
      CHECK(out == reinterpret_cast<kvp_decoder*>(0x1) && bytes == 12345,
            "a failed decoder call wrote its out-parameter");
    }
    uint64_t bytes = 12345;
    EXPECT_CODE("kvp_decode_workspace_size", Code(kvp_decode_workspace_size(c.cache, &cfg, &bytes)),
                KVP_OK);
    CHECK(bytes == 0, "the CPU backend needs no workspace, says %llu",
          static_cast<unsigned long long>(bytes));
    DecoderModel d;
    d.cfg = cfg;
    EXPECT_CODE("kvp_decoder_create", Code(kvp_decoder_create(c.cache, &cfg, &d.dec)), KVP_OK);
    c.decoders.push_back(d);
    return &c.decoders.back();
  }

  void Decode(CacheModel& c) {
    DecoderModel& d = *GetDecoder(c);
    const Geometry& g = c.g;
    const kvp_decode_config& cfg = d.cfg;
    const int32_t hq = cfg.num_query_heads, D = g.head_size;
    const int32_t num_seqs = Pick(0, cfg.max_num_seqs);
    const int32_t qlen = Pick(1, cfg.max_query_len);
    const int64_t dense = int64_t{hq} * D;

    // Rows: live sequences (their tables), synthetic rows of random valid
    // blocks, or padding rows of length 0.
    std::vector<std::vector<int32_t>> rows(num_seqs);
    std::vector<int32_t> lens(num_seqs, 0);
    int32_t need_width = 1;
    for (int32_t s = 0; s < num_seqs; ++s) {
      const int kind = Pick(0, 5);
      if (kind < 3 && !c.seqs.empty()) {
        auto it = c.seqs.begin();
        std::advance(it, Pick(0, static_cast<int>(c.seqs.size()) - 1));
        rows[s] = it->second.blocks;
        lens[s] = std::min(it->second.len, cfg.max_context_len);
      } else if (kind < 5) {
        lens[s] = Pick(0, cfg.max_context_len);
        const int32_t nb = (lens[s] + g.block_size - 1) / g.block_size;
        for (int32_t j = 0; j < nb; ++j) rows[s].push_back(Pick(0, g.blocks - 1));
      }
      need_width =
          std::max(need_width, static_cast<int32_t>((lens[s] + g.block_size - 1) / g.block_size));
    }
    const int32_t width = need_width + Pick(0, 2);
    const int64_t t_stride = OneIn(3) ? width + Pick(1, 3) : 0;
    const int64_t row_stride = t_stride ? t_stride : width;
    std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(num_seqs * row_stride, 1)), 0);
    for (int32_t s = 0; s < num_seqs; ++s) {
      for (int64_t j = 0; j < row_stride; ++j) {
        // Entries past a row's blocks are never read: make them garbage.
        table[s * row_stride + j] =
            j < static_cast<int64_t>(rows[s].size()) ? rows[s][j] : (OneIn(2) ? -12345 : kI32Max);
      }
    }
    const int64_t q_stride = OneIn(3) ? dense + Pick(1, 7) : 0;
    const int64_t o_stride = OneIn(3) ? dense + Pick(1, 7) : 0;
    const int64_t nrows = int64_t{num_seqs} * qlen;
    const int64_t q_elems = nrows == 0 ? 0 : (nrows - 1) * (q_stride ? q_stride : dense) + dense;
    const int64_t o_elems = nrows == 0 ? 0 : (nrows - 1) * (o_stride ? o_stride : dense) + dense;
    std::vector<uint8_t> q = values_.Make(cfg.q_dtype, q_elems);
    const int ob = ElemBytes(cfg.out_dtype);
    const bool want_lse = !OneIn(3);
    std::vector<float> alibi;
    if (OneIn(4)) {
      for (int32_t h = 0; h < hq; ++h) alibi.push_back(std::ldexp(1.0f, -Pick(0, 8)));
    }

    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.layer = Pick(0, g.layers - 1);
    a.num_seqs = num_seqs;
    a.query_len = qlen;
    a.sliding_window = OneIn(4) ? Pick(1, 40) : 0;
    a.sm_scale = OneIn(4) ? std::ldexp(1.0f, -Pick(0, 6)) : 0.0f;
    a.logits_soft_cap = OneIn(4) ? static_cast<float>(Pick(1, 50)) : 0.0f;
    a.q = q.empty() ? nullptr : q.data();
    a.q_token_stride = q_stride;
    a.block_table = table.data();
    a.block_table_stride = t_stride;
    a.block_table_width = width;
    a.seq_lens = lens.empty() ? nullptr : lens.data();
    a.alibi_slopes = alibi.empty() ? nullptr : alibi.data();
    a.out_token_stride = o_stride;

    bool ok = true, null_out = false;
    switch (OneIn(4) ? Pick(1, 16) : 0) {
      case 1:
        a.struct_size = Pick(0, 1) ? 0 : kDecodeArgs10 - 8;
        ok = false;
        break;
      case 2:
        a.layer = Pick(0, 1) ? -1 : g.layers;
        ok = false;
        break;
      case 3:
        a.num_seqs = Pick(0, 1) ? -1 : cfg.max_num_seqs + 1;
        ok = false;
        break;
      case 4:
        a.query_len = Pick(0, 1) ? 0 : cfg.max_query_len + 1;
        ok = false;
        break;
      case 5:
        a.sliding_window = -Pick(1, 3);
        ok = false;
        break;
      case 6:
        a.sm_scale = Pick(0, 1) ? NAN : -1.0f;
        ok = false;
        break;
      case 7:
        a.logits_soft_cap = Pick(0, 1) ? INFINITY : -2.0f;
        ok = false;
        break;
      case 8:
        a.q_token_stride = dense - 1;
        ok = false;
        break;
      case 9:
        a.out_token_stride = -Pick(1, 3);
        ok = false;
        break;
      case 10:
        a.block_table_width = -Pick(0, 2);
        ok = false;
        break;
      case 11:
        if (width >= 2) {
          a.block_table_stride = width - 1;
          ok = false;
        }
        break;
      case 12:
        a.reserved0 = 1;
        ok = false;
        break;
      case 13:
        if (num_seqs > 0) {
          lens[Pick(0, num_seqs - 1)] = Pick(0, 1) ? -1 : cfg.max_context_len + Pick(1, 9);
          ok = false;
        }
        break;
      case 14:
        if (num_seqs > 0) {
          // A length past the table's width (when the capacity allows one).
          const int32_t s = Pick(0, num_seqs - 1);
          if (int64_t{width} * g.block_size < cfg.max_context_len) {
            lens[s] = width * g.block_size + 1;
            ok = false;
          }
        }
        break;
      case 15:
        for (int32_t s = 0; s < num_seqs; ++s) {
          if (lens[s] > 0) {  // a block the length uses, out of range
            table[s * row_stride + Pick(0, (lens[s] - 1) / g.block_size)] =
                Pick(0, 1) ? -1 : g.blocks + Pick(0, 3);
            ok = false;
            break;
          }
        }
        break;
      case 16:
        if (num_seqs > 0) {
          switch (Pick(0, 3)) {
            case 0:
              a.q = nullptr;
              break;
            case 1:
              a.block_table = nullptr;
              break;
            case 2:
              a.seq_lens = nullptr;
              break;
            default:
              null_out = true;
              break;
          }
          ok = false;
        }
        break;
      default:
        break;
    }

    const uint8_t kPoison = 0xA7;
    std::vector<uint8_t> out(static_cast<size_t>(o_elems) * ob + 1, kPoison);
    std::vector<float> lse(static_cast<size_t>(nrows * hq) + 1);
    std::memset(lse.data(), kPoison, lse.size() * sizeof(float));
    a.out = null_out || o_elems == 0 ? nullptr : out.data();
    a.lse = want_lse && nrows > 0 ? lse.data() : nullptr;

    const int32_t got = Code(kvp_decode(d.dec, &a, nullptr));
    EXPECT_CODE("kvp_decode", got, ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    auto untouched = [&](const std::vector<uint8_t>& o, const std::vector<float>& l,
                         size_t from_row) {
      for (size_t i = 0; i < o.size(); ++i) {
        const int64_t elem = static_cast<int64_t>(i) / ob;
        const int64_t row = o_stride ? elem / o_stride : elem / dense;
        const int64_t col = o_stride ? elem % o_stride : elem % dense;
        const bool in_row = elem < o_elems && col < dense && row >= static_cast<int64_t>(from_row);
        if (!in_row || !ok) CHECK(o[i] == kPoison, "decode wrote out byte %zu outside its rows", i);
      }
      const uint8_t* lb = reinterpret_cast<const uint8_t*>(l.data());
      for (size_t i = ok && a.lse ? (l.size() - 1) * sizeof(float) : 0;
           i < l.size() * sizeof(float); ++i) {
        CHECK(lb[i] == kPoison, "decode wrote lse byte %zu it should not have", i);
      }
    };
    untouched(out, lse, 0);
    if (!ok) return;

    // Outputs: finite, and exact zeros with lse = -inf where nothing is visible.
    auto out_at = [&](const std::vector<uint8_t>& o, int64_t row, int32_t h, int32_t dd) {
      const int64_t e = row * (o_stride ? o_stride : dense) + int64_t{h} * D + dd;
      return Load(cfg.out_dtype, o, e);
    };
    for (int32_t s = 0; s < num_seqs; ++s) {
      for (int32_t i = 0; i < qlen; ++i) {
        const int64_t row = int64_t{s} * qlen + i;
        const bool sees_nothing = lens[s] - qlen + i < 0;
        for (int32_t h = 0; h < hq; ++h) {
          for (int32_t dd = 0; dd < D; ++dd) {
            const double x = out_at(out, row, h, dd);
            if (sees_nothing) {
              CHECK(x == 0.0, "seq %d query %d sees nothing but outputs %g", s, i, x);
            } else if (cfg.out_dtype != KVP_DTYPE_FP16) {  // FP16 may overflow honestly
              CHECK(std::isfinite(x), "seq %d query %d head %d: output %g from finite inputs", s, i,
                    h, x);
            }
          }
          if (a.lse) {
            const float l = lse[row * hq + h];
            if (sees_nothing) {
              CHECK(std::isinf(l) && l < 0, "seq %d query %d sees nothing, lse %g", s, i, l);
            } else {
              CHECK(!std::isnan(l), "lse NaN from finite inputs");
            }
          }
        }
      }
    }

    // A NaN or Inf in one sequence's query changes no other row, bit for bit.
    if (num_seqs >= 2 && OneIn(2)) {
      const int32_t victim = Pick(0, num_seqs - 1);
      std::vector<uint8_t> q2 = q;
      const int64_t vrow = int64_t{victim} * qlen + Pick(0, qlen - 1);
      const int64_t e = vrow * (q_stride ? q_stride : dense) + Pick(0, static_cast<int>(dense - 1));
      values_.Special(cfg.q_dtype, &q2, e, Pick(0, 2));
      std::vector<uint8_t> out2(out.size(), kPoison);
      std::vector<float> lse2(lse.size());
      std::memset(lse2.data(), kPoison, lse2.size() * sizeof(float));
      a.q = q2.data();
      a.out = out2.data();
      a.lse = a.lse ? lse2.data() : nullptr;
      EXPECT_CODE("kvp_decode(poisoned query)", Code(kvp_decode(d.dec, &a, nullptr)), KVP_OK);
      for (int32_t s = 0; s < num_seqs; ++s) {
        if (s == victim) continue;
        for (int32_t i = 0; i < qlen; ++i) {
          const int64_t row = int64_t{s} * qlen + i;
          const int64_t e0 = row * (o_stride ? o_stride : dense);
          CHECK(std::memcmp(out.data() + e0 * ob, out2.data() + e0 * ob, dense * ob) == 0,
                "a non-finite query in seq %d changed the output of seq %d", victim, s);
          if (a.lse) {
            CHECK(std::memcmp(&lse[row * hq], &lse2[row * hq], hq * sizeof(float)) == 0,
                  "a non-finite query in seq %d changed the lse of seq %d", victim, s);
          }
        }
      }
    }
  }

  void Copy(CacheModel& c) {
    const int32_t n = Pick(0, 3);
    std::vector<int32_t> pairs;
    std::vector<int32_t> free_order;
    for (int32_t b = 0; b < c.g.blocks; ++b) free_order.push_back(b);
    std::shuffle(free_order.begin(), free_order.end(), values_.rng());
    // Distinct blocks: sources first, destinations after them in the shuffle.
    for (int32_t i = 0; i < n; ++i) {
      if (2 * i + 1 < c.g.blocks) {
        pairs.push_back(free_order[2 * i]);
        pairs.push_back(free_order[2 * i + 1]);
      } else {
        pairs.push_back(Pick(0, c.g.blocks - 1));
        pairs.push_back(Pick(0, c.g.blocks - 1));
      }
    }
    int32_t num = n;
    if (n > 0 && OneIn(4)) {
      const int which = Pick(0, 2 * n - 1);
      static const int32_t kBad[] = {-1, kI32Min, kI32Max};
      pairs[which] = Pick(0, 1) ? kBad[Pick(0, 2)] : c.g.blocks;
    }
    if (OneIn(16)) num = -Pick(1, 3);
    const bool null_pairs = n > 0 && OneIn(16);
    // Predict with the documented rules.
    bool ok = num >= 0 && !null_pairs;
    std::set<int32_t> dsts;
    for (int32_t i = 0; ok && i < num; ++i) {
      const int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
      if (s < 0 || s >= c.g.blocks || d < 0 || d >= c.g.blocks || !dsts.insert(d).second)
        ok = false;
    }
    for (int32_t i = 0; ok && i < num; ++i) {
      if (dsts.count(pairs[2 * i])) ok = false;
    }
    EXPECT_CODE(
        "kvp_cache_copy_blocks",
        Code(kvp_cache_copy_blocks(c.cache, null_pairs ? nullptr : pairs.data(), num, nullptr)),
        ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!ok) return;
    const std::vector<uint8_t> before = c.shadow;
    for (int32_t i = 0; i < num; ++i) ShadowCopyBlock(c, pairs[2 * i + 1], before, c, pairs[2 * i]);
  }

  void Transfer() {
    CacheModel* dst = AnyCache();
    CacheModel* src = AnyCache();
    if (dst == nullptr || src == nullptr) return;
    const Geometry &a = src->g, &b = dst->g;
    const bool same_geometry = a.layers == b.layers && a.block_size == b.block_size &&
                               a.kv_heads == b.kv_heads && a.head_size == b.head_size &&
                               a.k_dtype == b.k_dtype && a.v_dtype == b.v_dtype &&
                               a.smoothing == b.smoothing && a.lambda == b.lambda;
    const int32_t n = Pick(0, 3);
    std::vector<int32_t> pairs;
    for (int32_t i = 0; i < n; ++i) {
      pairs.push_back(Pick(0, a.blocks - (OneIn(8) ? 0 : 1)));
      pairs.push_back(Pick(0, b.blocks - (OneIn(8) ? 0 : 1)));
    }
    bool ok = same_geometry;
    std::set<int32_t> dsts;
    for (int32_t i = 0; ok && i < n; ++i) {
      const int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
      if (s >= a.blocks || d >= b.blocks || !dsts.insert(d).second) ok = false;
    }
    if (src == dst) {
      for (int32_t i = 0; ok && i < n; ++i) {
        if (dsts.count(pairs[2 * i])) ok = false;
      }
    }
    EXPECT_CODE("kvp_cache_transfer_blocks",
                Code(kvp_cache_transfer_blocks(dst->cache, src->cache, pairs.data(), n, nullptr)),
                ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
    if (!ok) return;
    const std::vector<uint8_t> before = src->shadow;
    for (int32_t i = 0; i < n; ++i)
      ShadowCopyBlock(*dst, pairs[2 * i + 1], before, *src, pairs[2 * i]);
  }

  // Layout, info and statistics queries, with bad layers and struct sizes.
  void Queries(CacheModel& c) {
    switch (Pick(0, 3)) {
      case 0: {
        kvp_layer_layout lay;
        std::memset(&lay, 0xCD, sizeof(lay));
        lay.struct_size = OneIn(4) ? Pick(0, 1) * 8 : sizeof(lay);
        int32_t layer = Pick(0, c.g.layers - 1);
        if (OneIn(4)) layer = Pick(0, 1) ? -1 : c.g.layers;
        const bool ok = lay.struct_size == sizeof(lay) && layer >= 0 && layer < c.g.layers;
        const kvp_layer_layout before = lay;
        EXPECT_CODE("kvp_cache_get_layout", Code(kvp_cache_get_layout(c.cache, layer, &lay)),
                    ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
        if (!ok) {
          CHECK(std::memcmp(&lay, &before, sizeof(lay)) == 0, "a failed get_layout wrote");
        } else {
          CHECK(std::memcmp(&lay, &c.layouts[layer], sizeof(lay)) == 0, "the layout changed");
        }
        break;
      }
      case 1: {
        kvp_cache_info info;
        std::memset(&info, 0xCD, sizeof(info));
        info.struct_size = OneIn(4) ? 8 : sizeof(info);
        const bool ok = info.struct_size == sizeof(info);
        EXPECT_CODE("kvp_cache_get_info", Code(kvp_cache_get_info(c.cache, &info)),
                    ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
        if (ok) {
          CHECK(info.num_blocks == c.g.blocks && info.num_layers == c.g.layers &&
                    info.block_size == c.g.block_size && info.head_size == c.g.head_size &&
                    info.k_dtype == c.g.k_dtype && info.v_dtype == c.g.v_dtype &&
                    info.has_key_smoothing == (c.g.smoothing ? 1 : 0) &&
                    info.device_kind == KVP_DEVICE_CPU,
                "kvp_cache_get_info disagrees with the configuration");
          if (c.alloc) {
            CHECK(static_cast<size_t>(info.total_bytes) <= c.alloc->live.begin()->second,
                  "total_bytes %lld exceeds the allocation",
                  static_cast<long long>(info.total_bytes));
          }
        } else {
          CHECK(info.num_blocks == static_cast<int32_t>(0xCDCDCDCD), "a failed get_info wrote");
        }
        break;
      }
      case 2: {
        kvp_write_stats st;
        std::memset(&st, 0xCD, sizeof(st));
        st.struct_size = OneIn(4) ? 8 : sizeof(st);
        const bool ok = st.struct_size == sizeof(st);
        EXPECT_CODE("kvp_cache_get_write_stats", Code(kvp_cache_get_write_stats(c.cache, &st)),
                    ok ? KVP_OK : KVP_ERR_INVALID_ARGUMENT);
        if (!ok) CHECK(st.non_finite == 0xCDCDCDCDCDCDCDCDull, "a failed get_write_stats wrote");
        break;
      }
      default:
        EXPECT_CODE("kvp_cache_reset_write_stats", Code(kvp_cache_reset_write_stats(c.cache)),
                    KVP_OK);
        c.non_finite = 0;
        c.saturated = 0;
        break;
    }
  }

  // NULL handles and NULL out-parameters, on every entry that takes them.
  void BadCalls(CacheModel& c) {
    const int64_t id = c.seqs.empty() ? 1 : c.seqs.begin()->first;
    int32_t i32 = -9;
    int64_t i64 = -9;
    uint64_t u64 = 9;
    kvp_cache_info info;
    kvp_cache_info_init(&info);
    kvp_layer_layout lay;
    kvp_layer_layout_init(&lay);
    kvp_write_stats st;
    kvp_write_stats_init(&st);
    kvp_write_args w;
    kvp_write_args_init(&w);
    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = c.g.kv_heads;
    dc.max_num_seqs = 1;
    dc.max_context_len = 16;
    kvp_decode_args da;
    kvp_decode_args_init(&da);
    kvp_decoder* dec = reinterpret_cast<kvp_decoder*>(0x1);
    kvp_cache* cache = reinterpret_cast<kvp_cache*>(0x1);
    const int32_t pairs[2] = {0, 0};
    kvp_error* e = nullptr;
    switch (Pick(0, 24)) {
      case 0:
        e = kvp_seq_create(nullptr, &i64);
        break;
      case 1:
        e = kvp_seq_create(c.cache, nullptr);
        break;
      case 2:
        e = kvp_seq_fork(nullptr, id, &i64);
        break;
      case 3:
        e = kvp_seq_fork(c.cache, id, nullptr);
        break;
      case 4:
        e = kvp_seq_append(nullptr, id, 1, nullptr, nullptr);
        break;
      case 5:
        e = kvp_seq_truncate(nullptr, id, 0);
        break;
      case 6:
        e = kvp_seq_free(nullptr, id);
        break;
      case 7:
        e = kvp_seq_length(nullptr, id, &i32);
        break;
      case 8:
        e = kvp_seq_length(c.cache, id, nullptr);
        break;
      case 9:
        e = kvp_cache_num_free_blocks(nullptr, &i32);
        break;
      case 10:
        e = kvp_cache_num_free_blocks(c.cache, nullptr);
        break;
      case 11:
        e = kvp_cache_export_block_table(nullptr, &id, 1, 4, 4, nullptr, nullptr);
        break;
      case 12:
        e = kvp_cache_get_layout(c.cache, 0, nullptr);
        break;
      case 13:
        e = kvp_cache_get_info(nullptr, &info);
        break;
      case 14:
        e = kvp_cache_get_write_stats(c.cache, nullptr);
        break;
      case 15:
        e = kvp_cache_reset_write_stats(nullptr);
        break;
      case 16:
        e = kvp_cache_write(nullptr, &w, nullptr);
        break;
      case 17:
        e = kvp_cache_write(c.cache, nullptr, nullptr);
        break;
      case 18:
        e = kvp_cache_copy_blocks(nullptr, pairs, 1, nullptr);
        break;
      case 19:
        e = kvp_cache_transfer_blocks(nullptr, c.cache, pairs, 1, nullptr);
        break;
      case 20:
        e = kvp_cache_transfer_blocks(c.cache, nullptr, pairs, 1, nullptr);
        break;
      case 21:
        e = kvp_decode_workspace_size(c.cache, &dc, nullptr);
        break;
      case 22:
        e = kvp_decoder_create(nullptr, &dc, &dec);
        break;
      case 23:
        e = kvp_decode(nullptr, &da, nullptr);
        break;
      default:
        e = kvp_cache_create(nullptr, &cache);
        break;
    }
    EXPECT_CODE("a call with a NULL handle or out-parameter", Code(e), KVP_ERR_INVALID_ARGUMENT);
    CHECK(i32 == -9 && i64 == -9 && u64 == 9 && dec == reinterpret_cast<kvp_decoder*>(0x1) &&
              cache == reinterpret_cast<kvp_cache*>(0x1),
          "a failed call wrote an out-parameter");
  }

  // Destroy a cache (with live sequences and decoders) and make another.
  void Lifecycle() {
    const int index = Pick(0, 1);
    CacheModel& c = caches_[index];
    if (c.cache != nullptr) {
      if (caches_[1 - index].cache == nullptr) return;  // keep one cache
      Destroy(c);
    } else {
      NewCache(index);
    }
  }

  FuzzedDataProvider& in_;
  Values values_;
  CacheModel caches_[2];
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Harness h(in);
  h.Run();
  return 0;
}
