// The one dispatch point of the decode kernels: picks the partition kernel
// (thread-group or tensor-core, DecodeUsesTensorCores), turns the run-time K
// dtype and head size into its template arguments (the instantiated sets:
// 5 K dtypes, each in its own translation units decode_<dtype>.cu and
// decode_tc_<dtype>.cu, x the head sizes of KVPAGE_DECODE_FOR_EACH_HEAD_SIZE
// and KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE), launches it and then the reduce
// kernel. For the thread-group kernel V dtype, block size, GQA group and
// query_len are run-time values; the tensor-core kernel takes V = K dtype
// and picks its column tiles from the rows per KV head.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/launch.h"
#include "kernels/paged_decode.cuh"
#include "kernels/tc_decode.cuh"
#include "kernels/tc_staged_decode.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

// Compiled elsewhere (decode_<dtype>.cu); never instantiated here.
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kBF16)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kFP16)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kFP8E4M3)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kINT8)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kINT4)
KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_DECLARE_EXTERN, DType::kBF16)
KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_DECLARE_EXTERN, DType::kFP16)
KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_DECLARE_EXTERN, DType::kFP8E4M3)
KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_DECLARE_EXTERN, DType::kINT8)
KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_DECLARE_EXTERN, DType::kINT4)
KVPAGE_TC_STAGED_DECODE_DECLARE_EXTERN(DType::kBF16)
KVPAGE_TC_STAGED_DECODE_DECLARE_EXTERN(DType::kFP16)

namespace {

using LaunchFn = int (*)(const DecodeParams&, const DecodeShape&, const DecodeWorkspace&, size_t,
                         cudaStream_t);

template <DType KT, bool kTensorCores>
LaunchFn SelectHeadSize(int head_size) {
  if constexpr (kTensorCores) {
    switch (head_size) {
#define KVPAGE_DECODE_CASE(KT_, D)                                   \
  case D:                                                            \
    return TcSupports(KT_, D) ? &LaunchTcPartitionKernel<KT_, D> : nullptr;
      KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_CASE, KT)
#undef KVPAGE_DECODE_CASE
      default:
        return nullptr;
    }
  } else {
    switch (head_size) {
#define KVPAGE_DECODE_CASE(KT_, D) \
  case D:                          \
    return &LaunchPartitionKernel<KT_, D>;
      KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_CASE, KT)
#undef KVPAGE_DECODE_CASE
      default:
        return nullptr;
    }
  }
}

template <bool kTensorCores>
LaunchFn SelectPartitionLauncher(DType k_dtype, int head_size) {
  switch (k_dtype) {
    case DType::kBF16:
      return SelectHeadSize<DType::kBF16, kTensorCores>(head_size);
    case DType::kFP16:
      return SelectHeadSize<DType::kFP16, kTensorCores>(head_size);
    case DType::kFP8E4M3:
      return SelectHeadSize<DType::kFP8E4M3, kTensorCores>(head_size);
    case DType::kINT8:
      return SelectHeadSize<DType::kINT8, kTensorCores>(head_size);
    case DType::kINT4:
      return SelectHeadSize<DType::kINT4, kTensorCores>(head_size);
    default:
      return nullptr;
  }
}

// The staged kernel's launcher (StagedSupports says where it exists).
using StagedLaunchFn = int (*)(const DecodeParams&, const DecodeShape&, const DecodeWorkspace&,
                               cudaStream_t);
StagedLaunchFn SelectStagedLauncher(DType k_dtype) {
  return k_dtype == DType::kBF16   ? &LaunchTcStagedKernel<DType::kBF16, 128>
         : k_dtype == DType::kFP16 ? &LaunchTcStagedKernel<DType::kFP16, 128>
                                   : nullptr;
}

}  // namespace
}  // namespace decode

bool StagedDecodeSupports(const CacheGeometry& geo, int32_t rows) {
  return decode::StagedSupports(geo, rows) && decode::SelectStagedLauncher(geo.k_dtype) != nullptr;
}

size_t StagedDecodeSharedBytes(const CacheGeometry& geo, int32_t partition_size) {
  return static_cast<size_t>(decode::StagedSharedBytes(geo.head_size, partition_size));
}

int StagedDecodeBlocksPerSm() { return decode::kStagedBlocksPerSm; }

// 4096-token partitions (two of 8192: one wave of 256 blocks at 128
// sequences on 132 SMs) measured fastest at 128-512 sequences in the
// prototype (docs/PERF_NOTES.md, session 27).
int32_t StagedMaxPartitionSize() { return 4096; }

int32_t StagedPartitionStepTokens() { return decode::kStagedStageTokens; }

bool TensorCoreDecodeSupports(const CacheGeometry& geo) {
  return geo.k_dtype == geo.v_dtype &&
         decode::SelectPartitionLauncher<true>(geo.k_dtype, geo.head_size) != nullptr;
}

// DecodePath::kAuto's choice, from the measurements in docs/PERF_NOTES.md
// ("Tensor-core path, second version", H200): the tensor-core kernel for
// every quantized cache, even at one row per KV head (MHA FP8 570 vs 832 us,
// INT4 423 vs 680), and for 16-bit caches from kTensorCoreMinRows16 rows
// (group 2 BF16: 278 vs 346 us); MHA BF16 keeps the thread-group kernel
// (991 vs 1035 us).
constexpr int kTensorCoreMinRows16 = 2;

bool DecodeUsesTensorCores(const CacheGeometry& geo, int32_t rows, DecodePath path) {
  if (path == DecodePath::kThreadGroup || !TensorCoreDecodeSupports(geo)) return false;
  if (path == DecodePath::kTensorCore) return true;
  return IsQuantized(geo.k_dtype) || rows >= kTensorCoreMinRows16;
}

namespace {
// Whether the partition kernel is the tensor-core one with a ring.
bool UsesRing(const CacheGeometry& geo, bool tensor_cores) {
  return tensor_cores && decode::TcRingStages(geo.k_dtype, geo.head_size) > 0;
}

// Whether the host also weighs a third of the context as the partition
// size: for the tensor-core kernel with codes in registers (8- and 16-bit),
// where thirds measured 1-5% faster for 8-bit codes from 128 KV-head rows
// on (H100, docs/PERF_NOTES.md, session 17) and, once the kernel carried
// its next step in a register, from 1.2% faster to 0.1% slower for BF16
// where the host now picks them (128-512 KV-head rows; session 26;
// session 17's kernel had measured -0.8% to +2.8%).
bool WeighsThirds(const CacheGeometry& geo, bool tensor_cores) {
  return tensor_cores && !UsesRing(geo, tensor_cores);
}
}  // namespace

int32_t MaxPartitionSize(const CacheGeometry& geo, bool tensor_cores) {
  if (!tensor_cores) return 512;
  if (UsesRing(geo, tensor_cores)) return 8192;
  return DTypeBits(geo.k_dtype) == 8 ? 4096 : 2048;
}

int32_t MaxThirdPartitionSize(const CacheGeometry& geo, bool tensor_cores) {
  return WeighsThirds(geo, tensor_cores) ? 4096 : 0;
}

int32_t PartitionStepTokens(const CacheGeometry& geo, bool tensor_cores) {
  return WeighsThirds(geo, tensor_cores)
             ? std::max(decode::TcStepTokens(geo.k_dtype), kPartitionTokenMultiple)
             : 0;
}

bool PartitionKernelWritesOutput(const CacheGeometry& geo, bool tensor_cores) {
  return !tensor_cores || UsesRing(geo, tensor_cores);
}

int DecodeBlocksPerSm(const CacheGeometry& geo, int32_t rows, bool tensor_cores) {
  if (tensor_cores) {
    return decode::TcMinBlocksPerSm(geo.k_dtype, geo.head_size, decode::TcColumnTiles(rows));
  }
  return rows <= 1 ? decode::kMinBlocksPerSmOneRow : decode::kMinBlocksPerSm;
}

int DecodeWaveBlocksPerSm(const CacheGeometry& geo, int32_t rows, bool tensor_cores) {
  if (UsesRing(geo, tensor_cores)) return 1;
  return DecodeBlocksPerSm(geo, rows, tensor_cores);
}

size_t DecodeSharedBytes(const CacheGeometry& geo, int32_t rows, int32_t partition_size,
                         bool tensor_cores) {
  if (rows < 1) rows = 1;
  const auto words =
      tensor_cores ? decode::MakeTcSmemLayout(geo, partition_size,
                                              8 * decode::TcColumnTiles(rows)).total
                   : decode::MakeSmemLayout(geo, rows, partition_size).total;
  return sizeof(float) * static_cast<size_t>(words);
}

// The reduce kernel with kRows query heads a block, one warp each.
template <int kRows>
int LaunchReduce(const DecodeParams& params, const DecodeShape& shape,
                 const DecodeWorkspace& workspace, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((params.num_q_heads + kRows - 1) / kRows),
                  static_cast<unsigned>(params.query_len), static_cast<unsigned>(params.num_seqs));
  // As a programmatic dependent of the partition kernel (DecodeShape::
  // dependent_launch). Never without one: the reduce reads the lengths
  // before its wait, safe only behind a kernel that passed its own wait.
  return LaunchKernel(&decode::ReduceKernel<kRows>, grid, dim3(32 * kRows), 0, s,
                      shape.dependent_launch && shape.max_partitions > 0, params, shape, workspace);
}

int LaunchDecode(const DecodeParams& params, const DecodeShape& shape,
                 const DecodeWorkspace& workspace, void* stream) {
  const CacheGeometry& g = params.geo;
  if (g.num_kv_heads <= 0) return cudaErrorInvalidValue;
  const int32_t group = params.num_q_heads / g.num_kv_heads;
  const bool tc = DecodeUsesTensorCores(g, group * shape.max_query_len, shape.path);
  const decode::LaunchFn launch =
      tc ? decode::SelectPartitionLauncher<true>(g.k_dtype, g.head_size)
         : decode::SelectPartitionLauncher<false>(g.k_dtype, g.head_size);
  // direct_output promises what only some kernels do (the reduce skips
  // rows, or is not launched, on its word).
  const bool staged_ok = !shape.staged || (tc && !shape.direct_output &&
                                            StagedDecodeSupports(g, group * shape.max_query_len));
  if (launch == nullptr || params.num_q_heads % g.num_kv_heads != 0 || !staged_ok ||
      (shape.direct_output && !PartitionKernelWritesOutput(g, tc)) || params.query_len < 1 ||
      params.query_len > shape.max_query_len || shape.partition_size <= 0 ||
      shape.partition_size % kPartitionTokenMultiple != 0) {
    return cudaErrorInvalidValue;
  }
  if (params.num_seqs <= 0) return cudaSuccess;  // an empty batch: nothing to launch
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (shape.max_partitions > 0) {
    const int32_t rows = group * params.query_len;
    const int err =
        shape.staged
            ? decode::SelectStagedLauncher(g.k_dtype)(params, shape, workspace, s)
            : launch(params, shape, workspace, DecodeSharedBytes(g, rows, shape.partition_size, tc),
                     s);
    if (err != cudaSuccess || decode::PartitionKernelOwnsOutput(shape)) return err;
  }
  const int64_t rows = int64_t{params.num_seqs} * params.query_len * params.num_q_heads;
  return rows >= kReduceManyRows ? LaunchReduce<kReduceRowsMany>(params, shape, workspace, s)
                                 : LaunchReduce<1>(params, shape, workspace, s);
}

namespace {
// Static variables of an odd size ahead of the dynamic region, as every
// decode kernel has (block ids' fault flag, barriers, q rows).
__global__ void DecodeSmemAlignmentProbe(uint32_t* bytes) {
  __shared__ uint32_t own[5];
  if (threadIdx.x < 5) own[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    // (+ own[4] - 4: keeps `own`, and so its place ahead of the region.)
    bytes[0] = SharedAddress(decode::SharedWords()) % decode::kDecodeSmemAlign + own[4] - 4u;
  }
}
}  // namespace

int ProbeDecodeSmemMisalignment(uint32_t* bytes) {
  uint32_t* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(uint32_t));
  if (err != cudaSuccess) return err;
  DecodeSmemAlignmentProbe<<<1, 32, 256>>>(d);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(bytes, d, sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

}  // namespace kernels
}  // namespace kvpage
