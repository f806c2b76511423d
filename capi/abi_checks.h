// SPDX-License-Identifier: Apache-2.0
// The C++ core's enums and types against the C ABI's: the core converts the
// header's int32_t fields with static_cast, so each internal value must be
// the header's. Every KVP_* enum constant of the header is named here
// (tests/abi/check_bindings.py capi checks that none is missing).
#ifndef KVPAGE_CAPI_ABI_CHECKS_H_
#define KVPAGE_CAPI_ABI_CHECKS_H_

#include <cstdint>
#include <type_traits>

#include "include/kvpage/kvpage.h"
#include "src/backend.h"
#include "src/format_signature.h"
#include "src/geometry.h"
#include "src/status.h"

namespace kvpage {
namespace capi {

// kvp_dtype_t <-> DType (src/geometry.h).
static_assert(std::is_same_v<std::underlying_type_t<DType>, int32_t>);
static_assert(static_cast<int32_t>(DType::kFP32) == KVP_DTYPE_FP32);
static_assert(static_cast<int32_t>(DType::kFP16) == KVP_DTYPE_FP16);
static_assert(static_cast<int32_t>(DType::kBF16) == KVP_DTYPE_BF16);
static_assert(static_cast<int32_t>(DType::kFP8E4M3) == KVP_DTYPE_FP8_E4M3);
static_assert(static_cast<int32_t>(DType::kINT8) == KVP_DTYPE_INT8);
static_assert(static_cast<int32_t>(DType::kINT4) == KVP_DTYPE_INT4);

// kvp_error_code_t <-> ErrorCode (src/status.h); kvp_error_code() returns
// the internal code as int32_t.
static_assert(sizeof(std::underlying_type_t<ErrorCode>) == sizeof(int32_t));
static_assert(static_cast<int32_t>(ErrorCode::kOk) == KVP_OK);
static_assert(static_cast<int32_t>(ErrorCode::kInvalidArgument) == KVP_ERR_INVALID_ARGUMENT);
static_assert(static_cast<int32_t>(ErrorCode::kOutOfBlocks) == KVP_ERR_OUT_OF_BLOCKS);
static_assert(static_cast<int32_t>(ErrorCode::kOutOfMemory) == KVP_ERR_OUT_OF_MEMORY);
static_assert(static_cast<int32_t>(ErrorCode::kUnsupported) == KVP_ERR_UNSUPPORTED);
static_assert(static_cast<int32_t>(ErrorCode::kDevice) == KVP_ERR_DEVICE);
static_assert(static_cast<int32_t>(ErrorCode::kInternal) == KVP_ERR_INTERNAL);

// kvp_device_kind_t <-> DeviceKind (src/backend.h).
static_assert(std::is_same_v<std::underlying_type_t<DeviceKind>, int32_t>);
static_assert(static_cast<int32_t>(DeviceKind::kCpu) == KVP_DEVICE_CPU);
static_assert(static_cast<int32_t>(DeviceKind::kCuda) == KVP_DEVICE_CUDA);

// kvp_allocator's functions are handed to the core's Allocator as they are.
static_assert(std::is_same_v<decltype(kvp_allocator::alloc), decltype(Allocator::alloc)>);
static_assert(std::is_same_v<decltype(kvp_allocator::free), decltype(Allocator::free)>);
static_assert(std::is_same_v<decltype(kvp_allocator::user_data), decltype(Allocator::user_data)>);

// The format signature's size is the core's.
static_assert(KVP_FORMAT_SIGNATURE_BYTES == kFormatSignatureBytes);

}  // namespace capi
}  // namespace kvpage

#endif  // KVPAGE_CAPI_ABI_CHECKS_H_
