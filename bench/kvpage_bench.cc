// SPDX-License-Identifier: Apache-2.0
// kvpage-bench: decode and cache-write throughput on one GPU, against the
// device-to-device copy bandwidth measured in the same run.
//
// Bytes counted for a decode: K, V and scales of every token attended,
// read once (kvp_cache_info.bytes_per_token_per_layer per token). The cache
// spans enough layers (> 4x the L2) that consecutive runs rotate through
// different memory and never hit in L2; the timed writes rotate through
// copies of their input the same way. Two times per case, both medians
// with CUDA events after a warm-up: "time" replays a CUDA graph of one call
// per layer (as an engine replays its decode step; no host launch latency
// between calls), "eager time" times >= 50 single calls, each with the host
// launch of its kernels inside the events.
//
// --attend (only these) or --all (decode cases, then these): attention over
// query chunks through kvp_attend (prefill, chunked prefill, a chunk mixed
// with decoding sequences, short chunks; AttendCases), timed the same two
// ways, each reported in TFLOP/s (4 * Hq * D * keys visible to the query
// tokens, causal) and as a fraction of the H100's dense BF16 peak.
//
// --pack (only these; --all runs them too): kvp_cache_pack and
// kvp_cache_unpack of a 32k-token sequence of a 32-layer GQA 32/8 head-128
// model, every layer in one call and layer by layer, in GB/s of bytes read
// and written against the copy bandwidth (RunPackCase).
//
// usage: kvpage-bench [--quick] [--precise] [--attend | --pack | --all] [--csv FILE]
// [--hashes FILE] [--dtypes bf16,fp8,int8,int4] [--shapes SUBSTR,...]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvpage/kvpage.h"

namespace {

void Check(kvp_error* e, const char* what) {
  if (e == nullptr) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, kvp_error_code_name(kvp_error_code(e)),
               kvp_error_message(e));
  std::exit(1);
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

template <typename F>
double MedianMs(int iters, int warmup, F&& run) {
  cudaEvent_t a, b;
  CheckCuda(cudaEventCreate(&a), "event");
  CheckCuda(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) run(i);
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CheckCuda(cudaEventRecord(a), "record");
    run(warmup + i);
    CheckCuda(cudaEventRecord(b), "record");
    CheckCuda(cudaEventSynchronize(b), "sync");
    CheckCuda(cudaEventElapsedTime(&ms[i], a, b), "elapsed");
  }
  CheckCuda(cudaGetLastError(), "kernel");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

// Time per call of `calls` calls captured in one CUDA graph (call(i)
// enqueues call i on `stream`), the way an engine replays a decode step:
// each timed sample replays the graph back to back until it has run at
// least 32 calls, so the host's launch latency is paid once per sample
// instead of once per call. Median of `samples`.
// At least this many calls in a graph (callers cycle through their
// layers), as in an engine's step of many layers: a replay's own launch
// then costs each call a sixteenth of it, not a half (a 20 us write lost
// 1-5% in graphs of two calls; docs/archive.md, "Measurement method").
// KVPAGE_BENCH_GRAPH_CALLS=N sets the minimum (1: the method before).
int MinGraphCalls() {
  const char* env = std::getenv("KVPAGE_BENCH_GRAPH_CALLS");
  return env != nullptr ? std::max(1, std::min(64, std::atoi(env))) : 16;
}

template <typename F>
double GraphMedianMs(cudaStream_t stream, int calls, int samples, F&& call) {
  calls = std::max(calls, MinGraphCalls());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CheckCuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < calls; ++i) call(i);
  CheckCuda(cudaStreamEndCapture(stream, &graph), "capture");
  CheckCuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const int replays = (32 + calls - 1) / calls;
  cudaEvent_t a, b;
  CheckCuda(cudaEventCreate(&a), "event");
  CheckCuda(cudaEventCreate(&b), "event");
  for (int i = 0; i < 2; ++i) CheckCuda(cudaGraphLaunch(exec, stream), "replay");
  std::vector<float> ms(samples);
  for (float& m : ms) {
    CheckCuda(cudaEventRecord(a, stream), "record");
    for (int r = 0; r < replays; ++r) CheckCuda(cudaGraphLaunch(exec, stream), "replay");
    CheckCuda(cudaEventRecord(b, stream), "record");
    CheckCuda(cudaEventSynchronize(b), "sync");
    CheckCuda(cudaEventElapsedTime(&m, a, b), "elapsed");
    m /= static_cast<float>(replays * calls);
  }
  CheckCuda(cudaGetLastError(), "graph");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return ms[samples / 2];
}

// Device-to-device copy bandwidth: bytes read + bytes written per second.
double CopyBandwidthGBs() {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CheckCuda(cudaMalloc(&src, bytes), "malloc");
  CheckCuda(cudaMalloc(&dst, bytes), "malloc");
  CheckCuda(cudaMemset(src, 1, bytes), "memset");
  const double ms =
      MedianMs(50, 5, [&](int) { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

struct Shape {
  std::string name;
  int hq, hkv, head_size;
  std::vector<int> lens;
};

struct Result {
  std::string shape, dtype;
  int batch;
  double us, gbs, frac, write_gbs;
  double eager_us, eager_write_gbs;  // one call at a time, host launch included
  uint64_t output_hash;              // FNV-1a of layer 0's decode output bytes
};

// FNV-1a, 64-bit: a fingerprint of a decode's output, so that two builds'
// outputs on the benchmark's inputs (fixed seeds) compare bit for bit.
uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

uint64_t Fnv1a(const std::string& s) { return Fnv1a(std::vector<uint8_t>(s.begin(), s.end())); }

int ParseDtype(const std::string& s) {
  if (s == "bf16") return KVP_DTYPE_BF16;
  if (s == "fp16") return KVP_DTYPE_FP16;
  if (s == "fp8") return KVP_DTYPE_FP8_E4M3;
  if (s == "int8") return KVP_DTYPE_INT8;
  if (s == "int4") return KVP_DTYPE_INT4;
  std::fprintf(stderr, "unknown dtype %s\n", s.c_str());
  std::exit(2);
}

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

uint16_t ToHalf(float f) {
  const __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// KVPAGE_BENCH_WRITE_INPUT=fp16: the cache write's K and V are FP16, as an
// FP16 model's are (default BF16; the write kernel differs by input type).
// --precise: every decoder in precise mode (kvp_decode_config.precise).
// Layers of a cache of `cfg` (its num_layers aside) whose rotation spans
// more than 4x the L2, within [min_layers, 64]: the benchmarks cycle calls
// through them so that no call finds its K/V in L2. Sizes one layer with a
// probe cache of one layer.
int32_t LayersSpanningL2(kvp_cache_config cfg, size_t l2_bytes, int64_t min_layers) {
  cfg.num_layers = 1;
  kvp_cache* probe = nullptr;
  Check(kvp_cache_create(&cfg, &probe), "cache");
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  Check(kvp_cache_get_info(probe, &info), "info");
  kvp_cache_destroy(probe);
  const int64_t layer_bytes = info.total_bytes;
  return static_cast<int32_t>(std::min<int64_t>(
      64, std::max<int64_t>(min_layers, int64_t(4 * l2_bytes) / layer_bytes + 1)));
}

bool& PreciseDecode() {
  static bool on = false;
  return on;
}

bool HalfWriteInput() {
  const char* env = std::getenv("KVPAGE_BENCH_WRITE_INPUT");
  return env != nullptr && std::string(env) == "fp16";
}

// KVPAGE_BENCH_BLOCK_ORDER=linear: each sequence's blocks adjacent in
// memory instead of drawn from a shuffled pool (RunCase).
bool LinearBlockOrder() {
  const char* env = std::getenv("KVPAGE_BENCH_BLOCK_ORDER");
  return env != nullptr && std::string(env) == "linear";
}

Result RunCase(const Shape& shape, const std::string& dtype_name, double copy_gbs, int iters,
               size_t l2_bytes, std::mt19937& rng) {
  const int dtype = ParseDtype(dtype_name);
  const int bs = 16, D = shape.head_size, B = static_cast<int>(shape.lens.size());
  int64_t total_tokens = 0;
  int max_len = 0, width = 0;
  for (int l : shape.lens) {
    total_tokens += l;
    max_len = std::max(max_len, l);
  }
  width = (max_len + bs - 1) / bs;
  int64_t blocks = 0;
  for (int l : shape.lens) blocks += (l + bs - 1) / bs;

  // Enough layers that the rotation spans > 4x L2.
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.num_blocks = static_cast<int32_t>(blocks);
  cfg.block_size = bs;
  cfg.num_kv_heads = shape.hkv;
  cfg.head_size = D;
  cfg.k_dtype = dtype;
  cfg.v_dtype = dtype;
  cfg.num_layers = LayersSpanningL2(cfg, l2_bytes, 2);
  kvp_cache* cache = nullptr;
  Check(kvp_cache_create(&cfg, &cache), "cache");
  cudaStream_t stream = nullptr;  // graphs are captured on a stream of our own
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  Check(kvp_cache_get_info(cache, &info), "info");

  // Tables: each sequence gets its own blocks, shuffled as a real pool is
  // (or adjacent: LinearBlockOrder, to see what the scatter costs).
  std::vector<int32_t> perm(blocks);
  for (int64_t i = 0; i < blocks; ++i) perm[i] = static_cast<int32_t>(i);
  if (!LinearBlockOrder()) std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(size_t(B) * width, 0);
  std::vector<int64_t> slots;
  slots.reserve(total_tokens);
  int64_t next = 0;
  for (int s = 0; s < B; ++s) {
    for (int j = 0; j < (shape.lens[s] + bs - 1) / bs; ++j)
      table[size_t(s) * width + j] = perm[next++];
    for (int t = 0; t < shape.lens[s]; ++t) {
      slots.push_back(int64_t(table[size_t(s) * width + t / bs]) * bs + t % bs);
    }
  }

  // Fill every layer with random BF16 (or FP16: HalfWriteInput) K/V
  // through the write kernel, in chunks; time the chunks of the first
  // layer for the write throughput.
  const int64_t chunk = std::min<int64_t>(total_tokens, 65536);
  const int64_t elems = chunk * shape.hkv * D;
  std::vector<uint16_t> host(elems);
  std::normal_distribution<float> normal;
  const bool half_input = HalfWriteInput();
  for (auto& x : host) x = half_input ? ToHalf(normal(rng)) : ToBf16(normal(rng));
  // The timed writes rotate, as the decodes do, through memory larger than
  // the L2 (4x where the cache allows it), so that each call reads its K and
  // V from memory and writes to lines no recent call left in L2: their
  // destinations through the (layer, whole chunk) pairs, their inputs
  // through copies of the chunk's K and V. KVPAGE_BENCH_WRITE_ROTATE=0: one
  // input and each layer's first chunk (the archive's earlier method).
  const char* rotate_env = std::getenv("KVPAGE_BENCH_WRITE_ROTATE");
  const bool rotate = rotate_env == nullptr || std::string(rotate_env) != "0";
  const int64_t full_chunks = total_tokens / chunk;
  const double chunk_written = double(chunk) * info.bytes_per_token_per_layer;
  const int write_targets =
      rotate ? static_cast<int>(std::min<int64_t>(
                   cfg.num_layers * full_chunks,
                   std::max<int64_t>(cfg.num_layers, int64_t(4 * l2_bytes / chunk_written) + 1)))
             : cfg.num_layers;
  const int input_sets =
      rotate ? static_cast<int>(std::min<int64_t>(8, int64_t(4 * l2_bytes) / (elems * 4) + 1)) : 1;
  std::vector<void*> dk(input_sets), dv(input_sets);
  void *dslots = nullptr, *dtable = nullptr, *dlens = nullptr;
  for (int i = 0; i < input_sets; ++i) {
    CheckCuda(cudaMalloc(&dk[i], elems * 2), "malloc");
    CheckCuda(cudaMalloc(&dv[i], elems * 2), "malloc");
    CheckCuda(cudaMemcpy(dk[i], host.data(), elems * 2, cudaMemcpyHostToDevice), "copy");
  }
  std::reverse(host.begin(), host.end());
  for (int i = 0; i < input_sets; ++i) {
    CheckCuda(cudaMemcpy(dv[i], host.data(), elems * 2, cudaMemcpyHostToDevice), "copy");
  }
  CheckCuda(cudaMalloc(&dslots, slots.size() * 8), "malloc");
  CheckCuda(cudaMemcpy(dslots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice), "copy");
  auto write_chunk = [&](int layer, int64_t start, cudaStream_t on, int input = 0) {
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = layer;
    w.num_tokens = static_cast<int32_t>(std::min(chunk, total_tokens - start));
    w.input_dtype = half_input ? KVP_DTYPE_FP16 : KVP_DTYPE_BF16;
    w.key = dk[input];
    w.value = dv[input];
    w.slot_mapping = static_cast<const int64_t*>(dslots) + start;
    Check(kvp_cache_write(cache, &w, on), "write");
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (int64_t start = 0; start < total_tokens; start += chunk) write_chunk(l, start, nullptr);
  }
  CheckCuda(cudaDeviceSynchronize(), "fill");
  // Timed call i: destination i % write_targets (layers first), input copy
  // i % input_sets; every call writes one whole chunk.
  auto timed_write = [&](int i, cudaStream_t on) {
    const int target = i % write_targets;
    write_chunk(target % cfg.num_layers, (target / cfg.num_layers) * chunk, on, i % input_sets);
  };
  const double eager_write_ms =
      MedianMs(std::max(iters / 2, 20), 3, [&](int i) { timed_write(i, nullptr); });
  const double write_ms =
      GraphMedianMs(stream, std::max(write_targets, input_sets), std::max(iters / 4, 11),
                    [&](int i) { timed_write(i, stream); });
  // Write traffic: the 16-bit input read + the cache bytes written.
  const double write_bytes =
      double(chunk) * (2.0 * shape.hkv * D * 2 + info.bytes_per_token_per_layer);
  const double write_gbs = write_bytes / (write_ms * 1e-3) / 1e9;

  CheckCuda(cudaMalloc(&dtable, table.size() * 4), "malloc");
  CheckCuda(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "copy");
  std::vector<int32_t> lens(shape.lens.begin(), shape.lens.end());
  CheckCuda(cudaMalloc(&dlens, lens.size() * 4), "malloc");
  CheckCuda(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), "copy");
  const int64_t q_elems = int64_t(B) * shape.hq * D;
  std::vector<uint16_t> hq(q_elems);
  for (auto& x : hq) x = ToBf16(normal(rng));
  void *dq = nullptr, *dout = nullptr;
  CheckCuda(cudaMalloc(&dq, q_elems * 2), "malloc");
  CheckCuda(cudaMalloc(&dout, q_elems * 2), "malloc");
  CheckCuda(cudaMemcpy(dq, hq.data(), q_elems * 2, cudaMemcpyHostToDevice), "copy");

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = shape.hq;
  dc.max_num_seqs = B;
  dc.max_context_len = max_len;
  dc.precise = PreciseDecode() ? 1 : 0;
  kvp_decoder* dec = nullptr;
  Check(kvp_decoder_create(cache, &dc, &dec), "decoder");
  kvp_decode_args a;
  kvp_decode_args_init(&a);
  a.num_seqs = B;
  a.q = dq;
  a.block_table = static_cast<const int32_t*>(dtable);
  a.block_table_width = width;
  a.seq_lens = static_cast<const int32_t*>(dlens);
  a.out = dout;
  const double eager_ms = MedianMs(iters, 10, [&](int i) {
    a.layer = i % cfg.num_layers;
    Check(kvp_decode(dec, &a, nullptr), "decode");
  });
  // The graph holds one decode per layer: consecutive calls still rotate
  // through memory larger than the L2.
  const double ms = GraphMedianMs(stream, cfg.num_layers, std::max(iters / 4, 11), [&](int i) {
    a.layer = i % cfg.num_layers;
    Check(kvp_decode(dec, &a, stream), "decode");
  });
  // One more decode of layer 0 into a poisoned output, fingerprinted.
  std::vector<uint8_t> out_bytes(size_t(q_elems) * 2);
  CheckCuda(cudaMemset(dout, 0xFF, out_bytes.size()), "poison");
  a.layer = 0;
  Check(kvp_decode(dec, &a, nullptr), "decode");
  CheckCuda(cudaMemcpy(out_bytes.data(), dout, out_bytes.size(), cudaMemcpyDeviceToHost), "copy");
  const double bytes = double(total_tokens) * info.bytes_per_token_per_layer;
  Result r;
  r.output_hash = Fnv1a(out_bytes);
  r.shape = shape.name;
  r.dtype = dtype_name;
  r.batch = B;
  r.us = ms * 1e3;
  r.gbs = bytes / (ms * 1e-3) / 1e9;
  r.frac = r.gbs / copy_gbs;
  r.write_gbs = write_gbs;
  r.eager_us = eager_ms * 1e3;
  r.eager_write_gbs = write_bytes / (eager_write_ms * 1e-3) / 1e9;
  kvp_decoder_destroy(dec);
  CheckCuda(cudaStreamDestroy(stream), "stream");
  kvp_cache_destroy(cache);
  for (int i = 0; i < input_sets; ++i) {
    cudaFree(dk[i]);
    cudaFree(dv[i]);
  }
  for (void* p : {dslots, dtable, dlens, dq, dout}) cudaFree(p);
  return r;
}

// ---- Attention over query chunks (kvp_attend) --------------------------------------------

// Dense BF16 tensor-core peak of an H100 SXM (TFLOP/s): the reference for
// every KV dtype, since kvp_attend multiplies on 16-bit tensor cores.
constexpr double kPeakTflops = 989.0;

// kvp_attend through the function table, so that the bench still loads and
// runs its decode cases against a library older than ABI 1.3.
const kvp_api* AttendApi() {
  const kvp_api* api = kvp_get_api(KVP_ABI_MAJOR);
  if (api == nullptr || api->abi_minor < 3 || api->struct_size < KVP_API_STRUCT_SIZE_1_3) {
    return nullptr;
  }
  return api;
}

// One batch: sequence s has context ctx[s] (its new tokens included) and
// brings the last nq[s] of them as query tokens.
enum AttendRole { kOther = 0, kMixed, kChunk, kDecodeAttend, kDecodeDecode };

struct AttendCase {
  std::string name;
  std::vector<int> ctx, nq;
  bool via_decode = false;  // kvp_decode with query_len 1 (every nq is 1)
  AttendRole role = kOther;
};

struct AttendShape {
  std::string name;
  int hq, hkv;
};

std::vector<AttendShape> AttendShapes(bool quick) {
  std::vector<AttendShape> s = {{"GQA 32/8 D=128", 32, 8}, {"GQA 8/1 D=128", 8, 1}};
  if (quick) s.resize(1);
  return s;
}

std::vector<AttendCase> AttendCases() {
  auto rep = [](int n, int v) { return std::vector<int>(size_t(n), v); };
  std::vector<AttendCase> c;
  // (a) prefill from an empty cache: the chunk is the whole context.
  c.push_back({"a prefill 8x4096 ctx 4096", rep(8, 4096), rep(8, 4096)});
  // (b) one chunk over a long context.
  c.push_back({"b chunk 2048 ctx 8192", {8192}, {2048}});
  c.push_back({"b chunk 2048 ctx 32768", {32768}, {2048}});
  // (c) many medium chunks.
  c.push_back({"c 16x256 ctx 4096", rep(16, 4096), rep(16, 256)});
  // (d) a chunk mixed with decoding sequences, and its two parts alone.
  AttendCase mixed{"d mixed 2048 + 255x1 ctx 8192", rep(256, 8192), rep(256, 1)};
  mixed.nq[0] = 2048;
  mixed.role = kMixed;
  c.push_back(mixed);
  c.push_back({"d chunk alone 2048 ctx 8192", {8192}, {2048}, false, kChunk});
  c.push_back({"d decode alone 255x1 ctx 8192 kvp_attend", rep(255, 8192), rep(255, 1), false,
               kDecodeAttend});
  c.push_back({"d decode alone 255x1 ctx 8192 kvp_decode", rep(255, 8192), rep(255, 1), true,
               kDecodeDecode});
  // (e) short chunks (speculative verification, small prefix-cache misses).
  c.push_back({"e 4x16 ctx 8192", rep(4, 8192), rep(4, 16)});
  c.push_back({"e 4x64 ctx 8192", rep(4, 8192), rep(4, 64)});
  c.push_back({"e 1x16 ctx 32768", {32768}, {16}});
  return c;
}

// "attend <shape>: <case>": the key of a row in the CSV and the hashes, and
// what --shapes matches. No commas.
std::string AttendLabel(const AttendShape& shape, const AttendCase& c) {
  return "attend " + shape.name + ": " + c.name;
}

struct AttendResult {
  std::string label, shape, name, dtype;
  AttendRole role;
  int seqs, max_ctx;
  int64_t q_tokens;
  double flops, us, eager_us, tflops, frac;
  int64_t non_finite;    // output elements not finite (or never written)
  uint64_t output_hash;  // FNV-1a of layer 0's output bytes
};

// Random normal BF16 values on the device, from a fixed seed; buffers are
// filled with slices of it at random offsets (much faster than drawing
// hundreds of millions of values per case). Its odd length keeps repeats
// from lining up with tokens.
struct NormalPool {
  uint16_t* data = nullptr;
  int64_t size = 0;
};

NormalPool MakeNormalPool() {
  NormalPool p;
  p.size = (int64_t{1} << 24) - 3;
  std::vector<uint16_t> host(size_t(p.size));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal;
  for (auto& x : host) x = ToBf16(normal(rng));
  CheckCuda(cudaMalloc(&p.data, size_t(p.size) * 2), "malloc");
  CheckCuda(cudaMemcpy(p.data, host.data(), size_t(p.size) * 2, cudaMemcpyHostToDevice), "copy");
  return p;
}

void FillFromPool(void* dst, int64_t elems, const NormalPool& pool, std::mt19937& rng) {
  int64_t off = std::uniform_int_distribution<int64_t>(0, pool.size - 1)(rng);
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < elems;) {
    const int64_t n = std::min(elems - i, pool.size - off);
    CheckCuda(cudaMemcpy(d + i, pool.data + off, size_t(n) * 2, cudaMemcpyDeviceToDevice), "copy");
    i += n;
    off = 0;
  }
}

// Keys visible to the query tokens of a batch (causal: the token at
// position p sees p + 1 keys), and the FLOPs counted for them: QK^T and PV,
// 2 each per key, channel and query head.
double AttendFlops(const AttendCase& c, int hq, int head_size) {
  double keys = 0;
  for (size_t s = 0; s < c.ctx.size(); ++s) {
    const double n = c.nq[s], l = c.ctx[s];
    keys += n * (2 * l - n + 1) / 2;  // sum of p + 1 over p = l - n .. l - 1
  }
  return 4.0 * hq * head_size * keys;
}

// One case: a cache holding every context (random normal K/V written
// through kvp_cache_write; the write is not timed), one decoder of the
// case's capacities (max_num_seqs = sequences, max_context_len = the
// longest context, max_query_tokens = all query tokens), timed as RunCase
// times a decode: graph replay (one call per layer, layers spanning > 4x
// the L2 where the cache is smaller) and eager calls. `budget_ms` bounds
// each of the two timings' sample counts for long calls (prefill).
AttendResult RunAttendCase(const kvp_api* api, const AttendShape& shape, const AttendCase& ac,
                           const std::string& dtype_name, int iters, double budget_ms,
                           size_t l2_bytes, const NormalPool& pool) {
  const int dtype = ParseDtype(dtype_name);
  const int bs = 16, D = 128, B = static_cast<int>(ac.ctx.size());
  const std::string label = AttendLabel(shape, ac);
  // The data depend on the case and shape only: the same for every KV
  // dtype, and whichever other cases run.
  std::mt19937 rng(static_cast<uint32_t>(Fnv1a(label)));
  int64_t total_ctx = 0, total_q = 0, blocks = 0;
  int max_ctx = 0;
  std::vector<int32_t> starts(size_t(B) + 1, 0);
  for (int s = 0; s < B; ++s) {
    total_ctx += ac.ctx[s];
    total_q += ac.nq[s];
    blocks += (ac.ctx[s] + bs - 1) / bs;
    max_ctx = std::max(max_ctx, ac.ctx[s]);
    starts[s + 1] = static_cast<int32_t>(total_q);
    if (ac.via_decode && ac.nq[s] != 1) {
      std::fprintf(stderr, "%s: a kvp_decode case takes one query token per sequence\n",
                   label.c_str());
      std::exit(1);
    }
  }
  const int width = (max_ctx + bs - 1) / bs;

  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.num_blocks = static_cast<int32_t>(blocks);
  cfg.block_size = bs;
  cfg.num_kv_heads = shape.hkv;
  cfg.head_size = D;
  cfg.k_dtype = dtype;
  cfg.v_dtype = dtype;
  // One layer where it alone spans > 4x the L2; more for small caches.
  cfg.num_layers = LayersSpanningL2(cfg, l2_bytes, 1);
  kvp_cache* cache = nullptr;
  Check(kvp_cache_create(&cfg, &cache), "cache");
  cudaStream_t stream = nullptr;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  // Tables: each sequence its own blocks from a shuffled pool (or adjacent:
  // LinearBlockOrder); slots of every context token.
  std::vector<int32_t> perm(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) perm[size_t(i)] = static_cast<int32_t>(i);
  if (!LinearBlockOrder()) std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(size_t(B) * width, 0);
  std::vector<int64_t> slots;
  slots.reserve(size_t(total_ctx));
  int64_t next = 0;
  for (int s = 0; s < B; ++s) {
    for (int j = 0; j < (ac.ctx[s] + bs - 1) / bs; ++j) table[size_t(s) * width + j] = perm[next++];
    for (int t = 0; t < ac.ctx[s]; ++t) {
      slots.push_back(int64_t(table[size_t(s) * width + t / bs]) * bs + t % bs);
    }
  }

  // Fill every layer: random normal BF16 K and V, in chunks of <= 64k tokens.
  const int64_t chunk = std::min<int64_t>(total_ctx, 65536);
  const int64_t kv_elems = chunk * shape.hkv * D;
  void *dk = nullptr, *dv = nullptr, *dslots = nullptr;
  CheckCuda(cudaMalloc(&dk, size_t(kv_elems) * 2), "malloc");
  CheckCuda(cudaMalloc(&dv, size_t(kv_elems) * 2), "malloc");
  FillFromPool(dk, kv_elems, pool, rng);
  FillFromPool(dv, kv_elems, pool, rng);
  CheckCuda(cudaMalloc(&dslots, slots.size() * 8), "malloc");
  CheckCuda(cudaMemcpy(dslots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice), "copy");
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (int64_t start = 0; start < total_ctx; start += chunk) {
      kvp_write_args w;
      kvp_write_args_init(&w);
      w.layer = l;
      w.num_tokens = static_cast<int32_t>(std::min(chunk, total_ctx - start));
      w.input_dtype = KVP_DTYPE_BF16;
      w.key = dk;
      w.value = dv;
      w.slot_mapping = static_cast<const int64_t*>(dslots) + start;
      Check(kvp_cache_write(cache, &w, nullptr), "write");
    }
  }
  CheckCuda(cudaDeviceSynchronize(), "fill");
  for (void* p : {dk, dv, dslots}) cudaFree(p);

  void *dtable = nullptr, *dlens = nullptr, *dstarts = nullptr, *dq = nullptr, *dout = nullptr;
  const std::vector<int32_t> lens(ac.ctx.begin(), ac.ctx.end());
  CheckCuda(cudaMalloc(&dtable, table.size() * 4), "malloc");
  CheckCuda(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "copy");
  CheckCuda(cudaMalloc(&dlens, lens.size() * 4), "malloc");
  CheckCuda(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), "copy");
  CheckCuda(cudaMalloc(&dstarts, starts.size() * 4), "malloc");
  CheckCuda(cudaMemcpy(dstarts, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice), "copy");
  const int64_t q_elems = total_q * shape.hq * D;
  CheckCuda(cudaMalloc(&dq, size_t(q_elems) * 2), "malloc");
  CheckCuda(cudaMalloc(&dout, size_t(q_elems) * 2), "malloc");
  FillFromPool(dq, q_elems, pool, rng);

  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = shape.hq;
  dc.max_num_seqs = B;
  dc.max_context_len = max_ctx;
  dc.max_query_tokens = static_cast<int32_t>(total_q);
  dc.precise = PreciseDecode() ? 1 : 0;
  kvp_decoder* dec = nullptr;
  Check(kvp_decoder_create(cache, &dc, &dec), "decoder");
  kvp_attend_args a;
  api->attend_args_init(&a);
  a.num_seqs = B;
  a.query_starts = static_cast<const int32_t*>(dstarts);
  a.q = dq;
  a.block_table = static_cast<const int32_t*>(dtable);
  a.block_table_width = width;
  a.seq_lens = static_cast<const int32_t*>(dlens);
  a.out = dout;
  kvp_decode_args da;
  kvp_decode_args_init(&da);
  da.num_seqs = B;
  da.query_len = 1;
  da.q = dq;
  da.block_table = static_cast<const int32_t*>(dtable);
  da.block_table_width = width;
  da.seq_lens = static_cast<const int32_t*>(dlens);
  da.out = dout;
  auto call = [&](int layer, cudaStream_t on) {
    if (ac.via_decode) {
      da.layer = layer;
      Check(kvp_decode(dec, &da, on), "decode");
    } else {
      a.layer = layer;
      Check(api->attend(dec, &a, on), "attend");
    }
  };

  // A first call, then an estimate that sizes the sample counts: at most
  // `iters` eager calls and max(iters / 4, 11) graph samples (as RunCase),
  // fewer where that would take longer than budget_ms (at least 5).
  call(0, nullptr);
  CheckCuda(cudaDeviceSynchronize(), "attend");
  const double est_ms =
      std::max(1e-3, MedianMs(3, 1, [&](int i) { call(i % cfg.num_layers, nullptr); }));
  const int eager_iters = std::max(5, std::min(iters, static_cast<int>(budget_ms / est_ms)));
  const double eager_ms =
      MedianMs(eager_iters, 2, [&](int i) { call(i % cfg.num_layers, nullptr); });
  const int graph_calls = std::max(cfg.num_layers, MinGraphCalls());
  const int per_sample = (32 + graph_calls - 1) / graph_calls * graph_calls;
  const int samples = std::max(
      5, std::min(std::max(iters / 4, 11), static_cast<int>(budget_ms / (per_sample * est_ms))));
  const double ms = GraphMedianMs(stream, cfg.num_layers, samples,
                                  [&](int i) { call(i % cfg.num_layers, stream); });

  // One more call of layer 0 into a poisoned output (NaN in BF16):
  // fingerprinted, and every element must be written and finite.
  std::vector<uint8_t> out_bytes(size_t(q_elems) * 2);
  CheckCuda(cudaMemset(dout, 0xFF, out_bytes.size()), "poison");
  call(0, nullptr);
  CheckCuda(cudaMemcpy(out_bytes.data(), dout, out_bytes.size(), cudaMemcpyDeviceToHost), "copy");
  int64_t non_finite = 0;
  for (size_t i = 0; i + 1 < out_bytes.size(); i += 2) {
    const uint16_t u = static_cast<uint16_t>(out_bytes[i] | (out_bytes[i + 1] << 8));
    non_finite += (u & 0x7F80) == 0x7F80;
  }

  AttendResult r;
  r.label = label;
  r.shape = shape.name;
  r.name = ac.name;
  r.dtype = dtype_name;
  r.role = ac.role;
  r.seqs = B;
  r.max_ctx = max_ctx;
  r.q_tokens = total_q;
  r.flops = AttendFlops(ac, shape.hq, D);
  r.us = ms * 1e3;
  r.eager_us = eager_ms * 1e3;
  r.tflops = r.flops / (ms * 1e-3) / 1e12;
  r.frac = r.tflops / kPeakTflops;
  r.non_finite = non_finite;
  r.output_hash = Fnv1a(out_bytes);
  kvp_decoder_destroy(dec);
  CheckCuda(cudaStreamDestroy(stream), "stream");
  kvp_cache_destroy(cache);
  for (void* p : {dtable, dlens, dstarts, dq, dout}) cudaFree(p);
  return r;
}

// The CSV of the attend rows: FILE.csv -> FILE.attend.csv (else FILE.attend.csv).
std::string AttendCsvPath(const std::string& csv) {
  const std::string ext = ".csv";
  if (csv.size() > ext.size() && csv.compare(csv.size() - ext.size(), ext.size(), ext) == 0) {
    return csv.substr(0, csv.size() - ext.size()) + ".attend.csv";
  }
  return csv + ".attend.csv";
}

// Runs the attend cases (those whose label contains one of `only`, when
// given) for every dtype, printing a row per case as it finishes, then the
// mixed batch (d) against its parts.
std::vector<AttendResult> RunAttendCases(bool quick, const std::vector<std::string>& only,
                                         const std::vector<std::string>& dtypes, size_t l2_bytes) {
  std::vector<AttendResult> results;
  const kvp_api* api = AttendApi();
  if (api == nullptr) {
    uint32_t major = 0, minor = 0;
    kvp_abi_version(&major, &minor);
    std::printf("\nattend cases skipped: libkvpage has ABI %u.%u, kvp_attend needs 1.3\n", major,
                minor);
    return results;
  }
  std::vector<std::pair<AttendShape, AttendCase>> todo;
  for (const AttendShape& shape : AttendShapes(quick)) {
    for (const AttendCase& c : AttendCases()) {
      const std::string label = AttendLabel(shape, c);
      bool keep = only.empty();
      for (const std::string& o : only) keep = keep || label.find(o) != std::string::npos;
      if (keep) todo.emplace_back(shape, c);
    }
  }
  if (todo.empty()) return results;
  const NormalPool pool = MakeNormalPool();
  std::printf(
      "\nkvp_attend over query chunks: TFLOP/s = 4 * Hq * D * (keys visible to every query "
      "token, causal) / time; peak = %.0f TFLOP/s (H100 dense BF16); the K/V writes are not "
      "timed\n",
      kPeakTflops);
  std::printf(
      "\n| case | heads q/kv | seqs | query tokens | context | KV | time (us) | TFLOP/s | of peak "
      "| eager time (us) | outputs |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [shape, c] : todo) {
    for (const std::string& d : dtypes) {
      AttendResult r =
          RunAttendCase(api, shape, c, d, quick ? 20 : 60, quick ? 500.0 : 2000.0, l2_bytes, pool);
      const std::string outputs =
          r.non_finite == 0 ? "finite" : std::to_string(r.non_finite) + " NOT FINITE";
      std::printf("| %s | %d/%d | %d | %lld | %d | %s | %.1f | %.1f | %.1f%% | %.1f | %s |\n",
                  r.name.c_str(), shape.hq, shape.hkv, r.seqs, static_cast<long long>(r.q_tokens),
                  r.max_ctx, r.dtype.c_str(), r.us, r.tflops, 100 * r.frac, r.eager_us,
                  outputs.c_str());
      std::fflush(stdout);
      results.push_back(r);
    }
  }
  cudaFree(pool.data);

  // (d): the mixed batch against its chunk and its decoding sequences run
  // alone (graph times); below 1 the mix costs less than its parts.
  bool header = false;
  for (const AttendShape& shape : AttendShapes(quick)) {
    for (const std::string& d : dtypes) {
      double t[5] = {0, 0, 0, 0, 0};
      for (const AttendResult& r : results) {
        if (r.shape == shape.name && r.dtype == d) t[r.role] = r.us;
      }
      if (t[kMixed] == 0 || t[kChunk] == 0 || (t[kDecodeAttend] == 0 && t[kDecodeDecode] == 0)) {
        continue;
      }
      if (!header) {
        std::printf(
            "\nmixed batch (d): time(mixed) / (time(chunk alone) + time(decode alone))\n"
            "\n| shape | KV | mixed (us) | chunk alone (us) | decode alone, kvp_attend (us) | "
            "decode alone, kvp_decode (us) | ratio, kvp_attend decode | ratio, kvp_decode decode "
            "|\n|---|---|---|---|---|---|---|---|\n");
        header = true;
      }
      char cells[4][32];
      const double parts[4] = {
          t[kDecodeAttend], t[kDecodeDecode],
          t[kDecodeAttend] > 0 ? t[kMixed] / (t[kChunk] + t[kDecodeAttend]) : 0,
          t[kDecodeDecode] > 0 ? t[kMixed] / (t[kChunk] + t[kDecodeDecode]) : 0};
      for (int i = 0; i < 4; ++i) {
        if (parts[i] <= 0) {
          std::snprintf(cells[i], sizeof cells[i], "-");
        } else {
          std::snprintf(cells[i], sizeof cells[i], i < 2 ? "%.1f" : "%.2f", parts[i]);
        }
      }
      std::printf("| %s | %s | %.1f | %.1f | %s | %s | %s | %s |\n", shape.name.c_str(), d.c_str(),
                  t[kMixed], t[kChunk], cells[0], cells[1], cells[2], cells[3]);
    }
  }
  return results;
}

// ---- Moving blocks: kvp_cache_pack / kvp_cache_unpack ----------------------------------------

// kvp_cache_pack and kvp_cache_unpack through the function table, so that
// the bench still runs its other cases against a library older than ABI 1.4.
const kvp_api* PackApi() {
  const kvp_api* api = kvp_get_api(KVP_ABI_MAJOR);
  if (api == nullptr || api->abi_minor < 4 || api->struct_size < KVP_API_STRUCT_SIZE_1_4) {
    return nullptr;
  }
  return api;
}

struct PackResult {
  std::string dtype;
  int64_t bytes = 0;            // the sequence's packed bytes, every layer
  double us[4] = {0, 0, 0, 0};  // pack all, unpack all, pack by layer, unpack by layer
};

// A 32k-token sequence of a 32-layer GQA 32/8 head-128 model (2048 blocks
// of 16 tokens, at shuffled places in a pool of 4096) packed and unpacked:
// every layer in one call, and layer by layer (32 calls, as an engine
// streams a prefill), each timed as a replayed CUDA graph. GB/s counts the
// bytes read and written, as the copy bandwidth does.
PackResult RunPackCase(const kvp_api* api, const std::string& dtype_name, int num_layers,
                       int samples) {
  constexpr int kTokens = 32768, kBlockSize = 16, kPool = 4096;
  constexpr int kBlocks = kTokens / kBlockSize;
  kvp_cache_config cfg;
  api->cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.num_layers = num_layers;
  cfg.num_blocks = kPool;
  cfg.block_size = kBlockSize;
  cfg.num_kv_heads = 8;
  cfg.head_size = 128;
  cfg.k_dtype = cfg.v_dtype = ParseDtype(dtype_name);
  kvp_cache* cache = nullptr;
  Check(api->cache_create(&cfg, &cache), "cache create");
  std::vector<int32_t> perm(kPool);
  for (int i = 0; i < kPool; ++i) perm[i] = i;
  std::mt19937 rng(7);
  std::shuffle(perm.begin(), perm.end(), rng);
  // Packed from the first half of the pool, unpacked into the other.
  int32_t* ids = nullptr;
  CheckCuda(cudaMalloc(&ids, sizeof(int32_t) * kPool), "malloc");
  CheckCuda(cudaMemcpy(ids, perm.data(), sizeof(int32_t) * kPool, cudaMemcpyHostToDevice), "copy");
  uint64_t all = 0, layer = 0;
  Check(api->cache_pack_size(cache, kBlocks, 0, &all), "pack size");
  Check(api->cache_pack_size(cache, kBlocks, 1, &layer), "pack size");
  void* buffer = nullptr;
  CheckCuda(cudaMalloc(&buffer, all), "malloc");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  auto args = [&](int32_t* block_ids, int first, int count, uint8_t* at, uint64_t bytes) {
    kvp_pack_args a;
    api->pack_args_init(&a);
    a.block_ids = block_ids;
    a.num_blocks = kBlocks;
    a.first_layer = first;
    a.num_layers = count;
    a.buffer = at;
    a.buffer_bytes = bytes;
    return a;
  };
  uint8_t* const buf = static_cast<uint8_t*>(buffer);
  PackResult r;
  r.dtype = dtype_name;
  r.bytes = static_cast<int64_t>(all);
  r.us[0] = 1e3 * GraphMedianMs(stream, 1, samples, [&](int) {
              const kvp_pack_args a = args(ids, 0, 0, buf, all);
              Check(api->cache_pack(cache, &a, stream), "pack");
            });
  r.us[1] = 1e3 * GraphMedianMs(stream, 1, samples, [&](int) {
              const kvp_pack_args a = args(ids + kBlocks, 0, 0, buf, all);
              Check(api->cache_unpack(cache, &a, stream), "unpack");
            });
  // Layer by layer: a call per layer, times num_layers = the whole sequence.
  r.us[2] = 1e3 * num_layers * GraphMedianMs(stream, num_layers, samples, [&](int i) {
              const int l = i % num_layers;
              const kvp_pack_args a = args(ids, l, 1, buf + l * layer, layer);
              Check(api->cache_pack(cache, &a, stream), "pack");
            });
  r.us[3] = 1e3 * num_layers * GraphMedianMs(stream, num_layers, samples, [&](int i) {
              const int l = i % num_layers;
              const kvp_pack_args a = args(ids + kBlocks, l, 1, buf + l * layer, layer);
              Check(api->cache_unpack(cache, &a, stream), "unpack");
            });
  CheckCuda(cudaStreamDestroy(stream), "stream");
  CheckCuda(cudaFree(buffer), "free");
  CheckCuda(cudaFree(ids), "free");
  api->cache_destroy(cache);
  return r;
}

// --pack: every dtype's pack and unpack against the copy bandwidth.
std::vector<PackResult> RunPackCases(bool quick, const std::vector<std::string>& dtypes,
                                     double copy_gbs) {
  std::vector<PackResult> results;
  const kvp_api* api = PackApi();
  if (api == nullptr) {
    uint32_t major = 0, minor = 0;
    kvp_abi_version(&major, &minor);
    std::printf("\npack cases skipped: libkvpage has ABI %u.%u, kvp_cache_pack needs 1.4\n", major,
                minor);
    return results;
  }
  const int layers = quick ? 8 : 32;
  std::printf(
      "\nkvp_cache_pack / kvp_cache_unpack of a 32768-token sequence (2048 blocks of 16 tokens, "
      "shuffled in a pool of 4096), %d layers, GQA 32/8 D=128; GB/s = 2 x bytes / time (read + "
      "write, as the copy bandwidth); graph times; by layer = %d calls of one layer\n",
      layers, layers);
  std::printf(
      "\n| KV | bytes | pack all (us) | GB/s | of copy BW | unpack all (us) | GB/s | of copy BW | "
      "pack by layer (us) | of copy BW | unpack by layer (us) | of copy BW |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& d : dtypes) {
    const PackResult r = RunPackCase(api, d, layers, quick ? 5 : 15);
    double gbs[4];
    for (int i = 0; i < 4; ++i) gbs[i] = 2.0 * r.bytes / (r.us[i] * 1e-6) / 1e9;
    std::printf(
        "| %s | %lld | %.1f | %.0f | %.1f%% | %.1f | %.0f | %.1f%% | %.1f | %.1f%% | %.1f | "
        "%.1f%% |\n",
        d.c_str(), static_cast<long long>(r.bytes), r.us[0], gbs[0], 100 * gbs[0] / copy_gbs,
        r.us[1], gbs[1], 100 * gbs[1] / copy_gbs, r.us[2], 100 * gbs[2] / copy_gbs, r.us[3],
        100 * gbs[3] / copy_gbs);
    std::fflush(stdout);
    results.push_back(r);
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, attend_only = false, pack_only = false, all = false;
  std::string csv, hashes;
  std::vector<std::string> dtypes = {"bf16", "fp8", "int8", "int4"};
  bool dtypes_given = false;
  std::vector<std::string> only;  // substrings of shape names (for profiling)
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    for (size_t p = 0; p <= s.size();) {
      size_t c = s.find(',', p);
      if (c == std::string::npos) c = s.size();
      parts.push_back(s.substr(p, c - p));
      p = c + 1;
    }
    return parts;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--precise")) {
      PreciseDecode() = true;
    } else if (!std::strcmp(argv[i], "--attend")) {
      attend_only = true;
    } else if (!std::strcmp(argv[i], "--pack")) {
      pack_only = true;
    } else if (!std::strcmp(argv[i], "--all")) {
      all = true;
    } else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--hashes") && i + 1 < argc) {
      hashes = argv[++i];
    } else if (!std::strcmp(argv[i], "--dtypes") && i + 1 < argc) {
      dtypes = split(argv[++i]);
      dtypes_given = true;
    } else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) {
      only = split(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--precise] [--attend | --pack | --all] [--csv FILE] "
                   "[--hashes FILE] [--dtypes bf16,fp8,int8,int4] "
                   "[--shapes SUBSTR,...  (e.g. MHA,ragged,'B=512',prefill)]\n"
                   "  --attend: only the kvp_attend (query chunk) cases; --pack: only the "
                   "kvp_cache_pack / unpack cases; --all: decode cases, then both\n",
                   argv[0]);
      return 2;
    }
  }
  // Default: the decode cases alone (their output as scripts/perf_page.py reads it).
  const bool run_decode = (!attend_only && !pack_only) || all;
  const bool run_attend = attend_only || all;
  const bool run_pack = pack_only || all;
  int32_t gpus = 0;
  Check(kvp_device_count(KVP_DEVICE_CUDA, &gpus), "device count");
  if (gpus == 0) {
    std::printf(
        "kvpage-bench: no CUDA device (or no CUDA backend in this build); nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "props");
  const double copy_gbs = CopyBandwidthGBs();
  std::printf("device: %s, %d SMs, L2 %d MiB | copy bandwidth (D2D, read+write): %.0f GB/s\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
  std::printf("kvpage %s | %s\n", kvp_version_string(), kvp_build_info());
  if (LinearBlockOrder()) {
    std::printf(
        "block tables: each sequence's blocks adjacent (KVPAGE_BENCH_BLOCK_ORDER=linear)\n");
  }
  if (HalfWriteInput()) std::printf("cache write input: FP16 (KVPAGE_BENCH_WRITE_INPUT=fp16)\n");
  if (PreciseDecode()) std::printf("decoders in precise mode (--precise)\n");

  std::vector<Shape> shapes;
  for (int b : {16, 32, 64, 128, 256, 512}) {
    shapes.push_back({"seed GQA 8/1 T=8192 D=128", 8, 1, 128, std::vector<int>(b, 8192)});
  }
  shapes.push_back({"MHA 32/32 T=4096 D=128", 32, 32, 128, std::vector<int>(64, 4096)});
  shapes.push_back({"GQA 32/8 T=8192 D=128", 32, 8, 128, std::vector<int>(64, 8192)});
  // Groups of 2 and 4: where the dispatcher's 16-bit threshold lies.
  shapes.push_back({"GQA 8/4 T=8192 D=128", 8, 4, 128, std::vector<int>(64, 8192)});
  shapes.push_back({"GQA 8/2 T=8192 D=128", 8, 2, 128, std::vector<int>(64, 8192)});
  {
    std::mt19937 lr(1234);  // a fixed ragged batch, the same in every run
    std::uniform_real_distribution<double> u(std::log(16.0), std::log(32768.0));
    std::vector<int> lens(256);
    for (int& l : lens) l = static_cast<int>(std::exp(u(lr)));
    shapes.push_back({"ragged 32/8 log-uniform 16..32768", 32, 8, 128, lens});
  }
  // Latency-bound steps: a few sequences over long contexts (a chat over a
  // long document), where a decode's fixed cost and the few KV heads to
  // spread over the SMs decide the time, not the bandwidth.
  for (int t : {32768, 131072}) {
    for (int hkv : {8, 1}) {
      const int hq = hkv == 8 ? 32 : 8;
      for (int b : {1, 2, 4, 8}) {
        shapes.push_back({"latency GQA " + std::to_string(hq) + "/" + std::to_string(hkv) +
                              " T=" + std::to_string(t) + " D=128",
                          hq, hkv, 128, std::vector<int>(b, t)});
      }
    }
  }
  if (quick) shapes = {shapes[1], shapes[6]};
  if (!run_decode) shapes.clear();
  if (!only.empty()) {
    std::vector<Shape> kept;
    for (const Shape& s : shapes) {
      const std::string label = s.name + " B=" + std::to_string(s.lens.size());
      for (const std::string& o : only) {
        if (label.find(o) != std::string::npos) {
          kept.push_back(s);
          break;
        }
      }
    }
    shapes = kept;
  }

  std::mt19937 rng(42);
  std::vector<Result> results;
  if (run_decode) {
    std::printf(
        "\n| shape | B | KV | time (us) | GB/s | of copy BW | write GB/s | eager time (us) | eager "
        "write GB/s |\n|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const Shape& s : shapes) {
    for (const std::string& d : dtypes) {
      Result r = RunCase(s, d, copy_gbs, quick ? 20 : 60, size_t(prop.l2CacheSize), rng);
      std::printf("| %s | %d | %s | %.1f | %.0f | %.1f%% | %.0f | %.1f | %.0f |\n", r.shape.c_str(),
                  r.batch, r.dtype.c_str(), r.us, r.gbs, 100 * r.frac, r.write_gbs, r.eager_us,
                  r.eager_write_gbs);
      std::fflush(stdout);
      results.push_back(r);
    }
  }
  std::vector<AttendResult> attend_results;
  if (run_attend) {
    attend_results = RunAttendCases(quick, only, dtypes, size_t(prop.l2CacheSize));
  }
  if (run_pack) {
    // FP8 blocks are INT8's size: by default BF16, INT8 and INT4.
    RunPackCases(quick, dtypes_given ? dtypes : std::vector<std::string>{"bf16", "int8", "int4"},
                 copy_gbs);
  }
  if (!csv.empty() && run_decode) {
    FILE* f = std::fopen(csv.c_str(), "w");
    if (f) {
      std::fprintf(f,
                   "device,copy_gbs,shape,batch,kv_dtype,time_us,gbs,fraction,write_gbs,"
                   "eager_time_us,eager_write_gbs\n");
      for (const Result& r : results) {
        std::fprintf(f, "%s,%.1f,%s,%d,%s,%.2f,%.1f,%.4f,%.1f,%.2f,%.1f\n", prop.name, copy_gbs,
                     r.shape.c_str(), r.batch, r.dtype.c_str(), r.us, r.gbs, r.frac, r.write_gbs,
                     r.eager_us, r.eager_write_gbs);
      }
      std::fclose(f);
    }
  }
  if (!hashes.empty()) {
    FILE* f = std::fopen(hashes.c_str(), "w");
    if (f) {
      for (const Result& r : results) {
        std::fprintf(f, "%s,%d,%s,%016llx\n", r.shape.c_str(), r.batch, r.dtype.c_str(),
                     static_cast<unsigned long long>(r.output_hash));
      }
      for (const AttendResult& r : attend_results) {
        std::fprintf(f, "%s,%d,%s,%016llx\n", r.label.c_str(), r.seqs, r.dtype.c_str(),
                     static_cast<unsigned long long>(r.output_hash));
      }
      std::fclose(f);
    }
  }
  if (!csv.empty() && !attend_results.empty()) {
    const std::string path = AttendCsvPath(csv);
    FILE* f = std::fopen(path.c_str(), "w");
    if (f) {
      // shape, batch, kv_dtype and time_us as in the decode CSV
      // (scripts/ab_compare.py keys rows by them).
      std::fprintf(f,
                   "device,shape,batch,kv_dtype,time_us,tflops,fraction_of_peak,eager_time_us,"
                   "query_tokens,max_context,flops,non_finite\n");
      for (const AttendResult& r : attend_results) {
        std::fprintf(f, "%s,%s,%d,%s,%.2f,%.2f,%.4f,%.2f,%lld,%d,%.6e,%lld\n", prop.name,
                     r.label.c_str(), r.seqs, r.dtype.c_str(), r.us, r.tflops, r.frac, r.eager_us,
                     static_cast<long long>(r.q_tokens), r.max_ctx, r.flops,
                     static_cast<long long>(r.non_finite));
      }
      std::fclose(f);
      std::printf("\nattend rows: %s\n", path.c_str());
    }
  }
  const bool attend_failed = std::any_of(attend_results.begin(), attend_results.end(),
                                         [](const AttendResult& r) { return r.non_finite != 0; });
  return attend_failed ? 1 : 0;
}
