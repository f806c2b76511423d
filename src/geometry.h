// SPDX-License-Identifier: Apache-2.0
// Cache geometry: the one place that turns a cache configuration into byte
// offsets. Plain data with no dependencies, so that CUDA kernels can include
// it as well as the host code.
#ifndef KVPAGE_SRC_GEOMETRY_H_
#define KVPAGE_SRC_GEOMETRY_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KVP_HOST_DEVICE __host__ __device__
#else
#define KVP_HOST_DEVICE
#endif

namespace kvpage {

// Values equal the C API's kvp_dtype_t.
enum class DType : int32_t {
  kFP32 = 0,
  kFP16 = 1,
  kBF16 = 2,
  kFP8E4M3 = 3,
  kINT8 = 4,
  kINT4 = 5,
};

// "FP32", "FP16", "BF16", "FP8", "INT8", "INT4" (messages, test names).
KVP_HOST_DEVICE constexpr const char* DTypeName(DType t) {
  return t == DType::kFP32      ? "FP32"
         : t == DType::kFP16    ? "FP16"
         : t == DType::kBF16    ? "BF16"
         : t == DType::kFP8E4M3 ? "FP8"
         : t == DType::kINT8    ? "INT8"
         : t == DType::kINT4    ? "INT4"
                                : "?";
}

KVP_HOST_DEVICE constexpr int DTypeBits(DType t) {
  return t == DType::kFP32                          ? 32
         : t == DType::kINT4                        ? 4
         : (t == DType::kFP16 || t == DType::kBF16) ? 16
                                                    : 8;
}
// Quantized cache dtypes carry a scale per token and KV head.
KVP_HOST_DEVICE constexpr bool IsQuantized(DType t) {
  return t == DType::kFP8E4M3 || t == DType::kINT8 || t == DType::kINT4;
}
// Bytes of one scale entry: FP16 scale (symmetric) or FP16 {scale, min}.
KVP_HOST_DEVICE constexpr int ScaleEntryBytes(DType t) {
  return t == DType::kINT4 ? 4 : IsQuantized(t) ? 2 : 0;
}

// Byte alignment of every region inside a layer (and of the layers).
constexpr int64_t kRegionAlignment = 256;

KVP_HOST_DEVICE constexpr int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The shape of a paged cache. Layouts (DESIGN.md):
//   K: [num_blocks][num_kv_heads][k_chunks][block_size][16 bytes = k_x elems]
//   V: [num_blocks][num_kv_heads][head_size][block_size * v_bits / 8 bytes]
//   scales: [num_blocks][num_kv_heads][block_size] entries
// Each layer occupies one region of layer_bytes(): K data, V data, K scales,
// V scales, each starting at a kRegionAlignment boundary.
struct CacheGeometry {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_size = 0;
  DType k_dtype = DType::kBF16;
  DType v_dtype = DType::kBF16;

  KVP_HOST_DEVICE constexpr int k_bits() const { return DTypeBits(k_dtype); }
  KVP_HOST_DEVICE constexpr int v_bits() const { return DTypeBits(v_dtype); }
  // Elements of K per 16-byte chunk.
  KVP_HOST_DEVICE constexpr int k_x() const { return 128 / k_bits(); }
  // Chunks per head; head_size need not divide k_x (INT4 with 80 or 112):
  // the tail of the last chunk is stored as zero bits and never read.
  KVP_HOST_DEVICE constexpr int k_chunks() const { return (head_size + k_x() - 1) / k_x(); }

  KVP_HOST_DEVICE constexpr int64_t k_chunk_stride() const { return int64_t{block_size} * 16; }
  KVP_HOST_DEVICE constexpr int64_t k_head_stride() const { return k_chunks() * k_chunk_stride(); }
  KVP_HOST_DEVICE constexpr int64_t k_block_stride() const {
    return num_kv_heads * k_head_stride();
  }
  KVP_HOST_DEVICE constexpr int64_t v_channel_stride() const {
    return int64_t{block_size} * v_bits() / 8;
  }
  KVP_HOST_DEVICE constexpr int64_t v_head_stride() const { return head_size * v_channel_stride(); }
  KVP_HOST_DEVICE constexpr int64_t v_block_stride() const {
    return num_kv_heads * v_head_stride();
  }
  KVP_HOST_DEVICE constexpr int k_scale_entry_bytes() const { return ScaleEntryBytes(k_dtype); }
  KVP_HOST_DEVICE constexpr int v_scale_entry_bytes() const { return ScaleEntryBytes(v_dtype); }
  KVP_HOST_DEVICE constexpr int64_t k_scale_head_stride() const {
    return int64_t{block_size} * k_scale_entry_bytes();
  }
  KVP_HOST_DEVICE constexpr int64_t k_scale_block_stride() const {
    return num_kv_heads * k_scale_head_stride();
  }
  KVP_HOST_DEVICE constexpr int64_t v_scale_head_stride() const {
    return int64_t{block_size} * v_scale_entry_bytes();
  }
  KVP_HOST_DEVICE constexpr int64_t v_scale_block_stride() const {
    return num_kv_heads * v_scale_head_stride();
  }

  // Per-layer region sizes and offsets.
  KVP_HOST_DEVICE constexpr int64_t k_data_bytes() const { return num_blocks * k_block_stride(); }
  KVP_HOST_DEVICE constexpr int64_t v_data_bytes() const { return num_blocks * v_block_stride(); }
  KVP_HOST_DEVICE constexpr int64_t k_scale_bytes() const {
    return num_blocks * k_scale_block_stride();
  }
  KVP_HOST_DEVICE constexpr int64_t v_scale_bytes() const {
    return num_blocks * v_scale_block_stride();
  }
  KVP_HOST_DEVICE constexpr int64_t k_data_offset() const { return 0; }
  KVP_HOST_DEVICE constexpr int64_t v_data_offset() const {
    return AlignUp(k_data_offset() + k_data_bytes(), kRegionAlignment);
  }
  KVP_HOST_DEVICE constexpr int64_t k_scale_offset() const {
    return AlignUp(v_data_offset() + v_data_bytes(), kRegionAlignment);
  }
  KVP_HOST_DEVICE constexpr int64_t v_scale_offset() const {
    return AlignUp(k_scale_offset() + k_scale_bytes(), kRegionAlignment);
  }
  KVP_HOST_DEVICE constexpr int64_t layer_bytes() const {
    return AlignUp(v_scale_offset() + v_scale_bytes(), kRegionAlignment);
  }
  KVP_HOST_DEVICE constexpr int64_t total_bytes() const { return num_layers * layer_bytes(); }

  // A block spans one slice of each of the layer's four regions (K data,
  // V data, K scales, V scales); copying a block copies all four.
  static constexpr int kNumBlockRegions = 4;
  struct BlockRegion {
    int64_t offset;        // of the region in the layer
    int64_t block_stride;  // bytes of one block in it (0: region absent)
  };
  KVP_HOST_DEVICE constexpr BlockRegion block_region(int i) const {
    return i == 0   ? BlockRegion{k_data_offset(), k_block_stride()}
           : i == 1 ? BlockRegion{v_data_offset(), v_block_stride()}
           : i == 2 ? BlockRegion{k_scale_offset(), k_scale_block_stride()}
                    : BlockRegion{v_scale_offset(), v_scale_block_stride()};
  }

  // A packed buffer (kvp_cache_pack, docs/FORMATS.md "Packed blocks") of n
  // blocks over a range of layers: layer-major; in each layer's part, each
  // region's bytes of the n blocks in list order, regions in block_region
  // order (absent ones take no bytes). One layer's part is
  // n * packed_block_bytes() bytes.
  KVP_HOST_DEVICE constexpr int64_t packed_block_bytes() const {
    return k_block_stride() + v_block_stride() + k_scale_block_stride() + v_scale_block_stride();
  }
  // Where region r's part starts in one layer's part of n blocks.
  KVP_HOST_DEVICE constexpr int64_t packed_region_offset(int r, int64_t n) const {
    int64_t before = 0;
    for (int q = 0; q < r; ++q) before += block_region(q).block_stride;
    return n * before;
  }

  // Bytes one token occupies in one layer (all KV heads, data + scales).
  KVP_HOST_DEVICE constexpr int64_t bytes_per_token_per_layer() const {
    return num_kv_heads * (int64_t{k_chunks()} * 16 + int64_t{head_size} * v_bits() / 8 +
                           k_scale_entry_bytes() + v_scale_entry_bytes());
  }

  // Address of K element d of token t (in block b, KV head h), relative to
  // the layer's K data: byte offset, and the bit shift inside that byte
  // (0 except for the high nibble of INT4).
  KVP_HOST_DEVICE constexpr int64_t k_byte(int64_t b, int h, int t, int d) const {
    return b * k_block_stride() + h * k_head_stride() + (d / k_x()) * k_chunk_stride() +
           int64_t{t} * 16 + (d % k_x()) * k_bits() / 8;
  }
  KVP_HOST_DEVICE constexpr int k_shift(int d) const { return k_bits() == 4 ? (d % 2) * 4 : 0; }
  // Address of V element d of token t; INT4 packs tokens 2i (low nibble) and
  // 2i+1 (high nibble) into one byte.
  KVP_HOST_DEVICE constexpr int64_t v_byte(int64_t b, int h, int t, int d) const {
    return b * v_block_stride() + h * v_head_stride() + d * v_channel_stride() +
           int64_t{t} * v_bits() / 8;
  }
  KVP_HOST_DEVICE constexpr int v_shift(int t) const { return v_bits() == 4 ? (t % 2) * 4 : 0; }
  KVP_HOST_DEVICE constexpr int64_t k_scale_byte(int64_t b, int h, int t) const {
    return b * k_scale_block_stride() + h * k_scale_head_stride() +
           int64_t{t} * k_scale_entry_bytes();
  }
  KVP_HOST_DEVICE constexpr int64_t v_scale_byte(int64_t b, int h, int t) const {
    return b * v_scale_block_stride() + h * v_scale_head_stride() +
           int64_t{t} * v_scale_entry_bytes();
  }
};

}  // namespace kvpage

#endif  // KVPAGE_SRC_GEOMETRY_H_
