// SPDX-License-Identifier: Apache-2.0
// Plain parameter blocks of the cache operations, built on the host and
// handed to a backend (and, for CUDA, to the kernels by value). Pointers
// are in the cache's memory space.
#ifndef KVPAGE_SRC_PARAMS_H_
#define KVPAGE_SRC_PARAMS_H_

#include <cstddef>
#include <cstdint>

#include "src/geometry.h"

namespace kvpage {

// Checked mode (kvp_cache_config.checked): what a kernel found wrong in the
// data it was handed on the device, first violation only. The record lives
// in host-mapped memory, so the host reads it at the next API call without
// synchronizing; a kernel claims it, fills it, then publishes `fault`.
enum class DeviceFault : uint32_t {
  kNone = 0,
  kSlotOutOfRange = 1,        // write: slot_mapping[where] = value, not in [-1, limit)
  kSeqLenOutOfRange = 2,      // decode: seq_lens[where] = value, not in [0, limit]
  kBlockIdOutOfRange = 3,     // decode: a block id of table row `where` = value, not in [0, limit)
  kCopyPairOutOfRange = 4,    // copy: a block id of pair `where` = value, not in [0, limit)
  kQueryStartOutOfRange = 5,  // attend: query_starts[where] = value, not in [previous, limit]
  kQueryPastContext = 6,      // attend: sequence `where` has value query tokens > seq_lens = limit
  kPackBlockOutOfRange = 7,   // pack/unpack: block_ids[where] = value, not in [0, limit)
  kUnpackBlockRepeated = 8    // unpack: block_ids[where] = value = block_ids[limit], limit < where
};

struct DeviceErrorRecord {
  uint32_t fault;  // DeviceFault; 0 until published
  uint32_t claim;  // 0 until a kernel claims the record
  int64_t where;
  int64_t value;
  int64_t limit;
};

// Write counters as the backends keep them (device memory for CUDA).
struct WriteCounters {
  unsigned long long non_finite;
  unsigned long long saturated;
};

// Store num_tokens tokens of one layer through a slot mapping.
struct WriteParams {
  CacheGeometry geo;
  uint8_t* layer;     // base of the layer's region
  DType input_dtype;  // FP32, FP16 or BF16
  int32_t num_tokens;
  const void* key;  // [t * key_stride + h * head_size + d]
  const void* value;
  int64_t key_stride;  // elements between tokens
  int64_t value_stride;
  const int64_t* slot_mapping;  // -1 = skip
  const float* key_smoothing;   // [num_kv_heads * head_size] or null
  WriteCounters* counters;
  DeviceErrorRecord* checked;  // checked mode: report bad slots here; else null
};

// What a block move does (Backend::MoveBlocks).
enum class BlockMove : int32_t {
  kCopy = 0,    // block ids[2i] -> block ids[2i + 1] within the cache
  kPack = 1,    // block ids[i] of the cache -> the packed buffer
  kUnpack = 2,  // the packed buffer -> block ids[i] of the cache
};

// Whole blocks (every region: data and scales) of a range of layers, moved
// within a cache (copy-on-write, kvp_cache_copy_blocks) or between a cache
// and a packed buffer (kvp_cache_pack / kvp_cache_unpack; layout:
// CacheGeometry::packed_block_bytes). Ids are not validated here: the
// CPU backend's caller checks them on the host; the CUDA kernel skips ids
// out of range and reports them to `checked`.
struct BlockMoveParams {
  CacheGeometry geo;
  uint8_t* cache;  // layer 0 of the cache
  BlockMove move;
  int32_t first_layer;
  int32_t num_layers;
  const int32_t* ids;  // kCopy: pairs [2 * num_items]; else block ids [num_items]
  int32_t num_items;
  bool ids_on_host;            // ids in host memory (kCopy only: copy-on-write's pairs)
  uint8_t* buffer;             // kPack, kUnpack: 16-byte aligned, num_layers * num_items blocks
  DeviceErrorRecord* checked;  // checked mode: report bad ids here; else null
};

// Where item `item` of a block move reads and writes its bytes of region
// r in layer `layer` of the range (0 = first_layer): the cache's block `id`
// (for kCopy the pair's source; `dst` its destination) and, packing or
// unpacking, the item's place in the buffer. Both backends move through it.
struct BlockMoveEnds {
  const uint8_t* from;
  uint8_t* to;
};
KVP_HOST_DEVICE inline BlockMoveEnds BlockMoveRegion(const BlockMoveParams& p, int32_t layer, int r,
                                                     int64_t item, int32_t id, int32_t dst) {
  const CacheGeometry::BlockRegion region = p.geo.block_region(r);
  uint8_t* const cache =
      p.cache + (int64_t{p.first_layer} + layer) * p.geo.layer_bytes() + region.offset;
  if (p.move == BlockMove::kCopy) {
    return {cache + id * region.block_stride, cache + dst * region.block_stride};
  }
  const int64_t n = p.num_items;
  uint8_t* const packed = p.buffer + layer * n * p.geo.packed_block_bytes() +
                          p.geo.packed_region_offset(r, n) + item * region.block_stride;
  uint8_t* const block = cache + id * region.block_stride;
  return p.move == BlockMove::kPack ? BlockMoveEnds{block, packed} : BlockMoveEnds{packed, block};
}

// Attention over one layer (semantics: kvp_decode and kvp_attend in
// kvpage.h). Sequence s owns query tokens query_starts[s] ..
// query_starts[s + 1] - 1 (kvp_attend), or, with query_starts null,
// s * query_len .. (s + 1) * query_len - 1 (kvp_decode); q, out and lse are
// indexed by that token number either way.
struct DecodeParams {
  CacheGeometry geo;
  const uint8_t* layer;
  int32_t num_seqs;
  int32_t query_len;            // kvp_decode; 0 with query_starts
  const int32_t* query_starts;  // kvp_attend: [num_seqs + 1]; else null
  int32_t max_query_tokens;     // capacity of the decoder (kvp_attend)
  int32_t num_q_heads;
  int32_t max_context_len;  // capacity of the decoder
  DType q_dtype;
  DType out_dtype;
  const void* q;
  int64_t q_stride;  // elements between query tokens
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t block_table_width;
  const int32_t* seq_lens;
  const float* alibi_slopes;   // [num_q_heads] or null
  const float* key_smoothing;  // [num_kv_heads * head_size] or null
  int32_t sliding_window;      // 0 = off
  float sm_scale;              // resolved (never 0)
  float logits_soft_cap;       // 0 = off
  void* out;
  int64_t out_stride;          // elements between query tokens
  float* lse;                  // [query token][num_q_heads] or null
  DeviceErrorRecord* checked;  // checked mode: validate lengths and block ids; else null
};

// Which partition kernel a CUDA decode may run, as a tuning override
// (DecodeTuning::path, src/decode_plan.h): kAuto lets the plan choose; tests
// and comparisons force one family or the other.
enum class DecodePath : int32_t { kAuto = 0, kThreadGroup = 1, kTensorCore = 2 };

// The partition kernel a decode runs, one per mechanism (docs/DESIGN.md,
// "Decode kernels"):
//   kThreadGroup         CUDA cores, any dtypes and block size (paged_decode.cuh);
//   kTensorCoreRegisters mma.sync, codes loaded into registers a step ahead;
//   kTensorCoreRing      mma.sync, codes through a per-warp cp.async ring
//                        (tc_decode.cuh; which of the two is fixed by
//                        TcRingStages for the dtype and head size);
//   kTensorCoreStaged    mma.sync fed by a producer warp's bulk copies into
//                        shared-memory stages (tc_staged_decode.cuh, sm_90+).
enum class DecodeKernel : int32_t {
  kThreadGroup = 0,
  kTensorCoreRegisters = 1,
  kTensorCoreRing = 2,
  kTensorCoreStaged = 3,
};

// Split-K partition sizes are multiples of this many tokens (the kernels'
// steps and spans divide it).
constexpr int32_t kPartitionTokenMultiple = 32;

// The plan of a decode (PlanDecode, src/decode_plan.h): the kernel and its
// launch shape, fixed by the decoder's capacities and the device when it is
// created, never by a batch's lengths. The partition kernel's grid is
// (max_partitions, num_kv_heads, the call's num_seqs), of `threads` threads;
// the reduce kernel follows unless the partition kernel owns the output.
struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::kThreadGroup;
  int32_t threads = 0;  // the partition kernel's block size
  int32_t max_num_seqs = 0;
  int32_t max_query_len = 1;
  int32_t partition_size = 0;  // tokens per split-K partition (kPartitionTokenMultiple)
  int32_t max_partitions = 0;  // ceil(max_context_len / partition_size)
  // The partition kernel writes out and lse itself for a sequence shorter
  // than one partition, which the reduce kernel then skips (kernels whose
  // traits say writes_output). With one partition a sequence
  // (max_partitions == 1) it writes every row, empty sequences' too, and
  // the reduce kernel is not launched.
  bool direct_output = false;
  // Programmatic dependent launches (sm_90+): the partition kernel of the
  // stream's previous kernel, the reduce kernel of the partition kernel.
  // Each one's blocks start while its predecessor drains and wait on the
  // device before touching what it writes.
  bool dependent_launch = false;
  // The tensor-core register path has L2 fetch the K (V) blocks of the
  // step this many steps ahead of the one it computes (0: none).
  int32_t prefetch_k_steps = 0;
  int32_t prefetch_v_steps = 0;
};

// Split-K scratch, carved from the decoder's workspace (all FP32):
//   partial_out [max_num_seqs][max_query_len][num_q_heads][max_partitions][head_size]
//   partial_max [max_num_seqs][max_query_len][num_q_heads][max_partitions]
//   partial_sum [same]
// partial_out holds the partition's softmax-normalized output, partial_max
// its largest logit and partial_sum sum(exp(logit - partial_max)).
struct DecodeWorkspace {
  float* partial_out = nullptr;
  float* partial_max = nullptr;
  float* partial_sum = nullptr;
};

// ---- Attention over query chunks (kvp_attend) ---------------------------------------------

// The plan of kvp_attend's launches (PlanAttend, src/decode_plan.h), fixed
// by the decoder's capacities and the device, never by a batch: a schedule
// kernel turns the batch's lengths into work items on the device, the
// attention kernel runs one block per work item and KV head, and a merge
// kernel combines the items of tiles whose context was split
// (docs/DESIGN.md, "Attention over query chunks").
struct AttendPlan {
  int32_t mainloop = 0;     // kernels::AttendMainloop (kernels/attend_traits.h)
  int32_t tile_rows = 0;    // query rows (token x query head of a group) a block serves
  int32_t tile_tokens = 0;  // KV tokens per mainloop step
  int32_t threads = 0;
  size_t shared_bytes = 0;
  // Query tiles a batch within the capacities can have, per KV head:
  // ceil(max_query_tokens * group / tile_rows) plus one partial tile per
  // sequence.
  int32_t max_tiles = 0;
  // Work items per KV head the schedule aims at when a batch has fewer
  // tiles than that (few long contexts, short chunks): it splits each
  // tile's context into equal spans of at least min_split_tokens, so that
  // the items fill the GPU; 0 = never split. The split items' partial
  // results need split_items slots.
  int32_t split_items = 0;
  int32_t min_split_tokens = 0;
  int32_t max_items = 0;  // max(max_tiles, split_items): the attention grid's x
  // Decode rows (sequences with one query token) run the decode kernel of
  // decode_rows_plan (PlanDecode at one query token a sequence) instead of
  // query tiles: the schedule launch gathers their queries into the
  // workspace, the decode writes their results there, and a scatter kernel
  // moves them to out and lse.
  bool decode_rows = false;
  DecodePlan decode_rows_plan;
};

// One work item: the query tile `tile` of sequence `seq` (its packed rows
// tile * tile_rows .., row = query token * group + query head in the
// group) over the KV tokens [kv_begin, kv_end), with the sequence's query
// tokens and context as the schedule checked them. An item of a split tile
// (split_slot >= 0) writes its partial result to that slot of the
// workspace; else it writes out and lse.
struct AttendWorkItem {
  int32_t seq;
  int32_t tile;
  int32_t kv_begin;
  int32_t kv_end;
  int32_t split_slot;
  int32_t query_start;
  int32_t query_count;
  int32_t context;
};

// A split tile: its items are split_slot first_slot .. first_slot +
// num_splits - 1, in KV order.
struct AttendMerge {
  int32_t seq;
  int32_t tile;
  int32_t first_slot;
  int32_t num_splits;
};

// kvp_attend's scratch, carved from the decoder's workspace:
//   counts        [2]: work items, merges (written by the schedule kernel)
//   items         [max_items]
//   merges        [split_items]
//   partial_out   [split_items][num_kv_heads][tile_rows][head_size] FP32
//   partial_lse   [split_items][num_kv_heads][tile_rows] FP32
struct AttendWorkspace {
  int32_t* counts = nullptr;
  AttendWorkItem* items = nullptr;
  AttendMerge* merges = nullptr;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  // Decode rows (AttendPlan::decode_rows), by sequence: the context of a
  // decode row, else 0 [max_num_seqs]; its query [max_num_seqs][num_q_heads
  // * head_size] in the call's q dtype, its output likewise in the out
  // dtype, its lse [max_num_seqs][num_q_heads]; the decode's split-K
  // scratch.
  int32_t* decode_lens = nullptr;
  void* decode_q = nullptr;
  void* decode_out = nullptr;
  float* decode_lse = nullptr;
  DecodeWorkspace decode;
};

}  // namespace kvpage

#endif  // KVPAGE_SRC_PARAMS_H_
