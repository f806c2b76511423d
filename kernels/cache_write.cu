// Cache write: quantize each new token's K and V per KV head and scatter
// them into the paged layout (src/geometry.h), byte-identical to the CPU
// backend's write (src/cpu_backend.cc, CpuBackend::Write).
//
// One warp per (token, KV head, K or V). The warp loads the vector (vector
// loads of 4 elements when the input allows), quantizes it with
// kernels/common/quantize.cuh, then writes:
//   - K: the token's row of 16-byte chunks, staged in shared memory so that
//     each chunk is one 16-byte store (INT4 tails past head_size are zero);
//   - V: one element per channel, strided by the block's channel stride.
//     When consecutive tokens fill a channel's aligned 32-bit word of the
//     block (2, 4 or 8 slots; a prefill's slot mapping does), one warp
//     quantizes them all and writes each word once (VWordRun). Otherwise
//     the token is written alone; INT4 V packs tokens 2i and 2i+1 into one
//     byte, and both may be written by different warps of the same launch:
//     each nibble is set with atomics on its aligned 32-bit word (clear own
//     bits, set own bits; the bits are disjoint, so the result does not
//     depend on the interleaving). A word is never written both ways: a
//     run owns all of its slots (slots within one call are distinct);
//   - the FP16 scale entry ({scale, min} for INT4).
// Dtypes and geometry are runtime values; every branch on them is
// warp-uniform. The kernel is memory-bound, so clarity wins over
// specialization.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/quantize.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
// Elements per lane: head_size <= 256 over 32 lanes.
constexpr int kPerLane = 8;
// Largest K row of one token-head: 256 FP16 channels = 32 chunks of 16 B.
constexpr int kMaxKChunks = 32;

struct WriteArgs {
  WriteParams p;
  bool key_vec;    // key rows allow 4-element vector loads
  bool value_vec;  // value rows allow 4-element vector loads
};

// Input element types: raw storage and the exact conversion to FP32.
template <typename T>
struct Input;
template <>
struct Input<float> {
  using Raw = float;
  __device__ static float ToFloat(Raw r) { return r; }
};
struct HalfTag {};
struct Bf16Tag {};
template <>
struct Input<HalfTag> {
  using Raw = uint16_t;
  __device__ static float ToFloat(Raw r) { return HalfBitsToFloat(r); }
};
template <>
struct Input<Bf16Tag> {
  using Raw = uint16_t;
  __device__ static float ToFloat(Raw r) {
    return __uint_as_float(static_cast<uint32_t>(r) << 16);
  }
};

// Lane layout of a vector: elements come in groups of kVec = 4 consecutive
// channels (one 16- or 8-byte load); lane l holds groups l, l + 32, ... so
// that a warp's loads are contiguous and, for head_size 128, every lane has
// work (8-element groups of 16-bit inputs would leave half the warp idle).
// Register i is channel ((lane + 32 * (i / kVec)) * kVec + i % kVec).
// head_size is a multiple of 16, so a group is either wholly valid or not.
template <typename Tag>
struct LaneLayout {
  using Raw = typename Input<Tag>::Raw;
  static constexpr int kVec = 4;
  static constexpr int kLoadBytes = kVec * sizeof(Raw);
  static constexpr int kGroups = kPerLane / kVec;
  __device__ static int Channel(int lane, int i) {
    return (lane + 32 * (i / kVec)) * kVec + i % kVec;
  }
};

// Loads this lane's elements of row `src` (head_size channels) as FP32.
// Returns the valid mask.
template <typename Tag>
__device__ __forceinline__ uint32_t LoadRow(const void* src, int head_size,
                                            bool vec, int lane,
                                            float (&x)[kPerLane]) {
  using L = LaneLayout<Tag>;
  using Raw = typename L::Raw;
  const Raw* row = static_cast<const Raw*>(src);
  uint32_t valid = 0;
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    const int d0 = (lane + 32 * j) * L::kVec;
    if (d0 >= head_size) continue;
    Raw raw[L::kVec];
    if (vec) {
      if constexpr (L::kLoadBytes == 16) {
        const uint4 chunk = __ldg(reinterpret_cast<const uint4*>(row + d0));
        static_assert(sizeof(raw) == sizeof(chunk), "one load per group");
        memcpy(raw, &chunk, sizeof(chunk));
      } else {
        const uint2 chunk = __ldg(reinterpret_cast<const uint2*>(row + d0));
        static_assert(sizeof(raw) == sizeof(chunk), "one load per group");
        memcpy(raw, &chunk, sizeof(chunk));
      }
    } else {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) raw[e] = row[d0 + e];
    }
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) {
      x[j * L::kVec + e] = Input<Tag>::ToFloat(raw[e]);
      valid |= 1u << (j * L::kVec + e);
    }
  }
  return valid;
}

// K row of one token-head into the layer: codes staged in shared memory as
// the token's bytes in chunk order, then one 16-byte store per chunk.
template <typename Tag>
__device__ __forceinline__ void StoreK(const CacheGeometry& g, uint8_t* k_row,
                                       int lane, uint32_t valid,
                                       const uint16_t (&codes)[kPerLane],
                                       uint8_t* stage) {
  using L = LaneLayout<Tag>;
  const int bits = g.k_bits();
  const int row_bytes = g.k_chunks() * 16;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (!(valid & (1u << i))) continue;
    const int d = L::Channel(lane, i);
    if (bits == 16) {
      reinterpret_cast<uint16_t*>(stage)[d] = codes[i];
    } else if (bits == 8) {
      stage[d] = static_cast<uint8_t>(codes[i]);
    } else if (i % 2 == 0) {
      // INT4: channels 2k (low nibble) and 2k+1 (high) are consecutive
      // registers of this lane (kVec is even).
      stage[d / 2] =
          static_cast<uint8_t>((codes[i] & 0xF) | ((codes[i + 1] & 0xF) << 4));
    }
  }
  // INT4 tail past head_size (head_size 80, 112): zero bits, as the CPU.
  const int data_bytes = g.head_size * bits / 8;
  for (int b = data_bytes + lane; b < row_bytes; b += 32) stage[b] = 0;
  __syncwarp();
  const int64_t chunk_stride = g.k_chunk_stride();
  for (int c = lane; c < g.k_chunks(); c += 32) {
    *reinterpret_cast<uint4*>(k_row + c * chunk_stride) =
        reinterpret_cast<const uint4*>(stage)[c];
  }
  __syncwarp();  // the stage is reused by this warp's next item
}

// One INT4 nibble at `byte` (bit `shift`), without disturbing the other
// nibble, which another warp may be writing at the same time.
__device__ __forceinline__ void StoreNibble(uint8_t* byte, int shift,
                                            uint16_t code) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(byte);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
  const int sh = static_cast<int>(addr & 3) * 8 + shift;
  const unsigned int set = static_cast<unsigned int>(code & 0xF) << sh;
  const unsigned int clear = static_cast<unsigned int>(~code & 0xF) << sh;
  if (clear != 0) atomicAnd(word, ~clear);
  if (set != 0) atomicOr(word, set);
}

// V of one token-head: element d of token `off` at v_head + d * stride.
template <typename Tag>
__device__ __forceinline__ void StoreV(const CacheGeometry& g, uint8_t* v_head,
                                       int off, int lane, uint32_t valid,
                                       const uint16_t (&codes)[kPerLane]) {
  using L = LaneLayout<Tag>;
  const int bits = g.v_bits();
  const int64_t stride = g.v_channel_stride();
  uint8_t* base = v_head + int64_t{off} * bits / 8;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (!(valid & (1u << i))) continue;
    uint8_t* p = base + L::Channel(lane, i) * stride;
    if (bits == 16) {
      *reinterpret_cast<uint16_t*>(p) = codes[i];  // little-endian, as the CPU
    } else if (bits == 8) {
      *p = static_cast<uint8_t>(codes[i]);
    } else {
      StoreNibble(p, g.v_shift(off), codes[i]);
    }
  }
}

// FP16 scale entry: {scale} or, for INT4, {scale, min} (4 bytes).
__device__ __forceinline__ void StoreScale(uint8_t* entry, int entry_bytes,
                                           uint16_t scale, uint16_t min) {
  if (entry_bytes == 4) {
    *reinterpret_cast<uint32_t*>(entry) =
        static_cast<uint32_t>(scale) | (static_cast<uint32_t>(min) << 16);
  } else if (entry_bytes == 2) {
    *reinterpret_cast<uint16_t*>(entry) = scale;
  }
}

// Steps 1-4 for one row of head_size inputs: this lane's codes, and the
// vector's scale entry on every lane. Returns the lane's valid mask.
template <typename Tag>
__device__ __forceinline__ uint32_t QuantizeRow(
    const void* row, int head_size, bool vec, const float* lambda, DType dtype,
    int lane, uint16_t (&codes)[kPerLane], uint16_t* scale, uint16_t* min,
    LaneStats* stats) {
  float x[kPerLane];
  const uint32_t valid = LoadRow<Tag>(row, head_size, vec, lane, x);
  uint32_t overflow = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (!(valid & (1u << i))) continue;
    const float l =
        lambda != nullptr ? __ldg(lambda + LaneLayout<Tag>::Channel(lane, i))
                          : 1.0f;
    bool o;
    x[i] = PrepareValue(x[i], l, lambda != nullptr, &o, stats);
    overflow |= static_cast<uint32_t>(o) << i;
  }
  QuantizeWarpVector(dtype, x, overflow, valid, codes, scale, min, stats);
  return valid;
}

// V codes of one channel for W = 32 / v_bits consecutive slots fill one
// aligned 32-bit word. When consecutive tokens t0 .. t0 + W - 1 write
// exactly those slots (a prefill does), the warp of token t0 writes the
// whole word with one plain store and the others skip their V: fewer,
// wider stores, and no atomics for INT4. Returns t0 when token t's word is
// filled by such a run, else -1.
__device__ __forceinline__ int32_t VWordRun(const int64_t* slot_mapping,
                                            int32_t num_tokens, int32_t t,
                                            int64_t slot, int w) {
  const int j = static_cast<int>(slot % w);
  const int32_t t0 = t - j;
  if (t0 < 0 || t0 + w > num_tokens) return -1;
  for (int k = 0; k < w; ++k) {
    if (k != j && __ldg(slot_mapping + t0 + k) != slot - j + k) return -1;
  }
  return t0;
}

template <typename Tag>
__global__ void __launch_bounds__(kThreads)
    CacheWriteKernel(const WriteArgs args) {
  __shared__ uint4 stage_mem[kWarpsPerBlock][kMaxKChunks];
  const WriteParams& p = args.p;
  const CacheGeometry& g = p.geo;
  using Raw = typename Input<Tag>::Raw;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  uint8_t* stage = reinterpret_cast<uint8_t*>(stage_mem[warp]);
  const int D = g.head_size;
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;
  uint8_t* const k_data = p.layer + g.k_data_offset();
  uint8_t* const v_data = p.layer + g.v_data_offset();
  uint8_t* const k_scales = p.layer + g.k_scale_offset();
  uint8_t* const v_scales = p.layer + g.v_scale_offset();
  const Raw* const key = static_cast<const Raw*>(p.key);
  const Raw* const value = static_cast<const Raw*>(p.value);

  LaneStats stats;
  uint16_t codes[kPerLane];
  uint16_t scale;
  uint16_t min;
  // Item = (token, head, K or V): one vector per warp keeps the register
  // footprint small (higher occupancy hides the scattered V stores better).
  const int64_t num_items = int64_t{p.num_tokens} * g.num_kv_heads * 2;
  for (int64_t item = int64_t{blockIdx.x} * kWarpsPerBlock + warp;
       item < num_items; item += int64_t{gridDim.x} * kWarpsPerBlock) {
    const bool is_v = (item & 1) != 0;
    const int64_t token_head = item >> 1;
    const int32_t t = static_cast<int32_t>(token_head / g.num_kv_heads);
    const int h = static_cast<int>(token_head % g.num_kv_heads);
    const int64_t slot = __ldg(p.slot_mapping + t);
    if (slot < 0 || slot >= num_slots) continue;  // padding (or invalid)
    const int64_t b = slot / g.block_size;
    const int off = static_cast<int>(slot % g.block_size);
    const int64_t head_offset = int64_t{h} * D;

    if (!is_v) {
      // ---- K (key smoothing applies to K only) ----
      const float* lambda =
          p.key_smoothing != nullptr ? p.key_smoothing + head_offset : nullptr;
      const uint32_t valid = QuantizeRow<Tag>(
          key + t * p.key_stride + head_offset, D, args.key_vec, lambda,
          g.k_dtype, lane, codes, &scale, &min, &stats);
      StoreK<Tag>(g, k_data + g.k_byte(b, h, off, 0), lane, valid, codes,
                  stage);
      if (lane == 0) {
        StoreScale(k_scales + g.k_scale_byte(b, h, off),
                   g.k_scale_entry_bytes(), scale, min);
      }
      continue;
    }

    // ---- V ----
    const int v_bits = g.v_bits();
    const int w = 32 / v_bits;
    // (Supported block sizes are multiples of w, so a word never spans
    // two blocks; the check keeps other geometries on the plain path.)
    const int32_t t0 =
        g.block_size % w == 0
            ? VWordRun(p.slot_mapping, p.num_tokens, t, slot, w)
            : -1;
    if (t0 >= 0 && t0 != t) continue;  // the run's first token writes it
    if (t0 < 0) {
      // A token on its own: element by element (INT4 nibbles by atomics).
      const uint32_t valid = QuantizeRow<Tag>(
          value + t * p.value_stride + head_offset, D, args.value_vec, nullptr,
          g.v_dtype, lane, codes, &scale, &min, &stats);
      StoreV<Tag>(g, v_data + g.v_byte(b, h, 0, 0), off, lane, valid, codes);
      if (lane == 0) {
        StoreScale(v_scales + g.v_scale_byte(b, h, off),
                   g.v_scale_entry_bytes(), scale, min);
      }
      continue;
    }
    // The run t .. t + w - 1 fills the words of slots off .. off + w - 1
    // (off is a multiple of w): accumulate each channel's word in
    // registers, little-endian like the CPU's byte-wise stores.
    const uint32_t mask = (1u << v_bits) - 1u;  // v_bits <= 16
    uint32_t words[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) words[i] = 0;
    uint32_t valid = 0;
    for (int k = 0; k < w; ++k) {
      valid = QuantizeRow<Tag>(value + (t + k) * p.value_stride + head_offset,
                               D, args.value_vec, nullptr, g.v_dtype, lane,
                               codes, &scale, &min, &stats);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        words[i] |= (static_cast<uint32_t>(codes[i]) & mask) << (k * v_bits);
      }
      if (lane == 0) {
        StoreScale(v_scales + g.v_scale_byte(b, h, off + k),
                   g.v_scale_entry_bytes(), scale, min);
      }
    }
    // off is a multiple of w, so each channel's word is 4-byte aligned.
    uint8_t* const v_word = v_data + g.v_byte(b, h, off, 0);
    const int64_t stride = g.v_channel_stride();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (valid & (1u << i)) {
        *reinterpret_cast<uint32_t*>(
            v_word + LaneLayout<Tag>::Channel(lane, i) * stride) = words[i];
      }
    }
  }

  // One atomic per warp and counter, only when there is something to add.
  const unsigned non_finite = __reduce_add_sync(kFullWarp, stats.non_finite);
  const unsigned saturated = __reduce_add_sync(kFullWarp, stats.saturated);
  if (lane == 0 && p.counters != nullptr) {
    if (non_finite != 0) {
      atomicAdd(&p.counters->non_finite,
                static_cast<unsigned long long>(non_finite));
    }
    if (saturated != 0) {
      atomicAdd(&p.counters->saturated,
                static_cast<unsigned long long>(saturated));
    }
  }
}

bool Aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

template <typename Tag>
int Launch(const WriteArgs& args, cudaStream_t stream) {
  const int64_t items =
      int64_t{args.p.num_tokens} * args.p.geo.num_kv_heads * 2;
  int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // A grid-stride loop covers the rest; this is plenty to fill any GPU.
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  CacheWriteKernel<Tag><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

}  // namespace

int LaunchCacheWrite(const WriteParams& params, void* stream) {
  const CacheGeometry& g = params.geo;
  if (params.num_tokens <= 0 || g.num_kv_heads <= 0) return cudaSuccess;
  // The 16-byte K chunk stores and the scale/V stores need an aligned layer
  // (layers start at 256-byte boundaries of a cudaMalloc'd or
  // engine-allocated, aligned cache).
  if (!Aligned(params.layer, 16)) return cudaErrorMisalignedAddress;
  if (g.head_size <= 0 || g.head_size > 32 * kPerLane || g.head_size % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int in_bytes = params.input_dtype == DType::kFP32 ? 4 : 2;
  WriteArgs args;
  args.p = params;
  // Rows start at t * stride + h * head_size elements and head_size is a
  // multiple of 16, so 4-element loads need an aligned base and stride.
  const int load_bytes = 4 * in_bytes;
  args.key_vec = Aligned(params.key, load_bytes) &&
                 (params.key_stride * in_bytes) % load_bytes == 0;
  args.value_vec = Aligned(params.value, load_bytes) &&
                   (params.value_stride * in_bytes) % load_bytes == 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (params.input_dtype) {
    case DType::kFP32:
      return Launch<float>(args, s);
    case DType::kFP16:
      return Launch<HalfTag>(args, s);
    case DType::kBF16:
      return Launch<Bf16Tag>(args, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace kvpage
