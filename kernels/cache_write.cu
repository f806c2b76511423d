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
//      per token, and V as 32-bit words — one word per channel for each run
//      of W = 32 / v_bits tokens whose slots fill an aligned word in order
//      (a prefill's slot mapping does that), no atomics.
// A token outside such a run (a decode step's scattered slots, a run cut by
// the tile's edge) has its V stored element by element; an INT4 nibble then
// shares its byte with a token another block may be writing, so the tile's
// nibbles of one aligned 32-bit word are set together with atomics (clear
// own bits, set own bits; the bits are disjoint, so the result does not
// depend on the interleaving). A word is never written both ways: a run
// owns all of its slots (slots within one call are distinct).
// Template arguments: the input dtype, lanes per token (head size), the V
// word's width (V bits) and whether the input rows allow 16-byte loads; the
// K and V dtypes themselves are run-time values, every branch on them
// warp-uniform. Where the cache stores the input's own 16-bit format, a
// finite row's codes are its bits (the 16-bit-V kernels only).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/checked.cuh"
#include "kernels/common/quantize.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace {

// Input element types: raw storage and the exact conversion to FP32.
template <typename T>
struct Input;
// kIdentityDType: the cache dtype whose codes are the input's own bits
// (none for FP32).
template <>
struct Input<float> {
  using Raw = float;
  static constexpr DType kIdentityDType = DType::kFP32;
  __device__ static float ToFloat(Raw r) { return r; }
  __device__ static uint32_t Bits(float f) { return __float_as_uint(f); }
};
struct HalfTag {};
struct Bf16Tag {};
template <>
struct Input<HalfTag> {
  using Raw = uint16_t;
  static constexpr DType kIdentityDType = DType::kFP16;
  __device__ static float ToFloat(Raw r) { return HalfBitsToFloat(r); }
  // The input's bits back from its exact conversion.
  __device__ static uint32_t Bits(float f) { return HalfBits(__float2half_rn(f)); }
};
template <>
struct Input<Bf16Tag> {
  using Raw = uint16_t;
  static constexpr DType kIdentityDType = DType::kBF16;
  __device__ static float ToFloat(Raw r) { return __uint_as_float(static_cast<uint32_t>(r) << 16); }
  __device__ static uint32_t Bits(float f) { return __float_as_uint(f) >> 16; }
};

// Tokens per tile: one lane group each; also the width of the run masks.
constexpr int kTileTokens = 32;
// Blocks per SM the register budget is sized for (64 registers a thread):
// the quantizer is issue- and latency-bound, so more resident tiles beat a
// few spilled registers.
template <int kThreads>
constexpr int MinBlocksPerSm() {
  return 65536 / 64 / kThreads;
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
  using Raw = typename L::Raw;
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    Raw raw[L::kVec];
    memcpy(raw, &row.group[j], sizeof(raw));
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) x[j * L::kVec + e] = Input<Tag>::ToFloat(raw[e]);
  }
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
  float x[L::kPerLane];
  RowToFloat(row, x);
  bool prepared = false;
  if (lambda == nullptr && valid == (1u << L::kPerLane) - 1u) {
    // Every element valid and, if finite (one FMA each: x * 0 is NaN
    // exactly for non-finite x), step 1 leaves it as it is.
    float any_non_finite = 0.0f;
#pragma unroll
    for (int i = 0; i < L::kPerLane; ++i) any_non_finite = __fmaf_rn(x[i], 0.0f, any_non_finite);
    prepared = !isnan(any_non_finite);
    if (kTryIdentity && prepared && Input<Tag>::kIdentityDType == dtype) {
      // The cache stores the input's own 16-bit format: every step is exact
      // on finite values, so each code is the input's bits.
#pragma unroll
      for (int i = 0; i < L::kPerLane; ++i) codes[i] = Input<Tag>::Bits(x[i]);
      *scale = 0;
      *min = 0;
      return;
    }
  }
  uint32_t overflow = 0;
  if (!prepared) {
    overflow = lambda != nullptr ? PrepareRow<true, L>(valid, lambda, lane, x, stats)
                                 : PrepareRow<false, L>(valid, lambda, lane, x, stats);
  }
  QuantizeLaneGroupVector<kLanes>(dtype, x, overflow, valid, codes, scale, min, stats);
}

// A token's K codes into its row of the stage, as the token's bytes in
// chunk order (channel d at byte d * bits / 8; INT4 low nibble first); the
// INT4 tail past head_size (head sizes 80, 112) is zero, as on the CPU.
template <typename Tag, int kLanes>
__device__ __forceinline__ void StageKRow(const CacheGeometry& g, int lane, uint32_t valid,
                                          const uint32_t (&codes)[RowLayout<Tag, kLanes>::kPerLane],
                                          uint8_t* row) {
  using L = RowLayout<Tag, kLanes>;
  const int bits = g.k_bits();
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    if (!(valid & (1u << (j * L::kVec)))) continue;
    const uint32_t* c = codes + j * L::kVec;
    uint32_t w[4] = {0, 0, 0, 0};
    int bytes;
    if (bits == 16) {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) w[e / 2] |= static_cast<uint32_t>(c[e]) << (16 * (e % 2));
      bytes = L::kVec * 2;
    } else if (bits == 8) {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) {
        w[e / 4] |= static_cast<uint32_t>(c[e] & 0xFF) << (8 * (e % 4));
      }
      bytes = L::kVec;
    } else {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) {
        w[e / 8] |= static_cast<uint32_t>(c[e] & 0xF) << (4 * (e % 8));
      }
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
  const int data_bytes = g.head_size * bits / 8;
  for (int b = data_bytes + lane; b < g.k_chunks() * 16; b += kLanes) row[b] = 0;
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

// The INT4 codes of lone tokens (bit j of `tokens`: token j of the tile)
// of one V channel row, each a nibble at dst(j) (bit shift(j)). Nibbles
// that share an aligned 32-bit word — consecutive tokens of a run cut by
// the tile's edge, the usual case — are set together: one atomic pair per
// word instead of one per token.
template <typename Dst, typename Shift, typename Code>
__device__ __forceinline__ void StoreLoneNibbles(uint32_t tokens, Dst&& dst, Shift&& shift,
                                                 Code&& code) {
  unsigned int* word = nullptr;
  unsigned int mask = 0, bits = 0;
  for (; tokens != 0; tokens &= tokens - 1) {
    const int j = __ffs(tokens) - 1;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(dst(j));
    unsigned int* const w = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
    if (w != word) {
      if (word != nullptr) StoreBitsAtomically(word, mask, bits);
      word = w;
      mask = bits = 0;
    }
    const int sh = static_cast<int>(addr & 3) * 8 + shift(j);
    mask |= 0xFu << sh;
    bits |= static_cast<unsigned int>(code(j) & 0xF) << sh;
  }
  if (word != nullptr) StoreBitsAtomically(word, mask, bits);
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
  // above it (session 10's wrong V nibbles, docs/PERF_NOTES.md session 11).
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
  // The same for any j <= kTileTokens - W. INT4: the two aligned words
  // around it, funnel-shifted — 2 loads instead of 8. Their bytes outside
  // j .. j + W - 1 may be other tokens' or unset ones: masked, then
  // shifted out. Wider codes: code by code (the funnel form
  // measured 3% slower there).
  __device__ static uint32_t Word(const Code* row, int j) {
    const int a = j & ~(kWordTokens - 1);
    if (a == j) return AlignedWord(row, j);
    if (kVBits == 4) {
      return __funnelshift_r(AlignedWord<false>(row, a), AlignedWord<false>(row, a + kWordTokens),
                             (j - a) * kVBits);
    }
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < kWordTokens; ++e) word |= static_cast<uint32_t>(row[j + e]) << (e * kVBits);
    return word;
  }
};

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
                                  MinBlocksPerSm<RowLayout<Tag, kLanes>::kThreads>())
    CacheWriteKernel(const WriteParams p) {
  using L = RowLayout<Tag, kLanes>;
  using Raw = typename L::Raw;
  constexpr int W = 32 / kVBits;  // tokens per V word
  const CacheGeometry& g = p.geo;
  // Per token of the tile: where its K row, V row and scale entries start
  // (byte offsets in the K data, the V data and entry indices; -1: the
  // token writes nothing) and its slot's offset in the block; the V word
  // runs (bit j: token j starts a run / lies in one / writes at all); its
  // codes and scales.
  __shared__ int64_t s_k_row[kTileTokens];
  __shared__ int64_t s_v_row[kTileTokens];
  __shared__ int64_t s_entry[kTileTokens];
  __shared__ int32_t s_off[kTileTokens];
  __shared__ uint32_t s_runs[3];
  __shared__ uint32_t s_scale[2][kTileTokens];
  __shared__ __align__(16) uint8_t s_k[kTileTokens][L::kKRowPitch];
  __shared__ __align__(8)
      typename VStage<kVBits>::Code s_v[L::kMaxHeadSize][VStage<kVBits>::kPitch];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kLanes;
  const int k = tid / kLanes;  // the lane group's token in the tile
  const int h = static_cast<int>(blockIdx.y);
  const int D = g.head_size;
  const int64_t t0 = int64_t{blockIdx.x} * kTileTokens;
  const int64_t head_offset = int64_t{h} * D;
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;

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
  const bool written = TokenSlot(p, t, num_slots, false) >= 0;
  if (tid < kTileTokens) {
    const int64_t slot = TokenSlot(p, t0 + tid, num_slots, h == 0);
    // A run: W tokens in a row whose slots are one aligned V word's, in
    // order (an aligned word never crosses a block: block_size % W == 0).
    bool start = slot >= 0 && slot % W == 0 && g.block_size % W == 0;
#pragma unroll
    for (int j = 1; j < W; ++j) {
      const int64_t next = __shfl_down_sync(kFullWarp, slot, j);
      start = start && tid + j < kTileTokens && next == slot + j;
    }
    const uint32_t starts = __ballot_sync(kFullWarp, start);
    const uint32_t written_tokens = __ballot_sync(kFullWarp, slot >= 0);
    uint32_t members = 0;
#pragma unroll
    for (int j = 0; j < W; ++j) members |= starts << j;
    // 32-bit division where the pool allows (one instruction sequence
    // instead of the 64-bit one's ~70).
    int64_t b;
    int off;
    if (num_slots <= INT32_MAX) {
      const uint32_t s32 = static_cast<uint32_t>(slot);
      b = s32 / static_cast<uint32_t>(g.block_size);
      off = static_cast<int>(s32 % static_cast<uint32_t>(g.block_size));
    } else {
      b = slot / g.block_size;
      off = static_cast<int>(slot % g.block_size);
    }
    s_k_row[tid] = slot >= 0 ? g.k_byte(b, h, off, 0) : -1;
    s_v_row[tid] = g.v_byte(b, h, off, 0);
    s_entry[tid] = (b * g.num_kv_heads + h) * g.block_size + off;
    s_off[tid] = off;
    if (tid == 0) {
      s_runs[0] = starts;
      s_runs[1] = members;
      s_runs[2] = written_tokens;
    }
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
  QuantizeRow<kVBits == 16>(key_row, valid, lambda, g.k_dtype, lane, codes, &scale, &min, &stats);
  if (written) {
    StageKRow<Tag, kLanes>(g, lane, valid, codes, s_k[k]);
    if (lane == 0) s_scale[0][k] = scale | static_cast<uint32_t>(min) << 16;
  }
  QuantizeRow<kVBits == 16>(value_row, valid, nullptr, g.v_dtype, lane, codes, &scale, &min,
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
  uint8_t* const k_data = p.layer + g.k_data_offset();
  uint8_t* const v_data = p.layer + g.v_data_offset();
  // K: chunk c of token j is 16 bytes at its row + c * chunk_stride.
  const int k_chunks = g.k_chunks();
  for (unsigned i = tid; i < k_chunks * kTileTokens; i += L::kThreads) {
    const int j = i % kTileTokens;
    const int c = i / kTileTokens;
    if (s_k_row[j] < 0) continue;
    *reinterpret_cast<uint4*>(k_data + s_k_row[j] + c * g.k_chunk_stride()) =
        *reinterpret_cast<const uint4*>(&s_k[j][c * 16]);
  }
  // Scales: K by the first 32 threads, V by the next 32.
  if (tid < 2 * kTileTokens) {
    const int j = tid % kTileTokens;
    if (s_k_row[j] >= 0) {
      if (tid < kTileTokens) {
        const int bytes = g.k_scale_entry_bytes();
        StoreScale(p.layer + g.k_scale_offset() + s_entry[j] * bytes, bytes, s_scale[0][j]);
      } else {
        const int bytes = g.v_scale_entry_bytes();
        StoreScale(p.layer + g.v_scale_offset() + s_entry[j] * bytes, bytes, s_scale[1][j]);
      }
    }
  }
  // V: per channel, the tile's tokens in slices of W. A slice holds at
  // most one run start (runs are W long and disjoint): that run is one
  // word, read straight from the stage where it starts on the slice grid
  // (a prefill tile's usual case); tokens in no run are stored one by one.
  const uint32_t starts = s_runs[0];
  const uint32_t lone = s_runs[2] & ~s_runs[1];
  const int64_t channel_stride = g.v_channel_stride();
  constexpr int kSlices = kTileTokens / W;
  for (unsigned i = tid; i < D * kSlices; i += L::kThreads) {
    const int d = i / kSlices;
    const int j0 = (i % kSlices) * W;
    if (starts & (1u << j0)) {  // the slice is one run: the common case
      *reinterpret_cast<uint32_t*>(v_data + s_v_row[j0] + d * channel_stride) =
          VStage<kVBits>::AlignedWord(s_v[d], j0);
      continue;
    }
    const uint32_t slice = ((1u << W) - 1u) << j0;
    if (starts & slice) {  // a run that starts off the slice grid
      const int j = __ffs(starts & slice) - 1;
      *reinterpret_cast<uint32_t*>(v_data + s_v_row[j] + d * channel_stride) =
          VStage<kVBits>::Word(s_v[d], j);
    }
    auto dst = [&](int j) { return v_data + s_v_row[j] + d * channel_stride; };
    if constexpr (kVBits == 4) {
      StoreLoneNibbles(
          lone & slice, dst, [&](int j) { return g.v_shift(s_off[j]); },
          [&](int j) { return s_v[d][j]; });
    } else {
      for (uint32_t rest = lone & slice; rest != 0; rest &= rest - 1) {
        const int j = __ffs(rest) - 1;
        if (kVBits == 16) {
          *reinterpret_cast<uint16_t*>(dst(j)) = s_v[d][j];  // little-endian, as the CPU
        } else {
          *dst(j) = static_cast<uint8_t>(s_v[d][j]);
        }
      }
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

template <typename Tag, int kLanes, int kVBits, bool kVecLoads>
int Launch(const WriteParams& p, cudaStream_t stream) {
  const int64_t tiles = (int64_t{p.num_tokens} + kTileTokens - 1) / kTileTokens;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.geo.num_kv_heads));
  CacheWriteKernel<Tag, kLanes, kVBits, kVecLoads>
      <<<grid, RowLayout<Tag, kLanes>::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename Tag, int kLanes, bool kVecLoads>
int LaunchForVBits(const WriteParams& p, cudaStream_t stream) {
  switch (p.geo.v_bits()) {
    case 16:
      return Launch<Tag, kLanes, 16, kVecLoads>(p, stream);
    case 8:
      return Launch<Tag, kLanes, 8, kVecLoads>(p, stream);
    case 4:
      return Launch<Tag, kLanes, 4, kVecLoads>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// The one dispatch point: input dtype, lanes per row (from the head size),
// the V word's packing and the input rows' alignment become template
// arguments.
template <typename Tag>
int LaunchForInput(const WriteParams& p, bool vec_loads, cudaStream_t stream) {
  const bool narrow = p.geo.head_size <= RowLayout<Tag, 8>::kMaxHeadSize;
  if (vec_loads) {
    return narrow ? LaunchForVBits<Tag, 8, true>(p, stream)
                  : LaunchForVBits<Tag, 16, true>(p, stream);
  }
  return narrow ? LaunchForVBits<Tag, 8, false>(p, stream)
                : LaunchForVBits<Tag, 16, false>(p, stream);
}

}  // namespace

int LaunchCacheWrite(const WriteParams& params, void* stream) {
  const CacheGeometry& g = params.geo;
  if (params.num_tokens <= 0 || g.num_kv_heads <= 0) return cudaSuccess;
  // The 16-byte K chunk stores and the scale/V stores need an aligned layer
  // (layers start at 256-byte boundaries of a cudaMalloc'd or
  // engine-allocated, aligned cache).
  if (!Aligned(params.layer, 16)) return cudaErrorMisalignedAddress;
  if (g.head_size <= 0 || g.head_size > 256 || g.head_size % 16 != 0) {
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
      return LaunchForInput<float>(params, vec_loads, s);
    case DType::kFP16:
      return LaunchForInput<HalfTag>(params, vec_loads, s);
    case DType::kBF16:
      return LaunchForInput<Bf16Tag>(params, vec_loads, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace kvpage
