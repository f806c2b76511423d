// SPDX-License-Identifier: Apache-2.0
#include "src/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "src/status.h"
#include "src/sync.h"

namespace kvpage {
namespace {

// Blocks needed to hold `length` tokens. Computed in 64 bits so that a
// length near INT32_MAX cannot overflow the rounding.
int64_t BlocksFor(int64_t length, int32_t block_size) {
  return (length + block_size - 1) / block_size;
}

absl::Status UnknownSequence(int64_t seq) {
  return absl::InvalidArgumentError(kvpage::StrFormat("seq_id %d does not exist", seq));
}

}  // namespace

// The constructor cannot report an error, and the C API validates the cache
// configuration before it gets here; the clamps only keep a misuse from
// turning into a division by zero or a negative vector size.
BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(std::max(num_blocks, 0)),
      block_size_(std::max(block_size, 1)),
      ref_counts_(static_cast<size_t>(num_blocks_), 0) {
  // A stack handed out from the back: push in descending order so that the
  // first allocations get the lowest ids, which keeps tables readable in
  // tests and debugging output.
  free_blocks_.reserve(static_cast<size_t>(num_blocks_));
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_blocks_.push_back(b);
}

absl::StatusOr<int64_t> BlockManager::CreateSequence() {
  MutexLock lock(&mu_);
  const int64_t id = next_id_;
  seqs_.emplace(id, Sequence{});  // may throw std::bad_alloc: nothing changed yet
  ++next_id_;
  return id;
}

absl::StatusOr<int64_t> BlockManager::Fork(int64_t parent) {
  MutexLock lock(&mu_);
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) return UnknownSequence(parent);
  // Check before touching any count, so that a failure changes nothing.
  for (int32_t b : it->second.blocks) {
    if (ref_counts_[b] == std::numeric_limits<int32_t>::max()) {
      return absl::ResourceExhaustedError(kvpage::StrFormat(
          "block %d of seq_id %d is already shared by %d sequences", b, parent, ref_counts_[b]));
    }
  }
  // Insert first (a copy, then an insertion that may rehash `it` away; both
  // may throw std::bad_alloc), count references once nothing can fail.
  Sequence child = it->second;
  const int64_t id = next_id_;
  const Sequence& inserted = seqs_.emplace(id, std::move(child)).first->second;
  ++next_id_;
  for (int32_t b : inserted.blocks) ++ref_counts_[b];
  return id;
}

// With num_tokens == 0 nothing is written, so no block needs to be private:
// `copy` is not called at all. With num_tokens > 0 it is always called, with
// one copy when the last block is partly filled and shared, else with none.
absl::StatusOr<std::vector<int64_t>> BlockManager::Append(
    int64_t seq, int32_t num_tokens,
    absl::FunctionRef<absl::Status(absl::Span<const BlockCopy>)> copy) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        kvpage::StrFormat("num_tokens must be >= 0, got %d", num_tokens));
  }
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return UnknownSequence(seq);
  Sequence& s = it->second;
  if (num_tokens == 0) return std::vector<int64_t>();

  const int64_t new_length = int64_t{s.length} + num_tokens;
  if (new_length > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        kvpage::StrFormat("num_tokens %d would make seq_id %d longer than %d tokens "
                          "(current length %d)",
                          num_tokens, seq, std::numeric_limits<int32_t>::max(), s.length));
  }

  // Tokens land in the last block only if it has room; if another sequence
  // also references it, writing there would change that sequence's tokens.
  const bool cow = s.length % block_size_ != 0 && ref_counts_[s.blocks.back()] > 1;
  const int64_t new_blocks =
      BlocksFor(new_length, block_size_) - static_cast<int64_t>(s.blocks.size());
  const int64_t needed = new_blocks + (cow ? 1 : 0);
  const int64_t num_free = static_cast<int64_t>(free_blocks_.size());
  if (needed > num_free) {
    return absl::ResourceExhaustedError(
        kvpage::StrFormat("appending %d tokens to seq_id %d (length %d) needs %d free blocks, "
                          "only %d are free",
                          num_tokens, seq, s.length, needed, num_free));
  }

  // Blocks are taken from the top of the stack, but only popped once the
  // copy has succeeded: a failed copy then leaves the free list exactly as it
  // was without having to undo anything.
  // free_blocks_[next - 1] is the next block handed out.
  size_t next = free_blocks_.size();
  // Everything that allocates comes before the copy and the commit, so that
  // a std::bad_alloc (mapped to KVP_ERR_OUT_OF_MEMORY) changes nothing.
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(num_tokens));
  s.blocks.reserve(s.blocks.size() + static_cast<size_t>(new_blocks));
  BlockCopy copies[1];
  size_t num_copies = 0;
  if (cow) {
    copies[num_copies++] = BlockCopy{s.blocks.back(), free_blocks_[--next]};
  }
  if (absl::Status st = copy(absl::MakeConstSpan(copies, num_copies)); !st.ok()) {
    return st;
  }

  // Commit.
  if (cow) {
    --ref_counts_[s.blocks.back()];
    s.blocks.back() = copies[0].dst;
    ref_counts_[copies[0].dst] = 1;
  }
  for (int64_t i = 0; i < new_blocks; ++i) {
    const int32_t b = free_blocks_[--next];
    ref_counts_[b] = 1;
    s.blocks.push_back(b);
  }
  free_blocks_.resize(next);

  for (int64_t pos = s.length; pos < new_length; ++pos) {
    const int64_t block = s.blocks[static_cast<size_t>(pos / block_size_)];
    slots.push_back(block * block_size_ + pos % block_size_);
  }
  s.length = static_cast<int32_t>(new_length);
  return slots;
}

absl::Status BlockManager::Truncate(int64_t seq, int32_t length) {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return UnknownSequence(seq);
  Sequence& s = it->second;
  if (length < 0 || length > s.length) {
    return absl::InvalidArgumentError(
        kvpage::StrFormat("length must be in [0, %d] (the current length of seq_id %d), got %d",
                          s.length, seq, length));
  }
  const size_t keep = static_cast<size_t>(BlocksFor(length, block_size_));
  // Release from the end, so the stack's top is the earliest released block:
  // appending again gets the same blocks back in the same order.
  while (s.blocks.size() > keep) {
    const int32_t b = s.blocks.back();
    s.blocks.pop_back();
    if (--ref_counts_[b] == 0) free_blocks_.push_back(b);
  }
  s.length = length;
  return absl::OkStatus();
}

absl::Status BlockManager::Free(int64_t seq) {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return UnknownSequence(seq);
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (--ref_counts_[*b] == 0) free_blocks_.push_back(*b);
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> BlockManager::Length(int64_t seq) const {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return UnknownSequence(seq);
  return it->second.length;
}

absl::StatusOr<std::vector<int32_t>> BlockManager::Blocks(int64_t seq) const {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return UnknownSequence(seq);
  return it->second.blocks;
}

int32_t BlockManager::NumFreeBlocks() const {
  MutexLock lock(&mu_);
  return static_cast<int32_t>(free_blocks_.size());
}

int32_t BlockManager::RefCount(int32_t block) const {
  MutexLock lock(&mu_);
  if (block < 0 || block >= num_blocks_) return -1;
  return ref_counts_[block];
}

int64_t BlockManager::NumSequences() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(seqs_.size());
}

absl::Status BlockManager::ExportBlockTable(absl::Span<const int64_t> seqs,
                                            int32_t max_blocks_per_seq, int64_t row_stride,
                                            int32_t* table, int32_t* lens) const {
  if (max_blocks_per_seq < 0) {
    return absl::InvalidArgumentError(
        kvpage::StrFormat("max_blocks_per_seq must be >= 0, got %d", max_blocks_per_seq));
  }
  if (row_stride < max_blocks_per_seq) {
    return absl::InvalidArgumentError(kvpage::StrFormat(
        "row_stride must be >= max_blocks_per_seq (%d), got %d", max_blocks_per_seq, row_stride));
  }
  if (table == nullptr && !seqs.empty()) {
    return absl::InvalidArgumentError(
        kvpage::StrFormat("table must not be null when num_seqs > 0 (num_seqs = %d)", seqs.size()));
  }
  MutexLock lock(&mu_);
  // Every check comes before the first write: a failed export leaves the
  // caller's buffers untouched.
  std::vector<const Sequence*> found;
  found.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto it = seqs_.find(seqs[i]);
    if (it == seqs_.end()) {
      return absl::InvalidArgumentError(
          kvpage::StrFormat("seqs[%d]: seq_id %d does not exist", i, seqs[i]));
    }
    const size_t n = it->second.blocks.size();
    if (n > static_cast<size_t>(max_blocks_per_seq)) {
      return absl::InvalidArgumentError(
          kvpage::StrFormat("seq_id %d has %d blocks, more than max_blocks_per_seq = %d", seqs[i],
                            n, max_blocks_per_seq));
    }
    found.push_back(&it->second);
  }
  for (size_t i = 0; i < found.size(); ++i) {
    const std::vector<int32_t>& blocks = found[i]->blocks;
    int32_t* row = table + static_cast<int64_t>(i) * row_stride;
    std::copy(blocks.begin(), blocks.end(), row);
    std::fill(row + blocks.size(), row + max_blocks_per_seq, 0);
    if (lens != nullptr) lens[i] = found[i]->length;
  }
  return absl::OkStatus();
}

}  // namespace kvpage
