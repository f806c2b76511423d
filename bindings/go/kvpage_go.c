/* SPDX-License-Identifier: Apache-2.0 */
#include "kvpage_go.h"

#include <string.h>

kvp_error* kvpgo_cache_create(int32_t device_kind, int32_t device_ordinal, int32_t num_layers,
                              int32_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                              int32_t head_size, int32_t k_dtype, int32_t v_dtype,
                              const float* key_smoothing, int32_t checked, kvp_cache** cache) {
  kvp_cache_config c;
  kvp_cache_config_init(&c);
  c.device_kind = device_kind;
  c.device_ordinal = device_ordinal;
  c.num_layers = num_layers;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.num_kv_heads = num_kv_heads;
  c.head_size = head_size;
  c.k_dtype = k_dtype;
  c.v_dtype = v_dtype;
  c.key_smoothing = key_smoothing;
  c.checked = checked;
  return kvp_cache_create(&c, cache);
}

kvp_error* kvpgo_seq_append(kvp_cache* cache, int64_t seq_id, int32_t num_tokens, int64_t* slots,
                            uintptr_t stream) {
  return kvp_seq_append(cache, seq_id, num_tokens, slots, (void*)stream);
}

kvp_error* kvpgo_write(kvp_cache* cache, int32_t layer, int32_t num_tokens, int32_t input_dtype,
                       const void* key, const void* value, int64_t key_token_stride,
                       int64_t value_token_stride, const int64_t* slot_mapping, uintptr_t stream) {
  kvp_write_args a;
  kvp_write_args_init(&a);
  a.layer = layer;
  a.num_tokens = num_tokens;
  a.input_dtype = input_dtype;
  a.key = key;
  a.value = value;
  a.key_token_stride = key_token_stride;
  a.value_token_stride = value_token_stride;
  a.slot_mapping = slot_mapping;
  return kvp_cache_write(cache, &a, (void*)stream);
}

kvp_error* kvpgo_write_raw(kvp_cache* cache, int32_t layer, int32_t num_tokens, int32_t input_dtype,
                           uintptr_t key, uintptr_t value, int64_t key_token_stride,
                           int64_t value_token_stride, uintptr_t slot_mapping, uintptr_t stream) {
  return kvpgo_write(cache, layer, num_tokens, input_dtype, (const void*)key, (const void*)value,
                     key_token_stride, value_token_stride, (const int64_t*)slot_mapping, stream);
}

kvp_error* kvpgo_copy_blocks(kvp_cache* cache, const int32_t* pairs, int32_t num_pairs,
                             uintptr_t stream) {
  return kvp_cache_copy_blocks(cache, pairs, num_pairs, (void*)stream);
}

kvp_error* kvpgo_copy_blocks_raw(kvp_cache* cache, uintptr_t pairs, int32_t num_pairs,
                                 uintptr_t stream) {
  return kvp_cache_copy_blocks(cache, (const int32_t*)pairs, num_pairs, (void*)stream);
}

kvp_error* kvpgo_transfer_blocks(kvp_cache* dst, const kvp_cache* src, const int32_t* pairs,
                                 int32_t num_pairs, uintptr_t stream) {
  return kvp_cache_transfer_blocks(dst, src, pairs, num_pairs, (void*)stream);
}

void kvpgo_decode_config(kvp_decode_config* c, int32_t num_query_heads, int32_t max_num_seqs,
                         int32_t max_context_len, int32_t max_query_len, int32_t q_dtype,
                         int32_t out_dtype, uintptr_t workspace, uint64_t workspace_bytes,
                         int32_t precise, int32_t max_query_tokens) {
  kvp_decode_config_init(c);
  c->num_query_heads = num_query_heads;
  c->max_num_seqs = max_num_seqs;
  c->max_context_len = max_context_len;
  c->max_query_len = max_query_len;
  c->q_dtype = q_dtype;
  c->out_dtype = out_dtype;
  c->workspace = (void*)workspace;
  c->workspace_bytes = workspace_bytes;
  c->precise = precise;
  c->max_query_tokens = max_query_tokens;
}

kvp_error* kvpgo_attention(kvp_decoder* decoder, int32_t attend, int32_t query_len,
                           const int32_t* query_starts, int32_t layer, int32_t num_seqs,
                           int32_t sliding_window, float sm_scale, float logits_soft_cap,
                           const void* q, int64_t q_token_stride, const int32_t* block_table,
                           int64_t block_table_stride, int32_t block_table_width,
                           const int32_t* seq_lens, const float* alibi_slopes, void* out,
                           int64_t out_token_stride, float* lse, uintptr_t stream) {
  kvp_decode_args d;
  kvp_decode_args_init(&d);
  d.layer = layer;
  d.num_seqs = num_seqs;
  d.query_len = query_len;
  d.sliding_window = sliding_window;
  d.sm_scale = sm_scale;
  d.logits_soft_cap = logits_soft_cap;
  d.q = q;
  d.q_token_stride = q_token_stride;
  d.block_table = block_table;
  d.block_table_stride = block_table_stride;
  d.block_table_width = block_table_width;
  d.seq_lens = seq_lens;
  d.alibi_slopes = alibi_slopes;
  d.out = out;
  d.out_token_stride = out_token_stride;
  d.lse = lse;
  if (!attend) return kvp_decode(decoder, &d, (void*)stream);
  /* kvp_attend_args: query_starts for query_len, the rest as d has it. */
  kvp_attend_args a;
  kvp_attend_args_init(&a);
  a.query_starts = query_starts;
  a.layer = d.layer;
  a.num_seqs = d.num_seqs;
  a.sliding_window = d.sliding_window;
  a.sm_scale = d.sm_scale;
  a.logits_soft_cap = d.logits_soft_cap;
  a.q = d.q;
  a.q_token_stride = d.q_token_stride;
  a.block_table = d.block_table;
  a.block_table_stride = d.block_table_stride;
  a.block_table_width = d.block_table_width;
  a.seq_lens = d.seq_lens;
  a.alibi_slopes = d.alibi_slopes;
  a.out = d.out;
  a.out_token_stride = d.out_token_stride;
  a.lse = d.lse;
  return kvp_attend(decoder, &a, (void*)stream);
}

kvp_error* kvpgo_attention_raw(kvp_decoder* decoder, int32_t attend, int32_t query_len,
                               uintptr_t query_starts, int32_t layer, int32_t num_seqs,
                               int32_t sliding_window, float sm_scale, float logits_soft_cap,
                               uintptr_t q, int64_t q_token_stride, uintptr_t block_table,
                               int64_t block_table_stride, int32_t block_table_width,
                               uintptr_t seq_lens, uintptr_t alibi_slopes, uintptr_t out,
                               int64_t out_token_stride, uintptr_t lse, uintptr_t stream) {
  return kvpgo_attention(decoder, attend, query_len, (const int32_t*)query_starts, layer, num_seqs,
                         sliding_window, sm_scale, logits_soft_cap, (const void*)q, q_token_stride,
                         (const int32_t*)block_table, block_table_stride, block_table_width,
                         (const int32_t*)seq_lens, (const float*)alibi_slopes, (void*)out,
                         out_token_stride, (float*)lse, stream);
}

kvp_error* kvpgo_pack(kvp_cache* cache, int32_t unpack, const int32_t* block_ids,
                      int32_t num_blocks, int32_t first_layer, int32_t num_layers, void* buffer,
                      uint64_t buffer_bytes, const void* signature, uintptr_t stream) {
  kvp_pack_args a;
  kvp_pack_args_init(&a);
  a.block_ids = block_ids;
  a.num_blocks = num_blocks;
  a.first_layer = first_layer;
  a.num_layers = num_layers;
  a.buffer = buffer;
  a.buffer_bytes = buffer_bytes;
  a.signature = signature;
  if (unpack) return kvp_cache_unpack(cache, &a, (void*)stream);
  return kvp_cache_pack(cache, &a, (void*)stream);
}

kvp_error* kvpgo_pack_raw(kvp_cache* cache, int32_t unpack, uintptr_t block_ids, int32_t num_blocks,
                          int32_t first_layer, int32_t num_layers, uintptr_t buffer,
                          uint64_t buffer_bytes, const void* signature, uintptr_t stream) {
  return kvpgo_pack(cache, unpack, (const int32_t*)block_ids, num_blocks, first_layer, num_layers,
                    (void*)buffer, buffer_bytes, signature, stream);
}

void kvpgo_read_host(void* dst, uintptr_t src, size_t n) { memcpy(dst, (const void*)src, n); }
