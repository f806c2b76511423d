// SPDX-License-Identifier: Apache-2.0
// The reduce kernel of the decode (flash-decoding's merge), launched after
// any partition kernel unless that kernel owns the output. Grid (num_q_heads
// / rows a block, query_len, num_seqs), a warp per query head
// (ReduceKernel): merges the ceil(seq_len / P) partitions (read on the
// device) with the max trick and writes out (FP32/FP16/BF16) and lse
// (natural log, FP32); a row with nothing visible gets zeros and -inf. A
// sequence whose partition kernel wrote its rows itself (direct output,
// partition_common.cuh PartitionWritesOutput) is left alone.
#ifndef KVPAGE_KERNELS_DECODE_REDUCE_CUH_
#define KVPAGE_KERNELS_DECODE_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/partition_common.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

// Grid (ceil(num_q_heads / kRows), query_len, num_seqs), one warp per query
// head: warp w of block x merges head x * kRows + w. A row's merge is a
// chain of latencies (the length, the grid wait, the partials, the stores)
// over a few KB, so what counts is how many chains run at once: one block
// per row (128 threads, two channels each) made two waves of blocks at B =
// 512, and its share of the decode was 6-8 us (docs/archive.md, "Reduce
// kernel and direct output"). A lane takes four channels at a time (16-byte loads).
template <int kRows>
__global__ void __launch_bounds__(32 * kRows)
    ReduceKernel(const __grid_constant__ DecodeParams p, const __grid_constant__ DecodePlan plan,
                 const __grid_constant__ DecodeWorkspace ws) {
  constexpr int kChunk = 256;           // partition weights staged at a time (per warp)
  constexpr int kQuads = 256 / 4 / 32;  // 4-channel groups per lane (D <= 256)
  __shared__ float w_s[kRows][kChunk];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int h = blockIdx.x * kRows + warp;
  const int i = blockIdx.y;
  const int s = blockIdx.z;
  const int D = p.geo.head_size;
  const int quads = D / 4;
  const int len = SequenceLength(p, s);
  const int nparts = PartitionCount(plan, len);
  const bool written = PartitionWritesOutput(plan, len);
  const int64_t base = PartialBase(p, plan, s, i, min(h, p.num_q_heads - 1));
  const int64_t row = int64_t{s} * p.query_len + i;
  // Everything above reads the caller's inputs, which were complete before
  // the partition kernel passed its own wait; the partials are its results.
  WaitForPrerequisiteGrid();
  AllowDependentGrid();
  if (written || h >= p.num_q_heads) return;  // by the sequence's one partition; no such head
  // out = acc / total (sum of the weights), lse = m + log(total); total >= 1
  // whenever anything was visible (the partition holding the maximum
  // contributes exp(0) * sum >= 1).
  auto store = [&](const float4(&acc)[kQuads], float total, float m) {
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const int64_t at = row * p.out_stride + int64_t{h} * D;
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) {
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 0, acc[k].x * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 1, acc[k].y * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 2, acc[k].z * inv);
        StoreFromFloat(p.out_dtype, p.out, at + 4 * q + 3, acc[k].w * inv);
      }
    }
    if (p.lse != nullptr && lane == 0) {
      p.lse[row * p.num_q_heads + h] = total > 0.0f ? m + logf(total) : -INFINITY;
    }
  };
  auto fma4 = [](float w, const float4& x, float4& a) {
    a.x = fmaf(w, x.x, a.x);
    a.y = fmaf(w, x.y, a.y);
    a.z = fmaf(w, x.z, a.z);
    a.w = fmaf(w, x.w, a.w);
  };
  float4 acc[kQuads];
#pragma unroll
  for (int k = 0; k < kQuads; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // A few partitions (small batches and short sequences): every input of
  // the merge is loaded at once, each lane taking all the maxima and sums
  // itself (broadcast loads) — one round of loads after the length. The
  // general path below takes three rounds.
  constexpr int kFew = 8;
  if (nparts <= kFew) {
    float pm[kFew], ps[kFew];
    float4 po[kFew][kQuads];
#pragma unroll
    for (int j = 0; j < kFew; ++j) {
      pm[j] = j < nparts ? ws.partial_max[base + j] : -INFINITY;
      ps[j] = j < nparts ? ws.partial_sum[base + j] : 0.0f;
#pragma unroll
      for (int k = 0; k < kQuads; ++k) {
        const int q = lane + 32 * k;
        po[j][k] = j < nparts && q < quads ? LoadFloat4(ws.partial_out + (base + j) * D + 4 * q)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kFew; ++j) m = fmaxf(m, pm[j]);
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < kFew; ++j) {
      // A partition with nothing visible for this row has max -inf, sum 0.
      const float w = pm[j] == -INFINITY ? 0.0f : ps[j] * __expf(pm[j] - m);
      total += w;
#pragma unroll
      for (int k = 0; k < kQuads; ++k) fma4(w, po[j][k], acc[k]);
    }
    store(acc, total, m);
    return;
  }

  float m = -INFINITY;
  for (int j = lane; j < nparts; j += 32) m = fmaxf(m, ws.partial_max[base + j]);
  m = WarpReduceMax(m);
  float wsum = 0.0f;
  for (int c0 = 0; c0 < nparts; c0 += kChunk) {
    const int n = min(kChunk, nparts - c0);
    __syncwarp();  // w_s of the previous chunk is consumed
    for (int j = lane; j < n; j += 32) {
      const float pm = ws.partial_max[base + c0 + j];
      // A partition with nothing visible for this row has max -inf, sum 0.
      const float w = pm == -INFINITY ? 0.0f : ws.partial_sum[base + c0 + j] * __expf(pm - m);
      w_s[warp][j] = w;
      wsum += w;
    }
    __syncwarp();
    const float* po = ws.partial_out + (base + c0) * D;
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) {
        float4 a = acc[k];
        for (int j = 0; j < n; ++j) fma4(w_s[warp][j], LoadFloat4(po + int64_t{j} * D + 4 * q), a);
        acc[k] = a;
      }
    }
  }
  store(acc, WarpReduceSum(wsum), m);
}

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_DECODE_REDUCE_CUH_
