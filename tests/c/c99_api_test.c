/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A strict C99 program against the public header: a CPU cache with INT8 keys
 * and INT4 values, three sequences made through kvp_seq_create /
 * kvp_seq_append, random FP32 K/V written through the returned slots, the
 * exported block table, and a GQA decode (FP32 q and out) of both layers,
 * checked against a double-precision attention computed here over the
 * original, unquantized K/V.
 *
 * Usage: kvpage_c99_test [seed]   (a fresh seed is drawn when none is given;
 * it is printed so that a failure can be reproduced).
 *
 * Tolerance. The CPU backend dequantizes exactly and accumulates in double,
 * so the difference from the reference is the quantization error alone:
 *  - V, INT4 asymmetric, one FP16 {scale, min} per token and head: min is
 *    rounded down and scale up from (max - min) / 15, so no code clips and
 *    every element is off by at most scale / 2 = (max - min) / 30 (about
 *    0.17 for 128 N(0,1) values, more for an unlucky wide token). The
 *    output is a convex combination of values, so its V error is at most
 *    sum_j w_j * scale_j / 2 with the softmax weights w_j; the program
 *    computes that bound from the data for every output element (with 1%
 *    slack for the FP16 rounding of the scale). A flat 0.15 would not be a
 *    safe bound: with five tokens one of them often carries most of the
 *    weight, and scale / 2 alone can exceed 0.15.
 *  - K, INT8 symmetric, one FP16 scale per token and head: every element is
 *    off by at most amax / 254 (about 0.011 here), independently, so a logit
 *    q.k / sqrt(128) is off by about 0.011 / sqrt(3) * |q| / sqrt(128),
 *    i.e. sigma ~ 0.0065 for N(0,1) queries, and an output moves by about
 *    that times |v_j - out| ~ 1: 0.04 is over 6 sigma.
 *  So each element must satisfy |out - ref| <= V bound + 0.04, and the
 *  whole output |out - ref| <= 0.3 (a sanity cap on the bound itself).
 *  The log-sum-exp sees only the K error: |lse - ref| <= 0.04.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpage/kvpage.h"

#define NUM_LAYERS 2
#define NUM_BLOCKS 16
#define BLOCK_SIZE 16
#define KV_HEADS 2
#define Q_HEADS 4
#define HEAD 128
#define NUM_SEQS 3
#define MAX_CONTEXT 64
#define TABLE_WIDTH (MAX_CONTEXT / BLOCK_SIZE)
#define DENSE (KV_HEADS * HEAD)
#define Q_DENSE (Q_HEADS * HEAD)
#define K_ALLOWANCE 0.04
#define CAP 0.3

static const int32_t kLens[NUM_SEQS] = {5, 17, 40};

static void fail(const char* what) {
  fprintf(stderr, "c99_api_test: FAILED: %s\n", what);
  exit(1);
}

static void check(kvp_error* e, const char* call) {
  if (e != NULL) {
    fprintf(stderr, "c99_api_test: FAILED: %s: %s: %s\n", call,
            kvp_error_code_name(kvp_error_code(e)), kvp_error_message(e));
    kvp_error_free(e);
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

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : fresh_seed();
  int32_t total = 0, s, l, i, h, d, j;
  g_state = seed != 0 ? seed : 1;
  for (s = 0; s < NUM_SEQS; ++s) total += kLens[s];

  /* The cache. */
  kvp_cache_config cfg;
  kvp_cache_config_init(&cfg);
  cfg.num_layers = NUM_LAYERS;
  cfg.num_blocks = NUM_BLOCKS;
  cfg.block_size = BLOCK_SIZE;
  cfg.num_kv_heads = KV_HEADS;
  cfg.head_size = HEAD;
  cfg.k_dtype = KVP_DTYPE_INT8;
  cfg.v_dtype = KVP_DTYPE_INT4;
  kvp_cache* cache = NULL;
  CHECK(kvp_cache_create(&cfg, &cache));

  /* Three sequences; their slots, concatenated, are the slot mapping. */
  int64_t seq_ids[NUM_SEQS];
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * (size_t)total);
  if (slots == NULL) fail("malloc");
  {
    int32_t at = 0;
    for (s = 0; s < NUM_SEQS; ++s) {
      CHECK(kvp_seq_create(cache, &seq_ids[s]));
      /* Two appends per sequence, so that a block boundary may fall inside. */
      const int32_t first = kLens[s] / 2;
      CHECK(kvp_seq_append(cache, seq_ids[s], first, slots + at, NULL));
      CHECK(kvp_seq_append(cache, seq_ids[s], kLens[s] - first, slots + at + first, NULL));
      at += kLens[s];
    }
    for (i = 0; i < total; ++i) {
      if (slots[i] < 0 || slots[i] >= (int64_t)NUM_BLOCKS * BLOCK_SIZE) fail("slot out of range");
    }
  }

  /* Random K/V per layer, written through the slots. */
  const size_t kv_elems = (size_t)total * DENSE;
  float* keys = (float*)malloc(sizeof(float) * kv_elems * NUM_LAYERS);
  float* values = (float*)malloc(sizeof(float) * kv_elems * NUM_LAYERS);
  if (keys == NULL || values == NULL) fail("malloc");
  for (i = 0; i < (int32_t)(kv_elems * NUM_LAYERS); ++i) {
    keys[i] = randn();
    values[i] = randn();
  }
  for (l = 0; l < NUM_LAYERS; ++l) {
    kvp_write_args w;
    kvp_write_args_init(&w);
    w.layer = l;
    w.num_tokens = total;
    w.input_dtype = KVP_DTYPE_FP32;
    w.key = keys + (size_t)l * kv_elems;
    w.value = values + (size_t)l * kv_elems;
    w.slot_mapping = slots;
    CHECK(kvp_cache_write(cache, &w, NULL));
  }
  {
    kvp_write_stats st;
    kvp_write_stats_init(&st);
    CHECK(kvp_cache_get_write_stats(cache, &st));
    if (st.non_finite != 0 || st.saturated != 0) fail("write stats count finite, in-range data");
  }

  /* The block table. */
  int32_t table[NUM_SEQS * TABLE_WIDTH];
  int32_t seq_lens[NUM_SEQS];
  CHECK(kvp_cache_export_block_table(cache, seq_ids, NUM_SEQS, TABLE_WIDTH, TABLE_WIDTH, table,
                                     seq_lens));
  for (s = 0; s < NUM_SEQS; ++s) {
    if (seq_lens[s] != kLens[s]) fail("exported length");
  }

  /* Decoder: GQA, 4 query heads over 2 KV heads, FP32 in and out. */
  kvp_decode_config dc;
  kvp_decode_config_init(&dc);
  dc.num_query_heads = Q_HEADS;
  dc.max_num_seqs = NUM_SEQS;
  dc.max_context_len = MAX_CONTEXT;
  dc.max_query_len = 1;
  dc.q_dtype = KVP_DTYPE_FP32;
  dc.out_dtype = KVP_DTYPE_FP32;
  kvp_decoder* decoder = NULL;
  CHECK(kvp_decoder_create(cache, &dc, &decoder));

  float q[NUM_SEQS * Q_DENSE];
  float out[NUM_SEQS * Q_DENSE];
  float lse[NUM_SEQS * Q_HEADS];
  double max_err = 0.0, max_tol = 0.0, max_lse_err = 0.0, max_ratio = 0.0;
  const double sm_scale = 1.0 / sqrt((double)HEAD);
  for (l = 0; l < NUM_LAYERS; ++l) {
    for (i = 0; i < NUM_SEQS * Q_DENSE; ++i) {
      q[i] = randn();
      out[i] = NAN; /* poison: every element must be written */
    }
    for (i = 0; i < NUM_SEQS * Q_HEADS; ++i) lse[i] = NAN;
    kvp_decode_args a;
    kvp_decode_args_init(&a);
    a.layer = l;
    a.num_seqs = NUM_SEQS;
    a.query_len = 1;
    a.q = q;
    a.block_table = table;
    a.block_table_width = TABLE_WIDTH;
    a.seq_lens = seq_lens;
    a.out = out;
    a.lse = lse;
    CHECK(kvp_decode(decoder, &a, NULL));

    const float* lk = keys + (size_t)l * kv_elems;
    const float* lv = values + (size_t)l * kv_elems;
    int32_t first = 0; /* index of the sequence's first token in keys/values */
    for (s = 0; s < NUM_SEQS; ++s) {
      for (h = 0; h < Q_HEADS; ++h) {
        const int kvh = h / (Q_HEADS / KV_HEADS);
        const float* qh = q + (size_t)s * Q_DENSE + (size_t)h * HEAD;
        double logits[MAX_CONTEXT], half_step[MAX_CONTEXT], m = -INFINITY, sum = 0.0;
        for (j = 0; j < kLens[s]; ++j) {
          const float* kj = lk + (size_t)(first + j) * DENSE + (size_t)kvh * HEAD;
          const float* vj = lv + (size_t)(first + j) * DENSE + (size_t)kvh * HEAD;
          double dot = 0.0, lo = vj[0], hi = vj[0];
          for (d = 0; d < HEAD; ++d) {
            dot += (double)qh[d] * kj[d];
            if (vj[d] < lo) lo = vj[d];
            if (vj[d] > hi) hi = vj[d];
          }
          logits[j] = sm_scale * dot;
          if (logits[j] > m) m = logits[j];
          half_step[j] = (hi - lo) / 30.0 * 1.01;
        }
        for (j = 0; j < kLens[s]; ++j) {
          logits[j] = exp(logits[j] - m);
          sum += logits[j];
        }
        double vbound = 0.0;
        for (j = 0; j < kLens[s]; ++j) vbound += logits[j] / sum * half_step[j];
        const double tol = vbound + K_ALLOWANCE;
        if (tol > max_tol) max_tol = tol;
        for (d = 0; d < HEAD; ++d) {
          double ref = 0.0;
          for (j = 0; j < kLens[s]; ++j) {
            ref += logits[j] / sum * lv[(size_t)(first + j) * DENSE + (size_t)kvh * HEAD + d];
          }
          const float got = out[(size_t)s * Q_DENSE + (size_t)h * HEAD + d];
          const double err = fabs((double)got - ref);
          if (!isfinite(got)) {
            fprintf(stderr, "layer %d seq %d head %d dim %d: output %g is not finite\n", l, s, h, d,
                    got);
            fail("non-finite or unwritten output");
          }
          if (err > max_err) max_err = err;
          if (err / tol > max_ratio) max_ratio = err / tol;
          if (err > tol || err > CAP) {
            fprintf(stderr,
                    "layer %d seq %d head %d dim %d: got %.6f, reference %.6f, error %.4f "
                    "> tolerance %.4f (seed %llu)\n",
                    l, s, h, d, got, ref, err, tol, (unsigned long long)seed);
            fail("decode output differs from the float64 reference");
          }
        }
        const double ref_lse = m + log(sum);
        const float got_lse = lse[s * Q_HEADS + h];
        if (!isfinite(got_lse) || fabs(got_lse - ref_lse) > K_ALLOWANCE) {
          fprintf(stderr, "layer %d seq %d head %d: lse %.6f, reference %.6f (seed %llu)\n", l, s,
                  h, got_lse, ref_lse, (unsigned long long)seed);
          fail("lse differs from the float64 reference");
        }
        if (fabs(got_lse - ref_lse) > max_lse_err) max_lse_err = fabs(got_lse - ref_lse);
      }
      first += kLens[s];
    }
  }

  kvp_decoder_destroy(decoder);
  for (s = 0; s < NUM_SEQS; ++s) CHECK(kvp_seq_free(cache, seq_ids[s]));
  {
    int32_t num_free = -1;
    CHECK(kvp_cache_num_free_blocks(cache, &num_free));
    if (num_free != NUM_BLOCKS) fail("blocks not returned after freeing every sequence");
  }
  kvp_cache_destroy(cache);
  free(slots);
  free(keys);
  free(values);
  printf(
      "c99_api_test: OK: %s, INT8 K / INT4 V, %d layers, seqs {5, 17, 40}, GQA %d/%d: "
      "max |out - ref| %.4f (%.0f%% of its tolerance; largest tolerance %.4f), "
      "max |lse - ref| %.4f, seed %llu\n",
      kvp_version_string(), NUM_LAYERS, Q_HEADS, KV_HEADS, max_err, 100.0 * max_ratio, max_tol,
      max_lse_err, (unsigned long long)seed);
  return 0;
}
