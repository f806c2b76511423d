/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpage — paged KV cache and decode attention, C ABI.
 *
 * One header, plain C99. Everything the library exports starts with kvp_ /
 * KVP_. Conventions (the same for every entry):
 *
 *  - A call that can fail returns a kvp_error*: NULL means success, anything
 *    else is an error object the caller owns and releases with
 *    kvp_error_free(). Its code (kvp_error_code()) is stable across
 *    releases; its message names the bad argument and its value. A failed
 *    call leaves its out-parameters and the cache unchanged.
 *  - Structs passed by pointer begin with `size_t struct_size`; fill them
 *    with the matching kvp_*_init() first. The library accepts any
 *    struct_size at least as large as the first released version of the
 *    struct and treats fields beyond struct_size as their defaults.
 *  - Handles are opaque, typed, and created by kvp_X_create(..., kvp_X**)
 *    and released by kvp_X_destroy(), which accepts NULL.
 *  - Nothing aborts, exits, prints, or throws across this boundary.
 *
 * Thread safety:
 *  - kvp_cache: sequence operations (kvp_seq_*, kvp_cache_export_block_table,
 *    kvp_cache_num_free_blocks) may be called from several threads at once;
 *    they are serialized internally. kvp_cache_get_info,
 *    kvp_cache_get_layout and kvp_decoder_create only read the cache and may
 *    run alongside anything but kvp_cache_destroy. The write statistics may
 *    be read or reset while writes run; such a read or reset may miss the
 *    counts of the writes in flight. Writes, decodes and block copies may be
 *    issued from several threads too; on the CUDA backend they are ordered
 *    by the stream the caller passes, on the CPU backend they run at once
 *    and the caller must not write and read the same blocks concurrently.
 *    kvp_cache_pack, kvp_cache_unpack and the format signature calls are
 *    ordered the same way as block copies.
 *    kvp_cache_destroy() must not race with any other call on the cache.
 *  - kvp_decoder: kvp_decode() on one decoder must not run concurrently
 *    from two threads when the decoder owns its workspace (the workspace
 *    would be shared); use one decoder per thread or stream.
 *  - kvp_error objects are plain values, safe to hand between threads.
 */
#ifndef KVPAGE_KVPAGE_H_
#define KVPAGE_KVPAGE_H_

/* Laid out by hand, as sqlite3.h and zstd.h are (field comments aligned). */
/* clang-format off */

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define KVP_EXPORT
#elif defined(__GNUC__)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                  */
/* ------------------------------------------------------------------------ */

/* Package version (semantic versioning of the project). */
#define KVP_VERSION_MAJOR 0
#define KVP_VERSION_MINOR 1
#define KVP_VERSION_PATCH 0
#define KVP_VERSION_STRING "0.1.0"

/* ABI version. Major: something removed or reordered (never, within a
 * major). Minor: entries appended to the function table or fields appended
 * to a struct. */
#define KVP_ABI_MAJOR 1
#define KVP_ABI_MINOR 4

/* Struct sizes by ABI version, as PJRT_STRUCT_SIZE in OpenXLA's PJRT C API:
 * the bytes of `type` up to and including `last_field`. Each struct that
 * begins with struct_size, and the function table, is followed by
 * KVP_<NAME>_STRUCT_SIZE_<major>_<minor> for the version that first released
 * it and for each minor that appended to it, naming that version's last
 * field; the library accepts any struct_size at least the first one. A field
 * appended after the first release ends its line with a comment holding only
 * the ABI version that added it (`ABI 1.1`, as kvp_cache_config.checked
 * does); fields without that mark are ABI 1.0, or, in a struct first
 * released later, of the version its struct_size line is marked with. */
#define KVP_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* "0.1.0": the package version of the loaded library. */
KVP_EXPORT const char* kvp_version_string(void);
/* The ABI version of the loaded library. */
KVP_EXPORT void kvp_abi_version(uint32_t* major, uint32_t* minor);
/* What this build holds: backends, CUDA architectures, KV dtypes, head sizes,
 * block sizes; one line of "key=value" pairs separated by "; ". */
KVP_EXPORT const char* kvp_build_info(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Stable codes: never renumbered, only appended. */
typedef enum kvp_error_code_t {
  KVP_OK = 0,
  KVP_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or inconsistent arg */
  KVP_ERR_OUT_OF_BLOCKS = 2,    /* the cache has too few free blocks */
  KVP_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
  KVP_ERR_UNSUPPORTED = 4,      /* valid request this build cannot serve */
  KVP_ERR_DEVICE = 5,           /* the CUDA runtime reported an error */
  KVP_ERR_INTERNAL = 6          /* a bug in kvpage: please report it */
} kvp_error_code_t;

typedef struct kvp_error kvp_error;

/* The code of an error; KVP_OK for NULL. */
KVP_EXPORT int32_t kvp_error_code(const kvp_error* error);
/* The message of an error, valid until kvp_error_free(); "" for NULL. */
KVP_EXPORT const char* kvp_error_message(const kvp_error* error);
/* Releases an error; accepts NULL. */
KVP_EXPORT void kvp_error_free(kvp_error* error);
/* "INVALID_ARGUMENT" etc.; "UNKNOWN" for codes this build does not know. */
KVP_EXPORT const char* kvp_error_code_name(int32_t code);

/* ------------------------------------------------------------------------ */
/* Data types and devices                                                    */
/* ------------------------------------------------------------------------ */

typedef enum kvp_dtype_t {
  KVP_DTYPE_FP32 = 0,     /* inputs, queries and outputs only */
  KVP_DTYPE_FP16 = 1,
  KVP_DTYPE_BF16 = 2,
  KVP_DTYPE_FP8_E4M3 = 3, /* KV cache only: symmetric, FP16 scale per token-head */
  KVP_DTYPE_INT8 = 4,     /* KV cache only: symmetric, FP16 scale per token-head */
  KVP_DTYPE_INT4 = 5      /* KV cache only: asymmetric, FP16 scale + FP16 min */
} kvp_dtype_t;

typedef enum kvp_device_kind_t {
  KVP_DEVICE_CPU = 0,
  KVP_DEVICE_CUDA = 1
} kvp_device_kind_t;

/* Number of devices of a kind this build can use: 1 for the CPU, the CUDA
 * device count for CUDA (0 when the build has no CUDA backend or no GPU is
 * present; that is not an error). */
KVP_EXPORT kvp_error* kvp_device_count(int32_t device_kind, int32_t* count);

/* ------------------------------------------------------------------------ */
/* Cache                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct kvp_cache kvp_cache;

/* Engine-provided memory for the cache and for the workspaces its decoders
 * own (optional): alloc is called once by kvp_cache_create and once by each
 * kvp_decoder_create that needs a workspace it owns (none on the CPU
 * backend); free once for each, with the same size, by kvp_cache_destroy and
 * kvp_decoder_destroy. alloc returns NULL on failure; the creating call then
 * fails with KVP_ERR_OUT_OF_MEMORY and keeps nothing. Memory must be host
 * memory for KVP_DEVICE_CPU and device memory of `device_ordinal` for
 * KVP_DEVICE_CUDA, aligned to at least `alignment` bytes. */
typedef struct kvp_allocator {
  size_t struct_size;
  void* user_data;
  void* (*alloc)(void* user_data, size_t bytes, size_t alignment,
                 int32_t device_kind, int32_t device_ordinal);
  void (*free)(void* user_data, void* ptr, size_t bytes, int32_t device_kind,
               int32_t device_ordinal);
} kvp_allocator;
#define KVP_ALLOCATOR_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_allocator, free)

KVP_EXPORT void kvp_allocator_init(kvp_allocator* allocator);

typedef struct kvp_cache_config {
  size_t struct_size;
  int32_t device_kind;    /* kvp_device_kind_t; default KVP_DEVICE_CPU */
  /* CUDA device; default 0. Every call on the cache runs there, whatever
   * the calling thread's current device, and leaves that current device as
   * it found it; device pointers passed for the cache (inputs, tables,
   * outputs) are memory of this device. Must be 0 for KVP_DEVICE_CPU
   * (there is one CPU device; anything else is KVP_ERR_INVALID_ARGUMENT,
   * which catches a GPU cache whose device_kind was left at its default). */
  int32_t device_ordinal;
  int32_t num_layers;     /* >= 1; default 1 */
  /* >= 1; default 0 (must be set). num_blocks * block_size (the number of
   * slots) must be below 2^31: slots and block ids are int32 in the
   * kernels. A larger product is KVP_ERR_INVALID_ARGUMENT, refused before
   * anything is allocated. */
  int32_t num_blocks;
  int32_t block_size;     /* tokens per block: 8, 16 or 32; default 16 */
  int32_t num_kv_heads;   /* 1..65535; default 0 (must be set) */
  /* Head size and dtypes: those this build holds, kvp_build_info()'s
   * head_sizes and kv_dtypes (a full build: head size 64, 80, 96, 112, 128
   * or 256, every dtype below; a reduced build, fewer). */
  int32_t head_size;     /* default 128 */
  int32_t k_dtype;        /* FP16, BF16, FP8_E4M3, INT8, INT4; default BF16 */
  int32_t v_dtype;        /* same set as k_dtype; default BF16 */
  int32_t reserved0;      /* must be 0 */
  /* Optional per-channel key smoothing (SmoothAttention): NULL, or host
   * memory holding num_kv_heads * head_size positive finite floats. The
   * write stores K / lambda, the decode multiplies q by lambda. Copied at
   * creation. */
  const float* key_smoothing;
  /* Optional engine allocator; NULL means the library allocates. Copied at
   * creation; the functions must stay callable until the cache and its
   * decoders are destroyed. */
  const kvp_allocator* allocator;
  /* Checked mode (default 0 = off): the CUDA kernels validate what
   * they read from device memory — block ids in block tables (against
   * num_blocks), seq_lens (against max_context_len and block_table_width *
   * block_size), slot mappings, device-side copy pairs and the block ids
   * of kvp_cache_pack / kvp_cache_unpack (in range; unpack destinations
   * distinct) — and skip any access a bad value would make. The first
   * violation is recorded in host-mapped memory; the next kvp_cache_write,
   * kvp_decode, kvp_attend, kvp_cache_copy_blocks, kvp_cache_transfer_blocks,
   * kvp_cache_pack or kvp_cache_unpack on the cache returns
   * it as KVP_ERR_INVALID_ARGUMENT ("checked mode: ...", naming the array,
   * the index and the value) and clears it. Outputs of the sequences with a
   * bad value are unspecified (finite; a partition with a bad block id
   * contributes nothing). Costs a few instructions per block; no host
   * synchronization. The CPU backend validates these on the host in every
   * mode. In the default fast mode the CUDA kernels trust them (see
   * docs/RELIABILITY.md): slots out of range are skipped, anything else out
   * of range is undefined behaviour. */
  int32_t checked; /* ABI 1.1 */
} kvp_cache_config;
#define KVP_CACHE_CONFIG_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_cache_config, allocator)
#define KVP_CACHE_CONFIG_STRUCT_SIZE_1_1 KVP_STRUCT_SIZE(kvp_cache_config, checked)

KVP_EXPORT void kvp_cache_config_init(kvp_cache_config* config);

KVP_EXPORT kvp_error* kvp_cache_create(const kvp_cache_config* config,
                                       kvp_cache** cache);
KVP_EXPORT void kvp_cache_destroy(kvp_cache* cache);

/* Where one layer of the cache lives, for engines that read or write it
 * themselves. All pointers are in the cache's device memory space. Byte
 * offsets of element (block b, head h, ...):
 *   K data  (16-byte chunks of k_x elements; INT4: two per byte, low nibble
 *            first):  b*k_block_stride + h*k_head_stride
 *                     + c*k_chunk_stride + t*16 + byte-in-chunk
 *            for chunk c = d / k_x of channel d and token t in the block.
 *   V data  (INT4: two tokens per byte, even token in the low nibble):
 *            b*v_block_stride + h*v_head_stride + d*v_channel_stride
 *            + (t * v_bits / 8)
 *   scales  (FP16; INT4 holds {scale, min} pairs): b*scale_block_stride
 *            + h*scale_head_stride + t*scale_entry_bytes
 * Scale pointers are NULL and their strides 0 for FP16/BF16 data. */
typedef struct kvp_layer_layout {
  size_t struct_size;
  void* k_data;
  void* v_data;
  void* k_scales;
  void* v_scales;
  int64_t k_block_stride;   /* bytes */
  int64_t k_head_stride;    /* bytes */
  int64_t k_chunk_stride;   /* bytes: one chunk = block_size * 16 bytes */
  int32_t k_x;              /* elements per 16-byte chunk: 8, 16 or 32 */
  int32_t k_chunks;         /* ceil(head_size / k_x); tail elements are 0 */
  int64_t v_block_stride;   /* bytes */
  int64_t v_head_stride;    /* bytes */
  int64_t v_channel_stride; /* bytes: block_size * v_bits / 8 */
  int32_t k_bits;           /* bits per K element: 16, 8 or 4 */
  int32_t v_bits;           /* bits per V element: 16, 8 or 4 */
  int64_t k_scale_block_stride; /* bytes */
  int64_t k_scale_head_stride;  /* bytes */
  int64_t v_scale_block_stride; /* bytes */
  int64_t v_scale_head_stride;  /* bytes */
  int32_t k_scale_entry_bytes;  /* 0, 2 (scale) or 4 ({scale, min}) */
  int32_t v_scale_entry_bytes;
  int64_t k_data_bytes;     /* size of the whole layer's K data */
  int64_t v_data_bytes;
  int64_t k_scale_bytes;
  int64_t v_scale_bytes;
} kvp_layer_layout;
#define KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_layer_layout, v_scale_bytes)

KVP_EXPORT void kvp_layer_layout_init(kvp_layer_layout* layout);
KVP_EXPORT kvp_error* kvp_cache_get_layout(const kvp_cache* cache,
                                           int32_t layer,
                                           kvp_layer_layout* layout);

/* Sizes of the cache as a whole. */
typedef struct kvp_cache_info {
  size_t struct_size;
  int32_t device_kind;
  int32_t device_ordinal;
  int32_t num_layers;
  int32_t num_blocks;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_size;
  int32_t k_dtype;
  int32_t v_dtype;
  int32_t has_key_smoothing;
  /* Bytes one token occupies in one layer, K + V + their scales, all KV
   * heads (what a decode reads per token per layer). */
  int64_t bytes_per_token_per_layer;
  int64_t total_bytes; /* everything the cache allocated */
} kvp_cache_info;
#define KVP_CACHE_INFO_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_cache_info, total_bytes)

KVP_EXPORT void kvp_cache_info_init(kvp_cache_info* info);
KVP_EXPORT kvp_error* kvp_cache_get_info(const kvp_cache* cache,
                                         kvp_cache_info* info);

/* ------------------------------------------------------------------------ */
/* Sequences and block tables (optional: engines with their own block       */
/* manager pass their own tables and slot mappings to the operations)       */
/* ------------------------------------------------------------------------ */

/* Creates an empty sequence; ids are assigned by the cache, never reused. */
KVP_EXPORT kvp_error* kvp_seq_create(kvp_cache* cache, int64_t* seq_id);
/* Creates a sequence that shares every block of `parent` (prefix sharing);
 * the first append to a shared, partly filled last block copies it first. */
KVP_EXPORT kvp_error* kvp_seq_fork(kvp_cache* cache, int64_t parent,
                                   int64_t* child);
/* Appends num_tokens tokens, allocating blocks as needed, and writes their
 * slots (block * block_size + offset) into slots[0..num_tokens) (host
 * memory; may be NULL). A copy-on-write of the last block is performed on
 * `stream` (ignored on the CPU backend) before the call returns. Too few
 * free blocks: KVP_ERR_OUT_OF_BLOCKS and nothing changes. */
KVP_EXPORT kvp_error* kvp_seq_append(kvp_cache* cache, int64_t seq_id,
                                     int32_t num_tokens, int64_t* slots,
                                     void* stream);
/* Shortens a sequence to `length` tokens (<= its length), releasing blocks
 * it no longer needs (rejected speculative tokens). */
KVP_EXPORT kvp_error* kvp_seq_truncate(kvp_cache* cache, int64_t seq_id,
                                       int32_t length);
/* Releases the sequence and its references to blocks. */
KVP_EXPORT kvp_error* kvp_seq_free(kvp_cache* cache, int64_t seq_id);
KVP_EXPORT kvp_error* kvp_seq_length(const kvp_cache* cache, int64_t seq_id,
                                     int32_t* length);
KVP_EXPORT kvp_error* kvp_cache_num_free_blocks(const kvp_cache* cache,
                                                int32_t* num_free);

/* Writes a batch's dense block table into caller host memory:
 * table[i * row_stride + j] = j-th block of seq_ids[i] for
 * j < max_blocks_per_seq (entries past the sequence's blocks are 0), and
 * seq_lens[i] = its length (seq_lens may be NULL). A sequence with more
 * than max_blocks_per_seq blocks is KVP_ERR_INVALID_ARGUMENT. */
KVP_EXPORT kvp_error* kvp_cache_export_block_table(
    const kvp_cache* cache, const int64_t* seq_ids, int32_t num_seqs,
    int32_t max_blocks_per_seq, int64_t row_stride, int32_t* table,
    int32_t* seq_lens);

/* ------------------------------------------------------------------------ */
/* Writing tokens                                                            */
/* ------------------------------------------------------------------------ */

/* key[t * key_token_stride + h * head_size + d] (same for value), in
 * input_dtype (FP32, FP16 or BF16), for t < num_tokens: token t goes to slot
 * slot_mapping[t] (int64, vLLM's convention; -1 skips the token). Pointers
 * are in the cache's memory space. Quantized dtypes get one scale per token
 * and KV head. Non-finite inputs are stored as 0 and counted; values beyond
 * the format's range saturate and are counted (kvp_cache_get_write_stats).
 *
 * Slots other than -1 must be distinct within one call. A repeated slot is
 * not refused (finding it would cost the GPU write a pass over the
 * mapping) and touches no other slot, but what it holds is unspecified on
 * the CUDA backend (its K, V and scales may come from different tokens of
 * the call); on the CPU backend it holds the K, V and scales of one of
 * those tokens, whole.
 *
 * num_tokens = 0 is a no-op that succeeds; every other argument is still
 * checked (layer, input_dtype, strides, reserved0), except key, value and
 * slot_mapping, which may then be NULL. */
typedef struct kvp_write_args {
  size_t struct_size;
  int32_t layer;
  int32_t num_tokens;
  int32_t input_dtype;       /* default KVP_DTYPE_BF16 */
  int32_t reserved0;         /* must be 0 */
  const void* key;
  const void* value;
  int64_t key_token_stride;  /* elements; 0 = num_kv_heads * head_size */
  int64_t value_token_stride;
  const int64_t* slot_mapping;
} kvp_write_args;
#define KVP_WRITE_ARGS_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_write_args, slot_mapping)

KVP_EXPORT void kvp_write_args_init(kvp_write_args* args);
KVP_EXPORT kvp_error* kvp_cache_write(kvp_cache* cache,
                                      const kvp_write_args* args,
                                      void* stream);

/* Counters the writes keep (on the device for CUDA caches), over all layers
 * since creation or the last reset. Reading synchronizes with the cache's
 * device. */
typedef struct kvp_write_stats {
  size_t struct_size;
  uint64_t non_finite; /* NaN / +-Inf input values (stored as 0) */
  uint64_t saturated;  /* finite values clipped to the format's range */
} kvp_write_stats;
#define KVP_WRITE_STATS_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_write_stats, saturated)

KVP_EXPORT void kvp_write_stats_init(kvp_write_stats* stats);
KVP_EXPORT kvp_error* kvp_cache_get_write_stats(const kvp_cache* cache,
                                                kvp_write_stats* stats);
KVP_EXPORT kvp_error* kvp_cache_reset_write_stats(kvp_cache* cache);

/* ------------------------------------------------------------------------ */
/* Block copies                                                              */
/* ------------------------------------------------------------------------ */

/* For each i < num_pairs, copies block pairs[2i] to block pairs[2i+1] in
 * every layer, data and scales together. `pairs` is in the cache's memory
 * space. Destinations must be distinct and not also sources. */
KVP_EXPORT kvp_error* kvp_cache_copy_blocks(kvp_cache* cache,
                                            const int32_t* pairs,
                                            int32_t num_pairs, void* stream);
/* Same, from block pairs[2i] of `src` to block pairs[2i+1] of `dst`: two
 * caches of the same geometry and dtypes (e.g. a GPU cache and its CPU swap
 * space). `pairs` is host memory. Their key smoothing vectors must be equal
 * bit for bit, or both absent: the stored K is K / lambda, so a block
 * decodes to other keys under another lambda. Any difference is
 * KVP_ERR_INVALID_ARGUMENT (naming the first differing kv head and channel
 * and both values) and nothing is copied. */
KVP_EXPORT kvp_error* kvp_cache_transfer_blocks(kvp_cache* dst,
                                                const kvp_cache* src,
                                                const int32_t* pairs,
                                                int32_t num_pairs,
                                                void* stream);

/* ------------------------------------------------------------------------ */
/* Decode attention                                                          */
/* ------------------------------------------------------------------------ */

/* For sequence s, query token i < query_len and query head h:
 *   p   = seq_lens[s] - query_len + i          (the query's position)
 *   l_j = sm_scale * (q . k_j)                 for tokens j <= p
 *   l_j = cap * tanh(l_j / cap)                if logits_soft_cap > 0
 *   l_j += alibi_slopes[h] * (j - p)           if alibi_slopes
 *   tokens with j <= p - sliding_window are masked if sliding_window > 0
 *   out = sum_j softmax(l)_j * v_j,  lse = log(sum_j exp(l_j))
 * over the tokens named by row s of the block table, K/V head
 * h / (num_query_heads / num_kv_heads). A query with no visible token
 * (seq_lens[s] == 0, e.g. a padding row) outputs zeros and lse = -inf.
 *
 * The decoder fixes the capacities a launch is shaped by, so one CUDA graph
 * captured once serves every batch within them: lengths and tables are read
 * from memory when the kernels run. A captured graph also keeps the
 * num_seqs and query_len it was captured with: capture with num_seqs =
 * max_num_seqs and give rows a batch does not use length 0 (they cost a
 * block that exits at once). */
typedef struct kvp_decoder kvp_decoder;

typedef struct kvp_decode_config {
  size_t struct_size;
  int32_t num_query_heads; /* multiple of num_kv_heads; default 0 (set it) */
  int32_t max_num_seqs;    /* default 0 (set it) */
  int32_t max_context_len; /* tokens; default 0 (set it) */
  int32_t max_query_len;   /* query tokens per sequence; default 1 */
  int32_t q_dtype;         /* FP32, FP16 or BF16; default BF16 */
  int32_t out_dtype;       /* FP32, FP16 or BF16; default BF16 */
  /* Optional caller-owned workspace of at least kvp_decode_workspace_size()
   * bytes in the cache's memory space, 256-byte aligned; NULL = owned by the
   * decoder (from the cache's kvp_allocator when it has one). It is scratch
   * for the decodes: decoders used one after another on one stream may
   * share one. */
  void* workspace;
  uint64_t workspace_bytes;
  /* Precise mode (default 0 = off, the fastest path): 1 computes every
   * decode of this decoder in FP32 from end to end, queries included (FP32
   * queries are not rounded to 16 bits; 16-bit ones are exact in FP32), so
   * that the LSE is accurate to FP32 rounding and an engine that merges
   * partial results by their LSE (cascade attention, split prefill) can
   * rely on it. Precise mode runs the CUDA-core kernel: 1.0-1.7x the
   * default's time for 16-bit caches, 1.3-4.6x for quantized ones
   * (docs/PERFORMANCE.md). The CPU backend is precise either way.
   *
   * The precision contract of the CUDA decode, FP32 output against float64
   * attention over the values the cache stores (rel-L2 over a batch), and
   * the LSE's error as |error| / (1 + |LSE|), measured on Gaussian data, a
   * peaked softmax, logits past 100 and a 32k context (docs/ACCURACY.md):
   *  - precise mode, and the CUDA-core kernel wherever it runs (MHA on
   *    16-bit caches, K and V of different dtypes): q, logits, P and the
   *    sums in FP32; output <= 2e-5, LSE <= 2e-5;
   *  - tensor-core kernels of BF16/FP16 caches: q and P each split into
   *    two 16-bit parts (hi + lo), FP32 sums; output <= 2e-5, LSE <= 5e-5;
   *  - tensor-core kernels of FP8/INT8/INT4 caches: q and P rounded to
   *    FP16, FP32 sums; output <= 3e-3, LSE <= 1.5e-2.
   * A 16-bit output adds its own rounding (at most half an ulp). */
  int32_t precise; /* ABI 1.2 */
  /* Query tokens of one kvp_attend call, all sequences together: the
   * capacity kvp_attend's launches are shaped by. Default 0 = max_num_seqs
   * * max_query_len (at most 2^31 - 1). */
  int32_t max_query_tokens; /* ABI 1.3 */
} kvp_decode_config;
#define KVP_DECODE_CONFIG_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_decode_config, workspace_bytes)
#define KVP_DECODE_CONFIG_STRUCT_SIZE_1_2 KVP_STRUCT_SIZE(kvp_decode_config, precise)
#define KVP_DECODE_CONFIG_STRUCT_SIZE_1_3 KVP_STRUCT_SIZE(kvp_decode_config, max_query_tokens)

KVP_EXPORT void kvp_decode_config_init(kvp_decode_config* config);
KVP_EXPORT kvp_error* kvp_decode_workspace_size(const kvp_cache* cache,
                                                const kvp_decode_config* config,
                                                uint64_t* bytes);
KVP_EXPORT kvp_error* kvp_decoder_create(const kvp_cache* cache,
                                         const kvp_decode_config* config,
                                         kvp_decoder** decoder);
KVP_EXPORT void kvp_decoder_destroy(kvp_decoder* decoder);

typedef struct kvp_decode_args {
  size_t struct_size;
  int32_t layer;
  int32_t num_seqs;   /* <= max_num_seqs */
  int32_t query_len;  /* 1..max_query_len; default 1 */
  int32_t sliding_window; /* tokens attended per query, 0 = all; default 0 */
  float sm_scale;         /* 0 = 1/sqrt(head_size); default 0 */
  float logits_soft_cap;  /* 0 = off; default 0 */
  /* q[(s * query_len + i) * q_token_stride + h * head_size + d] */
  const void* q;
  int64_t q_token_stride;   /* elements; 0 = num_query_heads * head_size */
  /* block_table[s * block_table_stride + j], int32, j < block_table_width */
  const int32_t* block_table;
  int64_t block_table_stride; /* elements; 0 = block_table_width */
  int32_t block_table_width;
  int32_t reserved0;          /* must be 0 */
  const int32_t* seq_lens;    /* [num_seqs], <= max_context_len */
  const float* alibi_slopes;  /* [num_query_heads] or NULL */
  /* out[(s * query_len + i) * out_token_stride + h * head_size + d] */
  void* out;
  int64_t out_token_stride; /* elements; 0 = num_query_heads * head_size */
  float* lse;  /* [num_seqs][query_len][num_query_heads] FP32, or NULL */
} kvp_decode_args;
#define KVP_DECODE_ARGS_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_decode_args, lse)

KVP_EXPORT void kvp_decode_args_init(kvp_decode_args* args);
/* Launches on `stream` (a cudaStream_t; NULL = the default stream) without
 * allocating or synchronizing; runs at once on the CPU backend.
 * num_seqs = 0 is a no-op that succeeds; every other argument is still
 * checked (layer, query_len, sliding_window, sm_scale, logits_soft_cap,
 * strides, block_table_width, reserved0), except q, block_table, seq_lens,
 * out and lse, which may then be NULL. */
KVP_EXPORT kvp_error* kvp_decode(kvp_decoder* decoder,
                                 const kvp_decode_args* args, void* stream);

/* ------------------------------------------------------------------------ */
/* Attention over query chunks (varlen)                                      */
/* ------------------------------------------------------------------------ */

/* kvp_attend: one call over a batch whose sequences each bring their own
 * number of query tokens (chunked prefill, prefix-cache hits, speculative
 * verification, and batches that mix them with decoding sequences), on a
 * kvp_decoder. Sequence s owns query tokens query_starts[s] ..
 * query_starts[s + 1] - 1 (FlashAttention's cu_seqlens_q); its n_s =
 * query_starts[s + 1] - query_starts[s] tokens are the last n_s of its
 * context of seq_lens[s] tokens, which the engine has already written with
 * kvp_cache_write. Token i of the chunk sits at position
 *   p = seq_lens[s] - n_s + i
 * and attends as kvp_decode's query token at p does (causal, aligned to the
 * end of the context; ALiBi, sliding window, soft-cap, key smoothing alike).
 * A sequence with n_s = 0 costs nothing and writes nothing; one with
 * seq_lens[s] = 0 < n_s is an error (n_s <= seq_lens[s] is required).
 *
 * Capacities come from the decoder (max_num_seqs, max_context_len,
 * max_query_tokens): one CUDA graph captured once serves every mix of
 * lengths within them, with no host work per batch; query_starts,
 * seq_lens and the block table are read from memory when the kernels run.
 * Precision (docs/DECISIONS.md, "Query chunks"): the CUDA kernels multiply
 * on tensor cores with q rounded to K's 16-bit type and the softmax weights
 * to V's (BF16 for BF16 caches, FP16 otherwise) and sum in FP32, as
 * FlashAttention does; against float64 attention over the cache's values,
 * FP32 output within rel-L2 8e-3 (BF16 V) or 2e-3 (FP16 and quantized V)
 * over a batch and LSE within 2e-2 * (1 + |LSE|), as
 * tests/capi/gpu_attend_test.cc holds them. kvp_attend on a precise
 * decoder is served by the CPU backend (which computes in double) and is
 * KVP_ERR_UNSUPPORTED on CUDA. */
typedef struct kvp_attend_args {
  size_t struct_size; /* ABI 1.3 */
  int32_t layer;
  int32_t num_seqs;       /* <= max_num_seqs */
  int32_t sliding_window; /* tokens attended per query, 0 = all; default 0 */
  float sm_scale;         /* 0 = 1/sqrt(head_size); default 0 */
  float logits_soft_cap;  /* 0 = off; default 0 */
  int32_t reserved0;      /* must be 0 */
  /* int32 [num_seqs + 1], non-decreasing from query_starts[0] = 0 to at
   * most max_query_tokens; in the cache's memory space. */
  const int32_t* query_starts;
  /* q[t * q_token_stride + h * head_size + d], t < query_starts[num_seqs] */
  const void* q;
  int64_t q_token_stride;   /* elements; 0 = num_query_heads * head_size */
  /* block_table[s * block_table_stride + j], int32, j < block_table_width */
  const int32_t* block_table;
  int64_t block_table_stride; /* elements; 0 = block_table_width */
  int32_t block_table_width;
  int32_t reserved1;          /* must be 0 */
  const int32_t* seq_lens;    /* [num_seqs], context lengths, new tokens included */
  const float* alibi_slopes;  /* [num_query_heads] or NULL */
  /* out[t * out_token_stride + h * head_size + d] */
  void* out;
  int64_t out_token_stride; /* elements; 0 = num_query_heads * head_size */
  float* lse;  /* [query token t][num_query_heads] FP32, or NULL */
} kvp_attend_args;
#define KVP_ATTEND_ARGS_STRUCT_SIZE_1_3 KVP_STRUCT_SIZE(kvp_attend_args, lse)

KVP_EXPORT void kvp_attend_args_init(kvp_attend_args* args);
/* Launches on `stream` without allocating or synchronizing, as kvp_decode;
 * runs at once on the CPU backend. num_seqs = 0 is a no-op that succeeds
 * once every other argument checks out (query_starts, q, block_table,
 * seq_lens, out and lse may then be NULL). Lengths and offsets that live in
 * device memory are checked on the host by the CPU backend and, in checked
 * mode (kvp_cache_config.checked), on the device by the CUDA backend, which
 * reports them at the next call; without it a bad value reads and writes
 * nothing outside the cache, the table, q, out and lse, but its rows'
 * results are undefined. */
KVP_EXPORT kvp_error* kvp_attend(kvp_decoder* decoder,
                                 const kvp_attend_args* args, void* stream);

/* ------------------------------------------------------------------------ */
/* Moving blocks between processes: pack and unpack (ABI 1.4)               */
/* ------------------------------------------------------------------------ */

/* Disaggregated serving computes a request's KV in one cache (prefill) and
 * decodes it from another, on another GPU or host. kvp_cache_pack copies a
 * list of blocks over a range of layers, data and scales, into one
 * contiguous buffer; the engine moves the buffer with its own transport
 * (NCCL, RDMA, a socket); kvp_cache_unpack copies it into the receiving
 * cache at block ids the receiver chose (from its own kvp_seq_append, or
 * its own block manager). The blocks move as stored: an INT8 block is
 * about half of a BF16 one, an INT4 block about a quarter.
 *
 * Buffer layout (docs/FORMATS.md, "Packed blocks"), layer-major: for each
 * layer of the range, for each region (K data, V data, K scales, V scales;
 * FP16/BF16 data has no scale regions), the listed blocks' bytes of that
 * region in list order, exactly as the cache stores them. A layer takes
 * kvp_cache_pack_size(cache, num_blocks, 1) bytes, so a pack of layers
 * [a, b) is the packs of layers a, a + 1, ... one after another: an engine
 * can send each layer as prefill finishes it, and unpack layer by layer or
 * all at once.
 *
 * Compatibility: packed bytes mean the same in two caches of the same
 * format: number of layers, block size, KV heads, head size, K and V
 * dtypes, key smoothing vector and buffer layout. Their number of blocks,
 * device kind and device may differ (a GPU cache packs for a CPU cache and
 * back). kvp_cache_format_signature writes the format as a
 * KVP_FORMAT_SIGNATURE_BYTES-byte blob in host memory (the same bytes on
 * every platform; the key smoothing vector enters as a 64-bit hash of its
 * bits) that the sending engine hands to the receiving one once per
 * connection; kvp_cache_check_signature refuses a peer's blob of
 * another format with KVP_ERR_INVALID_ARGUMENT naming the first field that
 * differs and both values, and kvp_pack_args.signature runs the same check
 * at the start of a pack or unpack. The buffer carries no header: reading
 * one from device memory would cost the host a synchronization.
 *
 * Both calls launch on `stream` (a cudaStream_t; NULL = the default stream)
 * without allocating or synchronizing: one kernel on the CUDA backend,
 * which a CUDA graph can capture; they run at once on the CPU backend.
 * block_ids and the buffer are in the cache's memory space (for a CUDA
 * cache, device memory of its device or memory it can address: host-mapped,
 * managed, a peer's). The CPU backend refuses block ids out of range, and
 * unpack destinations listed twice, on the host, moving nothing. The CUDA
 * backend cannot read device-side ids before its kernel runs: in checked
 * mode (kvp_cache_config.checked) the kernel skips an id out of range,
 * moves the other blocks and reports it at the next call on the cache, and
 * reports a destination listed twice (that block then holds the bytes of
 * either entry); without checked mode a bad id is undefined behaviour, as
 * in kvp_cache_copy_blocks. Pack sources may repeat (a block shared by two
 * sequences is packed for each). Every other bad argument is refused
 * before anything moves, on both backends. */
typedef struct kvp_pack_args {
  size_t struct_size; /* ABI 1.4 */
  /* int32 [num_blocks] block ids of the cache, in the cache's memory space,
   * in buffer order: the blocks to pack, or the distinct blocks to unpack
   * into. */
  const int32_t* block_ids;
  int32_t num_blocks;  /* >= 0; 0 = a no-op once the rest checks out */
  int32_t first_layer; /* default 0 */
  int32_t num_layers;  /* layers from first_layer; default 0 = to the last */
  int32_t reserved0;   /* must be 0 */
  /* The packed blocks: kvp_cache_pack writes, kvp_cache_unpack reads them.
   * In the cache's memory space, 16-byte aligned, outside the cache's own
   * memory, at least kvp_cache_pack_size(cache, num_blocks, layers) bytes.
   * block_ids and buffer may be NULL when num_blocks is 0. */
  void* buffer;
  uint64_t buffer_bytes;
  /* A peer's format signature (KVP_FORMAT_SIGNATURE_BYTES bytes of host
   * memory) to check first, as kvp_cache_check_signature does; a mismatch
   * fails the call before anything moves. NULL (default): no check. */
  const void* signature;
} kvp_pack_args;
#define KVP_PACK_ARGS_STRUCT_SIZE_1_4 KVP_STRUCT_SIZE(kvp_pack_args, signature)

/* Bytes of a format signature (kvp_cache_format_signature). */
#define KVP_FORMAT_SIGNATURE_BYTES 64

KVP_EXPORT void kvp_pack_args_init(kvp_pack_args* args);
/* Bytes of a buffer holding num_blocks (>= 0) blocks of num_layers layers
 * (1..num_layers of the cache; 0 = every layer). */
KVP_EXPORT kvp_error* kvp_cache_pack_size(const kvp_cache* cache,
                                          int32_t num_blocks,
                                          int32_t num_layers,
                                          uint64_t* bytes);
/* Copies blocks block_ids[i] of layers [first_layer, first_layer +
 * num_layers) into the buffer. The caller orders it after the writes of
 * those blocks (same stream, or an event). */
KVP_EXPORT kvp_error* kvp_cache_pack(const kvp_cache* cache,
                                     const kvp_pack_args* args, void* stream);
/* Copies a buffer packed by a cache of the same format into blocks
 * block_ids[i] of layers [first_layer, first_layer + num_layers). */
KVP_EXPORT kvp_error* kvp_cache_unpack(kvp_cache* cache,
                                       const kvp_pack_args* args,
                                       void* stream);
/* Writes the cache's format signature (KVP_FORMAT_SIGNATURE_BYTES bytes)
 * into `signature` (host memory of signature_bytes >= that). */
KVP_EXPORT kvp_error* kvp_cache_format_signature(const kvp_cache* cache,
                                                 void* signature,
                                                 size_t signature_bytes);
/* Success when the signature_bytes bytes at `signature` (host memory) are
 * the format signature of a cache whose packed blocks this cache can
 * unpack (and the reverse); else KVP_ERR_INVALID_ARGUMENT naming the first
 * field that differs, the peer's value and this cache's. */
KVP_EXPORT kvp_error* kvp_cache_check_signature(const kvp_cache* cache,
                                                const void* signature,
                                                size_t signature_bytes);

/* ------------------------------------------------------------------------ */
/* Function table for dlopen users: resolve kvp_get_api alone.               */
/* ------------------------------------------------------------------------ */

/* Append-only: fields are never removed or reordered within an ABI major. */
typedef struct kvp_api {
  size_t struct_size; /* sizeof the table the library was built with */
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* (*version_string)(void);
  void (*abi_version)(uint32_t*, uint32_t*);
  const char* (*build_info)(void);
  int32_t (*error_code)(const kvp_error*);
  const char* (*error_message)(const kvp_error*);
  void (*error_free)(kvp_error*);
  const char* (*error_code_name)(int32_t);
  kvp_error* (*device_count)(int32_t, int32_t*);
  void (*allocator_init)(kvp_allocator*);
  void (*cache_config_init)(kvp_cache_config*);
  kvp_error* (*cache_create)(const kvp_cache_config*, kvp_cache**);
  void (*cache_destroy)(kvp_cache*);
  void (*layer_layout_init)(kvp_layer_layout*);
  kvp_error* (*cache_get_layout)(const kvp_cache*, int32_t, kvp_layer_layout*);
  void (*cache_info_init)(kvp_cache_info*);
  kvp_error* (*cache_get_info)(const kvp_cache*, kvp_cache_info*);
  kvp_error* (*seq_create)(kvp_cache*, int64_t*);
  kvp_error* (*seq_fork)(kvp_cache*, int64_t, int64_t*);
  kvp_error* (*seq_append)(kvp_cache*, int64_t, int32_t, int64_t*, void*);
  kvp_error* (*seq_truncate)(kvp_cache*, int64_t, int32_t);
  kvp_error* (*seq_free)(kvp_cache*, int64_t);
  kvp_error* (*seq_length)(const kvp_cache*, int64_t, int32_t*);
  kvp_error* (*cache_num_free_blocks)(const kvp_cache*, int32_t*);
  kvp_error* (*cache_export_block_table)(const kvp_cache*, const int64_t*,
                                         int32_t, int32_t, int64_t, int32_t*,
                                         int32_t*);
  void (*write_args_init)(kvp_write_args*);
  kvp_error* (*cache_write)(kvp_cache*, const kvp_write_args*, void*);
  void (*write_stats_init)(kvp_write_stats*);
  kvp_error* (*cache_get_write_stats)(const kvp_cache*, kvp_write_stats*);
  kvp_error* (*cache_reset_write_stats)(kvp_cache*);
  kvp_error* (*cache_copy_blocks)(kvp_cache*, const int32_t*, int32_t, void*);
  kvp_error* (*cache_transfer_blocks)(kvp_cache*, const kvp_cache*,
                                      const int32_t*, int32_t, void*);
  void (*decode_config_init)(kvp_decode_config*);
  kvp_error* (*decode_workspace_size)(const kvp_cache*,
                                      const kvp_decode_config*, uint64_t*);
  kvp_error* (*decoder_create)(const kvp_cache*, const kvp_decode_config*,
                               kvp_decoder**);
  void (*decoder_destroy)(kvp_decoder*);
  void (*decode_args_init)(kvp_decode_args*);
  kvp_error* (*decode)(kvp_decoder*, const kvp_decode_args*, void*);
  void (*attend_args_init)(kvp_attend_args*);                      /* ABI 1.3 */
  kvp_error* (*attend)(kvp_decoder*, const kvp_attend_args*, void*); /* ABI 1.3 */
  void (*pack_args_init)(kvp_pack_args*);                          /* ABI 1.4 */
  kvp_error* (*cache_pack_size)(const kvp_cache*, int32_t, int32_t,
                                uint64_t*);                        /* ABI 1.4 */
  kvp_error* (*cache_pack)(const kvp_cache*, const kvp_pack_args*,
                           void*);                                 /* ABI 1.4 */
  kvp_error* (*cache_unpack)(kvp_cache*, const kvp_pack_args*, void*); /* ABI 1.4 */
  kvp_error* (*cache_format_signature)(const kvp_cache*, void*,
                                       size_t);                    /* ABI 1.4 */
  kvp_error* (*cache_check_signature)(const kvp_cache*, const void*,
                                      size_t);                     /* ABI 1.4 */
} kvp_api;
#define KVP_API_STRUCT_SIZE_1_0 KVP_STRUCT_SIZE(kvp_api, decode)
#define KVP_API_STRUCT_SIZE_1_3 KVP_STRUCT_SIZE(kvp_api, attend)
#define KVP_API_STRUCT_SIZE_1_4 KVP_STRUCT_SIZE(kvp_api, cache_check_signature)

/* The function table of ABI major `abi_major`, or NULL if this library does
 * not provide it. Check table->abi_minor (or struct_size) before using
 * entries appended in later minors. */
KVP_EXPORT const kvp_api* kvp_get_api(uint32_t abi_major);

typedef const kvp_api* (*kvp_get_api_fn)(uint32_t abi_major);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* clang-format on */

#endif /* KVPAGE_KVPAGE_H_ */
