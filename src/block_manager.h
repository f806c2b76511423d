// SPDX-License-Identifier: Apache-2.0
// Block manager: which blocks each sequence owns, with reference counts so
// that forks share blocks and copy-on-write keeps shared blocks intact.
// Pure bookkeeping: it never touches cache memory; copies it decides on are
// carried out by a callback while its lock is held, so that a failed copy
// leaves everything unchanged.
#ifndef KVPAGE_SRC_BLOCK_MANAGER_H_
#define KVPAGE_SRC_BLOCK_MANAGER_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace kvpage {

// A block copy: every layer's data and scales of block `src` to `dst`.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

// Thread-safe: every method may be called from several threads.
// Errors (absl::Status codes, mapped to the C API's by capi/):
//   kInvalidArgument     unknown sequence id, negative or too large counts
//   kResourceExhausted   too few free blocks (KVP_ERR_OUT_OF_BLOCKS)
// A method that fails changes nothing.
class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }

  // New empty sequence; ids start at 1 and are never reused.
  absl::StatusOr<int64_t> CreateSequence();
  // New sequence sharing all of `parent`'s blocks (each block's count + 1).
  absl::StatusOr<int64_t> Fork(int64_t parent);

  // Appends `num_tokens` (>= 0) tokens to `seq`. If the last block is
  // partly filled and shared, it is first replaced by a fresh copy: `copy`
  // is called with the copies to perform (possibly an empty list; not at all
  // when num_tokens == 0) before anything changes; if it returns an error,
  // the append fails and nothing changes. `copy` runs under this manager's
  // lock and must not call back into it.
  // Returns the slot (block * block_size + offset) of each new token.
  absl::StatusOr<std::vector<int64_t>> Append(
      int64_t seq, int32_t num_tokens,
      absl::FunctionRef<absl::Status(absl::Span<const BlockCopy>)> copy);

  // Shortens `seq` to `length` tokens (0 <= length <= current length),
  // dropping its references to blocks past the new end.
  absl::Status Truncate(int64_t seq, int32_t length);
  // Drops the sequence and its block references.
  absl::Status Free(int64_t seq);

  absl::StatusOr<int32_t> Length(int64_t seq) const;
  absl::StatusOr<std::vector<int32_t>> Blocks(int64_t seq) const;
  int32_t NumFreeBlocks() const;
  // Reference count of a block (0 = free); -1 for an id out of range.
  int32_t RefCount(int32_t block) const;
  int64_t NumSequences() const;

  // Dense table of `seqs`: table[i * row_stride + j] = j-th block of seqs[i]
  // for j < max_blocks_per_seq, 0 past its blocks; lens[i] = its length
  // (lens may be null). Fails without writing anything if an id is unknown
  // or a sequence has more than max_blocks_per_seq blocks.
  absl::Status ExportBlockTable(absl::Span<const int64_t> seqs, int32_t max_blocks_per_seq,
                                int64_t row_stride, int32_t* table, int32_t* lens) const;

 private:
  struct Sequence {
    int32_t length = 0;
    std::vector<int32_t> blocks;
  };

  const int32_t num_blocks_;
  const int32_t block_size_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> ref_counts_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_blocks_ ABSL_GUARDED_BY(mu_);  // a stack
  // std::unordered_map, not absl::flat_hash_map: an insertion whose
  // allocation throws std::bad_alloc must leave the map as it was, and
  // Abseil's swiss tables corrupt themselves when a rehash fails to
  // allocate (docs/RELIABILITY.md).
  std::unordered_map<int64_t, Sequence> seqs_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace kvpage

#endif  // KVPAGE_SRC_BLOCK_MANAGER_H_
