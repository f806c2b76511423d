// SPDX-License-Identifier: Apache-2.0
// kvpage's error kinds on top of absl::Status. The C API's stable codes are
// carried as a payload so that "out of blocks" and "out of memory" (both
// resource exhaustion to Abseil) stay distinct; capi/ maps them back.
#ifndef KVPAGE_SRC_STATUS_H_
#define KVPAGE_SRC_STATUS_H_

#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace kvpage {

// absl::StrFormat, safe under host allocation failure. Abseil's own appends
// its last chunk to the result from a destructor (FormatSinkImpl), so a
// std::bad_alloc there terminates the process; here the sink swallows the
// failure and it is rethrown once formatting is done, for the C API's
// firewall to report as KVP_ERR_OUT_OF_MEMORY. Use this one everywhere.
namespace internal {
struct SafeStringSink {
  std::string* out;
  bool failed;
  friend void AbslFormatFlush(SafeStringSink* sink, absl::string_view chunk) {
    if (sink->failed) return;
    try {
      sink->out->append(chunk.data(), chunk.size());
    } catch (...) {
      sink->failed = true;
    }
  }
};
}  // namespace internal

template <typename... Args>
std::string StrFormat(const absl::FormatSpec<Args...>& format, const Args&... args) {
  std::string out;
  internal::SafeStringSink sink{&out, false};
  absl::Format(&sink, format, args...);
  if (sink.failed) throw std::bad_alloc();
  return out;
}

// Values equal the C API's kvp_error_code_t.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kOutOfBlocks = 2,
  kOutOfMemory = 3,
  kUnsupported = 4,
  kDevice = 5,
  kInternal = 6,
};

absl::Status MakeError(ErrorCode code, absl::string_view message);
// The kvpage code of a status (from its payload, else from its Abseil code).
ErrorCode CodeOf(const absl::Status& status);

inline absl::Status InvalidArgument(absl::string_view m) {
  return MakeError(ErrorCode::kInvalidArgument, m);
}
inline absl::Status OutOfBlocks(absl::string_view m) {
  return MakeError(ErrorCode::kOutOfBlocks, m);
}
inline absl::Status OutOfMemory(absl::string_view m) {
  return MakeError(ErrorCode::kOutOfMemory, m);
}
inline absl::Status Unsupported(absl::string_view m) {
  return MakeError(ErrorCode::kUnsupported, m);
}
inline absl::Status DeviceError(absl::string_view m) { return MakeError(ErrorCode::kDevice, m); }
inline absl::Status Internal(absl::string_view m) { return MakeError(ErrorCode::kInternal, m); }

}  // namespace kvpage

#define KVP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status kvp_status_ = (expr);       \
    if (!kvp_status_.ok()) return kvp_status_; \
  } while (0)

#define KVP_CONCAT_INNER_(a, b) a##b
#define KVP_CONCAT_(a, b) KVP_CONCAT_INNER_(a, b)
#define KVP_ASSIGN_OR_RETURN(lhs, expr) \
  KVP_ASSIGN_OR_RETURN_IMPL_(KVP_CONCAT_(kvp_statusor_, __LINE__), lhs, expr)
#define KVP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // KVPAGE_SRC_STATUS_H_
