// SPDX-License-Identifier: Apache-2.0
// absl::MutexLock, visible to ThreadSanitizer.
//
// Debian's Abseil is not built with -fsanitize=thread, so the atomics and
// futex waits inside absl::Mutex are invisible to TSan: it sees no
// happens-before edge between two critical sections and reports the data
// they protect as racing. Under TSan this lock announces each acquisition
// and release with TSan's mutex annotations (what an instrumented
// absl::Mutex does itself), so races are judged by the real lock
// discipline. Everywhere else it is exactly absl::MutexLock.
// docs/RELIABILITY.md ("ThreadSanitizer and Abseil") says why.
#ifndef KVPAGE_SRC_SYNC_H_
#define KVPAGE_SRC_SYNC_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#define KVPAGE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVPAGE_TSAN 1
#endif
#endif

#if KVPAGE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace kvpage {

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
#if KVPAGE_TSAN
    __tsan_mutex_pre_lock(mu_, 0);
#endif
    mu_->Lock();
#if KVPAGE_TSAN
    __tsan_mutex_post_lock(mu_, 0, 0);
#endif
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
#if KVPAGE_TSAN
    __tsan_mutex_pre_unlock(mu_, 0);
#endif
    mu_->Unlock();
#if KVPAGE_TSAN
    __tsan_mutex_post_unlock(mu_, 0);
#endif
  }

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace kvpage

#endif  // KVPAGE_SRC_SYNC_H_
