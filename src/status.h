// kvpage's error kinds on top of absl::Status. The C API's stable codes are
// carried as a payload so that "out of blocks" and "out of memory" (both
// resource exhaustion to Abseil) stay distinct; capi/ maps them back.
#ifndef KVPAGE_SRC_STATUS_H_
#define KVPAGE_SRC_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvpage {

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
inline absl::Status DeviceError(absl::string_view m) {
  return MakeError(ErrorCode::kDevice, m);
}
inline absl::Status Internal(absl::string_view m) {
  return MakeError(ErrorCode::kInternal, m);
}

}  // namespace kvpage

#define KVP_RETURN_IF_ERROR(expr)                \
  do {                                           \
    ::absl::Status kvp_status_ = (expr);         \
    if (!kvp_status_.ok()) return kvp_status_;   \
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
