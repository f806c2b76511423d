/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A strict C99 program that uses the library the way a dlopen user does:
 * it resolves the single symbol kvp_get_api and does everything else through
 * the function table. The header is included for its types and macros only;
 * the program does not link against libkvpage.
 *
 * Usage: kvpage_dlopen_test /path/to/libkvpage.so [seed]
 *
 * Scenario: a CPU cache with FP8 E4M3 keys and values, one sequence of 33
 * tokens (three blocks, the last one holding a single token), BF16 K/V
 * written through the slots kvp_seq_append returned, a BF16 GQA decode
 * (4 query heads over 2 KV heads), checked against a double-precision
 * attention over the data the library was given (the BF16 values, decoded
 * here by hand).
 *
 * Tolerance. The CPU backend dequantizes exactly and accumulates in double,
 * so what separates it from the reference is FP8 and the BF16 output:
 *  - FP8 E4M3 with one FP16 scale per token and head (amax / 448, so
 *    nothing saturates) keeps 3 mantissa bits: every element is off by at
 *    most 2^-4 of its magnitude (round to nearest), plus at most 2^-10 of
 *    the scale for the few values that land among the subnormals.
 *  - V: the output is a convex combination sum_j w_j v_j, so its V error is
 *    at most sum_j w_j * (2^-4 |v_j| + 2^-10 scale_j). The program computes
 *    this bound from the data for every output element. A flat 0.1 is not a
 *    safe bound: when one token carries ~70% of the weight and |v| ~ 2.2
 *    (both happen with N(0,1) data and 33 tokens), the V error alone can
 *    reach 0.7 * 2.2 / 16 ~ 0.095, and 0.095 was seen in 300 runs.
 *  - K: elements off by up to 2^-4 relative, independently, so a logit
 *    q.k / sqrt(128) moves by ~ 2^-4 / sqrt(3) ~ 0.036 (sigma) and an output
 *    by ~ 0.036 * sqrt(sum_j w_j^2) * |v_j - out| ~ 0.01 (sigma): an
 *    allowance of 0.06 is 6 sigma. The log-sum-exp moves by
 *    sum_j w_j * dlogit_j, also ~ 0.01 (sigma): 0.08 for it.
 *  - BF16 output: at most 2^-8 of |out| (half an ulp).
 *  So |out - ref| <= V bound + 0.06 + 2^-8 |ref| per element, under a flat
 *  cap of 0.2, and |lse - ref| <= 0.08.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpage/kvpage.h"

#define NUM_BLOCKS 8
#define BLOCK_SIZE 16
#define KV_HEADS 2
#define Q_HEADS 4
#define HEAD 128
#define NUM_TOKENS 33
#define TABLE_WIDTH 4
#define DENSE (KV_HEADS * HEAD)
#define Q_DENSE (Q_HEADS * HEAD)
#define K_ALLOWANCE 0.06
#define CAP 0.2
#define LSE_TOLERANCE 0.08

static const kvp_api* api;

static void fail(const char* what) {
  fprintf(stderr, "dlopen_test: FAILED: %s\n", what);
  exit(1);
}

static void check(kvp_error* e, const char* call) {
  if (e != NULL) {
    fprintf(stderr, "dlopen_test: FAILED: %s: %s: %s\n", call,
            api->error_code_name(api->error_code(e)), api->error_message(e));
    api->error_free(e);
    exit(1);
  }
}
#define CHECK(call) check((call), #call)

/* xorshift64* and Box-Muller: N(0,1) samples. */
static uint64_t g_state;
static double uniform01(void) {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return ((g_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}
static float randn(void) {
  const double two_pi = 6.283185307179586;
  double u = uniform01();
  while (u <= 0.0) u = uniform01();
  return (float)(sqrt(-2.0 * log(u)) * cos(two_pi * uniform01()));
}

static uint64_t fresh_seed(void) {
  uint64_t seed = 0;
  FILE* f = fopen("/dev/urandom", "rb");
  if (f != NULL) {
    if (fread(&seed, sizeof(seed), 1, f) != 1) seed = 0;
    fclose(f);
  }
  seed ^= (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)clock();
  return seed != 0 ? seed : 0x2545F4914F6CDD1DULL;
}

/* FP32 -> BF16, round half to even (finite inputs only), and back. */
static uint16_t to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
static float from_bf16(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s /path/to/libkvpage.so [seed]\n", argv[0]);
    return 2;
  }
  const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : fresh_seed();
  int i, h, d, j;
  g_state = seed != 0 ? seed : 1;

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen_test: dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  /* A function pointer from dlsym without the pedantic object-to-function
   * pointer conversion: copy the bytes. */
  kvp_get_api_fn get_api = NULL;
  {
    void* sym = dlsym(lib, "kvp_get_api");
    if (sym == NULL) fail("dlsym(kvp_get_api)");
    memcpy(&get_api, &sym, sizeof(get_api));
  }
  if (get_api(KVP_ABI_MAJOR + 1) != NULL) fail("kvp_get_api accepted an unknown major");
  api = get_api(KVP_ABI_MAJOR);
  if (api == NULL) fail("kvp_get_api(KVP_ABI_MAJOR) returned NULL");
  if (api->abi_major != KVP_ABI_MAJOR) fail("table abi_major");
  /* Every entry this header knows must be there (a table of an older minor
   * would be shorter). */
  if (api->struct_size < sizeof(kvp_api)) {
    fail("the library's table is older than this header");
  }
  if (strcmp(api->version_string(), KVP_VERSION_STRING) != 0) {
    fprintf(stderr, "version %s, header %s\n", api->version_string(), KVP_VERSION_STRING);
    fail("version string");
  }
  {
    uint32_t major = 0, minor = 0;
    api->abi_version(&major, &minor);
    if (major != KVP_ABI_MAJOR || minor != api->abi_minor) fail("abi_version");
  }

  /* The cache. */
  kvp_cache_config cfg;
  api->cache_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_blocks = NUM_BLOCKS;
  cfg.block_size = BLOCK_SIZE;
  cfg.num_kv_heads = KV_HEADS;
  cfg.head_size = HEAD;
  cfg.k_dtype = KVP_DTYPE_FP8_E4M3;
  cfg.v_dtype = KVP_DTYPE_FP8_E4M3;
  kvp_cache* cache = NULL;
  CHECK(api->cache_create(&cfg, &cache));
  {
    kvp_cache_info info;
    api->cache_info_init(&info);
    CHECK(api->cache_get_info(cache, &info));
    if (info.k_dtype != KVP_DTYPE_FP8_E4M3 || info.v_dtype != KVP_DTYPE_FP8_E4M3 ||
        info.num_blocks != NUM_BLOCKS) {
      fail("cache info");
    }
  }

  /* One sequence of 33 tokens. */
  int64_t seq = -1;
  int64_t slots[NUM_TOKENS];
  CHECK(api->seq_create(cache, &seq));
  CHECK(api->seq_append(cache, seq, NUM_TOKENS, slots, NULL));
  {
    int32_t len = -1;
    CHECK(api->seq_length(cache, seq, &len));
    if (len != NUM_TOKENS) fail("sequence length");
  }

  /* BF16 K/V; the reference uses exactly these values. */
  static uint16_t k16[NUM_TOKENS * DENSE], v16[NUM_TOKENS * DENSE];
  static double kref[NUM_TOKENS * DENSE], vref[NUM_TOKENS * DENSE];
  static double vamax[NUM_TOKENS * KV_HEADS]; /* per token and head: scale * 448 */
  for (i = 0; i < NUM_TOKENS * DENSE; ++i) {
    k16[i] = to_bf16(randn());
    v16[i] = to_bf16(randn());
    kref[i] = from_bf16(k16[i]);
    vref[i] = from_bf16(v16[i]);
    if (fabs(vref[i]) > vamax[i / HEAD]) vamax[i / HEAD] = fabs(vref[i]);
  }
  kvp_write_args w;
  api->write_args_init(&w);
  w.layer = 0;
  w.num_tokens = NUM_TOKENS;
  w.input_dtype = KVP_DTYPE_BF16;
  w.key = k16;
  w.value = v16;
  w.slot_mapping = slots;
  CHECK(api->cache_write(cache, &w, NULL));

  int32_t table[TABLE_WIDTH];
  int32_t seq_len = -1;
  CHECK(api->cache_export_block_table(cache, &seq, 1, TABLE_WIDTH, TABLE_WIDTH, table, &seq_len));
  if (seq_len != NUM_TOKENS) fail("exported length");

  /* Decode: BF16 q and out. */
  kvp_decode_config dc;
  api->decode_config_init(&dc);
  dc.num_query_heads = Q_HEADS;
  dc.max_num_seqs = 1;
  dc.max_context_len = TABLE_WIDTH * BLOCK_SIZE;
  dc.q_dtype = KVP_DTYPE_BF16;
  dc.out_dtype = KVP_DTYPE_BF16;
  {
    uint64_t ws = 0;
    CHECK(api->decode_workspace_size(cache, &dc, &ws));
  }
  kvp_decoder* decoder = NULL;
  CHECK(api->decoder_create(cache, &dc, &decoder));

  uint16_t q16[Q_DENSE], out16[Q_DENSE];
  float lse[Q_HEADS];
  for (i = 0; i < Q_DENSE; ++i) {
    q16[i] = to_bf16(randn());
    out16[i] = 0x7FC1; /* a BF16 NaN: every element must be written */
  }
  for (i = 0; i < Q_HEADS; ++i) lse[i] = NAN;
  kvp_decode_args a;
  api->decode_args_init(&a);
  a.num_seqs = 1;
  a.query_len = 1;
  a.q = q16;
  a.block_table = table;
  a.block_table_width = TABLE_WIDTH;
  a.seq_lens = &seq_len;
  a.out = out16;
  a.lse = lse;
  CHECK(api->decode(decoder, &a, NULL));

  double max_err = 0.0, max_lse_err = 0.0, max_ratio = 0.0;
  const double sm_scale = 1.0 / sqrt((double)HEAD);
  for (h = 0; h < Q_HEADS; ++h) {
    const int kvh = h / (Q_HEADS / KV_HEADS);
    double logits[NUM_TOKENS], m = -INFINITY, sum = 0.0;
    for (j = 0; j < NUM_TOKENS; ++j) {
      double dot = 0.0;
      for (d = 0; d < HEAD; ++d) {
        dot += (double)from_bf16(q16[h * HEAD + d]) * kref[j * DENSE + kvh * HEAD + d];
      }
      logits[j] = sm_scale * dot;
      if (logits[j] > m) m = logits[j];
    }
    for (j = 0; j < NUM_TOKENS; ++j) {
      logits[j] = exp(logits[j] - m);
      sum += logits[j];
    }
    for (d = 0; d < HEAD; ++d) {
      double ref = 0.0, vbound = 0.0;
      for (j = 0; j < NUM_TOKENS; ++j) {
        const double v = vref[j * DENSE + kvh * HEAD + d];
        ref += logits[j] / sum * v;
        vbound += logits[j] / sum * (fabs(v) / 16.0 + vamax[j * KV_HEADS + kvh] / 448.0 / 1024.0);
      }
      const double tol = vbound * 1.01 + K_ALLOWANCE + fabs(ref) / 256.0;
      const float got = from_bf16(out16[h * HEAD + d]);
      const double err = fabs((double)got - ref);
      if (!isfinite(got)) fail("non-finite or unwritten output");
      if (err > max_err) max_err = err;
      if (err / tol > max_ratio) max_ratio = err / tol;
      if (err > tol || err > CAP) {
        fprintf(stderr,
                "head %d dim %d: got %.6f, reference %.6f, error %.4f > tolerance %.4f "
                "(seed %llu)\n",
                h, d, got, ref, err, tol, (unsigned long long)seed);
        fail("decode output differs from the float64 reference");
      }
    }
    const double ref_lse = m + log(sum);
    if (!isfinite(lse[h]) || fabs(lse[h] - ref_lse) > LSE_TOLERANCE) {
      fprintf(stderr, "head %d: lse %.6f, reference %.6f (seed %llu)\n", h, lse[h], ref_lse,
              (unsigned long long)seed);
      fail("lse differs from the float64 reference");
    }
    if (fabs(lse[h] - ref_lse) > max_lse_err) max_lse_err = fabs(lse[h] - ref_lse);
  }

  /* An error through the table, then tear everything down. */
  {
    int32_t count = -5;
    kvp_error* e = api->device_count(7, &count);
    if (api->error_code(e) != KVP_ERR_INVALID_ARGUMENT || count != -5) fail("device_count(7)");
    api->error_free(e);
  }
  api->decoder_destroy(decoder);
  CHECK(api->seq_free(cache, seq));
  {
    int32_t num_free = -1;
    CHECK(api->cache_num_free_blocks(cache, &num_free));
    if (num_free != NUM_BLOCKS) fail("blocks not returned");
  }
  api->cache_destroy(cache);
  api = NULL;
  if (dlclose(lib) != 0) fail("dlclose");
  printf(
      "dlopen_test: OK: kvp_get_api alone, %s, FP8 K/V, 33 tokens, BF16 q/out: "
      "max |out - ref| %.4f (%.0f%% of its tolerance), max |lse - ref| %.4f, seed %llu\n",
      KVP_VERSION_STRING, max_err, 100.0 * max_ratio, max_lse_err, (unsigned long long)seed);
  return 0;
}
