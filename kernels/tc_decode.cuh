// SPDX-License-Identifier: Apache-2.0
// The tensor-core decode family (DecodeKernel::kTensorCoreRegisters and
// kTensorCoreRing): its launchers and instantiation macros, which the
// generated units (kernels/manifest.cmake) instantiate per (K dtype, head
// size) and decode_dispatch.cu declares extern. The kernels are one per
// mechanism, composed of the prologue, the step's math and the epilogue of
// tc_partition_common.cuh:
//   TcRegisterKernel (tc_register_decode.cuh): codes loaded into registers
//     one step ahead, L2 prefetch of the steps after;
//   TcRingKernel (tc_ring_decode.cuh): codes and scale entries through a
//     per-warp cp.async ring, two steps ahead (TcRingStages: INT4 at head
//     size 128).
// docs/DESIGN.md, "Decode kernels".
#ifndef KVPAGE_KERNELS_TC_DECODE_CUH_
#define KVPAGE_KERNELS_TC_DECODE_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

#include "kernels/partition_common.cuh"
#include "kernels/tc_register_decode.cuh"
#include "kernels/tc_ring_decode.cuh"
#include "src/manifest.h"

namespace kvpage {
namespace kernels {
namespace decode {

// The tensor-core kernel of (T, D, kNT, kBS): the ring where TcRingStages
// says so, else the register path.
template <DType T, int D, int kNT, int kBS>
constexpr PartitionKernelFn TcPartitionKernel() {
  if constexpr (TcRingStages(T, D) > 0) {
    return &TcRingKernel<T, D, kNT, kBS>;
  } else {
    return &TcRegisterKernel<T, D, kNT, kBS>;
  }
}

// Launches TcPartitionKernel<T, D, kNT, kBS>() with the shared memory it
// lays out.
template <DType T, int D, int kNT, int kBS>
int LaunchTcPartitionKernelShape(const DecodeParams& p, const DecodePlan& plan,
                                 const DecodeWorkspace& ws, cudaStream_t stream) {
  static std::atomic<size_t> configured[kMaxSmemDevices];
  const size_t smem_bytes =
      sizeof(float) *
      static_cast<size_t>(MakeTcSmemLayout(p.geo, plan.partition_size, 8 * kNT).total);
  return LaunchPartitionGrid(TcPartitionKernel<T, D, kNT, kBS>(), configured, p, plan, ws,
                             smem_bytes, stream);
}

template <DType T, int D, int kNT>
int LaunchTcPartitionKernelRows(const DecodeParams& p, const DecodePlan& plan,
                                const DecodeWorkspace& ws, cudaStream_t stream) {
  switch (p.geo.block_size) {
#define KVPAGE_TC_BLOCK_SIZE_CASE(BS) \
  case BS:                            \
    return LaunchTcPartitionKernelShape<T, D, kNT, BS>(p, plan, ws, stream);
    KVPAGE_MANIFEST_TC_BLOCK_SIZES(KVPAGE_TC_BLOCK_SIZE_CASE)
#undef KVPAGE_TC_BLOCK_SIZE_CASE
    default:
      return cudaErrorInvalidValue;  // not in the manifest: the plan never picks it
  }
}

// The tensor-core partition launcher for (T, D), same signature as
// LaunchPartitionKernel (the shared memory argument is recomputed: the two
// kernels lay it out differently).
template <DType T, int D>
int LaunchTcPartitionKernel(const DecodeParams& p, const DecodePlan& plan,
                            const DecodeWorkspace& ws, size_t /*smem_bytes*/, cudaStream_t stream) {
  if constexpr (!TcSupports(T, D)) {
    return cudaErrorInvalidValue;
  } else {
    const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
    if (TcColumnTiles(rows) == 1) return LaunchTcPartitionKernelRows<T, D, 1>(p, plan, ws, stream);
    return LaunchTcPartitionKernelRows<T, D, 2>(p, plan, ws, stream);
  }
}

#define KVPAGE_TC_DECODE_INSTANTIATE(T, D)                                           \
  template int LaunchTcPartitionKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                             const DecodeWorkspace&, size_t, cudaStream_t);
#define KVPAGE_TC_DECODE_DECLARE_EXTERN(T, D)                                               \
  extern template int LaunchTcPartitionKernel<T, D>(const DecodeParams&, const DecodePlan&, \
                                                    const DecodeWorkspace&, size_t, cudaStream_t);

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_TC_DECODE_CUH_
