// SPDX-License-Identifier: Apache-2.0
// The dispatch point of kvp_attend (docs/DESIGN.md, "Attention over query
// chunks"): the schedule kernel, the attention kernel of the cache's
// (K side, V side, head size) from the manifest's list
// (kernels/manifest.cmake, KVPAGE_MANIFEST_ATTEND), and the merge kernel,
// all shaped by the AttendPlan alone.
#include <cuda_runtime.h>

#include "kernels/attend_schedule.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/launch.h"
#include "kernels/varlen_attention.cuh"
#include "src/manifest.h"

namespace kvpage {
namespace kernels {
namespace attend {

// Compiled in the generated instantiation units.
#define KVPAGE_EXTERN_ATTEND(K, V, D) KVPAGE_ATTEND_DECLARE_EXTERN(K, V, D)
KVPAGE_MANIFEST_ATTEND(KVPAGE_EXTERN_ATTEND)
#undef KVPAGE_EXTERN_ATTEND

namespace {

using LaunchFn = int (*)(const DecodeParams&, const AttendPlan&, const AttendWorkspace&,
                         cudaStream_t);

LaunchFn SelectLauncher(OperandKind k, OperandKind v, int d) {
#define KVPAGE_CASE(K, V, D)                                \
  if (k == OperandKind::K && v == OperandKind::V && d == D) \
    return &LaunchVarlenAttention<D, OperandKind::K, OperandKind::V>;
  KVPAGE_MANIFEST_ATTEND(KVPAGE_CASE)
#undef KVPAGE_CASE
  return nullptr;
}

}  // namespace
}  // namespace attend

int LaunchAttend(const DecodeParams& params, const AttendPlan& plan,
                 const AttendWorkspace& workspace, void* stream) {
  const CacheGeometry& g = params.geo;
  const attend::LaunchFn launch =
      attend::SelectLauncher(OperandKindOf(g.k_dtype), OperandKindOf(g.v_dtype), g.head_size);
  const AttendMainloop loop = static_cast<AttendMainloop>(plan.mainloop);
  const bool known_loop =
      loop == AttendMainloop::kWarpMma ||
      (loop == AttendMainloop::kWarpgroupMma &&
       AttendWarpgroupServes(g.head_size, OperandKindOf(g.k_dtype), OperandKindOf(g.v_dtype)));
  const AttendTile tile = AttendTileFor(g.head_size, loop);
  if (launch == nullptr || !known_loop || params.query_starts == nullptr || g.num_kv_heads <= 0 ||
      params.num_q_heads % g.num_kv_heads != 0 || plan.tile_rows != tile.rows ||
      plan.tile_tokens != tile.tokens || plan.threads != tile.threads + tile.producers ||
      plan.tile_tokens % g.block_size != 0 || plan.max_items <= 0 ||
      plan.shared_bytes < static_cast<size_t>(AttendLayout(g.head_size, OperandKindOf(g.k_dtype),
                                                           OperandKindOf(g.v_dtype), loop)
                                                  .bytes)) {
    return cudaErrorInvalidValue;
  }
  if (params.num_seqs <= 0) return cudaSuccess;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int err = LaunchKernel(&attend::AttendScheduleKernel, dim3(1), dim3(attend::kScheduleThreads), 0,
                         s, false, params, plan, workspace);
  if (err != cudaSuccess) return err;
  err = launch(params, plan, workspace, s);
  if (err != cudaSuccess || plan.split_items == 0) return err;
  const dim3 merge_grid(
      static_cast<unsigned>(plan.split_items), static_cast<unsigned>(g.num_kv_heads),
      static_cast<unsigned>((plan.tile_rows + attend::kMergeRows - 1) / attend::kMergeRows));
  return LaunchKernel(&attend::AttendMergeKernel, merge_grid, dim3(attend::kMergeThreads), 0, s,
                      false, params, plan, workspace);
}

}  // namespace kernels
}  // namespace kvpage
