// SPDX-License-Identifier: Apache-2.0
// Checked mode: a kernel that finds a bad block id, length or slot in the
// data it was handed reports the first one here (src/params.h,
// DeviceErrorRecord) and skips the access instead of making it.
#ifndef KVPAGE_KERNELS_COMMON_CHECKED_CUH_
#define KVPAGE_KERNELS_COMMON_CHECKED_CUH_

#include <cstdint>

#include "src/params.h"

namespace kvpage {
namespace kernels {

// Publishes a fault unless one is already recorded: claim, fill, fence,
// then set `fault` (the host reads `fault` first, so it never sees a
// half-written record). The record is host-mapped memory.
__device__ __forceinline__ void ReportFault(DeviceErrorRecord* record, DeviceFault fault,
                                            int64_t where, int64_t value, int64_t limit) {
  if (record == nullptr) return;
  if (atomicCAS(&record->claim, 0u, 1u) != 0u) return;
  record->where = where;
  record->value = value;
  record->limit = limit;
  __threadfence_system();
  atomicExch(&record->fault, static_cast<uint32_t>(fault));
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_CHECKED_CUH_
