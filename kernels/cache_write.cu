// Cache write: quantize each new token's K and V per KV head and scatter
// them into the paged layout (src/geometry.h), byte-identical to the CPU
// backend's write (src/cpu_backend.cc, CpuBackend::Write).
//
// One warp per (token, KV head). V is stored [channel][token] within a
// block, so for each channel W = 32 / v_bits consecutive slots share one
// aligned 32-bit word. When the W tokens whose slots fill such a word come
// one after another in this call (a prefill's slot mapping does that), the
// warp of the run's first token handles the whole run — K and V of all W
// tokens — and the other W - 1 warps return at once:
//   - all 2W input rows are loaded before the first is quantized, so a warp
//     has up to 16 loads in flight (the kernel is bound by memory-level
//     parallelism, and the exact IEEE divisions of the quantizer,
//     kernels/common/quantize.cuh, are too slow to hide one load each);
//   - V words are assembled in registers and written once, no atomics;
//   - the K rows are staged in shared memory and stored as 16-byte chunks,
//     adjacent lanes taking adjacent tokens of one chunk row (W x 16
//     contiguous bytes).
// A token outside such a run is handled alone; INT4 V packs tokens 2i and
// 2i+1 into one byte, and both may be written by different warps of the
// same launch: each nibble is then set with atomics on its aligned 32-bit
// word (clear own bits, set own bits; the bits are disjoint, so the result
// does not depend on the interleaving). A word is never written both ways:
// a run owns all of its slots (slots within one call are distinct).
// Each vector is spread over the warp: lane l holds groups of 4 consecutive
// channels l, l + 32, ... (kPerLane = 4 for head sizes up to 128, 8 up to
// 256). Dtypes other than the input's and the V word width are run-time
// values; every branch on them is warp-uniform.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/checked.cuh"
#include "kernels/common/quantize.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/launch.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace {


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
// work. Register i is channel ((lane + 32 * (i / kVec)) * kVec + i % kVec).
// head_size is a multiple of 16, so a group is either wholly valid or not.
template <typename Tag, int kPerLane>
struct LaneLayout {
  using Raw = typename Input<Tag>::Raw;
  static constexpr int kVec = 4;
  static constexpr int kGroups = kPerLane / kVec;
  // One group's load: 16 bytes (FP32) or 8 bytes (FP16/BF16).
  using Chunk = std::conditional_t<sizeof(Raw) == 4, uint4, uint2>;
  // The largest K row of a token-head, in 16-byte chunks (16-bit codes).
  static constexpr int kMaxKChunks = 32 * kPerLane * 2 / 16;
  __device__ static int Channel(int lane, int i) {
    return (lane + 32 * (i / kVec)) * kVec + i % kVec;
  }
  // Which of the lane's registers hold channels < head_size.
  __device__ static uint32_t ValidMask(int lane, int head_size) {
    uint32_t valid = 0;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if ((lane + 32 * j) * kVec < head_size) valid |= ((1u << kVec) - 1u) << (j * kVec);
    }
    return valid;
  }
};

// The lane's raw input elements of one row, as loaded.
template <typename Tag, int kPerLane>
struct RawRow {
  typename LaneLayout<Tag, kPerLane>::Chunk group[LaneLayout<Tag, kPerLane>::kGroups];
};

// Starts copying this lane's elements of row `src` (head_size channels) to
// its slot of a shared-memory stage: asynchronously where the row allows
// vector loads (`vec`), else element by element. Lanes past head_size
// store zeros (never read as valid).
template <typename Tag, int kPerLane>
__device__ __forceinline__ void StageRow(const void* src, int head_size, bool vec, int lane,
                                         RawRow<Tag, kPerLane>* slot) {
  using L = LaneLayout<Tag, kPerLane>;
  using Raw = typename L::Raw;
  using Chunk = typename L::Chunk;
  const Raw* row = static_cast<const Raw*>(src);
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    const int d0 = (lane + 32 * j) * L::kVec;
    if (d0 < head_size && vec) {
      CpAsync<sizeof(Chunk)>(&slot->group[j], row + d0);
      continue;
    }
    Raw raw[L::kVec] = {};
    if (d0 < head_size) {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) raw[e] = row[d0 + e];
    }
    static_assert(sizeof(raw) == sizeof(Chunk), "one chunk per group");
    memcpy(&slot->group[j], raw, sizeof(Chunk));
  }
}

// Steps 1-4 of the quantizer for one loaded row: this lane's codes, and the
// vector's scale entry on every lane.
template <typename Tag, int kPerLane>
__device__ __forceinline__ void QuantizeRow(const RawRow<Tag, kPerLane>& row, uint32_t valid,
                                            const float* lambda, DType dtype, int lane,
                                            uint16_t (&codes)[kPerLane], uint16_t* scale,
                                            uint16_t* min, LaneStats* stats) {
  using L = LaneLayout<Tag, kPerLane>;
  using Raw = typename L::Raw;
  float x[kPerLane];
  uint32_t overflow = 0;
#pragma unroll
  for (int j = 0; j < L::kGroups; ++j) {
    Raw raw[L::kVec];
    memcpy(raw, &row.group[j], sizeof(raw));
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) {
      const int i = j * L::kVec + e;
      x[i] = Input<Tag>::ToFloat(raw[e]);
      if (!(valid & (1u << i))) continue;
      const float l = lambda != nullptr ? __ldg(lambda + L::Channel(lane, i)) : 1.0f;
      bool o;
      x[i] = PrepareValue(x[i], l, lambda != nullptr, &o, stats);
      overflow |= static_cast<uint32_t>(o) << i;
    }
  }
  QuantizeWarpVector(dtype, x, overflow, valid, codes, scale, min, stats);
}

// A token's K codes into its row of the stage, as the token's bytes in
// chunk order; INT4 tails past head_size (head sizes 80, 112) are zero, as
// on the CPU.
template <typename Tag, int kPerLane>
__device__ __forceinline__ void StageKRow(const CacheGeometry& g, int lane, uint32_t valid,
                                          const uint16_t (&codes)[kPerLane], uint8_t* stage) {
  using L = LaneLayout<Tag, kPerLane>;
  const int bits = g.k_bits();
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
      stage[d / 2] = static_cast<uint8_t>((codes[i] & 0xF) | ((codes[i + 1] & 0xF) << 4));
    }
  }
  const int data_bytes = g.head_size * bits / 8;
  for (int b = data_bytes + lane; b < g.k_chunks() * 16; b += 32) stage[b] = 0;
}

// One INT4 nibble at `byte` (bit `shift`), without disturbing the other
// nibble, which another warp may be writing at the same time.
__device__ __forceinline__ void StoreNibble(uint8_t* byte, int shift, uint16_t code) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(byte);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
  const int sh = static_cast<int>(addr & 3) * 8 + shift;
  const unsigned int set = static_cast<unsigned int>(code & 0xF) << sh;
  const unsigned int clear = static_cast<unsigned int>(~code & 0xF) << sh;
  if (clear != 0) atomicAnd(word, ~clear);
  if (set != 0) atomicOr(word, set);
}

// V of one token-head written alone: element d of token `off` at
// v_head + d * stride.
template <typename Tag, int kPerLane>
__device__ __forceinline__ void StoreVToken(const CacheGeometry& g, uint8_t* v_head, int off,
                                            int lane, uint32_t valid,
                                            const uint16_t (&codes)[kPerLane]) {
  using L = LaneLayout<Tag, kPerLane>;
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
__device__ __forceinline__ void StoreScale(uint8_t* entry, int entry_bytes, uint16_t scale,
                                           uint16_t min) {
  if (entry_bytes == 4) {
    *reinterpret_cast<uint32_t*>(entry) =
        static_cast<uint32_t>(scale) | (static_cast<uint32_t>(min) << 16);
  } else if (entry_bytes == 2) {
    *reinterpret_cast<uint16_t*>(entry) = scale;
  }
}

// How many tokens starting at `t` this warp handles: W when t starts a run
// (tokens t .. t + W - 1 write the slots of one aligned V word in order),
// 0 when t is inside a run (its first token's warp handles it), else 1.
template <int W>
__device__ __forceinline__ int RunLength(const CacheGeometry& g, const int64_t* slot_mapping,
                                         int32_t num_tokens, int32_t t, int64_t slot, int lane) {
  if (W == 1 || g.block_size % W != 0) return 1;
  const int j = static_cast<int>(slot % W);
  const int32_t t0 = t - j;
  if (t0 < 0 || t0 + W > num_tokens) return 1;  // warp-uniform
  const bool ok = lane >= W || __ldg(slot_mapping + t0 + lane) == slot - j + lane;
  if (!__all_sync(kFullWarp, ok)) return 1;
  return j == 0 ? W : 0;
}

// Warps per block: 4, or 2 where the stage of 4 would pass 48 KiB (FP32
// input, head size 256).
template <typename Tag, int kPerLane, int W>
constexpr int WarpsPerBlock() {
  using L = LaneLayout<Tag, kPerLane>;
  constexpr int per_warp = 2 * W * 32 * static_cast<int>(sizeof(RawRow<Tag, kPerLane>)) +
                           W * L::kMaxKChunks * 16;
  return 4 * per_warp <= 48 * 1024 ? 4 : 2;
}

template <typename Tag, int kPerLane, int W>
__global__ void __launch_bounds__(WarpsPerBlock<Tag, kPerLane, W>() * 32)
    CacheWriteKernel(const WriteArgs args) {
  using L = LaneLayout<Tag, kPerLane>;
  using Row = RawRow<Tag, kPerLane>;
  using Raw = typename L::Raw;
  constexpr int kWarps = WarpsPerBlock<Tag, kPerLane, W>();
  // Per warp: the input rows of an item (K rows 0..W-1, V rows W..2W-1, as
  // each lane's elements), and the K codes of its tokens in byte order.
  __shared__ Row raw_stage[kWarps][2 * W][32];
  __shared__ uint4 k_stage[kWarps][W][L::kMaxKChunks];
  const WriteParams& p = args.p;
  const CacheGeometry& g = p.geo;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int D = g.head_size;
  const uint32_t valid = L::ValidMask(lane, D);
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;
  uint8_t* const k_data = p.layer + g.k_data_offset();
  uint8_t* const v_data = p.layer + g.v_data_offset();
  uint8_t* const k_scales = p.layer + g.k_scale_offset();
  uint8_t* const v_scales = p.layer + g.v_scale_offset();
  const Raw* const key = static_cast<const Raw*>(p.key);
  const Raw* const value = static_cast<const Raw*>(p.value);
  Row(*const raw)[32] = raw_stage[warp];

  LaneStats stats;
  uint16_t codes[kPerLane];
  uint16_t scale;
  uint16_t min;
  // Block x of a group of W blocks takes tokens j, j + W, j + 2W, ... (j =
  // x % W) of the group's kWarps * W tokens, one per warp: in a prefill,
  // where runs tile the tokens, a block's warps are then all run leaders
  // or all inside runs (and return at once), so resident blocks are busy
  // ones. Tokens written one at a time (a decode step) keep one warp each.
  // Grid y is the KV head.
  const int h = static_cast<int>(blockIdx.y);
  const int64_t group_tokens = int64_t{kWarps} * W;
  const int64_t num_groups = (p.num_tokens + group_tokens - 1) / group_tokens;
  for (int64_t grp = blockIdx.x / W; grp < num_groups; grp += gridDim.x / W) {
    const int64_t tt = grp * group_tokens + int64_t{warp} * W + blockIdx.x % W;
    if (tt >= p.num_tokens) continue;
    const int32_t t = static_cast<int32_t>(tt);
    const int64_t slot = __ldg(p.slot_mapping + t);
    if (slot < 0 || slot >= num_slots) {  // padding, or invalid: never written
      if (slot != -1 && h == 0) {
        ReportFault(p.checked, DeviceFault::kSlotOutOfRange, t, slot, num_slots);
      }
      continue;
    }
    const int n = RunLength<W>(g, p.slot_mapping, p.num_tokens, t, slot, lane);
    if (n == 0) continue;  // inside another warp's run
    const int64_t b = slot / g.block_size;
    const int off = static_cast<int>(slot % g.block_size);
    const int64_t head_offset = int64_t{h} * D;

    // Every input row of the item in flight at once; then one wait. The
    // rows are quantized one at a time from shared memory in a loop that
    // is not unrolled: the quantizer (all dtypes, exact divisions) is long,
    // and W unrolled copies of it missed in the instruction cache.
    for (int k = 0; k < n; ++k) {
      StageRow(key + (t + k) * p.key_stride + head_offset, D, args.key_vec, lane, &raw[k][lane]);
      StageRow(value + (t + k) * p.value_stride + head_offset, D, args.value_vec, lane,
               &raw[W + k][lane]);
    }
    CpAsyncWaitAll();  // each lane reads back only its own elements

    // ---- K (key smoothing applies to K only) ----
    const float* lambda = p.key_smoothing != nullptr ? p.key_smoothing + head_offset : nullptr;
#pragma unroll 1
    for (int k = 0; k < n; ++k) {
      QuantizeRow(raw[k][lane], valid, lambda, g.k_dtype, lane, codes, &scale, &min, &stats);
      StageKRow<Tag>(g, lane, valid, codes, reinterpret_cast<uint8_t*>(k_stage[warp][k]));
      if (lane == 0) {
        StoreScale(k_scales + g.k_scale_byte(b, h, off + k), g.k_scale_entry_bytes(), scale, min);
      }
    }
    __syncwarp();
    // Tokens off .. off + n - 1 of block b: chunk c of token k sits at
    // c * chunk_stride + k * 16 from the first token's row.
    uint8_t* const k_row = k_data + g.k_byte(b, h, off, 0);
    const int64_t chunk_stride = g.k_chunk_stride();
    for (int i = lane; i < n * g.k_chunks(); i += 32) {
      const int c = i / n;
      const int k = i - c * n;
      *reinterpret_cast<uint4*>(k_row + c * chunk_stride + k * 16) = k_stage[warp][k][c];
    }

    // ---- V ----
    uint8_t* const v_head = v_data + g.v_byte(b, h, 0, 0);
    if (n == 1) {
      // A token on its own: element by element (INT4 nibbles by atomics).
      QuantizeRow(raw[W][lane], valid, nullptr, g.v_dtype, lane, codes, &scale, &min, &stats);
      StoreVToken<Tag>(g, v_head, off, lane, valid, codes);
      if (lane == 0) {
        StoreScale(v_scales + g.v_scale_byte(b, h, off), g.v_scale_entry_bytes(), scale, min);
      }
    } else {
      // The run fills the words of slots off .. off + W - 1 (off is a
      // multiple of W): each channel's word assembled in registers,
      // little-endian like the CPU's byte-wise stores.
      constexpr int kBits = 32 / W;
      constexpr uint32_t kMask = (1u << kBits) - 1u;
      uint32_t words[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) words[i] = 0;
#pragma unroll 1
      for (int k = 0; k < W; ++k) {
        QuantizeRow(raw[W + k][lane], valid, nullptr, g.v_dtype, lane, codes, &scale, &min,
                    &stats);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          words[i] |= (static_cast<uint32_t>(codes[i]) & kMask) << (k * kBits);
        }
        if (lane == 0) {
          StoreScale(v_scales + g.v_scale_byte(b, h, off + k), g.v_scale_entry_bytes(), scale,
                     min);
        }
      }
      uint8_t* const v_word = v_head + int64_t{off} * kBits / 8;
      const int64_t stride = g.v_channel_stride();
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (valid & (1u << i)) {
          *reinterpret_cast<uint32_t*>(v_word + L::Channel(lane, i) * stride) = words[i];
        }
      }
    }
    __syncwarp();  // the stages are reused by this warp's next item
  }

  // One atomic per warp and counter, only when there is something to add.
  const unsigned non_finite = __reduce_add_sync(kFullWarp, stats.non_finite);
  const unsigned saturated = __reduce_add_sync(kFullWarp, stats.saturated);
  if (lane == 0 && p.counters != nullptr) {
    if (non_finite != 0) {
      atomicAdd(&p.counters->non_finite, static_cast<unsigned long long>(non_finite));
    }
    if (saturated != 0) {
      atomicAdd(&p.counters->saturated, static_cast<unsigned long long>(saturated));
    }
  }
}

bool Aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <typename Tag, int kPerLane, int W>
int Launch(const WriteArgs& args, cudaStream_t stream) {
  constexpr int kWarps = WarpsPerBlock<Tag, kPerLane, W>();
  const int64_t group_tokens = int64_t{kWarps} * W;
  int64_t groups = (args.p.num_tokens + group_tokens - 1) / group_tokens;
  // A grid-stride loop covers the rest; this is plenty to fill any GPU.
  if (groups > (int64_t{1} << 16)) groups = int64_t{1} << 16;
  const dim3 grid(static_cast<unsigned>(groups * W), static_cast<unsigned>(args.p.geo.num_kv_heads));
  CacheWriteKernel<Tag, kPerLane, W><<<grid, kWarps * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

// The one dispatch point: V word width (from the V dtype's bits) and
// elements per lane (from the head size) become template arguments.
template <typename Tag>
int LaunchForInput(const WriteArgs& args, cudaStream_t stream) {
  const bool wide = args.p.geo.head_size > 32 * 4;
  switch (args.p.geo.v_bits()) {
    case 16:
      return wide ? Launch<Tag, 8, 2>(args, stream) : Launch<Tag, 4, 2>(args, stream);
    case 8:
      return wide ? Launch<Tag, 8, 4>(args, stream) : Launch<Tag, 4, 4>(args, stream);
    case 4:
      return wide ? Launch<Tag, 8, 8>(args, stream) : Launch<Tag, 4, 8>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int LaunchCacheWrite(const WriteParams& params, void* stream) {
  const CacheGeometry& g = params.geo;
  if (params.num_tokens <= 0 || g.num_kv_heads <= 0) return cudaSuccess;
  // The 16-byte K chunk stores and the scale/V stores need an aligned layer
  // (layers start at 256-byte boundaries of a cudaMalloc'd or
  // engine-allocated, aligned cache).
  if (!Aligned(params.layer, 16)) return cudaErrorMisalignedAddress;
  if (g.head_size <= 0 || g.head_size > 32 * 8 || g.head_size % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int in_bytes = params.input_dtype == DType::kFP32 ? 4 : 2;
  WriteArgs args;
  args.p = params;
  // Rows start at t * stride + h * head_size elements and head_size is a
  // multiple of 16, so 4-element loads need an aligned base and stride.
  const int load_bytes = 4 * in_bytes;
  args.key_vec = Aligned(params.key, load_bytes) && (params.key_stride * in_bytes) % load_bytes == 0;
  args.value_vec =
      Aligned(params.value, load_bytes) && (params.value_stride * in_bytes) % load_bytes == 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (params.input_dtype) {
    case DType::kFP32:
      return LaunchForInput<float>(args, s);
    case DType::kFP16:
      return LaunchForInput<HalfTag>(args, s);
    case DType::kBF16:
      return LaunchForInput<Bf16Tag>(args, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace kvpage
