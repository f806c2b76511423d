// SPDX-License-Identifier: Apache-2.0
// Warp-level tensor-core primitives of the tensor-core decode
// (tc_decode.cuh): the m16n8k16 MMA with FP32 accumulation, the 8x8
// transpose that turns an accumulator fragment into an operand fragment,
// and the FP32 -> FP16/BF16 pair packing. Fragment layouts are PTX's
// (lane = 4 * group + thread_in_group):
//   A (16x16, row-major): a[0] = (row g,   cols 2t, 2t+1), a[1] = (row g+8, 2t,
//   2t+1),
//                         a[2] = (row g,   cols 2t+8, 2t+9), a[3] = (row g+8,
//                         2t+8, 2t+9)
//   B (16x8):             b[0] = (rows 2t, 2t+1, col g), b[1] = (rows 2t+8,
//   2t+9, col g) C (16x8, FP32):       c[0..1] = (row g, cols 2t, 2t+1),
//   c[2..3] = (row g+8, 2t, 2t+1)
#ifndef KVPAGE_KERNELS_COMMON_MMA_CUH_
#define KVPAGE_KERNELS_COMMON_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/dequant.cuh"

namespace kvpage {
namespace kernels {

// c += A * B, FP16 (kBf16: BF16) inputs, FP32 accumulators (sm_80+).
template <bool kBf16>
__device__ __forceinline__ void MmaM16N8K16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The 8x8 matrix of 16-bit values the warp holds one pair per lane (lane
// 4g + t: row g, cols 2t, 2t+1), transposed: lane 4g + t gets (row 2t, col
// g), (row 2t+1, col g). An accumulator half c[0..1] packed to 16 bits is
// such a matrix; its transpose is a B operand half (sm_75+).
__device__ __forceinline__ uint32_t TransposeM8N8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Four 8x8 matrices of 16-bit values from shared memory, one register each,
// laid out as TransposeM8N8's input: lane l names row l % 8 of matrix l / 8
// (16 contiguous bytes at `row_address`, a shared-space address). With
// matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols
// 8-15), (rows 8-15, cols 8-15) of a 16x16 tile, the registers are that
// tile's A operand of MmaM16N8K16 (sm_75+).
__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], uint32_t row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_address));
}

// Two floats rounded to nearest-even FP16 (kBf16: BF16), `lo` in the low
// half: one cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32.
template <bool kBf16>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The two values of a pair back as floats (exact).
template <bool kBf16>
__device__ __forceinline__ float2 UnpackPair(uint32_t x) {
  float f[2];
  if constexpr (kBf16) {
    dequant_detail::Bf16x2ToFloat(x, f);
  } else {
    dequant_detail::Fp16x2ToFloat(x, f);
  }
  return make_float2(f[0], f[1]);
}

}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_COMMON_MMA_CUH_
