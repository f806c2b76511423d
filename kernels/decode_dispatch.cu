// SPDX-License-Identifier: Apache-2.0
// The one dispatch point of the decode kernels: LaunchDecode switches once
// on the plan's kernel (src/decode_plan.h), turns the run-time K dtype and
// head size into the template arguments of an instantiation the manifest
// holds (kernels/manifest.cmake; the extern declarations and cases below
// are generated from its X-macros), launches it and then the reduce kernel.
// The thread-group kernel takes V dtype, block size, GQA group and
// query_len as run-time values; the tensor-core kernels take V = K dtype and
// pick their column tiles from the call's rows per KV head.
#include <cuda_runtime.h>

#include "kernels/decode_reduce.cuh"
#include "kernels/launch.h"
#include "kernels/paged_decode.cuh"
#include "kernels/tc_decode.cuh"
#include "kernels/tc_staged_decode.cuh"
#include "src/manifest.h"

namespace kvpage {
namespace kernels {
namespace decode {

// Compiled in the generated instantiation units; never instantiated here.
#define KVPAGE_EXTERN_THREAD_GROUP(T, D) KVPAGE_DECODE_DECLARE_EXTERN(DType::T, D)
#define KVPAGE_EXTERN_TENSOR_CORE(T, D) KVPAGE_TC_DECODE_DECLARE_EXTERN(DType::T, D)
#define KVPAGE_EXTERN_STAGED(T, D) KVPAGE_TC_STAGED_DECODE_DECLARE_EXTERN(DType::T, D)
KVPAGE_MANIFEST_DECODE_THREAD_GROUP(KVPAGE_EXTERN_THREAD_GROUP)
KVPAGE_MANIFEST_DECODE_TENSOR_CORE(KVPAGE_EXTERN_TENSOR_CORE)
KVPAGE_MANIFEST_DECODE_STAGED(KVPAGE_EXTERN_STAGED)
#undef KVPAGE_EXTERN_THREAD_GROUP
#undef KVPAGE_EXTERN_TENSOR_CORE
#undef KVPAGE_EXTERN_STAGED

namespace {

// A partition kernel's launcher: the kernel for one (K dtype, head size),
// launched with the shared memory it lays out for the call's rows.
using LaunchFn = int (*)(const DecodeParams&, const DecodePlan&, const DecodeWorkspace&,
                         cudaStream_t);

template <DType T, int D>
int LaunchThreadGroup(const DecodeParams& p, const DecodePlan& plan, const DecodeWorkspace& ws,
                      cudaStream_t s) {
  const int rows = p.num_q_heads / p.geo.num_kv_heads * p.query_len;
  return LaunchPartitionKernel<T, D>(
      p, plan, ws,
      static_cast<size_t>(
          KernelSharedBytes(DecodeKernel::kThreadGroup, p.geo, rows, plan.partition_size)),
      s);
}
template <DType T, int D>
int LaunchTensorCore(const DecodeParams& p, const DecodePlan& plan, const DecodeWorkspace& ws,
                     cudaStream_t s) {
  return LaunchTcPartitionKernel<T, D>(p, plan, ws, 0, s);
}

// The launcher of `kernel` for (K dtype, head size), or null where the
// manifest holds none.
LaunchFn SelectLauncher(DecodeKernel kernel, DType k, int d) {
#define KVPAGE_CASE(T, D, FN) \
  if (k == DType::T && d == D) return &FN<DType::T, D>;
#define KVPAGE_CASE_THREAD_GROUP(T, D) KVPAGE_CASE(T, D, LaunchThreadGroup)
#define KVPAGE_CASE_TENSOR_CORE(T, D) KVPAGE_CASE(T, D, LaunchTensorCore)
#define KVPAGE_CASE_STAGED(T, D) KVPAGE_CASE(T, D, LaunchTcStagedKernel)
  switch (kernel) {
    case DecodeKernel::kThreadGroup:
      KVPAGE_MANIFEST_DECODE_THREAD_GROUP(KVPAGE_CASE_THREAD_GROUP)
      break;
    case DecodeKernel::kTensorCoreRegisters:
    case DecodeKernel::kTensorCoreRing:
      KVPAGE_MANIFEST_DECODE_TENSOR_CORE(KVPAGE_CASE_TENSOR_CORE)
      break;
    case DecodeKernel::kTensorCoreStaged:
      KVPAGE_MANIFEST_DECODE_STAGED(KVPAGE_CASE_STAGED)
      break;
  }
#undef KVPAGE_CASE
#undef KVPAGE_CASE_THREAD_GROUP
#undef KVPAGE_CASE_TENSOR_CORE
#undef KVPAGE_CASE_STAGED
  return nullptr;
}

// The reduce kernel with kRows query heads a block, one warp each.
template <int kRows>
int LaunchReduce(const DecodeParams& params, const DecodePlan& plan,
                 const DecodeWorkspace& workspace, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((params.num_q_heads + kRows - 1) / kRows),
                  static_cast<unsigned>(params.query_len), static_cast<unsigned>(params.num_seqs));
  // As a programmatic dependent of the partition kernel (DecodePlan::
  // dependent_launch). Never without one: the reduce reads the lengths
  // before its wait, safe only behind a kernel that passed its own wait.
  return LaunchKernel(&ReduceKernel<kRows>, grid, dim3(32 * kRows), 0, s,
                      plan.dependent_launch && plan.max_partitions > 0, params, plan, workspace);
}

}  // namespace
}  // namespace decode

int LaunchDecode(const DecodeParams& params, const DecodePlan& plan,
                 const DecodeWorkspace& workspace, void* stream) {
  const CacheGeometry& g = params.geo;
  if (g.num_kv_heads <= 0 || params.num_q_heads % g.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const int32_t group = params.num_q_heads / g.num_kv_heads;
  // A plan this build cannot run, or whose direct_output promises what the
  // kernel does not do (the reduce skips rows, or is not launched, on its
  // word), is refused.
  const decode::LaunchFn launch = decode::SelectLauncher(plan.kernel, g.k_dtype, g.head_size);
  if (launch == nullptr || !KernelBuilt(plan.kernel, g, group * plan.max_query_len) ||
      (plan.direct_output && !KernelTraits(plan.kernel, g, group).writes_output) ||
      params.query_len < 1 || params.query_len > plan.max_query_len || plan.partition_size <= 0 ||
      plan.partition_size % kPartitionTokenMultiple != 0) {
    return cudaErrorInvalidValue;
  }
  if (params.num_seqs <= 0) return cudaSuccess;  // an empty batch: nothing to launch
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (plan.max_partitions > 0) {
    const int err = launch(params, plan, workspace, s);
    if (err != cudaSuccess || decode::PartitionKernelOwnsOutput(plan)) return err;
  }
  const int64_t rows = int64_t{params.num_seqs} * params.query_len * params.num_q_heads;
  return rows >= kReduceManyRows ? decode::LaunchReduce<kReduceRowsMany>(params, plan, workspace, s)
                                 : decode::LaunchReduce<1>(params, plan, workspace, s);
}

}  // namespace kernels
}  // namespace kvpage
