// The one dispatch point of the decode kernels: turns the run-time K dtype
// and head size into template arguments of the partition kernel (the
// instantiated set: 5 K dtypes, each in its own translation unit
// decode_<dtype>.cu, x the head sizes of KVPAGE_DECODE_FOR_EACH_HEAD_SIZE),
// launches it and then the reduce kernel. V dtype, block size, GQA group and
// query_len are run-time values inside the kernel.
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "kernels/paged_decode.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

// Compiled elsewhere (decode_<dtype>.cu); never instantiated here.
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kBF16)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kFP16)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kFP8E4M3)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kINT8)
KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_DECLARE_EXTERN, DType::kINT4)

namespace {

using LaunchFn = int (*)(const DecodeParams&, const DecodeShape&, const DecodeWorkspace&, size_t,
                         cudaStream_t);

template <DType KT>
LaunchFn SelectHeadSize(int head_size) {
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

LaunchFn SelectPartitionLauncher(DType k_dtype, int head_size) {
  switch (k_dtype) {
    case DType::kBF16:
      return SelectHeadSize<DType::kBF16>(head_size);
    case DType::kFP16:
      return SelectHeadSize<DType::kFP16>(head_size);
    case DType::kFP8E4M3:
      return SelectHeadSize<DType::kFP8E4M3>(head_size);
    case DType::kINT8:
      return SelectHeadSize<DType::kINT8>(head_size);
    case DType::kINT4:
      return SelectHeadSize<DType::kINT4>(head_size);
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace decode

size_t DecodeSharedBytes(const CacheGeometry& geo, int32_t rows, int32_t partition_size) {
  if (rows < 1) rows = 1;
  return sizeof(float) *
         static_cast<size_t>(decode::MakeSmemLayout(geo, rows, partition_size).total);
}

int LaunchDecode(const DecodeParams& params, const DecodeShape& shape,
                 const DecodeWorkspace& workspace, void* stream) {
  const CacheGeometry& g = params.geo;
  const decode::LaunchFn launch = decode::SelectPartitionLauncher(g.k_dtype, g.head_size);
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
