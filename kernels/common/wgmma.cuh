// SPDX-License-Identifier: Apache-2.0
// Warpgroup tensor-core primitives of sm_90a (wgmma), for the Hopper
// mainloop of the query-chunk attention (kernels/varlen_attention.cuh):
// shared-memory matrix descriptors of 128-byte-swizzled K-major tiles, the
// m64nNk16 products with FP32 accumulators (A from shared memory or from
// registers, B from shared memory) and the fences around them. A
// warpgroup is 4 consecutive warps starting at a warp index divisible by
// 4; every wrapper is issued by all of its 128 threads.
//
// Accumulators (float d[N / 8][4] a thread) are laid out as N / 8
// m16n8 C fragments of the warp's 16 rows (warp w % 4 of the warpgroup
// owns rows 16 (w % 4) .. + 15 of the 64): d[n][0..1] = (row g, cols 8n +
// 2t, + 1), d[n][2..3] = (row g + 8, same cols), lane = 4g + t. An A
// operand from registers is the m16n8k16 A fragment of the warp's rows
// (kernels/common/mma.cuh), so P leaves the S accumulators without a
// shuffle.
//
// Tiles: a K-major tile of R rows x C 16-bit columns (C a multiple of 64)
// is stored as C / 64 column panels of R rows x 128 bytes, each 1024-byte
// aligned; the 16-byte unit u of row r sits at unit u ^ (r % 8) (the
// hardware's 128-byte swizzle). SwizzledIndex gives an element's place;
// a descriptor names an 8-row-aligned row and a 16-column-aligned column
// by their unswizzled address (the k-steps of a panel advance its start by
// 32 bytes).
#ifndef KVPAGE_KERNELS_COMMON_WGMMA_CUH_
#define KVPAGE_KERNELS_COMMON_WGMMA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

// wgmma exists on sm_90a alone; elsewhere the wrappers trap (the plan never
// picks the Hopper mainloop there).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVPAGE_HAS_WGMMA 1
#else
#define KVPAGE_HAS_WGMMA 0
#endif

namespace kvpage {
namespace kernels {

// Element index of (row r, column c) in a swizzled K-major tile of `rows`
// rows (see above).
__host__ __device__ __forceinline__ constexpr int SwizzledIndex(int rows, int r, int c) {
  return (c / 64) * rows * 64 + r * 64 + ((((c % 64) / 8) ^ (r % 8)) * 8) + c % 8;
}

// The descriptor of the K-major, 128-byte-swizzled operand starting at
// shared address `address` (its row 8-aligned within a 1024-byte-aligned
// panel): leading offset unused by swizzled K-major layouts (1), stride
// between 8-row groups 1024 bytes, swizzle mode 1 (128 bytes).
__device__ __forceinline__ uint64_t WgmmaDescriptor(uint32_t address) {
  return (uint64_t{(address & 0x3FFFFu) >> 4}) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Orders this thread's earlier register writes (accumulators, A operands)
// before the warpgroup's next products.
__device__ __forceinline__ void WgmmaFence() {
#if KVPAGE_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if KVPAGE_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if KVPAGE_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Makes this thread's generic-proxy writes to shared memory (stores,
// cp.async) visible to the async proxy the products read through; a
// barrier after it publishes them to the warpgroup.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if KVPAGE_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of `d` across the products that
// own it between WgmmaFence and WgmmaWait.
template <int kN>
__device__ __forceinline__ void WgmmaPin(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
  }
}

// The accumulator operands of an m64n64 product: 32 registers a thread.
#define KVPAGE_WGMMA_D64                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define KVPAGE_WGMMA_D64_OPERANDS(d)                                                            \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])

// The accumulator operands of an m64n128 product: 64 registers a thread.
#define KVPAGE_WGMMA_D128                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}, "
#define KVPAGE_WGMMA_D128_OPERANDS(d)                                                             \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),       \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),   \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),   \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),   \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),   \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),   \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),             \
      "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),             \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),             \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3])

// One product: the instruction's shape and types, its accumulator list,
// the numbers of the operands after the accumulators, the accumulator
// constraints (variadic: they hold commas).
#define KVPAGE_WGMMA_SS(INSTR, ACC, A, B, P, ...)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\nwgmma.mma_async.sync.aligned." INSTR \
               " " ACC "%" A ", %" B ", p, 1, 1, 0, 0;\n}\n"                                      \
               : __VA_ARGS__                                                                      \
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)))
#define KVPAGE_WGMMA_RS(INSTR, ACC, A0, A1, A2, A3, B, P, ...)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\nwgmma.mma_async.sync.aligned." INSTR \
               " " ACC "{%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 0;\n}\n"           \
               : __VA_ARGS__                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),                              \
                 "r"(static_cast<int>(accumulate)))

// d (+)= A * B over k = 16, m = 64, n = kN (64 or 128); FP16 inputs
// (kBf16: BF16), FP32 accumulators; `accumulate` false starts d at the
// product. SS: A and B are descriptors.
template <int kN, bool kBf16>
__device__ __forceinline__ void WgmmaM64K16(float (&d)[kN / 8][4], uint64_t a, uint64_t b,
                                            bool accumulate) {
  static_assert(kN == 64 || kN == 128, "m64n64k16 and m64n128k16 are wrapped");
#if KVPAGE_HAS_WGMMA
  if constexpr (kN == 64 && kBf16) {
    KVPAGE_WGMMA_SS("m64n64k16.f32.bf16.bf16", KVPAGE_WGMMA_D64, "32", "33", "34",
                    KVPAGE_WGMMA_D64_OPERANDS(d));
  } else if constexpr (kN == 64) {
    KVPAGE_WGMMA_SS("m64n64k16.f32.f16.f16", KVPAGE_WGMMA_D64, "32", "33", "34",
                    KVPAGE_WGMMA_D64_OPERANDS(d));
  } else if constexpr (kBf16) {
    KVPAGE_WGMMA_SS("m64n128k16.f32.bf16.bf16", KVPAGE_WGMMA_D128, "64", "65", "66",
                    KVPAGE_WGMMA_D128_OPERANDS(d));
  } else {
    KVPAGE_WGMMA_SS("m64n128k16.f32.f16.f16", KVPAGE_WGMMA_D128, "64", "65", "66",
                    KVPAGE_WGMMA_D128_OPERANDS(d));
  }
#else
  __trap();
#endif
}

// RS: A from registers (the warp's m16n8k16 A fragment), B a descriptor.
template <int kN, bool kBf16>
__device__ __forceinline__ void WgmmaM64K16(float (&d)[kN / 8][4], const uint32_t (&a)[4],
                                            uint64_t b, bool accumulate) {
  static_assert(kN == 64 || kN == 128, "m64n64k16 and m64n128k16 are wrapped");
#if KVPAGE_HAS_WGMMA
  if constexpr (kN == 64 && kBf16) {
    KVPAGE_WGMMA_RS("m64n64k16.f32.bf16.bf16", KVPAGE_WGMMA_D64, "32", "33", "34", "35", "36", "37",
                    KVPAGE_WGMMA_D64_OPERANDS(d));
  } else if constexpr (kN == 64) {
    KVPAGE_WGMMA_RS("m64n64k16.f32.f16.f16", KVPAGE_WGMMA_D64, "32", "33", "34", "35", "36", "37",
                    KVPAGE_WGMMA_D64_OPERANDS(d));
  } else if constexpr (kBf16) {
    KVPAGE_WGMMA_RS("m64n128k16.f32.bf16.bf16", KVPAGE_WGMMA_D128, "64", "65", "66", "67", "68",
                    "69", KVPAGE_WGMMA_D128_OPERANDS(d));
  } else {
    KVPAGE_WGMMA_RS("m64n128k16.f32.f16.f16", KVPAGE_WGMMA_D128, "64", "65", "66", "67", "68", "69",
                    KVPAGE_WGMMA_D128_OPERANDS(d));
  }
#else
  __trap();
#endif
}

#undef KVPAGE_WGMMA_SS
#undef KVPAGE_WGMMA_RS
#undef KVPAGE_WGMMA_D64
#undef KVPAGE_WGMMA_D64_OPERANDS
#undef KVPAGE_WGMMA_D128
#undef KVPAGE_WGMMA_D128_OPERANDS

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_WGMMA_CUH_
