// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's host side: device memory, the decode launch shape and
// workspace, and the launches. Every entry makes the cache's device current
// for its duration and restores the caller's device afterwards; launches
// go on the caller's stream with no allocation and no synchronization.
#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "src/backend.h"
#include "src/decode_plan.h"
#include "src/status.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/launch.h"
#endif

namespace kvpage {

#if KVPAGE_HAVE_CUDA
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls are unaffected
    return OutOfMemory(kvpage::StrFormat("%s: %s", what, cudaGetErrorString(e)));
  }
  return DeviceError(
      kvpage::StrFormat("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

// Makes `ordinal` the current device for a scope and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    status_ = CudaError(cudaGetDevice(&previous_), "cudaGetDevice");
    if (status_.ok() && previous_ != ordinal) {
      status_ = CudaError(cudaSetDevice(ordinal), "cudaSetDevice");
      switched_ = status_.ok();
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  absl::Status status_;
};

#define KVP_CUDA_GUARD(ordinal)    \
  DeviceGuard kvp_guard_(ordinal); \
  KVP_RETURN_IF_ERROR(kvp_guard_.status())

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

class CudaBackend final : public Backend {
 public:
  CudaBackend(int32_t ordinal, const DeviceProfile& device, const DecodeTuning& tuning)
      : ordinal_(ordinal), device_(device), tuning_(tuning) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  int32_t ordinal() const override { return ordinal_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    KVP_CUDA_GUARD(ordinal_);
    void* p = nullptr;
    KVP_RETURN_IF_ERROR(
        CudaError(cudaMalloc(&p, bytes),
                  kvpage::StrFormat("cudaMalloc(%d bytes) on device %d", bytes, ordinal_).c_str()));
    return p;
  }
  void Free(void* ptr) override {
    DeviceGuard guard(ordinal_);
    cudaFree(ptr);
  }
  absl::StatusOr<DeviceErrorRecord*> AllocateErrorRecord() override {
    KVP_CUDA_GUARD(ordinal_);
    void* p = nullptr;
    KVP_RETURN_IF_ERROR(CudaError(
        cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc (checked-mode error record)"));
    void* device = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&device, p, 0);
    if (err != cudaSuccess || device != p) {
      cudaFreeHost(p);
      return absl::UnimplementedError(
          "checked mode needs unified addressing (host-mapped memory at the same address)");
    }
    std::memset(p, 0, sizeof(DeviceErrorRecord));
    return static_cast<DeviceErrorRecord*>(p);
  }
  void FreeErrorRecord(DeviceErrorRecord* record) override {
    DeviceGuard guard(ordinal_);
    cudaFreeHost(record);
  }
  absl::Status Memset(void* ptr, int value, size_t bytes) override {
    KVP_CUDA_GUARD(ordinal_);
    KVP_RETURN_IF_ERROR(CudaError(cudaMemset(ptr, value, bytes), "cudaMemset"));
    // cudaMemset may return before it completes; creation must be done.
    return CudaError(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    KVP_CUDA_GUARD(ordinal_);
    return CudaError(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    KVP_CUDA_GUARD(ordinal_);
    // Work on any stream (also non-blocking ones) must be done first.
    KVP_RETURN_IF_ERROR(CudaError(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    return CudaError(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    // Unified addressing tells host, this device and peers apart.
    return CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)),
                     "cudaMemcpyAsync");
  }

  absl::Status Write(const WriteParams& p, void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    return CudaError(static_cast<cudaError_t>(kernels::LaunchCacheWrite(
                         p, device_.cc_major >= 9 && tuning_.dependent_write, stream)),
                     "cache write kernel launch");
  }

  // The decode's split-K scratch, then kvp_attend's (src/decode_plan.h).
  size_t DecodeWorkspaceBytes(const CacheGeometry& geo, const DecodeCapacity& cap) const override {
    return static_cast<size_t>(
        AttendWorkspaceBase(geo, cap) +
        PlanAttendWorkspace(geo, cap, PlanAttend(geo, cap, device_, tuning_)).bytes);
  }

  absl::Status Decode(const DecodeParams& p, const DecodeCapacity& cap, void* workspace,
                      void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    if (p.query_starts != nullptr) return Attend(p, cap, workspace, stream);
    const DecodePlan plan = PlanDecode(p.geo, cap, device_, tuning_);
    const DecodeWorkspaceLayout l = PlanWorkspace(p.geo, cap, plan);
    auto* base = static_cast<uint8_t*>(workspace);
    DecodeWorkspace ws;
    ws.partial_out = reinterpret_cast<float*>(base + l.out_offset);
    ws.partial_max = reinterpret_cast<float*>(base + l.max_offset);
    ws.partial_sum = reinterpret_cast<float*>(base + l.sum_offset);
    return CudaError(static_cast<cudaError_t>(kernels::LaunchDecode(p, plan, ws, stream)),
                     "decode kernel launch");
  }

  absl::Status Attend(const DecodeParams& p, const DecodeCapacity& cap, void* workspace,
                      void* stream) {
    if (cap.precise) {
      return Unsupported(
          "kvp_attend on a precise decoder (config->precise = 1) is served by the CPU backend "
          "only: the CUDA query-chunk kernels multiply 16-bit operands on tensor cores");
    }
    const AttendPlan plan = PlanAttend(p.geo, cap, device_, tuning_);
    const AttendWorkspaceLayout l = PlanAttendWorkspace(p.geo, cap, plan);
    auto* base = static_cast<uint8_t*>(workspace) + AttendWorkspaceBase(p.geo, cap);
    AttendWorkspace ws;
    ws.counts = reinterpret_cast<int32_t*>(base + l.counts_offset);
    ws.items = reinterpret_cast<AttendWorkItem*>(base + l.items_offset);
    ws.merges = reinterpret_cast<AttendMerge*>(base + l.merges_offset);
    ws.partial_out = reinterpret_cast<float*>(base + l.out_offset);
    ws.partial_lse = reinterpret_cast<float*>(base + l.lse_offset);
    if (plan.decode_rows) {
      ws.decode_lens = reinterpret_cast<int32_t*>(base + l.decode_lens_offset);
      ws.decode_q = base + l.decode_q_offset;
      ws.decode_out = base + l.decode_out_offset;
      ws.decode_lse = reinterpret_cast<float*>(base + l.decode_lse_offset);
      const DecodeWorkspaceLayout d = PlanWorkspace(p.geo, cap, plan.decode_rows_plan);
      auto* scratch = static_cast<uint8_t*>(workspace);
      ws.decode.partial_out = reinterpret_cast<float*>(scratch + d.out_offset);
      ws.decode.partial_max = reinterpret_cast<float*>(scratch + d.max_offset);
      ws.decode.partial_sum = reinterpret_cast<float*>(scratch + d.sum_offset);
    }
    return CudaError(static_cast<cudaError_t>(kernels::LaunchAttend(p, plan, ws, stream)),
                     "attention kernel launch");
  }

  absl::Status MoveBlocks(const BlockMoveParams& p, void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    return CudaError(static_cast<cudaError_t>(kernels::LaunchMoveBlocks(p, stream)),
                     "block move kernel launch");
  }

 private:
  // Where kvp_attend's part of the workspace starts: past the split-K
  // scratch of the decode and of kvp_attend's decode rows.
  int64_t AttendWorkspaceBase(const CacheGeometry& geo, const DecodeCapacity& cap) const {
    return DecodeScratchBytes(geo, cap, PlanDecode(geo, cap, device_, tuning_),
                              PlanAttend(geo, cap, device_, tuning_));
  }

  const int32_t ordinal_;
  const DeviceProfile device_;
  const DecodeTuning tuning_;  // read from the environment when the cache is created
};

}  // namespace
#endif  // KVPAGE_HAVE_CUDA

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

absl::StatusOr<DeviceProfile> CudaDeviceProfile(int32_t ordinal) {
#if KVPAGE_HAVE_CUDA
  const int32_t count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgument(kvpage::StrFormat(
        "config->device_ordinal = %d, but %d CUDA device(s) are present", ordinal, count));
  }
  int num_sms = 0, cc_major = 0, cc_minor = 0, smem_optin = 0, smem_per_sm = 0, smem_reserved = 0;
  KVP_RETURN_IF_ERROR(
      CudaError(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, ordinal),
                "cudaDeviceGetAttribute(MultiProcessorCount)"));
  KVP_RETURN_IF_ERROR(
      CudaError(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, ordinal),
                "cudaDeviceGetAttribute(ComputeCapabilityMajor)"));
  KVP_RETURN_IF_ERROR(
      CudaError(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal),
                "cudaDeviceGetAttribute(ComputeCapabilityMinor)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, ordinal),
      "cudaDeviceGetAttribute(ReservedSharedMemoryPerBlock)"));
  DeviceProfile d;
  d.num_sms = num_sms;
  d.cc_major = cc_major;
  d.max_shared_per_block = static_cast<size_t>(smem_optin);
  d.shared_per_sm = static_cast<size_t>(smem_per_sm);
  d.reserved_shared_per_block = static_cast<size_t>(smem_reserved);
#if KVPAGE_HAVE_SM90A
  d.wgmma = cc_major == 9 && cc_minor == 0;
#endif
  return d;
#else
  return Unsupported(
      kvpage::StrFormat("device_kind = KVP_DEVICE_CUDA (ordinal %d), but this build has no CUDA "
                        "backend (configure with KVPAGE_CUDA=ON and a CUDA toolkit)",
                        ordinal));
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal,
                                                         const DecodeTuning& tuning) {
  absl::StatusOr<DeviceProfile> device = CudaDeviceProfile(ordinal);
  if (!device.ok()) return device.status();
#if KVPAGE_HAVE_CUDA
  return std::unique_ptr<Backend>(new CudaBackend(ordinal, *device, tuning));
#else
  (void)tuning;
  return Unsupported("no CUDA backend");  // not reached: CudaDeviceProfile refused
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal) {
  return MakeCudaBackend(ordinal, DecodeTuningFromEnvironment());
}

}  // namespace kvpage
