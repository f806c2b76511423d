// The one dispatch point of the decode kernels: picks the partition kernel
// (thread-group or tensor-core, ChooseTensorCores), turns the run-time K
// dtype and head size into its template arguments (the instantiated sets:
// 5 K dtypes, each in its own translation units decode_<dtype>.cu and
// decode_tc_<dtype>.cu, x the head sizes of KVPAGE_DECODE_FOR_EACH_HEAD_SIZE
// and KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE), launches it and then the reduce
// kernel. For the thread-group kernel V dtype, block size, GQA group and
// query_len are run-time values; the tensor-core kernel takes V = K dtype
// and picks its column tiles from the rows per KV head.
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "kernels/paged_decode.cuh"
#include "kernels/tc_decode.cuh"

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

// DecodePath::kAuto's choice, from the measurements in docs/PERF_NOTES.md
// ("Tensor-core path"): the tensor-core kernel for 8-bit caches (FP8,
// INT8) from 8 rows per KV head, where it measured 15-17% faster than the
// thread-group kernel; the thread-group kernel for BF16 and INT4 (8-25%
// faster there) and for fewer rows (a group of 4 leaves half of each mma
// idle and measured 1.3x slower).
constexpr int kTensorCoreMinRows = 8;

bool ChooseTensorCores(const DecodeParams& p, const DecodeShape& shape) {
  if (shape.path == DecodePath::kThreadGroup || !TensorCoreDecodeSupports(p.geo)) return false;
  if (shape.path == DecodePath::kTensorCore) return true;
  const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
  const DType t = p.geo.k_dtype;
  return (t == DType::kFP8E4M3 || t == DType::kINT8) && rows >= kTensorCoreMinRows;
}

}  // namespace
}  // namespace decode

bool TensorCoreDecodeSupports(const CacheGeometry& geo) {
  return geo.k_dtype == geo.v_dtype &&
         decode::SelectPartitionLauncher<true>(geo.k_dtype, geo.head_size) != nullptr;
}

size_t DecodeSharedBytes(const CacheGeometry& geo, int32_t rows, int32_t partition_size) {
  if (rows < 1) rows = 1;
  size_t words = static_cast<size_t>(decode::MakeSmemLayout(geo, rows, partition_size).total);
  if (TensorCoreDecodeSupports(geo)) {
    const int pass_rows = 8 * decode::TcColumnTiles(rows);
    const size_t tc = static_cast<size_t>(
        decode::MakeTcSmemLayout(geo, partition_size, pass_rows).total);
    if (tc > words) words = tc;
  }
  return sizeof(float) * words;
}

int LaunchDecode(const DecodeParams& params, const DecodeShape& shape,
                 const DecodeWorkspace& workspace, void* stream) {
  const CacheGeometry& g = params.geo;
  const decode::LaunchFn launch =
      decode::ChooseTensorCores(params, shape)
          ? decode::SelectPartitionLauncher<true>(g.k_dtype, g.head_size)
          : decode::SelectPartitionLauncher<false>(g.k_dtype, g.head_size);
  if (launch == nullptr || g.num_kv_heads <= 0 || params.num_q_heads % g.num_kv_heads != 0 ||
      params.query_len < 1 || params.query_len > shape.max_query_len ||
      shape.partition_size <= 0 || shape.partition_size % 32 != 0) {
    return cudaErrorInvalidValue;
  }
  if (params.num_seqs <= 0) return cudaSuccess;  // an empty batch: nothing to launch
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (shape.max_partitions > 0) {
    const int32_t rows = params.num_q_heads / g.num_kv_heads * params.query_len;
    const int err =
        launch(params, shape, workspace, DecodeSharedBytes(g, rows, shape.partition_size), s);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(params.num_q_heads),
                  static_cast<unsigned>(params.query_len), static_cast<unsigned>(params.num_seqs));
  decode::ReduceKernel<decode::kReduceThreads>
      <<<grid, decode::kReduceThreads, 0, s>>>(params, shape, workspace);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvpage
