// SPDX-License-Identifier: Apache-2.0
// Test-only kernels (tests/kernels/*.cu, the kvpage_test_kernels library):
// probes and helpers the GPU unit tests launch, kept out of libkvpage.so.
// Each returns a cudaError_t as int.
#ifndef KVPAGE_TESTS_KERNELS_TEST_KERNELS_H_
#define KVPAGE_TESTS_KERNELS_TEST_KERNELS_H_

#include <cstdint>

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

// How many bytes past a 128-byte boundary the decode kernels' dynamic
// shared memory starts (0 expected: kernels/partition_common.cuh SharedWords),
// as a kernel with static shared memory of its own sees it, through
// *bytes; returns the CUDA error of the launch or copy.
int ProbeDecodeSmemMisalignment(uint32_t* bytes);

// Test support (sm_90a): one warpgroup's S = Q Kᵀ and O = P V, P = S
// rounded to the input type, through kernels/common/wgmma.cuh. Device
// arrays, row-major 16-bit values (bf16: BF16, else FP16): q [64][128],
// k [64][128] (token x channel), v [128][64] (channel x token); s [64][64]
// and o [64][128] FP32.
int LaunchWgmmaTileCheck(bool bf16, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                         float* s, float* o, void* stream);

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_TESTS_KERNELS_TEST_KERNELS_H_
