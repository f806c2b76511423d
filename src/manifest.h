// SPDX-License-Identifier: Apache-2.0
// The kernel manifest (kernels/manifest.cmake) for C++: which KV dtypes,
// head sizes and decode kernels this build holds. Plain constexpr data over
// the generated kvpage_manifest.h, so that host code, kernels and tests ask
// one list.
#ifndef KVPAGE_SRC_MANIFEST_H_
#define KVPAGE_SRC_MANIFEST_H_

#include <cstddef>

#include "kvpage_manifest.h"
#include "src/geometry.h"

namespace kvpage {

#define KVPAGE_MANIFEST_DTYPE_ENTRY(T) DType::T,
#define KVPAGE_MANIFEST_INT_ENTRY(N) N,
inline constexpr DType kManifestKvDtypes[] = {
    KVPAGE_MANIFEST_KV_DTYPES(KVPAGE_MANIFEST_DTYPE_ENTRY)};
inline constexpr int kManifestHeadSizes[] = {KVPAGE_MANIFEST_HEAD_SIZES(KVPAGE_MANIFEST_INT_ENTRY)};
#undef KVPAGE_MANIFEST_DTYPE_ENTRY
#undef KVPAGE_MANIFEST_INT_ENTRY

// Whether this build holds the full manifest (tests pinned to it skip
// otherwise).
inline constexpr bool kManifestFull = KVPAGE_MANIFEST_FULL != 0;

// The decode kernel families of the manifest.
enum class DecodeFamily { kThreadGroup, kTensorCore, kStaged };

// Whether the manifest holds KV dtype `t` / head size `d` / a decode
// kernel of `family` for K dtype `t` and head size `d`.
KVP_HOST_DEVICE constexpr bool ManifestHasKvDtype(DType t) {
#define KVPAGE_MANIFEST_MATCH(T) t == DType::T ||
  return KVPAGE_MANIFEST_KV_DTYPES(KVPAGE_MANIFEST_MATCH) false;
#undef KVPAGE_MANIFEST_MATCH
}
KVP_HOST_DEVICE constexpr bool ManifestHasHeadSize(int d) {
#define KVPAGE_MANIFEST_MATCH(N) d == N ||
  return KVPAGE_MANIFEST_HEAD_SIZES(KVPAGE_MANIFEST_MATCH) false;
#undef KVPAGE_MANIFEST_MATCH
}
KVP_HOST_DEVICE constexpr bool ManifestHasTcBlockSize(int block_size) {
#define KVPAGE_MANIFEST_MATCH(N) block_size == N ||
  return KVPAGE_MANIFEST_TC_BLOCK_SIZES(KVPAGE_MANIFEST_MATCH) false;
#undef KVPAGE_MANIFEST_MATCH
}
KVP_HOST_DEVICE constexpr bool ManifestHasDecode(DecodeFamily family, DType t, int d) {
#define KVPAGE_MANIFEST_MATCH(T, N) (t == DType::T && d == N) ||
  switch (family) {
    case DecodeFamily::kThreadGroup:
      return KVPAGE_MANIFEST_DECODE_THREAD_GROUP(KVPAGE_MANIFEST_MATCH) false;
    case DecodeFamily::kTensorCore:
      return KVPAGE_MANIFEST_DECODE_TENSOR_CORE(KVPAGE_MANIFEST_MATCH) false;
    case DecodeFamily::kStaged:
      return KVPAGE_MANIFEST_DECODE_STAGED(KVPAGE_MANIFEST_MATCH) false;
  }
  return false;
#undef KVPAGE_MANIFEST_MATCH
}

}  // namespace kvpage

#endif  // KVPAGE_SRC_MANIFEST_H_
