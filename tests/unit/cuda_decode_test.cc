// SPDX-License-Identifier: Apache-2.0
// The CUDA decode kernels (LaunchDecode: partition + reduce) against the
// CPU backend's decode, the double-precision oracle, on the same cache
// bytes and inputs. The cache is built in host memory by CpuBackend::Write
// from fresh random vectors (after filling every byte with random garbage,
// so that stale tokens past a sequence's end and unused scale entries hold
// arbitrary bit patterns, NaN included), then copied whole to the device.
// Block tables are random permutations; their padding holds out-of-range
// ids that must never be read. Outputs and the split-K workspace are
// poisoned with NaN first. Skips where no GPU is present.
//
// Tolerance. The kernel dequantizes K/V codes exactly (FP16 holds every
// code) and computes in FP32 (q * lambda * scale, dot products, exp, sums),
// so its result differs from the double oracle by a few FP32 roundings
// relative to the row's magnitude, plus the final rounding of each side to
// the output dtype (which may land on neighbouring values). Per element:
//   |gpu - cpu| <= a * max_d |cpu row| + b * |cpu|
// with (a, b) = (2e-3, 2^-7) for BF16 output, (1e-3, 2^-10) for FP16 and
// (2e-4, 1e-5) for FP32; lse within 1e-3 absolute. b is one unit in the
// last place of the output dtype at the bottom of a binade (BF16 2^-7, FP16
// 2^-10): two sides rounding a value near a rounding midpoint to BF16 may
// land one ulp apart, so 2^-8 alone would reject correct results. A row with
// nothing visible must be exactly zero with lse = -inf on both sides.
//
// The tensor-core kernel (DecodePath::kTensorCore) rounds q * lambda and the
// softmax weights to FP16 once for quantized caches (relative error 2^-11
// per value; 16-bit caches get a second, remainder product and stay within
// the FP32 bounds above). A logit moves by at most 2^-11 * scale *
// sum_d |q_d k_d| (about 6e-3 for these inputs, typically ten times less as
// the roundings cancel), and the output by that times the spread of V, so
// quantized caches on that path get a = 4e-3 (8 FP16 ulps of the row's
// largest value) and lse within 4e-3 + 2^-10 |lse| (the logits, and their
// error, grow with sm_scale).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "src/backend.h"
#include "src/decode_partition.h"
#include "src/decode_plan.h"
#include "src/formats.h"
#include "src/geometry.h"
#include "src/manifest.h"
#include "src/params.h"
#include "tests/common/fresh_seed.h"

#if KVPAGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "tests/kernels/test_kernels.h"
#endif

namespace kvpage {
namespace {

#if KVPAGE_HAVE_CUDA

// The test matrix is the manifest's (src/manifest.h): a reduced build
// tests what it holds.
constexpr auto& kCacheDTypes = kManifestKvDtypes;
constexpr auto& kHeadSizes = kManifestHeadSizes;
constexpr int kNumCacheDTypes = sizeof(kCacheDTypes) / sizeof(kCacheDTypes[0]);
constexpr int kNumHeadSizes = sizeof(kHeadSizes) / sizeof(kHeadSizes[0]);
constexpr int kBlockSizes[] = {8, 16, 32};
constexpr DType kIoDTypes[] = {DType::kFP32, DType::kFP16, DType::kBF16};

int ElemBytes(DType t) { return t == DType::kFP32 ? 4 : 2; }

// The compute capability's major version of device 0 (0 without one).
int GpuComputeMajor() {
  int n = 0, major = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) {
    return 0;
  }
  return major;
}

// Device 0 as the plan sees it (the H100's profile where there is none).
DeviceProfile TestDevice() {
  const absl::StatusOr<DeviceProfile> d = CudaDeviceProfile(0);
  return d.ok() ? *d : DeviceProfile::H100();
}

// The partition kernel the plan runs on this device for `rows` rows per KV
// head with `path` forced (where it exists) and the staged kernel allowed
// or not.
DecodeKernel CaseKernel(const CacheGeometry& geo, int32_t rows, DecodePath path,
                        bool staged = true) {
  DecodeTuning t;
  t.path = path;
  t.staged = staged;
  return ChooseDecodeKernel(geo, rows, false, TestDevice(), t);
}

// One decode problem.
struct Case {
  DType k = DType::kBF16;
  DType v = DType::kBF16;
  int head_size = 128;
  int block_size = 16;
  int num_kv_heads = 1;
  int group = 1;
  int query_len = 1;
  DType q_dtype = DType::kBF16;
  DType out_dtype = DType::kFP32;
  bool alibi = false;
  bool smoothing = false;
  bool lse = true;
  int window = 0;
  float soft_cap = 0;
  float sm_scale = 0;  // 0: 1/sqrt(D)
  int partition_size = 256;
  DecodePath path = DecodePath::kAuto;  // forced where the kernel exists
  // The staged tensor-core kernel (sm_90+, where it exists): -1 as the host
  // picks it, but one case in four on the register path instead; 0 off; 1
  // on (the test checks that it exists).
  int staged = -1;
  std::vector<int32_t> lens;
  // Capacities beyond the batch (the launch shape must not depend on it).
  int extra_seqs = 0;
  int extra_query_len = 0;
  int extra_context = 0;
  // Strides padded beyond num_q_heads * head_size.
  int q_pad = 0;
  int out_pad = 0;
  // V magnitudes along each sequence: 0 plain; else token t's V times
  // 2^(v_ramp * (t / len - 1/2)), the first v_zero_tokens zero (zero scales).
  float v_ramp = 0;
  int v_zero_tokens = 0;
  uint32_t seed = 0;
  // Set: the decode runs through a CUDA backend made with this tuning (its
  // own plan and workspace, as kvp_decode runs it), not a plan the test
  // builds at partition_size.
  std::optional<DecodeTuning> backend_tuning;

  std::string Describe() const {
    std::ostringstream os;
    os << "K=" << DTypeName(k) << " V=" << DTypeName(v) << " D=" << head_size
       << " bs=" << block_size << " kv_heads=" << num_kv_heads << " group=" << group
       << " qlen=" << query_len << " q=" << DTypeName(q_dtype) << " out=" << DTypeName(out_dtype)
       << " P=" << partition_size << " alibi=" << alibi << " smooth=" << smoothing << " lse=" << lse
       << " path=" << static_cast<int>(path) << " staged=" << staged << " window=" << window
       << " backend_tuning=" << (backend_tuning ? "yes" : "no") << " cap=" << soft_cap
       << " scale=" << sm_scale << " extra(seqs,qlen,ctx)=" << extra_seqs << "," << extra_query_len
       << "," << extra_context << " pad(q,out)=" << q_pad << "," << out_pad << " lens=[";
    for (size_t i = 0; i < lens.size(); ++i) os << (i ? "," : "") << lens[i];
    os << "] v_ramp=" << v_ramp << " v_zero=" << v_zero_tokens << " case_seed=" << seed;
    return os.str();
  }
};

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  bool ok() const { return bytes_ == 0 || ptr_ != nullptr; }
  size_t size_hint() const { return bytes_; }
  void Upload(const void* src) const {
    if (bytes_ > 0) ASSERT_EQ(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Download(void* dst) const {
    if (bytes_ > 0) ASSERT_EQ(cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void Poison() const {
    if (bytes_ > 0) ASSERT_EQ(cudaMemset(ptr_, 0xFF, bytes_), cudaSuccess);  // NaN in FP32/16
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
std::unique_ptr<DeviceBuffer> ToDevice(const std::vector<T>& host) {
  auto d = std::make_unique<DeviceBuffer>(host.size() * sizeof(T));
  if (d->ok()) d->Upload(host.data());
  return d;
}

struct Tolerance {
  double row_rel;   // times max |cpu| of the row
  double elem_rel;  // times |cpu|
};

Tolerance ToleranceFor(DType out) {
  switch (out) {
    case DType::kBF16:
      return {2e-3, 1.0 / 128};
    case DType::kFP16:
      return {1e-3, 1.0 / 1024};
    default:
      return {2e-4, 1e-5};
  }
}

// Largest error / tolerance ratio seen, per output dtype (printed by some
// tests as a calibration aid).
double g_worst_ratio[3] = {0, 0, 0};

void PrintWorstRatios() {
  std::printf(
      "worst |gpu - cpu| / tolerance: FP32 out %.3f, FP16 out %.3f, "
      "BF16 out %.3f\n",
      g_worst_ratio[0], g_worst_ratio[1], g_worst_ratio[2]);
}

// Runs one case on both backends and compares. Returns false on failure.
void RunCase(const Case& c) {
  SCOPED_TRACE(c.Describe());
  if (!ManifestHasKvDtype(c.k) || !ManifestHasKvDtype(c.v) || !ManifestHasHeadSize(c.head_size)) {
    GTEST_SKIP() << "not in this build's kernel manifest";
  }
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);

  const int D = c.head_size;
  const int bs = c.block_size;
  const int hkv = c.num_kv_heads;
  const int hq = hkv * c.group;
  const int num_seqs = static_cast<int>(c.lens.size());
  const int qlen = c.query_len;
  const int max_len = c.lens.empty() ? 0 : *std::max_element(c.lens.begin(), c.lens.end());

  // ---- The cache, in host memory, through the CPU backend's write.
  std::vector<int> blocks_of(num_seqs);
  int total_blocks = 0;
  int width = 1;
  for (int s = 0; s < num_seqs; ++s) {
    blocks_of[s] = (c.lens[s] + bs - 1) / bs;
    total_blocks += blocks_of[s];
    width = std::max(width, blocks_of[s]);
  }
  width += 2;  // padding entries the kernel must never read
  CacheGeometry geo;
  geo.num_layers = 1;
  geo.num_blocks = total_blocks + 3;
  geo.block_size = bs;
  geo.num_kv_heads = hkv;
  geo.head_size = D;
  geo.k_dtype = c.k;
  geo.v_dtype = c.v;
  std::vector<uint8_t> cache(static_cast<size_t>(geo.total_bytes()));
  for (auto& b : cache) b = static_cast<uint8_t>(rng());  // stale garbage

  std::vector<int32_t> perm(geo.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t table_stride = width + 1;
  std::vector<int32_t> table(std::max<int64_t>(1, num_seqs * table_stride));
  for (auto& e : table)
    e = (rng() & 1) ? -1 - static_cast<int32_t>(rng() % 100)
                    : geo.num_blocks + static_cast<int32_t>(rng() % 100000);
  int next = 0;
  std::vector<int64_t> slots;
  std::vector<float> v_mag;  // per written token
  for (int s = 0; s < num_seqs; ++s) {
    for (int j = 0; j < blocks_of[s]; ++j) table[s * table_stride + j] = perm[next++];
    for (int t = 0; t < c.lens[s]; ++t) {
      slots.push_back(int64_t{table[s * table_stride + t / bs]} * bs + t % bs);
      v_mag.push_back(t < c.v_zero_tokens ? 0.0f
                      : c.v_ramp == 0
                          ? 1.0f
                          : std::exp2(c.v_ramp * (static_cast<float>(t) / c.lens[s] - 0.5f)));
    }
  }

  std::vector<float> smoothing;
  if (c.smoothing) {
    smoothing.resize(static_cast<size_t>(hkv) * D);
    for (auto& l : smoothing) l = 0.25f + 3.75f * uniform(rng);
  }
  // K with outlier channels and a per-token offset (exercises INT4's min
  // and the smoothing); V plain normal.
  std::vector<float> chan(static_cast<size_t>(hkv) * D);
  for (auto& x : chan) x = uniform(rng) < 0.05f ? 8.0f : 1.0f;
  const int64_t ntok = static_cast<int64_t>(slots.size());
  std::vector<float> key(static_cast<size_t>(ntok) * hkv * D), value(key.size());
  for (int64_t t = 0; t < ntok; ++t) {
    for (int h = 0; h < hkv; ++h) {
      const float offset = 0.5f * normal(rng);
      for (int d = 0; d < D; ++d) {
        const size_t i = (t * hkv + h) * D + d;
        key[i] = normal(rng) * chan[h * D + d] + offset;
        value[i] = normal(rng) * v_mag[t];
      }
    }
  }
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  if (ntok > 0) {
    WriteCounters counters{0, 0};
    WriteParams w{};
    w.geo = geo;
    w.layer = cache.data();
    w.input_dtype = DType::kFP32;
    w.num_tokens = static_cast<int32_t>(ntok);
    w.key = key.data();
    w.value = value.data();
    w.key_stride = int64_t{hkv} * D;
    w.value_stride = int64_t{hkv} * D;
    w.slot_mapping = slots.data();
    w.key_smoothing = c.smoothing ? smoothing.data() : nullptr;
    w.counters = &counters;
    ASSERT_TRUE(cpu->Write(w, nullptr).ok());
  }

  // ---- Queries and options.
  const int64_t q_stride = int64_t{hq} * D + c.q_pad;
  const int64_t out_stride = int64_t{hq} * D + c.out_pad;
  const int64_t q_rows = std::max<int64_t>(1, int64_t{num_seqs} * qlen);
  std::vector<uint8_t> q(static_cast<size_t>(q_rows * q_stride * ElemBytes(c.q_dtype)));
  for (int64_t i = 0; i < q_rows * q_stride; ++i) {
    StoreFromFloat(c.q_dtype, q.data(), i, normal(rng));
  }
  std::vector<float> alibi;
  if (c.alibi) {
    alibi.resize(hq);
    for (auto& a : alibi) a = uniform(rng);
  }

  DecodeParams p{};
  p.geo = geo;
  p.num_seqs = num_seqs;
  p.query_len = qlen;
  p.num_q_heads = hq;
  p.max_context_len = max_len + c.extra_context;
  p.q_dtype = c.q_dtype;
  p.out_dtype = c.out_dtype;
  p.q_stride = q_stride;
  p.out_stride = out_stride;
  p.block_table_stride = table_stride;
  p.block_table_width = width;
  p.sliding_window = c.window;
  p.sm_scale = c.sm_scale > 0 ? c.sm_scale : 1.0f / std::sqrt(static_cast<float>(D));
  p.logits_soft_cap = c.soft_cap;

  // ---- The oracle.
  const size_t out_elems = static_cast<size_t>(q_rows * out_stride);
  const size_t out_bytes = out_elems * ElemBytes(c.out_dtype);
  std::vector<uint8_t> cpu_out(out_bytes, 0xFF), gpu_out(out_bytes);
  std::vector<float> cpu_lse(static_cast<size_t>(q_rows) * hq, std::nanf("")),
      gpu_lse(cpu_lse.size());
  {
    DecodeParams h = p;
    h.layer = cache.data();
    h.q = q.data();
    h.block_table = table.data();
    h.seq_lens = c.lens.data();
    h.alibi_slopes = c.alibi ? alibi.data() : nullptr;
    h.key_smoothing = c.smoothing ? smoothing.data() : nullptr;
    h.out = cpu_out.data();
    h.lse = cpu_lse.data();  // always: the output bound below uses it
    DecodeCapacity cap;
    cap.num_q_heads = hq;
    cap.max_num_seqs = num_seqs + c.extra_seqs;
    cap.max_context_len = p.max_context_len;
    cap.max_query_len = qlen + c.extra_query_len;
    const absl::Status st = cpu->Decode(h, cap, nullptr, nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }

  // ---- The kernels, planned as the host plans them, at the case's partition.
  DecodePlan plan;
  plan.max_num_seqs = num_seqs + c.extra_seqs;
  plan.max_query_len = qlen + c.extra_query_len;
  plan.partition_size = c.partition_size;
  plan.max_partitions = (p.max_context_len + c.partition_size - 1) / c.partition_size;
  plan.prefetch_k_steps = static_cast<int32_t>(rng() % 3);  // results must not depend on them
  plan.prefetch_v_steps = static_cast<int32_t>(rng() % 3);
  // Mostly as the host launches on sm_90+: both kernels programmatic
  // dependents (the partition kernel of the delayed q copy below).
  plan.dependent_launch = rng() % 4 != 0;
  const int32_t cap_rows = c.group * plan.max_query_len;
  plan.kernel =
      c.backend_tuning
          ? PlanDecode(geo,
                       DecodeCapacity{hq, plan.max_num_seqs, p.max_context_len, plan.max_query_len},
                       TestDevice(), *c.backend_tuning)
                .kernel
          : CaseKernel(geo, cap_rows, c.path, c.staged == 1 || (c.staged == -1 && rng() % 4 != 0));
  if (c.staged == 1) {
    ASSERT_EQ(plan.kernel, DecodeKernel::kTensorCoreStaged) << "no staged kernel for this case";
  }
  const kernels::DecodeKernelTraits traits = kernels::KernelTraits(plan.kernel, geo, cap_rows);
  plan.threads = traits.threads;
  plan.direct_output = traits.writes_output;
  const size_t partials = static_cast<size_t>(plan.max_num_seqs) * plan.max_query_len * hq *
                          std::max(plan.max_partitions, 1);
  DeviceBuffer d_cache(cache.size()), d_q(q.size()), d_q_src(q.size()), d_out(out_bytes),
      d_lse(gpu_lse.size() * sizeof(float)), d_pout(partials * D * sizeof(float)),
      d_pmax(partials * sizeof(float)), d_psum(partials * sizeof(float));
  ASSERT_TRUE(d_cache.ok() && d_q.ok() && d_q_src.ok() && d_out.ok() && d_lse.ok() && d_pout.ok() &&
              d_pmax.ok() && d_psum.ok());
  d_cache.Upload(cache.data());
  // q reaches d_q through a kernel right before the decode (below); until
  // then d_q holds NaN.
  d_q.Poison();
  d_q_src.Upload(q.data());
  d_out.Poison();
  d_lse.Poison();
  d_pout.Poison();
  d_pmax.Poison();
  d_psum.Poison();
  auto d_table = ToDevice(table);
  auto d_lens = ToDevice(c.lens.empty() ? std::vector<int32_t>{0} : c.lens);
  auto d_alibi = ToDevice(c.alibi ? alibi : std::vector<float>{0.0f});
  auto d_smooth = ToDevice(c.smoothing ? smoothing : std::vector<float>{0.0f});
  ASSERT_TRUE(d_table->ok() && d_lens->ok() && d_alibi->ok() && d_smooth->ok());

  DecodeParams d = p;
  d.layer = d_cache.get<uint8_t>();
  d.q = d_q.get();
  d.block_table = d_table->get<int32_t>();
  d.seq_lens = d_lens->get<int32_t>();
  d.alibi_slopes = c.alibi ? d_alibi->get<float>() : nullptr;
  d.key_smoothing = c.smoothing ? d_smooth->get<float>() : nullptr;
  d.out = d_out.get();
  d.lse = c.lse ? d_lse.get<float>() : nullptr;
  DecodeWorkspace ws;
  ws.partial_out = d_pout.get<float>();
  ws.partial_max = d_pmax.get<float>();
  ws.partial_sum = d_psum.get<float>();
  // A producer that lets a dependent start at once and writes q 20 us
  // later: the partition kernel must wait for it before reading q.
  ASSERT_EQ(kernels::LaunchDelayedCopy(d_q.get(), d_q_src.get(), static_cast<int64_t>(q.size()),
                                       20000, nullptr),
            0);
  if (c.backend_tuning) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(0, *c.backend_tuning);
    ASSERT_TRUE(backend.ok()) << backend.status();
    const DecodeCapacity cap{hq, plan.max_num_seqs, p.max_context_len, plan.max_query_len};
    DeviceBuffer w(std::max<size_t>(1, (*backend)->DecodeWorkspaceBytes(geo, cap)));
    ASSERT_TRUE(w.ok());
    w.Poison();
    const absl::Status st = (*backend)->Decode(d, cap, w.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
  } else {
    ASSERT_EQ(kernels::LaunchDecode(d, plan, ws, nullptr), 0);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  d_out.Download(gpu_out.data());
  d_lse.Download(gpu_lse.data());

  // ---- Compare.
  Tolerance tol = ToleranceFor(c.out_dtype);
  double lse_abs = 1e-3, lse_rel = 0;
  const bool tc_quantized = plan.kernel != DecodeKernel::kThreadGroup && IsQuantized(c.k);
  if (tc_quantized) {
    tol.row_rel = std::max(tol.row_rel, 4e-3);
    // The tensor-core path rounds q * lambda to FP16 for quantized caches
    // (one mma, not hi + lo): a logit error that grows with the logits.
    lse_abs = 4e-3;
    lse_rel = 1.0 / 1024;
  }
  // The same logit error d moves an output by at most 2 d max|v| (softmax
  // weights shift between tokens): the largest |v| of each sequence and KV
  // head, for that part of the output bound.
  // (Sequence s's tokens are key/value rows first_token[s] .. + lens[s].)
  std::vector<int64_t> first_token(static_cast<size_t>(num_seqs) + 1, 0);
  for (int s = 0; s < num_seqs; ++s) first_token[s + 1] = first_token[s] + c.lens[s];
  std::vector<double> v_abs_max(static_cast<size_t>(num_seqs) * hkv, 0.0);
  for (int s = 0; s < num_seqs; ++s) {
    for (int64_t t = first_token[s]; t < first_token[s + 1]; ++t) {
      for (int h = 0; h < hkv; ++h) {
        for (int d = 0; d < D; ++d) {
          double& m = v_abs_max[static_cast<size_t>(s) * hkv + h];
          m = std::max(m, std::fabs(static_cast<double>(value[(t * hkv + h) * D + d])));
        }
      }
    }
  }
  // How far rounding q * lambda to FP16 moves a logit: sm_scale * sum_i
  // e_i q_i k_i with relative errors |e_i| <= 2^-11, one per channel (the
  // smoothing cancels between q and the stored K / lambda). As independent
  // errors of that range their sum has the standard deviation
  // sm_scale * 2^-11 / sqrt(3) * |q . k|_2 (elementwise product); lse, a
  // softmax-weighted mean of the logits' errors, moves no more than the
  // largest token's. Five of those bound it where the |lse| / 1024 rule
  // above is too tight: logits near zero made of large products (a failed
  // draw: lse 0.29, off by 0.0057).
  auto logit_sigma = [&](int s, int i, int h) {
    double worst = 0;
    const int64_t qrow = (int64_t{s} * qlen + i) * q_stride + int64_t{h} * D;
    for (int64_t t = first_token[s]; t < first_token[s + 1]; ++t) {
      double sq = 0;
      for (int d = 0; d < D; ++d) {
        const double a = LoadAsFloat(c.q_dtype, q.data(), qrow + d) *
                         static_cast<double>(key[(t * hkv + h / c.group) * D + d]);
        sq += a * a;
      }
      worst = std::max(worst, sq);
    }
    return p.sm_scale * std::ldexp(1.0, -11) / std::sqrt(3.0) * std::sqrt(worst);
  };
  int failures = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int i = 0; i < qlen; ++i) {
      const int64_t row = int64_t{s} * qlen + i;
      for (int h = 0; h < hq; ++h) {
        const double row_lse_cpu = cpu_lse[row * hq + h];
        // The row's bound on a logit's error (tensor-core path, quantized K).
        const double logit_err =
            tc_quantized && std::isfinite(row_lse_cpu)
                ? std::max(lse_abs + lse_rel * std::fabs(row_lse_cpu), 5 * logit_sigma(s, i, h))
                : lse_abs + lse_rel * std::fabs(row_lse_cpu);
        double row_max = 0;
        for (int dd = 0; dd < D; ++dd) {
          row_max =
              std::max(row_max, std::fabs(static_cast<double>(LoadAsFloat(
                                    c.out_dtype, cpu_out.data(), row * out_stride + h * D + dd))));
        }
        for (int dd = 0; dd < D && failures < 10; ++dd) {
          const int64_t idx = row * out_stride + int64_t{h} * D + dd;
          const double want = LoadAsFloat(c.out_dtype, cpu_out.data(), idx);
          const double got = LoadAsFloat(c.out_dtype, gpu_out.data(), idx);
          double bound = tol.row_rel * row_max + tol.elem_rel * std::fabs(want);
          if (tc_quantized && std::isfinite(row_lse_cpu)) {
            bound += 2 * logit_err * v_abs_max[static_cast<size_t>(s) * hkv + h / c.group];
          }
          const double err = std::fabs(got - want);
          if (bound > 0) {
            double& worst = g_worst_ratio[static_cast<int>(c.out_dtype)];
            worst = std::max(worst, err / bound);
          }
          if (!(err <= bound)) {
            ADD_FAILURE() << "out seq " << s << " token " << i << " head " << h << " d " << dd
                          << ": gpu " << got << " cpu " << want << " (bound " << bound << ")";
            ++failures;
          }
        }
        if (c.lse && failures < 10) {
          const float want = cpu_lse[row * hq + h];
          const float got = gpu_lse[row * hq + h];
          const bool ok = std::isinf(want) ? (got == want) : std::fabs(got - want) <= logit_err;
          if (!ok) {
            ADD_FAILURE() << "lse seq " << s << " token " << i << " head " << h << ": gpu " << got
                          << " cpu " << want;
            ++failures;
          }
        }
      }
    }
  }
}

bool HaveGpu() { return CudaDeviceCount() > 0; }

// Lengths around the interesting boundaries of (block size, partition
// size, query length), plus random ones.
std::vector<int32_t> BoundaryLens(std::mt19937& rng, int bs, int P, int qlen, int n, int max_len) {
  const int pool[] = {0,     1, qlen - 1, qlen,      bs - 1, bs,        bs + 1,
                      P - 1, P, P + 1,    2 * P - 1, 2 * P,  2 * P + 1, 3 * bs + 2};
  std::vector<int32_t> lens;
  for (int i = 0; i < n; ++i) {
    int len;
    if (rng() % 3 == 0) {
      len = static_cast<int>(rng() % (max_len + 1));
    } else {
      len = pool[rng() % (sizeof(pool) / sizeof(pool[0]))];
    }
    lens.push_back(std::clamp(len, 0, max_len));
  }
  return lens;
}

// A random case over the whole option space for the given dtypes, shape.
Case RandomCase(std::mt19937& rng, DType k, DType v, int D, int bs) {
  Case c;
  c.seed = rng();
  c.k = k;
  c.v = v;
  c.head_size = D;
  c.block_size = bs;
  const int groups[] = {1, 4, 8, 16};
  c.group = groups[rng() % 4];
  c.num_kv_heads = 1 + static_cast<int>(rng() % 2);
  c.query_len = 1 + static_cast<int>(rng() % 4);
  c.q_dtype = kIoDTypes[rng() % 3];
  c.out_dtype = kIoDTypes[rng() % 3];
  c.alibi = rng() % 3 == 0;
  c.smoothing = rng() % 3 == 0;
  c.lse = rng() % 2 == 0;
  c.window = rng() % 4 == 0 ? 1 + static_cast<int>(rng() % 80) : 0;
  c.soft_cap = rng() % 4 == 0 ? 1.0f + static_cast<float>(rng() % 30) : 0.0f;
  c.partition_size = rng() % 3 == 0 ? 32 : 256;
  c.extra_seqs = static_cast<int>(rng() % 2);
  c.extra_query_len = static_cast<int>(rng() % 2);
  c.extra_context = rng() % 2 == 0 ? 0 : static_cast<int>(rng() % 600);
  c.q_pad = rng() % 4 == 0 ? 8 : 0;
  c.out_pad = rng() % 4 == 0 ? 16 : 0;
  c.lens = BoundaryLens(rng, bs, c.partition_size, c.query_len, 1 + static_cast<int>(rng() % 3),
                        2 * c.partition_size + 40);
  const DecodePath paths[] = {DecodePath::kAuto, DecodePath::kThreadGroup, DecodePath::kTensorCore};
  c.path = paths[rng() % 3];
  return c;
}

#define KVPAGE_REQUIRE_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present"

// The longest partition the host may pick for the tensor-core kernel of
// `geo`: its halves' limit, or a third of the context up to
// MaxThirdPartitionSize (16-bit caches: 4096 against 2048).
int32_t LongestTcPartition(const CacheGeometry& geo) {
  const kernels::DecodeKernelTraits t =
      kernels::KernelTraits(CaseKernel(geo, 1, DecodePath::kTensorCore, false), geo, 1);
  return std::max(t.max_partition, t.max_third_partition);
}

// ---- A small set for the sanitizers -------------------------------------

// The decode kernels' dynamic shared memory starts on a 128-byte boundary
// whatever static shared memory a kernel has: their copies into it run
// slower off one (docs/archive.md, "Shared-memory alignment").
TEST(CudaDecodeSmall, DynamicSharedMemoryAligned) {
  KVPAGE_REQUIRE_GPU();
  uint32_t bytes = 0xFFFFFFFFu;
  ASSERT_EQ(kernels::ProbeDecodeSmemMisalignment(&bytes), 0);
  EXPECT_EQ(bytes, 0u);
}

TEST(CudaDecodeSmall, EveryDtypeShort) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  const DType vs[] = {DType::kINT4, DType::kFP8E4M3, DType::kBF16, DType::kINT8, DType::kFP16};
  int n = 0;
  for (DType k : kCacheDTypes) {
    Case c;
    c.seed = rng();
    c.k = k;
    c.v = vs[n % 5];
    c.head_size = n % 2 ? 80 : 128;
    c.block_size = kBlockSizes[n % 3];
    c.num_kv_heads = 2;
    c.group = 4;
    c.query_len = 2;
    c.q_dtype = DType::kBF16;
    c.out_dtype = kIoDTypes[n % 3];
    c.alibi = n % 2 == 0;
    c.window = n == 3 ? 20 : 0;
    c.soft_cap = n == 4 ? 10.0f : 0.0f;
    c.smoothing = n == 1;
    c.partition_size = 32;
    c.extra_seqs = 1;
    c.lens = {0, 1, 33, 70};
    RunCase(c);
    ++n;
  }
}

TEST(CudaDecodeSmall, ManyRowsAndTails) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  Case c;
  c.seed = rng();
  c.k = DType::kINT4;
  c.v = DType::kINT4;
  c.head_size = 112;  // INT4 K tail chunk
  c.block_size = 8;
  c.group = 12;
  c.query_len = 3;  // 36 rows: 5 row tiles, the last partial
  c.partition_size = 64;
  c.lens = {2, 64, 65, 130};
  RunCase(c);
}

// Every dtype through the tensor-core kernel: head sizes 64/128/256, every
// block size, 4 to 16 rows, partitions shorter than a warp's step (INT4
// takes 64 tokens per step), every option somewhere.
TEST(CudaDecodeSmall, TensorCoresEveryDtype) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  int n = 0;
  for (DType t : kCacheDTypes) {
    for (int D : {64, 128, 256}) {
      Case c;
      c.seed = rng();
      c.k = t;
      c.v = t;
      c.head_size = D;
      c.path = DecodePath::kTensorCore;
      c.block_size = kBlockSizes[n % 3];
      c.num_kv_heads = 2;
      c.group = n % 4 == 0 ? 4 : 8;
      c.query_len = n % 3 == 2 ? 2 : 1;  // 16 rows: two column tiles
      c.q_dtype = kIoDTypes[n % 3];
      c.out_dtype = kIoDTypes[(n + 1) % 3];
      c.alibi = n % 2 == 0;
      c.window = n % 5 == 3 ? 20 : 0;
      c.soft_cap = n % 4 == 1 ? 10.0f : 0.0f;
      c.smoothing = n % 3 == 1;
      c.partition_size = n % 2 ? 32 : 64;
      c.extra_seqs = 1;
      c.lens = {0, 1, 33, 70, 129};
      RunCase(c);
      if (HasFailure()) return;
      ++n;
    }
  }
}

// A block table narrower than a partition: the INT4 ring kernel's first
// partition copies a partition's worth of block ids before it knows the
// length (CopyTableSlice). Entries past the table's width must not be read
// (the last row's would lie past the table: memcheck) and must not matter;
// those inside it past the sequence's end are garbage (RunCase).
TEST(CudaDecodeSmall, TableNarrowerThanAPartition) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  for (int bs : kBlockSizes) {
    Case c;
    c.seed = rng();
    c.k = DType::kINT4;
    c.v = DType::kINT4;
    c.head_size = 128;
    c.path = DecodePath::kTensorCore;
    c.block_size = bs;
    c.group = 8;
    c.partition_size = 2048;  // 64-256 ids a partition; the rows hold 3-11
    c.lens = {1, 40, 130, 0};
    // Only the ring kernel copies early: the one tensor-core kernel that
    // writes its own output (kernels/launch.h).
    CacheGeometry geo;
    geo.head_size = c.head_size;
    geo.block_size = c.block_size;
    geo.k_dtype = c.k;
    geo.v_dtype = c.v;
    ASSERT_EQ(CaseKernel(geo, c.group * c.query_len, c.path), DecodeKernel::kTensorCoreRing);
    RunCase(c);
    if (HasFailure()) return;
  }
}

// ---- The dtype x head size x block size matrix ---------------------------

// The tensor-core kernel over its whole domain (K = V dtype, head sizes
// 64/128/256) x block sizes x random options, GQA 1/4/8/16.
TEST(CudaDecode, TensorCoreMatrix) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  for (DType t : kCacheDTypes) {
    for (int D : {64, 128, 256}) {
      for (int bs : kBlockSizes) {
        for (int rep = 0; rep < 2; ++rep) {
          Case c = RandomCase(rng, t, t, D, bs);
          c.path = DecodePath::kTensorCore;
          RunCase(c);
          if (HasFailure()) return;
        }
      }
    }
  }
  PrintWorstRatios();
}

TEST(CudaDecode, DtypeHeadBlockMatrix) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  for (DType k : kCacheDTypes) {
    for (DType v : kCacheDTypes) {
      for (int D : kHeadSizes) {
        for (int bs : kBlockSizes) {
          RunCase(RandomCase(rng, k, v, D, bs));
          if (HasFailure()) return;
        }
      }
    }
  }
  PrintWorstRatios();
}

// ---- Options, one at a time and together ----------------------------------

TEST(CudaDecode, OptionsAndIoDtypes) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  const DType pairs[][2] = {{DType::kBF16, DType::kBF16},
                            {DType::kINT8, DType::kINT4},
                            {DType::kFP8E4M3, DType::kFP8E4M3},
                            {DType::kINT4, DType::kFP16}};
  for (const auto& kv : pairs) {
    for (int opt = 0; opt < 32; ++opt) {
      Case c;
      c.seed = rng();
      c.k = kv[0];
      c.v = kv[1];
      c.head_size = 128;
      c.block_size = 16;
      c.num_kv_heads = 2;
      c.group = 4;
      c.alibi = opt & 1;
      c.window = (opt & 2) ? 37 : 0;
      c.soft_cap = (opt & 4) ? 4.0f : 0.0f;
      c.smoothing = opt & 8;
      c.lse = opt & 16;
      c.query_len = 1 + opt % 4;
      c.q_dtype = kIoDTypes[opt % 3];
      c.out_dtype = kIoDTypes[(opt / 3) % 3];
      c.sm_scale = (opt % 5 == 0) ? 0.3f : 0.0f;
      c.partition_size = 64;
      c.lens = {1, 5, 64, 65, 200, 0};
      RunCase(c);
      if (HasFailure()) return;
    }
  }
}

// The staged kernel (sm_90+) over its domain: BF16 / FP16 at head size 128
// and block size 16, up to 8 rows per KV head (GQA groups 1-8, multi-token
// queries), every option at random, partition sizes that are and are not
// multiples of its 64-token stage, and lengths that end inside a stage, a
// block, or right at their ends.
// Decodes through CUDA backends made with each tuning override
// (DecodeTuning, as KVPAGE_* environment variables ask for them): plain
// stream order, a 96-token partition (not a power of two, not a whole
// number of the kernels' warp steps), each kernel family forced, the staged
// kernel off, L2 prefetch distances; every dtype pair and option at random.
TEST(CudaDecode, BackendTuning) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  std::vector<DecodeTuning> tunings(6);
  tunings[0].dependent_decode = false;
  tunings[1].partition_size = 96;
  tunings[2].path = DecodePath::kThreadGroup;
  tunings[3].path = DecodePath::kTensorCore;
  tunings[3].dependent_decode = false;
  tunings[4].staged = false;
  tunings[5].prefetch_k_steps = 0;
  tunings[5].prefetch_v_steps = 3;
  for (const DecodeTuning& t : tunings) {
    for (int rep = 0; rep < 4; ++rep) {
      const DType k = kCacheDTypes[rng() % kNumCacheDTypes];
      const DType v = rng() % 2 ? k : kCacheDTypes[rng() % kNumCacheDTypes];
      Case c = RandomCase(rng, k, v, rep % 2 ? 128 : kHeadSizes[rng() % kNumHeadSizes],
                          kBlockSizes[rng() % 3]);
      c.backend_tuning = t;
      RunCase(c);
      if (HasFailure()) return;
    }
  }
}

TEST(CudaDecode, StagedEveryOption) {
  KVPAGE_REQUIRE_GPU();
  if (GpuComputeMajor() < 9) GTEST_SKIP() << "the staged kernel needs sm_90+";
  KVPAGE_SEEDED_RNG(rng);
  const int shapes[][2] = {{1, 1}, {2, 1}, {4, 1}, {8, 1}, {1, 8}, {2, 4}, {4, 2}, {3, 2}};
  for (DType t : {DType::kBF16, DType::kFP16}) {
    for (const auto& gq : shapes) {
      for (int rep = 0; rep < 3; ++rep) {
        Case c = RandomCase(rng, t, t, 128, 16);
        c.group = gq[0];
        c.query_len = gq[1];
        c.extra_query_len = 0;
        c.path = DecodePath::kTensorCore;
        c.staged = 1;
        const int sizes[] = {32, 96, 256, 2752, 4096};
        c.partition_size = sizes[rng() % 5];
        c.lens = BoundaryLens(rng, 16, c.partition_size, c.query_len,
                              1 + static_cast<int>(rng() % 3), 2 * c.partition_size + 40);
        c.lens.push_back(64 * (1 + static_cast<int>(rng() % 8)));  // ends on a stage
        RunCase(c);
        if (HasFailure()) return;
      }
    }
  }
  PrintWorstRatios();
}

// ---- Partition sizes and their boundaries --------------------------------

TEST(CudaDecode, PartitionBoundaries) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  // Any multiple of 32 is a valid partition size (DecodePlan): powers of
  // two (what the host picks today) and two that are not.
  for (int P : {32, 96, 256, 512, 1376}) {
    for (int bs : kBlockSizes) {
      Case c;
      c.seed = rng();
      c.k = kCacheDTypes[rng() % kNumCacheDTypes];
      c.v = kCacheDTypes[rng() % kNumCacheDTypes];
      c.head_size = kHeadSizes[rng() % kNumHeadSizes];
      c.block_size = bs;
      c.group = 4;
      c.query_len = 1 + static_cast<int>(rng() % 2);
      c.partition_size = P;
      c.window = rng() % 2 ? P + 3 : 0;
      c.lens = {P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, bs - 1, bs, bs + 1, 1, 0};
      c.extra_context = P;  // one partition more than any sequence needs
      c.path = rng() % 2 ? DecodePath::kTensorCore : DecodePath::kThreadGroup;
      if (rng() % 2) c.v = c.k;  // where the tensor-core kernel can run
      RunCase(c);
      if (HasFailure()) return;
    }
  }
}

// ---- GQA groups, large and odd -------------------------------------------

TEST(CudaDecode, LargeGroups) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  const int configs[][2] = {{64, 8}, {64, 1}, {24, 2}, {16, 4}, {7, 3}, {32, 1}};
  for (const auto& gq : configs) {
    Case c;
    c.seed = rng();
    c.k = kCacheDTypes[rng() % kNumCacheDTypes];
    c.v = kCacheDTypes[rng() % kNumCacheDTypes];
    c.head_size = gq[0] == 64 ? 64 : kHeadSizes[rng() % kNumHeadSizes];
    c.block_size = kBlockSizes[rng() % 3];
    c.group = gq[0];
    c.query_len = gq[1];
    c.alibi = rng() % 2;
    c.window = rng() % 2 ? 50 : 0;
    c.partition_size = 128;
    c.lens = {300, 9, 0, 129};
    RunCase(c);
    if (HasFailure()) return;
  }
}

// ---- A batch with many rows ------------------------------------------------

// The reduce kernel merges several rows a block once a decode has
// kernels::kReduceManyRows rows (sequences x query tokens x query heads):
// a batch past that, with a head count that leaves warps of the last block
// idle, and lengths that take both of its merges (up to 8 partitions, and
// more), besides empty and one-partition sequences.
TEST(CudaDecode, ManyRowsReduce) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  Case c;
  c.seed = rng();
  c.k = kCacheDTypes[rng() % kNumCacheDTypes];
  c.v = rng() % 2 ? c.k : kCacheDTypes[rng() % kNumCacheDTypes];
  c.head_size = kHeadSizes[rng() % kNumHeadSizes];
  c.block_size = kBlockSizes[rng() % 3];
  c.num_kv_heads = 2;
  c.group = 3;  // 6 query heads: the last of each sequence's blocks of 4 has two
  c.query_len = 2;
  c.partition_size = 32;
  const int num_seqs = static_cast<int>(kernels::kReduceManyRows / (2 * 6)) + 3;
  for (int s = 0; s < num_seqs; ++s) {
    c.lens.push_back(s % 17 == 0 ? 0 : 1 + static_cast<int>(rng() % 400));  // up to 13 partitions
  }
  c.path = rng() % 2 ? DecodePath::kTensorCore : DecodePath::kThreadGroup;
  ASSERT_GE(int64_t{num_seqs} * c.query_len * c.num_kv_heads * c.group, kernels::kReduceManyRows);
  RunCase(c);
}

// ---- Nothing visible -----------------------------------------------------

TEST(CudaDecode, EmptyAndInvisible) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  Case c;
  c.seed = rng();
  c.k = DType::kINT8;
  c.v = DType::kINT8;
  c.group = 2;
  c.query_len = 4;  // lengths below 4: the first query tokens see nothing
  c.lens = {0, 0, 1, 2, 3};
  c.partition_size = 32;
  RunCase(c);
  c.lens = {0, 0};  // every sequence empty
  RunCase(c);
  c.lens = {40, 300};
  c.window = 1;  // one token each
  RunCase(c);
  // One partition a sequence in a kernel that writes its own output (the
  // INT4 ring kernel, the thread-group kernel): no reduce kernel runs, so
  // the partition kernel writes the empty sequences' rows (zeros, lse
  // -inf) itself; outputs are poisoned before the decode.
  const std::pair<DType, DecodePath> owners[] = {{DType::kINT4, DecodePath::kTensorCore},
                                                 {DType::kINT8, DecodePath::kThreadGroup}};
  for (const auto& [t, path] : owners) {
    Case e;
    e.seed = rng();
    e.k = e.v = t;
    e.group = 8;
    e.num_kv_heads = 2;
    e.query_len = 2;
    e.path = path;
    e.lens = {0, 37, 0, 1, 300, 0};
    e.partition_size = 512;  // >= the 300-token capacity: one partition
    // The case is only worth its name where the kernel writes its output.
    CacheGeometry geo;
    geo.head_size = e.head_size;
    geo.block_size = e.block_size;
    geo.k_dtype = e.k;
    geo.v_dtype = e.v;
    const int32_t rows = e.group * e.query_len;
    ASSERT_TRUE(kernels::KernelTraits(CaseKernel(geo, rows, e.path), geo, rows).writes_output);
    RunCase(e);  // a failure prints the case
  }
}

// ---- A long context -------------------------------------------------------

TEST(CudaDecode, LongContext) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  const DType kv[][2] = {{DType::kBF16, DType::kBF16},
                         {DType::kINT4, DType::kINT4},
                         {DType::kINT8, DType::kFP8E4M3},
                         {DType::kFP8E4M3, DType::kFP8E4M3}};
  for (const auto& t : kv) {
    for (DecodePath path : {DecodePath::kThreadGroup, DecodePath::kTensorCore}) {
      if (path == DecodePath::kTensorCore && t[0] != t[1]) continue;
      Case c;
      c.seed = rng();
      c.k = t[0];
      c.v = t[1];
      c.head_size = 128;
      c.block_size = 16;
      c.num_kv_heads = 1;
      c.group = 8;
      c.query_len = 1;
      c.out_dtype = DType::kFP32;
      // The tensor-core path at the longest partition the host may pick for
      // it (LongestTcPartition: 4096, 8192 with a ring): the longest
      // accumulation per warp, where a precision loss in the FP32
      // accumulators shows (it did once: biased V codes).
      CacheGeometry geo;
      geo.head_size = c.head_size;
      geo.block_size = c.block_size;
      geo.k_dtype = c.k;
      geo.v_dtype = c.v;
      c.partition_size = path == DecodePath::kTensorCore ? LongestTcPartition(geo) : 256;
      c.lens = {33000, 1000};
      c.path = path;
      RunCase(c);
      if (HasFailure()) return;
    }
  }
  PrintWorstRatios();
}

// V scales that change by orders of magnitude along a sequence, after a run
// of zero V vectors (zero scales): the tensor-core kernels with a ring keep
// a per-warp V factor that starts at the first nonzero scale and drops (O
// rescaled) whenever a larger one comes; growing and shrinking ramps, at the
// longest partition and at short ones.
TEST(CudaDecode, VScalesAlongTheSequence) {
  KVPAGE_REQUIRE_GPU();
  KVPAGE_SEEDED_RNG(rng);
  for (DType t : {DType::kINT4, DType::kINT8, DType::kFP8E4M3, DType::kBF16}) {
    for (float ramp : {24.0f, -24.0f}) {
      for (int bs : {8, 16, 32}) {
        Case c;
        c.seed = rng();
        c.k = c.v = t;
        c.head_size = 128;
        c.block_size = bs;
        c.num_kv_heads = 2;
        c.group = 8;
        c.query_len = 1;
        c.out_dtype = DType::kFP32;
        c.path = DecodePath::kTensorCore;
        c.v_ramp = ramp;
        c.v_zero_tokens = 300;
        CacheGeometry geo;
        geo.head_size = c.head_size;
        geo.k_dtype = c.k;
        geo.v_dtype = c.v;
        c.partition_size = bs == 16 ? LongestTcPartition(geo) : 256;
        c.lens = {5000, 1200, 301, 64};
        RunCase(c);
        if (HasFailure()) return;
      }
    }
  }
  PrintWorstRatios();
}

#endif  // KVPAGE_HAVE_CUDA

}  // namespace
}  // namespace kvpage
