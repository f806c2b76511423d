// SPDX-License-Identifier: Apache-2.0
// Checked mode on the GPU (kvp_cache_config.checked): corrupt block tables,
// lengths, slot mappings and device-side copy pairs are skipped by the
// kernels and reported by the next call on the cache, which names the
// array, the index and the value; the other sequences' results and the rest
// of the cache are unaffected, and the call after that works again. Run
// under compute-sanitizer memcheck on the device: no invalid access.
// Every test skips itself where no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "include/kvpage/kvpage.h"
#include "tests/common/reference.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvpage {
namespace testing {
namespace {

#if KVPAGE_HAVE_CUDA

#define ASSERT_OK(expr)                        \
  do {                                         \
    std::string kvp_err_ = TakeError(expr);    \
    ASSERT_TRUE(kvp_err_.empty()) << kvp_err_; \
  } while (0)
#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

bool HaveGpu() {
  int32_t n = 0;
  TakeError(kvp_device_count(KVP_DEVICE_CUDA, &n));
  return n > 0;
}

// Expects `err` to be INVALID_ARGUMENT with a message holding every part.
void ExpectFault(kvp_error* err, const std::vector<std::string>& parts) {
  ASSERT_NE(err, nullptr) << "expected the recorded fault, the call succeeded";
  const int32_t code = kvp_error_code(err);
  const std::string msg = kvp_error_message(err);
  kvp_error_free(err);
  EXPECT_EQ(code, KVP_ERR_INVALID_ARGUMENT) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> ToHost(const T* dev, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// A checked CUDA cache of the parameter's KV dtype with three sequences
// written (random K/V), each in its own shuffled blocks, and a decoder over
// them. INT8 and INT4 run the tensor-core kernel without and with its ring
// (whose first partition takes its block ids by early copies, then
// validates them: CopyTableSlice).
class GpuChecked : public ::testing::TestWithParam<int32_t> {
 protected:
  static constexpr int kHeads = 2, kQHeads = 4, kD = 128, kBs = 16, kBlocks = 32, kWidth = 8;
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
    kvp_cache_config cfg;
    kvp_cache_config_init(&cfg);
    cfg.device_kind = KVP_DEVICE_CUDA;
    cfg.num_blocks = kBlocks;
    cfg.block_size = kBs;
    cfg.num_kv_heads = kHeads;
    cfg.head_size = kD;
    cfg.k_dtype = GetParam();
    cfg.v_dtype = GetParam();
    cfg.checked = 1;
    ASSERT_OK(kvp_cache_create(&cfg, &cache_));
    std::vector<int32_t> perm(kBlocks);
    for (int i = 0; i < kBlocks; ++i) perm[i] = i;
    for (int i = kBlocks - 1; i > 0; --i) std::swap(perm[i], perm[rng_.uniform(0, i)]);
    table_.assign(3 * kWidth, 0);
    int next = 0;
    for (int s = 0; s < 3; ++s) {
      for (int j = 0; j < (lens_[s] + kBs - 1) / kBs; ++j) table_[s * kWidth + j] = perm[next++];
      used_.insert(used_.end(), table_.begin() + s * kWidth,
                   table_.begin() + s * kWidth + (lens_[s] + kBs - 1) / kBs);
      for (int t = 0; t < lens_[s]; ++t) {
        slots_.push_back(int64_t{table_[s * kWidth + t / kBs]} * kBs + t % kBs);
      }
    }
    const size_t elems = slots_.size() * kHeads * kD;
    std::vector<float> k(elems), v(elems), q(3 * kQHeads * kD);
    for (float& x : k) x = rng_.normal(1.0f);
    for (float& x : v) x = rng_.normal(1.0f);
    for (float& x : q) x = rng_.normal(1.0f);
    d_k_ = ToDevice(k);
    d_v_ = ToDevice(v);
    d_q_ = ToDevice(q);
    d_slots_ = ToDevice(slots_);
    d_out_ = ToDevice(std::vector<float>(q.size(), NAN));
    ASSERT_OK(Write(d_slots_));
    kvp_decode_config dc;
    kvp_decode_config_init(&dc);
    dc.num_query_heads = kQHeads;
    dc.max_num_seqs = 3;
    dc.max_context_len = kWidth * kBs;
    dc.q_dtype = KVP_DTYPE_FP32;
    dc.out_dtype = KVP_DTYPE_FP32;
    ASSERT_OK(kvp_decoder_create(cache_, &dc, &decoder_));
    clean_ = DecodeNow(table_, lens_);
    for (float x : clean_) ASSERT_TRUE(std::isfinite(x));
  }
  void TearDown() override {
    kvp_decoder_destroy(decoder_);
    kvp_cache_destroy(cache_);
    for (void* p : {static_cast<void*>(d_k_), static_cast<void*>(d_v_), static_cast<void*>(d_q_),
                    static_cast<void*>(d_slots_), static_cast<void*>(d_out_)}) {
      cudaFree(p);
    }
  }

  kvp_error* Write(const int64_t* slots) {
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.num_tokens = static_cast<int32_t>(slots_.size());
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = d_k_;
    w.value = d_v_;
    w.slot_mapping = slots;
    return kvp_cache_write(cache_, &w, nullptr);
  }
  kvp_error* Decode(const std::vector<int32_t>& table, const std::vector<int32_t>& lens) {
    int32_t* d_table = ToDevice(table);
    int32_t* d_lens = ToDevice(lens);
    cudaMemset(d_out_, 0xFF, 3 * kQHeads * kD * sizeof(float));  // poison (NaN)
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.num_seqs = 3;
    a.q = d_q_;
    a.block_table = d_table;
    a.block_table_width = kWidth;
    a.seq_lens = d_lens;
    a.out = d_out_;
    kvp_error* err = kvp_decode(decoder_, &a, nullptr);
    cudaDeviceSynchronize();
    cudaFree(d_table);
    cudaFree(d_lens);
    return err;
  }
  // Decodes and returns the output (fails the test if the call fails).
  std::vector<float> DecodeNow(const std::vector<int32_t>& table,
                               const std::vector<int32_t>& lens) {
    const std::string err = TakeError(Decode(table, lens));
    EXPECT_TRUE(err.empty()) << err;
    return ToHost(d_out_, 3 * kQHeads * kD);
  }
  // The whole layer 0 (data and scales) as bytes.
  std::vector<uint8_t> CacheBytes() {
    kvp_layer_layout l;
    kvp_layer_layout_init(&l);
    EXPECT_EQ(TakeError(kvp_cache_get_layout(cache_, 0, &l)), "");
    std::vector<uint8_t> all;
    const std::pair<void*, int64_t> regions[] = {{l.k_data, l.k_data_bytes},
                                                 {l.v_data, l.v_data_bytes},
                                                 {l.k_scales, l.k_scale_bytes},
                                                 {l.v_scales, l.v_scale_bytes}};
    for (const auto& r : regions) {
      std::vector<uint8_t> b = ToHost(static_cast<const uint8_t*>(r.first), r.second);
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  }
  // Sequence s's rows of a decode output.
  static std::vector<float> Rows(const std::vector<float>& out, int s) {
    return std::vector<float>(out.begin() + s * kQHeads * kD, out.begin() + (s + 1) * kQHeads * kD);
  }
  Rng rng_{};
  kvp_cache* cache_ = nullptr;
  kvp_decoder* decoder_ = nullptr;
  std::vector<int32_t> lens_ = {40, rng_.uniform(70, 99), 33};
  std::vector<int32_t> table_;
  std::vector<int32_t> used_;  // block ids the sequences hold
  std::vector<int64_t> slots_;
  float *d_k_ = nullptr, *d_v_ = nullptr, *d_q_ = nullptr, *d_out_ = nullptr;
  int64_t* d_slots_ = nullptr;
  std::vector<float> clean_;
};

TEST_P(GpuChecked, BadBlockIdIsReportedAndNotRead) {
  for (const int32_t bad : {kBlocks + 1000, -5, kBlocks}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> table = table_;
    table[1 * kWidth + 2] = bad;  // sequence 1, its third block
    const std::string err = TakeError(Decode(table, lens_));
    ASSERT_TRUE(err.empty()) << "the launch itself succeeds: " << err;
    const std::vector<float> out = ToHost(d_out_, 3 * kQHeads * kD);
    EXPECT_EQ(Rows(out, 0), Rows(clean_, 0));
    EXPECT_EQ(Rows(out, 2), Rows(clean_, 2));
    for (float x : Rows(out, 1)) EXPECT_TRUE(std::isfinite(x));
    ExpectFault(Decode(table_, lens_),
                {"checked mode", "block id " + std::to_string(bad), "block_table row 1"});
    EXPECT_EQ(DecodeNow(table_, lens_), clean_) << "the fault is reported once, then cleared";
  }
}

TEST_P(GpuChecked, BadSeqLenIsReportedAndTakenAsEmpty) {
  for (const int32_t bad : {kWidth * kBs + 1, 1 << 30, -3}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> lens = lens_;
    lens[2] = bad;
    ASSERT_EQ(TakeError(Decode(table_, lens)), "");
    const std::vector<float> out = ToHost(d_out_, 3 * kQHeads * kD);
    EXPECT_EQ(Rows(out, 0), Rows(clean_, 0));
    EXPECT_EQ(Rows(out, 1), Rows(clean_, 1));
    for (float x : Rows(out, 2)) EXPECT_EQ(x, 0.0f);
    ExpectFault(Decode(table_, lens_), {"checked mode", "seq_lens[2] = " + std::to_string(bad)});
    EXPECT_EQ(DecodeNow(table_, lens_), clean_);
  }
}

TEST_P(GpuChecked, BadSlotIsReportedAndNothingElseWritten) {
  const std::vector<uint8_t> before = CacheBytes();
  // Rewriting the same tokens leaves the bytes as they are; with two slots
  // corrupted, those two tokens are skipped (their old bytes stay).
  std::vector<int64_t> slots = slots_;
  slots[5] = int64_t{kBlocks} * kBs + 7;
  slots[9] = -7;
  int64_t* d_bad = ToDevice(slots);
  ASSERT_EQ(TakeError(Write(d_bad)), "");
  ASSERT_CUDA(cudaDeviceSynchronize());
  cudaFree(d_bad);
  EXPECT_TRUE(CacheBytes() == before) << "no byte changed";
  // Either corrupt slot may be the first one a warp reports.
  kvp_error* err = Write(d_slots_);
  ASSERT_NE(err, nullptr);
  const std::string msg = kvp_error_message(err);
  const bool named =
      msg.find("slot_mapping[5] = " + std::to_string(slots[5])) != std::string::npos ||
      msg.find("slot_mapping[9] = -7") != std::string::npos;
  EXPECT_TRUE(named) << msg;
  ExpectFault(err, {"checked mode"});
  ASSERT_OK(Write(d_slots_));
  EXPECT_EQ(DecodeNow(table_, lens_), clean_);
}

TEST_P(GpuChecked, BadCopyPairIsReported) {
  const std::vector<uint8_t> before = CacheBytes();
  // A copy of a block onto a free one (block ids past the written ones are
  // never in the table) and a pair with a bad destination.
  int32_t free_block = 0;
  while (std::find(used_.begin(), used_.end(), free_block) != used_.end()) ++free_block;
  const std::vector<int32_t> pairs = {table_[0], free_block, 3, 5000};
  int32_t* d_pairs = ToDevice(pairs);
  ASSERT_EQ(TakeError(kvp_cache_copy_blocks(cache_, d_pairs, 2, nullptr)), "");
  ASSERT_CUDA(cudaDeviceSynchronize());
  cudaFree(d_pairs);
  ExpectFault(kvp_cache_copy_blocks(cache_, nullptr, 0, nullptr),
              {"checked mode", "block id 5000", "pair 1"});
  EXPECT_EQ(DecodeNow(table_, lens_), clean_);
  EXPECT_FALSE(CacheBytes() == before) << "the good pair was copied";
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, GpuChecked, ::testing::Values(KVP_DTYPE_INT8, KVP_DTYPE_INT4),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return std::string(info.param == KVP_DTYPE_INT8 ? "INT8" : "INT4");
                         });

#else  // !KVPAGE_HAVE_CUDA

TEST(GpuChecked, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace testing
}  // namespace kvpage
