// SPDX-License-Identifier: Apache-2.0
// The decode plan: one host-only function that turns a cache geometry, a
// decoder's capacities, the device and tuning overrides into the kernel a
// decode runs and its launch shape (DecodePlan, src/params.h), in the
// manner of FlashAttention-3's tile_size.h and heuristics.h. Plain
// arithmetic over the kernels' traits table (kernels/decode_traits.h) and
// the kernel manifest (src/manifest.h): no CUDA, so it is pinned per device
// profile by a unit test on any machine (tests/unit/decode_plan_test.cc).
// docs/DESIGN.md, "Decode plan", gives the rules and their evidence.
#ifndef KVPAGE_SRC_DECODE_PLAN_H_
#define KVPAGE_SRC_DECODE_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {

// Decoder capacities: everything a launch shape may depend on.
struct DecodeCapacity {
  int32_t num_q_heads = 0;
  int32_t max_num_seqs = 0;
  int32_t max_context_len = 0;
  int32_t max_query_len = 1;
  // Query tokens of one kvp_attend call (kvp_decode_config.max_query_tokens,
  // resolved: never 0).
  int32_t max_query_tokens = 1;
  // kvp_decode_config.precise: FP32 from end to end (the plan runs the
  // CUDA-core kernel).
  bool precise = false;
};

// What the plan needs to know of a device.
struct DeviceProfile {
  int num_sms = 0;
  int cc_major = 0;                      // compute capability's major version
  size_t max_shared_per_block = 0;       // opt-in limit of one block
  size_t shared_per_sm = 0;              // shared memory of one SM
  size_t reserved_shared_per_block = 0;  // the system's share of it per resident block
  // The library's sm_90a machine code runs here (compute capability 9.0 and
  // a build for 90a): wgmma kernels exist.
  bool wgmma = false;

  // Profiles of the devices the plan is pinned for (tests; the CUDA backend
  // reads its own device's figures).
  static constexpr DeviceProfile H100() { return {132, 9, 232448, 233472, 1024, true}; }
  static constexpr DeviceProfile H200() { return {132, 9, 232448, 233472, 1024, true}; }
  static constexpr DeviceProfile A100() { return {108, 8, 166912, 167936, 1024, false}; }
};

// Tuning overrides of the CUDA backend's launches: comparisons, tuning
// measurements and escape hatches. A default-constructed value is the
// library's own choice everywhere; the environment fills one in one place
// (DecodeTuningFromEnvironment), and tests construct them directly.
struct DecodeTuning {
  DecodePath path = DecodePath::kAuto;  // KVPAGE_DECODE_KERNEL
  bool staged = true;                   // KVPAGE_DECODE_STAGED=0: no staged kernel
  bool dependent_decode = true;         // KVPAGE_DECODE_PDL=0: plain stream order
  bool dependent_write = true;          // KVPAGE_WRITE_PDL=0: the cache write likewise
  // KVPAGE_DECODE_PARTITION: this partition size (a positive multiple of
  // kPartitionTokenMultiple) wherever it fits the kernel's shared memory;
  // 0: the wave model's.
  int32_t partition_size = 0;
  // KVPAGE_DECODE_PREFETCH=K,V: L2 prefetch distances of the tensor-core
  // register path, 0..4 steps each; -1: the device's default.
  int32_t prefetch_k_steps = -1;
  int32_t prefetch_v_steps = -1;
  // KVPAGE_ATTEND_SPLIT=0: kvp_attend never splits a tile's context.
  bool attend_split = true;
  // KVPAGE_ATTEND_WGMMA=0: kvp_attend runs the mma.sync mainloop on Hopper
  // too.
  bool attend_wgmma = true;
  // KVPAGE_ATTEND_ITEMS_PER_SM=N (1..64): the split-KV schedule aims at N
  // work items per SM; 0: the plan's.
  int32_t attend_items_per_sm = 0;
  // KVPAGE_ATTEND_DECODE_ROWS=0: kvp_attend serves sequences with one query
  // token with query tiles too, not with the decode kernel.
  bool attend_decode_rows = true;
};

// The tuning the KVPAGE_* environment variables ask for (README.md's table);
// unset, or a value it cannot read, leaves that field at its default.
DecodeTuning DecodeTuningFromEnvironment();

// The partition kernel a decode with `rows` query rows per KV head at
// capacity (num_q_heads / num_kv_heads * max_query_len), in precise mode or
// not, runs on `device`.
DecodeKernel ChooseDecodeKernel(const CacheGeometry& geo, int32_t rows, bool precise,
                                const DeviceProfile& device, const DecodeTuning& tuning);

// The whole plan: ChooseDecodeKernel's kernel, its partition size by the
// wave model (src/decode_partition.h) within its shared memory, grid,
// direct output, dependent launches and prefetch distances. Depends on
// capacities, device and tuning only.
DecodePlan PlanDecode(const CacheGeometry& geo, const DecodeCapacity& cap,
                      const DeviceProfile& device, const DecodeTuning& tuning);

// The split-K workspace of a plan (src/params.h DecodeWorkspace): offsets
// of partial_out, partial_max and partial_sum, each 256-byte aligned, and
// the bytes in all.
struct DecodeWorkspaceLayout {
  int64_t out_offset = 0, max_offset = 0, sum_offset = 0, bytes = 0;
};
DecodeWorkspaceLayout PlanWorkspace(const CacheGeometry& geo, const DecodeCapacity& cap,
                                    const DecodePlan& plan);

// kvp_attend's plan: the attention kernel's tile (kernels/attend_traits.h),
// its shared memory, the work-item bound of a batch within the capacities,
// the split-KV target and the decode rows' plan, from capacities and device
// only.
AttendPlan PlanAttend(const CacheGeometry& geo, const DecodeCapacity& cap,
                      const DeviceProfile& device, const DecodeTuning& tuning);

// kvp_attend's workspace (src/params.h AttendWorkspace): offsets of its
// arrays, each 256-byte aligned, from the start of its part of the
// decoder's workspace, and the bytes in all. The decode rows' split-K
// scratch is not among them: it is the decode's own (the decoder's
// workspace starts with room for either plan's, DecodeScratchBytes).
struct AttendWorkspaceLayout {
  int64_t counts_offset = 0, items_offset = 0, merges_offset = 0, out_offset = 0, lse_offset = 0,
          decode_lens_offset = 0, decode_q_offset = 0, decode_out_offset = 0, decode_lse_offset = 0,
          bytes = 0;
};
AttendWorkspaceLayout PlanAttendWorkspace(const CacheGeometry& geo, const DecodeCapacity& cap,
                                          const AttendPlan& plan);

// The split-K scratch at the start of a decoder's workspace: enough for
// kvp_decode's plan and for kvp_attend's decode rows.
int64_t DecodeScratchBytes(const CacheGeometry& geo, const DecodeCapacity& cap,
                           const DecodePlan& decode, const AttendPlan& attend);

// "thread_group", "tensor_core_registers", "tensor_core_ring",
// "tensor_core_staged" (messages, tests, the benchmark).
const char* DecodeKernelName(DecodeKernel kernel);

}  // namespace kvpage

#endif  // KVPAGE_SRC_DECODE_PLAN_H_
