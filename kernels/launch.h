// Host-callable launchers of the kernels: plain C++ declarations over the
// plain-data parameter blocks of src/params.h, so that src/ (compiled by the
// host compiler, no CUDA syntax) can call into the CUDA objects. Each
// returns a cudaError_t as int (cudaSuccess = 0): the launch's own error,
// from cudaGetLastError(). None allocates or synchronizes.
#ifndef KVPAGE_KERNELS_LAUNCH_H_
#define KVPAGE_KERNELS_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "src/geometry.h"
#include "src/params.h"

namespace kvpage {
namespace kernels {

// Fills dst[i] = seed * 2654435761 + i (mod 2^32) for i < n on `stream`.
// The toolchain probe: proves .cu files compile, link and run.
int LaunchFillPattern(uint32_t* dst, int64_t n, uint32_t seed, void* stream);
// Tests: sets the shared memory of every SM to 0xFF bytes (blocks of the
// largest size, on every SM), so that a kernel launched next that reads
// shared memory it did not write sees set bits, not a lucky zero.
int LaunchPoisonShared(void* stream);
// Tests: adds to *count the 32-bit words that are not all ones in the
// shared memory of 2 x SMs blocks of 48 KiB, read before any write (after
// LaunchPoisonShared: none, where the poison reaches what kernels see).
int LaunchCountUnpoisonedShared(unsigned int* count, void* stream);
// Tests: a producer that lets its programmatic dependent start at once
// (sm_90+) and only then, after spinning for `delay_ns`, copies `bytes`
// from src to dst on `stream`. A kernel launched next as a dependent reads
// dst's new bytes only if it waits for its prerequisite grid first.
int LaunchDelayedCopy(void* dst, const void* src, int64_t bytes, int64_t delay_ns, void* stream);

// Test support: counts where ScaleDivisor (kernels/common/quantize.cuh)
// and __fdiv_rn disagree on `stream`: counts[0] over every pair of an FP16
// scale significand and an FP32 value significand (2^33 pairs, bit for
// bit), counts[1] over `random_pairs` random scales and values of every
// exponent (by the quantizer's rules); counts[2] the pairs compared;
// counts[3] the constant divisors whose reciprocal is not RN(1 / d), the
// positive finite FP16 values whose HalfReciprocal is not __frcp_rn's, and
// where the scale ScaleUp makes of a division by a constant
// divisor (127, 448, 15) differs from that of __fdiv_rn, over every
// positive finite FP32 value, counts[4] the divisions compared. The
// counters are added to.
int LaunchScaleDivisionCheck(unsigned long long* counts, int64_t random_pairs, uint32_t seed,
                             void* stream);

// Quantize + scatter (WriteParams; pointers in device memory). Produces
// the same bytes as the CPU backend's write; -1 slots are skipped, slots
// out of range are skipped too (nothing is written for them). With
// `dependent` (sm_90+), the kernel is a programmatic dependent launch: its
// blocks may start while the stream's previous kernel drains, and wait on
// the device for it to complete before touching memory.
int LaunchCacheWrite(const WriteParams& params, bool dependent, void* stream);

// Copies blocks pairs[2i] -> pairs[2i+1] of every layer of the cache at
// `base`, data and scales, in one launch. `pairs` is in device memory, or,
// with pairs_on_host, in host memory: then the pairs travel in the kernel's
// parameters (a few launches for many pairs), so nothing is staged in
// device memory that another stream's copy could overwrite (copy-on-write
// inside kvp_seq_append runs on the caller's stream). Pairs out of range
// copy nothing; with `checked` (checked mode) the first is reported there.
int LaunchCopyBlocks(const CacheGeometry& geo, uint8_t* base, const int32_t* pairs,
                     int32_t num_pairs, bool pairs_on_host, DeviceErrorRecord* checked,
                     void* stream);

// Query heads a reduce block merges, a warp each: 1, or kReduceRowsMany
// once a decode has kReduceManyRows rows (sequences x query tokens x
// query heads). Measured (H100, docs/PERF_NOTES.md session 16): one a
// block was as fast as a block per row or faster at every batch; four a
// block another 1-2% faster for INT4 from 2,048 rows on, where most blocks
// have little to merge, and 4-5% slower for FP8 at 256-512 rows.
constexpr int kReduceRowsMany = 4;
constexpr int64_t kReduceManyRows = 2048;

// Decode: the partition kernel then the reduce kernel, both shaped by
// `shape` alone. Sequences/partitions past a sequence's length exit at once.
int LaunchDecode(const DecodeParams& params, const DecodeShape& shape,
                 const DecodeWorkspace& workspace, void* stream);

// Whether the tensor-core partition kernel exists for this geometry (K and
// V of one dtype, a head size it is built for).
bool TensorCoreDecodeSupports(const CacheGeometry& geo);

// Whether the decode runs the tensor-core partition kernel for `rows` query
// rows per KV head at capacity (num_q_heads / num_kv_heads * max_query_len):
// `path` forces one kernel (where it exists), kAuto picks from the
// measurements in docs/PERF_NOTES.md.
bool DecodeUsesTensorCores(const CacheGeometry& geo, int32_t rows, DecodePath path);

// The largest partition the host may pick for that kernel: the tensor-core
// kernel streams a partition fast enough that a longer one amortizes its
// per-block prologue (block ids, scale records, q operands) better; with a
// shared-memory ring (no per-token records staged) longer still.
int32_t MaxPartitionSize(const CacheGeometry& geo, bool tensor_cores);

// The longest third of the context the host may pick where it weighs
// thirds (PartitionStepTokens), which may exceed MaxPartitionSize: 16-bit
// caches halve up to 2048 tokens (4096 measured 5-13% slower, docs/
// PERF_NOTES.md session 24) but take 2752-token thirds of 8192; 0 elsewhere.
int32_t MaxThirdPartitionSize(const CacheGeometry& geo, bool tensor_cores);

// The step a third of the context is rounded up to where the host weighs
// thirds for that kernel (the tensor-core kernel with codes in registers:
// 32 tokens, one warp's step of 8-bit codes, two of 16-bit ones, since
// partition sizes are multiples of kPartitionTokenMultiple), or 0: halves
// only. Rounding to a
// step of all four warps (128) instead leaves no warp idle in a
// partition's last step but makes the thirds less even (8192 tokens:
// 2816 + 2816 + 2560 against 2752 + 2752 + 2688), which measured 0.1-0.4%
// slower for FP8 and INT8 at 128-512 sequences (docs/PERF_NOTES.md,
// session 18).
int32_t PartitionStepTokens(const CacheGeometry& geo, bool tensor_cores);

// Whether that kernel writes out and lse itself for a sequence shorter
// than one partition (DecodeShape::direct_output): the thread-group kernel
// and the tensor-core kernel with a ring do.
bool PartitionKernelWritesOutput(const CacheGeometry& geo, bool tensor_cores);

// Partition blocks one SM keeps resident for that kernel (its launch
// bounds): the host sizes partitions so that the grid fills whole waves.
int DecodeBlocksPerSm(const CacheGeometry& geo, int32_t rows, bool tensor_cores);

// The staged tensor-core kernel (kernels/tc_staged_decode.cuh, sm_90+;
// DecodeShape::staged): whether it exists for this geometry and `rows`
// query rows per KV head at capacity (16-bit K and V at block size 16,
// head size 128, up to 8 rows), its dynamic shared memory for a partition
// of `partition_size` tokens, its resident blocks per SM (also the wave
// model's slots), the longest partition the host picks for it, and the
// step a third of the context is rounded up to (a stage: 64 tokens).
bool StagedDecodeSupports(const CacheGeometry& geo, int32_t rows);
size_t StagedDecodeSharedBytes(const CacheGeometry& geo, int32_t partition_size);
int StagedDecodeBlocksPerSm();
int32_t StagedMaxPartitionSize();
int32_t StagedPartitionStepTokens();

// Blocks per SM the wave model counts as a wave's slots: the resident
// blocks, but one for the tensor-core kernel with a ring (INT4 at head size
// 128), where one block an SM streamed as fast as two and fewer, longer
// partitions won at small batches (H100, docs/PERF_NOTES.md session 11).
int DecodeWaveBlocksPerSm(const CacheGeometry& geo, int32_t rows, bool tensor_cores);

// Dynamic shared memory the chosen partition kernel needs for `rows` query
// rows per block (num_q_heads / num_kv_heads * max_query_len) and
// `partition_size` tokens; the host picks the largest partition size whose
// need fits the device's per-block limit. The launch raises the kernel's
// dynamic shared memory limit itself when the need exceeds 48 KiB.
size_t DecodeSharedBytes(const CacheGeometry& geo, int32_t rows, int32_t partition_size,
                         bool tensor_cores);

// For tests: how many bytes past a 128-byte boundary the decode kernels'
// dynamic shared memory starts (0 expected: kernels/paged_decode.cuh
// SharedWords), as a kernel with static shared memory of its own sees it,
// through *bytes; returns the CUDA error of the launch or copy.
int ProbeDecodeSmemMisalignment(uint32_t* bytes);

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_LAUNCH_H_
