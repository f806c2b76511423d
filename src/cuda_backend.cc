// The CUDA backend's host side: device memory, the decode launch shape and
// workspace, and the launches. Every entry makes the cache's device current
// for its duration and restores the caller's device afterwards; launches
// go on the caller's stream with no allocation and no synchronization.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "src/backend.h"
#include "src/decode_partition.h"
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
  CudaBackend(int32_t ordinal, int num_sms, int cc_major, size_t max_shared_per_block,
              size_t shared_per_sm, size_t reserved_shared_per_block)
      : ordinal_(ordinal),
        num_sms_(num_sms),
        cc_major_(cc_major),
        max_shared_per_block_(max_shared_per_block),
        shared_per_sm_(shared_per_sm),
        reserved_shared_per_block_(reserved_shared_per_block) {}

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
                         p, cc_major_ >= 9 && DependentWriteFromEnvironment(), stream)),
                     "cache write kernel launch");
  }

  // KVPAGE_DECODE_KERNEL=thread_group|tensor_core forces one partition
  // kernel (for comparisons, and as an escape hatch); unset or anything
  // else lets the dispatcher choose. Read once per process.
  static DecodePath PathFromEnvironment() {
    static const DecodePath path = [] {
      const char* v = std::getenv("KVPAGE_DECODE_KERNEL");
      if (v == nullptr) return DecodePath::kAuto;
      const absl::string_view s(v);
      if (s == "thread_group") return DecodePath::kThreadGroup;
      if (s == "tensor_core") return DecodePath::kTensorCore;
      return DecodePath::kAuto;
    }();
    return path;
  }

  // Whether environment variable `name` leaves a programmatic dependent
  // launch on: anything but "0" (unset included).
  static bool DependentLaunchOn(const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr || absl::string_view(v) != "0";
  }
  // KVPAGE_DECODE_PDL=0 launches the decode's kernels, KVPAGE_WRITE_PDL=0
  // the cache write, in plain stream order (escape hatches, and the
  // comparisons in docs/PERF_NOTES.md); otherwise each is a programmatic
  // dependent launch where the device has one (sm_90+). Read once per
  // process.
  static bool DependentDecodeFromEnvironment() {
    static const bool on = DependentLaunchOn("KVPAGE_DECODE_PDL");
    return on;
  }
  static bool DependentWriteFromEnvironment() {
    static const bool on = DependentLaunchOn("KVPAGE_WRITE_PDL");
    return on;
  }
  // KVPAGE_DECODE_STAGED=0 keeps the staged tensor-core kernel out (the
  // register path runs instead; for comparisons, docs/PERF_NOTES.md).
  // Read once per process.
  static bool StagedDecodeFromEnvironment() {
    static const bool on = DependentLaunchOn("KVPAGE_DECODE_STAGED");
    return on;
  }

  // KVPAGE_DECODE_PARTITION=N (a multiple of 32) replaces the wave model's
  // partition size with N wherever N fits the kernel's shared memory (for
  // tuning measurements, docs/PERF_NOTES.md); 0 where unset or invalid.
  // Read once per process.
  static int32_t PartitionFromEnvironment() {
    static const int32_t size = [] {
      const char* v = std::getenv("KVPAGE_DECODE_PARTITION");
      int32_t n = 0;
      if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < kPartitionTokenMultiple ||
          n % kPartitionTokenMultiple != 0) {
        return 0;
      }
      return n;
    }();
    return size;
  }

  // KVPAGE_DECODE_PREFETCH=K,V (each 0..4; one number sets both) sets how
  // many steps ahead the tensor-core kernel's register path has L2 prefetch
  // its K and V blocks (0: off; for tuning measurements, docs/PERF_NOTES.md);
  // unset or invalid: {-1, -1}, the device's default (Shape). Read once per
  // process.
  static std::pair<int32_t, int32_t> PrefetchFromEnvironment() {
    static const std::pair<int32_t, int32_t> steps = [] {
      const std::pair<int32_t, int32_t> unset{-1, -1};
      const char* env = std::getenv("KVPAGE_DECODE_PREFETCH");
      if (env == nullptr) return unset;
      const std::vector<absl::string_view> parts = absl::StrSplit(env, ',');
      int32_t k_steps = 0, v_steps = 0;
      if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &k_steps) ||
          !absl::SimpleAtoi(parts.back(), &v_steps) || k_steps < 0 || k_steps > 4 || v_steps < 0 ||
          v_steps > 4) {
        return unset;
      }
      return std::pair<int32_t, int32_t>{k_steps, v_steps};
    }();
    return steps;
  }

  // Partition size: the largest of MaxPartitionSize..32 (512 for the
  // thread-group kernel, 2048 for the tensor-core one, 4096 with 8-bit codes,
  // 8192 with its ring; StagedMaxPartitionSize for the staged kernel) whose
  // shared memory fits the kernel's resident blocks on an SM, a half of it
  // or (PartitionStepTokens) a third of the context (up to
  // MaxThirdPartitionSize where that fits too), by the wave model of
  // src/decode_partition.h with this device's SMs and the kernel's wave
  // slots (DecodeWaveBlocksPerSm). Depends on capacities only.
  int32_t PartitionSize(const CacheGeometry& geo, const DecodeCapacity& cap, int32_t rows, bool tc,
                        bool staged) const {
    auto shared_bytes = [&](int32_t p) {
      return staged ? kernels::StagedDecodeSharedBytes(geo, p)
                    : kernels::DecodeSharedBytes(geo, rows, p, tc);
    };
    // The kernels' register budgets are cut for DecodeBlocksPerSm resident
    // blocks: the partition's shared memory should let that many share an
    // SM too, and must fit one block.
    const int blocks_per_sm =
        staged ? kernels::StagedDecodeBlocksPerSm() : kernels::DecodeBlocksPerSm(geo, rows, tc);
    const size_t sm_share = shared_per_sm_ / blocks_per_sm;
    const size_t resident_budget =
        std::min(max_shared_per_block_,
                 sm_share > reserved_shared_per_block_ ? sm_share - reserved_shared_per_block_ : 0);
    auto largest_fitting = [&](size_t budget) {
      int32_t p = staged ? kernels::StagedMaxPartitionSize() : kernels::MaxPartitionSize(geo, tc);
      while (p > 32 && shared_bytes(p) > budget) p /= 2;
      return p;
    };
    int32_t p = largest_fitting(resident_budget);
    if (shared_bytes(p) > resident_budget) {
      p = largest_fitting(max_shared_per_block_);  // fewer blocks per SM, then
    }
    const int64_t slots =
        int64_t{num_sms_} * (staged ? kernels::StagedDecodeBlocksPerSm()
                                    : kernels::DecodeWaveBlocksPerSm(geo, rows, tc));
    // A third of the context may be longer than the halves (16-bit caches),
    // where its shared memory fits the resident blocks too.
    int32_t largest_third =
        staged ? kernels::StagedMaxPartitionSize() : kernels::MaxThirdPartitionSize(geo, tc);
    if (largest_third > 0 && shared_bytes(largest_third) > resident_budget) largest_third = p;
    const int32_t step =
        staged ? kernels::StagedPartitionStepTokens() : kernels::PartitionStepTokens(geo, tc);
    const int32_t forced = PartitionFromEnvironment();
    return forced > 0 && (forced <= p || shared_bytes(forced) <= resident_budget)
               ? forced
               : PartitionSizeByWaves(p, int64_t{cap.max_num_seqs} * geo.num_kv_heads,
                                      cap.max_context_len, slots, step, largest_third);
  }

  // The decode's launch shape, from capacities only: the partition kernel
  // (DecodeUsesTensorCores, staged or not) and its PartitionSize.
  DecodeShape Shape(const CacheGeometry& geo, const DecodeCapacity& cap) const {
    DecodeShape s;
    s.max_num_seqs = cap.max_num_seqs;
    s.max_query_len = cap.max_query_len;
    const int32_t rows = cap.num_q_heads / geo.num_kv_heads * cap.max_query_len;
    s.path = PathFromEnvironment();
    s.dependent_launch = cc_major_ >= 9 && DependentDecodeFromEnvironment();
    // One step ahead each on sm_90+, the best measured on the H100 (two
    // thrashed L2); off before sm_90, where it was never measured.
    const auto [pf_k, pf_v] = PrefetchFromEnvironment();
    const int32_t pf_default = cc_major_ >= 9 ? 1 : 0;
    s.prefetch_k_steps = pf_k >= 0 ? pf_k : pf_default;
    s.prefetch_v_steps = pf_v >= 0 ? pf_v : pf_default;
    const bool tc = kernels::DecodeUsesTensorCores(geo, rows, s.path);
    // The staged kernel wherever it exists (sm_90+: BF16 and FP16 at head
    // size 128, block size 16, up to 8 rows a KV head): 2-7% faster than
    // the register path on every benchmark shape it serves, 32-512
    // sequences, GQA and ragged (H100, docs/PERF_NOTES.md, session 28).
    s.staged = tc && cc_major_ >= 9 && StagedDecodeFromEnvironment() &&
               kernels::StagedDecodeSupports(geo, rows);
    const int32_t p = PartitionSize(geo, cap, rows, tc, s.staged);
    s.direct_output = !s.staged && kernels::PartitionKernelWritesOutput(geo, tc);
    s.partition_size = p;
    s.max_partitions = (cap.max_context_len + p - 1) / p;
    return s;
  }

  // Workspace layout (src/params.h): partial_out, then partial_max, then
  // partial_sum, each 256-byte aligned.
  struct WorkspaceLayout {
    int64_t out_offset = 0, max_offset = 0, sum_offset = 0, bytes = 0;
  };
  static WorkspaceLayout Layout(const CacheGeometry& geo, const DecodeCapacity& cap,
                                const DecodeShape& s) {
    const int64_t rows =
        int64_t{s.max_num_seqs} * s.max_query_len * cap.num_q_heads * s.max_partitions;
    WorkspaceLayout l;
    l.max_offset = AlignUp(rows * geo.head_size * int64_t{sizeof(float)}, kRegionAlignment);
    l.sum_offset = l.max_offset + AlignUp(rows * int64_t{sizeof(float)}, kRegionAlignment);
    l.bytes = l.sum_offset + AlignUp(rows * int64_t{sizeof(float)}, kRegionAlignment);
    return l;
  }

  size_t DecodeWorkspaceBytes(const CacheGeometry& geo, const DecodeCapacity& cap) const override {
    return static_cast<size_t>(Layout(geo, cap, Shape(geo, cap)).bytes);
  }

  absl::Status Decode(const DecodeParams& p, const DecodeCapacity& cap, void* workspace,
                      void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    const DecodeShape shape = Shape(p.geo, cap);
    const WorkspaceLayout l = Layout(p.geo, cap, shape);
    auto* base = static_cast<uint8_t*>(workspace);
    DecodeWorkspace ws;
    ws.partial_out = reinterpret_cast<float*>(base + l.out_offset);
    ws.partial_max = reinterpret_cast<float*>(base + l.max_offset);
    ws.partial_sum = reinterpret_cast<float*>(base + l.sum_offset);
    return CudaError(static_cast<cudaError_t>(kernels::LaunchDecode(p, shape, ws, stream)),
                     "decode kernel launch");
  }

  absl::Status CopyBlocks(const CacheGeometry& geo, uint8_t* base, const int32_t* pairs,
                          int32_t num_pairs, bool pairs_on_host, DeviceErrorRecord* checked,
                          void* stream) override {
    KVP_CUDA_GUARD(ordinal_);
    return CudaError(static_cast<cudaError_t>(kernels::LaunchCopyBlocks(
                         geo, base, pairs, num_pairs, pairs_on_host, checked, stream)),
                     "block copy kernel launch");
  }

 private:
  const int32_t ordinal_;
  const int num_sms_;
  const int cc_major_;  // compute capability's major version
  const size_t max_shared_per_block_;
  const size_t shared_per_sm_;              // shared memory of one SM
  const size_t reserved_shared_per_block_;  // the system's share of it per resident block
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

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int32_t ordinal) {
#if KVPAGE_HAVE_CUDA
  const int32_t count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgument(kvpage::StrFormat(
        "config->device_ordinal = %d, but %d CUDA device(s) are present", ordinal, count));
  }
  int num_sms = 0, cc_major = 0, smem_optin = 0, smem_per_sm = 0, smem_reserved = 0;
  KVP_RETURN_IF_ERROR(
      CudaError(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, ordinal),
                "cudaDeviceGetAttribute(MultiProcessorCount)"));
  KVP_RETURN_IF_ERROR(
      CudaError(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, ordinal),
                "cudaDeviceGetAttribute(ComputeCapabilityMajor)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)"));
  KVP_RETURN_IF_ERROR(CudaError(
      cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, ordinal),
      "cudaDeviceGetAttribute(ReservedSharedMemoryPerBlock)"));
  return std::unique_ptr<Backend>(
      new CudaBackend(ordinal, num_sms, cc_major, static_cast<size_t>(smem_optin),
                      static_cast<size_t>(smem_per_sm), static_cast<size_t>(smem_reserved)));
#else
  return Unsupported(
      kvpage::StrFormat("device_kind = KVP_DEVICE_CUDA (ordinal %d), but this build has no CUDA "
                        "backend (configure with KVPAGE_CUDA=ON and a CUDA toolkit)",
                        ordinal));
#endif
}

}  // namespace kvpage
