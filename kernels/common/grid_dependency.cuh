// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (sm_90 and newer; both are no-ops before,
// and where the launch did not ask for it). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may have its blocks
// resident while the kernel before it in the stream still runs: it must
// wait for that kernel (all of it, its stores visible) before its first
// global memory access, and it lets its own dependent be scheduled with
// AllowDependentGrid once nothing of its own is left to schedule behind it.
// With the launch helpers every kernel family uses (LaunchKernel,
// EnsureDynamicSmem).
#ifndef KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_
#define KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <utility>

namespace kvpage {
namespace kernels {

// Lets the dependent grid be scheduled once every block of this grid has
// called it (or exited): its blocks then take SM slots as this grid
// drains, instead of after it, and wait on the device.
__device__ __forceinline__ void AllowDependentGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the grid this one depends on has completed and its stores
// are visible; returns at once where there is none.
__device__ __forceinline__ void WaitForPrerequisiteGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem_bytes, stream>>>(args...), as a
// programmatic dependent of the stream's previous kernel where `dependent`
// (the kernel must then call WaitForPrerequisiteGrid before its first
// global memory access). Returns the launch's error, and clears it.
template <typename... Params, typename... Args>
inline int LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                        cudaStream_t stream, bool dependent, Args&&... args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = dependent ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();
  return err != cudaSuccess ? err : last;
}

// Raises a kernel's dynamic shared memory limit to `bytes` when it exceeds
// the default 48 KiB: once per (kernel, device, size increase), a host-side
// attribute set, no synchronization.
inline int EnsureDynamicSmem(const void* kernel, size_t bytes, std::atomic<size_t>* configured,
                             int max_devices) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::atomic<size_t>* slot = dev < max_devices ? &configured[dev] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  if (slot != nullptr) {
    size_t cur = slot->load(std::memory_order_relaxed);
    while (cur < bytes && !slot->compare_exchange_weak(cur, bytes)) {
    }
  }
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_
