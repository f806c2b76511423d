// SPDX-License-Identifier: Apache-2.0
// The matrices the C API suites loop over, from the kernel manifest
// (src/manifest.h), as kvp_dtype_t values: a reduced build tests what it
// holds.
#ifndef KVPAGE_TESTS_COMMON_TEST_MATRIX_H_
#define KVPAGE_TESTS_COMMON_TEST_MATRIX_H_

#include "include/kvpage/kvpage.h"
#include "src/manifest.h"

namespace kvpage {
namespace testing {

#define KVPAGE_KV_DTYPE_ENTRY(T) static_cast<int>(kvpage::DType::T),
inline constexpr int kKvDtypes[] = {KVPAGE_MANIFEST_KV_DTYPES(KVPAGE_KV_DTYPE_ENTRY)};
#undef KVPAGE_KV_DTYPE_ENTRY
inline constexpr int kNumKvDtypes = sizeof(kKvDtypes) / sizeof(kKvDtypes[0]);
inline constexpr auto& kHeadSizes = kvpage::kManifestHeadSizes;
inline constexpr int kNumHeadSizes = sizeof(kHeadSizes) / sizeof(kHeadSizes[0]);
inline constexpr int kBlockSizes[] = {8, 16, 32};
// Query and output dtypes.
inline constexpr int kIoDtypes[] = {KVP_DTYPE_FP32, KVP_DTYPE_FP16, KVP_DTYPE_BF16};

}  // namespace testing
}  // namespace kvpage

#endif  // KVPAGE_TESTS_COMMON_TEST_MATRIX_H_
