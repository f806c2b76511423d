// SPDX-License-Identifier: Apache-2.0
// The CUDA backend through the C API, against the CPU backend: the same
// writes give the same cache bytes; decodes agree within the tolerance
// below; one captured CUDA graph serves batches of different lengths,
// tables and sizes; copy-on-write, swaps and the caller's current device.
// Every test skips itself where no GPU is present.
//
// Decode tolerance: the CPU backend computes in double and rounds once; the
// kernel dequantizes exactly (every code * FP16 scale product is exact in
// FP32) and accumulates in FP32, so their difference is FP32 rounding
// (~1e-6 relative) plus one rounding of the output dtype each:
//   |gpu - cpu| <= 2 ulp(out dtype) * |cpu| + 1e-3 * max|cpu row| ... with
// the row term covering sums that cancel. LSE within 1e-3 absolute.
#include <algorithm>
#include <cmath>
#include <cstdio>
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

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvpage {
namespace testing {
namespace {

#if KVPAGE_HAVE_CUDA

double UlpRel(int dtype) {
  return dtype == KVP_DTYPE_BF16   ? std::ldexp(1.0, -7)
         : dtype == KVP_DTYPE_FP16 ? std::ldexp(1.0, -10)
                                   : 1e-5;
}

// One decode problem on both backends.
struct Batch {
  int num_seqs = 0, query_len = 1, hq = 0, q_dtype = KVP_DTYPE_BF16, out_dtype = KVP_DTYPE_BF16;
  int width = 0, sliding_window = 0;
  float sm_scale = 0, soft_cap = 0;
  std::vector<int32_t> table, lens;
  std::vector<float> alibi;
  std::vector<uint8_t> q;
  bool lse = true;
};

// Runs `batch` on the CPU cache and on the GPU cache (decoders with the
// given capacities) and compares.
void CompareDecode(const Twins& twins, int layer, const Batch& b, int max_num_seqs,
                   int max_context_len, int max_query_len) {
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = b.hq;
  dc.max_num_seqs = max_num_seqs;
  dc.max_context_len = max_context_len;
  dc.max_query_len = max_query_len;
  dc.q_dtype = b.q_dtype;
  dc.out_dtype = b.out_dtype;
  kvp_decoder *cpu_dec = nullptr, *gpu_dec = nullptr;
  ASSERT_OK(kvp_decoder_create(twins.cpu(), &dc, &cpu_dec));
  ASSERT_EQ(twins.OnGpu([&] { return kvp_decoder_create(twins.gpu(), &dc, &gpu_dec); }), "");
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  ASSERT_OK(kvp_cache_get_info(twins.cpu(), &info));
  const int D = info.head_size;
  const int64_t rows = int64_t(b.num_seqs) * b.query_len;
  const int out_bytes = DtypeBytes(b.out_dtype);
  std::vector<uint8_t> cpu_out(rows * b.hq * D * out_bytes, 0xFF);  // NaN in every dtype
  std::vector<float> cpu_lse(rows * b.hq, std::numeric_limits<float>::quiet_NaN());

  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.layer = layer;
  a.num_seqs = b.num_seqs;
  a.query_len = b.query_len;
  a.sliding_window = b.sliding_window;
  a.sm_scale = b.sm_scale;
  a.logits_soft_cap = b.soft_cap;
  a.q = b.q.data();
  a.block_table = b.table.data();
  a.block_table_width = b.width;
  a.seq_lens = b.lens.data();
  a.alibi_slopes = b.alibi.empty() ? nullptr : b.alibi.data();
  a.out = cpu_out.data();
  a.lse = b.lse ? cpu_lse.data() : nullptr;
  ASSERT_OK(kvp_decode(cpu_dec, &a, nullptr));

  DeviceBuffer<uint8_t> dq(b.q), dout(std::vector<uint8_t>(cpu_out.size(), 0xFF));
  DeviceBuffer<int32_t> dtable(b.table), dlens(b.lens);
  DeviceBuffer<float> dalibi(b.alibi.empty() ? std::vector<float>{0} : b.alibi);
  DeviceBuffer<float> dlse(
      std::vector<float>(cpu_lse.size(), std::numeric_limits<float>::quiet_NaN()));
  a.q = dq.get();
  a.block_table = dtable.get();
  a.seq_lens = dlens.get();
  a.alibi_slopes = b.alibi.empty() ? nullptr : dalibi.get();
  a.out = dout.get();
  a.lse = b.lse ? dlse.get() : nullptr;
  ASSERT_EQ(twins.OnGpu([&] { return kvp_decode(gpu_dec, &a, nullptr); }), "");
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint8_t> gpu_out = dout.Read(cpu_out.size());
  const std::vector<float> gpu_lse = dlse.Read(cpu_lse.size());

  int bad = 0;
  for (int64_t r = 0; r < rows * b.hq && bad < 5; ++r) {
    double row_max = 0;
    for (int d = 0; d < D; ++d) {
      row_max = std::max(row_max, std::abs(LoadElement(b.out_dtype, cpu_out.data(), r * D + d)));
    }
    for (int d = 0; d < D; ++d) {
      const double want = LoadElement(b.out_dtype, cpu_out.data(), r * D + d);
      const double got = LoadElement(b.out_dtype, gpu_out.data(), r * D + d);
      if (!(std::abs(got - want) <= 2 * UlpRel(b.out_dtype) * std::abs(want) + 1e-3 * row_max)) {
        ADD_FAILURE() << "row " << r / b.hq << " head " << r % b.hq << " d " << d << ": gpu " << got
                      << ", cpu " << want;
        if (++bad >= 5) break;
      }
    }
    if (b.lse) {
      if (std::isinf(cpu_lse[r])) {
        EXPECT_TRUE(std::isinf(gpu_lse[r]) && gpu_lse[r] < 0) << "lse " << r << ": " << gpu_lse[r];
      } else {
        EXPECT_NEAR(gpu_lse[r], cpu_lse[r], 1e-3) << "lse " << r;
      }
    }
  }
  kvp_decoder_destroy(cpu_dec);
  kvp_decoder_destroy(gpu_dec);
}

TEST(GpuWrite, SameBytesAsTheCpuForEveryFormat) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  int i = 0;
  for (int kd : kKvDtypes) {
    for (int vd : kKvDtypes) {
      Geometry g;
      g.k_dtype = kd;
      g.v_dtype = vd;
      g.head_size = kHeadSizes[i % kNumHeadSizes];
      g.block_size = kBlockSizes[i % 3];
      g.smoothing = i % 4 == 0;
      ++i;
      SCOPED_TRACE(absl::StrFormat("K=%s V=%s D=%d bs=%d", DtypeName(kd), DtypeName(vd),
                                   g.head_size, g.block_size));
      Twins twins(g, rng);
      ASSERT_EQ(twins.error(), "");
      std::vector<int> lens = {1, 7, 33, rng.uniform(1, 200)};
      Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
      // Odd and even tokens of one block in one call (INT4 V shares bytes),
      // padding slots, and some non-finite and huge values.
      l.slots.insert(l.slots.begin() + 3, -1);
      std::vector<float> k = rng.normals(l.slots.size() * twins.token_elems());
      std::vector<float> v = rng.normals(l.slots.size() * twins.token_elems());
      k[5] = std::numeric_limits<float>::quiet_NaN();
      v[70] = std::numeric_limits<float>::infinity();
      k[300] = 1e30f;
      for (int d = 0; d < g.head_size; ++d) v[2 * twins.token_elems() + d] = 0;  // zero vector
      ASSERT_EQ(twins.Write(i % 2, kIoDtypes[i % 3], l.slots, k, v), "");
      twins.ExpectSameBytes();
    }
  }
}

TEST(GpuDecode, AgreesWithTheCpuAcrossTheMatrix) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  int i = 0;
  for (int kd : kKvDtypes) {
    for (int D : kHeadSizes) {
      for (int group : {1, 4, 8, 16}) {
        Geometry g;
        g.k_dtype = kd;
        g.v_dtype = kKvDtypes[rng.uniform(0, kNumKvDtypes - 1)];
        g.head_size = D;
        g.block_size = kBlockSizes[i % 3];
        g.num_kv_heads = group == 16 ? 1 : 2;
        g.smoothing = i % 5 == 0;
        const int option = i++ % 6;
        SCOPED_TRACE(absl::StrFormat("K=%s V=%s D=%d bs=%d group=%d option=%d", DtypeName(kd),
                                     DtypeName(g.v_dtype), D, g.block_size, group, option));
        std::vector<int> lens = {
            0, 1, g.block_size - 1, g.block_size + 1, rng.uniform(1, 700), rng.uniform(256, 1100)};
        g.num_blocks = BlocksFor(lens, g.block_size) + 4;
        Twins twins(g, rng);
        ASSERT_EQ(twins.error(), "");
        const Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
        FillTwins(twins, rng, 1, kIoDtypes[i % 3], l);
        twins.ExpectSameBytes();
        Batch b;
        b.num_seqs = static_cast<int>(lens.size());
        b.hq = g.num_kv_heads * group;
        b.q_dtype = kIoDtypes[(i / 3) % 3];
        b.out_dtype = kIoDtypes[(i / 2) % 3];
        b.table = l.table;
        b.lens = l.lens;
        b.width = l.width;
        if (option == 1)
          for (int h = 0; h < b.hq; ++h) b.alibi.push_back(std::ldexp(1.0f, -rng.uniform(0, 8)));
        if (option == 2) b.sliding_window = rng.uniform(1, 300);
        if (option == 3) b.soft_cap = 5 + 20 * std::abs(rng.normal());
        if (option == 4) b.query_len = rng.uniform(2, 4);
        if (option == 5) b.sm_scale = 0.02f;
        StoreElements(b.q_dtype, rng.normals(size_t(b.num_seqs) * b.query_len * b.hq * D), &b.q);
        CompareDecode(twins, 1, b, b.num_seqs + 2, 1200, 4);
      }
    }
  }
}

TEST(GpuDecode, PartitionBoundariesAndLongContext) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int kd : {KVP_DTYPE_BF16, KVP_DTYPE_INT4}) {
    Geometry g;
    g.k_dtype = kd;
    g.v_dtype = kd == KVP_DTYPE_INT4 ? KVP_DTYPE_INT8 : KVP_DTYPE_BF16;
    g.num_kv_heads = 1;
    g.head_size = 128;
    g.num_layers = 1;
    // Partition sizes are powers of two from 32 to 512: lengths at each
    // boundary +-1, and one context past 32k tokens.
    std::vector<int> lens = {31,  32,  33,  63,  64,  65,   127,  128,  129,  255,
                             256, 257, 511, 512, 513, 1023, 1024, 1025, 33001};
    g.num_blocks = BlocksFor(lens, g.block_size) + 2;
    Twins twins(g, rng);
    ASSERT_EQ(twins.error(), "");
    const Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
    FillTwins(twins, rng, 0, KVP_DTYPE_BF16, l);
    Batch b;
    b.num_seqs = static_cast<int>(lens.size());
    b.hq = 8;
    b.table = l.table;
    b.lens = l.lens;
    b.width = l.width;
    StoreElements(b.q_dtype, rng.normals(size_t(b.num_seqs) * b.hq * 128), &b.q);
    CompareDecode(twins, 0, b, b.num_seqs, 33001, 1);
    CompareDecode(twins, 0, b, 64, 40000, 2);  // other capacities, other partitions
  }
}

// One decode captured in a CUDA graph, replayed with other lengths, tables
// and batch sizes (rows of length 0) within the capacities.
TEST(GpuDecode, OneGraphServesEveryBatchWithinCapacity) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_INT8;
  g.v_dtype = KVP_DTYPE_INT4;
  g.num_blocks = 400;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  const int max_seqs = 8, max_len = 1000, hq = 8, D = 128, width = max_len / 16 + 1;
  // Fill every block with data once: any table over them is valid.
  std::vector<int64_t> all_slots(g.num_blocks * 16);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  ASSERT_EQ(
      twins.Write(0, KVP_DTYPE_FP32, all_slots, rng.normals(all_slots.size() * twins.token_elems()),
                  rng.normals(all_slots.size() * twins.token_elems())),
      "");

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = max_seqs;
  dc.max_context_len = max_len;
  kvp_decoder* dec = nullptr;
  ASSERT_OK(kvp_decoder_create(twins.gpu(), &dc, &dec));
  DeviceBuffer<int32_t> table(std::vector<int32_t>(max_seqs * width, 0));
  DeviceBuffer<int32_t> lens(std::vector<int32_t>(max_seqs, 0));
  DeviceBuffer<uint8_t> q(std::vector<uint8_t>(max_seqs * hq * D * 2, 0));
  DeviceBuffer<uint8_t> out(std::vector<uint8_t>(max_seqs * hq * D * 2, 0));
  DeviceBuffer<float> lse(std::vector<float>(max_seqs * hq, 0));
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = max_seqs;
  a.q = q.get();
  a.block_table = table.get();
  a.block_table_width = width;
  a.seq_lens = lens.get();
  a.out = out.get();
  a.lse = lse.get();
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  std::string captured = TakeError(kvp_decode(dec, &a, stream));
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, "");
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 6; ++replay) {
    // A batch of 1..max_seqs real sequences; the other rows have length 0.
    const int n = rng.uniform(1, max_seqs);
    std::vector<int32_t> h_lens(max_seqs, 0), h_table(max_seqs * width, 0);
    for (int s = 0; s < n; ++s) {
      h_lens[s] = replay == 0 && s == 0 ? max_len : rng.uniform(1, max_len);
      for (int j = 0; j < width; ++j) h_table[s * width + j] = rng.uniform(0, g.num_blocks - 1);
    }
    std::vector<uint8_t> h_q;
    StoreElements(KVP_DTYPE_BF16, rng.normals(size_t(max_seqs) * hq * D), &h_q);
    lens.Assign(h_lens);
    table.Assign(h_table);
    q.Assign(h_q);
    ASSERT_CUDA(cudaMemset(out.get(), 0xFF, max_seqs * hq * D * 2));  // poison
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));

    // The same batch, eagerly on the CPU.
    kvp_decoder* cpu_dec = nullptr;
    ASSERT_OK(kvp_decoder_create(twins.cpu(), &dc, &cpu_dec));
    std::vector<uint8_t> want(max_seqs * hq * D * 2);
    std::vector<float> want_lse(max_seqs * hq);
    kvp_decode_args c = a;
    c.q = h_q.data();
    c.block_table = h_table.data();
    c.seq_lens = h_lens.data();
    c.out = want.data();
    c.lse = want_lse.data();
    ASSERT_OK(kvp_decode(cpu_dec, &c, nullptr));
    kvp_decoder_destroy(cpu_dec);
    const std::vector<uint8_t> got = out.Read(want.size());
    const std::vector<float> got_lse = lse.Read(want_lse.size());
    for (int64_t r = 0; r < max_seqs * hq; ++r) {
      double row_max = 0;
      for (int d = 0; d < D; ++d)
        row_max = std::max(row_max, std::abs(LoadElement(KVP_DTYPE_BF16, want.data(), r * D + d)));
      for (int d = 0; d < D; ++d) {
        const double w = LoadElement(KVP_DTYPE_BF16, want.data(), r * D + d);
        const double o = LoadElement(KVP_DTYPE_BF16, got.data(), r * D + d);
        ASSERT_LE(std::abs(o - w), 2 * UlpRel(KVP_DTYPE_BF16) * std::abs(w) + 1e-3 * row_max)
            << "replay " << replay << " row " << r << " d " << d;
      }
      if (std::isinf(want_lse[r])) {
        ASSERT_TRUE(std::isinf(got_lse[r])) << "replay " << replay << " row " << r;
      } else {
        ASSERT_NEAR(got_lse[r], want_lse[r], 1e-3) << "replay " << replay << " row " << r;
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  kvp_decoder_destroy(dec);
}

// A decoder on a workspace the engine owns gives the same results as one
// owning its own; too small a workspace is refused.
TEST(GpuDecode, CallerOwnedWorkspace) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_INT4;
  g.v_dtype = KVP_DTYPE_FP8_E4M3;
  std::vector<int> lens = {5, 300, 777};
  g.num_blocks = BlocksFor(lens, g.block_size) + 1;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  const Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
  FillTwins(twins, rng, 0, KVP_DTYPE_BF16, l);
  const int hq = 8, D = 128;
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = hq;
  dc.max_num_seqs = 3;
  dc.max_context_len = 800;
  uint64_t need = 0;
  ASSERT_OK(kvp_decode_workspace_size(twins.gpu(), &dc, &need));
  ASSERT_GT(need, 0u);
  void* ws = nullptr;
  ASSERT_CUDA(cudaMalloc(&ws, need));
  ASSERT_CUDA(cudaMemset(ws, 0xFF, need));  // poison: the kernels must not read stale data
  dc.workspace = ws;
  dc.workspace_bytes = need - 1;
  kvp_decoder* dec = nullptr;
  kvp_error* e = kvp_decoder_create(twins.gpu(), &dc, &dec);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(kvp_error_code(e), KVP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvp_error_message(e)).find("workspace_bytes"), std::string::npos);
  kvp_error_free(e);
  dc.workspace_bytes = need;
  kvp_decoder* own = nullptr;
  ASSERT_OK(kvp_decoder_create(twins.gpu(), &dc, &dec));
  dc.workspace = nullptr;
  dc.workspace_bytes = 0;
  ASSERT_OK(kvp_decoder_create(twins.gpu(), &dc, &own));
  std::vector<uint8_t> h_q;
  StoreElements(KVP_DTYPE_BF16, rng.normals(size_t(3) * hq * D), &h_q);
  DeviceBuffer<uint8_t> q(h_q), out_a(std::vector<uint8_t>(h_q.size(), 0xFF)),
      out_b(std::vector<uint8_t>(h_q.size(), 0xFF));
  DeviceBuffer<int32_t> table(l.table), dlens(l.lens);
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = 3;
  a.q = q.get();
  a.block_table = table.get();
  a.block_table_width = l.width;
  a.seq_lens = dlens.get();
  a.out = out_a.get();
  ASSERT_OK(kvp_decode(dec, &a, nullptr));
  a.out = out_b.get();
  ASSERT_OK(kvp_decode(own, &a, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint8_t> ra = out_a.Read(h_q.size()), rb = out_b.Read(h_q.size());
  EXPECT_EQ(ra, rb);
  for (int64_t i = 0; i < int64_t(h_q.size() / 2); ++i) {
    ASSERT_TRUE(std::isfinite(LoadElement(KVP_DTYPE_BF16, ra.data(), i))) << i;
  }
  // Decoders used in turn on one stream may share a workspace, with other
  // lengths each time (shorter ones, over the same tables).
  kvp_decoder* twin = nullptr;
  dc.workspace = ws;
  dc.workspace_bytes = need;
  ASSERT_OK(kvp_decoder_create(twins.gpu(), &dc, &twin));
  const std::vector<std::vector<int32_t>> later = {{777, 1, 513}, {0, 300, 776}, {64, 299, 777}};
  for (size_t k = 0; k < later.size(); ++k) {
    SCOPED_TRACE(absl::StrFormat("lengths %d, %d, %d", later[k][0], later[k][1], later[k][2]));
    std::vector<int32_t> lk = later[k];
    for (int s = 0; s < 3; ++s) lk[s] = std::min(lk[s], l.lens[s]);
    ASSERT_CUDA(cudaMemcpy(dlens.get(), lk.data(), 3 * sizeof(int32_t), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(out_a.get(), 0xFF, h_q.size()));
    ASSERT_CUDA(cudaMemset(out_b.get(), 0xFF, h_q.size()));
    a.out = out_a.get();
    ASSERT_OK(kvp_decode(k % 2 == 0 ? twin : dec, &a, nullptr));
    a.out = out_b.get();
    ASSERT_OK(kvp_decode(own, &a, nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = out_a.Read(h_q.size());
    EXPECT_EQ(got, out_b.Read(h_q.size()));
    // Every row written over the poison (a length-0 row with zeros).
    for (int64_t i = 0; i < int64_t(h_q.size() / 2); ++i) {
      ASSERT_TRUE(std::isfinite(LoadElement(KVP_DTYPE_BF16, got.data(), i))) << i;
    }
  }
  kvp_decoder_destroy(dec);
  kvp_decoder_destroy(twin);
  kvp_decoder_destroy(own);
  cudaFree(ws);
}

TEST(GpuCache, ForkSwapAndNonFiniteContainment) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_FP8_E4M3;
  g.v_dtype = KVP_DTYPE_INT4;
  g.block_size = 8;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  // The same sequence operations on both caches: fork, then the child's
  // append copies the shared partial block (copy-on-write on the GPU).
  for (kvp_cache* c : {twins.cpu(), twins.gpu()}) {
    int64_t parent = 0, child = 0;
    std::vector<int64_t> slots(13);
    ASSERT_OK(kvp_seq_create(c, &parent));
    ASSERT_OK(kvp_seq_append(c, parent, 13, slots.data(), nullptr));
    ASSERT_OK(kvp_seq_fork(c, parent, &child));
    (void)child;
  }
  Rng same(rng.seed + 1);
  std::vector<int64_t> slots(13);
  std::iota(slots.begin(), slots.end(), 0);  // blocks 0 and 1, as allocated
  ASSERT_EQ(twins.Write(0, KVP_DTYPE_FP32, slots, same.normals(13 * twins.token_elems()),
                        same.normals(13 * twins.token_elems())),
            "");
  for (kvp_cache* c : {twins.cpu(), twins.gpu()}) {
    std::vector<int64_t> child_slots(2);
    ASSERT_OK(kvp_seq_append(c, 2, 2, child_slots.data(), nullptr));
    EXPECT_EQ(child_slots[0], 2 * 8 + 5);  // block 2, the copy
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  twins.ExpectSameBytes();

  // Non-finite values in one token are stored as 0 and counted, on both.
  std::vector<float> k = rng.normals(twins.token_elems()), v = rng.normals(twins.token_elems());
  k[1] = std::numeric_limits<float>::quiet_NaN();
  v[2] = -std::numeric_limits<float>::infinity();
  ASSERT_EQ(twins.Write(1, KVP_DTYPE_FP32, {40}, k, v), "");
  twins.ExpectSameBytes();

  // Swap blocks 0..2 of every layer out to a CPU cache and back in.
  kvp_cache_config cfg = CpuConfig(g);
  cfg.num_blocks = 5;
  kvp_cache* swap = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &swap));
  const int32_t out_pairs[] = {0, 4, 1, 3, 2, 0};
  ASSERT_OK(kvp_cache_transfer_blocks(swap, twins.gpu(), out_pairs, 3, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const DequantizedLayer from_swap = DequantizedLayer::Read(swap, 0);
  const DequantizedLayer from_cpu = DequantizedLayer::Read(twins.cpu(), 0);
  for (int t = 0; t < 8; ++t) {
    for (int d = 0; d < g.head_size; ++d) {
      ASSERT_EQ(from_swap.k(4, 1, t, d), from_cpu.k(0, 1, t, d));
      ASSERT_EQ(from_swap.v(0, 0, t, d), from_cpu.v(2, 0, t, d));
    }
  }
  const int32_t in_pairs[] = {4, 10, 3, 11};
  ASSERT_OK(kvp_cache_transfer_blocks(twins.gpu(), swap, in_pairs, 2, nullptr));
  ASSERT_OK(
      kvp_cache_copy_blocks(twins.cpu(), std::vector<int32_t>{0, 10, 1, 11}.data(), 2, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  twins.ExpectSameBytes();
  kvp_cache_destroy(swap);
}

// A cache is bound to its device: every call on it works from a thread
// whose current device is another one and leaves that device current
// (with two GPUs or more: the cache on the last, the calls from device 0;
// with one, the same calls from the cache's own device). Sequences with
// copy-on-write, writes, a decode, block copies and a swap, each checked
// against the CPU backend; the test's own buffers live on the cache's
// device, as an engine's inputs for that cache do.
TEST(GpuCache, EveryCallFromAnotherCurrentDevice) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  Geometry g;
  g.k_dtype = KVP_DTYPE_INT8;
  g.v_dtype = KVP_DTYPE_INT4;
  g.device_ordinal = GpuCount() - 1;
  g.calling_device = 0;
  SCOPED_TRACE(absl::StrFormat("seed=%d; cache on device %d of %d, calls from device %d", rng.seed,
                               g.device_ordinal, GpuCount(), g.calling_device));
  // The next test finds the current device this one found, pass or fail.
  struct RestoreDevice {
    int ordinal = 0;
    RestoreDevice() { cudaGetDevice(&ordinal); }
    ~RestoreDevice() { cudaSetDevice(ordinal); }
  } restore;
  ASSERT_CUDA(cudaSetDevice(g.device_ordinal));
  {
    Twins twins(g, rng);
    ASSERT_EQ(twins.error(), "");
    kvp_cache* const caches[2] = {twins.cpu(), twins.gpu()};
    auto call = [&](int c, auto f) { return c == 1 ? twins.OnGpu(f) : TakeError(f()); };
    // A parent of 37 tokens, written; a fork whose append copies the shared
    // partial block (the block-copy kernel on the GPU); the child's tokens.
    int64_t parent[2] = {0, 0}, child[2] = {0, 0};
    std::vector<int64_t> slots[2], child_slots[2];
    for (int c = 0; c < 2; ++c) {
      slots[c].resize(37);
      ASSERT_EQ(call(c, [&] { return kvp_seq_create(caches[c], &parent[c]); }), "");
      ASSERT_EQ(
          call(c,
               [&] { return kvp_seq_append(caches[c], parent[c], 37, slots[c].data(), nullptr); }),
          "");
    }
    ASSERT_EQ(slots[0], slots[1]);
    ASSERT_EQ(twins.Write(0, KVP_DTYPE_BF16, slots[0], rng.normals(37 * twins.token_elems()),
                          rng.normals(37 * twins.token_elems())),
              "");
    for (int c = 0; c < 2; ++c) {
      child_slots[c].resize(2);
      ASSERT_EQ(call(c, [&] { return kvp_seq_fork(caches[c], parent[c], &child[c]); }), "");
      ASSERT_EQ(call(c,
                     [&] {
                       return kvp_seq_append(caches[c], child[c], 2, child_slots[c].data(),
                                             nullptr);
                     }),
                "");
    }
    ASSERT_EQ(child_slots[0], child_slots[1]);
    EXPECT_NE(child_slots[0][0] / g.block_size, slots[0][32] / g.block_size);  // the copy
    ASSERT_EQ(twins.Write(0, KVP_DTYPE_FP16, child_slots[0], rng.normals(2 * twins.token_elems()),
                          rng.normals(2 * twins.token_elems())),
              "");
    ASSERT_CUDA(cudaDeviceSynchronize());
    twins.ExpectSameBytes();

    // Both sequences decoded through the tables the caches export.
    Batch b;
    b.num_seqs = 2;
    b.hq = g.num_kv_heads * 4;
    b.width = 3;
    b.table.resize(6);
    b.lens.resize(2);
    std::vector<int32_t> gpu_table(6), gpu_lens(2);
    const int64_t cpu_ids[] = {parent[0], child[0]}, gpu_ids[] = {parent[1], child[1]};
    ASSERT_OK(
        kvp_cache_export_block_table(twins.cpu(), cpu_ids, 2, 3, 3, b.table.data(), b.lens.data()));
    ASSERT_EQ(twins.OnGpu([&] {
      return kvp_cache_export_block_table(twins.gpu(), gpu_ids, 2, 3, 3, gpu_table.data(),
                                          gpu_lens.data());
    }),
              "");
    EXPECT_EQ(gpu_table, b.table);
    EXPECT_EQ(b.lens, (std::vector<int32_t>{37, 39}));
    StoreElements(b.q_dtype, rng.normals(size_t(b.num_seqs) * b.hq * g.head_size), &b.q);
    CompareDecode(twins, 0, b, 2, 64, 1);

    // Block copies (every layer), then a swap out to a CPU cache and back in.
    const int32_t first = static_cast<int32_t>(slots[0][0] / g.block_size);
    const int32_t copied = static_cast<int32_t>(child_slots[0][0] / g.block_size);
    const std::vector<int32_t> pairs = {first, 40, copied, 41};
    const DeviceBuffer<int32_t> device_pairs(pairs);  // in the GPU cache's memory space
    ASSERT_OK(kvp_cache_copy_blocks(twins.cpu(), pairs.data(), 2, nullptr));
    ASSERT_EQ(twins.OnGpu([&] {
      return kvp_cache_copy_blocks(twins.gpu(), device_pairs.get(), 2, nullptr);
    }),
              "");
    ASSERT_CUDA(cudaDeviceSynchronize());
    twins.ExpectSameBytes();
    kvp_cache_config cfg = CpuConfig(g);  // swap space of two blocks
    cfg.num_blocks = 2;
    kvp_cache* swap = nullptr;
    ASSERT_OK(kvp_cache_create(&cfg, &swap));
    const int32_t out_pairs[] = {40, 1, 41, 0};
    ASSERT_EQ(twins.OnGpu([&] {
      return kvp_cache_transfer_blocks(swap, twins.gpu(), out_pairs, 2, nullptr);
    }),
              "");
    ASSERT_CUDA(cudaDeviceSynchronize());
    for (int l = 0; l < g.num_layers; ++l) {
      const DequantizedLayer from_swap = DequantizedLayer::Read(swap, l);
      const DequantizedLayer from_cpu = DequantizedLayer::Read(twins.cpu(), l);
      for (int h = 0; h < g.num_kv_heads; ++h) {
        for (int t = 0; t < g.block_size; ++t) {
          for (int d = 0; d < g.head_size; ++d) {
            ASSERT_EQ(from_swap.k(1, h, t, d), from_cpu.k(40, h, t, d))
                << l << " " << h << " " << t;
            ASSERT_EQ(from_swap.v(0, h, t, d), from_cpu.v(41, h, t, d))
                << l << " " << h << " " << t;
          }
        }
      }
    }
    const int32_t in_pairs[] = {1, 50, 0, 51};
    ASSERT_EQ(twins.OnGpu([&] {
      return kvp_cache_transfer_blocks(twins.gpu(), swap, in_pairs, 2, nullptr);
    }),
              "");
    ASSERT_OK(kvp_cache_copy_blocks(twins.cpu(), std::vector<int32_t>{40, 50, 41, 51}.data(), 2,
                                    nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    twins.ExpectSameBytes();
    kvp_cache_destroy(swap);
  }

  // Creating and destroying from the calling device leave it current too.
  ASSERT_CUDA(cudaSetDevice(g.calling_device));
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.device_ordinal = g.device_ordinal;
  cfg.num_blocks = 16;
  cfg.num_kv_heads = 1;
  kvp_cache* cache = nullptr;
  ASSERT_OK(kvp_cache_create(&cfg, &cache));
  int now = -1;
  ASSERT_CUDA(cudaGetDevice(&now));
  EXPECT_EQ(now, g.calling_device);
  kvp_cache_destroy(cache);
  ASSERT_CUDA(cudaGetDevice(&now));
  EXPECT_EQ(now, g.calling_device);
}

// ---- The precision contract (docs/ACCURACY.md, "What each path rounds") --

// What a GPU decode's FP32 output and LSE are off by, against float64
// attention over the dequantized cache.
struct DecodeErrors {
  double out_rel_l2 = 0;  // ||out - ref|| / ||ref|| over every row
  double lse_err = 0;     // max |lse - ref| / (1 + |ref|)
  double lse_max = 0;     // max |ref lse|
};

// Runs `b` (FP32 q and out, LSE on) through a decoder of the GPU cache,
// precise or not, and measures it against the float64 reference.
DecodeErrors MeasureDecode(const Twins& twins, const Batch& b, int max_context_len, int precise) {
  DecodeErrors e;
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = b.hq;
  dc.max_num_seqs = b.num_seqs;
  dc.max_context_len = max_context_len;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  dc.precise = precise;
  kvp_decoder* dec = nullptr;
  EXPECT_EQ(twins.OnGpu([&] { return kvp_decoder_create(twins.gpu(), &dc, &dec); }), "");
  if (dec == nullptr) return e;
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  EXPECT_EQ(TakeError(kvp_cache_get_info(twins.cpu(), &info)), "");
  const int D = info.head_size;
  const size_t rows = size_t(b.num_seqs) * b.hq;
  DeviceBuffer<uint8_t> dq(b.q);
  DeviceBuffer<int32_t> dtable(b.table), dlens(b.lens);
  DeviceBuffer<float> dout(std::vector<float>(rows * D, std::nanf(""))),
      dlse(std::vector<float>(rows, std::nanf("")));
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = b.num_seqs;
  a.sm_scale = b.sm_scale;
  a.q = dq.get();
  a.block_table = dtable.get();
  a.block_table_width = b.width;
  a.seq_lens = dlens.get();
  a.out = dout.get();
  a.lse = dlse.get();
  EXPECT_EQ(twins.OnGpu([&] { return kvp_decode(dec, &a, nullptr); }), "");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  kvp_decoder_destroy(dec);
  const std::vector<float> out = dout.Read(rows * D), lse = dlse.Read(rows);

  DecodeProblem p;
  p.num_seqs = b.num_seqs;
  p.num_q_heads = b.hq;
  p.head_size = D;
  p.q_dtype = KVP_DTYPE_FP32;
  p.q = b.q;
  p.block_table = b.table;
  p.block_table_width = b.width;
  p.seq_lens = b.lens;
  p.sm_scale = b.sm_scale;
  std::vector<double> ref_out, ref_lse;
  ReferenceDecode(DequantizedLayer::Read(twins.cpu(), 0), p, &ref_out, &ref_lse);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) {
    num += (out[i] - ref_out[i]) * (out[i] - ref_out[i]);
    den += ref_out[i] * ref_out[i];
  }
  e.out_rel_l2 = std::isfinite(num) ? std::sqrt(num / den) : INFINITY;
  for (size_t r = 0; r < rows; ++r) {
    const double err = std::abs(lse[r] - ref_lse[r]) / (1 + std::abs(ref_lse[r]));
    e.lse_err = std::isfinite(err) ? std::max(e.lse_err, err) : INFINITY;
    e.lse_max = std::max(e.lse_max, std::abs(ref_lse[r]));
  }
  return e;
}

// Every kernel the plan can choose, on data that stresses each rounding
// (Gaussian; a peaked softmax; logits past 100, as in the cascade
// example; a 32k context), in default and precise mode, against the bounds
// docs/ACCURACY.md states. Prints the measured errors (the document's table
// is made from them by bench/accuracy.py on the same data).
TEST(GpuDecode, PrecisionContract) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  struct Path {
    const char* kernel;  // what the plan runs in default mode (docs/DESIGN.md)
    int dtype, block_size, hq;
    double out_bound, lse_bound;  // default mode; precise mode: kPrecise*
  };
  // Bounds (include/kvpage/kvpage.h, docs/ACCURACY.md): FP32 output rel-L2
  // and LSE error / (1 + |LSE|), about 4x the largest measured on an H100
  // over these data. The 16-bit caches' tensor-core kernels split q and P
  // into hi + lo 16-bit parts; the quantized caches' round both to FP16.
  const Path paths[] = {
      {"thread-group (MHA BF16)", KVP_DTYPE_BF16, 16, 1, 2e-5, 2e-5},
      {"tensor-core staged (BF16)", KVP_DTYPE_BF16, 16, 8, 2e-5, 5e-5},
      {"tensor-core registers (FP16, block 32)", KVP_DTYPE_FP16, 32, 8, 2e-5, 5e-5},
      {"tensor-core registers (FP8)", KVP_DTYPE_FP8_E4M3, 16, 8, 3e-3, 1.5e-2},
      {"tensor-core registers (INT8)", KVP_DTYPE_INT8, 16, 8, 3e-3, 1.5e-2},
      {"tensor-core ring (INT4)", KVP_DTYPE_INT4, 16, 8, 3e-3, 1.5e-2},
  };
  constexpr double kPreciseOut = 2e-5, kPreciseLse = 2e-5;
  enum Data { kGaussian, kPeaked, kLargeLogits, kLongContext };
  const char* data_names[] = {"gaussian", "peaked", "large logits", "32k context"};
  for (const Path& path : paths) {
    for (int data : {kGaussian, kPeaked, kLargeLogits, kLongContext}) {
      SCOPED_TRACE(absl::StrFormat("%s, %s", path.kernel, data_names[data]));
      Geometry g;
      g.k_dtype = g.v_dtype = path.dtype;
      g.block_size = path.block_size;
      g.num_kv_heads = 2;
      g.num_layers = 1;
      const std::vector<int> lens =
          data == kLongContext ? std::vector<int>{32768} : std::vector<int>{2048, 517, 1};
      g.num_blocks = BlocksFor(lens, g.block_size) + 2;
      Twins twins(g, rng);
      ASSERT_EQ(twins.error(), "");
      const Layout l = RandomLayout(rng, lens, g.block_size, g.num_blocks);
      const int D = g.head_size;
      std::vector<float> k = rng.normals(l.slots.size() * twins.token_elems());
      std::vector<float> v = rng.normals(l.slots.size() * twins.token_elems());
      Batch b;
      b.num_seqs = static_cast<int>(lens.size());
      b.hq = path.hq * g.num_kv_heads;
      b.table = l.table;
      b.lens = l.lens;
      b.width = l.width;
      std::vector<float> q =
          rng.normals(size_t(b.num_seqs) * b.hq * D, data == kPeaked ? 6.0f : 1.0f);
      if (data == kLargeLogits) {
        // Channel 0 of every key 30 (plus noise), of every query 40: logits
        // near 106 at the default scale, where 16-bit q costs 2^-11 of them.
        for (size_t t = 0; t < k.size(); t += D) k[t] = 30.0f + rng.normal(0.5f);
        for (size_t t = 0; t < q.size(); t += D) q[t] = 40.0f + rng.normal(1.0f);
      }
      ASSERT_EQ(twins.Write(0, KVP_DTYPE_FP32, l.slots, k, v), "");
      StoreElements(KVP_DTYPE_FP32, q, &b.q);
      const int ctx = lens[0];
      const DecodeErrors fast = MeasureDecode(twins, b, ctx, 0);
      const DecodeErrors precise = MeasureDecode(twins, b, ctx, 1);
      std::printf(
          "precision | %-40s | %-12s | |lse| <= %6.1f | default out %.2e lse %.2e | "
          "precise out %.2e lse %.2e\n",
          path.kernel, data_names[data], fast.lse_max, fast.out_rel_l2, fast.lse_err,
          precise.out_rel_l2, precise.lse_err);
      EXPECT_LE(fast.out_rel_l2, path.out_bound);
      EXPECT_LE(fast.lse_err, path.lse_bound);
      EXPECT_LE(precise.out_rel_l2, kPreciseOut);
      EXPECT_LE(precise.lse_err, kPreciseLse);
    }
  }
}

// The minimal case: an INT8 cache of 2 tokens, q = 1 + 2^-12 in
// every channel, FP32 q and out. The tensor-core path rounds q to FP16 (the
// result equals that of q = 1); precise mode sees the difference, and its
// LSE is within FP32 rounding of float64's.
TEST(GpuDecode, PreciseModeKeepsFp32Queries) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.num_kv_heads = 1;
  g.num_layers = 1;
  g.num_blocks = 4;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  const Layout l = RandomLayout(rng, {2}, g.block_size, g.num_blocks);
  // Keys all positive, so that q's lost 2^-12 moves every logit by at least
  // 2^-12 * 64 * 0.5 / 16 (a sum of random signs could cancel it).
  std::vector<float> k = rng.normals(2 * 128);
  for (float& x : k) x = 0.5f + std::abs(x);
  ASSERT_EQ(twins.Write(0, KVP_DTYPE_FP32, l.slots, k, rng.normals(2 * 128)), "");
  Batch b;
  b.num_seqs = 1;
  b.hq = 8;  // a GQA group of 8: the tensor-core kernel in default mode
  b.table = l.table;
  b.lens = l.lens;
  b.width = l.width;
  b.sm_scale = 1.0f / 16;
  StoreElements(KVP_DTYPE_FP32, std::vector<float>(8 * 128, 1.0f + std::ldexp(1.0f, -12)), &b.q);
  const DecodeErrors fast = MeasureDecode(twins, b, 2, 0);
  const DecodeErrors precise = MeasureDecode(twins, b, 2, 1);
  std::printf("minimal case: default lse err %.2e, precise lse err %.2e\n", fast.lse_err,
              precise.lse_err);
  EXPECT_LE(precise.lse_err, 2e-5);
  EXPECT_LE(precise.out_rel_l2, 2e-5);
  // The default path's rounding of q shows in the LSE: what precise mode
  // is for.
  EXPECT_GT(fast.lse_err, 10 * precise.lse_err);
}

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace testing
}  // namespace kvpage
