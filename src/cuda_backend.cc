// The CUDA backend's host side. The kernels arrive with the CUDA backend
// issue; until then a cache on a CUDA device is KVP_ERR_UNSUPPORTED, and
// this file only reports devices and probes the toolchain.
#include "absl/strings/str_format.h"
#include "src/backend.h"
#include "src/status.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvpage {

int32_t CudaDeviceCount() {
#if KVPAGE_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not sticky, clear it
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal) {
#if KVPAGE_HAVE_CUDA
  const int32_t count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgument(absl::StrFormat(
        "config->device_ordinal = %d, but %d CUDA device(s) are present", ordinal, count));
  }
  return Unsupported(
      "the CUDA backend's kernels are not part of this release yet; use "
      "device_kind = KVP_DEVICE_CPU");
#else
  return Unsupported(absl::StrFormat(
      "device_kind = KVP_DEVICE_CUDA (ordinal %d), but this build has no CUDA "
      "backend (configure with KVPAGE_CUDA=ON and a CUDA toolkit)",
      ordinal));
#endif
}

}  // namespace kvpage
