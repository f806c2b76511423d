// SPDX-License-Identifier: Apache-2.0
// The logit rules of the decode, defined once for every partition kernel:
// the logit scale (sm_scale, divided by the soft-cap where there is one:
// the scaled logit is divided by cap before tanh), the soft-cap, ALiBi
// (added after the cap, as CpuBackend::Decode does) and the masks (the
// causal cut of each query token, the sliding window, the sequence end).
// The thread-group kernel (paged_decode.cuh) applies them in natural-log
// units (LogitQScale, WindowStart, SoftCap, AddAlibi); the tensor-core
// kernels (tc_register_decode.cuh, tc_ring_decode.cuh,
// tc_staged_decode.cuh) in log2 units, one step of a warp at a time, each
// step compiled for two variants, as FlashInfer's attention/variants.cuh
// makes its logit transform and mask a compile-time type:
//   - UnmaskedLogits: every token of the step is before the sequence end
//     and seen by every row, there is no soft-cap or ALiBi, the logit
//     scale is positive. Such a step carries no mask, no guard and no
//     per-logit scale: the row's factor rides on the row maximum and on
//     the FFMA before EX2 (one FMUL less a logit).
//   - MaskedLogits: everything else; the soft-cap and ALiBi are run-time
//     values there (per-option kernels would multiply the instantiations
//     for steps that are mostly a partition's edges).
// LogitRules::Unmasked picks a step's variant at run time, so the
// unmasked steps, the bulk of a long partition, stay a separate
// instantiation of each step. These helpers compile to the code the
// kernels had with the rules written inline (docs/DESIGN.md, "Changing a
// kernel", says what that takes).
#ifndef KVPAGE_KERNELS_LOGIT_VARIANTS_CUH_
#define KVPAGE_KERNELS_LOGIT_VARIANTS_CUH_

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/common/log2_units.cuh"
#include "kernels/partition_common.cuh"
#include "src/params.h"

namespace kvpage {
namespace kernels {
namespace decode {

// ---- The rules in natural-log units --------------------------------------------------------

// What q is scaled by: sm_scale, or with a soft-cap sm_scale / cap.
__device__ __forceinline__ float LogitQScale(const DecodeParams& p) {
  return p.logits_soft_cap > 0.0f ? p.sm_scale / p.logits_soft_cap : p.sm_scale;
}

// The first token a query row at position `pos` sees (sliding window).
__device__ __forceinline__ int WindowStart(const DecodeParams& p, int pos) {
  return p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
}

// The soft-cap of a scaled logit l (q carries 1 / cap): cap * tanh(l).
__device__ __forceinline__ float SoftCap(float l, float cap) {
  if (cap > 0.0f) l = cap * tanhf(l);
  return l;
}

// ALiBi: l + slope * (t - pos) for token t of a row at position pos. The
// slope is read only with ALiBi on (a reference, so that a caller's shared
// or global slope is not loaded otherwise).
__device__ __forceinline__ float AddAlibi(float l, bool alibi, const float& slope, int t, int pos) {
  if (alibi) l = fmaf(slope, static_cast<float>(t - pos), l);
  return l;
}

// ---- The rules of a partition and of a row (tensor-core kernels) ---------------------------

// What a partition's logits obey: the soft-cap `cap`, the logit scale
// `q_scale` (LogitQScale), ALiBi, `plain` (neither ALiBi nor soft-cap),
// the last token query token 0 sees (`pos0`, in the sequence: query token
// i sees up to pos0 + i), and the partition tokens every row sees whole
// (no window or causal cut): [vis_lo, vis_hi].
struct LogitRules {
  float cap, q_scale;
  bool alibi, plain;
  int pos0;
  int vis_lo, vis_hi;

  // Whether the `tokens` partition tokens from s0 (n_valid: the partition's
  // tokens before the sequence end) take UnmaskedLogits. (Bitwise ands: a
  // short-circuit chain returned from here keeps its branches. s0 by
  // reference, as the mainloops keep it: as a value the comparison with
  // vis_lo turns round.)
  __device__ __forceinline__ bool Unmasked(const int& s0, int tokens, int n_valid) const {
    return plain & (q_scale > 0.0f) & (s0 + tokens <= n_valid) & (s0 >= vis_lo) &
           (s0 + tokens - 1 <= vis_hi);
  }
};
// (qlen: p.query_len, as the caller loaded it.)
__device__ __forceinline__ LogitRules MakeLogitRules(const DecodeParams& p,
                                                     const PartitionState& st, int qlen) {
  LogitRules r;
  r.cap = p.logits_soft_cap;
  r.q_scale = LogitQScale(p);
  r.alibi = p.alibi_slopes != nullptr;
  r.plain = !r.alibi && !(r.cap > 0.0f);
  // Every row sees up to pos0; the last row's window starts last.
  r.pos0 = st.len - qlen;
  r.vis_hi = r.pos0 - st.start;
  r.vis_lo = (p.sliding_window > 0 ? max(0, st.len - p.sliding_window) : 0) - st.start;
  return r;
}

// What the masks need of query row row0 + i of the partition: its last
// visible token `pos` (-1: a padding row sees nothing), its first `lo`
// (sliding window), its ALiBi slope. (The row is formed here, so that
// its comparison with st.rows keeps its operands' order.)
struct RowMask {
  int pos, lo;
  float slope;
};
__device__ __forceinline__ RowMask MakeRowMask(const DecodeParams& p, const PartitionState& st,
                                               const LogitRules& r, int qlen, int row0, int i) {
  const int row = row0 + i;
  const int gi = row / qlen;
  const int qi = row - gi * qlen;  // the row's query token
  const bool live = row < st.rows;
  const int pos = r.pos0 + qi;
  RowMask m;
  m.pos = live ? pos : -1;
  m.lo = WindowStart(p, pos);
  m.slope = (r.alibi && live) ? p.alibi_slopes[st.kvh * st.group + gi] : 0.0f;
  return m;
}

// A logit y (log2 units, the row's factor applied) of token t through the
// soft-cap and ALiBi.
__device__ __forceinline__ float CapAndAlibiLog2(float y, const LogitRules& r, const RowMask& m,
                                                 int t) {
  if (!r.plain) {
    float l = y * kLn2;
    l = SoftCap(l, r.cap);
    l = AddAlibi(l, r.alibi, m.slope, t, m.pos);
    y = l * kLog2e;
  }
  return y;
}

// CapAndAlibiLog2 and the row's mask (`in`: t is before the sequence end):
// -inf where the row does not see t. (TcPass::Logits writes the mask's
// test beside `in`'s other use, where it compiles to the code it had.)
__device__ __forceinline__ float MaskedLogit(float y, const LogitRules& r, const RowMask& m, int t,
                                             bool in) {
  y = CapAndAlibiLog2(y, r, m, t);
  const bool visible = in && t >= m.lo && t <= m.pos;
  return visible ? y : -INFINITY;
}

// ---- The compile-time variants of a step ---------------------------------------------------

// A step's logit y is a token's product q.k times its K scale: masked,
// MaskedLogit of rfac * y (log2 units, the row's factor `rfac` applied);
// unmasked, y itself, rfac applied in RowMax and Prob. m: a row maximum.
template <bool kMasked_>
struct LogitVariant {
  static constexpr bool kMasked = kMasked_;
  // The row maximum (log2 units) of the step's logits' maximum m.
  __device__ __forceinline__ static float RowMax(float m, float rfac) {
    if constexpr (kMasked) {
      return m;
    } else {
      return m * rfac;
    }
  }
  // exp of a kept logit y against the running maximum m. A masked logit is
  // -inf; so may the maximum be (nothing seen yet): -inf - -inf must give
  // 0, not NaN.
  __device__ __forceinline__ static float Prob(float y, float rfac, float m) {
    if constexpr (kMasked) {
      return y == -INFINITY ? 0.0f : Exp2(y - m);
    } else {
      return Exp2(fmaf(y, rfac, -m));
    }
  }
};
using UnmaskedLogits = LogitVariant<false>;
using MaskedLogits = LogitVariant<true>;

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage

#endif  // KVPAGE_KERNELS_LOGIT_VARIANTS_CUH_
