/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An engine's decode loop through kvpage's public API:
 *   a batch of sequences with different prompt lengths -> prefill writes ->
 *   decode steps that append one token per sequence, write its K/V and
 *   attend -> a fork (parallel sampling from a shared prefix) -> frees.
 * Runs on the CUDA backend when this build has one and a GPU is present,
 * else on the CPU backend. Prints tokens per second, blocks used, bytes per
 * token for the KV dtype, and the largest error of the last step's outputs
 * against float64 attention over the unquantized K/V.
 *
 * usage: kvpage_decode_loop [bf16|fp16|fp8|int8|int4] [steps]
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpage/kvpage.h"

enum {
  kLayers = 4,
  kKvHeads = 8,
  kQHeads = 32,
  kHead = 128,
  kBlock = 16,
  kSeqs = 8,
  kMaxSeqs = kSeqs + 1,
  kMaxLen = 1024,
  kMaxBlocksPerSeq = kMaxLen / kBlock
};
#define TOKEN_ELEMS (kKvHeads * kHead)

#ifdef KVPAGE_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

static int check(kvp_error* e, const char* what) {
  if (e == NULL) return 0;
  fprintf(stderr, "%s failed: %s: %s\n", what, kvp_error_code_name(kvp_error_code(e)),
          kvp_error_message(e));
  kvp_error_free(e);
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Standard normal values (Box-Muller) from a small xorshift generator. */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
  return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}

/* Where the cache lives decides where the buffers handed to kvpage live:
 * a CUDA cache reads inputs from, and writes outputs to, device memory. */
static int on_gpu = 0;

/* A scratch buffer in the cache's memory space holding a copy of `src`. */
typedef struct {
  void* ptr;
  size_t bytes;
} Staged;

static void* stage(Staged* st, const void* src, size_t bytes) {
#ifdef KVPAGE_EXAMPLE_CUDA
  if (on_gpu) {
    if (bytes > st->bytes) {
      cudaFree(st->ptr);
      if (cudaMalloc(&st->ptr, bytes) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
        exit(1);
      }
      st->bytes = bytes;
    }
    if (src != NULL) cudaMemcpy(st->ptr, src, bytes, cudaMemcpyHostToDevice);
    return st->ptr;
  }
#endif
  (void)st;
  (void)bytes;
  return (void*)src;
}

static void unstage(void* dst, const Staged* st, void* host_result, size_t bytes) {
#ifdef KVPAGE_EXAMPLE_CUDA
  if (on_gpu) {
    cudaMemcpy(dst, st->ptr, bytes, cudaMemcpyDeviceToHost);
    return;
  }
#endif
  (void)st;
  if (dst != host_result) memcpy(dst, host_result, bytes);
}

static Staged st_k, st_v, st_slots, st_q, st_out, st_table, st_lens;

/* What the engine keeps to check the last step: every token's K/V per layer
 * and sequence, unquantized. */
typedef struct {
  int64_t id;
  int len;
  float* k[kLayers]; /* [kMaxLen][TOKEN_ELEMS] */
  float* v[kLayers];
} Sequence;

static void seq_alloc(Sequence* s) {
  int l;
  for (l = 0; l < kLayers; ++l) {
    s->k[l] = (float*)malloc(sizeof(float) * kMaxLen * TOKEN_ELEMS);
    s->v[l] = (float*)malloc(sizeof(float) * kMaxLen * TOKEN_ELEMS);
    if (!s->k[l] || !s->v[l]) {
      fprintf(stderr, "out of host memory\n");
      exit(1);
    }
  }
}

/* Appends n tokens to `s` in the cache and writes random K/V for them in
 * every layer (FP32 inputs). */
static void append_and_write(kvp_cache* cache, Sequence* s, int n, void* stream) {
  int64_t slots[kMaxLen];
  int l, i;
  check(kvp_seq_append(cache, s->id, n, slots, stream), "kvp_seq_append");
  for (l = 0; l < kLayers; ++l) {
    kvp_write_args w;
    float* k = s->k[l] + (size_t)s->len * TOKEN_ELEMS;
    float* v = s->v[l] + (size_t)s->len * TOKEN_ELEMS;
    for (i = 0; i < n * TOKEN_ELEMS; ++i) {
      k[i] = normal();
      v[i] = normal();
    }
    kvp_write_args_init(&w);
    w.layer = l;
    w.num_tokens = n;
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = stage(&st_k, k, sizeof(float) * (size_t)n * TOKEN_ELEMS);
    w.value = stage(&st_v, v, sizeof(float) * (size_t)n * TOKEN_ELEMS);
    w.slot_mapping = stage(&st_slots, slots, sizeof(int64_t) * (size_t)n);
    check(kvp_cache_write(cache, &w, stream), "kvp_cache_write");
  }
  s->len += n;
}

/* float64 attention of one query head over a sequence's unquantized K/V. */
static void reference(const Sequence* s, int layer, const float* q, int h, double* out) {
  const int kvh = h / (kQHeads / kKvHeads);
  double m = -1e300, sum = 0, *w = (double*)malloc(sizeof(double) * s->len);
  int j, d;
  for (j = 0; j < s->len; ++j) {
    double dot = 0;
    for (d = 0; d < kHead; ++d) {
      dot += (double)q[h * kHead + d] * s->k[layer][(size_t)j * TOKEN_ELEMS + kvh * kHead + d];
    }
    w[j] = dot / sqrt((double)kHead);
    if (w[j] > m) m = w[j];
  }
  for (j = 0; j < s->len; ++j) sum += (w[j] = exp(w[j] - m));
  for (d = 0; d < kHead; ++d) {
    double o = 0;
    for (j = 0; j < s->len; ++j)
      o += w[j] / sum * s->v[layer][(size_t)j * TOKEN_ELEMS + kvh * kHead + d];
    out[d] = o;
  }
  free(w);
}

static int parse_dtype(const char* name) {
  if (strcmp(name, "bf16") == 0) return KVP_DTYPE_BF16;
  if (strcmp(name, "fp16") == 0) return KVP_DTYPE_FP16;
  if (strcmp(name, "fp8") == 0) return KVP_DTYPE_FP8_E4M3;
  if (strcmp(name, "int8") == 0) return KVP_DTYPE_INT8;
  if (strcmp(name, "int4") == 0) return KVP_DTYPE_INT4;
  fprintf(stderr, "unknown KV dtype '%s' (bf16, fp16, fp8, int8, int4)\n", name);
  exit(2);
}

int main(int argc, char** argv) {
  const char* dtype_name = argc > 1 ? argv[1] : "int8";
  const int dtype = parse_dtype(dtype_name);
  const int steps = argc > 2 ? atoi(argv[2]) : 32;
  kvp_cache_config cfg;
  kvp_cache_info info;
  kvp_decode_config dc;
  kvp_decoder* decoder = NULL;
  kvp_cache* cache = NULL;
  Sequence seqs[kMaxSeqs];
  int64_t ids[kMaxSeqs];
  int32_t table[kMaxSeqs * kMaxBlocksPerSeq], lens[kMaxSeqs];
  float* q = (float*)malloc(sizeof(float) * kMaxSeqs * kQHeads * kHead);
  float* out = (float*)malloc(sizeof(float) * kMaxSeqs * kQHeads * kHead);
  int num_seqs = kSeqs, gpus = 0, s, l, step, i, free_blocks = 0;
  double decode_time = 0, max_err = 0;
  long long tokens = 0;

  kvp_cache_config_init(&cfg);
  cfg.num_layers = kLayers;
  cfg.num_blocks = kMaxSeqs * kMaxBlocksPerSeq;
  cfg.block_size = kBlock;
  cfg.num_kv_heads = kKvHeads;
  cfg.head_size = kHead;
  cfg.k_dtype = dtype;
  cfg.v_dtype = dtype;
  check(kvp_device_count(KVP_DEVICE_CUDA, &gpus), "kvp_device_count");
#ifdef KVPAGE_EXAMPLE_CUDA
  if (gpus > 0) {
    kvp_error* err;
    cfg.device_kind = KVP_DEVICE_CUDA;
    err = kvp_cache_create(&cfg, &cache);
    if (err != NULL) {
      printf("CUDA cache not available (%s); using the CPU backend\n", kvp_error_message(err));
      kvp_error_free(err);
      cache = NULL;
    }
    on_gpu = cache != NULL;
  }
#endif
  if (cache == NULL) {
    cfg.device_kind = KVP_DEVICE_CPU;
    check(kvp_cache_create(&cfg, &cache), "kvp_cache_create");
  }
  kvp_cache_info_init(&info);
  check(kvp_cache_get_info(cache, &info), "kvp_cache_get_info");
  printf(
      "kvpage %s | %s backend | KV %s | %d layers, %d KV heads, %d query heads, head %d, block "
      "%d\n",
      kvp_version_string(), info.device_kind == KVP_DEVICE_CUDA ? "CUDA" : "CPU", dtype_name,
      kLayers, kKvHeads, kQHeads, kHead, kBlock);

  kvp_decode_config_init(&dc);
  dc.num_query_heads = kQHeads;
  dc.max_num_seqs = kMaxSeqs;
  dc.max_context_len = kMaxLen;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  check(kvp_decoder_create(cache, &dc, &decoder), "kvp_decoder_create");

  /* Prefill: prompts of different lengths. */
  for (s = 0; s < kSeqs; ++s) {
    seq_alloc(&seqs[s]);
    seqs[s].len = 0;
    check(kvp_seq_create(cache, &seqs[s].id), "kvp_seq_create");
    append_and_write(cache, &seqs[s], 17 + (int)(uniform01() * 480), NULL);
  }

  for (step = 0; step < steps; ++step) {
    double t0;
    if (step == steps / 2) {
      /* Parallel sampling: sequence 0 forks; the two share the prefix's
       * blocks and the next append copies the shared partial block. */
      Sequence* child = &seqs[num_seqs];
      seq_alloc(child);
      check(kvp_seq_fork(cache, seqs[0].id, &child->id), "kvp_seq_fork");
      child->len = seqs[0].len;
      for (l = 0; l < kLayers; ++l) {
        memcpy(child->k[l], seqs[0].k[l], sizeof(float) * (size_t)seqs[0].len * TOKEN_ELEMS);
        memcpy(child->v[l], seqs[0].v[l], sizeof(float) * (size_t)seqs[0].len * TOKEN_ELEMS);
      }
      ++num_seqs;
    }
    for (s = 0; s < num_seqs; ++s) append_and_write(cache, &seqs[s], 1, NULL);
    for (s = 0; s < num_seqs; ++s) ids[s] = seqs[s].id;
    check(kvp_cache_export_block_table(cache, ids, num_seqs, kMaxBlocksPerSeq, kMaxBlocksPerSeq,
                                       table, lens),
          "kvp_cache_export_block_table");
    for (i = 0; i < num_seqs * kQHeads * kHead; ++i) q[i] = normal();
    t0 = now_s();
    for (l = 0; l < kLayers; ++l) {
      const size_t out_bytes = sizeof(float) * (size_t)num_seqs * kQHeads * kHead;
      kvp_decode_args a;
      kvp_decode_args_init(&a);
      a.layer = l;
      a.num_seqs = num_seqs;
      a.q = stage(&st_q, q, out_bytes);
      a.block_table = stage(&st_table, table, sizeof(table));
      a.block_table_width = kMaxBlocksPerSeq;
      a.seq_lens = stage(&st_lens, lens, sizeof(int32_t) * (size_t)num_seqs);
      a.out = stage(&st_out, NULL, out_bytes);
      if (a.out == NULL) a.out = out;
      check(kvp_decode(decoder, &a, NULL), "kvp_decode");
      unstage(out, &st_out, a.out, out_bytes); /* the engine's next layer needs it */
      if (step == steps - 1 && l == kLayers - 1) {
        /* The last step: every output against float64 attention. */
        int h;
        double ref[kHead];
        for (s = 0; s < num_seqs; ++s) {
          for (h = 0; h < kQHeads; ++h) {
            int d;
            reference(&seqs[s], l, q + ((size_t)s * kQHeads) * kHead, h, ref);
            for (d = 0; d < kHead; ++d) {
              double e = fabs(out[((size_t)s * kQHeads + h) * kHead + d] - ref[d]);
              if (!(e <= max_err)) max_err = e; /* NaN propagates */
            }
          }
        }
      }
    }
    decode_time += now_s() - t0;
    tokens += num_seqs;
  }

  check(kvp_cache_num_free_blocks(cache, &free_blocks), "kvp_cache_num_free_blocks");
  printf("decode: %d steps, %lld tokens in %.3f s -> %.1f tokens/s (all %d layers attended)\n",
         steps, tokens, decode_time, tokens / decode_time, kLayers);
  printf("blocks used: %d of %d (%d sequences, one forked)\n", cfg.num_blocks - free_blocks,
         cfg.num_blocks, num_seqs);
  printf("bytes per token: %lld per layer, %lld for all %d layers (BF16 would be %d per layer)\n",
         (long long)info.bytes_per_token_per_layer,
         (long long)info.bytes_per_token_per_layer * kLayers, kLayers, 2 * 2 * TOKEN_ELEMS);
  printf("largest |error| of the last step vs float64 attention over unquantized K/V: %.3g\n",
         max_err);

  for (s = 0; s < num_seqs; ++s) {
    check(kvp_seq_free(cache, seqs[s].id), "kvp_seq_free");
    for (l = 0; l < kLayers; ++l) {
      free(seqs[s].k[l]);
      free(seqs[s].v[l]);
    }
  }
  check(kvp_cache_num_free_blocks(cache, &free_blocks), "kvp_cache_num_free_blocks");
  if (free_blocks != cfg.num_blocks) {
    fprintf(stderr, "leak: %d of %d blocks free after freeing every sequence\n", free_blocks,
            cfg.num_blocks);
    return 1;
  }
  kvp_decoder_destroy(decoder);
  kvp_cache_destroy(cache);
  free(q);
  free(out);
  return max_err == max_err ? 0 : 1; /* fail on NaN */
}
