// SPDX-License-Identifier: Apache-2.0
#include "src/status.h"

#include <string>

#include "absl/strings/cord.h"

namespace kvpage {
namespace {

constexpr absl::string_view kCodePayload = "kvpage/error_code";

absl::StatusCode AbslCodeFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return absl::StatusCode::kOk;
    case ErrorCode::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ErrorCode::kOutOfBlocks:
      return absl::StatusCode::kResourceExhausted;
    case ErrorCode::kOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    case ErrorCode::kUnsupported:
      return absl::StatusCode::kUnimplemented;
    case ErrorCode::kDevice:
      return absl::StatusCode::kUnavailable;
    case ErrorCode::kInternal:
      return absl::StatusCode::kInternal;
  }
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::Status MakeError(ErrorCode code, absl::string_view message) {
  absl::Status s(AbslCodeFor(code), message);
  if (!s.ok()) {
    s.SetPayload(kCodePayload, absl::Cord(std::to_string(static_cast<int>(code))));
  }
  return s;
}

ErrorCode CodeOf(const absl::Status& status) {
  if (status.ok()) return ErrorCode::kOk;
  if (auto p = status.GetPayload(kCodePayload)) {
    int v = std::stoi(std::string(*p));
    if (v >= 1 && v <= static_cast<int>(ErrorCode::kInternal)) {
      return static_cast<ErrorCode>(v);
    }
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return ErrorCode::kInvalidArgument;
    case absl::StatusCode::kResourceExhausted:
      return ErrorCode::kOutOfBlocks;
    case absl::StatusCode::kUnimplemented:
      return ErrorCode::kUnsupported;
    case absl::StatusCode::kUnavailable:
      return ErrorCode::kDevice;
    default:
      return ErrorCode::kInternal;
  }
}

}  // namespace kvpage
