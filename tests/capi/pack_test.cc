// SPDX-License-Identifier: Apache-2.0
// kvp_cache_pack / kvp_cache_unpack and the format signature on the CPU
// backend, through the C API: round trips of every K/V dtype pair with and
// without key smoothing, between caches of different sizes, the buffer
// against the layout docs/FORMATS.md describes (built from the layout
// query, not from the library's geometry code), layer ranges, a moved
// sequence decoding to the same bits, and signatures that tell formats
// apart. The bad-input cases are in bad_input_test.cc (BadInputCache.Pack*).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/capi/pack_helpers.h"
#include "tests/common/reference.h"
#include "tests/common/test_matrix.h"

namespace kvpage {
namespace testing {
namespace {

// A call that must succeed.
#define ASSERT_OK(expr) ASSERT_EQ(TakeError(expr), "")

// A cache format (everything the signature holds).
struct Format {
  int layers = 2, block_size = 16, heads = 2, head_size = 64;
  int k_dtype = KVP_DTYPE_INT8, v_dtype = KVP_DTYPE_INT4;
  std::vector<float> smoothing;  // empty: none
  std::string Describe() const {
    return absl::StrFormat("layers %d block_size %d heads %d head_size %d K %s V %s%s", layers,
                           block_size, heads, head_size, DtypeName(k_dtype), DtypeName(v_dtype),
                           smoothing.empty() ? "" : " smoothed");
  }
};

Format RandomFormat(Rng& rng, int k_dtype, int v_dtype, bool smoothed) {
  Format f;
  f.layers = rng.uniform(1, 3);
  f.block_size = kBlockSizes[rng.uniform(0, 2)];
  f.heads = rng.uniform(1, 2);
  f.head_size = kHeadSizes[rng.uniform(0, kNumHeadSizes - 1)];
  f.k_dtype = k_dtype;
  f.v_dtype = v_dtype;
  if (smoothed) {
    for (int i = 0; i < f.heads * f.head_size; ++i)
      f.smoothing.push_back(std::exp(rng.normal(0.7f)));
  }
  return f;
}

// A CPU cache of format `f`, released with the object.
class TestCache {
 public:
  TestCache(const Format& f, int num_blocks) {
    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.num_layers = f.layers;
    cfg.num_blocks = num_blocks;
    cfg.block_size = f.block_size;
    cfg.num_kv_heads = f.heads;
    cfg.head_size = f.head_size;
    cfg.k_dtype = f.k_dtype;
    cfg.v_dtype = f.v_dtype;
    cfg.key_smoothing = f.smoothing.empty() ? nullptr : f.smoothing.data();
    error_ = TakeError(kvp_cache_create(&cfg, &cache_));
  }
  ~TestCache() { kvp_cache_destroy(cache_); }
  TestCache(const TestCache&) = delete;
  TestCache& operator=(const TestCache&) = delete;
  kvp_cache* get() const { return cache_; }
  const std::string& error() const { return error_; }

  std::string Write(Rng& rng, const std::vector<int64_t>& slots) {
    return WriteRandomTokens(cache_, rng, slots);
  }
  std::string Fill(Rng& rng) { return FillEveryBlock(cache_, rng); }

  uint64_t PackSize(int32_t num_blocks, int32_t num_layers) const {
    uint64_t bytes = 0;
    EXPECT_EQ(TakeError(kvp_cache_pack_size(cache_, num_blocks, num_layers, &bytes)), "");
    return bytes;
  }

 private:
  kvp_cache* cache_ = nullptr;
  std::string error_;
};

kvp_pack_args Args(const std::vector<int32_t>& ids, int first, int count, AlignedBytes* buf,
                   const void* signature = nullptr) {
  return PackArgs(ids.data(), static_cast<int>(ids.size()), first, count, buf->data(), buf->size(),
                  signature);
}

// Every K/V dtype pair, with and without key smoothing: the buffer is the
// documented layout of the source's blocks; unpacking writes exactly the
// listed blocks of a cache of another size; packing those again gives the
// same buffer.
TEST(Pack, RoundTripEveryFormat) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int k_dtype : kKvDtypes) {
    for (int v_dtype : kKvDtypes) {
      for (bool smoothed : {false, true}) {
        const Format f = RandomFormat(rng, k_dtype, v_dtype, smoothed);
        SCOPED_TRACE(f.Describe());
        TestCache src(f, 16), dst(f, 28);
        ASSERT_EQ(src.error(), "");
        ASSERT_EQ(dst.error(), "");
        ASSERT_EQ(src.Fill(rng), "");
        ASSERT_EQ(dst.Fill(rng), "");
        const int n = rng.uniform(1, 12);
        std::vector<int32_t> src_ids(n);
        for (int32_t& id : src_ids) id = rng.uniform(0, 15);  // sources may repeat
        const std::vector<int32_t> dst_ids = DistinctIds(rng, n, 28);
        const std::vector<uint8_t> dst_sig = SignatureOf(dst.get());
        const std::vector<uint8_t> src_sig = SignatureOf(src.get());

        AlignedBytes buf(src.PackSize(n, 0));
        std::memset(buf.data(), 0xA5, buf.size());
        kvp_pack_args a = Args(src_ids, 0, 0, &buf, dst_sig.data());
        ASSERT_OK(kvp_cache_pack(src.get(), &a, nullptr));
        const Blocks from = ReadBlocks(src.get(), HostRead);
        ASSERT_TRUE(buf.bytes() == ExpectedPack(from, src_ids, 0, f.layers))
            << "the buffer is not the documented layout";

        const Blocks before = ReadBlocks(dst.get(), HostRead);
        a = Args(dst_ids, 0, 0, &buf, src_sig.data());
        ASSERT_OK(kvp_cache_unpack(dst.get(), &a, nullptr));
        EXPECT_EQ(FirstDifference(ExpectedUnpack(before, from, src_ids, dst_ids, 0, f.layers),
                                  ReadBlocks(dst.get(), HostRead)),
                  "");

        AlignedBytes again(buf.size());
        a = Args(dst_ids, 0, 0, &again);
        ASSERT_OK(kvp_cache_pack(dst.get(), &a, nullptr));
        EXPECT_TRUE(again.bytes() == buf.bytes()) << "packed back, the bytes differ";
      }
    }
  }
}

// A sequence moved to another cache, at the blocks that cache's own block
// manager gave it, decodes to the same bits there.
TEST(Pack, MovedSequenceDecodesToTheSameBits) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Format f = RandomFormat(rng, KVP_DTYPE_INT8, KVP_DTYPE_INT4, true);
  f.layers = 3;
  TestCache prefill(f, 32), decode(f, 48);
  ASSERT_EQ(prefill.error(), "");
  ASSERT_EQ(decode.error(), "");
  const int len = 3 * f.block_size + 5;
  const int width = (len + f.block_size - 1) / f.block_size;
  int64_t seq = 0, other = 0, moved = 0;
  std::vector<int64_t> slots(len);
  ASSERT_OK(kvp_seq_create(prefill.get(), &seq));
  ASSERT_OK(kvp_seq_append(prefill.get(), seq, len, slots.data(), nullptr));
  ASSERT_EQ(prefill.Write(rng, slots), "");
  // The decode side holds another sequence first: its ids differ.
  ASSERT_OK(kvp_seq_create(decode.get(), &other));
  ASSERT_OK(kvp_seq_append(decode.get(), other, 2 * f.block_size + 1, nullptr, nullptr));
  ASSERT_OK(kvp_seq_create(decode.get(), &moved));
  ASSERT_OK(kvp_seq_append(decode.get(), moved, len, nullptr, nullptr));
  std::vector<int32_t> from(width), to(width);
  int32_t from_len = 0, to_len = 0;
  ASSERT_OK(
      kvp_cache_export_block_table(prefill.get(), &seq, 1, width, width, from.data(), &from_len));
  ASSERT_OK(
      kvp_cache_export_block_table(decode.get(), &moved, 1, width, width, to.data(), &to_len));
  ASSERT_EQ(from_len, len);
  ASSERT_EQ(to_len, len);
  ASSERT_NE(from, to);

  // Layer by layer through one buffer, as an engine streams it.
  AlignedBytes buf(prefill.PackSize(width, 1));
  for (int l = 0; l < f.layers; ++l) {
    kvp_pack_args a = Args(from, l, 1, &buf);
    ASSERT_OK(kvp_cache_pack(prefill.get(), &a, nullptr));
    a = Args(to, l, 1, &buf);
    ASSERT_OK(kvp_cache_unpack(decode.get(), &a, nullptr));
  }

  const int hq = 2 * f.heads;
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = 1;
  dc.max_context_len = width * f.block_size;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  const std::vector<float> q = rng.normals(size_t(hq) * f.head_size);
  for (int l = 0; l < f.layers; ++l) {
    std::vector<float> outs[2];
    const TestCache* caches[2] = {&prefill, &decode};
    const std::vector<int32_t>* tables[2] = {&from, &to};
    for (int side = 0; side < 2; ++side) {
      kvp_decoder* dec = nullptr;
      ASSERT_OK(kvp_decoder_create(caches[side]->get(), &dc, &dec));
      outs[side].assign(q.size(), std::nanf(""));
      kvp_decode_args a;
      kvp_decode_args_init(&a);
      a.layer = l;
      a.num_seqs = 1;
      a.q = q.data();
      a.block_table = tables[side]->data();
      a.block_table_width = width;
      a.seq_lens = &len;
      a.out = outs[side].data();
      const std::string err = TakeError(kvp_decode(dec, &a, nullptr));
      kvp_decoder_destroy(dec);
      ASSERT_EQ(err, "");
    }
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), q.size() * sizeof(float)), 0)
        << "layer " << l << " decodes differently after the move";
  }
}

// One pack of several layers is the packs of its layers one after another;
// unpacking layer by layer equals unpacking all at once; num_layers = 0
// reaches the last layer.
TEST(Pack, LayerRangesAreSlicesOfOneBuffer) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Format f = RandomFormat(rng, KVP_DTYPE_FP8_E4M3, KVP_DTYPE_BF16, false);
  f.layers = 4;
  TestCache src(f, 20), whole(f, 20), layered(f, 20);
  for (TestCache* c : {&src, &whole, &layered}) ASSERT_EQ(c->error(), "");
  ASSERT_EQ(src.Fill(rng), "");
  Rng same(rng.seed + 1), same_again(rng.seed + 1);  // the two destinations start equal
  ASSERT_EQ(whole.Fill(same), "");
  ASSERT_EQ(layered.Fill(same_again), "");
  const std::vector<int32_t> ids = DistinctIds(rng, 7, 20), dst = DistinctIds(rng, 7, 20);
  const uint64_t layer_bytes = src.PackSize(7, 1);
  ASSERT_EQ(src.PackSize(7, 0), 4 * layer_bytes);
  AlignedBytes all(src.PackSize(7, 0));
  kvp_pack_args a = Args(ids, 0, 0, &all);
  ASSERT_OK(kvp_cache_pack(src.get(), &a, nullptr));
  const std::vector<uint8_t> all_bytes = all.bytes();
  for (int first = 0; first < 4; ++first) {
    for (int count = 0; count <= 4 - first; ++count) {
      SCOPED_TRACE(absl::StrFormat("layers from %d, num_layers %d", first, count));
      const int layers = count == 0 ? 4 - first : count;
      AlignedBytes part(layers * layer_bytes);
      a = Args(ids, first, count, &part);
      ASSERT_OK(kvp_cache_pack(src.get(), &a, nullptr));
      ASSERT_TRUE(part.bytes() ==
                  std::vector<uint8_t>(all_bytes.begin() + first * layer_bytes,
                                       all_bytes.begin() + (first + layers) * layer_bytes));
    }
  }
  a = Args(dst, 0, 0, &all);
  ASSERT_OK(kvp_cache_unpack(whole.get(), &a, nullptr));
  for (int l = 0; l < 4; ++l) {
    AlignedBytes part(layer_bytes);
    std::memcpy(part.data(), all.data() + l * layer_bytes, layer_bytes);
    a = Args(dst, l, 1, &part);
    ASSERT_OK(kvp_cache_unpack(layered.get(), &a, nullptr));
  }
  EXPECT_EQ(FirstDifference(ReadBlocks(whole.get(), HostRead), ReadBlocks(layered.get(), HostRead)),
            "");
}

// The size query follows the layout: blocks x layers x the bytes of one
// block's regions.
TEST(Pack, SizeIsBlocksTimesLayersTimesTheBlockRegions) {
  for (int k_dtype : kKvDtypes) {
    for (int v_dtype : kKvDtypes) {
      Format f;
      f.layers = 3;
      f.k_dtype = k_dtype;
      f.v_dtype = v_dtype;
      TestCache c(f, 10);
      ASSERT_EQ(c.error(), "");
      kvp_layer_layout lay;
      kvp_layer_layout_init(&lay);
      ASSERT_OK(kvp_cache_get_layout(c.get(), 0, &lay));
      const uint64_t block = lay.k_block_stride + lay.v_block_stride + lay.k_scale_block_stride +
                             lay.v_scale_block_stride;
      EXPECT_EQ(c.PackSize(7, 2), 7 * 2 * block);
      EXPECT_EQ(c.PackSize(7, 0), 7 * 3 * block);
      EXPECT_EQ(c.PackSize(0, 1), 0u);
      EXPECT_EQ(c.PackSize(1000, 1), 1000 * block);  // repeated sources may exceed num_blocks
    }
  }
}

// num_blocks = 0 moves nothing and succeeds with NULL pointers, but the
// other arguments are still checked.
TEST(Pack, NoBlocksIsANoOpThatStillChecksItsArguments) {
  Format f;
  TestCache c(f, 8);
  ASSERT_EQ(c.error(), "");
  kvp_pack_args a;
  kvp_pack_args_init(&a);
  ASSERT_OK(kvp_cache_pack(c.get(), &a, nullptr));
  ASSERT_OK(kvp_cache_unpack(c.get(), &a, nullptr));
  a.first_layer = f.layers;
  EXPECT_NE(TakeError(kvp_cache_pack(c.get(), &a, nullptr)).find("first_layer"), std::string::npos);
  a.first_layer = 0;
  a.reserved0 = 1;
  EXPECT_NE(TakeError(kvp_cache_unpack(c.get(), &a, nullptr)).find("reserved0"), std::string::npos);
}

// A caller built against a newer header passes a bigger struct.
TEST(Pack, LargerArgsStructIsAccepted) {
  Rng rng;
  Format f;
  TestCache c(f, 8);
  ASSERT_EQ(c.error(), "");
  ASSERT_EQ(c.Fill(rng), "");
  struct {
    kvp_pack_args s;
    unsigned char tail[16];
  } big;
  std::memset(&big, 0xA5, sizeof(big));
  const std::vector<int32_t> ids = {3, 1};
  AlignedBytes buf(c.PackSize(2, 0));
  big.s = Args(ids, 0, 0, &buf);
  big.s.struct_size = sizeof(kvp_pack_args) + 16;
  ASSERT_OK(kvp_cache_pack(c.get(), &big.s, nullptr));
  EXPECT_TRUE(buf.bytes() == ExpectedPack(ReadBlocks(c.get(), HostRead), ids, 0, f.layers));
}

// ---- Format signatures --------------------------------------------------------

uint64_t LittleEndian(const std::vector<uint8_t>& s, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t{s[at + i]} << (8 * i);
  return v;
}

// The blob holds the fields docs/FORMATS.md places, little-endian; the
// number of blocks does not enter it.
TEST(FormatSignature, FieldsSitWhereTheFormatPageSays) {
  Rng rng;
  Format f = RandomFormat(rng, KVP_DTYPE_INT4, KVP_DTYPE_FP8_E4M3, false);
  TestCache a(f, 8), b(f, 100);
  ASSERT_EQ(a.error(), "");
  ASSERT_EQ(b.error(), "");
  const std::vector<uint8_t> s = SignatureOf(a.get());
  EXPECT_EQ(s, SignatureOf(b.get()));
  EXPECT_EQ(std::string(s.begin(), s.begin() + 4), "KVPS");
  EXPECT_EQ(LittleEndian(s, 4, 4), 1u);  // signature version
  EXPECT_EQ(LittleEndian(s, 8, 4), 1u);  // packed layout version
  EXPECT_EQ(LittleEndian(s, 12, 4), uint64_t(f.layers));
  EXPECT_EQ(LittleEndian(s, 16, 4), uint64_t(f.block_size));
  EXPECT_EQ(LittleEndian(s, 20, 4), uint64_t(f.heads));
  EXPECT_EQ(LittleEndian(s, 24, 4), uint64_t(f.head_size));
  EXPECT_EQ(LittleEndian(s, 28, 4), uint64_t(KVP_DTYPE_INT4));
  EXPECT_EQ(LittleEndian(s, 32, 4), uint64_t(KVP_DTYPE_FP8_E4M3));
  EXPECT_EQ(LittleEndian(s, 36, 4), uint64_t(KVP_DTYPE_FP16));  // the scales' dtype
  EXPECT_EQ(LittleEndian(s, 40, 4), 0u);                        // no key smoothing
  EXPECT_EQ(LittleEndian(s, 44, 4), 0u);
  EXPECT_EQ(LittleEndian(s, 48, 8), 0u);
  EXPECT_EQ(LittleEndian(s, 56, 4), a.PackSize(1, 1));
  ASSERT_OK(kvp_cache_check_signature(a.get(), SignatureOf(b.get()).data(), s.size()));
  ASSERT_OK(kvp_cache_check_signature(b.get(), s.data(), s.size()));
  // A larger output buffer: 64 bytes written, the rest untouched.
  std::vector<uint8_t> big(80, 0xEE);
  ASSERT_OK(kvp_cache_format_signature(a.get(), big.data(), big.size()));
  EXPECT_TRUE(std::equal(s.begin(), s.end(), big.begin()));
  EXPECT_TRUE(std::all_of(big.begin() + 64, big.end(), [](uint8_t x) { return x == 0xEE; }));
}

// Each field that decides the bytes, changed alone: the check on either
// side names it and gives both values.
TEST(FormatSignature, EveryDifferingFieldIsNamedWithBothValues) {
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Format base;
  base.head_size = 128;
  for (int i = 0; i < base.heads * base.head_size; ++i) {
    base.smoothing.push_back(std::exp(rng.normal(0.5f)));
  }
  struct Variant {
    const char* field;
    Format f;
    std::string ours, theirs;  // in the message: this cache's value, the peer's
  };
  std::vector<Variant> variants;
  auto add = [&](const char* field, auto mutate, std::string ours, std::string theirs) {
    Format f = base;
    mutate(f);
    variants.push_back({field, f, ours, theirs});
  };
  add(
      "num_layers", [](Format& f) { f.layers = 3; }, "2", "3");
  add(
      "block_size", [](Format& f) { f.block_size = 32; }, "16", "32");
  add(
      "num_kv_heads",
      [](Format& f) {
        f.heads = 1;
        f.smoothing.resize(128);
      },
      "2", "1");
  add(
      "head_size",
      [](Format& f) {
        f.head_size = 64;
        f.smoothing.resize(128);
      },
      "128", "64");
  add(
      "k_dtype", [](Format& f) { f.k_dtype = KVP_DTYPE_FP8_E4M3; }, "INT8 (4)", "FP8 (3)");
  add(
      "v_dtype", [](Format& f) { f.v_dtype = KVP_DTYPE_BF16; }, "INT4 (5)", "BF16 (2)");
  add(
      "key smoothing", [](Format& f) { f.smoothing.clear(); }, "present", "absent");
  add(
      "key smoothing hash", [](Format& f) { f.smoothing[77] *= 1.0001f; }, "0x", "0x");
  TestCache mine(base, 8);
  ASSERT_EQ(mine.error(), "");
  const std::vector<uint8_t> my_sig = SignatureOf(mine.get());
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.field);
    TestCache peer(v.f, 12);
    ASSERT_EQ(peer.error(), "");
    const std::vector<uint8_t> peer_sig = SignatureOf(peer.get());
    const std::string err = TakeError(kvp_cache_check_signature(mine.get(), peer_sig.data(), 64));
    EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
    EXPECT_NE(err.find(std::string(v.field) + " is " + v.theirs), std::string::npos) << err;
    EXPECT_NE(err.find("in the signature, " + v.ours), std::string::npos) << err;
    EXPECT_NE(err.find("in this cache"), std::string::npos) << err;
    // The other way round, and through kvp_pack_args.signature.
    EXPECT_NE(TakeError(kvp_cache_check_signature(peer.get(), my_sig.data(), 64)).find(v.field),
              std::string::npos);
    kvp_pack_args a;
    kvp_pack_args_init(&a);
    a.signature = peer_sig.data();
    EXPECT_NE(TakeError(kvp_cache_unpack(mine.get(), &a, nullptr)).find(v.field),
              std::string::npos);
  }
}

// Blobs that are not a signature of this version, or were altered.
TEST(FormatSignature, DamagedBlobsAreRefused) {
  Format f;
  TestCache c(f, 8);
  ASSERT_EQ(c.error(), "");
  const std::vector<uint8_t> good = SignatureOf(c.get());
  auto check = [&](const std::vector<uint8_t>& s, size_t n) {
    return TakeError(kvp_cache_check_signature(c.get(), s.data(), n));
  };
  ASSERT_EQ(check(good, 64), "");
  std::vector<uint8_t> s = good;
  s[0] = 'X';
  EXPECT_NE(check(s, 64).find("magic"), std::string::npos);
  s = good;
  s[4] = 2;
  EXPECT_NE(check(s, 64).find("version 2"), std::string::npos);
  s = good;
  s[20] ^= 1;  // num_kv_heads changed without its checksum
  EXPECT_NE(check(s, 64).find("checksum"), std::string::npos);
  s = good;
  s[63] ^= 0x80;
  EXPECT_NE(check(s, 64).find("checksum"), std::string::npos);
  for (size_t n : {size_t{0}, size_t{7}, size_t{63}, size_t{65}}) {
    std::vector<uint8_t> longer = good;
    longer.resize(80);
    EXPECT_NE(check(longer, n).find("signature_bytes = " + std::to_string(n)), std::string::npos)
        << n;
  }
  EXPECT_NE(TakeError(kvp_cache_check_signature(c.get(), nullptr, 64)).find("signature"),
            std::string::npos);
  EXPECT_NE(TakeError(kvp_cache_check_signature(nullptr, good.data(), 64)).find("cache"),
            std::string::npos);
  std::vector<uint8_t> out(64, 0x11);
  EXPECT_NE(TakeError(kvp_cache_format_signature(c.get(), out.data(), 63)).find("63"),
            std::string::npos);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t x) { return x == 0x11; }));
  EXPECT_NE(TakeError(kvp_cache_format_signature(c.get(), nullptr, 64)).find("signature"),
            std::string::npos);
  EXPECT_NE(TakeError(kvp_cache_format_signature(nullptr, out.data(), 64)).find("cache"),
            std::string::npos);
}

// The function table carries the ABI 1.4 entries.
TEST(Pack, FunctionTableCarriesTheEntries) {
  const kvp_api* api = kvp_get_api(KVP_ABI_MAJOR);
  ASSERT_NE(api, nullptr);
  ASSERT_GE(api->abi_minor, 4u);
  ASSERT_GE(api->struct_size, size_t{KVP_API_STRUCT_SIZE_1_4});
  EXPECT_EQ(api->cache_pack, &kvp_cache_pack);
  EXPECT_EQ(api->cache_unpack, &kvp_cache_unpack);
  EXPECT_EQ(api->cache_pack_size, &kvp_cache_pack_size);
  EXPECT_EQ(api->pack_args_init, &kvp_pack_args_init);
  EXPECT_EQ(api->cache_format_signature, &kvp_cache_format_signature);
  EXPECT_EQ(api->cache_check_signature, &kvp_cache_check_signature);
}

}  // namespace
}  // namespace testing
}  // namespace kvpage
