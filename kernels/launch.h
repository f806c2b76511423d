// SPDX-License-Identifier: Apache-2.0
// Host-callable launchers of the kernels: plain C++ declarations over the
// plain-data parameter blocks of src/params.h, so that src/ (compiled by the
// host compiler, no CUDA syntax) can call into the CUDA objects. Each
// returns a cudaError_t as int (cudaSuccess = 0): the launch's own error,
// from cudaGetLastError(). None allocates or synchronizes.
#ifndef KVPAGE_KERNELS_LAUNCH_H_
#define KVPAGE_KERNELS_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/decode_traits.h"
#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {

// Quantize + scatter (WriteParams; pointers in device memory). Produces
// the same bytes as the CPU backend's write; -1 slots are skipped, slots
// out of range are skipped too (nothing is written for them). With
// `dependent` (sm_90+), the kernel is a programmatic dependent launch: its
// blocks may start while the stream's previous kernel drains, and wait on
// the device for it to complete before touching memory.
int LaunchCacheWrite(const WriteParams& params, bool dependent, void* stream);

// Moves whole blocks (BlockMoveParams, src/params.h), data and scales, in
// one launch: copies within the cache (kCopy), packs into a buffer (kPack)
// or unpacks from one (kUnpack). `ids` is in device memory, or, with
// ids_on_host (kCopy), in host memory: then the pairs travel in the
// kernel's parameters (a few launches for many pairs), so nothing is
// staged in device memory that another stream's copy could overwrite
// (copy-on-write inside kvp_seq_append runs on the caller's stream). Ids
// out of range move nothing; with `checked` (checked mode) the first is
// reported there, and so is an unpack destination listed twice. A region
// or buffer not 16-byte aligned is refused (cudaErrorInvalidValue, nothing
// launched): the supported geometries never have one.
int LaunchMoveBlocks(const BlockMoveParams& params, void* stream);

// Query heads a reduce block merges, a warp each: 1, or kReduceRowsMany
// once a decode has kReduceManyRows rows (sequences x query tokens x query
// heads), where most blocks have little to merge (docs/DESIGN.md, "Reduce").
constexpr int kReduceRowsMany = 4;
constexpr int64_t kReduceManyRows = 2048;

// Decode: the plan's partition kernel, then the reduce kernel unless the
// partition kernel owns the output; shaped by `plan` alone (src/
// decode_plan.h). Partitions past a sequence's length exit at once. A plan
// this build cannot run is refused (cudaErrorInvalidValue), launching
// nothing.
int LaunchDecode(const DecodeParams& params, const DecodePlan& plan,
                 const DecodeWorkspace& workspace, void* stream);

// kvp_attend (params.query_starts set): the schedule kernel, the
// attention kernel of the cache's K/V sides and head size, and the merge
// kernel of split tiles; shaped by `plan` alone (src/decode_plan.h). A plan
// this build cannot run is refused (cudaErrorInvalidValue), launching
// nothing.
int LaunchAttend(const DecodeParams& params, const AttendPlan& plan,
                 const AttendWorkspace& workspace, void* stream);

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_LAUNCH_H_
