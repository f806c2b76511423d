// SPDX-License-Identifier: Apache-2.0
// A decoder: the capacities a decode launch is shaped by, the query/output
// dtypes, and the workspace; Run() checks a batch against them and hands
// it to the cache's backend.
#ifndef KVPAGE_SRC_DECODER_H_
#define KVPAGE_SRC_DECODER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/backend.h"
#include "src/cache.h"

namespace kvpage {

struct DecoderOptions {
  DecodeCapacity capacity;
  DType q_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  void* workspace = nullptr;  // caller-owned, or null
  uint64_t workspace_bytes = 0;
};

// Mirrors kvp_decode_args and kvp_attend_args (see include/kvpage/kvpage.h
// for semantics): kvp_attend sets `attend` and query_starts, kvp_decode
// query_len.
struct DecodeRequest {
  bool attend = false;
  int32_t layer = 0;
  int32_t num_seqs = 0;
  int32_t query_len = 1;
  const int32_t* query_starts = nullptr;
  int32_t sliding_window = 0;
  float sm_scale = 0;
  float logits_soft_cap = 0;
  const void* q = nullptr;
  int64_t q_stride = 0;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int32_t block_table_width = 0;
  const int32_t* seq_lens = nullptr;
  const float* alibi_slopes = nullptr;
  void* out = nullptr;
  int64_t out_stride = 0;
  float* lse = nullptr;
};

class Decoder {
 public:
  // Validates the options against the cache (messages name the
  // kvp_decode_config fields).
  static absl::Status Validate(const Cache& cache, const DecoderOptions& options);
  static absl::StatusOr<uint64_t> WorkspaceBytes(const Cache& cache, const DecoderOptions& options);
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(const Cache& cache,
                                                         const DecoderOptions& options);
  ~Decoder();

  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // kvp_decode (request.query_starts null) and kvp_attend.
  absl::Status Run(const DecodeRequest& request, void* stream);

 private:
  Decoder(const Cache& cache, const DecoderOptions& options) : cache_(cache), options_(options) {}

  const Cache& cache_;
  DecoderOptions options_;
  void* owned_workspace_ = nullptr;  // from the cache's allocator, else its backend
  uint64_t owned_bytes_ = 0;
};

}  // namespace kvpage

#endif  // KVPAGE_SRC_DECODER_H_
