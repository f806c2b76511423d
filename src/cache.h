// SPDX-License-Identifier: Apache-2.0
// A paged KV cache: its geometry, its memory on one backend, its block
// manager and write counters, and the operations on them. Everything is
// validated here that needs the cache's state; capi/ checks the C-level
// arguments (pointers, struct sizes) before calling in.
#ifndef KVPAGE_SRC_CACHE_H_
#define KVPAGE_SRC_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/backend.h"
#include "src/block_manager.h"
#include "src/format_signature.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {

struct CacheOptions {
  DeviceKind device_kind = DeviceKind::kCpu;
  int32_t device_ordinal = 0;
  CacheGeometry geometry;
  std::vector<float> key_smoothing;  // empty, or num_kv_heads * head_size
  Allocator allocator;               // null functions = backend's own
  bool checked = false;              // kvp_cache_config.checked
};

// Validates a geometry (messages name the kvp_cache_config fields).
absl::Status ValidateGeometry(const CacheGeometry& g);
bool IsCacheDtype(DType t);
bool IsActivationDtype(DType t);

struct WriteRequest {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  DType input_dtype = DType::kBF16;
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t key_stride = 0;  // elements; 0 = dense
  int64_t value_stride = 0;
  const int64_t* slot_mapping = nullptr;
};

// kvp_pack_args, as the core reads it (semantics: kvpage.h).
struct PackRequest {
  const int32_t* block_ids = nullptr;  // in the cache's memory space
  int32_t num_blocks = 0;
  int32_t first_layer = 0;
  int32_t num_layers = 0;  // 0 = through the last layer
  void* buffer = nullptr;  // in the cache's memory space
  uint64_t buffer_bytes = 0;
  const void* signature = nullptr;  // a peer's kFormatSignatureBytes bytes, or null
};

class Cache {
 public:
  static absl::StatusOr<std::unique_ptr<Cache>> Create(CacheOptions options);
  ~Cache();

  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  const CacheGeometry& geometry() const { return geo_; }
  DeviceKind device_kind() const { return backend_->kind(); }
  int32_t device_ordinal() const { return backend_->ordinal(); }
  Backend& backend() const { return *backend_; }
  BlockManager& blocks() { return blocks_; }
  const BlockManager& blocks() const { return blocks_; }
  bool has_key_smoothing() const { return smoothing_ != nullptr; }
  // The engine's allocator (null functions when it gave none): the cache's
  // memory and the workspaces decoders own come from it.
  const Allocator& allocator() const { return allocator_; }
  // Key smoothing vector in the cache's memory space, or null.
  const float* key_smoothing() const { return smoothing_; }
  // The same vector in host memory (empty without smoothing), so that
  // caches can be compared without reading device memory.
  const std::vector<float>& host_key_smoothing() const { return host_smoothing_; }
  uint8_t* layer(int32_t l) const { return base_ + l * geo_.layer_bytes(); }
  uint8_t* base() const { return base_; }
  int64_t total_bytes() const { return static_cast<int64_t>(bytes_); }

  absl::Status Write(const WriteRequest& request, void* stream);
  // Block pairs in the cache's memory space.
  absl::Status CopyBlocks(const int32_t* pairs, int32_t num_pairs, void* stream);
  // From `src` (same geometry, and the same key smoothing vector bit for
  // bit, or none on both sides: the stored K is K / lambda, so a block
  // means something else under another lambda) into this cache; pairs in
  // host memory.
  absl::Status TransferBlocksFrom(const Cache& src, const int32_t* pairs, int32_t num_pairs,
                                  void* stream);

  // The format signature of this cache, and the check of a peer's.
  const FormatSignature& signature() const { return signature_; }
  absl::Status CheckSignature(const char* name, const void* signature, size_t bytes) const;
  // Bytes of a packed buffer of `num_blocks` blocks of `num_layers` layers
  // (0 = every layer).
  absl::StatusOr<uint64_t> PackBytes(int32_t num_blocks, int32_t num_layers) const;
  // Gathers blocks into a packed buffer / scatters one into blocks.
  absl::Status Pack(const PackRequest& request, void* stream) const;
  absl::Status Unpack(const PackRequest& request, void* stream);

  // Sequence operations (block manager + copy-on-write on the backend).
  absl::StatusOr<std::vector<int64_t>> Append(int64_t seq, int32_t num_tokens, void* stream);

  absl::StatusOr<WriteCounters> ReadCounters() const;
  absl::Status ResetCounters();

  // Checked mode (CacheOptions::checked): the record kernels report bad
  // device-side data to, else null.
  DeviceErrorRecord* checked_record() const { return checked_; }
  // The fault a kernel recorded since the last call, as an
  // INVALID_ARGUMENT error (and the record cleared); OK when none.
  absl::Status TakeDeviceFault() const;

 private:
  Cache(CacheOptions options, std::unique_ptr<Backend> backend);
  // Copies whole blocks of every layer (pairs in host memory with
  // `on_host`; else in the cache's memory space).
  absl::Status CopyPairs(const int32_t* pairs, int32_t num_pairs, bool on_host, void* stream) const;
  // Checks a pack or unpack request and turns it into the backend's move.
  absl::StatusOr<BlockMoveParams> PackMove(const PackRequest& r, BlockMove move) const;

  CacheGeometry geo_;
  Allocator allocator_;
  bool checked_wanted_ = false;
  std::unique_ptr<Backend> backend_;
  BlockManager blocks_;
  uint8_t* base_ = nullptr;  // num_layers regions, then smoothing, counters
  size_t bytes_ = 0;
  const float* smoothing_ = nullptr;
  std::vector<float> host_smoothing_;     // smoothing_'s values, on the host
  FormatSignature signature_{};           // of the geometry and host_smoothing_
  WriteCounters* counters_ = nullptr;     // in the cache's memory space
  DeviceErrorRecord* checked_ = nullptr;  // host-mapped (CUDA) or host memory
};

// Bound on every byte count and element offset the operations compute
// (the cache itself, decode workspaces, strided rows): far inside int64.
constexpr int64_t kMaxBytes = int64_t{1} << 56;

// A strided array of `rows` rows of `row_elems` elements, `stride` apart
// (0 = dense): fails, naming `name` and its value, unless the last row ends
// below kMaxBytes elements.
absl::Status CheckRowExtent(const char* name, int64_t stride, int64_t rows, int64_t row_elems);

// Validates block pairs held in host memory: sources in [0, src_blocks),
// destinations in [0, dst_blocks), destinations distinct and (when both
// sides are one cache) not also sources.
absl::Status ValidateBlockPairs(const int32_t* pairs, int32_t num_pairs, int32_t src_blocks,
                                int32_t dst_blocks, bool same_cache);

// Validates block ids held in host memory, the array named `name`: each in
// [0, num_blocks), and, with `distinct`, none listed twice.
absl::Status ValidateBlockIds(const char* name, const int32_t* ids, int32_t n, int32_t num_blocks,
                              bool distinct);

}  // namespace kvpage

#endif  // KVPAGE_SRC_CACHE_H_
