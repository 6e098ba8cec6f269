// pw::Mutex: absl::Mutex, visible to ThreadSanitizer.
//
// Debian's abseil is not built with TSan, so TSan cannot see absl::Mutex's happens-before edges
// and reports false races on everything it guards. Under TSan (PW_TSAN) this wrapper announces
// each acquire and release itself; otherwise it adds nothing. Conditions are predicates run with
// the lock held, possibly on the thread that releases it.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(PW_TSAN)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace pw {

#if defined(PW_TSAN)
// absl's deadlock detector keeps a global graph behind locks TSan cannot see either, which TSan
// reports as races inside abseil; TSan builds turn the detector off.
inline const bool kTsanBuildIgnoresAbslDeadlockGraph = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();
#endif

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    Acquired();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Unlocking evaluates waiters' conditions, which live on the waiters' stacks: see their
    // Releasing() before reading them.
    Acquired();
    Releasing();
    mu_.Unlock();
  }
  // Releases the lock until pred() holds, then returns with it held.
  template <typename Pred>
  void Await(const Pred& pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Checked<Pred> c{this, &pred};
    absl::Condition cond(&c);
    Releasing();  // Publishes `cond` to the thread that will evaluate it.
    mu_.Await(cond);
    Acquired();
  }
  // As Await, but gives up after `timeout`; returns pred()'s value. Holds the lock either way.
  template <typename Pred>
  bool AwaitWithTimeout(const Pred& pred, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Checked<Pred> c{this, &pred};
    absl::Condition cond(&c);
    Releasing();
    bool ok = mu_.AwaitWithTimeout(cond, timeout);
    Acquired();
    return ok;
  }
  // Acquires the lock once pred() holds.
  template <typename Pred>
  void LockWhen(const Pred& pred) ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    Checked<Pred> c{this, &pred};
    absl::Condition cond(&c);
    Releasing();  // Publishes `cond` to the thread that will evaluate it.
    mu_.LockWhen(cond);
    Acquired();
  }
  // As LockWhen, but gives up after `timeout`; returns pred()'s value. Holds the lock either way.
  template <typename Pred>
  bool LockWhenWithTimeout(const Pred& pred, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    Checked<Pred> c{this, &pred};
    absl::Condition cond(&c);
    Releasing();
    bool ok = mu_.LockWhenWithTimeout(cond, timeout);
    Acquired();
    return ok;
  }

 private:
  template <typename Pred>
  struct Checked {
    Mutex* mu;
    const Pred* pred;
    // Runs with mu_ held, on whichever thread evaluates it; the lock may be dropped right after
    // (the waiter sleeps), so the evaluation is bracketed as a critical section of its own.
    bool operator()() const {
      mu->Acquired();
      bool holds = (*pred)();
      mu->Releasing();
      return holds;
    }
  };
  void Acquired() {
#if defined(PW_TSAN)
    __tsan_acquire(this);
#endif
  }
  void Releasing() {
#if defined(PW_TSAN)
    __tsan_release(this);
#endif
  }
  absl::Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace pw
