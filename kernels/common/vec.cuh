// SPDX-License-Identifier: Apache-2.0
// 16-byte vector loads and the element conversions of the small FP32 /
// FP16 / BF16 tensors a kernel reads or writes (queries, outputs). Cache
// bytes (K, V) go through dequant.cuh instead.
#ifndef KVPAGE_KERNELS_COMMON_VEC_CUH_
#define KVPAGE_KERNELS_COMMON_VEC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/dequant.cuh"
#include "src/geometry.h"

namespace kvpage {
namespace kernels {

// One 16-byte load through the read-only (non-coherent) path: the cache is
// never written while a decode reads it, and the texture path keeps the
// lines in L1 for the next row tile. `p` must be 16-byte aligned, which every
// K chunk row and V vector of the layouts in src/geometry.h is.
__device__ __forceinline__ uint4 Load16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint4 Zero16() { return make_uint4(0u, 0u, 0u, 0u); }

// Element `i` of an FP32 / FP16 / BF16 tensor as float (exact). The dtype is
// a runtime value: these tensors are small (one query or output row per
// thread block), so a uniform switch costs nothing next to the cache reads.
__device__ __forceinline__ float LoadAsFloat(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::kFP16:
      return __half2float(reinterpret_cast<const __half*>(base)[i]);
    case DType::kBF16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return reinterpret_cast<const float*>(base)[i];
  }
}

// Stores `v` as FP32 / FP16 / BF16 with round-half-to-even (16-bit overflow
// gives +-Inf), matching StoreFromFloat of src/formats.h.
__device__ __forceinline__ void StoreFromFloat(DType dtype, void* base, int64_t i, float v) {
  switch (dtype) {
    case DType::kFP16:
      reinterpret_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case DType::kBF16:
      reinterpret_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      reinterpret_cast<float*>(base)[i] = v;
  }
}

// Elements i .. i + 7 of an FP32 / FP16 / BF16 tensor as floats: 16-byte
// loads where the address allows (a query row with an aligned stride),
// element loads otherwise.
__device__ __forceinline__ void LoadAsFloat8(DType dtype, const void* base, int64_t i,
                                             float (&f)[8]) {
  const int bytes = dtype == DType::kFP32 ? 4 : 2;
  const auto* at = static_cast<const uint8_t*>(base) + i * bytes;
  if (reinterpret_cast<uintptr_t>(at) % 16 != 0) {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = LoadAsFloat(dtype, base, i + e);
    return;
  }
  if (dtype == DType::kFP32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(at));
    const float4 b = __ldg(reinterpret_cast<const float4*>(at) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    return;
  }
  if (dtype == DType::kBF16) {
    DequantCodes<DType::kBF16>(Load16(at), f);
  } else {
    DequantCodes<DType::kFP16>(Load16(at), f);
  }
}

// Asynchronous global -> shared copy of kBytes (4, 8 or 16; both addresses
// aligned to it), bypassing registers: a warp can keep many in flight. With
// `in` false nothing is read and the kBytes of shared memory become zeros.
// 16-byte copies bypass L1 (.cg), smaller ones cannot. kL2Fetch256: L2
// fills the whole aligned 256 bytes around the copy from DRAM at once
// (.L2::256B), for copies whose neighbours in that span come soon after:
// fewer, larger DRAM reads where a block's pieces are scattered.
template <int kBytes, bool kL2Fetch256 = false>
__device__ __forceinline__ void CpAsync(void* smem, const void* gmem, bool in = true) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = in ? kBytes : 0;
  // One instruction, four spellings: the cache operator and the L2 fetch
  // size are part of the opcode.
#define KVPAGE_CP_ASYNC(opcode)                                                                 \
  asm volatile(opcode " [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(kBytes), "r"(src_bytes) \
               : "memory")
  if constexpr (kBytes == 16 && kL2Fetch256) {
    KVPAGE_CP_ASYNC("cp.async.cg.shared.global.L2::256B");
  } else if constexpr (kBytes == 16) {
    KVPAGE_CP_ASYNC("cp.async.cg.shared.global");
  } else if constexpr (kL2Fetch256) {
    KVPAGE_CP_ASYNC("cp.async.ca.shared.global.L2::256B");
  } else {
    KVPAGE_CP_ASYNC("cp.async.ca.shared.global");
  }
#undef KVPAGE_CP_ASYNC
}

// Closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still
// in flight (the older ones are in shared memory, visible to this thread).
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Asks L2 for the 128-byte line holding `p` (any address inside an
// allocation; no alignment needed, nothing returned, no registers held).
__device__ __forceinline__ void PrefetchL2Line(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Asks L2 to fetch kBytes (a multiple of 16) from global memory at `p`
// (16-byte aligned) and returns at once: no registers, no wait, nothing
// for the caller to track. A later load of those lines then waits for L2
// instead of DRAM. sm_90 fetches the range with one bulk instruction;
// before it, one line prefetch per 128 bytes.
template <int kBytes>
__device__ __forceinline__ void PrefetchL2(const void* p) {
  static_assert(kBytes % 16 == 0, "bulk prefetches cover whole 16-byte units");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)),
               "r"(kBytes));
#else
  for (int off = 0; off < kBytes; off += 128) PrefetchL2Line(static_cast<const char*>(p) + off);
#endif
}

// Four consecutive floats (16-byte aligned) in one load.
__device__ __forceinline__ float4 LoadFloat4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_VEC_CUH_
