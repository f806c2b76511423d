// SPDX-License-Identifier: Apache-2.0
// Cache write: quantize each new token's K and V per KV head and scatter
// them into the paged layout (src/geometry.h), byte-identical to the CPU
// backend's write (src/cpu_backend.cc, CpuBackend::Write).
//
// One thread block per tile of 32 consecutive tokens of the call and one KV
// head; one group of kLanes lanes (8 for head sizes up to 128, 16 up to 256)
// per token, each lane holding 16 channels. The write is bound by memory
// and by the quantizer's instructions (exact IEEE divisions), so the tile is
// laid out for both:
//   1. every lane loads its slice of the token's K and V rows at once
//      (16-byte streaming loads), before anything waits: a block has 32
//      tokens' rows in flight;
//   2. the tile's 64 rows are quantized in parallel, each by its own lane
//      group (reductions over kLanes lanes, no serial loop over tokens),
//      into shared memory laid out like the cache: K rows as bytes in chunk
//      order, V as [channel][token] codes, scales per token;
//   3. the tile is stored with adjacent threads on adjacent bytes of the
//      cache: K as 16-byte chunks (adjacent tokens of one chunk row), scales
//      per token, and V per unit (U tokens whose slots run from a multiple
//      of U: 16 bytes of a channel row, or the block's row if shorter) as
//      one vector store, and the other tokens per group (VGroup: tokens
//      whose slots are consecutive within one aligned 32-bit V word of W =
//      32 / v_bits tokens). A group that fills its word is one plain store.
//      Stores that fill whole lines of a quantized cache carry the
//      evict-first hint (StoreTileBytes).
// A group that fills part of its word (a run cut by the tile's edge, a
// decode step's token) stores its codes alone; an INT4 nibble then shares
// its byte with a token another block may be writing, so a group's nibbles
// are set with atomics (clear own bits, set own bits; the bits are
// disjoint, so the result does not depend on the interleaving). A word is
// never written both ways: a whole-word group owns all of its slots (slots
// within one call are distinct).
// Template arguments: the input dtype, lanes per token (head size), the V
// word's width (V bits) and whether the input rows allow 16-byte loads; the
// K and V dtypes themselves are run-time values, every branch on them
// warp-uniform. Where the cache stores the input's own 16-bit format, a
// finite row's codes are its bits (the 16-bit-V kernels only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/checked.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/quantize.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace {

// Input element types: raw storage and the exact conversion to FP32 of a
// 32-bit word of elements (element 0 in the low bits), one instruction per
// element.
template <typename T>
struct Input;
// kIdentityDType: the cache dtype whose codes are the input's own bits
// (none for FP32).
template <>
struct Input<float> {
  using Raw = float;
  static constexpr DType kIdentityDType = DType::kFP32;
  __device__ static void WordToFloat(uint32_t w, float* out) { out[0] = __uint_as_float(w); }
  __device__ static uint32_t Bits(float f) { return __float_as_uint(f); }
};
struct HalfTag {};
struct Bf16Tag {};
template <>
struct Input<HalfTag> {
  using Raw = uint16_t;
  using Pair = __half2;
  static constexpr DType kIdentityDType = DType::kFP16;
  __device__ static void WordToFloat(uint32_t w, float* out) {
    __half2 h;
    memcpy(&h, &w, sizeof(h));
    const float2 f = __half22float2(h);
    out[0] = f.x;
    out[1] = f.y;
  }
  // The input's bits back from its exact conversion.
  __device__ static uint32_t Bits(float f) { return HalfBits(__float2half_rn(f)); }
};
template <>
struct Input<Bf16Tag> {
  using Raw = uint16_t;
  using Pair = __nv_bfloat162;
  static constexpr DType kIdentityDType = DType::kBF16;
  // A BF16 value is the high half of its FP32 value: a shift for the low
  // element, a mask for the high one.
  __device__ static void WordToFloat(uint32_t w, float* out) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xFFFF0000u);
  }
  __device__ static uint32_t Bits(float f) { return __float_as_uint(f) >> 16; }
};

// Tokens per tile: one lane group each; also the width of the run masks.
constexpr int kTileTokens = 32;
// Blocks per SM the register budget is sized for: the quantizer is
// issue- and latency-bound, so more resident tiles beat a few spilled
// registers. 64 registers a thread (4 blocks of 256 threads) by default;
// 48 (5 blocks) for INT4 V from 16-bit input, which stores the fewest
// bytes a token and so gains the most from more tiles in flight: +1.9 to
// +5.7% on every INT4 write shape, where the same budget cost BF16 V 3-7%
// and FP8/INT8 V's ragged batch 3-4% (docs/archive.md, "Cache write").
template <typename Tag, int kLanes, int kVBits>
constexpr int MinBlocksPerSm() {
  const int registers = kVBits == 4 && sizeof(typename Input<Tag>::Raw) == 2 ? 48 : 64;
  return 65536 / registers / (kTileTokens * kLanes);
}

// Lane layout of one row (a token-head vector): channels come in groups of
// kVec = 16 bytes of input; lane l of the row's group holds groups l,
// l + kLanes, ... so that the group's loads are contiguous. Register i is
// channel ((l + kLanes * (i / kVec)) * kVec + i % kVec). head_size is a
// multiple of 16, so a group is either wholly valid or not.
template <typename Tag, int kLanes>
struct RowLayout {
  using Raw = typename Input<Tag>::Raw;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(Raw));
  static constexpr int kPerLane = 16;
  static constexpr int kGroups = kPerLane / kVec;
  static constexpr int kMaxHeadSize = kLanes * kPerLane;
  static constexpr int kThreads = kTileTokens * kLanes;
  // Bytes of the widest K row (16-bit codes), plus 16 so that adjacent
  // tokens' rows start on different banks.
  static constexpr int kKRowPitch = kMaxHeadSize * 2 + 16;
  __device__ static int Channel(int lane, int i) {
    return (lane + kLanes * (i / kVec)) * kVec + i % kVec;
  }
  // Which of the lane's registers hold channels < head_size.
  __device__ static uint32_t ValidMask(int lane, int head_size) {
    uint32_t valid = 0;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if ((lane + kLanes * j) * kVec < head_size) valid |= ((1u << kVec) - 1u) << (j * kVec);
    }
    return valid;
  }
};

// What the kernel needs of the layer's geometry, computed once on the host
// (MakeWriteLayout): in the kernel, CacheGeometry's accessors cost a
// run-time division (k_chunks()) and a switch on the dtypes at every use,
// ~100 instructions a warp (ncu, docs/archive.md, "Cache write").
struct WriteLayout {
  uint8_t* k_data;
  uint8_t* v_data;
  uint8_t* k_scales;
  uint8_t* v_scales;
  int64_t num_slots;
  int64_t k_block_stride;  // bytes
  int64_t v_block_stride;
  int32_t k_head_stride;
  int32_t v_head_stride;
  int32_t k_chunk_stride;
  int32_t v_channel_stride;
  int32_t k_chunks;
  int32_t k_bits;
  int32_t k_entry_bytes;
  int32_t v_entry_bytes;
  int32_t block_shift;  // log2(block_size)
  // Tokens of a V unit (VStage::Words): 16 bytes of codes or a block's
  // row if shorter; 0 where that is one V word (INT4 at block size 8).
  int32_t v_unit_tokens;
};

// The lane's raw input elements of one row, as loaded.
template <typename Tag, int kLanes>
struct RawRow {
  uint4 group[RowLayout<Tag, kLanes>::kGroups];
};

// Loads this lane's elements of row `src` (head_size channels): 16-byte
// streaming loads where the rows allow them (kVecLoads), else element by
// element. Groups past head_size hold zeros (never used). A template
// argument, not a run-time flag: as a flag, the element loads stayed in
// the vector path as predicated-off instructions (~10% of the kernel's).
template <bool kVecLoads, typename Tag, int kLanes>
__device__ __forceinline__ void LoadRow(const void* src, int head_size, int lane,
                                        RawRow<Tag, kLanes>* out) {
  using L = RowLayout<Tag, kLanes>;
  using Raw = typename L::Raw;
  const Raw* row = static_cast<const Raw*>(src);
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    const int d0 = (lane + kLanes * j) * L::kVec;
    out->group[j] = make_uint4(0, 0, 0, 0);
    if (d0 >= head_size) continue;
    if constexpr (kVecLoads) {
      out->group[j] = __ldcs(reinterpret_cast<const uint4*>(row + d0));
    } else {
      Raw raw[L::kVec];
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) raw[e] = row[d0 + e];
      static_assert(sizeof(raw) == sizeof(uint4), "one 16-byte group");
      memcpy(&out->group[j], raw, sizeof(raw));
    }
  }
}

// This lane's elements of one loaded row as FP32 (exact conversions).
template <typename Tag, int kLanes>
__device__ __forceinline__ void RowToFloat(const RawRow<Tag, kLanes>& row,
                                           float (&x)[RowLayout<Tag, kLanes>::kPerLane]) {
  using L = RowLayout<Tag, kLanes>;
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(typename L::Raw));
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    const uint32_t words[4] = {row.group[j].x, row.group[j].y, row.group[j].z, row.group[j].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) Input<Tag>::WordToFloat(words[w], x + j * L::kVec + w * kPerWord);
  }
}

// The range of this lane's elements of a 16-bit row, from the raw pairs
// with the input format's own NaN-propagating min/max (exact: min and max
// do not round), two elements an instruction; one pass also finds whether
// every element is finite (a NaN propagates, an infinity is an extreme).
// kMinMax: the minimum and maximum (INT4); else {-amax, amax} (FP8, INT8,
// and the identity path, which needs only finiteness).
template <bool kMinMax, typename Tag, int kLanes>
__device__ __forceinline__ LaneRange RawRange(const RawRow<Tag, kLanes>& row, bool* finite) {
  using L = RowLayout<Tag, kLanes>;
  using Pair = typename Input<Tag>::Pair;
  auto pair = [&](int k) {
    const uint4& g = row.group[k / 4];
    uint32_t w = k % 4 == 0 ? g.x : k % 4 == 1 ? g.y : k % 4 == 2 ? g.z : g.w;
    if (!kMinMax) w &= 0x7FFF7FFFu;  // |x|, both halves
    Pair p;
    memcpy(&p, &w, sizeof(p));
    return p;
  };
  constexpr int kPairs = L::kPerLane / 2;
  Pair lo = pair(0), hi = lo;
#pragma unroll
  for (int k = 1; k < kPairs; ++k) {
    const Pair p = pair(k);
    if (kMinMax) lo = __hmin2_nan(lo, p);
    hi = __hmax2_nan(hi, p);
  }
  const float h0 = __low2float(hi), h1 = __high2float(hi);
  if (!kMinMax) {
    *finite = isfinite(h0) && isfinite(h1);
    const float amax = fmaxf(h0, h1);
    return LaneRange{-amax, amax};
  }
  const float l0 = __low2float(lo), l1 = __high2float(lo);
  *finite = isfinite(h0) && isfinite(h1) && isfinite(l0) && isfinite(l1);
  return LaneRange{fminf(l0, l1), fmaxf(h0, h1)};
}

// Step 1 in place for this lane's elements: non-finite values to zero
// (counted), divided by the smoothing vector when kSmooth; invalid
// elements become NaN (never counted; the quantizer's min/max reductions
// skip them). Returns the smoothing-overflow bits.
template <bool kSmooth, typename Layout>
__device__ __forceinline__ uint32_t PrepareRow(uint32_t valid, const float* lambda, int lane,
                                               float (&x)[Layout::kPerLane], LaneStats* stats) {
  uint32_t overflow = 0;
#pragma unroll
  for (int i = 0; i < Layout::kPerLane; ++i) {
    const bool ok = (valid >> i) & 1u;
    const float l = kSmooth && ok ? __ldg(lambda + Layout::Channel(lane, i)) : 1.0f;
    bool o;
    x[i] = PrepareValue(ok ? x[i] : 0.0f, l, kSmooth && ok, &o, stats);
    if (!ok) x[i] = __int_as_float(0x7FC00000);
    overflow |= static_cast<uint32_t>(o) << i;
  }
  return overflow;
}

// Steps 1-4 of the quantizer for one loaded row: this lane's codes, and the
// vector's scale entry on every lane of the group. kTryIdentity: take the
// input's bits as codes where the cache dtype is the input's own.
template <bool kTryIdentity, typename Tag, int kLanes>
__device__ __forceinline__ void QuantizeRow(const RawRow<Tag, kLanes>& row, uint32_t valid,
                                            const float* lambda, DType dtype, int lane,
                                            uint32_t (&codes)[RowLayout<Tag, kLanes>::kPerLane],
                                            uint16_t* scale, uint16_t* min, LaneStats* stats) {
  using L = RowLayout<Tag, kLanes>;
  bool prepared = false;
  // The lane's range where the raw row gives it (16-bit input); else the
  // quantizer takes it from x.
  LaneRange range{0.0f, 0.0f};
  bool has_range = false;
  float x[L::kPerLane];
  if (lambda == nullptr && valid == (1u << L::kPerLane) - 1u) {
    // Every element valid and, if finite, step 1 leaves it as it is.
    if constexpr (sizeof(typename L::Raw) == 2) {
      range =
          dtype == DType::kINT4 ? RawRange<true>(row, &prepared) : RawRange<false>(row, &prepared);
      has_range = prepared;
      RowToFloat(row, x);
    } else {
      RowToFloat(row, x);
      // One FMA each: x * 0 is NaN exactly for non-finite x.
      float any_non_finite = 0.0f;
#pragma unroll
      for (int i = 0; i < L::kPerLane; ++i) {
        any_non_finite = __fmaf_rn(x[i], 0.0f, any_non_finite);
      }
      prepared = !isnan(any_non_finite);
    }
    if (kTryIdentity && prepared && Input<Tag>::kIdentityDType == dtype) {
      // The cache stores the input's own 16-bit format: every step is exact
      // on finite values, so each code is the input's bits.
#pragma unroll
      for (int i = 0; i < L::kPerLane; ++i) codes[i] = Input<Tag>::Bits(x[i]);
      *scale = 0;
      *min = 0;
      return;
    }
  } else {
    RowToFloat(row, x);
  }
  uint32_t overflow = 0;
  if (!prepared) {
    overflow = lambda != nullptr ? PrepareRow<true, L>(valid, lambda, lane, x, stats)
                                 : PrepareRow<false, L>(valid, lambda, lane, x, stats);
  }
  QuantizeLaneGroupVector<kLanes>(dtype, x, overflow, valid, has_range, range, codes, scale, min,
                                  stats);
}

// A token's K codes into its row of the stage, as the token's bytes in
// chunk order (channel d at byte d * bits / 8; INT4 low nibble first); the
// INT4 tail past head_size (head sizes 80, 112) is zero, as on the CPU.
template <typename Tag, int kLanes>
__device__ __forceinline__ void StageKRow(const WriteLayout& lay, int head_size, int lane,
                                          uint32_t valid,
                                          const uint32_t (&codes)[RowLayout<Tag, kLanes>::kPerLane],
                                          uint8_t* row) {
  using L = RowLayout<Tag, kLanes>;
  const int bits = lay.k_bits;
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    if (!(valid & (1u << (j * L::kVec)))) continue;
    const uint32_t* c = codes + j * L::kVec;
    // Packed with byte permutes (they take each code's low bytes) and, for
    // INT4 (codes 0..15), a shift-add per code.
    uint32_t w[4] = {0, 0, 0, 0};
    int bytes;
    if (bits == 16) {
#pragma unroll
      for (int e = 0; e < L::kVec; e += 2) w[e / 2] = __byte_perm(c[e], c[e + 1], 0x5410);
      bytes = L::kVec * 2;
    } else if (bits == 8) {
#pragma unroll
      for (int e = 0; e < L::kVec; e += 4) {
        w[e / 4] = __byte_perm(__byte_perm(c[e], c[e + 1], 0x0040),
                               __byte_perm(c[e + 2], c[e + 3], 0x4000), 0x7610);
      }
      bytes = L::kVec;
    } else {
#pragma unroll
      for (int e = L::kVec - 1; e >= 0; --e) w[e / 8] = w[e / 8] * 16u + c[e];
      bytes = L::kVec / 2;
    }
    // The group's bytes are aligned to their size (16, 8, 4 or 2).
    uint8_t* dst = row + (lane + kLanes * j) * bytes;
    if (bytes == 16) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if (bytes == 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else if (bytes == 4) {
      *reinterpret_cast<uint32_t*>(dst) = w[0];
    } else {
      *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w[0]);
    }
  }
  const int data_bytes = head_size * bits / 8;
  for (int b = data_bytes + lane; b < lay.k_chunks * 16; b += kLanes) row[b] = 0;
}

// Sets the bits `mask` of `*word` to `bits` (a subset of mask) without
// disturbing the others, which another block may be writing at the same
// time: an AND for the zeros, an OR for the ones.
__device__ __forceinline__ void StoreBitsAtomically(unsigned int* word, unsigned int mask,
                                                    unsigned int bits) {
  const unsigned int clear = mask & ~bits;
  if (clear != 0) atomicAnd(word, ~clear);
  if (bits != 0) atomicOr(word, bits);
}

// The V stage (per channel, the tile's codes in token order): one byte
// per code (two for 16-bit codes), rows padded by 8 bytes so that the
// store phase's 8-byte reads of adjacent channels fall on different banks.
template <int kVBits>
struct VStage {
  using Code = std::conditional_t<kVBits == 16, uint16_t, uint8_t>;
  static constexpr int kPitch = kTileTokens + 8 / static_cast<int>(sizeof(Code));
  static constexpr int kWordTokens = 32 / kVBits;  // W: tokens per V word
  // The V word of tokens j .. j + W - 1 of one channel row (token j in the
  // lowest bits, as the CPU packs them), j a multiple of W. kClean: every
  // staged byte read holds a code (high nibble zero); otherwise the bytes
  // are masked first — a token that writes nothing leaves its stage byte
  // unset, and the fold below ORs a byte's high nibble into the code
  // above it (an earlier build wrote wrong V nibbles that way: docs/archive.md,
  // "Cache write").
  template <bool kClean = true>
  __device__ static uint32_t AlignedWord(const Code* row, int j) {
    if (kVBits != 4) return *reinterpret_cast<const uint32_t*>(row + j);
    // Eight 4-bit codes, one per byte: fold each byte pair into one byte
    // (x | x >> 4 puts codes 2i, 2i+1 in byte 2i), then gather bytes 0 and
    // 2 of both halves.
    uint2 u = *reinterpret_cast<const uint2*>(row + j);
    if (!kClean) {
      u.x &= 0x0F0F0F0Fu;
      u.y &= 0x0F0F0F0Fu;
    }
    return __byte_perm(u.x | (u.x >> 4), u.y | (u.y >> 4), 0x6420);
  }
  // The same for any j < kTileTokens (a group that ends the tile reads
  // the row's padding past its last code: those codes are not its own and
  // its caller masks them). INT4: Words, two aligned words funnel-shifted
  // off the grid — 2 loads instead of 8. Wider codes off the grid: code by
  // code (the funnel form measured 3% slower there).
  __device__ static uint32_t Word(const Code* row, int j) {
    if (kVBits == 4 || (j & (kWordTokens - 1)) == 0) {
      uint32_t word[1];
      Words(row, j, word);
      return word[0];
    }
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < kWordTokens; ++e) word |= static_cast<uint32_t>(row[j + e]) << (e * kVBits);
    return word;
  }
  // The kWords words of tokens j .. j + kWords * W - 1 of one channel row
  // (any j): kWords + 1 aligned words funnel-shifted where j is off the
  // word grid. The bytes outside the tokens asked for may be other
  // tokens' or unset ones (the last word may be the row's padding): off
  // the grid they are masked and shifted out; on it, those past the
  // caller's own tokens are the caller's to mask.
  template <int kWords>
  __device__ static void Words(const Code* row, int j, uint32_t (&out)[kWords]) {
    const int a = j & ~(kWordTokens - 1);
    const int shift = (j - a) * kVBits;
    if (shift == 0) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) out[i] = AlignedWord(row, a + i * kWordTokens);
      return;
    }
    uint32_t w[kWords + 1];
#pragma unroll
    for (int i = 0; i <= kWords; ++i) w[i] = AlignedWord<false>(row, a + i * kWordTokens);
#pragma unroll
    for (int i = 0; i < kWords; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], shift);
  }
};

// A V group of the tile, packed in 32 bits: `length` tokens from token
// `first` whose slots are consecutive within one aligned V word. A group
// of W tokens is the whole word (a prefill's usual case); a shorter one
// shares its word with tokens of other groups (the rest of a run cut by
// the tile's edge, a decode step's other slots) or with cached tokens.
struct VGroup {
  __device__ static uint32_t Make(int first, int length) {
    return static_cast<uint32_t>(first) | static_cast<uint32_t>(length) << 8;
  }
  __device__ static int First(uint32_t group) { return static_cast<int>(group & 0xFF); }
  __device__ static int Length(uint32_t group) { return static_cast<int>(group >> 8); }
};

// Stores `value`, with the evict-first hint where `streaming`: nothing in
// this call reads the cache bytes it writes, so lines the tile has filled
// may leave L2 first. Callers ask for it only where the tile writes every
// byte of the sectors involved, and only where it measured faster
// (docs/archive.md, "Cache write").
template <typename T>
__device__ __forceinline__ void StoreTileBytes(T* dst, const T& value, bool streaming) {
  if (streaming) {
    __stcs(dst, value);
  } else {
    *dst = value;
  }
}

// A scale entry: FP16 scale (2 bytes) or, for INT4, {scale, min} (4 bytes);
// `entry` holds scale | min << 16.
__device__ __forceinline__ void StoreScale(uint8_t* dst, int entry_bytes, uint32_t entry) {
  if (entry_bytes == 4) {
    *reinterpret_cast<uint32_t*>(dst) = entry;
  } else if (entry_bytes == 2) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(entry);
  }
}

// The slot token t writes, or -1 where it writes nothing: past the call's
// tokens, padding (-1), or out of range (reported in checked mode once,
// by `report`'s caller).
__device__ __forceinline__ int64_t TokenSlot(const WriteParams& p, int64_t t, int64_t num_slots,
                                             bool report) {
  const int64_t slot = t < p.num_tokens ? __ldg(p.slot_mapping + t) : -1;
  if (slot >= 0 && slot < num_slots) return slot;
  if (report && slot != -1) {
    ReportFault(p.checked, DeviceFault::kSlotOutOfRange, t, slot, num_slots);
  }
  return -1;
}

// kVBits: the V dtype's bits (16, 8, 4); kVecLoads: both inputs' rows
// allow 16-byte loads; run-time values elsewhere.
template <typename Tag, int kLanes, int kVBits, bool kVecLoads>
__global__ void __launch_bounds__(RowLayout<Tag, kLanes>::kThreads,
                                  MinBlocksPerSm<Tag, kLanes, kVBits>())
    CacheWriteKernel(const WriteParams p, const WriteLayout lay) {
  using L = RowLayout<Tag, kLanes>;
  using Raw = typename L::Raw;
  constexpr int W = 32 / kVBits;  // tokens per V word
  // Per token of the tile: where its K row, V row and scale entries start
  // (byte offsets in the K data, the V data and entry indices; -1: the
  // token writes nothing) and its slot's offset in the block; the tile's
  // V units and V groups (first tokens; VGroup, in token order) and how
  // many of each; the codes and scales.
  constexpr int kMaxUnits = kTileTokens / 8;  // units are 8 tokens or more
  __shared__ int64_t s_k_row[kTileTokens];
  __shared__ int64_t s_v_row[kTileTokens];
  __shared__ int64_t s_entry[kTileTokens];
  __shared__ int32_t s_off[kTileTokens];
  __shared__ uint32_t s_groups[kTileTokens];
  __shared__ uint32_t s_units[kMaxUnits];
  __shared__ uint32_t s_num_groups;
  __shared__ uint32_t s_num_units;
  __shared__ uint32_t s_unit_tokens;  // bit j: token j is in a V unit
  __shared__ uint32_t s_scale[2][kTileTokens];
  __shared__ __align__(16) uint8_t s_k[kTileTokens][L::kKRowPitch];
  __shared__ __align__(8)
      typename VStage<kVBits>::Code s_v[L::kMaxHeadSize][VStage<kVBits>::kPitch];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kLanes;
  const int k = tid / kLanes;  // the lane group's token in the tile
  const int h = static_cast<int>(blockIdx.y);
  const int D = p.geo.head_size;
  const int64_t t0 = int64_t{blockIdx.x} * kTileTokens;
  const int64_t head_offset = int64_t{h} * D;
  // Launched as a programmatic dependent (LaunchCacheWrite): the kernel
  // before this one in the stream may still be producing the inputs, the
  // slot mapping, or reading the cache this overwrites. Once every block
  // is past this point, the next kernel may take the slots this grid frees.
  WaitForPrerequisiteGrid();
  AllowDependentGrid();

  // 1. The rows in flight first; the slots meanwhile: each lane group
  // reads its token's (to know whether it writes), warp 0 the tile's (for
  // the store phase, behind the barrier).
  RawRow<Tag, kLanes> key_row, value_row;
  const int64_t t = t0 + k;
  if (t < p.num_tokens) {
    LoadRow<kVecLoads>(static_cast<const Raw*>(p.key) + t * p.key_stride + head_offset, D, lane,
                       &key_row);
    LoadRow<kVecLoads>(static_cast<const Raw*>(p.value) + t * p.value_stride + head_offset, D, lane,
                       &value_row);
  }
  const bool written = TokenSlot(p, t, lay.num_slots, false) >= 0;
  if (tid < kTileTokens) {
    const int64_t slot = TokenSlot(p, t0 + tid, lay.num_slots, h == 0);
    const int64_t prev = __shfl_up_sync(kFullWarp, slot, 1);
    const bool follows = tid > 0 && slot >= 0 && prev >= 0 && slot == prev + 1;
    // The slot's low bits: its place in the aligned words and units (a
    // power of two each, and never across a block: block_size is a
    // multiple of both).
    const uint32_t pos = static_cast<uint32_t>(slot);
    // V units: U tokens whose slots run from a multiple of U, one vector
    // store per channel row (a prefill's usual case). A unit starts at a
    // token whose next U - 1 tokens each follow the one before.
    bool in_unit = false;
    const int U = lay.v_unit_tokens;
    if (U != 0) {
      const uint32_t linked = __ballot_sync(kFullWarp, follows && (pos & (U - 1)) != 0);
      const uint32_t rest = (U == 32 ? kFullWarp : (1u << U) - 1u) & ~1u;  // tokens 1 .. U - 1
      const bool head = slot >= 0 && (pos & (U - 1)) == 0 && ((linked >> tid) & rest) == rest;
      const uint32_t heads = __ballot_sync(kFullWarp, head);
      // In a unit: the last head at or before this token is less than U back.
      const uint32_t upto = heads & (kFullWarp >> (31 - tid));
      in_unit = upto != 0 && tid - (31 - __clz(upto)) < U;
      if (head) s_units[__popc(heads & ((1u << tid) - 1u))] = tid;
      if (tid == 0) s_num_units = __popc(heads);
    }
    const uint32_t unit_tokens = __ballot_sync(kFullWarp, in_unit);
    if (tid == 0) s_unit_tokens = unit_tokens;
    // V groups of the other tokens: a token continues the group of the
    // token before it when their slots are consecutive within one aligned
    // V word.
    const bool continues = follows && !in_unit && pos % W != 0;
    const uint32_t cont = __ballot_sync(kFullWarp, continues);
    const uint32_t starts = __ballot_sync(kFullWarp, slot >= 0 && !in_unit) & ~cont;
    if (starts & (1u << tid)) {
      // Its length: 1 + the continuing tokens right after it.
      const uint32_t after = tid < kTileTokens - 1 ? cont >> (tid + 1) : 0u;
      s_groups[__popc(starts & ((1u << tid) - 1u))] = VGroup::Make(tid, __ffs(~after));
    }
    const int64_t b = slot >> lay.block_shift;
    const int off = static_cast<int>(pos & ((1u << lay.block_shift) - 1u));
    s_k_row[tid] = slot >= 0 ? b * lay.k_block_stride + h * lay.k_head_stride + off * 16 : -1;
    s_v_row[tid] = b * lay.v_block_stride + h * lay.v_head_stride + off * kVBits / 8;
    s_entry[tid] = ((b * p.geo.num_kv_heads + h) << lay.block_shift) + off;
    s_off[tid] = off;
    if (tid == 0) s_num_groups = __popc(starts);
  }

  // 2. Quantize the token's K and V rows into the stage. Every lane group
  // runs the quantizer (its reductions shuffle warp-wide); a token that
  // writes nothing has no valid channel, counts nothing and stores nothing.
  const uint32_t valid = written ? L::ValidMask(lane, D) : 0u;
  LaneStats stats;
  uint32_t codes[L::kPerLane];
  uint16_t scale;
  uint16_t min;
  const float* lambda = p.key_smoothing != nullptr ? p.key_smoothing + head_offset : nullptr;
  // The identity path only where V is 16-bit: in the quantized-V kernels
  // its branch cost the quantized dtypes 4-7% (registers).
  QuantizeRow<kVBits == 16>(key_row, valid, lambda, p.geo.k_dtype, lane, codes, &scale, &min,
                            &stats);
  if (written) {
    StageKRow<Tag, kLanes>(lay, D, lane, valid, codes, s_k[k]);
    if (lane == 0) s_scale[0][k] = scale | static_cast<uint32_t>(min) << 16;
  }
  QuantizeRow<kVBits == 16>(value_row, valid, nullptr, p.geo.v_dtype, lane, codes, &scale, &min,
                            &stats);
  if (written) {
#pragma unroll
    for (int i = 0; i < L::kPerLane; ++i) {
      if (valid & (1u << i)) {
        s_v[L::Channel(lane, i)][k] = static_cast<typename VStage<kVBits>::Code>(codes[i]);
      }
    }
    if (lane == 0) s_scale[1][k] = scale | static_cast<uint32_t>(min) << 16;
  }
  __syncthreads();

  // 3. Store the tile, adjacent threads on adjacent tokens.
  // K: chunk c of token j is 16 bytes at its row + c * chunk_stride.
  const bool k_streaming = lay.k_bits < 16;
  for (unsigned i = tid; i < lay.k_chunks * kTileTokens; i += L::kThreads) {
    const int j = i % kTileTokens;
    const int c = i / kTileTokens;
    if (s_k_row[j] < 0) continue;
    // A token of a V unit is one of U (8 or more) whose slots run from a
    // multiple of U: their chunks fill whole 128-byte lines. Quantized K
    // only: 16-bit K wrote the ragged batch 4% slower with the hint.
    StoreTileBytes(reinterpret_cast<uint4*>(lay.k_data + s_k_row[j] + c * lay.k_chunk_stride),
                   *reinterpret_cast<const uint4*>(&s_k[j][c * 16]),
                   k_streaming && ((s_unit_tokens >> j) & 1u));
  }
  // Scales: K by the first 32 threads, V by the next 32.
  if (tid < 2 * kTileTokens) {
    const int j = tid % kTileTokens;
    if (s_k_row[j] >= 0) {
      if (tid < kTileTokens) {
        StoreScale(lay.k_scales + s_entry[j] * lay.k_entry_bytes, lay.k_entry_bytes, s_scale[0][j]);
      } else {
        StoreScale(lay.v_scales + s_entry[j] * lay.v_entry_bytes, lay.v_entry_bytes, s_scale[1][j]);
      }
    }
  }
  // V: per channel, units first, then groups. A unit is one vector store
  // of U codes (16 bytes, or a block's row if shorter). A group of W
  // tokens fills its aligned word and is one store; a group that fills
  // part of its word (a run cut by the tile's edge, a decode step's token)
  // sets its codes alone: INT4 nibbles with atomics (the rest of the byte
  // may be another block's), wider codes one by one. A word is never
  // written both ways: a unit or a whole-word group owns all of its slots
  // (slots within one call are distinct). Which thread takes which
  // (channel, unit or group):
  //   - 16-bit V (channel rows of 16+ bytes): adjacent threads on a
  //     channel's adjacent units or groups, so that a prefill tile's
  //     stores are contiguous in a block's row (the other order touches
  //     8x the sectors: BF16 wrote at 2/3 of this order's speed);
  //   - 8- and 4-bit V: a warp on 32 adjacent channels of one unit or
  //     group, so that its branches and stage reads are the same on every
  //     lane (the rows are 8-16 bytes, so the stores stay within a few
  //     sectors; FP8 and INT8 against the other order, same run: ragged
  //     +16%, aligned prefills +1-2%).
  const int num_units = lay.v_unit_tokens != 0 ? static_cast<int>(s_num_units) : 0;
  const int num_groups = static_cast<int>(s_num_groups);
  const int64_t channel_stride = lay.v_channel_stride;
  // Words per unit: 4 (16 bytes) or 2 (a block row of 8 bytes).
  const bool wide_units = lay.v_unit_tokens == 4 * W;
  // A unit that is a block's whole row: the tile writes every channel's
  // row, so whole sectors (a 16-bit unit is half a row at block size 16).
  const bool unit_rows = lay.v_unit_tokens == (1 << lay.block_shift);
  auto store_unit = [&](int d, int ui) {
    const int j = static_cast<int>(s_units[ui]);
    uint8_t* const dst = lay.v_data + s_v_row[j] + d * channel_stride;
    if (wide_units) {
      uint32_t w[4];
      VStage<kVBits>::Words(s_v[d], j, w);
      StoreTileBytes(reinterpret_cast<uint4*>(dst), make_uint4(w[0], w[1], w[2], w[3]), unit_rows);
    } else {
      uint32_t w[2];
      VStage<kVBits>::Words(s_v[d], j, w);
      StoreTileBytes(reinterpret_cast<uint2*>(dst), make_uint2(w[0], w[1]), unit_rows);
    }
  };
  auto store_group = [&](int d, int gi) {
    const uint32_t group = s_groups[gi];
    const int j = VGroup::First(group);
    const int len = VGroup::Length(group);
    uint8_t* const dst = lay.v_data + s_v_row[j] + d * channel_stride;
    const uint32_t word = VStage<kVBits>::Word(s_v[d], j);
    if (len == W) {
      *reinterpret_cast<uint32_t*>(dst) = word;
    } else if constexpr (kVBits == 4) {
      const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
      // The byte's place in its word, then CacheGeometry::v_shift (INT4
      // known here, so no dtype switch).
      const int shift = static_cast<int>(addr & 3) * 8 + (s_off[j] % 2) * 4;
      const uint32_t codes = (1u << (4 * len)) - 1u;  // len < 8
      StoreBitsAtomically(reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3}), codes << shift,
                          (word & codes) << shift);
    } else {
      for (int e = 0; e < len; ++e) {
        const uint32_t code = word >> (e * kVBits);
        if (kVBits == 16) {
          reinterpret_cast<uint16_t*>(dst)[e] = static_cast<uint16_t>(code);  // little-endian
        } else {
          dst[e] = static_cast<uint8_t>(code);
        }
      }
    }
  };
  if constexpr (kVBits == 16) {
    // Units are 8 tokens here: at most kMaxUnits a tile.
    if (num_units != 0) {
      for (unsigned i = tid; i < D * kMaxUnits; i += L::kThreads) {
        if (static_cast<int>(i % kMaxUnits) < num_units) store_unit(i / kMaxUnits, i % kMaxUnits);
      }
    }
    constexpr int kSlots = kTileTokens / W;
    for (unsigned i = tid; i < D * kSlots; i += L::kThreads) {
      for (int gi = i % kSlots; gi < num_groups; gi += kSlots) store_group(i / kSlots, gi);
    }
  } else {
    constexpr int kChannels = L::kMaxHeadSize;
    const int d = tid % kChannels;
    for (int ui = tid / kChannels; ui < num_units && d < D; ui += L::kThreads / kChannels) {
      store_unit(d, ui);
    }
    for (int gi = tid / kChannels; gi < num_groups && d < D; gi += L::kThreads / kChannels) {
      store_group(d, gi);
    }
  }

  // One atomic per warp and counter, only when there is something to add.
  const unsigned non_finite = __reduce_add_sync(kFullWarp, stats.non_finite);
  const unsigned saturated = __reduce_add_sync(kFullWarp, stats.saturated);
  if (tid % 32 == 0 && p.counters != nullptr) {
    if (non_finite != 0) {
      atomicAdd(&p.counters->non_finite, static_cast<unsigned long long>(non_finite));
    }
    if (saturated != 0) {
      atomicAdd(&p.counters->saturated, static_cast<unsigned long long>(saturated));
    }
  }
}

bool Aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

WriteLayout MakeWriteLayout(const WriteParams& p) {
  const CacheGeometry& g = p.geo;
  WriteLayout lay{};
  lay.k_data = p.layer + g.k_data_offset();
  lay.v_data = p.layer + g.v_data_offset();
  lay.k_scales = p.layer + g.k_scale_offset();
  lay.v_scales = p.layer + g.v_scale_offset();
  lay.num_slots = int64_t{g.num_blocks} * g.block_size;
  lay.k_block_stride = g.k_block_stride();
  lay.v_block_stride = g.v_block_stride();
  // Head sizes <= 256 and block sizes <= 32: a head's bytes fit 32 bits.
  lay.k_head_stride = static_cast<int32_t>(g.k_head_stride());
  lay.v_head_stride = static_cast<int32_t>(g.v_head_stride());
  lay.k_chunk_stride = static_cast<int32_t>(g.k_chunk_stride());
  lay.v_channel_stride = static_cast<int32_t>(g.v_channel_stride());
  lay.k_chunks = g.k_chunks();
  lay.k_bits = g.k_bits();
  lay.k_entry_bytes = g.k_scale_entry_bytes();
  lay.v_entry_bytes = g.v_scale_entry_bytes();
  while ((1 << lay.block_shift) < g.block_size) ++lay.block_shift;
  const int unit = std::min(128 / g.v_bits(), g.block_size);
  lay.v_unit_tokens = unit > 32 / g.v_bits() ? unit : 0;
  return lay;
}

template <typename Tag, int kLanes, int kVBits, bool kVecLoads>
int Launch(const WriteParams& p, bool dependent, cudaStream_t stream) {
  const int64_t tiles = (int64_t{p.num_tokens} + kTileTokens - 1) / kTileTokens;
  return LaunchKernel(&CacheWriteKernel<Tag, kLanes, kVBits, kVecLoads>,
                      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.geo.num_kv_heads)),
                      dim3(RowLayout<Tag, kLanes>::kThreads), 0, stream, dependent, p,
                      MakeWriteLayout(p));
}

template <typename Tag, int kLanes, bool kVecLoads>
int LaunchForVBits(const WriteParams& p, bool dependent, cudaStream_t stream) {
  switch (p.geo.v_bits()) {
    case 16:
      return Launch<Tag, kLanes, 16, kVecLoads>(p, dependent, stream);
    case 8:
      return Launch<Tag, kLanes, 8, kVecLoads>(p, dependent, stream);
    case 4:
      return Launch<Tag, kLanes, 4, kVecLoads>(p, dependent, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// The one dispatch point: input dtype, lanes per row (from the head size),
// the V word's packing and the input rows' alignment become template
// arguments.
template <typename Tag>
int LaunchForInput(const WriteParams& p, bool vec_loads, bool dependent, cudaStream_t stream) {
  const bool narrow = p.geo.head_size <= RowLayout<Tag, 8>::kMaxHeadSize;
  if (vec_loads) {
    return narrow ? LaunchForVBits<Tag, 8, true>(p, dependent, stream)
                  : LaunchForVBits<Tag, 16, true>(p, dependent, stream);
  }
  return narrow ? LaunchForVBits<Tag, 8, false>(p, dependent, stream)
                : LaunchForVBits<Tag, 16, false>(p, dependent, stream);
}

}  // namespace

int LaunchCacheWrite(const WriteParams& params, bool dependent, void* stream) {
  const CacheGeometry& g = params.geo;
  if (params.num_tokens <= 0 || g.num_kv_heads <= 0) return cudaSuccess;
  // The 16-byte K chunk stores and the scale/V stores need an aligned layer
  // (layers start at 256-byte boundaries of a cudaMalloc'd or
  // engine-allocated, aligned cache).
  if (!Aligned(params.layer, 16)) return cudaErrorMisalignedAddress;
  if (g.head_size <= 0 || g.head_size > 256 || g.head_size % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  // Powers of two that V words and units divide (WriteLayout::block_shift).
  if (g.block_size != 8 && g.block_size != 16 && g.block_size != 32) {
    return cudaErrorInvalidValue;
  }
  const int in_bytes = params.input_dtype == DType::kFP32 ? 4 : 2;
  // Rows start at t * stride + h * head_size elements and head_size is a
  // multiple of 16, so 16-byte loads need an aligned base and stride.
  const bool vec_loads = Aligned(params.key, 16) && (params.key_stride * in_bytes) % 16 == 0 &&
                         Aligned(params.value, 16) && (params.value_stride * in_bytes) % 16 == 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (params.input_dtype) {
    case DType::kFP32:
      return LaunchForInput<float>(params, vec_loads, dependent, s);
    case DType::kFP16:
      return LaunchForInput<HalfTag>(params, vec_loads, dependent, s);
    case DType::kBF16:
      return LaunchForInput<Bf16Tag>(params, vec_loads, dependent, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace kvpage
