// SPDX-License-Identifier: Apache-2.0
// kvp_cache_pack / kvp_cache_unpack on the CUDA backend, against the CPU
// backend: a sequence's blocks moved CPU -> GPU -> CPU come back byte for
// byte; a GPU cache and a CPU cache fed the same writes pack the same
// bytes; a CUDA graph captures a pack and an unpack once and serves other
// blocks on every replay; checked mode reports bad device-side ids; bad
// arguments change nothing; two GPUs move blocks through device memory.
// Every test skips itself where no GPU is present.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/capi/gpu_twins.h"
#include "tests/capi/pack_helpers.h"
#include "tests/common/reference.h"
#include "tests/common/test_matrix.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvpage {
namespace testing {
namespace {

#if KVPAGE_HAVE_CUDA

void DeviceRead(void* dst, const void* src, size_t n) {
  cudaDeviceSynchronize();
  cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}

// A cache of geometry g with `num_blocks` blocks on the CPU or GPU
// `ordinal` (key smoothing from `smoothing` where given).
kvp_cache* MakeCache(Geometry g, int num_blocks, int device, const std::vector<float>& smoothing,
                     std::string* err, bool checked = false) {
  g.num_blocks = num_blocks;
  kvp_cache_config cfg = CpuConfig(g);
  if (!smoothing.empty()) cfg.key_smoothing = smoothing.data();
  if (device >= 0) {
    cfg.device_kind = KVP_DEVICE_CUDA;
    cfg.device_ordinal = device;
  }
  cfg.checked = checked ? 1 : 0;
  kvp_cache* c = nullptr;
  *err = TakeError(kvp_cache_create(&cfg, &c));
  return c;
}

uint64_t PackSize(const kvp_cache* c, int n, int layers) {
  uint64_t bytes = 0;
  EXPECT_EQ(TakeError(kvp_cache_pack_size(c, n, layers, &bytes)), "");
  return bytes;
}

// A sequence's blocks from a CPU cache into a GPU cache of another size
// (device-side ids it chose) and from there into a second CPU cache: the
// bytes never change, for every K/V dtype pair, with and without key
// smoothing; the GPU's pack is the CPU's byte for byte.
TEST(GpuPack, CpuToGpuToCpuKeepsEveryByte) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  for (int k_dtype : kKvDtypes) {
    for (int v_dtype : kKvDtypes) {
      Geometry g;
      g.k_dtype = k_dtype;
      g.v_dtype = v_dtype;
      g.num_layers = rng.uniform(1, 3);
      g.head_size = kHeadSizes[rng.uniform(0, kNumHeadSizes - 1)];
      g.block_size = kBlockSizes[rng.uniform(0, 2)];
      g.num_kv_heads = rng.uniform(1, 4);
      std::vector<float> lambda;
      if (rng.uniform(0, 1) == 1) {
        for (int i = 0; i < g.num_kv_heads * g.head_size; ++i) {
          lambda.push_back(std::exp(rng.normal(0.5f)));
        }
      }
      SCOPED_TRACE(absl::StrFormat("K %s V %s layers %d head_size %d block_size %d heads %d%s",
                                   DtypeName(k_dtype), DtypeName(v_dtype), g.num_layers,
                                   g.head_size, g.block_size, g.num_kv_heads,
                                   lambda.empty() ? "" : " smoothed"));
      std::string e1, e2, e3;
      kvp_cache* src = MakeCache(g, 20, -1, lambda, &e1);
      kvp_cache* gpu = MakeCache(g, 50, 0, lambda, &e2);
      kvp_cache* back = MakeCache(g, 30, -1, lambda, &e3);
      ASSERT_EQ(e1 + e2 + e3, "");
      ASSERT_EQ(FillEveryBlock(src, rng), "");
      ASSERT_EQ(FillEveryBlock(back, rng), "");
      const int n = rng.uniform(1, 20);
      const std::vector<int32_t> src_ids = DistinctIds(rng, n, 20);
      const std::vector<int32_t> gpu_ids = DistinctIds(rng, n, 50);
      const std::vector<int32_t> back_ids = DistinctIds(rng, n, 30);
      const uint64_t bytes = PackSize(src, n, 0);
      AlignedBytes host(bytes);
      kvp_pack_args a = PackArgs(src_ids.data(), n, 0, 0, host.data(), bytes);
      ASSERT_OK(kvp_cache_pack(src, &a, nullptr));

      DeviceBuffer<uint8_t> dbuf(host.bytes()), dbuf2(std::vector<uint8_t>(bytes, 0xCD));
      DeviceBuffer<int32_t> dids(gpu_ids);
      const Blocks gpu_before = ReadBlocks(gpu, DeviceRead);
      a = PackArgs(dids.get(), n, 0, 0, dbuf.get(), bytes);
      ASSERT_OK(kvp_cache_unpack(gpu, &a, nullptr));
      const Blocks from = ReadBlocks(src, HostRead);
      EXPECT_EQ(FirstDifference(ExpectedUnpack(gpu_before, from, src_ids, gpu_ids, 0, g.num_layers),
                                ReadBlocks(gpu, DeviceRead)),
                "");
      a = PackArgs(dids.get(), n, 0, 0, dbuf2.get(), bytes);
      ASSERT_OK(kvp_cache_pack(gpu, &a, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      AlignedBytes round(bytes);
      ASSERT_CUDA(cudaMemcpy(round.data(), dbuf2.get(), bytes, cudaMemcpyDeviceToHost));
      ASSERT_TRUE(round.bytes() == host.bytes()) << "the GPU packed other bytes";

      const Blocks back_before = ReadBlocks(back, HostRead);
      a = PackArgs(back_ids.data(), n, 0, 0, round.data(), bytes);
      ASSERT_OK(kvp_cache_unpack(back, &a, nullptr));
      EXPECT_EQ(
          FirstDifference(ExpectedUnpack(back_before, from, src_ids, back_ids, 0, g.num_layers),
                          ReadBlocks(back, HostRead)),
          "");
      kvp_cache_destroy(src);
      kvp_cache_destroy(gpu);
      kvp_cache_destroy(back);
      if (HasFailure()) return;
    }
  }
}

// A GPU cache and a CPU cache fed the same writes pack the same bytes, for
// every layer range.
TEST(GpuPack, TwinsPackTheSameBytes) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_FP8_E4M3;
  g.v_dtype = KVP_DTYPE_INT4;
  g.num_layers = 3;
  g.smoothing = true;
  Twins twins(g, rng);
  ASSERT_EQ(twins.error(), "");
  std::vector<int64_t> slots(g.num_blocks * g.block_size);
  std::iota(slots.begin(), slots.end(), 0);
  for (int l = 0; l < g.num_layers; ++l) {
    ASSERT_EQ(twins.Write(l, KVP_DTYPE_BF16, slots, rng.normals(slots.size() * twins.token_elems()),
                          rng.normals(slots.size() * twins.token_elems())),
              "");
  }
  std::vector<int32_t> ids(37);
  for (int32_t& id : ids) id = rng.uniform(0, g.num_blocks - 1);  // repeats allowed
  DeviceBuffer<int32_t> dids(ids);
  for (int first = 0; first < g.num_layers; ++first) {
    for (int count = 0; count <= g.num_layers - first; ++count) {
      SCOPED_TRACE(absl::StrFormat("layers from %d, num_layers %d", first, count));
      const uint64_t bytes = PackSize(twins.cpu(), 37, count == 0 ? g.num_layers - first : count);
      AlignedBytes host(bytes);
      kvp_pack_args a = PackArgs(ids.data(), 37, first, count, host.data(), bytes);
      ASSERT_OK(kvp_cache_pack(twins.cpu(), &a, nullptr));
      DeviceBuffer<uint8_t> dbuf(std::vector<uint8_t>(bytes, 0x3C));
      a = PackArgs(dids.get(), 37, first, count, dbuf.get(), bytes);
      ASSERT_EQ(twins.OnGpu([&] { return kvp_cache_pack(twins.gpu(), &a, nullptr); }), "");
      ASSERT_CUDA(cudaDeviceSynchronize());
      ASSERT_TRUE(dbuf.Read(bytes) == host.bytes());
    }
  }
}

// One capture of a layer's pack (cache A) and unpack (cache B) on a
// stream; each replay moves the blocks the device-side id arrays name at
// that moment, after new writes to A.
TEST(GpuPack, OneGraphServesEveryTransfer) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_INT8;
  g.v_dtype = KVP_DTYPE_INT8;
  g.num_layers = 2;
  std::string e1, e2;
  kvp_cache* a_cache = MakeCache(g, 64, 0, {}, &e1);
  kvp_cache* b_cache = MakeCache(g, 96, 0, {}, &e2);
  ASSERT_EQ(e1 + e2, "");
  const int n = 16;
  DeviceBuffer<int32_t> src_ids(std::vector<int32_t>(n, 0)), dst_ids(std::vector<int32_t>(n, 0));
  const uint64_t layer_bytes = PackSize(a_cache, n, 1);
  DeviceBuffer<uint8_t> buf(std::vector<uint8_t>(layer_bytes, 0));
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  std::string captured;
  for (int l = 0; l < g.num_layers && captured.empty(); ++l) {
    const kvp_pack_args p = PackArgs(src_ids.get(), n, l, 1, buf.get(), layer_bytes);
    const kvp_pack_args u = PackArgs(dst_ids.get(), n, l, 1, buf.get(), layer_bytes);
    // Two statements: the operands of one `+` may be evaluated (and so
    // captured) in either order, the unpack before the pack.
    captured = TakeError(kvp_cache_pack(a_cache, &p, stream));
    if (captured.empty()) captured = TakeError(kvp_cache_unpack(b_cache, &u, stream));
  }
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, "");
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    // New contents for A (through a CPU twin of the same bytes) and new ids.
    std::vector<int64_t> slots(64 * g.block_size);
    std::iota(slots.begin(), slots.end(), 0);
    for (int l = 0; l < g.num_layers; ++l) {
      std::vector<uint8_t> k, v;
      StoreElements(KVP_DTYPE_BF16, rng.normals(slots.size() * 2 * 128), &k);
      StoreElements(KVP_DTYPE_BF16, rng.normals(slots.size() * 2 * 128), &v);
      DeviceBuffer<uint8_t> dk(k), dv(v);
      DeviceBuffer<int64_t> ds(slots);
      kvp_write_args w;
      kvp_write_args_init(&w);
      w.layer = l;
      w.num_tokens = static_cast<int32_t>(slots.size());
      w.key = dk.get();
      w.value = dv.get();
      w.slot_mapping = ds.get();
      ASSERT_OK(kvp_cache_write(a_cache, &w, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
    }
    std::vector<int32_t> src(n);
    for (int32_t& id : src) id = rng.uniform(0, 63);
    const std::vector<int32_t> dst = DistinctIds(rng, n, 96);
    src_ids.Assign(src);
    dst_ids.Assign(dst);
    ASSERT_CUDA(cudaDeviceSynchronize());  // the copies are done before the replay reads them
    const Blocks a_blocks = ReadBlocks(a_cache, DeviceRead);
    const Blocks b_before = ReadBlocks(b_cache, DeviceRead);
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(FirstDifference(ExpectedUnpack(b_before, a_blocks, src, dst, 0, g.num_layers),
                              ReadBlocks(b_cache, DeviceRead)),
              "")
        << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  kvp_cache_destroy(a_cache);
  kvp_cache_destroy(b_cache);
}

// Checked mode: a device-side id out of range moves nothing for that
// block, the others move, and the next call reports it; an unpack
// destination listed twice is reported too.
TEST(GpuPack, CheckedModeReportsBadDeviceIds) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  std::string e1, e2;
  kvp_cache* src = MakeCache(g, 32, 0, {}, &e1, /*checked=*/true);
  kvp_cache* dst = MakeCache(g, 32, 0, {}, &e2, /*checked=*/true);
  ASSERT_EQ(e1 + e2, "");
  const std::vector<int32_t> bad = {4, 5, 32, 7};  // 32 is out of range
  DeviceBuffer<int32_t> ids(bad);
  const uint64_t bytes = PackSize(src, 4, 0);
  DeviceBuffer<uint8_t> buf(std::vector<uint8_t>(bytes, 0x11));
  kvp_pack_args a = PackArgs(ids.get(), 4, 0, 0, buf.get(), bytes);
  ASSERT_OK(kvp_cache_pack(src, &a, nullptr));  // the host cannot see the id
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint8_t> packed = buf.Read(bytes);
  kvp_layer_layout lay;
  kvp_layer_layout_init(&lay);
  ASSERT_OK(kvp_cache_get_layout(src, 0, &lay));
  const size_t k = static_cast<size_t>(lay.k_block_stride);
  // Layer 0's K data part: item 0 holds block 4 (zeros: never written),
  // item 2 was skipped (the buffer's 0x11 bytes stay).
  EXPECT_TRUE(std::all_of(packed.begin(), packed.begin() + k, [](uint8_t x) { return x == 0; }));
  EXPECT_TRUE(std::all_of(packed.begin() + 2 * k, packed.begin() + 3 * k,
                          [](uint8_t x) { return x == 0x11; }));
  std::string err = TakeError(kvp_cache_pack(src, &a, nullptr));
  EXPECT_NE(err.find("block_ids[2] = 32"), std::string::npos) << err;
  EXPECT_NE(err.find("checked mode"), std::string::npos) << err;

  ids.Assign(std::vector<int32_t>{9, 10, 9, 11});
  a = PackArgs(ids.get(), 4, 0, 0, buf.get(), bytes);
  ASSERT_OK(kvp_cache_unpack(dst, &a, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  err = TakeError(kvp_cache_unpack(dst, &a, nullptr));
  EXPECT_NE(err.find("block_ids[2] = 9"), std::string::npos) << err;
  EXPECT_NE(err.find("block_ids[0]"), std::string::npos) << err;
  // Reported once; good ids then run clean.
  ids.Assign(std::vector<int32_t>{9, 10, 12, 11});
  ASSERT_OK(kvp_cache_unpack(dst, &a, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_OK(kvp_cache_unpack(dst, &a, nullptr));
  kvp_cache_destroy(src);
  kvp_cache_destroy(dst);
}

// Bad arguments on a GPU cache: refused before anything moves; the device
// buffer and the cache keep their bytes.
TEST(GpuPack, BadArgumentsChangeNothing) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  Geometry g;
  std::string e1, e2;
  kvp_cache* gpu = MakeCache(g, 32, 0, {}, &e1);
  g.k_dtype = KVP_DTYPE_FP8_E4M3;
  kvp_cache* other = MakeCache(g, 32, -1, {}, &e2);
  ASSERT_EQ(e1 + e2, "");
  const std::vector<uint8_t> other_sig = SignatureOf(other);
  const std::vector<int32_t> good = {1, 2, 3};
  DeviceBuffer<int32_t> ids(good);
  const uint64_t bytes = PackSize(gpu, 3, 0);
  std::vector<uint8_t> poison(bytes + 64);
  for (uint8_t& x : poison) x = static_cast<uint8_t>(rng.uniform(0, 255));
  DeviceBuffer<uint8_t> buf(poison);
  const Blocks before = ReadBlocks(gpu, DeviceRead);
  struct Case {
    const char* what;
    kvp_pack_args a;
    const char* needle;
  };
  const kvp_pack_args base = PackArgs(ids.get(), 3, 0, 0, buf.get(), bytes);
  std::vector<Case> cases;
  auto add = [&](const char* what, auto mutate, const char* needle) {
    kvp_pack_args a = base;
    mutate(&a);
    cases.push_back({what, a, needle});
  };
  add(
      "buffer_bytes short", [&](kvp_pack_args* a) { a->buffer_bytes = bytes - 16; },
      "buffer_bytes");
  add(
      "misaligned", [&](kvp_pack_args* a) { a->buffer = buf.get() + 4; }, "aligned");
  add(
      "buffer NULL", [](kvp_pack_args* a) { a->buffer = nullptr; }, "buffer");
  add(
      "block_ids NULL", [](kvp_pack_args* a) { a->block_ids = nullptr; }, "block_ids");
  add(
      "first_layer", [](kvp_pack_args* a) { a->first_layer = 2; }, "first_layer");
  add(
      "num_layers", [](kvp_pack_args* a) { a->num_layers = 3; }, "num_layers");
  add(
      "signature", [&](kvp_pack_args* a) { a->signature = other_sig.data(); }, "k_dtype");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(TakeError(kvp_cache_pack(gpu, &c.a, nullptr)).find(c.needle), std::string::npos);
    EXPECT_NE(TakeError(kvp_cache_unpack(gpu, &c.a, nullptr)).find(c.needle), std::string::npos);
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(buf.Read(poison.size()) == poison) << "a failed pack wrote into the buffer";
  EXPECT_EQ(FirstDifference(before, ReadBlocks(gpu, DeviceRead)), "");
  kvp_cache_destroy(gpu);
  kvp_cache_destroy(other);
}

// Two GPUs: packed on one, copied peer to peer, unpacked on the other.
TEST(GpuPack, BetweenTwoGpus) {
  SKIP_WITHOUT_GPU();
  if (GpuCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  Rng rng;
  SCOPED_TRACE(absl::StrFormat("seed=%d", rng.seed));
  Geometry g;
  g.k_dtype = KVP_DTYPE_BF16;
  g.v_dtype = KVP_DTYPE_INT4;
  std::string e0, e1, e2;
  kvp_cache* cpu = MakeCache(g, 24, -1, {}, &e0);
  kvp_cache* gpu0 = MakeCache(g, 24, 0, {}, &e1);
  kvp_cache* gpu1 = MakeCache(g, 40, 1, {}, &e2);
  ASSERT_EQ(e0 + e1 + e2, "");
  ASSERT_EQ(FillEveryBlock(cpu, rng), "");
  const std::vector<int32_t> all = DistinctIds(rng, 24, 24);
  const uint64_t bytes = PackSize(cpu, 24, 0);
  AlignedBytes host(bytes);
  kvp_pack_args a = PackArgs(all.data(), 24, 0, 0, host.data(), bytes);
  ASSERT_OK(kvp_cache_pack(cpu, &a, nullptr));
  DeviceBuffer<uint8_t> on0(host.bytes());
  DeviceBuffer<int32_t> ids0(all);
  a = PackArgs(ids0.get(), 24, 0, 0, on0.get(), bytes);
  ASSERT_OK(kvp_cache_unpack(gpu0, &a, nullptr));  // gpu0 now holds cpu's blocks at `all`
  const std::vector<int32_t> src = DistinctIds(rng, 9, 24), dst = DistinctIds(rng, 9, 40);
  DeviceBuffer<int32_t> src_ids(src);
  const uint64_t part = PackSize(gpu0, 9, 0);
  a = PackArgs(src_ids.get(), 9, 0, 0, on0.get(), part);
  ASSERT_OK(kvp_cache_pack(gpu0, &a, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaSetDevice(1));
  void* on1 = nullptr;
  int32_t* dst_ids = nullptr;
  ASSERT_CUDA(cudaMalloc(&on1, part));
  ASSERT_CUDA(cudaMalloc(&dst_ids, dst.size() * sizeof(int32_t)));
  ASSERT_CUDA(
      cudaMemcpy(dst_ids, dst.data(), dst.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpyPeer(on1, 1, on0.get(), 0, part));
  const Blocks before = ReadBlocks(gpu1, DeviceRead);
  a = PackArgs(dst_ids, 9, 0, 0, on1, part);
  const std::string err = TakeError(kvp_cache_unpack(gpu1, &a, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_EQ(err, "");
  // Against gpu0's blocks as they are (each one of the CPU cache's).
  EXPECT_EQ(FirstDifference(
                ExpectedUnpack(before, ReadBlocks(gpu0, DeviceRead), src, dst, 0, g.num_layers),
                ReadBlocks(gpu1, DeviceRead)),
            "");
  cudaFree(on1);
  cudaFree(dst_ids);
  kvp_cache_destroy(cpu);
  kvp_cache_destroy(gpu0);
  kvp_cache_destroy(gpu1);
}

#else  // !KVPAGE_HAVE_CUDA

TEST(GpuPack, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace testing
}  // namespace kvpage
