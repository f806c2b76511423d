// SPDX-License-Identifier: Apache-2.0
// The C ABI: argument checks, error objects, the exception firewall and the
// function table. Every entry is wrapped in KVP_API_BEGIN / KVP_API_END so
// that no C++ exception crosses the boundary.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "capi/abi_checks.h"
#include "capi/struct_io.h"
#include "include/kvpage/kvpage.h"
#include "kvpage_manifest.h"
#include "src/cache.h"
#include "src/decoder.h"
#include "src/status.h"

#ifndef KVPAGE_CUDA_ARCHITECTURES
#define KVPAGE_CUDA_ARCHITECTURES "none"
#endif

struct kvp_error {
  int32_t code;
  std::string message;
};

struct kvp_cache {
  std::unique_ptr<kvpage::Cache> impl;
};

struct kvp_decoder {
  std::unique_ptr<kvpage::Decoder> impl;
};

namespace {

using kvpage::DType;
using kvpage::ErrorCode;

// Returned when not even an error object can be allocated; never freed.
kvp_error g_out_of_memory{KVP_ERR_OUT_OF_MEMORY, "out of host memory"};

kvp_error* NewError(int32_t code, std::string message) noexcept {
  try {
    return new kvp_error{code, std::move(message)};
  } catch (...) {
    return &g_out_of_memory;
  }
}

kvp_error* ToError(const absl::Status& status) noexcept {
  if (status.ok()) return nullptr;
  try {
    return NewError(static_cast<int32_t>(kvpage::CodeOf(status)), std::string(status.message()));
  } catch (...) {
    return &g_out_of_memory;
  }
}

kvp_error* InvalidArg(std::string message) {
  return NewError(KVP_ERR_INVALID_ARGUMENT, std::move(message));
}

// "<name> is NULL" for the first null pointer among the arguments.
#define KVP_CHECK_NOT_NULL(ptr)                               \
  do {                                                        \
    if ((ptr) == nullptr) return InvalidArg(#ptr " is NULL"); \
  } while (0)

}  // namespace

// The exception firewall around every entry that returns kvp_error*.
#define KVP_API_BEGIN try {
#define KVP_API_END                                                                \
  }                                                                                \
  catch (const std::bad_alloc&) {                                                  \
    return &g_out_of_memory;                                                       \
  }                                                                                \
  catch (const std::exception& e) {                                                \
    return NewError(KVP_ERR_INTERNAL, std::string("internal error: ") + e.what()); \
  }                                                                                \
  catch (...) {                                                                    \
    return NewError(KVP_ERR_INTERNAL, "internal error: unknown exception");        \
  }

// ---- Versions and build --------------------------------------------------

extern "C" {

const char* kvp_version_string(void) { return KVP_VERSION_STRING; }

void kvp_abi_version(uint32_t* major, uint32_t* minor) {
  if (major != nullptr) *major = KVP_ABI_MAJOR;
  if (minor != nullptr) *minor = KVP_ABI_MINOR;
}

// The ABI part of kvp_build_info comes from the header's macros, so that it
// cannot disagree with kvp_abi_version() and kvp_get_api(); the KV dtypes
// and head sizes come from the kernel manifest (kernels/manifest.cmake).
#define KVPAGE_STRINGIZE_(x) #x
#define KVPAGE_STRINGIZE(x) KVPAGE_STRINGIZE_(x)

const char* kvp_build_info(void) {
  return "version=" KVP_VERSION_STRING
         "; abi=" KVPAGE_STRINGIZE(KVP_ABI_MAJOR) "." KVPAGE_STRINGIZE(KVP_ABI_MINOR)
         "; backends=cpu"
#if KVPAGE_HAVE_CUDA
         ",cuda"
#endif
         "; cuda_architectures=" KVPAGE_CUDA_ARCHITECTURES
         "; kv_dtypes=" KVPAGE_MANIFEST_KV_DTYPE_NAMES
         "; scale_dtype=fp16"
         "; head_sizes=" KVPAGE_MANIFEST_HEAD_SIZE_NAMES
         "; block_sizes=8,16,32"
         "; tensor_core_block_sizes=" KVPAGE_MANIFEST_TC_BLOCK_SIZE_NAMES
         "; io_dtypes=fp32,fp16,bf16";
}

// ---- Errors ----------------------------------------------------------------

int32_t kvp_error_code(const kvp_error* error) { return error ? error->code : KVP_OK; }

const char* kvp_error_message(const kvp_error* error) {
  return error ? error->message.c_str() : "";
}

void kvp_error_free(kvp_error* error) {
  if (error != &g_out_of_memory) delete error;
}

const char* kvp_error_code_name(int32_t code) {
  switch (code) {
    case KVP_OK:
      return "OK";
    case KVP_ERR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case KVP_ERR_OUT_OF_BLOCKS:
      return "OUT_OF_BLOCKS";
    case KVP_ERR_OUT_OF_MEMORY:
      return "OUT_OF_MEMORY";
    case KVP_ERR_UNSUPPORTED:
      return "UNSUPPORTED";
    case KVP_ERR_DEVICE:
      return "DEVICE";
    case KVP_ERR_INTERNAL:
      return "INTERNAL";
    default:
      return "UNKNOWN";
  }
}

kvp_error* kvp_device_count(int32_t device_kind, int32_t* count) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(count);
  if (device_kind == KVP_DEVICE_CPU) {
    *count = 1;
  } else if (device_kind == KVP_DEVICE_CUDA) {
    *count = kvpage::CudaDeviceCount();
  } else {
    return InvalidArg(kvpage::StrFormat(
        "device_kind = %d, must be KVP_DEVICE_CPU (0) or KVP_DEVICE_CUDA (1)", device_kind));
  }
  return nullptr;
  KVP_API_END
}

// ---- Struct defaults ---------------------------------------------------------

void kvp_allocator_init(kvp_allocator* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
}

void kvp_cache_config_init(kvp_cache_config* c) {
  if (c == nullptr) return;
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->device_kind = KVP_DEVICE_CPU;
  c->num_layers = 1;
  c->block_size = 16;
  c->head_size = 128;
  c->k_dtype = KVP_DTYPE_BF16;
  c->v_dtype = KVP_DTYPE_BF16;
}

void kvp_layer_layout_init(kvp_layer_layout* l) {
  if (l == nullptr) return;
  std::memset(l, 0, sizeof(*l));
  l->struct_size = sizeof(*l);
}

void kvp_cache_info_init(kvp_cache_info* i) {
  if (i == nullptr) return;
  std::memset(i, 0, sizeof(*i));
  i->struct_size = sizeof(*i);
}

void kvp_write_args_init(kvp_write_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->input_dtype = KVP_DTYPE_BF16;
}

void kvp_write_stats_init(kvp_write_stats* s) {
  if (s == nullptr) return;
  std::memset(s, 0, sizeof(*s));
  s->struct_size = sizeof(*s);
}

void kvp_decode_config_init(kvp_decode_config* c) {
  if (c == nullptr) return;
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->max_query_len = 1;
  c->q_dtype = KVP_DTYPE_BF16;
  c->out_dtype = KVP_DTYPE_BF16;
}

void kvp_decode_args_init(kvp_decode_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->query_len = 1;
}

void kvp_attend_args_init(kvp_attend_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
}

void kvp_pack_args_init(kvp_pack_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
}

}  // extern "C"

// ---- Cache -------------------------------------------------------------------

namespace {

// Reads a caller's struct over its defaults (see capi/struct_io.h).
template <typename T>
kvp_error* ReadIn(const T* user, const char* name, void (*init)(T*), T* out) {
  init(out);
  const size_t min_size = kvpage::capi::FirstReleasedSize<T>();
  if (user->struct_size < min_size) {
    return InvalidArg(kvpage::StrFormat(
        "%s->struct_size = %d, must be at least %d (call the matching kvp_*_init first)", name,
        user->struct_size, min_size));
  }
  kvpage::capi::CopyPrefix(user, out);
  out->struct_size = sizeof(T);
  return nullptr;
}

template <typename T>
kvp_error* CheckOut(const T* user, const char* name) {
  const size_t min_size = kvpage::capi::FirstReleasedSize<T>();
  if (user->struct_size < min_size) {
    return InvalidArg(kvpage::StrFormat(
        "%s->struct_size = %d, must be at least %d (call the matching kvp_*_init first)", name,
        user->struct_size, min_size));
  }
  return nullptr;
}

}  // namespace

extern "C" {

kvp_error* kvp_cache_create(const kvp_cache_config* config, kvp_cache** cache) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(config);
  KVP_CHECK_NOT_NULL(cache);
  kvp_cache_config c;
  if (kvp_error* e = ReadIn(config, "config", kvp_cache_config_init, &c)) return e;
  if (c.device_kind != KVP_DEVICE_CPU && c.device_kind != KVP_DEVICE_CUDA) {
    return InvalidArg(kvpage::StrFormat(
        "config->device_kind = %d, must be KVP_DEVICE_CPU (0) or KVP_DEVICE_CUDA (1)",
        c.device_kind));
  }
  if (c.device_ordinal < 0) {
    return InvalidArg(
        kvpage::StrFormat("config->device_ordinal = %d, must be >= 0", c.device_ordinal));
  }
  // There is one CPU device: a nonzero ordinal with KVP_DEVICE_CPU is most
  // likely a CUDA cache whose device_kind was left at its default, which
  // would then be handed device pointers (docs/DECISIONS.md).
  if (c.device_kind == KVP_DEVICE_CPU && c.device_ordinal != 0) {
    return InvalidArg(kvpage::StrFormat(
        "config->device_ordinal = %d with device_kind = KVP_DEVICE_CPU (0), must be 0 (set "
        "device_kind = KVP_DEVICE_CUDA (1) for a GPU cache)",
        c.device_ordinal));
  }
  if (c.reserved0 != 0) {
    return InvalidArg(kvpage::StrFormat("config->reserved0 = %d, must be 0", c.reserved0));
  }
  if (c.checked != 0 && c.checked != 1) {
    return InvalidArg(kvpage::StrFormat("config->checked = %d, must be 0 or 1", c.checked));
  }
  kvpage::CacheOptions o;
  o.checked = c.checked != 0;
  o.device_kind = static_cast<kvpage::DeviceKind>(c.device_kind);
  o.device_ordinal = c.device_ordinal;
  o.geometry.num_layers = c.num_layers;
  o.geometry.num_blocks = c.num_blocks;
  o.geometry.block_size = c.block_size;
  o.geometry.num_kv_heads = c.num_kv_heads;
  o.geometry.head_size = c.head_size;
  o.geometry.k_dtype = static_cast<DType>(c.k_dtype);
  o.geometry.v_dtype = static_cast<DType>(c.v_dtype);
  if (kvp_error* e = ToError(kvpage::ValidateGeometry(o.geometry))) return e;
  if (c.key_smoothing != nullptr) {
    o.key_smoothing.assign(c.key_smoothing,
                           c.key_smoothing + static_cast<size_t>(c.num_kv_heads) * c.head_size);
  }
  if (c.allocator != nullptr) {
    kvp_allocator a;
    if (kvp_error* e = ReadIn(c.allocator, "config->allocator", kvp_allocator_init, &a)) {
      return e;
    }
    if ((a.alloc == nullptr) != (a.free == nullptr)) {
      return InvalidArg(
          kvpage::StrFormat("config->allocator->%s is NULL: set both alloc and free, or neither",
                            a.alloc == nullptr ? "alloc" : "free"));
    }
    o.allocator.user_data = a.user_data;
    o.allocator.alloc = a.alloc;
    o.allocator.free = a.free;
  }
  auto created = kvpage::Cache::Create(std::move(o));
  if (!created.ok()) return ToError(created.status());
  *cache = new kvp_cache{std::move(created).value()};
  return nullptr;
  KVP_API_END
}

void kvp_cache_destroy(kvp_cache* cache) {
  try {
    delete cache;
  } catch (...) {
    // Destruction frees memory only; nothing to report through a void API.
  }
}

kvp_error* kvp_cache_get_layout(const kvp_cache* cache, int32_t layer, kvp_layer_layout* layout) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(layout);
  if (kvp_error* e = CheckOut(layout, "layout")) return e;
  const kvpage::CacheGeometry& g = cache->impl->geometry();
  if (layer < 0 || layer >= g.num_layers) {
    return InvalidArg(kvpage::StrFormat("layer = %d is out of range [0, %d)", layer, g.num_layers));
  }
  kvp_layer_layout l;
  kvp_layer_layout_init(&l);
  uint8_t* base = cache->impl->layer(layer);
  l.k_data = base + g.k_data_offset();
  l.v_data = base + g.v_data_offset();
  l.k_scales = g.k_scale_entry_bytes() ? base + g.k_scale_offset() : nullptr;
  l.v_scales = g.v_scale_entry_bytes() ? base + g.v_scale_offset() : nullptr;
  l.k_block_stride = g.k_block_stride();
  l.k_head_stride = g.k_head_stride();
  l.k_chunk_stride = g.k_chunk_stride();
  l.k_x = g.k_x();
  l.k_chunks = g.k_chunks();
  l.v_block_stride = g.v_block_stride();
  l.v_head_stride = g.v_head_stride();
  l.v_channel_stride = g.v_channel_stride();
  l.k_bits = g.k_bits();
  l.v_bits = g.v_bits();
  l.k_scale_block_stride = g.k_scale_block_stride();
  l.k_scale_head_stride = g.k_scale_head_stride();
  l.v_scale_block_stride = g.v_scale_block_stride();
  l.v_scale_head_stride = g.v_scale_head_stride();
  l.k_scale_entry_bytes = g.k_scale_entry_bytes();
  l.v_scale_entry_bytes = g.v_scale_entry_bytes();
  l.k_data_bytes = g.k_data_bytes();
  l.v_data_bytes = g.v_data_bytes();
  l.k_scale_bytes = g.k_scale_bytes();
  l.v_scale_bytes = g.v_scale_bytes();
  kvpage::capi::CopyOut(l, layout);
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_get_info(const kvp_cache* cache, kvp_cache_info* info) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(info);
  if (kvp_error* e = CheckOut(info, "info")) return e;
  const kvpage::Cache& c = *cache->impl;
  const kvpage::CacheGeometry& g = c.geometry();
  kvp_cache_info i;
  kvp_cache_info_init(&i);
  i.device_kind = static_cast<int32_t>(c.device_kind());
  i.device_ordinal = c.device_ordinal();
  i.num_layers = g.num_layers;
  i.num_blocks = g.num_blocks;
  i.block_size = g.block_size;
  i.num_kv_heads = g.num_kv_heads;
  i.head_size = g.head_size;
  i.k_dtype = static_cast<int32_t>(g.k_dtype);
  i.v_dtype = static_cast<int32_t>(g.v_dtype);
  i.has_key_smoothing = c.has_key_smoothing() ? 1 : 0;
  i.bytes_per_token_per_layer = g.bytes_per_token_per_layer();
  i.total_bytes = c.total_bytes();
  kvpage::capi::CopyOut(i, info);
  return nullptr;
  KVP_API_END
}

// ---- Sequences -----------------------------------------------------------------

kvp_error* kvp_seq_create(kvp_cache* cache, int64_t* seq_id) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(seq_id);
  auto id = cache->impl->blocks().CreateSequence();
  if (!id.ok()) return ToError(id.status());
  *seq_id = *id;
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_seq_fork(kvp_cache* cache, int64_t parent, int64_t* child) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(child);
  auto id = cache->impl->blocks().Fork(parent);
  if (!id.ok()) return ToError(id.status());
  *child = *id;
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_seq_append(kvp_cache* cache, int64_t seq_id, int32_t num_tokens, int64_t* slots,
                          void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  auto new_slots = cache->impl->Append(seq_id, num_tokens, stream);
  if (!new_slots.ok()) return ToError(new_slots.status());
  if (slots != nullptr && !new_slots->empty()) {
    std::memcpy(slots, new_slots->data(), new_slots->size() * sizeof(int64_t));
  }
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_seq_truncate(kvp_cache* cache, int64_t seq_id, int32_t length) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  return ToError(cache->impl->blocks().Truncate(seq_id, length));
  KVP_API_END
}

kvp_error* kvp_seq_free(kvp_cache* cache, int64_t seq_id) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  return ToError(cache->impl->blocks().Free(seq_id));
  KVP_API_END
}

kvp_error* kvp_seq_length(const kvp_cache* cache, int64_t seq_id, int32_t* length) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(length);
  auto len = cache->impl->blocks().Length(seq_id);
  if (!len.ok()) return ToError(len.status());
  *length = *len;
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_num_free_blocks(const kvp_cache* cache, int32_t* num_free) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(num_free);
  *num_free = cache->impl->blocks().NumFreeBlocks();
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_export_block_table(const kvp_cache* cache, const int64_t* seq_ids,
                                        int32_t num_seqs, int32_t max_blocks_per_seq,
                                        int64_t row_stride, int32_t* table, int32_t* seq_lens) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  if (num_seqs < 0) {
    return InvalidArg(kvpage::StrFormat("num_seqs = %d, must be >= 0", num_seqs));
  }
  if (num_seqs > 0) {
    KVP_CHECK_NOT_NULL(seq_ids);
    KVP_CHECK_NOT_NULL(table);
  }
  if (max_blocks_per_seq < 1) {
    return InvalidArg(
        kvpage::StrFormat("max_blocks_per_seq = %d, must be >= 1", max_blocks_per_seq));
  }
  if (row_stride < max_blocks_per_seq) {
    return InvalidArg(kvpage::StrFormat("row_stride = %d, must be >= max_blocks_per_seq = %d",
                                        row_stride, max_blocks_per_seq));
  }
  return ToError(cache->impl->blocks().ExportBlockTable(
      absl::MakeConstSpan(seq_ids, static_cast<size_t>(num_seqs)), max_blocks_per_seq, row_stride,
      table, seq_lens));
  KVP_API_END
}

// ---- Write -----------------------------------------------------------------------

kvp_error* kvp_cache_write(kvp_cache* cache, const kvp_write_args* args, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(args);
  kvp_write_args a;
  if (kvp_error* e = ReadIn(args, "args", kvp_write_args_init, &a)) return e;
  if (a.reserved0 != 0) {
    return InvalidArg(kvpage::StrFormat("args->reserved0 = %d, must be 0", a.reserved0));
  }
  kvpage::WriteRequest r;
  r.layer = a.layer;
  r.num_tokens = a.num_tokens;
  r.input_dtype = static_cast<DType>(a.input_dtype);
  r.key = a.key;
  r.value = a.value;
  r.key_stride = a.key_token_stride;
  r.value_stride = a.value_token_stride;
  r.slot_mapping = a.slot_mapping;
  return ToError(cache->impl->Write(r, stream));
  KVP_API_END
}

kvp_error* kvp_cache_get_write_stats(const kvp_cache* cache, kvp_write_stats* stats) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(stats);
  if (kvp_error* e = CheckOut(stats, "stats")) return e;
  auto counters = cache->impl->ReadCounters();
  if (!counters.ok()) return ToError(counters.status());
  kvp_write_stats s;
  kvp_write_stats_init(&s);
  s.non_finite = counters->non_finite;
  s.saturated = counters->saturated;
  kvpage::capi::CopyOut(s, stats);
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_reset_write_stats(kvp_cache* cache) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  return ToError(cache->impl->ResetCounters());
  KVP_API_END
}

// ---- Block copies -------------------------------------------------------------------

kvp_error* kvp_cache_copy_blocks(kvp_cache* cache, const int32_t* pairs, int32_t num_pairs,
                                 void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  return ToError(cache->impl->CopyBlocks(pairs, num_pairs, stream));
  KVP_API_END
}

kvp_error* kvp_cache_transfer_blocks(kvp_cache* dst, const kvp_cache* src, const int32_t* pairs,
                                     int32_t num_pairs, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(dst);
  KVP_CHECK_NOT_NULL(src);
  return ToError(dst->impl->TransferBlocksFrom(*src->impl, pairs, num_pairs, stream));
  KVP_API_END
}

// ---- Decode ----------------------------------------------------------------------------

}  // extern "C"

namespace {

kvp_error* ToDecoderOptions(const kvp_decode_config* config, kvpage::DecoderOptions* o) {
  kvp_decode_config c;
  if (kvp_error* e = ReadIn(config, "config", kvp_decode_config_init, &c)) return e;
  o->capacity.num_q_heads = c.num_query_heads;
  o->capacity.max_num_seqs = c.max_num_seqs;
  o->capacity.max_context_len = c.max_context_len;
  o->capacity.max_query_len = c.max_query_len;
  o->q_dtype = static_cast<DType>(c.q_dtype);
  o->out_dtype = static_cast<DType>(c.out_dtype);
  o->workspace = c.workspace;
  o->workspace_bytes = c.workspace_bytes;
  if (c.precise != 0 && c.precise != 1) {
    return InvalidArg(kvpage::StrFormat("config->precise = %d, must be 0 or 1", c.precise));
  }
  o->capacity.precise = c.precise != 0;
  // 0: every sequence at max_query_len, within int32 (query_starts are).
  o->capacity.max_query_tokens =
      c.max_query_tokens != 0
          ? c.max_query_tokens
          : static_cast<int32_t>(std::min<int64_t>(
                int64_t{c.max_num_seqs} * std::max(c.max_query_len, 1), INT32_MAX));
  return nullptr;
}

// The fields kvp_decode_args and kvp_attend_args share, as the core's
// request.
template <typename Args>
kvpage::DecodeRequest SharedRequestFields(const Args& a) {
  kvpage::DecodeRequest r;
  r.layer = a.layer;
  r.num_seqs = a.num_seqs;
  r.sliding_window = a.sliding_window;
  r.sm_scale = a.sm_scale;
  r.logits_soft_cap = a.logits_soft_cap;
  r.q = a.q;
  r.q_stride = a.q_token_stride;
  r.block_table = a.block_table;
  r.block_table_stride = a.block_table_stride;
  r.block_table_width = a.block_table_width;
  r.seq_lens = a.seq_lens;
  r.alibi_slopes = a.alibi_slopes;
  r.out = a.out;
  r.out_stride = a.out_token_stride;
  r.lse = a.lse;
  return r;
}

}  // namespace

extern "C" {

kvp_error* kvp_decode_workspace_size(const kvp_cache* cache, const kvp_decode_config* config,
                                     uint64_t* bytes) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(config);
  KVP_CHECK_NOT_NULL(bytes);
  kvpage::DecoderOptions o;
  if (kvp_error* e = ToDecoderOptions(config, &o)) return e;
  auto need = kvpage::Decoder::WorkspaceBytes(*cache->impl, o);
  if (!need.ok()) return ToError(need.status());
  *bytes = *need;
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_decoder_create(const kvp_cache* cache, const kvp_decode_config* config,
                              kvp_decoder** decoder) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(config);
  KVP_CHECK_NOT_NULL(decoder);
  kvpage::DecoderOptions o;
  if (kvp_error* e = ToDecoderOptions(config, &o)) return e;
  auto created = kvpage::Decoder::Create(*cache->impl, o);
  if (!created.ok()) return ToError(created.status());
  *decoder = new kvp_decoder{std::move(created).value()};
  return nullptr;
  KVP_API_END
}

void kvp_decoder_destroy(kvp_decoder* decoder) {
  try {
    delete decoder;
  } catch (...) {
  }
}

kvp_error* kvp_decode(kvp_decoder* decoder, const kvp_decode_args* args, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(decoder);
  KVP_CHECK_NOT_NULL(args);
  kvp_decode_args a;
  if (kvp_error* e = ReadIn(args, "args", kvp_decode_args_init, &a)) return e;
  if (a.reserved0 != 0) {
    return InvalidArg(kvpage::StrFormat("args->reserved0 = %d, must be 0", a.reserved0));
  }
  kvpage::DecodeRequest r = SharedRequestFields(a);
  r.query_len = a.query_len;
  return ToError(decoder->impl->Run(r, stream));
  KVP_API_END
}

kvp_error* kvp_attend(kvp_decoder* decoder, const kvp_attend_args* args, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(decoder);
  KVP_CHECK_NOT_NULL(args);
  kvp_attend_args a;
  if (kvp_error* e = ReadIn(args, "args", kvp_attend_args_init, &a)) return e;
  if (a.reserved0 != 0) {
    return InvalidArg(kvpage::StrFormat("args->reserved0 = %d, must be 0", a.reserved0));
  }
  if (a.reserved1 != 0) {
    return InvalidArg(kvpage::StrFormat("args->reserved1 = %d, must be 0", a.reserved1));
  }
  kvpage::DecodeRequest r = SharedRequestFields(a);
  r.attend = true;
  r.query_len = 0;
  r.query_starts = a.query_starts;
  return ToError(decoder->impl->Run(r, stream));
  KVP_API_END
}

// ---- Pack and unpack ----------------------------------------------------------------------

}  // extern "C"

namespace {

kvp_error* ToPackRequest(const kvp_pack_args* args, kvpage::PackRequest* r) {
  kvp_pack_args a;
  if (kvp_error* e = ReadIn(args, "args", kvp_pack_args_init, &a)) return e;
  if (a.reserved0 != 0) {
    return InvalidArg(kvpage::StrFormat("args->reserved0 = %d, must be 0", a.reserved0));
  }
  r->block_ids = a.block_ids;
  r->num_blocks = a.num_blocks;
  r->first_layer = a.first_layer;
  r->num_layers = a.num_layers;
  r->buffer = a.buffer;
  r->buffer_bytes = a.buffer_bytes;
  r->signature = a.signature;
  return nullptr;
}

}  // namespace

extern "C" {

kvp_error* kvp_cache_pack_size(const kvp_cache* cache, int32_t num_blocks, int32_t num_layers,
                               uint64_t* bytes) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(bytes);
  auto need = cache->impl->PackBytes(num_blocks, num_layers);
  if (!need.ok()) return ToError(need.status());
  *bytes = *need;
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_pack(const kvp_cache* cache, const kvp_pack_args* args, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(args);
  kvpage::PackRequest r;
  if (kvp_error* e = ToPackRequest(args, &r)) return e;
  return ToError(cache->impl->Pack(r, stream));
  KVP_API_END
}

kvp_error* kvp_cache_unpack(kvp_cache* cache, const kvp_pack_args* args, void* stream) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(args);
  kvpage::PackRequest r;
  if (kvp_error* e = ToPackRequest(args, &r)) return e;
  return ToError(cache->impl->Unpack(r, stream));
  KVP_API_END
}

kvp_error* kvp_cache_format_signature(const kvp_cache* cache, void* signature,
                                      size_t signature_bytes) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(signature);
  const kvpage::FormatSignature& mine = cache->impl->signature();
  if (signature_bytes < mine.size()) {
    return InvalidArg(
        kvpage::StrFormat("signature_bytes = %d, must be at least %d (KVP_FORMAT_SIGNATURE_BYTES)",
                          signature_bytes, mine.size()));
  }
  std::memcpy(signature, mine.data(), mine.size());
  return nullptr;
  KVP_API_END
}

kvp_error* kvp_cache_check_signature(const kvp_cache* cache, const void* signature,
                                     size_t signature_bytes) {
  KVP_API_BEGIN
  KVP_CHECK_NOT_NULL(cache);
  KVP_CHECK_NOT_NULL(signature);
  return ToError(cache->impl->CheckSignature("signature", signature, signature_bytes));
  KVP_API_END
}

// ---- Function table ------------------------------------------------------------------------

const kvp_api* kvp_get_api(uint32_t abi_major) {
  static const kvp_api table = {
      sizeof(kvp_api),
      KVP_ABI_MAJOR,
      KVP_ABI_MINOR,
      kvp_version_string,
      kvp_abi_version,
      kvp_build_info,
      kvp_error_code,
      kvp_error_message,
      kvp_error_free,
      kvp_error_code_name,
      kvp_device_count,
      kvp_allocator_init,
      kvp_cache_config_init,
      kvp_cache_create,
      kvp_cache_destroy,
      kvp_layer_layout_init,
      kvp_cache_get_layout,
      kvp_cache_info_init,
      kvp_cache_get_info,
      kvp_seq_create,
      kvp_seq_fork,
      kvp_seq_append,
      kvp_seq_truncate,
      kvp_seq_free,
      kvp_seq_length,
      kvp_cache_num_free_blocks,
      kvp_cache_export_block_table,
      kvp_write_args_init,
      kvp_cache_write,
      kvp_write_stats_init,
      kvp_cache_get_write_stats,
      kvp_cache_reset_write_stats,
      kvp_cache_copy_blocks,
      kvp_cache_transfer_blocks,
      kvp_decode_config_init,
      kvp_decode_workspace_size,
      kvp_decoder_create,
      kvp_decoder_destroy,
      kvp_decode_args_init,
      kvp_decode,
      kvp_attend_args_init,
      kvp_attend,
      kvp_pack_args_init,
      kvp_cache_pack_size,
      kvp_cache_pack,
      kvp_cache_unpack,
      kvp_cache_format_signature,
      kvp_cache_check_signature,
  };
  return abi_major == KVP_ABI_MAJOR ? &table : nullptr;
}

}  // extern "C"
