// SPDX-License-Identifier: Apache-2.0
#include "src/cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "src/manifest.h"
#include "src/status.h"

namespace kvpage {

bool IsCacheDtype(DType t) { return ManifestHasKvDtype(t); }

namespace {

// "a, b or c" of the manifest's entries, each as `name` spells it.
template <typename T, size_t N, typename Name>
std::string Choices(const T (&entries)[N], Name name) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) s += i + 1 == N ? " or " : ", ";
    s += name(entries[i]);
  }
  return s;
}

// The KV dtypes this build holds as the C API names them: "FP16 (1), ...".
std::string KvDtypeChoices() {
  return Choices(kManifestKvDtypes, [](DType t) {
    return kvpage::StrFormat("%s (%d)", t == DType::kFP8E4M3 ? "FP8_E4M3" : DTypeName(t),
                             static_cast<int>(t));
  });
}

}  // namespace

bool IsActivationDtype(DType t) {
  return t == DType::kFP32 || t == DType::kFP16 || t == DType::kBF16;
}

absl::Status ValidateGeometry(const CacheGeometry& g) {
  if (g.num_layers < 1) {
    return InvalidArgument(
        kvpage::StrFormat("config->num_layers = %d, must be >= 1", g.num_layers));
  }
  if (g.num_blocks < 1) {
    return InvalidArgument(
        kvpage::StrFormat("config->num_blocks = %d, must be >= 1", g.num_blocks));
  }
  if (g.block_size != 8 && g.block_size != 16 && g.block_size != 32) {
    return InvalidArgument(
        kvpage::StrFormat("config->block_size = %d, must be 8, 16 or 32", g.block_size));
  }
  // The CUDA kernels put KV heads on grid y (at most 65535); no model has
  // more than a few hundred.
  if (g.num_kv_heads < 1 || g.num_kv_heads > 65535) {
    return InvalidArgument(kvpage::StrFormat(
        "config->num_kv_heads = %d, must be between 1 and 65535", g.num_kv_heads));
  }
  // The head sizes and KV dtypes of the kernel manifest (a reduced build
  // holds fewer; kvp_build_info() lists them).
  if (!ManifestHasHeadSize(g.head_size)) {
    return InvalidArgument(kvpage::StrFormat(
        "config->head_size = %d, must be %s", g.head_size,
        Choices(kManifestHeadSizes, [](int d) { return kvpage::StrFormat("%d", d); })));
  }
  if (!IsCacheDtype(g.k_dtype)) {
    return InvalidArgument(kvpage::StrFormat("config->k_dtype = %d, must be %s",
                                             static_cast<int>(g.k_dtype), KvDtypeChoices()));
  }
  if (!IsCacheDtype(g.v_dtype)) {
    return InvalidArgument(kvpage::StrFormat("config->v_dtype = %d, must be %s",
                                             static_cast<int>(g.v_dtype), KvDtypeChoices()));
  }
  // Slots (block * block_size + offset) and table entries are int32 inside
  // the kernels; a layer must stay addressable with int64 offsets. Checked
  // before anything is allocated.
  if (int64_t{g.num_blocks} * g.block_size > INT32_MAX) {
    return InvalidArgument(kvpage::StrFormat(
        "config->num_blocks = %d with config->block_size = %d gives %d slots: num_blocks * "
        "block_size must be < 2^31 (slots are int32 in the kernels)",
        g.num_blocks, g.block_size, int64_t{g.num_blocks} * g.block_size));
  }
  // Every byte count of the geometry is int64: bound the whole cache
  // (128-bit arithmetic cannot overflow for int32 fields) before any of
  // them is computed.
  const __int128 per_token_head = int64_t{g.head_size} * 2 * 2 + 8 + 32;  // >= K+V+scales+tail
  const __int128 total = static_cast<__int128>(g.num_layers) * g.num_blocks * g.block_size *
                             g.num_kv_heads * per_token_head +
                         static_cast<__int128>(g.num_layers) * 4 * kRegionAlignment;
  if (total > kMaxBytes) {  // 64 PiB
    return InvalidArgument(kvpage::StrFormat(
        "config describes a cache of more than 2^56 bytes (num_layers %d x num_blocks %d x "
        "block_size %d x num_kv_heads %d x head_size %d)",
        g.num_layers, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size));
  }
  return absl::OkStatus();
}

absl::Status CheckRowExtent(const char* name, int64_t stride, int64_t rows, int64_t row_elems) {
  if (rows <= 0) return absl::OkStatus();
  const __int128 step = stride == 0 ? row_elems : stride;
  const __int128 end = (static_cast<__int128>(rows) - 1) * step + row_elems;
  if (end > kMaxBytes) {
    return InvalidArgument(kvpage::StrFormat("%s = %d: %d rows of it span more than 2^56 elements",
                                             name, stride, rows));
  }
  return absl::OkStatus();
}

namespace {

// (value, index) of v[0], v[stride], ..., v[(n - 1) * stride], sorted: finds
// repeats without a hash set (Abseil's corrupt themselves when an
// allocation throws).
std::vector<std::pair<int32_t, int32_t>> SortedIds(const int32_t* v, int32_t n, int stride) {
  std::vector<std::pair<int32_t, int32_t>> sorted;
  sorted.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) sorted.emplace_back(v[int64_t{i} * stride], i);
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

// The smallest index whose value an earlier index holds too, and that
// earlier index in *earlier; n when every value is distinct.
int32_t FirstRepeat(const std::vector<std::pair<int32_t, int32_t>>& sorted, int32_t n,
                    int32_t* earlier) {
  int32_t first = n;
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k].first == sorted[k - 1].first && sorted[k].second < first) {
      first = sorted[k].second;
      *earlier = sorted[k - 1].second;
    }
  }
  return first;
}

}  // namespace

absl::Status ValidateBlockPairs(const int32_t* pairs, int32_t num_pairs, int32_t src_blocks,
                                int32_t dst_blocks, bool same_cache) {
  const std::vector<std::pair<int32_t, int32_t>> dsts = SortedIds(pairs + 1, num_pairs, 2);
  int32_t earlier = 0;
  const int32_t first_repeat = FirstRepeat(dsts, num_pairs, &earlier);
  for (int32_t i = 0; i < num_pairs; ++i) {
    const int32_t src = pairs[2 * i], dst = pairs[2 * i + 1];
    if (src < 0 || src >= src_blocks) {
      return InvalidArgument(kvpage::StrFormat(
          "pairs[%d] (source of pair %d) = %d is out of range [0, %d)", 2 * i, i, src, src_blocks));
    }
    if (dst < 0 || dst >= dst_blocks) {
      return InvalidArgument(
          kvpage::StrFormat("pairs[%d] (destination of pair %d) = %d is out of range [0, %d)",
                            2 * i + 1, i, dst, dst_blocks));
    }
    if (i == first_repeat) {
      return InvalidArgument(kvpage::StrFormat(
          "pairs[%d] = %d: block %d is the destination of two pairs", 2 * i + 1, dst, dst));
    }
  }
  if (same_cache) {
    for (int32_t i = 0; i < num_pairs; ++i) {
      const auto at =
          std::lower_bound(dsts.begin(), dsts.end(), std::make_pair(pairs[2 * i], INT32_MIN));
      if (at != dsts.end() && at->first == pairs[2 * i]) {
        return InvalidArgument(
            kvpage::StrFormat("pairs[%d] = %d: block %d is both a source and a destination", 2 * i,
                              pairs[2 * i], pairs[2 * i]));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockIds(const char* name, const int32_t* ids, int32_t n, int32_t num_blocks,
                              bool distinct) {
  for (int32_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= num_blocks) {
      return InvalidArgument(
          kvpage::StrFormat("%s[%d] = %d is out of range [0, %d)", name, i, ids[i], num_blocks));
    }
  }
  if (distinct) {
    int32_t earlier = 0;
    const int32_t repeat = FirstRepeat(SortedIds(ids, n, 1), n, &earlier);
    if (repeat < n) {
      return InvalidArgument(kvpage::StrFormat(
          "%s[%d] = %d names the block %s[%d] names too: unpack destinations must be distinct",
          name, repeat, ids[repeat], name, earlier));
    }
  }
  return absl::OkStatus();
}

Cache::Cache(CacheOptions options, std::unique_ptr<Backend> backend)
    : geo_(options.geometry),
      allocator_(options.allocator),
      checked_wanted_(options.checked),
      backend_(std::move(backend)),
      blocks_(options.geometry.num_blocks, options.geometry.block_size) {}

absl::StatusOr<std::unique_ptr<Cache>> Cache::Create(CacheOptions options) {
  KVP_RETURN_IF_ERROR(ValidateGeometry(options.geometry));
  const CacheGeometry& g = options.geometry;
  if (!options.key_smoothing.empty()) {
    const size_t want = static_cast<size_t>(g.num_kv_heads) * g.head_size;
    if (options.key_smoothing.size() != want) {
      return Internal("key smoothing vector of the wrong size");
    }
    for (size_t i = 0; i < want; ++i) {
      const float l = options.key_smoothing[i];
      if (!(std::isfinite(l) && l > 0)) {
        return InvalidArgument(
            kvpage::StrFormat("config->key_smoothing[%d] = %g, must be positive and finite", i, l));
      }
    }
  }
  if ((options.allocator.alloc == nullptr) != (options.allocator.free == nullptr)) {
    return InvalidArgument("config->allocator must set both alloc and free, or neither");
  }

  std::unique_ptr<Backend> backend;
  if (options.device_kind == DeviceKind::kCpu) {
    backend = MakeCpuBackend();
  } else {
    KVP_ASSIGN_OR_RETURN(backend, MakeCudaBackend(options.device_ordinal));
  }
  std::vector<float> smoothing = std::move(options.key_smoothing);
  std::unique_ptr<Cache> cache(new Cache(std::move(options), std::move(backend)));

  // One allocation: the layers, then the smoothing vector, then counters.
  const int64_t smoothing_offset = g.total_bytes();
  const int64_t counters_offset = AlignUp(
      smoothing_offset + static_cast<int64_t>(smoothing.size() * sizeof(float)), kRegionAlignment);
  const size_t bytes = static_cast<size_t>(counters_offset + sizeof(WriteCounters));
  void* mem = nullptr;
  if (cache->allocator_.alloc != nullptr) {
    mem = cache->allocator_.alloc(cache->allocator_.user_data, bytes, kRegionAlignment,
                                  static_cast<int32_t>(cache->device_kind()),
                                  cache->device_ordinal());
    if (mem == nullptr) {
      return OutOfMemory(
          kvpage::StrFormat("the engine allocator returned NULL for %d bytes", bytes));
    }
    if (reinterpret_cast<uintptr_t>(mem) % kRegionAlignment != 0) {
      cache->allocator_.free(cache->allocator_.user_data, mem, bytes,
                             static_cast<int32_t>(cache->device_kind()), cache->device_ordinal());
      return InvalidArgument(kvpage::StrFormat(
          "the engine allocator returned %p, not aligned to %d bytes", mem, kRegionAlignment));
    }
  } else {
    KVP_ASSIGN_OR_RETURN(mem, cache->backend_->Allocate(bytes));
  }
  cache->base_ = static_cast<uint8_t*>(mem);
  cache->bytes_ = bytes;
  // Zeroed, so that slots never written decode to zeros, not garbage.
  KVP_RETURN_IF_ERROR(cache->backend_->Memset(mem, 0, bytes));
  if (!smoothing.empty()) {
    KVP_RETURN_IF_ERROR(cache->backend_->CopyFromHost(
        cache->base_ + smoothing_offset, smoothing.data(), smoothing.size() * sizeof(float)));
    cache->smoothing_ = reinterpret_cast<const float*>(cache->base_ + smoothing_offset);
    cache->host_smoothing_ = std::move(smoothing);
  }
  cache->counters_ = reinterpret_cast<WriteCounters*>(cache->base_ + counters_offset);
  cache->signature_ = MakeFormatSignature(g, cache->host_smoothing_);
  if (cache->checked_wanted_) {
    KVP_ASSIGN_OR_RETURN(cache->checked_, cache->backend_->AllocateErrorRecord());
    if (cache->checked_ == nullptr) {
      return OutOfMemory("could not allocate the checked-mode error record");
    }
  }
  return cache;
}

absl::Status Cache::TakeDeviceFault() const {
  if (checked_ == nullptr) return absl::OkStatus();
  // Published last by the kernel (kernels/common/checked.cuh); taking it
  // with an exchange lets one caller report it, then the record is free
  // for the next fault.
  const uint32_t fault = __atomic_exchange_n(&checked_->fault, 0u, __ATOMIC_ACQ_REL);
  if (fault == 0) return absl::OkStatus();
  const int64_t where = __atomic_load_n(&checked_->where, __ATOMIC_RELAXED);
  const int64_t value = __atomic_load_n(&checked_->value, __ATOMIC_RELAXED);
  const int64_t limit = __atomic_load_n(&checked_->limit, __ATOMIC_RELAXED);
  __atomic_store_n(&checked_->claim, 0u, __ATOMIC_RELEASE);
  switch (static_cast<DeviceFault>(fault)) {
    case DeviceFault::kSlotOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_cache_write had slot_mapping[%d] = %d, out of range "
          "[-1, %d); that token was not written",
          where, value, limit));
    case DeviceFault::kSeqLenOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_decode or kvp_attend had seq_lens[%d] = %d, out of range "
          "[0, %d] (max_context_len, block_table_width * block_size); it was decoded as empty",
          where, value, limit));
    case DeviceFault::kBlockIdOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_decode or kvp_attend had block id %d in block_table row "
          "%d, out of range [0, %d); that part of the sequence was not read",
          value, where, limit));
    case DeviceFault::kQueryStartOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_attend had query_starts[%d] = %d, below the entry "
          "before it, above max_query_tokens = %d, or, as query_starts[0], not 0; the sequences "
          "it bounds were not attended",
          where, value, limit));
    case DeviceFault::kQueryPastContext:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_attend gave sequence %d %d query tokens but seq_lens[%d] "
          "= %d; its sequence was not attended",
          where, value, where, limit));
    case DeviceFault::kCopyPairOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_cache_copy_blocks had block id %d in pair %d, out of "
          "range [0, %d); that pair was not copied",
          value, where, limit));
    case DeviceFault::kPackBlockOutOfRange:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_cache_pack or kvp_cache_unpack had block_ids[%d] = %d, "
          "out of range [0, %d); that block was not moved",
          where, value, limit));
    case DeviceFault::kUnpackBlockRepeated:
      return InvalidArgument(kvpage::StrFormat(
          "checked mode: an earlier kvp_cache_unpack had block_ids[%d] = %d, the block "
          "block_ids[%d] names too; that block holds either one's bytes",
          where, value, limit));
    default:
      return Internal(kvpage::StrFormat("checked mode: unknown device fault %d", fault));
  }
}

Cache::~Cache() {
  if (checked_ != nullptr) backend_->FreeErrorRecord(checked_);
  if (base_ == nullptr) return;
  if (allocator_.free != nullptr) {
    allocator_.free(allocator_.user_data, base_, bytes_, static_cast<int32_t>(device_kind()),
                    device_ordinal());
  } else {
    backend_->Free(base_);
  }
}

absl::Status Cache::Write(const WriteRequest& r, void* stream) {
  KVP_RETURN_IF_ERROR(TakeDeviceFault());  // checked mode: an earlier kernel's finding
  if (r.layer < 0 || r.layer >= geo_.num_layers) {
    return InvalidArgument(
        kvpage::StrFormat("args->layer = %d is out of range [0, %d)", r.layer, geo_.num_layers));
  }
  if (r.num_tokens < 0) {
    return InvalidArgument(kvpage::StrFormat("args->num_tokens = %d, must be >= 0", r.num_tokens));
  }
  if (!IsActivationDtype(r.input_dtype)) {
    return InvalidArgument(
        kvpage::StrFormat("args->input_dtype = %d, must be FP32 (0), FP16 (1) or BF16 (2)",
                          static_cast<int>(r.input_dtype)));
  }
  const int64_t dense = int64_t{geo_.num_kv_heads} * geo_.head_size;
  WriteParams p{};
  p.key_stride = r.key_stride == 0 ? dense : r.key_stride;
  p.value_stride = r.value_stride == 0 ? dense : r.value_stride;
  if (p.key_stride < dense) {
    return InvalidArgument(kvpage::StrFormat(
        "args->key_token_stride = %d, must be 0 or >= num_kv_heads * head_size = %d", r.key_stride,
        dense));
  }
  if (p.value_stride < dense) {
    return InvalidArgument(kvpage::StrFormat(
        "args->value_token_stride = %d, must be 0 or >= num_kv_heads * head_size = %d",
        r.value_stride, dense));
  }
  if (r.num_tokens == 0) return absl::OkStatus();
  KVP_RETURN_IF_ERROR(CheckRowExtent("args->key_token_stride", r.key_stride, r.num_tokens, dense));
  KVP_RETURN_IF_ERROR(
      CheckRowExtent("args->value_token_stride", r.value_stride, r.num_tokens, dense));
  if (r.key == nullptr || r.value == nullptr || r.slot_mapping == nullptr) {
    return InvalidArgument(kvpage::StrFormat("args->%s is NULL with num_tokens = %d",
                                             r.key == nullptr     ? "key"
                                             : r.value == nullptr ? "value"
                                                                  : "slot_mapping",
                                             r.num_tokens));
  }
  p.geo = geo_;
  p.layer = layer(r.layer);
  p.input_dtype = r.input_dtype;
  p.num_tokens = r.num_tokens;
  p.key = r.key;
  p.value = r.value;
  p.slot_mapping = r.slot_mapping;
  p.key_smoothing = smoothing_;
  p.counters = counters_;
  p.checked = checked_record();
  return backend_->Write(p, stream);
}

absl::Status Cache::CopyPairs(const int32_t* pairs, int32_t num_pairs, bool on_host,
                              void* stream) const {
  BlockMoveParams p{};
  p.geo = geo_;
  p.cache = base_;
  p.move = BlockMove::kCopy;
  p.first_layer = 0;
  p.num_layers = geo_.num_layers;
  p.ids = pairs;
  p.num_items = num_pairs;
  p.ids_on_host = on_host;
  p.checked = checked_record();
  return backend_->MoveBlocks(p, stream);
}

absl::Status Cache::CopyBlocks(const int32_t* pairs, int32_t num_pairs, void* stream) {
  KVP_RETURN_IF_ERROR(TakeDeviceFault());  // checked mode: an earlier kernel's finding
  if (num_pairs < 0) {
    return InvalidArgument(kvpage::StrFormat("num_pairs = %d, must be >= 0", num_pairs));
  }
  if (num_pairs == 0) return absl::OkStatus();
  if (pairs == nullptr) {
    return InvalidArgument(kvpage::StrFormat("pairs is NULL with num_pairs = %d", num_pairs));
  }
  if (device_kind() == DeviceKind::kCpu) {
    KVP_RETURN_IF_ERROR(
        ValidateBlockPairs(pairs, num_pairs, geo_.num_blocks, geo_.num_blocks, true));
  }
  return CopyPairs(pairs, num_pairs, /*on_host=*/false, stream);
}

// ---- Pack and unpack (kvp_cache_pack, kvp_cache_unpack) ---------------------------------

absl::Status Cache::CheckSignature(const char* name, const void* signature, size_t bytes) const {
  return CheckFormatSignature(name, signature, bytes, signature_);
}

absl::StatusOr<uint64_t> Cache::PackBytes(int32_t num_blocks, int32_t num_layers) const {
  if (num_blocks < 0) {
    return InvalidArgument(kvpage::StrFormat("num_blocks = %d, must be >= 0", num_blocks));
  }
  if (num_layers < 0 || num_layers > geo_.num_layers) {
    return InvalidArgument(
        kvpage::StrFormat("num_layers = %d, must be between 0 (every layer) and the cache's %d",
                          num_layers, geo_.num_layers));
  }
  const int32_t layers = num_layers == 0 ? geo_.num_layers : num_layers;
  // Pack sources may repeat, so num_blocks is not bounded by the cache.
  const __int128 bytes = static_cast<__int128>(num_blocks) * layers * geo_.packed_block_bytes();
  if (bytes > kMaxBytes) {
    return InvalidArgument(
        kvpage::StrFormat("num_blocks = %d of %d layers of %d bytes a block: more than 2^56 bytes",
                          num_blocks, layers, geo_.packed_block_bytes()));
  }
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<BlockMoveParams> Cache::PackMove(const PackRequest& r, BlockMove move) const {
  KVP_RETURN_IF_ERROR(TakeDeviceFault());  // checked mode: an earlier kernel's finding
  if (r.signature != nullptr) {
    KVP_RETURN_IF_ERROR(CheckSignature("args->signature", r.signature, kFormatSignatureBytes));
  }
  if (r.num_blocks < 0) {
    return InvalidArgument(kvpage::StrFormat("args->num_blocks = %d, must be >= 0", r.num_blocks));
  }
  if (r.first_layer < 0 || r.first_layer >= geo_.num_layers) {
    return InvalidArgument(kvpage::StrFormat("args->first_layer = %d is out of range [0, %d)",
                                             r.first_layer, geo_.num_layers));
  }
  const int32_t layers = r.num_layers == 0 ? geo_.num_layers - r.first_layer : r.num_layers;
  if (layers < 1 || layers > geo_.num_layers - r.first_layer) {
    return InvalidArgument(kvpage::StrFormat(
        "args->num_layers = %d with args->first_layer = %d: the cache has layers [0, %d) (0 = "
        "through the last)",
        r.num_layers, r.first_layer, geo_.num_layers));
  }
  KVP_ASSIGN_OR_RETURN(const uint64_t need, PackBytes(r.num_blocks, layers));
  BlockMoveParams p{};
  p.geo = geo_;
  p.cache = base_;
  p.move = move;
  p.first_layer = r.first_layer;
  p.num_layers = layers;
  p.ids = r.block_ids;
  p.num_items = r.num_blocks;
  p.buffer = static_cast<uint8_t*>(r.buffer);
  p.checked = checked_record();
  if (r.num_blocks == 0) return p;  // a no-op: the pointers may be NULL
  if (r.block_ids == nullptr || r.buffer == nullptr) {
    return InvalidArgument(kvpage::StrFormat("args->%s is NULL with args->num_blocks = %d",
                                             r.block_ids == nullptr ? "block_ids" : "buffer",
                                             r.num_blocks));
  }
  if (reinterpret_cast<uintptr_t>(r.buffer) % 16 != 0) {
    return InvalidArgument(kvpage::StrFormat("args->buffer = %p is not 16-byte aligned", r.buffer));
  }
  if (r.buffer_bytes < need) {
    return InvalidArgument(kvpage::StrFormat(
        "args->buffer_bytes = %d, but %d blocks of %d layers need %d bytes (kvp_cache_pack_size)",
        r.buffer_bytes, r.num_blocks, layers, need));
  }
  const auto at = reinterpret_cast<uintptr_t>(r.buffer), base = reinterpret_cast<uintptr_t>(base_);
  if (at < base + bytes_ && base < at + need) {
    return InvalidArgument(
        kvpage::StrFormat("args->buffer = %p overlaps the cache's own memory [%p, +%d bytes)",
                          r.buffer, base_, bytes_));
  }
  if (device_kind() == DeviceKind::kCpu) {  // the ids are host memory here
    KVP_RETURN_IF_ERROR(ValidateBlockIds("args->block_ids", r.block_ids, r.num_blocks,
                                         geo_.num_blocks, move == BlockMove::kUnpack));
  }
  return p;
}

absl::Status Cache::Pack(const PackRequest& r, void* stream) const {
  KVP_ASSIGN_OR_RETURN(const BlockMoveParams p, PackMove(r, BlockMove::kPack));
  if (p.num_items == 0) return absl::OkStatus();
  return backend_->MoveBlocks(p, stream);
}

absl::Status Cache::Unpack(const PackRequest& r, void* stream) {
  KVP_ASSIGN_OR_RETURN(const BlockMoveParams p, PackMove(r, BlockMove::kUnpack));
  if (p.num_items == 0) return absl::OkStatus();
  return backend_->MoveBlocks(p, stream);
}

absl::Status Cache::TransferBlocksFrom(const Cache& src, const int32_t* pairs, int32_t num_pairs,
                                       void* stream) {
  KVP_RETURN_IF_ERROR(TakeDeviceFault());
  KVP_RETURN_IF_ERROR(src.TakeDeviceFault());
  const CacheGeometry& a = src.geo_;
  const CacheGeometry& b = geo_;
  if (a.num_layers != b.num_layers || a.block_size != b.block_size ||
      a.num_kv_heads != b.num_kv_heads || a.head_size != b.head_size || a.k_dtype != b.k_dtype ||
      a.v_dtype != b.v_dtype || src.has_key_smoothing() != has_key_smoothing()) {
    return InvalidArgument(kvpage::StrFormat(
        "src and dst caches differ in geometry: layers %d/%d, block_size %d/%d, kv_heads "
        "%d/%d, head_size %d/%d, k_dtype %d/%d, v_dtype %d/%d, key smoothing %d/%d",
        a.num_layers, b.num_layers, a.block_size, b.block_size, a.num_kv_heads, b.num_kv_heads,
        a.head_size, b.head_size, static_cast<int>(a.k_dtype), static_cast<int>(b.k_dtype),
        static_cast<int>(a.v_dtype), static_cast<int>(b.v_dtype), src.has_key_smoothing(),
        has_key_smoothing()));
  }
  // The stored K is K / lambda: under another lambda the same bytes decode
  // to other keys. Compared bit for bit (the values are positive and
  // finite, so equal bits are equal values and the reverse).
  const std::vector<float>& from = src.host_key_smoothing();
  const std::vector<float>& to = host_key_smoothing();
  for (size_t i = 0; i < from.size() && i < to.size(); ++i) {
    uint32_t from_bits, to_bits;
    std::memcpy(&from_bits, &from[i], sizeof(from_bits));
    std::memcpy(&to_bits, &to[i], sizeof(to_bits));
    if (from_bits != to_bits) {
      return InvalidArgument(kvpage::StrFormat(
          "src and dst caches differ in key smoothing at kv head %d channel %d: source %.9g "
          "vs destination %.9g",
          i / a.head_size, i % a.head_size, from[i], to[i]));
    }
  }
  if (num_pairs < 0) {
    return InvalidArgument(kvpage::StrFormat("num_pairs = %d, must be >= 0", num_pairs));
  }
  if (num_pairs == 0) return absl::OkStatus();
  if (pairs == nullptr) {
    return InvalidArgument(kvpage::StrFormat("pairs is NULL with num_pairs = %d", num_pairs));
  }
  KVP_RETURN_IF_ERROR(
      ValidateBlockPairs(pairs, num_pairs, a.num_blocks, b.num_blocks, &src == this));
  // A CUDA side (this cache's device first) moves the bytes; two CPU caches
  // copy on the host.
  Backend& mover = device_kind() == DeviceKind::kCuda ? *backend_ : src.backend();
  // Block strides agree; region offsets differ when num_blocks does.
  for (int32_t l = 0; l < b.num_layers; ++l) {
    for (int32_t i = 0; i < num_pairs; ++i) {
      for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
        const CacheGeometry::BlockRegion from = a.block_region(r), to = b.block_region(r);
        if (to.block_stride == 0) continue;
        KVP_RETURN_IF_ERROR(
            mover.CopyAsync(layer(l) + to.offset + pairs[2 * i + 1] * to.block_stride,
                            src.layer(l) + from.offset + pairs[2 * i] * from.block_stride,
                            to.block_stride, stream));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Cache::Append(int64_t seq, int32_t num_tokens, void* stream) {
  return blocks_.Append(seq, num_tokens, [&](absl::Span<const BlockCopy> copies) {
    // Every layer, data and scales, through the block copy kernel; the
    // pairs are host values and travel by value (no device staging another
    // stream could race on).
    std::vector<int32_t> pairs;
    pairs.reserve(2 * copies.size());
    for (const BlockCopy& c : copies) {
      pairs.push_back(c.src);
      pairs.push_back(c.dst);
    }
    return CopyPairs(pairs.data(), static_cast<int32_t>(copies.size()), /*on_host=*/true, stream);
  });
}

absl::StatusOr<WriteCounters> Cache::ReadCounters() const {
  WriteCounters c{};
  if (device_kind() == DeviceKind::kCpu) {
    // CPU writes on other threads add to the counters atomically: read them
    // the same way (a plain copy would be a data race).
    c.non_finite = __atomic_load_n(&counters_->non_finite, __ATOMIC_RELAXED);
    c.saturated = __atomic_load_n(&counters_->saturated, __ATOMIC_RELAXED);
    return c;
  }
  KVP_RETURN_IF_ERROR(backend_->CopyToHost(&c, counters_, sizeof(c)));
  return c;
}

absl::Status Cache::ResetCounters() {
  if (device_kind() == DeviceKind::kCpu) {
    __atomic_store_n(&counters_->non_finite, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counters_->saturated, 0, __ATOMIC_RELAXED);
    return absl::OkStatus();
  }
  return backend_->Memset(counters_, 0, sizeof(WriteCounters));
}

}  // namespace kvpage
