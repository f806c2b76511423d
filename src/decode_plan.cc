// SPDX-License-Identifier: Apache-2.0
// The decode plan (src/decode_plan.h): which kernel, how long a partition,
// which launch options. Every rule here is a decision with its evidence in
// docs/DESIGN.md, "Decode plan"; tests/unit/decode_plan_test.cc pins the
// outcome per device profile.
#include "src/decode_plan.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/attend_traits.h"
#include "kernels/decode_traits.h"
#include "src/decode_partition.h"

namespace kvpage {

namespace {

// Whether environment variable `name` leaves an option on: anything but
// "0" (unset included).
bool OnUnlessZero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || absl::string_view(v) != "0";
}

// 16-bit caches run the tensor-core kernels from this many rows per KV
// head (a GQA group of 2: 278 against 346 us on the H200); MHA BF16 keeps
// the thread-group kernel (991 against 1035 us).
constexpr int32_t kTensorCoreMinRows16 = 2;

}  // namespace

DecodeTuning DecodeTuningFromEnvironment() {
  DecodeTuning t;
  if (const char* v = std::getenv("KVPAGE_DECODE_KERNEL")) {
    const absl::string_view s(v);
    if (s == "thread_group") t.path = DecodePath::kThreadGroup;
    if (s == "tensor_core") t.path = DecodePath::kTensorCore;
  }
  t.staged = OnUnlessZero("KVPAGE_DECODE_STAGED");
  t.dependent_decode = OnUnlessZero("KVPAGE_DECODE_PDL");
  t.dependent_write = OnUnlessZero("KVPAGE_WRITE_PDL");
  t.attend_split = OnUnlessZero("KVPAGE_ATTEND_SPLIT");
  t.attend_wgmma = OnUnlessZero("KVPAGE_ATTEND_WGMMA");
  t.attend_decode_rows = OnUnlessZero("KVPAGE_ATTEND_DECODE_ROWS");
  if (const char* v = std::getenv("KVPAGE_DECODE_PARTITION")) {
    int32_t n = 0;
    if (absl::SimpleAtoi(v, &n) && n >= kPartitionTokenMultiple &&
        n % kPartitionTokenMultiple == 0) {
      t.partition_size = n;
    }
  }
  if (const char* v = std::getenv("KVPAGE_ATTEND_ITEMS_PER_SM")) {
    int32_t n = 0;
    if (absl::SimpleAtoi(v, &n) && n >= 1 && n <= 64) t.attend_items_per_sm = n;
  }
  if (const char* v = std::getenv("KVPAGE_DECODE_PREFETCH")) {
    // One number sets both distances; "K,V" each.
    const std::vector<absl::string_view> parts = absl::StrSplit(v, ',');
    int32_t k = 0, vv = 0;
    if (parts.size() <= 2 && absl::SimpleAtoi(parts[0], &k) &&
        absl::SimpleAtoi(parts.back(), &vv) && k >= 0 && k <= 4 && vv >= 0 && vv <= 4) {
      t.prefetch_k_steps = k;
      t.prefetch_v_steps = vv;
    }
  }
  return t;
}

DecodeKernel ChooseDecodeKernel(const CacheGeometry& geo, int32_t rows, bool precise,
                                const DeviceProfile& device, const DecodeTuning& tuning) {
  // Precise mode: the thread-group kernel keeps q, logits, P and the
  // accumulators in FP32 (docs/ACCURACY.md); the tensor-core kernels feed
  // 16-bit operands to the mma.
  if (precise) return DecodeKernel::kThreadGroup;
  using kernels::KernelBuilt;
  // The tensor-core family: the kernel with a ring where the dtype and head
  // size have one (INT4 at head size <= 128), else the register path.
  const DecodeKernel tc = KernelBuilt(DecodeKernel::kTensorCoreRing, geo, rows)
                              ? DecodeKernel::kTensorCoreRing
                              : DecodeKernel::kTensorCoreRegisters;
  if (tuning.path == DecodePath::kThreadGroup || !KernelBuilt(tc, geo, rows)) {
    return DecodeKernel::kThreadGroup;
  }
  // Every quantized cache takes the tensor cores, even at one row per KV
  // head (MHA FP8 570 against 832 us, INT4 423 against 680 on the H200);
  // 16-bit caches from kTensorCoreMinRows16 rows.
  if (tuning.path != DecodePath::kTensorCore && !IsQuantized(geo.k_dtype) &&
      rows < kTensorCoreMinRows16) {
    return DecodeKernel::kThreadGroup;
  }
  // The staged kernel wherever it exists on sm_90+ (BF16 and FP16 at head
  // size 128, block size 16, up to 8 rows a KV head): 2-7% faster than the
  // register path on every benchmark shape it serves.
  if (tc == DecodeKernel::kTensorCoreRegisters && device.cc_major >= 9 && tuning.staged &&
      KernelBuilt(DecodeKernel::kTensorCoreStaged, geo, rows)) {
    return DecodeKernel::kTensorCoreStaged;
  }
  return tc;
}

namespace {

// The partition size: the largest of the kernel's max_partition..32 whose
// shared memory fits its resident blocks on an SM (else one block), a half
// of it, or a third of the context (kernels that weigh thirds, up to their
// max_third_partition where that fits too), by the wave model with this
// device's SMs and the kernel's wave slots; the tuning's size where it fits.
int32_t PlanPartitionSize(DecodeKernel kernel, const CacheGeometry& geo, const DecodeCapacity& cap,
                          int32_t rows, const DeviceProfile& device, const DecodeTuning& tuning) {
  const kernels::DecodeKernelTraits t = kernels::KernelTraits(kernel, geo, rows);
  auto shared_bytes = [&](int32_t p) {
    return static_cast<size_t>(kernels::KernelSharedBytes(kernel, geo, rows, p));
  };
  // The kernel's register budget is cut for blocks_per_sm resident blocks:
  // the partition's shared memory should let that many share an SM too,
  // and must fit one block.
  const size_t sm_share = device.shared_per_sm / static_cast<size_t>(t.blocks_per_sm);
  const size_t resident_budget =
      std::min(device.max_shared_per_block, sm_share > device.reserved_shared_per_block
                                                ? sm_share - device.reserved_shared_per_block
                                                : 0);
  auto largest_fitting = [&](size_t budget) {
    int32_t p = t.max_partition;
    while (p > 32 && shared_bytes(p) > budget) p /= 2;
    return p;
  };
  int32_t p = largest_fitting(resident_budget);
  if (shared_bytes(p) > resident_budget) {
    p = largest_fitting(device.max_shared_per_block);  // fewer blocks per SM, then
  }
  const int64_t slots = int64_t{device.num_sms} * t.wave_blocks_per_sm;
  int32_t largest_third = t.max_third_partition;
  if (largest_third > 0 && shared_bytes(largest_third) > resident_budget) largest_third = p;
  const int32_t forced = tuning.partition_size;
  if (forced > 0 && (forced <= p || shared_bytes(forced) <= resident_budget)) return forced;
  return PartitionSizeByWaves(p, int64_t{cap.max_num_seqs} * geo.num_kv_heads, cap.max_context_len,
                              slots, t.third_step, largest_third);
}

}  // namespace

DecodePlan PlanDecode(const CacheGeometry& geo, const DecodeCapacity& cap,
                      const DeviceProfile& device, const DecodeTuning& tuning) {
  DecodePlan plan;
  const int32_t rows =
      geo.num_kv_heads > 0 ? cap.num_q_heads / geo.num_kv_heads * cap.max_query_len : 1;
  plan.kernel = ChooseDecodeKernel(geo, rows, cap.precise, device, tuning);
  const kernels::DecodeKernelTraits t = kernels::KernelTraits(plan.kernel, geo, rows);
  plan.threads = t.threads;
  plan.max_num_seqs = cap.max_num_seqs;
  plan.max_query_len = cap.max_query_len;
  plan.partition_size = PlanPartitionSize(plan.kernel, geo, cap, rows, device, tuning);
  plan.max_partitions = (cap.max_context_len + plan.partition_size - 1) / plan.partition_size;
  plan.direct_output = t.writes_output;
  plan.dependent_launch = device.cc_major >= 9 && tuning.dependent_decode;
  // One step ahead each on sm_90+, the best measured on the H100 (two
  // thrashed L2); off before sm_90, where it was never measured.
  const int32_t prefetch = device.cc_major >= 9 ? 1 : 0;
  plan.prefetch_k_steps = tuning.prefetch_k_steps >= 0 ? tuning.prefetch_k_steps : prefetch;
  plan.prefetch_v_steps = tuning.prefetch_v_steps >= 0 ? tuning.prefetch_v_steps : prefetch;
  return plan;
}

DecodeWorkspaceLayout PlanWorkspace(const CacheGeometry& geo, const DecodeCapacity& cap,
                                    const DecodePlan& plan) {
  const int64_t rows =
      int64_t{plan.max_num_seqs} * plan.max_query_len * cap.num_q_heads * plan.max_partitions;
  DecodeWorkspaceLayout l;
  l.max_offset = AlignUp(rows * geo.head_size * int64_t{sizeof(float)}, kRegionAlignment);
  l.sum_offset = l.max_offset + AlignUp(rows * int64_t{sizeof(float)}, kRegionAlignment);
  l.bytes = l.sum_offset + AlignUp(rows * int64_t{sizeof(float)}, kRegionAlignment);
  return l;
}

namespace {

// Work items per SM the split-KV schedule aims at: one wave, as many as an
// SM holds blocks of the kernel (mma.sync: two, by registers; wgmma: one,
// by registers and shared memory). A second wave of short split items
// costs more than the balance it buys (docs/archive.md, "Query-chunk
// attention kernel").
constexpr int32_t kAttendItemsPerSmWarpMma = 2;
constexpr int32_t kAttendItemsPerSmWarpgroupMma = 1;
// A split span covers at least this many KV tokens, so that the merge's
// round trip stays small beside the span's work.
constexpr int32_t kAttendMinSplitTokens = 512;

}  // namespace

AttendPlan PlanAttend(const CacheGeometry& geo, const DecodeCapacity& cap,
                      const DeviceProfile& device, const DecodeTuning& tuning) {
  // The warpgroup mainloop wherever it exists (sm_90a, the head sizes and
  // sides it serves): wgmma reads each K/V tile from shared memory once per
  // 64 rows, where mma.sync's ldmatrix reads it once per warp, and its
  // warpgroups overlap each other's softmax (docs/DESIGN.md, "Attention
  // over query chunks").
  const kernels::OperandKind k_side = kernels::OperandKindOf(geo.k_dtype);
  const kernels::OperandKind v_side = kernels::OperandKindOf(geo.v_dtype);
  const kernels::AttendMainloop loop =
      device.wgmma && tuning.attend_wgmma &&
              kernels::AttendWarpgroupServes(geo.head_size, k_side, v_side)
          ? kernels::AttendMainloop::kWarpgroupMma
          : kernels::AttendMainloop::kWarpMma;
  const kernels::AttendTile tile = kernels::AttendTileFor(geo.head_size, loop);
  AttendPlan plan;
  plan.mainloop = static_cast<int32_t>(loop);
  plan.tile_rows = tile.rows;
  plan.tile_tokens = tile.tokens;
  plan.threads = tile.threads + tile.producers;
  plan.shared_bytes =
      static_cast<size_t>(kernels::AttendLayout(geo.head_size, k_side, v_side, loop).bytes);
  const int64_t group = geo.num_kv_heads > 0 ? cap.num_q_heads / geo.num_kv_heads : 1;
  const int64_t tiles = (int64_t{cap.max_query_tokens} * group + tile.rows - 1) / tile.rows +
                        std::min(cap.max_num_seqs, cap.max_query_tokens);
  plan.max_tiles = static_cast<int32_t>(std::min<int64_t>(tiles, INT32_MAX / 2));
  const int64_t target =
      geo.num_kv_heads > 0
          ? int64_t{device.num_sms} *
                (tuning.attend_items_per_sm > 0                   ? tuning.attend_items_per_sm
                 : loop == kernels::AttendMainloop::kWarpgroupMma ? kAttendItemsPerSmWarpgroupMma
                                                                  : kAttendItemsPerSmWarpMma) /
                geo.num_kv_heads
          : 0;
  plan.split_items = tuning.attend_split ? static_cast<int32_t>(std::max<int64_t>(target, 0)) : 0;
  plan.min_split_tokens = kAttendMinSplitTokens;
  plan.max_items = std::max(plan.max_tiles, plan.split_items);
  // A sequence with one query token is a decode row: the decode kernel
  // streams its context at the copy bandwidth, where a query tile of
  // tile_rows rows holding group of them spends its steps on rows that do
  // not exist (docs/DESIGN.md, "Attention over query chunks").
  plan.decode_rows = tuning.attend_decode_rows && !cap.precise;
  if (plan.decode_rows) {
    DecodeCapacity one = cap;
    one.max_query_len = 1;
    plan.decode_rows_plan = PlanDecode(geo, one, device, tuning);
  }
  return plan;
}

AttendWorkspaceLayout PlanAttendWorkspace(const CacheGeometry& geo, const DecodeCapacity& cap,
                                          const AttendPlan& plan) {
  AttendWorkspaceLayout l;
  l.counts_offset = 0;
  l.items_offset = AlignUp(2 * int64_t{sizeof(int32_t)}, kRegionAlignment);
  l.merges_offset =
      l.items_offset +
      AlignUp(int64_t{plan.max_items} * int64_t{sizeof(AttendWorkItem)}, kRegionAlignment);
  l.out_offset = l.merges_offset + AlignUp(int64_t{plan.split_items} * int64_t{sizeof(AttendMerge)},
                                           kRegionAlignment);
  const int64_t rows = int64_t{plan.split_items} * geo.num_kv_heads * plan.tile_rows;
  l.lse_offset =
      l.out_offset + AlignUp(rows * geo.head_size * int64_t{sizeof(float)}, kRegionAlignment);
  l.decode_lens_offset = l.lse_offset + AlignUp(rows * int64_t{sizeof(float)}, kRegionAlignment);
  l.bytes = l.decode_lens_offset;
  if (plan.decode_rows) {
    // Queries and outputs at 4 bytes an element, the widest q and out dtype.
    const int64_t values = int64_t{cap.max_num_seqs} * cap.num_q_heads * geo.head_size;
    const int64_t lse = int64_t{cap.max_num_seqs} * cap.num_q_heads;
    l.decode_q_offset =
        l.decode_lens_offset +
        AlignUp(int64_t{cap.max_num_seqs} * int64_t{sizeof(int32_t)}, kRegionAlignment);
    l.decode_out_offset = l.decode_q_offset + AlignUp(values * 4, kRegionAlignment);
    l.decode_lse_offset = l.decode_out_offset + AlignUp(values * 4, kRegionAlignment);
    l.bytes = l.decode_lse_offset + AlignUp(lse * int64_t{sizeof(float)}, kRegionAlignment);
  }
  return l;
}

int64_t DecodeScratchBytes(const CacheGeometry& geo, const DecodeCapacity& cap,
                           const DecodePlan& decode, const AttendPlan& attend) {
  int64_t bytes = PlanWorkspace(geo, cap, decode).bytes;
  // (PlanWorkspace sizes by the plan's own sequences and query length.)
  if (attend.decode_rows)
    bytes = std::max(bytes, PlanWorkspace(geo, cap, attend.decode_rows_plan).bytes);
  return bytes;
}

const char* DecodeKernelName(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::kThreadGroup:
      return "thread_group";
    case DecodeKernel::kTensorCoreRegisters:
      return "tensor_core_registers";
    case DecodeKernel::kTensorCoreRing:
      return "tensor_core_ring";
    case DecodeKernel::kTensorCoreStaged:
      return "tensor_core_staged";
  }
  return "?";
}

}  // namespace kvpage
