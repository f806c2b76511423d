// Programmatic dependent launch (sm_90 and newer; both are no-ops before,
// and where the launch did not ask for it). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may have its blocks
// resident while the kernel before it in the stream still runs: it must
// wait for that kernel (all of it, its stores visible) before its first
// global memory access, and it lets its own dependent be scheduled with
// AllowDependentGrid once nothing of its own is left to schedule behind it.
#ifndef KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_
#define KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_

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

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_GRID_DEPENDENCY_CUH_
