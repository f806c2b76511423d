// SPDX-License-Identifier: Apache-2.0
// The backend interface: where a cache's memory lives and how its
// operations run. One implementation per device kind (CPU, CUDA); the
// cache and the C API above it never branch on the device kind.
#ifndef KVPAGE_SRC_BACKEND_H_
#define KVPAGE_SRC_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/decode_plan.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {

enum class DeviceKind : int32_t { kCpu = 0, kCuda = 1 };

// Engine-provided memory (mirrors kvp_allocator; null functions = none).
struct Allocator {
  void* user_data = nullptr;
  void* (*alloc)(void* user_data, size_t bytes, size_t alignment, int32_t device_kind,
                 int32_t device_ordinal) = nullptr;
  void (*free)(void* user_data, void* ptr, size_t bytes, int32_t device_kind,
               int32_t device_ordinal) = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual int32_t ordinal() const = 0;

  // Memory in this backend's space (used when the engine gave no
  // allocator), and the host <-> backend transfers the cache needs.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // A zeroed checked-mode record (src/params.h) that this backend's kernels
  // can write and the host can read without synchronizing: host-mapped
  // memory for CUDA (one pointer on both sides, unified addressing).
  virtual absl::StatusOr<DeviceErrorRecord*> AllocateErrorRecord() = 0;
  virtual void FreeErrorRecord(DeviceErrorRecord* record) = 0;
  virtual absl::Status Memset(void* ptr, int value, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Copies between any two places this backend's device can reach (its own
  // memory, host memory, another device's memory), ordered on `stream`.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) = 0;

  // Quantize and scatter tokens (WriteParams); slots out of range are an
  // error where the backend can see them before writing anything.
  virtual absl::Status Write(const WriteParams& params, void* stream) = 0;

  virtual size_t DecodeWorkspaceBytes(const CacheGeometry& geo,
                                      const DecodeCapacity& cap) const = 0;
  virtual absl::Status Decode(const DecodeParams& params, const DecodeCapacity& cap,
                              void* workspace, void* stream) = 0;

  // Moves whole blocks (BlockMoveParams): copies within the cache, packs
  // into a buffer or unpacks from one, on `stream`. `ids` is in this
  // backend's memory space, or in host memory with ids_on_host. Ids out of
  // range that the host could not check move nothing; `checked` (checked
  // mode, else null) records the first.
  virtual absl::Status MoveBlocks(const BlockMoveParams& params, void* stream) = 0;
};

std::unique_ptr<Backend> MakeCpuBackend();
// The CUDA backend of device `ordinal`, with the tuning the environment
// asks for (DecodeTuningFromEnvironment, read here, once per cache) or with
// `tuning` (tests); an error where this build has no CUDA backend or no
// such device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal);
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal,
                                                         const DecodeTuning& tuning);
// What the decode plan needs to know of CUDA device `ordinal`.
absl::StatusOr<DeviceProfile> CudaDeviceProfile(int32_t ordinal);
// Number of CUDA devices (0 without CUDA support or GPUs).
int32_t CudaDeviceCount();

}  // namespace kvpage

#endif  // KVPAGE_SRC_BACKEND_H_
