// SPDX-License-Identifier: Apache-2.0
// Tests of CacheGeometry against hand-computed strides, offsets and element
// addresses, plus exhaustive checks that every element has its own bits.
#include "src/geometry.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>

namespace kvpage {
namespace {

CacheGeometry MakeGeometry(DType k, DType v, int head_size = 128, int num_kv_heads = 2,
                           int block_size = 16, int num_blocks = 3, int num_layers = 2) {
  CacheGeometry g;
  g.num_layers = num_layers;
  g.num_blocks = num_blocks;
  g.block_size = block_size;
  g.num_kv_heads = num_kv_heads;
  g.head_size = head_size;
  g.k_dtype = k;
  g.v_dtype = v;
  return g;
}

TEST(GeometryTest, DTypeProperties) {
  EXPECT_EQ(DTypeBits(DType::kFP32), 32);
  EXPECT_EQ(DTypeBits(DType::kFP16), 16);
  EXPECT_EQ(DTypeBits(DType::kBF16), 16);
  EXPECT_EQ(DTypeBits(DType::kFP8E4M3), 8);
  EXPECT_EQ(DTypeBits(DType::kINT8), 8);
  EXPECT_EQ(DTypeBits(DType::kINT4), 4);
  EXPECT_FALSE(IsQuantized(DType::kBF16));
  EXPECT_FALSE(IsQuantized(DType::kFP16));
  EXPECT_TRUE(IsQuantized(DType::kFP8E4M3));
  EXPECT_TRUE(IsQuantized(DType::kINT8));
  EXPECT_TRUE(IsQuantized(DType::kINT4));
  EXPECT_EQ(ScaleEntryBytes(DType::kBF16), 0);
  EXPECT_EQ(ScaleEntryBytes(DType::kFP8E4M3), 2);
  EXPECT_EQ(ScaleEntryBytes(DType::kINT8), 2);
  EXPECT_EQ(ScaleEntryBytes(DType::kINT4), 4);
  EXPECT_EQ(AlignUp(0, 256), 0);
  EXPECT_EQ(AlignUp(1, 256), 256);
  EXPECT_EQ(AlignUp(256, 256), 256);
  EXPECT_EQ(AlignUp(12672, 256), 12800);
}

TEST(GeometryTest, Bf16HandComputed) {
  const CacheGeometry g = MakeGeometry(DType::kBF16, DType::kBF16);
  EXPECT_EQ(g.k_x(), 8);
  EXPECT_EQ(g.k_chunks(), 16);
  EXPECT_EQ(g.k_chunk_stride(), 256);   // 16 tokens * 16 bytes
  EXPECT_EQ(g.k_head_stride(), 4096);   // 16 chunks
  EXPECT_EQ(g.k_block_stride(), 8192);  // 2 heads
  EXPECT_EQ(g.v_channel_stride(), 32);  // 16 tokens * 2 bytes
  EXPECT_EQ(g.v_head_stride(), 4096);
  EXPECT_EQ(g.v_block_stride(), 8192);
  EXPECT_EQ(g.k_scale_entry_bytes(), 0);
  EXPECT_EQ(g.k_scale_bytes(), 0);
  EXPECT_EQ(g.k_data_bytes(), 24576);
  EXPECT_EQ(g.v_data_offset(), 24576);
  EXPECT_EQ(g.k_scale_offset(), 49152);
  EXPECT_EQ(g.v_scale_offset(), 49152);
  EXPECT_EQ(g.layer_bytes(), 49152);
  EXPECT_EQ(g.total_bytes(), 98304);
  EXPECT_EQ(g.bytes_per_token_per_layer(), 1024);  // 2 * (256 + 256)
  // Block 1, head 1, token 3, element 13: chunk 1, element 5 in the chunk.
  EXPECT_EQ(g.k_byte(1, 1, 3, 13), 8192 + 4096 + 256 + 3 * 16 + 5 * 2);
  EXPECT_EQ(g.k_byte(1, 1, 3, 13), 12602);
  EXPECT_EQ(g.v_byte(1, 1, 3, 13), 8192 + 4096 + 13 * 32 + 3 * 2);
  EXPECT_EQ(g.k_shift(13), 0);
  EXPECT_EQ(g.v_shift(3), 0);
}

TEST(GeometryTest, Fp16MatchesBf16) {
  const CacheGeometry a = MakeGeometry(DType::kFP16, DType::kFP16);
  const CacheGeometry b = MakeGeometry(DType::kBF16, DType::kBF16);
  EXPECT_EQ(a.layer_bytes(), b.layer_bytes());
  EXPECT_EQ(a.k_byte(2, 1, 15, 127), b.k_byte(2, 1, 15, 127));
  EXPECT_EQ(a.v_byte(2, 1, 15, 127), b.v_byte(2, 1, 15, 127));
}

TEST(GeometryTest, Fp8AndInt8HandComputed) {
  for (DType dtype : {DType::kFP8E4M3, DType::kINT8}) {
    const CacheGeometry g = MakeGeometry(dtype, dtype);
    EXPECT_EQ(g.k_x(), 16);
    EXPECT_EQ(g.k_chunks(), 8);
    EXPECT_EQ(g.k_chunk_stride(), 256);
    EXPECT_EQ(g.k_head_stride(), 2048);
    EXPECT_EQ(g.k_block_stride(), 4096);
    EXPECT_EQ(g.v_channel_stride(), 16);
    EXPECT_EQ(g.v_head_stride(), 2048);
    EXPECT_EQ(g.v_block_stride(), 4096);
    EXPECT_EQ(g.k_data_bytes(), 12288);
    EXPECT_EQ(g.v_data_offset(), 12288);
    EXPECT_EQ(g.k_scale_offset(), 24576);
    EXPECT_EQ(g.k_scale_entry_bytes(), 2);
    EXPECT_EQ(g.k_scale_head_stride(), 32);
    EXPECT_EQ(g.k_scale_block_stride(), 64);
    EXPECT_EQ(g.k_scale_bytes(), 192);
    EXPECT_EQ(g.v_scale_offset(), 24832);  // 24576 + 192, aligned up
    EXPECT_EQ(g.v_scale_bytes(), 192);
    EXPECT_EQ(g.layer_bytes(), 25088);  // 24832 + 192, aligned up
    EXPECT_EQ(g.total_bytes(), 50176);
    EXPECT_EQ(g.bytes_per_token_per_layer(), 520);  // 2 * (128 + 128 + 2 + 2)
    // Block 2, head 1, token 5, element 37: chunk 2, byte 5 in the chunk.
    EXPECT_EQ(g.k_byte(2, 1, 5, 37), 8192 + 2048 + 2 * 256 + 5 * 16 + 5);
    EXPECT_EQ(g.v_byte(2, 1, 6, 37), 8192 + 2048 + 37 * 16 + 6);
    EXPECT_EQ(g.k_scale_byte(2, 1, 5), 128 + 32 + 10);
    EXPECT_EQ(g.v_scale_byte(1, 0, 15), 64 + 30);
  }
}

TEST(GeometryTest, Int4HandComputed) {
  const CacheGeometry g = MakeGeometry(DType::kINT4, DType::kINT4);
  EXPECT_EQ(g.k_x(), 32);
  EXPECT_EQ(g.k_chunks(), 4);
  EXPECT_EQ(g.k_chunk_stride(), 256);
  EXPECT_EQ(g.k_head_stride(), 1024);
  EXPECT_EQ(g.k_block_stride(), 2048);
  EXPECT_EQ(g.v_channel_stride(), 8);  // 16 tokens, two per byte
  EXPECT_EQ(g.v_head_stride(), 1024);
  EXPECT_EQ(g.v_block_stride(), 2048);
  EXPECT_EQ(g.k_data_bytes(), 6144);
  EXPECT_EQ(g.v_data_offset(), 6144);
  EXPECT_EQ(g.k_scale_offset(), 12288);
  EXPECT_EQ(g.k_scale_entry_bytes(), 4);
  EXPECT_EQ(g.k_scale_head_stride(), 64);
  EXPECT_EQ(g.k_scale_block_stride(), 128);
  EXPECT_EQ(g.k_scale_bytes(), 384);
  EXPECT_EQ(g.v_scale_offset(), 12800);           // 12672 aligned up
  EXPECT_EQ(g.layer_bytes(), 13312);              // 13184 aligned up
  EXPECT_EQ(g.bytes_per_token_per_layer(), 272);  // 2 * (64 + 64 + 4 + 4)
  // K element 45 of token 7: chunk 1, element 13 -> byte 6, high nibble.
  EXPECT_EQ(g.k_byte(1, 0, 7, 45), 2048 + 256 + 7 * 16 + 6);
  EXPECT_EQ(g.k_shift(45), 4);
  EXPECT_EQ(g.k_byte(1, 0, 7, 44), g.k_byte(1, 0, 7, 45));
  EXPECT_EQ(g.k_shift(44), 0);
  // V element 45 of token 7: channel 45, byte 3, high nibble; token 6
  // shares the byte in the low nibble.
  EXPECT_EQ(g.v_byte(1, 0, 7, 45), 2048 + 45 * 8 + 3);
  EXPECT_EQ(g.v_shift(7), 4);
  EXPECT_EQ(g.v_byte(1, 0, 6, 45), g.v_byte(1, 0, 7, 45));
  EXPECT_EQ(g.v_shift(6), 0);
  EXPECT_EQ(g.k_scale_byte(2, 1, 3), 256 + 64 + 12);
}

TEST(GeometryTest, Int4KeyChunksRoundUpForOddHeadSizes) {
  // head_size 80: 80 / 32 = 2.5 -> 3 chunks; 112 -> 4 chunks.
  const CacheGeometry g80 = MakeGeometry(DType::kINT4, DType::kINT4, 80, 1);
  EXPECT_EQ(g80.k_chunks(), 3);
  EXPECT_EQ(g80.k_head_stride(), 3 * 256);
  EXPECT_EQ(g80.v_head_stride(), 80 * 8);
  EXPECT_EQ(g80.bytes_per_token_per_layer(), 3 * 16 + 40 + 4 + 4);  // 96
  const CacheGeometry g112 = MakeGeometry(DType::kINT4, DType::kFP8E4M3, 112, 1);
  EXPECT_EQ(g112.k_chunks(), 4);
  EXPECT_EQ(g112.bytes_per_token_per_layer(), 4 * 16 + 112 + 4 + 2);  // 182
  // Other dtypes divide 80 and 112 exactly (or nearly: FP8 80 -> 5 chunks,
  // 112 -> 7 chunks; BF16 80 -> 10, 112 -> 14).
  EXPECT_EQ(MakeGeometry(DType::kFP8E4M3, DType::kFP8E4M3, 80).k_chunks(), 5);
  EXPECT_EQ(MakeGeometry(DType::kINT8, DType::kINT8, 112).k_chunks(), 7);
  EXPECT_EQ(MakeGeometry(DType::kBF16, DType::kBF16, 112).k_chunks(), 14);

  // A wider case: 4 heads, block size 32, 5 blocks, head_size 80.
  const CacheGeometry g = MakeGeometry(DType::kINT4, DType::kBF16, 80, 4, 32, 5);
  EXPECT_EQ(g.k_chunk_stride(), 512);
  EXPECT_EQ(g.k_head_stride(), 1536);
  EXPECT_EQ(g.k_block_stride(), 6144);
  EXPECT_EQ(g.k_data_bytes(), 30720);
  // Last element: chunk 2, element 15 in the chunk -> byte 7, high nibble.
  EXPECT_EQ(g.k_byte(4, 3, 31, 79), 4 * 6144 + 3 * 1536 + 2 * 512 + 31 * 16 + 7);
  EXPECT_EQ(g.k_shift(79), 4);
  EXPECT_LT(g.k_byte(4, 3, 31, 79), g.k_data_bytes());
  // Elements 80..95 of the last chunk are padding: bytes 8..15 of the row.
  EXPECT_EQ(g.k_byte(0, 0, 0, 79) % 16, 7);
}

TEST(GeometryTest, MixedDtypesUseTheirOwnStrides) {
  const CacheGeometry g = MakeGeometry(DType::kINT8, DType::kINT4);
  EXPECT_EQ(g.k_x(), 16);
  EXPECT_EQ(g.k_head_stride(), 8 * 256);
  EXPECT_EQ(g.v_channel_stride(), 8);
  EXPECT_EQ(g.k_scale_entry_bytes(), 2);
  EXPECT_EQ(g.v_scale_entry_bytes(), 4);
  EXPECT_EQ(g.bytes_per_token_per_layer(), 2 * (128 + 64 + 2 + 4));
}

// Every element of every region maps to its own (byte, shift) inside its
// region, regions are 256-aligned and do not overlap.
void ExpectDisjointAndInBounds(const CacheGeometry& g) {
  EXPECT_EQ(g.v_data_offset() % kRegionAlignment, 0);
  EXPECT_EQ(g.k_scale_offset() % kRegionAlignment, 0);
  EXPECT_EQ(g.v_scale_offset() % kRegionAlignment, 0);
  EXPECT_EQ(g.layer_bytes() % kRegionAlignment, 0);
  EXPECT_LE(g.k_data_offset() + g.k_data_bytes(), g.v_data_offset());
  EXPECT_LE(g.v_data_offset() + g.v_data_bytes(), g.k_scale_offset());
  EXPECT_LE(g.k_scale_offset() + g.k_scale_bytes(), g.v_scale_offset());
  EXPECT_LE(g.v_scale_offset() + g.v_scale_bytes(), g.layer_bytes());
  EXPECT_EQ(g.total_bytes(), g.num_layers * g.layer_bytes());

  std::set<std::pair<int64_t, int>> k_seen;
  std::set<std::pair<int64_t, int>> v_seen;
  std::set<int64_t> ks_seen;
  std::set<int64_t> vs_seen;
  for (int b = 0; b < g.num_blocks; ++b) {
    for (int h = 0; h < g.num_kv_heads; ++h) {
      for (int t = 0; t < g.block_size; ++t) {
        for (int d = 0; d < g.head_size; ++d) {
          const int64_t kb = g.k_byte(b, h, t, d);
          const int64_t vb = g.v_byte(b, h, t, d);
          ASSERT_GE(kb, 0);
          ASSERT_LT(kb, g.k_data_bytes());
          ASSERT_GE(vb, 0);
          ASSERT_LT(vb, g.v_data_bytes());
          ASSERT_TRUE(k_seen.insert({kb, g.k_shift(d)}).second);
          ASSERT_TRUE(v_seen.insert({vb, g.v_shift(t)}).second);
        }
        const int64_t ks = g.k_scale_byte(b, h, t);
        const int64_t vs = g.v_scale_byte(b, h, t);
        if (g.k_scale_entry_bytes() > 0) {
          ASSERT_LE(ks + g.k_scale_entry_bytes(), g.k_scale_bytes());
          ASSERT_TRUE(ks_seen.insert(ks).second);
        }
        if (g.v_scale_entry_bytes() > 0) {
          ASSERT_LE(vs + g.v_scale_entry_bytes(), g.v_scale_bytes());
          ASSERT_TRUE(vs_seen.insert(vs).second);
        }
      }
    }
  }
  // Dense except for INT4 K padding: the elements fill the region exactly.
  const int64_t k_elements_bytes =
      int64_t{g.num_blocks} * g.num_kv_heads * g.block_size * g.head_size * g.k_bits() / 8;
  if (g.head_size % g.k_x() == 0) {
    EXPECT_EQ(k_elements_bytes, g.k_data_bytes());
  } else {
    EXPECT_LT(k_elements_bytes, g.k_data_bytes());
  }
  EXPECT_EQ(static_cast<int64_t>(v_seen.size()) * g.v_bits(), g.v_data_bytes() * 8);
}

TEST(GeometryTest, EveryElementHasItsOwnBits) {
  const DType dtypes[] = {DType::kFP16, DType::kBF16, DType::kFP8E4M3, DType::kINT8, DType::kINT4};
  for (DType k : dtypes) {
    for (DType v : dtypes) {
      for (int head_size : {64, 80, 112}) {
        SCOPED_TRACE("k=" + std::to_string(static_cast<int>(k)) +
                     " v=" + std::to_string(static_cast<int>(v)) +
                     " head_size=" + std::to_string(head_size));
        ExpectDisjointAndInBounds(MakeGeometry(k, v, head_size, 2, 16, 2, 1));
      }
    }
  }
}

TEST(GeometryTest, UsableInConstantExpressions) {
  constexpr CacheGeometry g = [] {
    CacheGeometry c;
    c.num_layers = 1;
    c.num_blocks = 1;
    c.block_size = 16;
    c.num_kv_heads = 1;
    c.head_size = 128;
    c.k_dtype = DType::kINT8;
    c.v_dtype = DType::kINT8;
    return c;
  }();
  static_assert(g.bytes_per_token_per_layer() == 260, "");
  static_assert(g.layer_bytes() % kRegionAlignment == 0, "");
}

}  // namespace
}  // namespace kvpage
