// Host-callable launchers of the kernels: plain C++ declarations, so that
// src/ (compiled by the host compiler) can call into the CUDA objects.
#ifndef KVPAGE_KERNELS_LAUNCH_H_
#define KVPAGE_KERNELS_LAUNCH_H_

#include <cstdint>

namespace kvpage {
namespace kernels {

// Fills dst[i] = seed * 2654435761 + i (mod 2^32) for i < n on `stream`.
// The toolchain probe: proves .cu files compile, link and run. Returns a
// cudaError_t as int.
int LaunchFillPattern(uint32_t* dst, int64_t n, uint32_t seed, void* stream);

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_LAUNCH_H_
