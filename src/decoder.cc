// SPDX-License-Identifier: Apache-2.0
#include "src/decoder.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "src/status.h"

namespace kvpage {

absl::Status Decoder::Validate(const Cache& cache, const DecoderOptions& o) {
  const CacheGeometry& g = cache.geometry();
  const DecodeCapacity& c = o.capacity;
  if (c.num_q_heads < 1 || c.num_q_heads % g.num_kv_heads != 0) {
    return InvalidArgument(kvpage::StrFormat(
        "config->num_query_heads = %d, must be a positive multiple of the cache's "
        "num_kv_heads = %d",
        c.num_q_heads, g.num_kv_heads));
  }
  if (c.max_num_seqs < 1) {
    return InvalidArgument(
        kvpage::StrFormat("config->max_num_seqs = %d, must be >= 1", c.max_num_seqs));
  }
  if (c.max_context_len < 1) {
    return InvalidArgument(
        kvpage::StrFormat("config->max_context_len = %d, must be >= 1", c.max_context_len));
  }
  if (c.max_query_len < 1 || c.max_query_len > c.max_context_len) {
    return InvalidArgument(
        kvpage::StrFormat("config->max_query_len = %d, must be in [1, max_context_len = %d]",
                          c.max_query_len, c.max_context_len));
  }
  if (c.max_query_tokens < 1) {
    return InvalidArgument(kvpage::StrFormat(
        "config->max_query_tokens = %d, must be >= 0 (0 = max_num_seqs * max_query_len)",
        c.max_query_tokens));
  }
  // Whatever the backend makes of them (CUDA: split-K partials of at least
  // 32 tokens each, FP32), byte counts and offsets derived from the
  // capacities must stay far inside int64.
  const __int128 partials = static_cast<__int128>(c.max_num_seqs) * c.max_query_len *
                            c.num_q_heads * ((int64_t{c.max_context_len} + 31) / 32) *
                            (int64_t{g.head_size} + 2) * 4;
  if (partials > kMaxBytes) {
    return InvalidArgument(kvpage::StrFormat(
        "config->max_num_seqs = %d, max_query_len = %d, num_query_heads = %d and "
        "max_context_len = %d together describe a decode of more than 2^56 bytes of "
        "workspace",
        c.max_num_seqs, c.max_query_len, c.num_q_heads, c.max_context_len));
  }
  // kvp_attend's rows (query tokens times heads) and their split-KV
  // partials likewise.
  const __int128 attend_rows = (static_cast<__int128>(c.max_query_tokens) + c.max_num_seqs) *
                               c.num_q_heads * (int64_t{g.head_size} + 2) * 4;
  if (attend_rows > kMaxBytes) {
    return InvalidArgument(kvpage::StrFormat(
        "config->max_query_tokens = %d with num_query_heads = %d describes more than 2^56 bytes "
        "of query rows",
        c.max_query_tokens, c.num_q_heads));
  }
  if (!IsActivationDtype(o.q_dtype)) {
    return InvalidArgument(
        kvpage::StrFormat("config->q_dtype = %d, must be FP32 (0), FP16 (1) or BF16 (2)",
                          static_cast<int>(o.q_dtype)));
  }
  if (!IsActivationDtype(o.out_dtype)) {
    return InvalidArgument(
        kvpage::StrFormat("config->out_dtype = %d, must be FP32 (0), FP16 (1) or BF16 (2)",
                          static_cast<int>(o.out_dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Decoder::WorkspaceBytes(const Cache& cache, const DecoderOptions& o) {
  KVP_RETURN_IF_ERROR(Validate(cache, o));
  return cache.backend().DecodeWorkspaceBytes(cache.geometry(), o.capacity);
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const Cache& cache,
                                                         const DecoderOptions& o) {
  KVP_ASSIGN_OR_RETURN(const uint64_t need, WorkspaceBytes(cache, o));
  std::unique_ptr<Decoder> d(new Decoder(cache, o));
  if (o.workspace != nullptr) {
    if (o.workspace_bytes < need) {
      return InvalidArgument(kvpage::StrFormat(
          "config->workspace_bytes = %d, but this decoder needs %d (kvp_decode_workspace_size)",
          o.workspace_bytes, need));
    }
    if (reinterpret_cast<uintptr_t>(o.workspace) % kRegionAlignment != 0) {
      return InvalidArgument(kvpage::StrFormat("config->workspace = %p is not %d-byte aligned",
                                               o.workspace, kRegionAlignment));
    }
  } else if (need > 0) {
    // The engine's allocator serves the workspace too, when it gave one.
    const Allocator& a = cache.allocator();
    if (a.alloc != nullptr) {
      void* mem = a.alloc(a.user_data, static_cast<size_t>(need), kRegionAlignment,
                          static_cast<int32_t>(cache.device_kind()), cache.device_ordinal());
      if (mem == nullptr) {
        return OutOfMemory(kvpage::StrFormat(
            "the engine allocator returned NULL for the decoder's workspace of %d bytes", need));
      }
      if (reinterpret_cast<uintptr_t>(mem) % kRegionAlignment != 0) {
        a.free(a.user_data, mem, static_cast<size_t>(need),
               static_cast<int32_t>(cache.device_kind()), cache.device_ordinal());
        return InvalidArgument(kvpage::StrFormat(
            "the engine allocator returned %p for the decoder's workspace, not aligned to %d "
            "bytes",
            mem, kRegionAlignment));
      }
      d->owned_workspace_ = mem;
    } else {
      KVP_ASSIGN_OR_RETURN(d->owned_workspace_, cache.backend().Allocate(need));
    }
    d->owned_bytes_ = need;
    d->options_.workspace = d->owned_workspace_;
    d->options_.workspace_bytes = need;
  }
  return d;
}

Decoder::~Decoder() {
  if (owned_workspace_ == nullptr) return;
  const Allocator& a = cache_.allocator();
  if (a.free != nullptr) {
    a.free(a.user_data, owned_workspace_, static_cast<size_t>(owned_bytes_),
           static_cast<int32_t>(cache_.device_kind()), cache_.device_ordinal());
  } else {
    cache_.backend().Free(owned_workspace_);
  }
}

absl::Status Decoder::Run(const DecodeRequest& r, void* stream) {
  KVP_RETURN_IF_ERROR(cache_.TakeDeviceFault());  // checked mode: an earlier kernel's finding
  const CacheGeometry& g = cache_.geometry();
  const DecodeCapacity& c = options_.capacity;
  if (r.layer < 0 || r.layer >= g.num_layers) {
    return InvalidArgument(
        kvpage::StrFormat("args->layer = %d is out of range [0, %d)", r.layer, g.num_layers));
  }
  if (r.num_seqs < 0 || r.num_seqs > c.max_num_seqs) {
    return InvalidArgument(kvpage::StrFormat(
        "args->num_seqs = %d is out of range [0, max_num_seqs = %d]", r.num_seqs, c.max_num_seqs));
  }
  const bool attend = r.attend;
  if (!attend && (r.query_len < 1 || r.query_len > c.max_query_len)) {
    return InvalidArgument(
        kvpage::StrFormat("args->query_len = %d is out of range [1, max_query_len = %d]",
                          r.query_len, c.max_query_len));
  }
  if (r.sliding_window < 0) {
    return InvalidArgument(
        kvpage::StrFormat("args->sliding_window = %d, must be >= 0 (0 = off)", r.sliding_window));
  }
  if (!std::isfinite(r.sm_scale) || r.sm_scale < 0) {
    return InvalidArgument(kvpage::StrFormat(
        "args->sm_scale = %g, must be finite and >= 0 (0 = 1/sqrt(head_size))", r.sm_scale));
  }
  if (!std::isfinite(r.logits_soft_cap) || r.logits_soft_cap < 0) {
    return InvalidArgument(kvpage::StrFormat(
        "args->logits_soft_cap = %g, must be finite and >= 0 (0 = off)", r.logits_soft_cap));
  }
  const int64_t dense = int64_t{c.num_q_heads} * g.head_size;
  if (r.q_stride != 0 && r.q_stride < dense) {
    return InvalidArgument(kvpage::StrFormat(
        "args->q_token_stride = %d, must be 0 or >= num_query_heads * head_size = %d", r.q_stride,
        dense));
  }
  if (r.out_stride != 0 && r.out_stride < dense) {
    return InvalidArgument(kvpage::StrFormat(
        "args->out_token_stride = %d, must be 0 or >= num_query_heads * head_size = %d",
        r.out_stride, dense));
  }
  if (r.block_table_width < 1) {
    return InvalidArgument(
        kvpage::StrFormat("args->block_table_width = %d, must be >= 1", r.block_table_width));
  }
  if (r.block_table_stride != 0 && r.block_table_stride < r.block_table_width) {
    return InvalidArgument(
        kvpage::StrFormat("args->block_table_stride = %d, must be 0 or >= block_table_width = %d",
                          r.block_table_stride, r.block_table_width));
  }
  if (r.num_seqs == 0) return absl::OkStatus();
  // Element offsets of the last row must be computable in int64.
  const int64_t rows = attend ? int64_t{c.max_query_tokens} : int64_t{r.num_seqs} * r.query_len;
  KVP_RETURN_IF_ERROR(CheckRowExtent("args->q_token_stride", r.q_stride, rows, dense));
  KVP_RETURN_IF_ERROR(CheckRowExtent("args->out_token_stride", r.out_stride, rows, dense));
  KVP_RETURN_IF_ERROR(CheckRowExtent("args->block_table_stride", r.block_table_stride, r.num_seqs,
                                     r.block_table_width));
  const char* null_arg = attend && r.query_starts == nullptr ? "query_starts"
                         : r.q == nullptr                    ? "q"
                         : r.block_table == nullptr          ? "block_table"
                         : r.seq_lens == nullptr             ? "seq_lens"
                         : r.out == nullptr                  ? "out"
                                                             : nullptr;
  if (null_arg != nullptr) {
    return InvalidArgument(
        kvpage::StrFormat("args->%s is NULL with num_seqs = %d", null_arg, r.num_seqs));
  }

  DecodeParams p{};
  p.geo = g;
  p.layer = cache_.layer(r.layer);
  p.num_seqs = r.num_seqs;
  p.query_len = attend ? 0 : r.query_len;
  p.query_starts = attend ? r.query_starts : nullptr;
  p.max_query_tokens = c.max_query_tokens;
  p.num_q_heads = c.num_q_heads;
  p.max_context_len = c.max_context_len;
  p.q_dtype = options_.q_dtype;
  p.out_dtype = options_.out_dtype;
  p.q = r.q;
  p.q_stride = r.q_stride == 0 ? dense : r.q_stride;
  p.block_table = r.block_table;
  p.block_table_stride = r.block_table_stride == 0 ? r.block_table_width : r.block_table_stride;
  p.block_table_width = r.block_table_width;
  p.seq_lens = r.seq_lens;
  p.alibi_slopes = r.alibi_slopes;
  p.key_smoothing = cache_.key_smoothing();
  p.sliding_window = r.sliding_window;
  p.sm_scale = r.sm_scale == 0 ? 1.0f / std::sqrt(static_cast<float>(g.head_size)) : r.sm_scale;
  p.logits_soft_cap = r.logits_soft_cap;
  p.out = r.out;
  p.out_stride = r.out_stride == 0 ? dense : r.out_stride;
  p.lse = r.lse;
  p.checked = cache_.checked_record();
  return cache_.backend().Decode(p, c, options_.workspace, stream);
}

}  // namespace kvpage
