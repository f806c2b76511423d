// SPDX-License-Identifier: Apache-2.0
// kvp_attend on the CUDA backend against the CPU backend: ragged batches
// mixing chunks of 0, 1, 2, 7, 16, 63, 64, 65, 513 and 2048 query tokens
// with decoding rows, contexts up to 32k (split KV), every KV dtype and
// mixed K/V, every head size, block size and option, sequences sharing
// blocks after a fork, one captured graph replayed over different mixes,
// and checked mode's report of bad offsets. Skips itself without a GPU.
//
// Tolerance: the kernels round q to K's 16-bit operand type and P to V's
// (BF16 for BF16 caches, FP16 otherwise) and sum in FP32, as FlashAttention
// does; the CPU computes in double. Over a batch, the output's rel-L2 error
// is within kOutBound (BF16 operands: 2^-9 per rounding; FP16: 2^-12) and
// each LSE within kLseBound * (1 + |LSE|): the bounds the header states for
// kvp_attend (docs/DECISIONS.md, "Query chunks").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "src/manifest.h"
#include "tests/capi/gpu_twins.h"
#include "tests/common/reference.h"
#include "tests/common/test_matrix.h"

namespace kvpage {
namespace testing {
namespace {

#if KVPAGE_HAVE_CUDA

double OutBound(int v_dtype) { return v_dtype == KVP_DTYPE_BF16 ? 8e-3 : 2e-3; }
constexpr double kLseBound = 2e-2;

// One kvp_attend problem, host side.
struct AttendBatch {
  int hq = 0, q_dtype = KVP_DTYPE_BF16, out_dtype = KVP_DTYPE_BF16;
  int width = 0, sliding_window = 0;
  float sm_scale = 0, soft_cap = 0;
  std::vector<int32_t> starts, lens, table;
  std::vector<float> alibi;
  std::vector<uint8_t> q;
  int tokens() const { return starts.back(); }
  int num_seqs() const { return static_cast<int>(lens.size()); }
};

struct Errors {
  double out_rel_l2 = 0, lse_max = 0;
  int nonfinite = 0, lse_mismatch = 0;
};

kvp_attend_args ArgsFor(const AttendBatch& b) {
  kvp_attend_args a;
  kvp_attend_args_init(&a);
  a.num_seqs = b.num_seqs();
  a.sliding_window = b.sliding_window;
  a.sm_scale = b.sm_scale;
  a.logits_soft_cap = b.soft_cap;
  a.block_table_width = b.width;
  return a;
}

kvp_decode_config ConfigFor(const AttendBatch& b, int max_seqs, int max_context, int max_tokens) {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = b.hq;
  dc.max_num_seqs = max_seqs;
  dc.max_context_len = max_context;
  dc.max_query_tokens = max_tokens;
  dc.q_dtype = b.q_dtype;
  dc.out_dtype = b.out_dtype;
  return dc;
}

// Output and LSE of the CPU cache for `b` (the oracle).
void RunCpu(const Twins& twins, const AttendBatch& b, int head_size, std::vector<uint8_t>* out,
            std::vector<float>* lse) {
  kvp_decode_config dc = ConfigFor(b, b.num_seqs(), 1 << 16, std::max(b.tokens(), 1));
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(twins.cpu(), &dc, &dec));
  out->assign(size_t(std::max(b.tokens(), 1)) * b.hq * head_size * DtypeBytes(b.out_dtype), 0xFF);
  lse->assign(size_t(std::max(b.tokens(), 1)) * b.hq, std::numeric_limits<float>::quiet_NaN());
  kvp_attend_args a = ArgsFor(b);
  a.query_starts = b.starts.data();
  a.q = b.q.data();
  a.block_table = b.table.data();
  a.seq_lens = b.lens.data();
  a.alibi_slopes = b.alibi.empty() ? nullptr : b.alibi.data();
  a.out = out->data();
  a.lse = lse->data();
  ASSERT_OK(kvp_attend(dec, &a, nullptr));
  kvp_decoder_destroy(dec);
}

Errors Compare(const AttendBatch& b, int D, const std::vector<uint8_t>& want,
               const std::vector<float>& want_lse, const std::vector<uint8_t>& got,
               const std::vector<float>& got_lse) {
  Errors e;
  double num = 0, den = 0;
  for (int64_t i = 0; i < int64_t(b.tokens()) * b.hq * D; ++i) {
    const double w = LoadElement(b.out_dtype, want.data(), i);
    const double g = LoadElement(b.out_dtype, got.data(), i);
    if (!std::isfinite(g)) ++e.nonfinite;
    num += (g - w) * (g - w);
    den += w * w;
  }
  e.out_rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (int64_t r = 0; r < int64_t(b.tokens()) * b.hq; ++r) {
    if (std::isinf(want_lse[r])) {
      if (!(std::isinf(got_lse[r]) && got_lse[r] < 0)) ++e.lse_mismatch;
      continue;
    }
    e.lse_max = std::max(e.lse_max,
                         std::abs(double(got_lse[r]) - want_lse[r]) / (1 + std::abs(want_lse[r])));
  }
  return e;
}

// Runs `b` on both caches (GPU decoder of the given capacities) and checks
// the GPU within the bounds of the V dtype.
void CompareAttend(const Twins& twins, const AttendBatch& b, int D, int v_dtype, int max_seqs,
                   int max_context, int max_tokens) {
  std::vector<uint8_t> want;
  std::vector<float> want_lse;
  RunCpu(twins, b, D, &want, &want_lse);
  kvp_decode_config dc = ConfigFor(b, max_seqs, max_context, max_tokens);
  kvp_decoder* dec = nullptr;
  ASSERT_EQ(twins.OnGpu([&] { return kvp_decoder_create(twins.gpu(), &dc, &dec); }), "");
  DeviceBuffer<uint8_t> dq(b.q), dout(std::vector<uint8_t>(want.size(), 0xFF));
  DeviceBuffer<int32_t> dstarts(b.starts), dlens(b.lens), dtable(b.table);
  DeviceBuffer<float> dalibi(b.alibi.empty() ? std::vector<float>{0} : b.alibi);
  DeviceBuffer<float> dlse(std::vector<float>(want_lse.size(), std::nanf("")));
  kvp_attend_args a = ArgsFor(b);
  a.query_starts = dstarts.get();
  a.q = dq.get();
  a.block_table = dtable.get();
  a.seq_lens = dlens.get();
  a.alibi_slopes = b.alibi.empty() ? nullptr : dalibi.get();
  a.out = dout.get();
  a.lse = dlse.get();
  ASSERT_EQ(twins.OnGpu([&] { return kvp_attend(dec, &a, nullptr); }), "");
  ASSERT_CUDA(cudaDeviceSynchronize());
  kvp_decoder_destroy(dec);
  const Errors e =
      Compare(b, D, want, want_lse, dout.Read(want.size()), dlse.Read(want_lse.size()));
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_EQ(e.lse_mismatch, 0);
  EXPECT_LE(e.out_rel_l2, OutBound(v_dtype));
  EXPECT_LE(e.lse_max, kLseBound);
}

// A ragged batch over `lens` with `counts` query tokens each.
AttendBatch MakeBatch(Rng& rng, const Layout& l, const std::vector<int>& counts, int hq, int D) {
  AttendBatch b;
  b.hq = hq;
  b.lens = l.lens;
  b.table = l.table;
  b.width = l.width;
  b.starts.push_back(0);
  for (int c : counts) b.starts.push_back(b.starts.back() + c);
  b.q_dtype = kIoDtypes[rng.uniform(0, 2)];
  b.out_dtype = kIoDtypes[rng.uniform(0, 2)];
  StoreElements(b.q_dtype, rng.normals(size_t(std::max(b.tokens(), 1)) * hq * D), &b.q);
  return b;
}

void RandomOptions(Rng& rng, AttendBatch* b) {
  if (rng.uniform(0, 2) == 0) {
    for (int h = 0; h < b->hq; ++h) b->alibi.push_back(std::ldexp(1.0f, -rng.uniform(0, 8)));
  }
  if (rng.uniform(0, 2) == 0) b->soft_cap = 5.0f + 20.0f * std::abs(rng.normal());
  if (rng.uniform(0, 2) == 0) b->sliding_window = rng.uniform(1, 300);
  if (rng.uniform(0, 1) == 0) b->sm_scale = 0.05f + 0.1f * std::abs(rng.normal());
}

TEST(GpuAttend, AgreesWithTheCpuAcrossTheMatrix) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  const int kCounts[] = {0, 1, 2, 7, 16, 63, 64, 65};
  for (int trial = 0; trial < 3 * kNumKvDtypes * kNumHeadSizes; ++trial) {
    Geometry g;
    g.k_dtype = kKvDtypes[trial % kNumKvDtypes];
    g.v_dtype = trial % 5 == 4 ? kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)] : g.k_dtype;
    g.head_size = kHeadSizes[(trial / kNumKvDtypes) % kNumHeadSizes];
    g.block_size = 8 << rng.uniform(0, 2);
    g.num_kv_heads = rng.uniform(1, 2);
    g.smoothing = rng.uniform(0, 3) == 0;
    const int group = 1 << rng.uniform(0, 3);
    std::vector<int> counts, lens;
    const int n = rng.uniform(1, 5);
    for (int s = 0; s < n; ++s) {
      const int c = kCounts[rng.uniform(0, 7)];
      counts.push_back(c);
      lens.push_back(c + rng.uniform(0, 1) * rng.uniform(0, 400));
    }
    g.num_blocks = BlocksFor(lens, g.block_size) + 4;
    g.num_layers = 1;
    SCOPED_TRACE(absl::StrFormat("K=%s V=%s D=%d bs=%d hkv=%d group=%d smooth=%d",
                                 DtypeName(g.k_dtype), DtypeName(g.v_dtype), g.head_size,
                                 g.block_size, g.num_kv_heads, group, g.smoothing));
    // Half the trials without split KV, and half of each half on the
    // mma.sync mainloop where the plan would pick the warpgroup one, and a
    // third with one-token sequences in query tiles rather than the decode
    // kernel (the switches are read when the CUDA cache is created), so
    // that both schedules, both mainloops and both paths of decode rows
    // serve every dtype and head size.
    const bool split = trial % 2 == 0;
    const bool wgmma = trial % 4 < 2;
    const bool decode_rows = trial % 3 != 1;
    if (!split) setenv("KVPAGE_ATTEND_SPLIT", "0", 1);
    if (!wgmma) setenv("KVPAGE_ATTEND_WGMMA", "0", 1);
    if (!decode_rows) setenv("KVPAGE_ATTEND_DECODE_ROWS", "0", 1);
    Twins twins(g, rng);
    unsetenv("KVPAGE_ATTEND_SPLIT");
    unsetenv("KVPAGE_ATTEND_WGMMA");
    unsetenv("KVPAGE_ATTEND_DECODE_ROWS");
    ASSERT_EQ(twins.error(), "");
    const Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
    FillTwins(twins, rng, 0, KVP_DTYPE_FP32, l);
    AttendBatch b = MakeBatch(rng, l, counts, g.num_kv_heads * group, g.head_size);
    RandomOptions(rng, &b);
    SCOPED_TRACE(absl::StrFormat(
        "window=%d softcap=%g alibi=%d q=%s out=%s split=%d wgmma=%d decode_rows=%d",
        b.sliding_window, b.soft_cap, !b.alibi.empty(), DtypeName(b.q_dtype),
        DtypeName(b.out_dtype), split, wgmma, decode_rows));
    CompareAttend(twins, b, g.head_size, g.v_dtype, n + rng.uniform(0, 3), 1024,
                  b.tokens() + rng.uniform(0, 100) + 1);
    if (HasFailure()) return;
  }
}

// Long chunks and long contexts: 513 and 2048 query tokens, 16 over 32k
// (split KV), beside decoding rows.
TEST(GpuAttend, LongChunksAndContexts) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  // Few tiles split their contexts (kvp_attend's split-KV); many (the
  // 8-KV-head shape: more tiles than the schedule's split target) do not.
  struct Shape {
    std::vector<int> counts, lens;
    int num_kv_heads = 1, group = 4;
  } shapes[] = {
      {{2048}, {2048}},          {{513, 1, 1}, {4000, 3000, 1}},
      {{16}, {32768}},           {{1, 1, 1, 1}, {32768, 9000, 17, 20000}},
      {{2048, 1}, {3000, 8192}}, {{1500, 1500, 0}, {1500, 3000, 40}, 8, 2},
  };
  int case_index = 0;
  for (int k_dtype : kKvDtypes) {
    for (const Shape& s : shapes) {
      // Alternate cases on the mma.sync mainloop (where the plan would pick
      // the warpgroup one), and every third with one-token sequences in
      // query tiles: both see every dtype and long shapes.
      const bool wgmma = case_index % 2 == 0;
      const bool decode_rows = case_index++ % 3 != 2;
      Geometry g;
      g.k_dtype = g.v_dtype = k_dtype;
      g.head_size = 128;
      g.block_size = 16;
      g.num_kv_heads = s.num_kv_heads;
      g.num_layers = 1;
      g.num_blocks = BlocksFor(s.lens, 16) + 2;
      SCOPED_TRACE(absl::StrFormat("K=V=%s counts[0]=%d lens[0]=%d hkv=%d wgmma=%d decode_rows=%d",
                                   DtypeName(k_dtype), s.counts[0], s.lens[0], s.num_kv_heads,
                                   wgmma, decode_rows));
      if (!wgmma) setenv("KVPAGE_ATTEND_WGMMA", "0", 1);
      if (!decode_rows) setenv("KVPAGE_ATTEND_DECODE_ROWS", "0", 1);
      Twins twins(g, rng);
      unsetenv("KVPAGE_ATTEND_WGMMA");
      unsetenv("KVPAGE_ATTEND_DECODE_ROWS");
      ASSERT_EQ(twins.error(), "");
      const Layout l = RandomLayout(rng, s.lens, 16, g.num_blocks);
      FillTwins(twins, rng, 0, KVP_DTYPE_BF16, l);
      AttendBatch b = MakeBatch(rng, l, s.counts, s.num_kv_heads * s.group, 128);
      CompareAttend(twins, b, 128, k_dtype, b.num_seqs(), 32768, b.tokens());
      if (HasFailure()) return;
    }
  }
}

// Forked sequences read the same blocks: a table row that shares its
// first blocks with another's.
TEST(GpuAttend, SequencesSharingBlocks) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  Geometry g;
  g.k_dtype = g.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
  g.head_size = 128;
  g.block_size = 16;
  g.num_layers = 1;
  const std::vector<int> lens = {300, 200};
  g.num_blocks = BlocksFor(lens, 16) + 2;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  Layout l = RandomLayout(rng, lens, 16, g.num_blocks);
  FillTwins(twins, rng, 0, KVP_DTYPE_FP32, l);
  // Sequence 2 forks sequence 0 after 160 tokens (10 blocks) and adds 40.
  l.lens.push_back(200);
  for (int j = 0; j < l.width; ++j) l.table.push_back(j < 10 ? l.table[j] : l.table[l.width + j]);
  AttendBatch b = MakeBatch(rng, l, {100, 37, 40}, 2 * 4, 128);
  CompareAttend(twins, b, 128, g.v_dtype, 3, 512, b.tokens());
}

// One graph, captured once, replayed over batches of different mixes
// within the capacities: lengths, offsets and tables are read when it runs.
TEST(GpuAttend, OneGraphServesEveryMix) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = g.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
  g.head_size = 128;
  g.block_size = 16;
  g.num_kv_heads = 2;
  g.num_layers = 1;
  const int kSeqs = 4, kContext = 4096, kTokens = 1200;
  g.num_blocks = kSeqs * kContext / 16 + 4;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  const int hq = 8, D = 128;
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = kSeqs;
  dc.max_context_len = kContext;
  dc.max_query_tokens = kTokens;
  dc.q_dtype = KVP_DTYPE_BF16;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  ASSERT_EQ(twins.OnGpu([&] { return kvp_decoder_create(twins.gpu(), &dc, &dec); }), "");
  DeviceBuffer<uint8_t> dq(std::vector<uint8_t>(size_t(kTokens) * hq * D * 2));
  DeviceBuffer<float> dout(std::vector<float>(size_t(kTokens) * hq * D));
  DeviceBuffer<float> dlse(std::vector<float>(size_t(kTokens) * hq));
  DeviceBuffer<int32_t> dstarts{std::vector<int32_t>(kSeqs + 1)};
  DeviceBuffer<int32_t> dlens{std::vector<int32_t>(kSeqs)};
  DeviceBuffer<int32_t> dtable(std::vector<int32_t>(size_t(kSeqs) * kContext / 16));
  kvp_attend_args a;
  kvp_attend_args_init(&a);
  a.num_seqs = kSeqs;
  a.query_starts = dstarts.get();
  a.q = dq.get();
  a.block_table = dtable.get();
  a.block_table_width = kContext / 16;
  a.seq_lens = dlens.get();
  a.out = dout.get();
  a.lse = dlse.get();
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const std::string err = twins.OnGpu([&] { return kvp_attend(dec, &a, stream); });
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(err, "");
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<std::vector<int>> mixes[] = {
      {{1000, 1, 1, 1}, {1000, 4000, 30, 2}},  {{0, 0, 0, 0}, {0, 5, 0, 0}},
      {{64, 65, 63, 16}, {64, 4096, 700, 16}}, {{1, 1, 1, 1}, {4096, 4096, 4096, 4096}},
      {{300, 0, 900, 0}, {300, 0, 2000, 1}},
  };
  for (const auto& mix : mixes) {
    const std::vector<int>& counts = mix[0];
    const std::vector<int>& lens = mix[1];
    SCOPED_TRACE(absl::StrFormat("counts %d,%d,%d,%d", counts[0], counts[1], counts[2], counts[3]));
    Layout l = RandomLayout(rng, lens, 16, g.num_blocks);
    FillTwins(twins, rng, 0, KVP_DTYPE_FP32, l);
    AttendBatch b = MakeBatch(rng, l, counts, hq, D);
    b.q_dtype = KVP_DTYPE_BF16;
    b.out_dtype = KVP_DTYPE_FP32;
    StoreElements(b.q_dtype, rng.normals(size_t(std::max(b.tokens(), 1)) * hq * D), &b.q);
    // The graph's table has the capacity's width.
    std::vector<int32_t> table(size_t(kSeqs) * (kContext / 16), 0);
    for (int s = 0; s < kSeqs; ++s) {
      std::copy_n(l.table.begin() + size_t(s) * l.width, l.width,
                  table.begin() + size_t(s) * (kContext / 16));
    }
    dq.Assign(b.q);
    dstarts.Assign(b.starts);
    dlens.Assign(b.lens);
    dtable.Assign(table);
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    b.table = table;
    b.width = kContext / 16;
    std::vector<uint8_t> want;
    std::vector<float> want_lse;
    RunCpu(twins, b, D, &want, &want_lse);
    std::vector<float> got = dout.Read(size_t(std::max(b.tokens(), 1)) * hq * D);
    std::vector<uint8_t> got_bytes(got.size() * 4);
    std::memcpy(got_bytes.data(), got.data(), got_bytes.size());
    const Errors e = Compare(b, D, want, want_lse, got_bytes, dlse.Read(want_lse.size()));
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_EQ(e.lse_mismatch, 0);
    EXPECT_LE(e.out_rel_l2, OutBound(g.v_dtype));
    EXPECT_LE(e.lse_max, kLseBound);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  kvp_decoder_destroy(dec);
}

// Checked mode: offsets and lengths the host cannot see are checked on the
// device and reported by the next call; the rest of the batch still runs.
TEST(GpuAttend, CheckedModeReportsBadInputs) {
  SKIP_WITHOUT_GPU();
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.num_layers = 1;
  cfg.num_blocks = 16;
  cfg.block_size = 16;
  cfg.num_kv_heads = 1;
  cfg.head_size = kHeadSizes[0];
  cfg.k_dtype = cfg.v_dtype = kKvDtypes[0];
  cfg.checked = 1;
  kvp_cache* cache = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &cache));
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = 2;
  dc.max_num_seqs = 2;
  dc.max_context_len = 64;
  dc.max_query_tokens = 8;
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(cache, &dc, &dec));
  const int D = cfg.head_size;
  DeviceBuffer<uint8_t> dq(std::vector<uint8_t>(size_t(16) * 2 * D * 2, 0x3C));
  DeviceBuffer<uint8_t> dout(std::vector<uint8_t>(size_t(16) * 2 * D * 2));
  const std::vector<int32_t> good_table = {0, 1, 2, 3, 4, 5, 6, 7};
  struct Bad {
    std::vector<int32_t> starts, lens;
    const char* needle;
    std::vector<int32_t> table;
  } cases[] = {
      {{0, 3, 2}, {10, 10}, "query_starts[2] = 2", good_table},
      {{0, 3, 9}, {10, 10}, "query_starts[2] = 9", good_table},
      {{0, 5, 6}, {4, 10}, "sequence 0 5 query tokens but seq_lens[0] = 4", good_table},
      {{0, 1, 2}, {10, 65}, "seq_lens[1] = 65", good_table},
      // Row 1's third block (tokens 32-47 of its 60) is not a block.
      {{0, 1, 2}, {10, 60}, "block id 99 in block_table row 1", {0, 1, 2, 3, 4, 5, 99, 7}},
  };
  for (const Bad& c : cases) {
    DeviceBuffer<int32_t> dstarts(c.starts), dlens(c.lens), dtable(c.table);
    kvp_attend_args a;
    kvp_attend_args_init(&a);
    a.num_seqs = 2;
    a.query_starts = dstarts.get();
    a.q = dq.get();
    a.block_table = dtable.get();
    a.block_table_width = 4;
    a.seq_lens = dlens.get();
    a.out = dout.get();
    ASSERT_OK(kvp_attend(dec, &a, nullptr));  // launched; the fault is found on the device
    ASSERT_CUDA(cudaDeviceSynchronize());
    kvp_error* e = kvp_attend(dec, &a, nullptr);
    ASSERT_NE(e, nullptr) << c.needle;
    EXPECT_NE(std::string(kvp_error_message(e)).find(c.needle), std::string::npos)
        << kvp_error_message(e);
    kvp_error_free(e);  // taken: the record is free for the next case
  }
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
}

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace testing
}  // namespace kvpage
