// SPDX-License-Identifier: Apache-2.0
/* C helpers of the Go binding. cgo forbids passing Go memory that holds Go
 * pointers, so the argument structs that point to Go slices
 * (kvp_cache_config, kvp_write_args, kvp_decode_config, kvp_decode_args,
 * kvp_attend_args, kvp_pack_args) are
 * filled here, on the C side, from plain arguments. Device pointers and
 * streams arrive as uintptr_t. Only the public header is used. */
#ifndef KVPAGE_GO_H_
#define KVPAGE_GO_H_

#include <kvpage/kvpage.h>
#include <stdint.h>
#include <stdlib.h>

kvp_error* kvpgo_cache_create(int32_t device_kind, int32_t device_ordinal, int32_t num_layers,
                              int32_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                              int32_t head_size, int32_t k_dtype, int32_t v_dtype,
                              const float* key_smoothing, int32_t checked, kvp_cache** cache);

kvp_error* kvpgo_seq_append(kvp_cache* cache, int64_t seq_id, int32_t num_tokens, int64_t* slots,
                            uintptr_t stream);

kvp_error* kvpgo_write(kvp_cache* cache, int32_t layer, int32_t num_tokens, int32_t input_dtype,
                       const void* key, const void* value, int64_t key_token_stride,
                       int64_t value_token_stride, const int64_t* slot_mapping, uintptr_t stream);

kvp_error* kvpgo_write_raw(kvp_cache* cache, int32_t layer, int32_t num_tokens, int32_t input_dtype,
                           uintptr_t key, uintptr_t value, int64_t key_token_stride,
                           int64_t value_token_stride, uintptr_t slot_mapping, uintptr_t stream);

kvp_error* kvpgo_copy_blocks(kvp_cache* cache, const int32_t* pairs, int32_t num_pairs,
                             uintptr_t stream);

kvp_error* kvpgo_copy_blocks_raw(kvp_cache* cache, uintptr_t pairs, int32_t num_pairs,
                                 uintptr_t stream);

kvp_error* kvpgo_transfer_blocks(kvp_cache* dst, const kvp_cache* src, const int32_t* pairs,
                                 int32_t num_pairs, uintptr_t stream);

/* Fills a kvp_decode_config (workspace given as uintptr_t). */
void kvpgo_decode_config(kvp_decode_config* c, int32_t num_query_heads, int32_t max_num_seqs,
                         int32_t max_context_len, int32_t max_query_len, int32_t q_dtype,
                         int32_t out_dtype, uintptr_t workspace, uint64_t workspace_bytes,
                         int32_t precise, int32_t max_query_tokens);

/* Runs kvp_attend (with query_starts) where attend is nonzero, else kvp_decode
 * (with query_len); the other arguments are the fields the two share. */
kvp_error* kvpgo_attention(kvp_decoder* decoder, int32_t attend, int32_t query_len,
                           const int32_t* query_starts, int32_t layer, int32_t num_seqs,
                           int32_t sliding_window, float sm_scale, float logits_soft_cap,
                           const void* q, int64_t q_token_stride, const int32_t* block_table,
                           int64_t block_table_stride, int32_t block_table_width,
                           const int32_t* seq_lens, const float* alibi_slopes, void* out,
                           int64_t out_token_stride, float* lse, uintptr_t stream);

/* kvpgo_attention with addresses in the cache's memory space. */
kvp_error* kvpgo_attention_raw(kvp_decoder* decoder, int32_t attend, int32_t query_len,
                               uintptr_t query_starts, int32_t layer, int32_t num_seqs,
                               int32_t sliding_window, float sm_scale, float logits_soft_cap,
                               uintptr_t q, int64_t q_token_stride, uintptr_t block_table,
                               int64_t block_table_stride, int32_t block_table_width,
                               uintptr_t seq_lens, uintptr_t alibi_slopes, uintptr_t out,
                               int64_t out_token_stride, uintptr_t lse, uintptr_t stream);

/* Runs kvp_cache_unpack where unpack is nonzero, else kvp_cache_pack, over
 * the kvp_pack_args these fields make (signature: host memory or NULL). */
kvp_error* kvpgo_pack(kvp_cache* cache, int32_t unpack, const int32_t* block_ids,
                      int32_t num_blocks, int32_t first_layer, int32_t num_layers, void* buffer,
                      uint64_t buffer_bytes, const void* signature, uintptr_t stream);

/* kvpgo_pack with addresses in the cache's memory space. */
kvp_error* kvpgo_pack_raw(kvp_cache* cache, int32_t unpack, uintptr_t block_ids, int32_t num_blocks,
                          int32_t first_layer, int32_t num_layers, uintptr_t buffer,
                          uint64_t buffer_bytes, const void* signature, uintptr_t stream);

/* Copies n bytes of host memory at address src (e.g. a CPU cache's layout
 * pointer) into dst. */
void kvpgo_read_host(void* dst, uintptr_t src, size_t n);

#endif /* KVPAGE_GO_H_ */
