// SPDX-License-Identifier: Apache-2.0
// The decode plan (src/decode_plan.h) pinned per device profile, with no
// GPU: which kernel, which partition, which launch options, for the
// benchmark's shapes and the tuning overrides. Each row's comment is the
// decision it pins; docs/DESIGN.md, "Decode plan", has the evidence.
#include "src/decode_plan.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/attend_traits.h"
#include "kernels/decode_traits.h"
#include "src/decode_partition.h"
#include "src/manifest.h"
#include "tests/common/fresh_seed.h"
#include "tests/common/plan_geometry.h"

namespace kvpage {
namespace {

using K = DecodeKernel;

struct PlanRow {
  const char* why;
  DeviceProfile device;
  DType k, v;
  int head_size, block_size, num_q_heads, num_kv_heads, query_len, seqs, context;
  K kernel;
  int32_t partition_size;
  bool direct_output;
};

constexpr DeviceProfile kH100 = DeviceProfile::H100();
constexpr DeviceProfile kH200 = DeviceProfile::H200();
constexpr DeviceProfile kA100 = DeviceProfile::A100();
constexpr DType kBF16 = DType::kBF16, kFP16 = DType::kFP16, kFP8 = DType::kFP8E4M3,
                kINT8 = DType::kINT8, kINT4 = DType::kINT4;

// The benchmark's seed shape is 8 query heads on 1 KV head, head 128, block
// 16, 8192 tokens; GQA 32/8 and MHA 32/32 beside it.
const PlanRow kRows[] = {
    // 16-bit caches on sm_90: the staged kernel wherever it exists. 4096-token
    // partitions (two of 8192: one wave of 256 blocks at 128 sequences on
    // 132 SMs x 2); 1024 at 32 sequences, where longer ones leave SMs idle.
    {"staged, small batch", kH100, kBF16, kBF16, 128, 16, 8, 1, 1, 32, 8192, K::kTensorCoreStaged,
     1024, false},
    {"staged, one wave", kH100, kBF16, kBF16, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreStaged,
     4096, false},
    {"staged, large batch", kH100, kBF16, kBF16, 128, 16, 8, 1, 1, 512, 8192, K::kTensorCoreStaged,
     4096, false},
    {"staged FP16", kH100, kFP16, kFP16, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreStaged, 4096,
     false},
    {"staged GQA 32/8", kH100, kBF16, kBF16, 128, 16, 32, 8, 1, 128, 8192, K::kTensorCoreStaged,
     4096, false},
    {"staged, one long sequence", kH100, kBF16, kBF16, 128, 16, 8, 1, 1, 1, 131072,
     K::kTensorCoreStaged, 512, false},
    // The H200 has the H100's SMs and shared memory: the same plans.
    {"H200 = H100", kH200, kBF16, kBF16, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreStaged, 4096,
     false},
    {"H200 = H100, INT4", kH200, kINT4, kINT4, 128, 16, 8, 1, 1, 512, 8192, K::kTensorCoreRing,
     8192, true},
    // MHA 16-bit keeps the thread-group kernel (one row a KV head), 512 tokens.
    {"MHA BF16: thread-group", kH100, kBF16, kBF16, 128, 16, 32, 32, 1, 128, 8192, K::kThreadGroup,
     512, true},
    // 8-bit caches: the register path, thirds of 8192 (2752, rounded to a
    // 32-token warp step) from 128 sequences, where halves leave a partial
    // wave on 132 SMs x 3.
    {"FP8 small batch", kH100, kFP8, kFP8, 128, 16, 8, 1, 1, 32, 8192, K::kTensorCoreRegisters,
     1024, false},
    {"FP8 thirds", kH100, kFP8, kFP8, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreRegisters, 2752,
     false},
    {"INT8 thirds", kH100, kINT8, kINT8, 128, 16, 8, 1, 1, 512, 8192, K::kTensorCoreRegisters, 2752,
     false},
    {"FP8 head 256, 8 query tokens", kH100, kFP8, kFP8, 256, 32, 64, 4, 8, 256, 32768,
     K::kTensorCoreRegisters, 4096, false},
    {"INT8 head 64, block 8, 2 query tokens", kH100, kINT8, kINT8, 64, 8, 32, 8, 2, 7, 2048,
     K::kTensorCoreRegisters, 512, false},
    // INT4 at head 128: the ring kernel, partitions up to 8192 (one a
    // sequence from 128 sequences: the partition kernel owns the output).
    {"INT4 ring small batch", kH100, kINT4, kINT4, 128, 16, 8, 1, 1, 32, 8192, K::kTensorCoreRing,
     2048, true},
    {"INT4 ring", kH100, kINT4, kINT4, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreRing, 8192, true},
    {"INT4 ring MHA", kH100, kINT4, kINT4, 128, 16, 32, 32, 1, 128, 8192, K::kTensorCoreRing, 8192,
     true},
    {"INT4 ring, one long sequence", kH100, kINT4, kINT4, 128, 16, 32, 8, 1, 1, 131072,
     K::kTensorCoreRing, 8192, true},
    // Mixed K/V dtypes have no tensor-core kernel.
    {"mixed K/V: thread-group", kH100, kBF16, kINT4, 128, 16, 8, 1, 1, 128, 8192, K::kThreadGroup,
     512, true},
    // sm_80 (A100, 108 SMs): no staged kernel; the register path sizes by
    // its own waves and 164 KB an SM.
    {"A100 BF16", kA100, kBF16, kBF16, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreRegisters, 2048,
     false},
    {"A100 BF16 thirds", kA100, kBF16, kBF16, 128, 16, 8, 1, 1, 512, 8192, K::kTensorCoreRegisters,
     2752, false},
    {"A100 FP8", kA100, kFP8, kFP8, 128, 16, 8, 1, 1, 128, 8192, K::kTensorCoreRegisters, 4096,
     false},
    {"A100 INT4", kA100, kINT4, kINT4, 128, 16, 32, 8, 1, 128, 8192, K::kTensorCoreRing, 4096,
     true},
    {"A100 MHA BF16", kA100, kBF16, kBF16, 128, 16, 32, 32, 1, 128, 8192, K::kThreadGroup, 512,
     true},
};

CacheGeometry Geometry(DType k, DType v, int head_size, int block_size, int num_kv_heads) {
  return PlanGeometry(k, v, head_size, block_size, num_kv_heads);
}

DecodeCapacity Capacity(int num_q_heads, int seqs, int context, int query_len) {
  DecodeCapacity c;
  c.num_q_heads = num_q_heads;
  c.max_num_seqs = seqs;
  c.max_context_len = context;
  c.max_query_len = query_len;
  return c;
}

TEST(DecodePlan, PinnedPerDeviceProfile) {
  if (!kManifestFull) GTEST_SKIP() << "the rows are pinned for the full kernel manifest";
  for (const PlanRow& r : kRows) {
    SCOPED_TRACE(r.why);
    const CacheGeometry g = Geometry(r.k, r.v, r.head_size, r.block_size, r.num_kv_heads);
    const DecodePlan plan =
        PlanDecode(g, Capacity(r.num_q_heads, r.seqs, r.context, r.query_len), r.device, {});
    EXPECT_EQ(DecodeKernelName(plan.kernel), std::string(DecodeKernelName(r.kernel)));
    EXPECT_EQ(plan.partition_size, r.partition_size);
    EXPECT_EQ(plan.max_partitions, (r.context + r.partition_size - 1) / r.partition_size);
    EXPECT_EQ(plan.direct_output, r.direct_output);
    EXPECT_EQ(plan.threads, r.kernel == K::kTensorCoreStaged ? 160 : 128);
    EXPECT_EQ(plan.max_num_seqs, r.seqs);
    EXPECT_EQ(plan.max_query_len, r.query_len);
    // Dependent launches and one step of L2 prefetch on sm_90+ only.
    const bool sm90 = r.device.cc_major >= 9;
    EXPECT_EQ(plan.dependent_launch, sm90);
    EXPECT_EQ(plan.prefetch_k_steps, sm90 ? 1 : 0);
    EXPECT_EQ(plan.prefetch_v_steps, sm90 ? 1 : 0);
  }
}

// Each tuning override moves the field it names, and only that one.
TEST(DecodePlan, TuningOverrides) {
  if (!kManifestFull) GTEST_SKIP() << "pinned for the full kernel manifest";
  const CacheGeometry bf16 = Geometry(kBF16, kBF16, 128, 16, 1);
  const CacheGeometry int4 = Geometry(kINT4, kINT4, 128, 16, 1);
  const DecodeCapacity cap = Capacity(8, 128, 8192, 1);
  DecodeTuning t;
  t.path = DecodePath::kThreadGroup;
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).kernel, K::kThreadGroup);
  EXPECT_EQ(PlanDecode(int4, cap, kH100, t).kernel, K::kThreadGroup);
  EXPECT_EQ(PlanDecode(int4, cap, kH100, t).partition_size, 512);
  t = {};
  t.staged = false;  // the register path, at thirds of the context
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).kernel, K::kTensorCoreRegisters);
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).partition_size, 2752);
  EXPECT_EQ(PlanDecode(int4, cap, kH100, t).kernel, K::kTensorCoreRing);
  t = {};
  t.path = DecodePath::kTensorCore;  // forces 16-bit MHA onto the tensor cores
  EXPECT_EQ(PlanDecode(bf16, Capacity(1, 128, 8192, 1), kH100, t).kernel, K::kTensorCoreStaged);
  EXPECT_EQ(PlanDecode(bf16, Capacity(1, 128, 8192, 1), kH100, {}).kernel, K::kThreadGroup);
  t = {};
  t.partition_size = 96;
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).partition_size, 96);
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).max_partitions, 86);
  t.partition_size = 1 << 20;  // does not fit shared memory: the wave model's
  EXPECT_EQ(PlanDecode(bf16, cap, kH100, t).partition_size, 4096);
  // Precise mode runs the CUDA-core kernel whatever the cache and tuning.
  DecodeCapacity precise = cap;
  precise.precise = true;
  t = {};
  t.path = DecodePath::kTensorCore;
  EXPECT_EQ(PlanDecode(bf16, precise, kH100, t).kernel, K::kThreadGroup);
  EXPECT_EQ(PlanDecode(int4, precise, kH100, {}).kernel, K::kThreadGroup);
  EXPECT_EQ(PlanDecode(int4, precise, kH100, {}).partition_size, 512);
  t = {};
  t.dependent_decode = false;
  EXPECT_FALSE(PlanDecode(bf16, cap, kH100, t).dependent_launch);
  t = {};
  t.prefetch_k_steps = 0;
  t.prefetch_v_steps = 3;
  EXPECT_EQ(PlanDecode(bf16, cap, kA100, t).prefetch_k_steps, 0);
  EXPECT_EQ(PlanDecode(bf16, cap, kA100, t).prefetch_v_steps, 3);
}

// The environment reader: every switch, its valid values, and values it
// cannot read (which leave the default).
TEST(DecodePlan, TuningFromEnvironment) {
  const char* names[] = {"KVPAGE_DECODE_KERNEL",    "KVPAGE_DECODE_STAGED",
                         "KVPAGE_DECODE_PDL",       "KVPAGE_WRITE_PDL",
                         "KVPAGE_DECODE_PARTITION", "KVPAGE_DECODE_PREFETCH"};
  for (const char* n : names) unsetenv(n);
  DecodeTuning t = DecodeTuningFromEnvironment();
  EXPECT_EQ(t.path, DecodePath::kAuto);
  EXPECT_TRUE(t.staged && t.dependent_decode && t.dependent_write);
  EXPECT_EQ(t.partition_size, 0);
  EXPECT_EQ(t.prefetch_k_steps, -1);
  EXPECT_EQ(t.prefetch_v_steps, -1);

  setenv("KVPAGE_DECODE_KERNEL", "thread_group", 1);
  setenv("KVPAGE_DECODE_STAGED", "0", 1);
  setenv("KVPAGE_DECODE_PDL", "0", 1);
  setenv("KVPAGE_WRITE_PDL", "0", 1);
  setenv("KVPAGE_DECODE_PARTITION", "96", 1);
  setenv("KVPAGE_DECODE_PREFETCH", "0,3", 1);
  t = DecodeTuningFromEnvironment();
  EXPECT_EQ(t.path, DecodePath::kThreadGroup);
  EXPECT_FALSE(t.staged || t.dependent_decode || t.dependent_write);
  EXPECT_EQ(t.partition_size, 96);
  EXPECT_EQ(t.prefetch_k_steps, 0);
  EXPECT_EQ(t.prefetch_v_steps, 3);

  setenv("KVPAGE_DECODE_KERNEL", "tensor_core", 1);
  setenv("KVPAGE_DECODE_STAGED", "1", 1);
  setenv("KVPAGE_DECODE_PARTITION", "100", 1);  // not a multiple of 32
  setenv("KVPAGE_DECODE_PREFETCH", "2", 1);     // one number sets both
  t = DecodeTuningFromEnvironment();
  EXPECT_EQ(t.path, DecodePath::kTensorCore);
  EXPECT_TRUE(t.staged);
  EXPECT_EQ(t.partition_size, 0);
  EXPECT_EQ(t.prefetch_k_steps, 2);
  EXPECT_EQ(t.prefetch_v_steps, 2);

  setenv("KVPAGE_DECODE_KERNEL", "fastest", 1);
  setenv("KVPAGE_DECODE_PARTITION", "x", 1);
  setenv("KVPAGE_DECODE_PREFETCH", "5", 1);  // past 4
  t = DecodeTuningFromEnvironment();
  EXPECT_EQ(t.path, DecodePath::kAuto);
  EXPECT_EQ(t.partition_size, 0);
  EXPECT_EQ(t.prefetch_k_steps, -1);
  setenv("KVPAGE_DECODE_PREFETCH", "1,2,3", 1);
  EXPECT_EQ(DecodeTuningFromEnvironment().prefetch_k_steps, -1);
  for (const char* n : names) unsetenv(n);
}

// Over random geometries, capacities and devices: the plan runs a kernel
// this build holds, at a partition that is a multiple of 32 whose shared
// memory fits one block, with direct output only where the kernel writes it.
TEST(DecodePlan, InvariantsOverRandomShapes) {
  KVPAGE_SEEDED_RNG(rng);
  const int block_sizes[] = {8, 16, 32};
  const DeviceProfile devices[] = {kH100, kA100, {46, 9, 232448, 233472, 1024}};
  for (int i = 0; i < 20000; ++i) {
    const int hkv = 1 << (rng() % 4);
    const CacheGeometry g = Geometry(kManifestKvDtypes[rng() % std::size(kManifestKvDtypes)],
                                     kManifestKvDtypes[rng() % std::size(kManifestKvDtypes)],
                                     kManifestHeadSizes[rng() % std::size(kManifestHeadSizes)],
                                     block_sizes[rng() % 3], hkv);
    const DecodeCapacity cap =
        Capacity(hkv * (1 << (rng() % 4)), 1 + static_cast<int>(rng() % 600),
                 1 + static_cast<int>(rng() % 200000), 1 + static_cast<int>(rng() % 8));
    const DeviceProfile& dev = devices[rng() % 3];
    DecodeCapacity capacity = cap;
    capacity.precise = rng() % 4 == 0;
    DecodeTuning t;
    t.path = static_cast<DecodePath>(rng() % 3);
    t.staged = rng() % 2;
    const DecodePlan plan = PlanDecode(g, capacity, dev, t);
    const int32_t rows = cap.num_q_heads / hkv * cap.max_query_len;
    SCOPED_TRACE(testing::Message() << DTypeName(g.k_dtype) << "/" << DTypeName(g.v_dtype) << " D="
                                    << g.head_size << " bs=" << g.block_size << " rows=" << rows
                                    << " kernel=" << DecodeKernelName(plan.kernel));
    ASSERT_TRUE(kernels::KernelBuilt(plan.kernel, g, rows));
    ASSERT_GT(plan.partition_size, 0);
    ASSERT_EQ(plan.partition_size % kPartitionTokenMultiple, 0);
    ASSERT_LE(kernels::KernelSharedBytes(plan.kernel, g, rows, plan.partition_size),
              static_cast<int64_t>(dev.max_shared_per_block));
    ASSERT_EQ(plan.max_partitions,
              (cap.max_context_len + plan.partition_size - 1) / plan.partition_size);
    if (plan.direct_output) ASSERT_TRUE(kernels::KernelTraits(plan.kernel, g, rows).writes_output);
    if (plan.kernel == K::kTensorCoreStaged) ASSERT_GE(dev.cc_major, 9);
    if (t.path == DecodePath::kThreadGroup || capacity.precise) {
      ASSERT_EQ(plan.kernel, K::kThreadGroup);
    }
    // The workspace holds every row's partials.
    const DecodeWorkspaceLayout l = PlanWorkspace(g, cap, plan);
    const int64_t partials =
        int64_t{cap.max_num_seqs} * cap.max_query_len * cap.num_q_heads * plan.max_partitions;
    ASSERT_GE(l.max_offset, partials * g.head_size * 4);
    ASSERT_GE(l.sum_offset - l.max_offset, partials * 4);
    ASSERT_GE(l.bytes - l.sum_offset, partials * 4);
  }
}

// The traits table's rows as the wave model uses them: thirds of the
// context for the register path (16- and 8-bit codes, a 32-token step, up to
// 4096), 64-token stages for the staged kernel; none for the ring or the
// thread-group kernel.
TEST(DecodeKernelTraits, PartitionLimits) {
  for (DType t : {kBF16, kFP16, kFP8, kINT8}) {
    const CacheGeometry g = Geometry(t, t, 128, 16, 1);
    const kernels::DecodeKernelTraits tr = kernels::KernelTraits(K::kTensorCoreRegisters, g, 8);
    EXPECT_EQ(tr.third_step, 32);
    EXPECT_EQ(tr.max_third_partition, 4096);
    EXPECT_EQ(tr.max_partition, DTypeBits(t) == 8 ? 4096 : 2048);
    EXPECT_FALSE(tr.writes_output);
    EXPECT_EQ(PartitionSizeByWaves(tr.max_partition, 128, 8192, 132 * tr.wave_blocks_per_sm,
                                   tr.third_step, tr.max_third_partition),
              2752);
  }
  const CacheGeometry int4 = Geometry(kINT4, kINT4, 128, 16, 1);
  const kernels::DecodeKernelTraits ring = kernels::KernelTraits(K::kTensorCoreRing, int4, 8);
  EXPECT_EQ(ring.third_step, 0);
  EXPECT_EQ(ring.max_partition, 8192);
  EXPECT_EQ(ring.wave_blocks_per_sm, 1);
  EXPECT_TRUE(ring.writes_output);
  const kernels::DecodeKernelTraits tg = kernels::KernelTraits(K::kThreadGroup, int4, 1);
  EXPECT_EQ(tg.third_step, 0);
  EXPECT_EQ(tg.blocks_per_sm, 6);
  EXPECT_EQ(kernels::KernelTraits(K::kThreadGroup, int4, 2).blocks_per_sm, 4);
  const kernels::DecodeKernelTraits staged =
      kernels::KernelTraits(K::kTensorCoreStaged, Geometry(kBF16, kBF16, 128, 16, 1), 8);
  EXPECT_EQ(staged.third_step, 64);
  EXPECT_EQ(staged.threads, 160);
  EXPECT_EQ(PartitionSizeByWaves(staged.max_partition, 128, 8192, 132 * staged.wave_blocks_per_sm,
                                 staged.third_step, staged.max_third_partition),
            4096);
}

// Where each tensor-core kernel exists: the staged kernel for 16-bit K = V
// at head 128 and block 16 with 1-8 rows; the ring for INT4 at head 128;
// the register path for K = V whose head size is a multiple of four 16-byte
// chunks; the thread-group kernel for everything the manifest holds.
TEST(DecodeKernelTraits, WhereEachKernelExists) {
  for (DType k : kManifestKvDtypes) {
    for (DType v : kManifestKvDtypes) {
      for (int d : kManifestHeadSizes) {
        for (int bs : {8, 16, 32}) {
          const CacheGeometry g = Geometry(k, v, d, bs, 1);
          SCOPED_TRACE(testing::Message()
                       << DTypeName(k) << "/" << DTypeName(v) << " D=" << d << " bs=" << bs);
          EXPECT_TRUE(kernels::KernelBuilt(K::kThreadGroup, g, 1));
          const bool tc = k == v && ManifestHasTcBlockSize(bs) &&
                          (d == 64 || d == 128 || d == 256) && d % (4 * 128 / DTypeBits(k)) == 0;
          const bool ring = tc && k == kINT4 && d == 128;
          EXPECT_EQ(kernels::KernelBuilt(K::kTensorCoreRing, g, 8), ring);
          EXPECT_EQ(kernels::KernelBuilt(K::kTensorCoreRegisters, g, 8), tc && !ring);
          for (int rows : {1, 2, 8, 9, 16}) {
            EXPECT_EQ(kernels::KernelBuilt(K::kTensorCoreStaged, g, rows),
                      tc && !IsQuantized(k) && d == 128 && bs == 16 && rows <= 8)
                << "rows=" << rows;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvpage

namespace kvpage {
namespace {

CacheGeometry AttendGeometry(DType k, DType v, int head_size, int kv_heads) {
  return PlanGeometry(k, v, head_size, 16, kv_heads);
}

// kvp_attend's plan: the mainloop and tile per device and head size, the
// work-item bound of a batch at capacity, the split-KV target from the SMs,
// and the tuning's switches.
TEST(AttendPlan, PinnedForTheH100) {
  DecodeCapacity cap;
  cap.num_q_heads = 32;
  cap.max_num_seqs = 256;
  cap.max_context_len = 32768;
  cap.max_query_tokens = 8192;
  const AttendPlan p = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kH100, DecodeTuning{});
  // sm_90a: the warpgroup mainloop, 64-token steps, two warpgroups and a
  // producer warpgroup.
  EXPECT_EQ(p.mainloop, static_cast<int32_t>(kernels::AttendMainloop::kWarpgroupMma));
  EXPECT_EQ(p.tile_rows, 128);
  EXPECT_EQ(p.tile_tokens, 64);
  EXPECT_EQ(p.threads, 384);
  // 8192 tokens x 4 heads of a group / 128 rows, plus one partial tile for
  // each of 256 sequences.
  EXPECT_EQ(p.max_tiles, 256 + 256);
  EXPECT_EQ(p.split_items, 132 * 1 / 8);  // one wave of the wgmma kernel's one block an SM
  EXPECT_EQ(p.max_items, 512);
  EXPECT_EQ(p.min_split_tokens, 512);
  // Decode rows run kvp_decode's plan at one query token a sequence, and
  // the decoder's split-K scratch holds either plan's.
  DecodeCapacity one = cap;
  one.max_query_len = 1;
  const DecodePlan decode = PlanDecode(AttendGeometry(kBF16, kBF16, 128, 8), one, kH100, {});
  EXPECT_TRUE(p.decode_rows);
  EXPECT_EQ(p.decode_rows_plan.kernel, decode.kernel);
  EXPECT_EQ(p.decode_rows_plan.partition_size, decode.partition_size);
  EXPECT_EQ(p.decode_rows_plan.max_partitions, decode.max_partitions);
  EXPECT_EQ(p.decode_rows_plan.max_query_len, 1);
  DecodeCapacity wide = cap;
  wide.max_query_len = 8;
  const DecodePlan eight = PlanDecode(AttendGeometry(kBF16, kBF16, 128, 8), wide, kH100, {});
  const AttendPlan pw = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), wide, kH100, {});
  EXPECT_EQ(pw.decode_rows_plan.max_query_len, 1);
  EXPECT_EQ(
      DecodeScratchBytes(AttendGeometry(kBF16, kBF16, 128, 8), wide, eight, pw),
      std::max(
          PlanWorkspace(AttendGeometry(kBF16, kBF16, 128, 8), wide, eight).bytes,
          PlanWorkspace(AttendGeometry(kBF16, kBF16, 128, 8), one, pw.decode_rows_plan).bytes));
  DecodeCapacity precise = cap;
  precise.precise = true;
  EXPECT_FALSE(PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), precise, kH100, {}).decode_rows);
  DecodeTuning three;
  three.attend_items_per_sm = 3;
  EXPECT_EQ(PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kH100, three).split_items,
            132 * 3 / 8);
  DecodeTuning no_split;
  no_split.attend_split = false;
  const AttendPlan q = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kH100, no_split);
  EXPECT_EQ(q.split_items, 0);
  EXPECT_EQ(q.max_items, q.max_tiles);
  const int64_t items_bytes = 256 + AlignUp(512 * int64_t{sizeof(AttendWorkItem)}, 256);
  // Decode rows: per sequence its context, its query and output (4 bytes a
  // value at most) and its lse.
  EXPECT_EQ(PlanAttendWorkspace(AttendGeometry(kBF16, kBF16, 128, 8), cap, q).bytes,
            items_bytes + 256 * 4 + 2 * (256 * 32 * 128 * 4) + 256 * 32 * 4);
  DecodeTuning plain = no_split;
  plain.attend_decode_rows = false;
  const AttendPlan r = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kH100, plain);
  EXPECT_FALSE(r.decode_rows);
  EXPECT_EQ(PlanAttendWorkspace(AttendGeometry(kBF16, kBF16, 128, 8), cap, r).bytes, items_bytes);
  // MQA: the split target is per KV head.
  EXPECT_EQ(
      PlanAttend(AttendGeometry(kINT4, kINT4, 256, 1), cap, kH100, DecodeTuning{}).split_items,
      264);
  EXPECT_EQ(PlanAttend(AttendGeometry(kINT4, kINT4, 256, 1), cap, kH100, DecodeTuning{}).tile_rows,
            64);
  // The mma.sync mainloop: head sizes without a warpgroup tile, sides of
  // codes, the A100, and the tuning's switch.
  for (int d : {80, 96, 112, 256}) {
    const AttendPlan w = PlanAttend(AttendGeometry(kBF16, kFP16, d, 8), cap, kH100, {});
    EXPECT_EQ(w.mainloop, static_cast<int32_t>(kernels::AttendMainloop::kWarpMma)) << d;
    EXPECT_EQ(w.threads, 128) << d;
  }
  for (DType codes : {kFP8, kINT8, kINT4}) {
    EXPECT_EQ(PlanAttend(AttendGeometry(codes, kBF16, 128, 8), cap, kH100, {}).mainloop,
              static_cast<int32_t>(kernels::AttendMainloop::kWarpMma));
    EXPECT_EQ(PlanAttend(AttendGeometry(kFP16, codes, 64, 8), cap, kH100, {}).mainloop,
              static_cast<int32_t>(kernels::AttendMainloop::kWarpMma));
    EXPECT_EQ(PlanAttend(AttendGeometry(codes, codes, 256, 8), cap, kH100, {}).mainloop,
              static_cast<int32_t>(kernels::AttendMainloop::kWarpMma));
  }
  const AttendPlan a100 = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kA100, {});
  EXPECT_EQ(a100.mainloop, static_cast<int32_t>(kernels::AttendMainloop::kWarpMma));
  EXPECT_EQ(a100.tile_tokens, 32);
  DecodeTuning no_wgmma;
  no_wgmma.attend_wgmma = false;
  const AttendPlan m = PlanAttend(AttendGeometry(kBF16, kBF16, 128, 8), cap, kH100, no_wgmma);
  EXPECT_EQ(m.mainloop, static_cast<int32_t>(kernels::AttendMainloop::kWarpMma));
  EXPECT_EQ(m.tile_tokens, 32);
  EXPECT_EQ(m.threads, 128);
  EXPECT_EQ(PlanAttend(AttendGeometry(kFP16, kBF16, 64, 8), cap, kH100, {}).mainloop,
            static_cast<int32_t>(kernels::AttendMainloop::kWarpgroupMma));
}

// Every head size of the manifest and every pair of K/V dtypes: the tile's
// shared memory fits one block on the A100 (the smallest limit the library
// targets), and two blocks share an H100 SM where the head size is <= 128.
TEST(AttendPlan, SharedMemoryFitsEveryGeometry) {
  for (int d : kManifestHeadSizes) {
    for (DType k : kManifestKvDtypes) {
      for (DType v : kManifestKvDtypes) {
        DecodeCapacity cap;
        cap.num_q_heads = 8;
        cap.max_num_seqs = 4;
        cap.max_context_len = 4096;
        cap.max_query_tokens = 64;
        const AttendPlan p = PlanAttend(AttendGeometry(k, v, d, 2), cap, kA100, DecodeTuning{});
        SCOPED_TRACE(std::string(DTypeName(k)) + "/" + DTypeName(v) + " D=" + std::to_string(d));
        EXPECT_LE(p.shared_bytes, kA100.max_shared_per_block);
        if (d <= 128) {
          EXPECT_LE(2 * (p.shared_bytes + kH100.reserved_shared_per_block), kH100.shared_per_sm);
        }
        EXPECT_EQ(p.tile_tokens % 32, 0);  // a multiple of every block size
        // The H100's plan (the warpgroup mainloop at 64 and 128) fits one
        // block of it.
        const AttendPlan h = PlanAttend(AttendGeometry(k, v, d, 2), cap, kH100, DecodeTuning{});
        EXPECT_LE(h.shared_bytes + kH100.reserved_shared_per_block, kH100.max_shared_per_block);
        EXPECT_EQ(h.tile_tokens % 32, 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvpage
