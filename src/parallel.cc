// SPDX-License-Identifier: Apache-2.0
// ParallelFor on a process-wide pool of CpuThreads() - 1 worker threads.
//
// A call lists a job (on the caller's stack) in the pool and wakes at most
// as many sleeping workers as it has indices beyond the caller's own. Every
// participant, the caller included, takes the next unclaimed index until
// none remain; the caller then takes the job off the list and waits for the
// workers that joined it, never for one that is still waking up.
//
// The pool is made by the first call that needs it. It starts workers as
// calls need them: a call of n indices that finds fewer than
// min(n, CpuThreads()) - 1 workers idle starts more, up to CpuThreads() - 1
// in all (where one cannot start, those running suffice). The workers are
// joined and the pool freed when the library is unloaded or the process
// exits (a static destructor); calls run inline from then on. A child made
// by fork() has none of the parent's workers: it sets the parent's pool
// aside unused and makes its own at its first call that needs one.
#include "src/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "src/status.h"
#include "src/sync.h"

namespace kvpage {

int CpuThreads() {
  // Read once: an engine sets it before its first decode.
  static const int threads = [] {
    int n = 0;
    const char* env = std::getenv("KVPAGE_CPU_THREADS");
    if (env != nullptr && absl::SimpleAtoi(env, &n) && n >= 1) return n;
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return threads;
}

namespace {

// Whether this thread runs indices of a ParallelFor (as its caller or as a
// worker): a call nested in fn runs inline.
thread_local bool t_in_parallel_for = false;

class InParallelFor {
 public:
  InParallelFor() : was_(t_in_parallel_for) { t_in_parallel_for = true; }
  ~InParallelFor() { t_in_parallel_for = was_; }
  InParallelFor(const InParallelFor&) = delete;
  InParallelFor& operator=(const InParallelFor&) = delete;

 private:
  const bool was_;
};

// Spin budgets, in microseconds: a worker polls for the next job this long
// after its last one before it sleeps (so that back-to-back calls find it
// awake), and a caller polls this long for the workers still running its
// last indices before it sleeps.
constexpr int64_t kWorkerSpinUs = 50;
constexpr int64_t kCallerSpinUs = 50;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` for up to `us` microseconds, yielding the CPU between polls
// after the first few (a thread this one waits for may need it); whether
// `done` became true.
template <typename F>
bool SpinUntil(F done, int64_t us) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::microseconds(us);
  for (int i = 1;; ++i) {
    if (done()) return true;
    if (i <= 256) {
      CpuRelax();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();
  }
}

// absl::CondVar::Wait releases and retakes `mu` inside Abseil, where
// ThreadSanitizer does not see it (src/sync.h): TSan is told of an unlock
// and a lock around it.
void Wait(absl::CondVar* cv, absl::Mutex* mu) {
#if KVPAGE_TSAN
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
#endif
  cv->Wait(mu);
#if KVPAGE_TSAN
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
#endif
}

// One ParallelFor call.
struct Job {
  Job(int64_t n, absl::FunctionRef<void(int64_t)> fn, int helpers)
      : n(n), fn(fn), helpers_wanted(helpers) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Runs unclaimed indices until none is left or one has failed.
  void RunItems() noexcept {
    try {
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed);
           i < n && failure.load(std::memory_order_relaxed) == 0;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(i);
      }
    } catch (const std::bad_alloc&) {
      failure.store(1, std::memory_order_relaxed);
    } catch (...) {
      failure.store(2, std::memory_order_relaxed);
    }
  }
  bool HasWork() const {
    return next.load(std::memory_order_relaxed) < n && failure.load(std::memory_order_relaxed) == 0;
  }
  absl::Status status() const {
    switch (failure.load(std::memory_order_relaxed)) {
      case 0:
        return absl::OkStatus();
      case 1:
        return OutOfMemory("host allocation failed in the CPU backend");
      default:
        return Internal("unexpected exception in the CPU backend");
    }
  }

  const int64_t n;
  const absl::FunctionRef<void(int64_t)> fn;
  std::atomic<int64_t> next{0};
  std::atomic<int> failure{0};  // 1 = out of memory, 2 = other exception
  // Workers running its indices: changed under the pool's mutex, read by
  // the caller without it (acquire: their writes are then visible).
  std::atomic<int> active{0};
  // Guarded by the pool's mutex.
  int helpers_wanted;  // workers that may still join
  bool listed = false;
  Job* prev_job = nullptr;
  Job* next_job = nullptr;
  absl::CondVar left;  // the last active worker left a job no longer listed
};

class Pool {
 public:
  explicit Pool(int max_workers) : max_workers_(max_workers) {}

  // Lists `job`, wakes sleeping workers for it and starts more where too
  // few are idle; false once stopped.
  bool Post(Job* job);
  // Takes `job` off the list and waits until no worker runs its indices.
  void Finish(Job* job);
  // Stops and joins the workers; Post fails from then on.
  void Stop();

  Pool* set_aside = nullptr;  // the next pool set aside in a forked child

 private:
  void Work();
  // With mu_ held:
  Job* FindJob();
  void Sleep();
  void Leave(Job* job);

  const int max_workers_;
  absl::Mutex mu_;
  absl::CondVar wake_;
  std::atomic<uint64_t> posted_{0};  // jobs posted (and stops): spinning workers poll it
  bool stopped_ = false;
  int spinning_ = 0;  // workers polling posted_
  int sleeping_ = 0;  // workers waiting, not yet given a wake-up
  int wakeups_ = 0;   // wake-ups given, not yet taken
  Job* first_ = nullptr;
  Job* last_ = nullptr;
  std::vector<std::thread> threads_;  // grows under mu_ until stopped
};

bool Pool::Post(Job* job) {
  MutexLock lock(&mu_);
  if (stopped_) return false;
  job->prev_job = last_;
  (last_ != nullptr ? last_->next_job : first_) = job;
  last_ = job;
  job->listed = true;
  posted_.fetch_add(1, std::memory_order_relaxed);
  // Spinning workers find the job themselves, sleeping ones are woken, and
  // new ones (which look for a job first) make up the rest.
  int need = std::max(0, job->helpers_wanted - spinning_);
  const int wake = std::min(need, sleeping_);
  sleeping_ -= wake;
  wakeups_ += wake;
  for (int i = 0; i < wake; ++i) wake_.Signal();
  for (need -= wake; need > 0 && static_cast<int>(threads_.size()) < max_workers_; --need) {
    try {
      threads_.emplace_back([this] { Work(); });
    } catch (...) {  // std::bad_alloc, or std::system_error: no thread could start
      break;
    }
  }
  return true;
}

void Pool::Finish(Job* job) {
  {
    MutexLock lock(&mu_);  // from here on no worker joins
    (job->prev_job != nullptr ? job->prev_job->next_job : first_) = job->next_job;
    (job->next_job != nullptr ? job->next_job->prev_job : last_) = job->prev_job;
    job->listed = false;
    if (job->active.load(std::memory_order_relaxed) == 0) return;
  }
  // Workers run their last indices: poll a while, then sleep.
  if (SpinUntil([job] { return job->active.load(std::memory_order_acquire) == 0; },
                kCallerSpinUs)) {
    return;
  }
  MutexLock lock(&mu_);
  while (job->active.load(std::memory_order_relaxed) != 0) Wait(&job->left, &mu_);
}

void Pool::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    posted_.fetch_add(1, std::memory_order_relaxed);
    wake_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

Job* Pool::FindJob() {
  for (Job* job = first_; job != nullptr; job = job->next_job) {
    if (job->helpers_wanted > 0 && job->HasWork()) return job;
  }
  return nullptr;
}

void Pool::Sleep() {
  ++sleeping_;
  while (wakeups_ == 0 && !stopped_) Wait(&wake_, &mu_);
  if (wakeups_ > 0) {
    --wakeups_;  // the waker took this worker off sleeping_
  } else {
    --sleeping_;
  }
}

void Pool::Leave(Job* job) {
  // The caller may return once active is 0: nothing of the job is touched
  // after that store.
  const int active = job->active.load(std::memory_order_relaxed);
  if (active == 1 && !job->listed) job->left.Signal();
  job->active.store(active - 1, std::memory_order_release);
}

void Pool::Work() {
  pthread_setname_np(pthread_self(), "kvpage-cpu");
  t_in_parallel_for = true;
  Job* job = nullptr;     // the job whose indices this worker ran last
  bool spinning = false;  // counted in spinning_
  bool may_spin = false;  // ran a job since it last spun or slept
  for (;;) {
    uint64_t seen = 0;
    {
      MutexLock lock(&mu_);
      if (job != nullptr) Leave(job);
      job = nullptr;
      if (spinning) --spinning_;
      spinning = false;
      while (!stopped_ && (job = FindJob()) == nullptr && !may_spin) Sleep();
      if (stopped_) return;
      if (job != nullptr) {
        --job->helpers_wanted;
        job->active.store(job->active.load(std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
        may_spin = true;
      } else {
        seen = posted_.load(std::memory_order_relaxed);
        ++spinning_;
        spinning = true;
        may_spin = false;
      }
    }
    if (job != nullptr) {
      job->RunItems();
    } else {
      SpinUntil([&] { return posted_.load(std::memory_order_relaxed) != seen; }, kWorkerSpinUs);
    }
  }
}

std::atomic<Pool*> g_pool{nullptr};
std::atomic<bool> g_closed{false};        // unloading or exiting: no new pool
std::atomic<bool> g_fork_handled{false};  // ForgetPoolInChild is registered
Pool* g_set_aside = nullptr;              // parents' pools, in a forked child

// In a forked child: the parent's workers do not exist here. Its pool stays
// reachable (for leak checkers) but unused.
void ForgetPoolInChild() {
  Pool* pool = g_pool.exchange(nullptr);
  if (pool != nullptr) {
    pool->set_aside = g_set_aside;
    g_set_aside = pool;
  }
}

// The pool; nullptr where it cannot be made (the call runs inline).
Pool* GetPool() {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr || g_closed.load()) return pool;
  if (!g_fork_handled.load()) {  // registered twice in a race: harmless
    if (pthread_atfork(nullptr, nullptr, &ForgetPoolInChild) != 0) return nullptr;
    g_fork_handled.store(true);
  }
  Pool* made = new (std::nothrow) Pool(CpuThreads() - 1);
  if (made == nullptr) return nullptr;
  if (!g_pool.compare_exchange_strong(pool, made)) {  // another thread made one first
    delete made;
    return pool;
  }
  if (g_closed.load()) made->Stop();  // raced with the reaper below
  return made;
}

// Joins the workers when the library is unloaded or the process exits,
// before their code goes away, and frees the pool (nothing may call into
// the library then; an unloaded library must leave no allocation behind).
struct Reaper {
  ~Reaper() {
    g_closed.store(true);
    if (Pool* pool = g_pool.exchange(nullptr)) {
      pool->Stop();
      delete pool;
    }
  }
};
Reaper g_reaper;

}  // namespace

absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return absl::OkStatus();
  const int threads = CpuThreads();
  Job job(n, fn, static_cast<int>(std::min<int64_t>(threads, n)) - 1);
  Pool* pool = job.helpers_wanted > 0 && !t_in_parallel_for ? GetPool() : nullptr;
  const bool posted = pool != nullptr && pool->Post(&job);
  {
    InParallelFor inside;
    job.RunItems();
  }
  if (posted) pool->Finish(&job);
  return job.status();
}

}  // namespace kvpage
