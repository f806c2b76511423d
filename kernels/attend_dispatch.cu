// SPDX-License-Identifier: Apache-2.0
// The dispatch point of kvp_attend (docs/DESIGN.md, "Attention over query
// chunks"): the schedule kernel; with decode rows the decode (LaunchDecode
// of the plan's decode_rows_plan over the gathered rows) and the scatter of
// its results; the attention kernel of the cache's (K side, V side, head
// size) from the manifest's list (kernels/manifest.cmake,
// KVPAGE_MANIFEST_ATTEND), and the merge kernel, all shaped by the
// AttendPlan alone.
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
                                                  .bytes) ||
      (plan.decode_rows && (workspace.decode_lens == nullptr || workspace.decode_q == nullptr ||
                            workspace.decode_out == nullptr || workspace.decode_lse == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (params.num_seqs <= 0) return cudaSuccess;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned schedule_blocks =
      1 + (plan.decode_rows ? static_cast<unsigned>(params.num_seqs) : 0);
  int err = LaunchKernel(&attend::AttendScheduleKernel, dim3(schedule_blocks),
                         dim3(attend::kScheduleThreads), 0, s, false, params, plan, workspace);
  if (err != cudaSuccess) return err;
  if (plan.decode_rows) {
    // The decode rows as a decode batch of the same sequences, one query
    // token each; the others have context 0 there and cost a block exit.
    const int64_t row = int64_t{params.num_q_heads} * g.head_size;
    DecodeParams rows = params;
    rows.query_starts = nullptr;
    rows.query_len = 1;
    rows.q = workspace.decode_q;
    rows.q_stride = row;
    rows.seq_lens = workspace.decode_lens;
    rows.out = workspace.decode_out;
    rows.out_stride = row;
    rows.lse = params.lse != nullptr ? workspace.decode_lse : nullptr;
    err = LaunchDecode(rows, plan.decode_rows_plan, workspace.decode, s);
    if (err != cudaSuccess) return err;
  }
  err = launch(params, plan, workspace, s);
  if (err != cudaSuccess) return err;
  // The merge of split tiles and the decode rows' scatter, one launch.
  const int64_t finish_blocks =
      attend::AttendMergeBlocks(plan, g.num_kv_heads) + (plan.decode_rows ? params.num_seqs : 0);
  if (finish_blocks == 0) return cudaSuccess;
  return LaunchKernel(&attend::AttendFinishKernel, dim3(static_cast<unsigned>(finish_blocks)),
                      dim3(attend::kFinishThreads), 0, s, false, params, plan, workspace);
}

}  // namespace kernels
}  // namespace kvpage
