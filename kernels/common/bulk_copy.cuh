// SPDX-License-Identifier: Apache-2.0
// Shared-memory barriers (mbarrier) and bulk copies by the SM's copy engine
// (cp.async.bulk, sm_90+): a producer warp copies whole contiguous pieces
// of global memory into shared memory, each completing on a barrier that
// counts the bytes it expects, while consumer warps compute on earlier
// stages. Below sm_90 these compile to nothing: only kernels the host
// launches on sm_90+ call them (DecodeKernel::kTensorCoreStaged).
#ifndef KVPAGE_KERNELS_COMMON_BULK_COPY_CUH_
#define KVPAGE_KERNELS_COMMON_BULK_COPY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVPAGE_SM90_ONLY(...)
#else
#define KVPAGE_SM90_ONLY(...) __VA_ARGS__
#endif

namespace kvpage {
namespace kernels {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initializes a barrier that completes a phase after `arrivals`
// arrivals (and the bytes any arrival announced), then fences the
// initialization before the block's barrier publishes it.
__device__ __forceinline__ void MbarrierInit(uint64_t* bar, int arrivals) {
  KVPAGE_SM90_ONLY(
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)),
                   "r"(arrivals));)
}
__device__ __forceinline__ void MbarrierFenceInit() {
  KVPAGE_SM90_ONLY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");)
}
// Arrives and announces `bytes` that bulk copies will complete on `bar`.
__device__ __forceinline__ void MbarrierArriveExpectBytes(uint64_t* bar, int bytes) {
  KVPAGE_SM90_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                                    SharedAddress(bar)),
                                "r"(bytes)
                                : "memory");)
}
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  KVPAGE_SM90_ONLY(
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(bar))
                   : "memory");)
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  KVPAGE_SM90_ONLY(asm volatile("{\n .reg .pred done;\n"
                                "WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                                " @!done bra WAIT;\n}\n" ::"r"(SharedAddress(bar)),
                                "r"(parity)
                                : "memory");)
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// global to shared memory; completes them on `bar`.
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, int bytes,
                                                 uint64_t* bar) {
  KVPAGE_SM90_ONLY(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                                "[%0], [%1], %2, [%3];\n" ::"r"(SharedAddress(dst)),
                                "l"(__cvta_generic_to_global(src)), "r"(bytes),
                                "r"(SharedAddress(bar))
                                : "memory");)
}
// A barrier of the `threads` threads (whole warps) that use barrier `id`
// (1-15; 0 is __syncthreads'): a warp group's own.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_BULK_COPY_CUH_
