// SPDX-License-Identifier: Apache-2.0
// Helpers of the pack / unpack suites (pack_test.cc, gpu_pack_test.cc): a
// cache's blocks read through the public layout query, and the packed
// buffer docs/FORMATS.md ("Packed blocks") describes, built from them
// independently of the library's own geometry code.
#ifndef KVPAGE_TESTS_CAPI_PACK_HELPERS_H_
#define KVPAGE_TESTS_CAPI_PACK_HELPERS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

namespace kvpage {
namespace testing {

// Copies n bytes of the cache's memory space to the host.
using ReadFn = void (*)(void* dst, const void* src, size_t n);
inline void HostRead(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }

// Every block's bytes: blocks[layer][region][block], regions K data, V
// data, K scales, V scales (a region the dtype lacks has no blocks).
using Blocks = std::vector<std::vector<std::vector<std::vector<uint8_t>>>>;
constexpr int kRegions = 4;
constexpr const char* kRegionNames[kRegions] = {"K data", "V data", "K scales", "V scales"};

inline Blocks ReadBlocks(const kvp_cache* cache, ReadFn read) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  TakeError(kvp_cache_get_info(cache, &info));
  Blocks b(info.num_layers, std::vector<std::vector<std::vector<uint8_t>>>(kRegions));
  for (int l = 0; l < info.num_layers; ++l) {
    kvp_layer_layout lay;
    kvp_layer_layout_init(&lay);
    TakeError(kvp_cache_get_layout(cache, l, &lay));
    const struct {
      const void* base;
      int64_t stride;
    } regions[kRegions] = {{lay.k_data, lay.k_block_stride},
                           {lay.v_data, lay.v_block_stride},
                           {lay.k_scales, lay.k_scale_block_stride},
                           {lay.v_scales, lay.v_scale_block_stride}};
    for (int r = 0; r < kRegions; ++r) {
      if (regions[r].base == nullptr || regions[r].stride == 0) continue;
      std::vector<uint8_t> all(static_cast<size_t>(info.num_blocks * regions[r].stride));
      read(all.data(), regions[r].base, all.size());
      for (int32_t blk = 0; blk < info.num_blocks; ++blk) {
        const uint8_t* p = all.data() + blk * regions[r].stride;
        b[l][r].emplace_back(p, p + regions[r].stride);
      }
    }
  }
  return b;
}

// The buffer kvp_cache_pack must write for `ids` over layers
// [first, first + count): per layer, per region, each listed block's bytes.
inline std::vector<uint8_t> ExpectedPack(const Blocks& b, const std::vector<int32_t>& ids,
                                         int first, int count) {
  std::vector<uint8_t> out;
  for (int l = first; l < first + count; ++l) {
    for (int r = 0; r < kRegions; ++r) {
      if (b[l][r].empty()) continue;
      for (int32_t id : ids) out.insert(out.end(), b[l][r][id].begin(), b[l][r][id].end());
    }
  }
  return out;
}

// `dst` after unpacking the pack of `src_ids` of `src` into `dst_ids`.
inline Blocks ExpectedUnpack(Blocks dst, const Blocks& src, const std::vector<int32_t>& src_ids,
                             const std::vector<int32_t>& dst_ids, int first, int count) {
  for (int l = first; l < first + count; ++l) {
    for (int r = 0; r < kRegions; ++r) {
      for (size_t i = 0; i < dst_ids.size(); ++i) {
        if (!dst[l][r].empty()) dst[l][r][dst_ids[i]] = src[l][r][src_ids[i]];
      }
    }
  }
  return dst;
}

// "" when equal, else where the first difference lies.
inline std::string FirstDifference(const Blocks& want, const Blocks& got) {
  if (want.size() != got.size()) return "different numbers of layers";
  for (size_t l = 0; l < want.size(); ++l) {
    for (int r = 0; r < kRegions; ++r) {
      if (want[l][r].size() != got[l][r].size()) return "different numbers of blocks";
      for (size_t blk = 0; blk < want[l][r].size(); ++blk) {
        if (want[l][r][blk] != got[l][r][blk]) {
          return "layer " + std::to_string(l) + " " + kRegionNames[r] + " block " +
                 std::to_string(blk);
        }
      }
    }
  }
  return "";
}

// Random tokens (FP32 inputs, K with a wider spread than V) in `slots` of
// every layer of a CPU cache; the error's message, or "".
inline std::string WriteRandomTokens(kvp_cache* cache, Rng& rng,
                                     const std::vector<int64_t>& slots) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  std::string err = TakeError(kvp_cache_get_info(cache, &info));
  const size_t n = slots.size() * info.num_kv_heads * info.head_size;
  for (int l = 0; l < info.num_layers && err.empty(); ++l) {
    const std::vector<float> k = rng.normals(n, 2.0f), v = rng.normals(n);
    kvp_write_args a;
    kvp_write_args_init(&a);
    a.layer = l;
    a.num_tokens = static_cast<int32_t>(slots.size());
    a.input_dtype = KVP_DTYPE_FP32;
    a.key = k.data();
    a.value = v.data();
    a.slot_mapping = slots.data();
    err = TakeError(kvp_cache_write(cache, &a, nullptr));
  }
  return err;
}

// Random tokens in every slot of every layer of a CPU cache.
inline std::string FillEveryBlock(kvp_cache* cache, Rng& rng) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  TakeError(kvp_cache_get_info(cache, &info));
  std::vector<int64_t> slots(static_cast<size_t>(info.num_blocks) * info.block_size);
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  return WriteRandomTokens(cache, rng, slots);
}

// `n` distinct random block ids below `num_blocks`.
inline std::vector<int32_t> DistinctIds(Rng& rng, int n, int num_blocks) {
  std::vector<int32_t> ids(num_blocks);
  for (int i = 0; i < num_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng.gen);
  ids.resize(n);
  return ids;
}

inline kvp_pack_args PackArgs(const int32_t* ids, int n, int first, int count, void* buffer,
                              uint64_t bytes, const void* signature = nullptr) {
  kvp_pack_args a;
  kvp_pack_args_init(&a);
  a.block_ids = ids;
  a.num_blocks = n;
  a.first_layer = first;
  a.num_layers = count;
  a.buffer = buffer;
  a.buffer_bytes = bytes;
  a.signature = signature;
  return a;
}

// Host bytes at a 16-byte aligned address (packed buffers must be).
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t n = 0) : raw_(n + 16) {}
  uint8_t* data() {
    const auto at = reinterpret_cast<uintptr_t>(raw_.data());
    return raw_.data() + (16 - at % 16) % 16;
  }
  size_t size() const { return raw_.size() - 16; }
  std::vector<uint8_t> bytes() { return std::vector<uint8_t>(data(), data() + size()); }

 private:
  std::vector<uint8_t> raw_;
};

// A cache format's signature, as a vector.
inline std::vector<uint8_t> SignatureOf(const kvp_cache* cache) {
  std::vector<uint8_t> s(KVP_FORMAT_SIGNATURE_BYTES);
  TakeError(kvp_cache_format_signature(cache, s.data(), s.size()));
  return s;
}

}  // namespace testing
}  // namespace kvpage

#endif  // KVPAGE_TESTS_CAPI_PACK_HELPERS_H_
