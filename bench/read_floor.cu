// SPDX-License-Identifier: Apache-2.0
// kvpage-read-floor: how fast the pieces a decode reads can be read at
// all, through the same shuffled pool of blocks as kvpage-bench, without
// the decode's arithmetic. Per block and KV head a decode reads a K piece,
// a V piece and (quantized caches) a K and a V scale piece, each
// contiguous; here a producer warp per thread block copies them with the
// copy engine (cp.async.bulk, sm_90) into a ring of shared-memory stages
// that four consumer warps read back whole (one 16-byte load a lane at a
// time) and release. Work items are (sequence, partition) pairs, taken
// one per thread block (the decode's grid), by a persistent grid in a
// fixed stride, or by a persistent grid from a queue. Every (item order,
// partition size, blocks a stage, stages) variant is timed as kvpage-bench
// times a decode: a CUDA graph of 16 calls rotating through more than 4x
// the L2, the median of 11 replays, next to the copy bandwidth of the same
// run. What the decode adds to the best of these is its own consumer's
// cost (docs/archive.md, "Read floor and scattered blocks").
//
//   kvpage-read-floor [--cases SUBSTR,...] [--linear]
//
// --cases keeps the cases whose name ("bf16 B=128", ...) contains one of
// the substrings; --linear gives each sequence adjacent blocks instead.
// The "small" cases (4 sequences of 2048 tokens) run only when named, for
// compute-sanitizer: `compute-sanitizer kvpage-read-floor --cases small`.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Params {
  const uint8_t* layer;  // K region, V region, K scale region, V scale region
  int64_t k_off, v_off, ks_off, vs_off;
  int kbytes, vbytes, sbytes;  // per block (one KV head)
  const int* table;
  int width;  // table row entries
  const int* lens;
  int B, P;            // sequences, partition tokens
  int parts;           // partitions per sequence (capacity)
  int items;           // B * parts
  int mode;            // 0: one CTA per item, 1: static stride, 2: queue
  int chunk;           // blocks per stage
  unsigned* counters;  // [0] ticket, [1] CTAs done (mode 2)
  unsigned* sink;
};

constexpr int kConsumers = 4;
constexpr int kThreads = 32 * (kConsumers + 1);

// The barrier and copy instructions exist from sm_90 on; main() checks the
// device, and for older architectures these compile to nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FLOOR_SM90(...)
#else
#define FLOOR_SM90(...) __VA_ARGS__
#endif

__device__ __forceinline__ uint32_t Smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* b, int count) {
  FLOOR_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(Smem(b)), "r"(count));)
}
__device__ __forceinline__ void MbarExpect(uint64_t* b, int bytes) {
  FLOOR_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(Smem(b)),
                          "r"(bytes)
                          : "memory");)
}
__device__ __forceinline__ void MbarArrive(uint64_t* b) {
  FLOOR_SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(Smem(b)) : "memory");)
}
__device__ __forceinline__ void MbarWait(uint64_t* b, uint32_t parity) {
  FLOOR_SM90(asm volatile("{\n .reg .pred p;\n"
                          "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                          " @!p bra W;\n}\n" ::"r"(Smem(b)),
                          "r"(parity)
                          : "memory");)
}
__device__ __forceinline__ void Bulk(void* dst, const void* src, int bytes, uint64_t* b) {
  FLOOR_SM90(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
                          "[%1], %2, [%3];\n" ::"r"(Smem(dst)),
                          "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(Smem(b))
                          : "memory");)
}

template <int S>
__global__ void __launch_bounds__(kThreads) Floor(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[S], empty[S];
  __shared__ int info[S];  // blocks in the stage, or -1: no more
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int stage_bytes = p.chunk * (p.kbytes + p.vbytes + 2 * p.sbytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], 1);
    }
    FLOOR_SM90(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");)
  }
  __syncthreads();
  if (warp == 0) {
    // Producer.
    int k = 0;  // stage sequence number
    int item = p.mode == 2 ? -1 : static_cast<int>(blockIdx.x);
    __shared__ int ticket;
    while (true) {
      if (p.mode == 2) {
        if (lane == 0) ticket = atomicAdd(&p.counters[0], 1u);
        __syncwarp();
        item = ticket;
        __syncwarp();
      }
      if (item >= p.items) break;
      const int seq = item / p.parts, part = item % p.parts;
      const int len = p.lens[seq];
      const int start = part * p.P;
      if (start < len) {
        const int n = min(p.P, len - start);
        const int nblk = (n + 15) / 16;
        const int* row = p.table + int64_t{seq} * p.width + start / 16;
        for (int b0 = 0; b0 < nblk; b0 += 32) {
          const int id = b0 + lane < nblk ? row[b0 + lane] : 0;
          const int m = min(32, nblk - b0);
          for (int j = 0; j < m; j += p.chunk) {
            const int s = k % S;
            if (k >= S) MbarWait(&empty[s], ((k / S) - 1) & 1);
            const int c = min(p.chunk, m - j);
            uint8_t* dst = smem + s * stage_bytes;
            if (lane == 0) {
              info[s] = c;
              MbarExpect(&full[s], c * (p.kbytes + p.vbytes + 2 * p.sbytes));
            }
            __syncwarp();
            const int64_t b = __shfl_sync(0xffffffffu, id, (j + lane) & 31);
            if (lane < c) {
              uint8_t* d = dst + lane * (p.kbytes + p.vbytes + 2 * p.sbytes);
              Bulk(d, p.layer + p.k_off + b * p.kbytes, p.kbytes, &full[s]);
              Bulk(d + p.kbytes, p.layer + p.v_off + b * p.vbytes, p.vbytes, &full[s]);
              if (p.sbytes) {
                Bulk(d + p.kbytes + p.vbytes, p.layer + p.ks_off + b * p.sbytes, p.sbytes,
                     &full[s]);
                Bulk(d + p.kbytes + p.vbytes + p.sbytes, p.layer + p.vs_off + b * p.sbytes,
                     p.sbytes, &full[s]);
              }
            }
            ++k;
          }
        }
      }
      if (p.mode == 0) break;
      if (p.mode == 1) item += gridDim.x;
    }
    // No more: one sentinel stage per consumer.
    for (int w = 0; w < kConsumers; ++w, ++k) {
      const int s = k % S;
      if (k >= S) MbarWait(&empty[s], ((k / S) - 1) & 1);
      if (lane == 0) {
        info[s] = -1;
        MbarArrive(&full[s]);
      }
      __syncwarp();
    }
    if (p.mode == 2 && lane == 0) {
      __threadfence();
      if (atomicAdd(&p.counters[1], 1u) == gridDim.x - 1) {
        p.counters[0] = 0;
        p.counters[1] = 0;
      }
    }
  } else {
    const int w = warp - 1;
    uint32_t acc = 0;
    for (int k = w;; k += kConsumers) {
      const int s = k % S;
      MbarWait(&full[s], (k / S) & 1);
      const int c = info[s];
      if (c < 0) break;
      const uint4* src = reinterpret_cast<const uint4*>(smem + s * stage_bytes);
      const int n16 = c * (p.kbytes + p.vbytes + 2 * p.sbytes) / 16;
      for (int i = lane; i < n16; i += 32) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) MbarArrive(&empty[s]);
    }
    if (acc == 0x12345678u) p.sink[0] = acc;
  }
}

int main(int argc, char** argv) {
  std::vector<std::string> only;
  bool linear = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--linear")) {
      linear = true;
    } else if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) {
      std::string s = argv[++i];
      for (size_t p = 0; p <= s.size();) {
        size_t e = s.find(',', p);
        if (e == std::string::npos) e = s.size();
        only.push_back(s.substr(p, e - p));
        p = e + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--cases SUBSTR,...] [--linear]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("kvpage-read-floor: no CUDA device; nothing to measure\n");
    return 0;
  }
  int dev = 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major < 9) {
    std::printf("kvpage-read-floor: needs sm_90 or newer (bulk copies); %s is sm_%d%d\n", prop.name,
                prop.major, prop.minor);
    return 0;
  }
  // The median over `reps` of launch()'s time on `stream`, divided by the
  // `calls` it makes.
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  auto median_ms = [&](cudaStream_t stream, auto&& launch, int reps, int calls) {
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      CK(cudaEventRecord(ev0, stream));
      launch();
      CK(cudaEventRecord(ev1, stream));
      CK(cudaEventSynchronize(ev1));
      float m;
      CK(cudaEventElapsedTime(&m, ev0, ev1));
      ms.push_back(m / calls);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  {
    size_t bytes = size_t{1} << 30;
    void *s, *d;
    CK(cudaMalloc(&s, bytes));
    CK(cudaMalloc(&d, bytes));
    cudaMemset(s, 1, bytes);
    for (int i = 0; i < 5; ++i) cudaMemcpy(d, s, bytes, cudaMemcpyDeviceToDevice);
    // Copy bandwidth as kvpage-bench measures it.
    float ms = median_ms(
        nullptr, [&] { cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice); }, 50, 1);
    std::printf("copy bandwidth %.0f GB/s\n", 2.0 * bytes / (ms * 1e-3) / 1e9);
    cudaFree(s);
    cudaFree(d);
  }
  unsigned *counters, *sink;
  CK(cudaMalloc(&counters, 64));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(counters, 0, 64));
  struct Case {
    const char* name;
    int B, T, kbytes, vbytes, sbytes;
  };
  const Case cases[] = {{"bf16 B=128", 128, 8192, 4096, 4096, 0},
                        {"bf16 B=256", 256, 8192, 4096, 4096, 0},
                        {"bf16 B=512", 512, 8192, 4096, 4096, 0},
                        {"int4 B=512", 512, 8192, 1024, 1024, 64},
                        {"fp8 B=512", 512, 8192, 2048, 2048, 32},
                        // Small cases, run only when named (--cases small):
                        // every variant in seconds, for compute-sanitizer.
                        {"small bf16 B=4", 4, 2048, 4096, 4096, 0},
                        {"small int4 B=4", 4, 2048, 1024, 1024, 64}};
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    bool keep = only.empty() && std::strncmp(c.name, "small", 5) != 0;
    for (const std::string& o : only) keep = keep || std::strstr(c.name, o.c_str()) != nullptr;
    if (!keep) continue;
    const int nbps = c.T / 16;
    const int64_t nb = int64_t{c.B} * nbps;
    const int64_t per_block = c.kbytes + c.vbytes + 2 * c.sbytes;
    const int64_t layer_bytes = nb * per_block;
    const int layers = std::max<int64_t>(2, 4 * int64_t{prop.l2CacheSize} / layer_bytes + 1);
    uint8_t* buf;
    CK(cudaMalloc(&buf, layer_bytes * layers));
    CK(cudaMemset(buf, 3, layer_bytes * layers));
    std::vector<int> perm(nb);
    for (int64_t i = 0; i < nb; ++i) perm[i] = int(i);
    if (!linear) std::shuffle(perm.begin(), perm.end(), rng);
    int *table, *lens;
    CK(cudaMalloc(&table, nb * 4));
    CK(cudaMalloc(&lens, c.B * 4));
    CK(cudaMemcpy(table, perm.data(), nb * 4, cudaMemcpyHostToDevice));
    std::vector<int> hl(c.B, c.T);
    CK(cudaMemcpy(lens, hl.data(), c.B * 4, cudaMemcpyHostToDevice));
    const double bytes = double(layer_bytes);
    std::printf("%s: %.0f MB a layer, %d layers\n", c.name, bytes / 1e6, layers);
    for (int mode = 0; mode < 3; ++mode) {
      for (int P : {1024, 2048, 4096, 8192}) {
        if (P > c.T) continue;
        for (int chunk : {1, 2, 4}) {
          for (int S : {4, 8, 16}) {
            Params p{};
            p.k_off = 0;
            p.v_off = nb * c.kbytes;
            p.ks_off = p.v_off + nb * c.vbytes;
            p.vs_off = p.ks_off + nb * c.sbytes;
            p.kbytes = c.kbytes, p.vbytes = c.vbytes, p.sbytes = c.sbytes;
            p.table = table, p.width = nbps, p.lens = lens;
            p.B = c.B, p.P = P, p.parts = c.T / P, p.items = c.B * p.parts;
            p.mode = mode, p.chunk = chunk, p.counters = counters, p.sink = sink;
            const int smem = S * chunk * int(per_block);
            if (smem > 200 * 1024) continue;
            void (*k)(Params) = S == 4 ? Floor<4> : S == 8 ? Floor<8> : Floor<16>;
            CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            int per_sm = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem));
            if (per_sm == 0) continue;
            const int grid = mode == 0 ? p.items : prop.multiProcessorCount * per_sm;
            // Graph of 16 launches, as kvpage-bench times its decodes.
            cudaStream_t st;
            CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int r = 0; r < 16; ++r) {
              p.layer = buf + (r % layers) * layer_bytes;
              k<<<grid, kThreads, smem, st>>>(p);
            }
            CK(cudaStreamEndCapture(st, &g));
            cudaGraphExec_t ge;
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            const float m = median_ms(
                st, [&] { cudaGraphLaunch(ge, st); }, 11, 16);
            std::printf(
                "  mode %d P %5d chunk %d stages %2d (%3d KB, %d/SM, grid %5d): %7.1f us %5.0f "
                "GB/s\n",
                mode, P, chunk, S, smem / 1024, per_sm, grid, m * 1e3, bytes / (m * 1e-3) / 1e9);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            cudaStreamDestroy(st);
          }
        }
      }
    }
    cudaFree(buf);
    cudaFree(table);
    cudaFree(lens);
  }
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  cudaFree(counters);
  cudaFree(sink);
  return 0;
}
