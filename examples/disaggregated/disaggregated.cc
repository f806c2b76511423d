// SPDX-License-Identifier: Apache-2.0
// Disaggregated serving with kvpage and NCCL: a prefill process computes a
// batch's KV (here: writes random K/V with kvp_cache_write), packs the
// sequences' blocks layer by layer (kvp_cache_pack) and sends each layer
// with ncclSend while it packs the next (two buffers); a decode process on
// another GPU receives each layer, unpacks it (kvp_cache_unpack) into its
// own cache at the blocks its own sequences got (kvp_seq_create /
// kvp_seq_append), and decodes. The format signatures are exchanged and
// checked first. The prefill process decodes too and sends its output: the
// decode process's must be bit-identical, else both exit with 1.
//
// Two processes on two GPUs: by default the parent forks the decode
// process, creates the NCCL id (ncclGetUniqueId) and hands it over a pipe;
// with --rank R --id-file PATH each rank is launched on its own (rank 0
// writes the id to PATH, rank 1 waits for it).
//
//   kvpage-disaggregated [--gpus 0,1] [--dtype int8] [--seqs 6] [--layers 4] [--seed N]
//   kvpage-disaggregated --bench [--gpus 0,1] [--dtypes bf16,int8,int4] [--iters 10]
//   kvpage-disaggregated --rank 0|1 --id-file PATH [the options above]
//
// --bench: the end-to-end time to move one 32768-token sequence of a
// 32-layer GQA 32/8 head-128 model from one GPU to the other (first pack to
// last unpack, pipelined), against NCCL moving the same bytes in the same
// per-layer messages without kvpage, in the same run; timed on the decode
// rank with CUDA events after a barrier, median of --iters runs.
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvpage/kvpage.h"

namespace {

int g_rank = -1;  // for messages

[[noreturn]] void Die(const char* what, const std::string& why) {
  std::fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, why.c_str());
  std::exit(1);
}
void Check(kvp_error* e, const char* what) {
  if (e == nullptr) return;
  const std::string why =
      std::string(kvp_error_code_name(kvp_error_code(e))) + ": " + kvp_error_message(e);
  kvp_error_free(e);
  Die(what, why);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(what, cudaGetErrorString(e));
}
void Check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) Die(what, ncclGetErrorString(e));
}

struct Options {
  int gpus[2] = {0, 1};
  int dtype = KVP_DTYPE_INT8;
  int seqs = 6;
  int layers = 4;
  uint32_t seed = 0;  // 0: a fresh one (printed)
  bool bench = false;
  std::vector<std::string> bench_dtypes = {"bf16", "int8", "int4"};
  int iters = 10;
  int rank = -1;  // -1: fork both ranks
  std::string id_file;
};

int ParseDtype(const std::string& s) {
  if (s == "bf16") return KVP_DTYPE_BF16;
  if (s == "fp16") return KVP_DTYPE_FP16;
  if (s == "fp8") return KVP_DTYPE_FP8_E4M3;
  if (s == "int8") return KVP_DTYPE_INT8;
  if (s == "int4") return KVP_DTYPE_INT4;
  Die("--dtype", "unknown dtype " + s + " (bf16, fp16, fp8, int8, int4)");
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// The model both ranks serve.
struct Model {
  int layers, kv_heads = 8, q_heads = 32, head_size = 128, block_size = 16, dtype;
};

// One rank's side of the connection: its GPU, streams, communicator.
struct Rank {
  int rank, peer;
  ncclComm_t comm;
  cudaStream_t work, net;  // kvpage's kernels; NCCL's
  void* scratch;           // 4 KiB of device memory for small messages
};

// `bytes` of host memory from rank `from` to the other rank (both call it).
void Exchange(const Rank& r, int from, void* host, size_t bytes) {
  if (r.rank == from) {
    Check(cudaMemcpy(r.scratch, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    Check(ncclSend(r.scratch, bytes, ncclUint8, r.peer, r.comm, r.net), "ncclSend");
    Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");
  } else {
    Check(ncclRecv(r.scratch, bytes, ncclUint8, r.peer, r.comm, r.net), "ncclRecv");
    Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");
    Check(cudaMemcpy(host, r.scratch, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
}

// Both ranks return from it at about the same time.
void Barrier(const Rank& r) {
  Check(ncclAllReduce(r.scratch, r.scratch, 1, ncclFloat32, ncclSum, r.comm, r.net),
        "ncclAllReduce");
  Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");
}

kvp_cache* MakeCache(const Model& m, int gpu, int num_blocks) {
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.device_kind = KVP_DEVICE_CUDA;
  cfg.device_ordinal = gpu;
  cfg.num_layers = m.layers;
  cfg.num_blocks = num_blocks;
  cfg.block_size = m.block_size;
  cfg.num_kv_heads = m.kv_heads;
  cfg.head_size = m.head_size;
  cfg.k_dtype = m.dtype;
  cfg.v_dtype = m.dtype;
  kvp_cache* cache = nullptr;
  Check(kvp_cache_create(&cfg, &cache), "kvp_cache_create");
  return cache;
}

// The receiver checks the sender's format before any block moves; both
// ranks learn the verdict. Returns the sender's signature.
std::vector<uint8_t> AgreeOnFormat(const Rank& r, const kvp_cache* cache) {
  std::vector<uint8_t> sig(KVP_FORMAT_SIGNATURE_BYTES);
  Check(kvp_cache_format_signature(cache, sig.data(), sig.size()), "kvp_cache_format_signature");
  Exchange(r, 0, sig.data(), sig.size());
  int32_t ok = 1;
  if (r.rank == 1) {
    kvp_error* e = kvp_cache_check_signature(cache, sig.data(), sig.size());
    if (e != nullptr) {
      std::fprintf(stderr, "rank 1: the prefill cache's format differs: %s\n",
                   kvp_error_message(e));
      kvp_error_free(e);
      ok = 0;
    }
  }
  Exchange(r, 1, &ok, sizeof(ok));
  if (!ok) Die("format signature", "the caches cannot exchange blocks");
  return sig;
}

// Blocks of sequences `seqs`, in order (each sequence's first
// ceil(len / block_size) table entries), and the dense table with lengths.
struct Blocks {
  std::vector<int32_t> ids, table, lens;
  int width = 0;
};
Blocks SequenceBlocks(const kvp_cache* cache, const std::vector<int64_t>& seqs, int width,
                      int block_size) {
  Blocks b;
  b.width = width;
  b.table.assign(seqs.size() * width, 0);
  b.lens.assign(seqs.size(), 0);
  Check(kvp_cache_export_block_table(cache, seqs.data(), static_cast<int32_t>(seqs.size()), width,
                                     width, b.table.data(), b.lens.data()),
        "kvp_cache_export_block_table");
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int j = 0; j < (b.lens[s] + block_size - 1) / block_size; ++j) {
      b.ids.push_back(b.table[s * width + j]);
    }
  }
  return b;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  Check(cudaMalloc(&d, std::max<size_t>(host.size(), 1) * sizeof(T)), "cudaMalloc");
  Check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  // Done before kernels on non-blocking streams read it.
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return d;
}

// The layer-by-layer transfer of `num_blocks` blocks (ids on the device):
// rank 0 packs layer l into buffer l % 2 on its work stream and sends it on
// its NCCL stream, packing layer l + 1 meanwhile; rank 1 receives layer l
// into buffer l % 2 and unpacks it while the next layer arrives. Events
// keep each buffer from being refilled before it has been sent (unpacked).
struct Pipeline {
  void* buf[2] = {nullptr, nullptr};
  uint64_t layer_bytes = 0;
  cudaEvent_t filled[2], drained[2];
};

Pipeline MakePipeline(const kvp_cache* cache, int num_blocks) {
  Pipeline p;
  Check(kvp_cache_pack_size(cache, num_blocks, 1, &p.layer_bytes), "kvp_cache_pack_size");
  for (int b = 0; b < 2; ++b) {
    Check(cudaMalloc(&p.buf[b], p.layer_bytes), "cudaMalloc");
    Check(cudaEventCreateWithFlags(&p.filled[b], cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventCreateWithFlags(&p.drained[b], cudaEventDisableTiming), "cudaEventCreate");
  }
  return p;
}

void FreePipeline(Pipeline* p) {
  for (int b = 0; b < 2; ++b) {
    cudaFree(p->buf[b]);
    cudaEventDestroy(p->filled[b]);
    cudaEventDestroy(p->drained[b]);
  }
}

// Enqueues the transfer on this rank's streams (returns without waiting).
void Transfer(const Rank& r, Pipeline& p, kvp_cache* cache, const int32_t* ids, int num_blocks,
              int layers, const std::vector<uint8_t>& peer_signature) {
  for (int l = 0; l < layers; ++l) {
    const int b = l % 2;
    kvp_pack_args a;
    kvp_pack_args_init(&a);
    a.block_ids = ids;
    a.num_blocks = num_blocks;
    a.first_layer = l;
    a.num_layers = 1;
    a.buffer = p.buf[b];
    a.buffer_bytes = p.layer_bytes;
    if (r.rank == 0) {
      Check(cudaStreamWaitEvent(r.work, p.drained[b], 0), "cudaStreamWaitEvent");
      Check(kvp_cache_pack(cache, &a, r.work), "kvp_cache_pack");
      Check(cudaEventRecord(p.filled[b], r.work), "cudaEventRecord");
      Check(cudaStreamWaitEvent(r.net, p.filled[b], 0), "cudaStreamWaitEvent");
      Check(ncclSend(p.buf[b], p.layer_bytes, ncclUint8, r.peer, r.comm, r.net), "ncclSend");
      Check(cudaEventRecord(p.drained[b], r.net), "cudaEventRecord");
    } else {
      a.signature = peer_signature.data();  // checked on the host: no cost on the GPU
      Check(cudaStreamWaitEvent(r.net, p.drained[b], 0), "cudaStreamWaitEvent");
      Check(ncclRecv(p.buf[b], p.layer_bytes, ncclUint8, r.peer, r.comm, r.net), "ncclRecv");
      Check(cudaEventRecord(p.filled[b], r.net), "cudaEventRecord");
      Check(cudaStreamWaitEvent(r.work, p.filled[b], 0), "cudaStreamWaitEvent");
      Check(kvp_cache_unpack(cache, &a, r.work), "kvp_cache_unpack");
      Check(cudaEventRecord(p.drained[b], r.work), "cudaEventRecord");
    }
  }
}

// ---- The demo: move a batch, decode on both sides, compare ---------------------------------

int Demo(const Rank& r, const Options& opt, int gpu) {
  Model m;
  m.layers = opt.layers;
  m.dtype = opt.dtype;
  std::mt19937 rng(opt.seed);  // the same numbers on both ranks
  std::uniform_int_distribution<int> len_dist(1, 700);
  std::vector<int> lens(opt.seqs);
  for (int& len : lens) len = len_dist(rng);
  const int max_len = *std::max_element(lens.begin(), lens.end());
  const int width = (max_len + m.block_size - 1) / m.block_size;
  int total_blocks = 0;
  for (int len : lens) total_blocks += (len + m.block_size - 1) / m.block_size;

  // Pools of different sizes; the decode side holds another sequence first,
  // so its blocks are others than the prefill side's.
  kvp_cache* cache = MakeCache(m, gpu, total_blocks + (r.rank == 0 ? 8 : 40));
  const std::vector<uint8_t> peer_sig = AgreeOnFormat(r, cache);
  if (r.rank == 1) {
    int64_t other = 0;
    Check(kvp_seq_create(cache, &other), "kvp_seq_create");
    Check(kvp_seq_append(cache, other, 20 * m.block_size, nullptr, nullptr), "kvp_seq_append");
  }
  std::vector<int64_t> seqs(opt.seqs);
  const int64_t dense = int64_t{m.kv_heads} * m.head_size;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int s = 0; s < opt.seqs; ++s) {
    std::vector<int64_t> slots(lens[s]);
    Check(kvp_seq_create(cache, &seqs[s]), "kvp_seq_create");
    Check(kvp_seq_append(cache, seqs[s], lens[s], slots.data(), r.work), "kvp_seq_append");
    if (r.rank != 0) continue;  // the decode side receives its K/V
    int64_t* d_slots = ToDevice(slots);
    for (int l = 0; l < m.layers; ++l) {
      std::vector<float> k(lens[s] * dense), v(lens[s] * dense);
      for (float& x : k) x = 2.0f * normal(rng);
      for (float& x : v) x = normal(rng);
      float* d_k = ToDevice(k);
      float* d_v = ToDevice(v);
      kvp_write_args w;
      kvp_write_args_init(&w);
      w.layer = l;
      w.num_tokens = lens[s];
      w.input_dtype = KVP_DTYPE_FP32;
      w.key = d_k;
      w.value = d_v;
      w.slot_mapping = d_slots;
      Check(kvp_cache_write(cache, &w, r.work), "kvp_cache_write");
      Check(cudaStreamSynchronize(r.work), "cudaStreamSynchronize");
      cudaFree(d_k);
      cudaFree(d_v);
    }
    cudaFree(d_slots);
  }
  const Blocks blocks = SequenceBlocks(cache, seqs, width, m.block_size);
  int32_t* d_ids = ToDevice(blocks.ids);
  std::printf("rank %d (GPU %d, %s): %d sequences, %d blocks, first ids %d %d %d\n", r.rank, gpu,
              r.rank == 0 ? "prefill" : "decode", opt.seqs, total_blocks, blocks.ids[0],
              blocks.ids.size() > 1 ? blocks.ids[1] : -1,
              blocks.ids.size() > 2 ? blocks.ids[2] : -1);

  Pipeline p = MakePipeline(cache, total_blocks);
  Transfer(r, p, cache, d_ids, total_blocks, m.layers, peer_sig);
  Check(cudaStreamSynchronize(r.work), "cudaStreamSynchronize");
  Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");

  // Both sides decode the batch with the same queries.
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = m.q_heads;
  dc.max_num_seqs = opt.seqs;
  dc.max_context_len = width * m.block_size;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* dec = nullptr;
  Check(kvp_decoder_create(cache, &dc, &dec), "kvp_decoder_create");
  const size_t row = static_cast<size_t>(opt.seqs) * m.q_heads * m.head_size;
  std::vector<float> q(row);
  std::mt19937 q_rng(opt.seed + 1);  // the same queries on both ranks
  for (float& x : q) x = normal(q_rng);
  float* d_q = ToDevice(q);
  int32_t* d_table = ToDevice(blocks.table);
  int32_t* d_lens = ToDevice(blocks.lens);
  float* d_out = nullptr;
  Check(cudaMalloc(&d_out, row * m.layers * sizeof(float)), "cudaMalloc");
  for (int l = 0; l < m.layers; ++l) {
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.layer = l;
    a.num_seqs = opt.seqs;
    a.q = d_q;
    a.block_table = d_table;
    a.block_table_width = width;
    a.seq_lens = d_lens;
    a.out = d_out + row * l;
    Check(kvp_decode(dec, &a, r.work), "kvp_decode");
  }
  Check(cudaStreamSynchronize(r.work), "cudaStreamSynchronize");

  // The prefill side's output goes to the decode side, which compares.
  std::vector<float> mine(row * m.layers), theirs(row * m.layers);
  Check(cudaMemcpy(mine.data(), d_out, mine.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  if (r.rank == 0) {
    Check(ncclSend(d_out, mine.size() * sizeof(float), ncclUint8, r.peer, r.comm, r.net),
          "ncclSend");
  } else {
    Check(ncclRecv(d_out, theirs.size() * sizeof(float), ncclUint8, r.peer, r.comm, r.net),
          "ncclRecv");
  }
  Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");
  int32_t mismatches = 0;
  if (r.rank == 1) {
    Check(cudaMemcpy(theirs.data(), d_out, theirs.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    for (size_t i = 0; i < mine.size(); ++i) {
      if (std::memcmp(&mine[i], &theirs[i], sizeof(float)) != 0 && mismatches++ < 5) {
        std::fprintf(stderr, "rank 1: output %zu: decode side %.9g, prefill side %.9g\n", i,
                     mine[i], theirs[i]);
      }
    }
  }
  Exchange(r, 1, &mismatches, sizeof(mismatches));
  if (r.rank == 1) {
    std::printf("rank 1: %zu outputs (%d layers x %d sequences x %d heads x %d) %s\n", mine.size(),
                m.layers, opt.seqs, m.q_heads, m.head_size,
                mismatches == 0 ? "bit-identical to the prefill side's: OK"
                                : "DIFFER from the prefill side's");
  }
  cudaFree(d_q);
  cudaFree(d_table);
  cudaFree(d_lens);
  cudaFree(d_out);
  cudaFree(d_ids);
  FreePipeline(&p);
  kvp_decoder_destroy(dec);
  kvp_cache_destroy(cache);
  return mismatches == 0 ? 0 : 1;
}

// ---- --bench: end to end against NCCL alone ------------------------------------------------

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Bench(const Rank& r, const Options& opt, int gpu) {
  constexpr int kTokens = 32768;
  if (r.rank == 1) {
    std::printf(
        "\none %d-token sequence, 32 layers, GQA 32/8, head size 128, block size 16, GPU %d -> "
        "GPU %d; times on the decode rank, median of %d; NCCL alone: the same bytes in the same "
        "per-layer messages\n\n| KV | bytes | NCCL alone (ms) | GB/s | end to end (ms) | GB/s | "
        "of NCCL |\n|---|---|---|---|---|---|---|\n",
        kTokens, opt.gpus[0], opt.gpus[1], opt.iters);
  }
  for (const std::string& name : opt.bench_dtypes) {
    Model m;
    m.layers = 32;
    m.dtype = ParseDtype(name);
    const int blocks = kTokens / m.block_size;
    kvp_cache* cache = MakeCache(m, gpu, blocks + 64);
    const std::vector<uint8_t> peer_sig = AgreeOnFormat(r, cache);
    if (r.rank == 1) {
      int64_t other = 0;  // the decode side's ids start elsewhere
      Check(kvp_seq_create(cache, &other), "kvp_seq_create");
      Check(kvp_seq_append(cache, other, 64 * m.block_size, nullptr, nullptr), "kvp_seq_append");
    }
    std::vector<int64_t> seq(1);
    Check(kvp_seq_create(cache, &seq[0]), "kvp_seq_create");
    Check(kvp_seq_append(cache, seq[0], kTokens, nullptr, nullptr), "kvp_seq_append");
    const Blocks b = SequenceBlocks(cache, seq, blocks, m.block_size);
    int32_t* d_ids = ToDevice(b.ids);
    Pipeline p = MakePipeline(cache, blocks);
    cudaEvent_t start, stop;
    Check(cudaEventCreate(&start), "cudaEventCreate");
    Check(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<float> nccl_ms, e2e_ms;
    for (int it = -2; it < opt.iters; ++it) {  // two warm-up runs
      // NCCL alone: the same messages from and into the same buffers.
      Barrier(r);
      Check(cudaEventRecord(start, r.net), "cudaEventRecord");
      for (int l = 0; l < m.layers; ++l) {
        if (r.rank == 0) {
          Check(ncclSend(p.buf[l % 2], p.layer_bytes, ncclUint8, r.peer, r.comm, r.net),
                "ncclSend");
        } else {
          Check(ncclRecv(p.buf[l % 2], p.layer_bytes, ncclUint8, r.peer, r.comm, r.net),
                "ncclRecv");
        }
      }
      Check(cudaEventRecord(stop, r.net), "cudaEventRecord");
      Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (it >= 0) nccl_ms.push_back(ms);
      // End to end: first pack to last unpack.
      Barrier(r);
      Check(cudaEventRecord(start, r.net), "cudaEventRecord");
      Transfer(r, p, cache, d_ids, blocks, m.layers, peer_sig);
      Check(cudaEventRecord(stop, r.work), "cudaEventRecord");
      Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      Check(cudaStreamSynchronize(r.net), "cudaStreamSynchronize");
      Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (it >= 0) e2e_ms.push_back(ms);
    }
    if (r.rank == 1) {
      const double bytes = double(p.layer_bytes) * m.layers;
      const double nccl = Median(nccl_ms), e2e = Median(e2e_ms);
      std::printf("| %s | %.0f | %.3f | %.1f | %.3f | %.1f | %.1f%% |\n", name.c_str(), bytes, nccl,
                  bytes / (nccl * 1e-3) / 1e9, e2e, bytes / (e2e * 1e-3) / 1e9, 100 * nccl / e2e);
      std::fflush(stdout);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    FreePipeline(&p);
    cudaFree(d_ids);
    kvp_cache_destroy(cache);
  }
  return 0;
}

int RunRank(const Options& opt, int rank, const ncclUniqueId& id) {
  g_rank = rank;
  const int gpu = opt.gpus[rank];
  Check(cudaSetDevice(gpu), "cudaSetDevice");
  Rank r;
  r.rank = rank;
  r.peer = 1 - rank;
  Check(ncclCommInitRank(&r.comm, 2, id, rank), "ncclCommInitRank");
  Check(cudaStreamCreateWithFlags(&r.work, cudaStreamNonBlocking), "cudaStreamCreate");
  // NCCL's stream at the highest priority: its kernel's blocks are placed
  // before the pack and unpack kernels' (which fill every SM), so a layer's
  // transfer starts as soon as its buffer is ready instead of after the
  // next layer's pack has drained.
  int least = 0, greatest = 0;
  Check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  Check(cudaStreamCreateWithPriority(&r.net, cudaStreamNonBlocking, greatest),
        "cudaStreamCreateWithPriority");
  Check(cudaMalloc(&r.scratch, 4096), "cudaMalloc");
  Check(cudaMemset(r.scratch, 0, 4096), "cudaMemset");
  const int code = opt.bench ? Bench(r, opt, gpu) : Demo(r, opt, gpu);
  cudaFree(r.scratch);
  ncclCommDestroy(r.comm);
  cudaStreamDestroy(r.work);
  cudaStreamDestroy(r.net);
  return code;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--bench") {
      o.bench = true;
    } else if (a == "--gpus" && has_value) {
      const std::vector<std::string> g = Split(argv[++i]);
      if (g.size() != 2) Die("--gpus", "takes two device ordinals, e.g. 0,1");
      o.gpus[0] = std::atoi(g[0].c_str());
      o.gpus[1] = std::atoi(g[1].c_str());
    } else if (a == "--dtype" && has_value) {
      o.dtype = ParseDtype(argv[++i]);
    } else if (a == "--dtypes" && has_value) {
      o.bench_dtypes = Split(argv[++i]);
      for (const std::string& d : o.bench_dtypes) ParseDtype(d);
    } else if (a == "--seqs" && has_value) {
      o.seqs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--layers" && has_value) {
      o.layers = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--iters" && has_value) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seed" && has_value) {
      o.seed = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--rank" && has_value) {
      o.rank = std::atoi(argv[++i]);
    } else if (a == "--id-file" && has_value) {
      o.id_file = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--gpus 0,1] [--dtype int8] [--seqs 6] [--layers 4] [--seed N]\n"
                   "       %s --bench [--gpus 0,1] [--dtypes bf16,int8,int4] [--iters 10]\n"
                   "       add --rank 0|1 --id-file PATH to launch each rank on its own\n",
                   argv[0], argv[0]);
      std::exit(2);
    }
  }
  if (o.rank != -1 && ((o.rank != 0 && o.rank != 1) || o.id_file.empty())) {
    Die("--rank", "needs 0 or 1 and --id-file PATH");
  }
  return o;
}

// Rank 0 writes the id to `path` (whole, through a rename); rank 1 waits for it.
ncclUniqueId IdThroughFile(int rank, const std::string& path) {
  ncclUniqueId id;
  if (rank == 0) {
    Check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr || std::fwrite(&id, sizeof(id), 1, f) != 1 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), path.c_str()) != 0) {
      Die("--id-file", "cannot write " + path);
    }
    return id;
  }
  for (int waited = 0; waited < 6000; ++waited) {  // 10 minutes
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f != nullptr) {
      const bool whole = std::fread(&id, sizeof(id), 1, f) == 1;
      std::fclose(f);
      if (whole) return id;
    }
    usleep(100000);
  }
  Die("--id-file", "rank 0 never wrote " + path);
}

pid_t g_child = 0;
volatile sig_atomic_t g_child_done = 0, g_child_code = 0;

// The parent must not wait in NCCL for a decode process that has died.
void OnChildExit(int) {
  int status = 0;
  if (waitpid(g_child, &status, WNOHANG) == g_child) {
    g_child_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    g_child_done = 1;
    if (g_child_code != 0) {
      static const char msg[] = "rank 0: the decode process failed\n";
      ssize_t ignored = write(2, msg, sizeof(msg) - 1);
      (void)ignored;
      _exit(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = Parse(argc, argv);
  if (opt.seed == 0) opt.seed = std::random_device{}();
  if (!opt.bench) std::printf("seed %u (--seed %u replays it)\n", opt.seed, opt.seed);
  std::fflush(stdout);
  if (opt.rank >= 0) return RunRank(opt, opt.rank, IdThroughFile(opt.rank, opt.id_file));

  // One launch, two processes: nothing touches CUDA before the fork.
  int fds[2];
  if (pipe(fds) != 0) Die("pipe", std::strerror(errno));
  g_child = fork();
  if (g_child < 0) Die("fork", std::strerror(errno));
  if (g_child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the prefill process
    close(fds[1]);
    ncclUniqueId id;
    size_t got = 0;
    while (got < sizeof(id)) {
      const ssize_t n = read(fds[0], reinterpret_cast<char*>(&id) + got, sizeof(id) - got);
      if (n <= 0) Die("pipe", "the prefill process sent no NCCL id");
      got += static_cast<size_t>(n);
    }
    close(fds[0]);
    const int code = RunRank(opt, 1, id);
    // _exit skips the parent's atexit handlers, and with them stdio's
    // flush: a redirected stdout would lose the decode side's report.
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  struct sigaction on_child;
  std::memset(&on_child, 0, sizeof(on_child));
  on_child.sa_handler = OnChildExit;
  on_child.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &on_child, nullptr);
  close(fds[0]);
  g_rank = 0;
  ncclUniqueId id;
  Check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (write(fds[1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    Die("pipe", "cannot send the NCCL id");
  }
  close(fds[1]);
  const int code = RunRank(opt, 0, id);
  signal(SIGCHLD, SIG_DFL);
  int child = g_child_code;
  if (!g_child_done) {
    int status = 0;
    child = waitpid(g_child, &status, 0) == g_child && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  return code != 0 ? code : child;
}
