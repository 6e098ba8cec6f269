// Future<T> / Promise<T>: the one asynchronous value type of pathways.
//
// A Future<T> holds absl::StatusOr<T> once ready; Future<> (T = void) holds absl::Status.
// Futures are cheap, copyable, thread-safe references to one shared state; a Promise is the
// move-only write end. Setting a promise twice is a programmer error (CHECK).
//
// Callbacks: OnReady(cb) runs `cb` immediately on the calling thread if the future is already
// ready, otherwise on the thread that fulfils the promise, after the value is published. Callbacks
// must not block for long: they run on executor, dispatch and device threads.
//
// A promise destroyed without being set fulfils its future with an Internal error, so a waiter is
// never stranded.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "pw/base/check.h"
#include "pw/base/spin_wait.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pw/base/mutex.h"
#include "absl/time/time.h"

namespace pw {

template <typename T = void>
class Future;
template <typename T = void>
class Promise;

namespace internal {

template <typename T>
struct FutureValue {
  using type = absl::StatusOr<T>;
};
template <>
struct FutureValue<void> {
  using type = absl::Status;
};

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Thread-safe shared state: written once, then immutable.
template <typename T>
class FutureState {
 public:
  using Value = typename FutureValue<T>::type;
  using Callback = absl::AnyInvocable<void(const Value&) &&>;
  FutureState() = default;
  // Already ready with `v`: nothing else can see the state yet, so no lock.
  struct ReadyWith {};
  FutureState(ReadyWith, Value v) : ready_(true), settled_(true), value_(std::move(v)) {}

  void Set(Value v) {
    std::vector<Callback> callbacks;
    {
      pw::MutexLock lock(&mu_);
      PW_CHECK(!ready_.load(std::memory_order_relaxed), "promise set twice");
      value_.emplace(std::move(v));
      ready_.store(true, std::memory_order_release);
      callbacks.swap(callbacks_);
    }
    for (auto& cb : callbacks) std::move(cb)(*value_);
    settled_.store(true, std::memory_order_release);  // The callbacks are done with the value.
  }

  // The value to move out of, once ready and its callbacks have run (else null): for the last
  // holder of the state (Future::Take).
  Value* Settled() {
    return settled_.load(std::memory_order_acquire) ? &*value_ : nullptr;
  }

  bool IsReady() const { return ready_.load(std::memory_order_acquire); }

  const Value& Await() {
    if (!IsReady() && !SpinYieldUntil([this] { return IsReady(); })) {
      mu_.LockWhen([this] { return IsReady(); });
      mu_.Unlock();
    }
    return *value_;
  }

  // Returns false if the deadline passed first.
  bool AwaitWithTimeout(absl::Duration timeout) {
    if (IsReady()) return true;
    bool ok = mu_.LockWhenWithTimeout([this] { return IsReady(); }, timeout);
    mu_.Unlock();
    return ok;
  }

  void OnReady(Callback cb) {
    if (!IsReady()) {
      pw::MutexLock lock(&mu_);
      if (!ready_.load(std::memory_order_relaxed)) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    std::move(cb)(*value_);
  }

 private:
  pw::Mutex mu_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> settled_{false};  // Ready, and the callbacks of Set have run.
  std::optional<Value> value_;  // written once under mu_ before ready_ is released.
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
};

// The shared state of every ready OK Future<> (see Future::Ready).
const std::shared_ptr<FutureState<void>>& ReadyOkState();

}  // namespace internal

template <typename T>
class Future {
 public:
  using Value = typename internal::FutureValue<T>::type;

  Future() = default;  // Invalid until assigned; valid() is false.
  // A future that is already ready with `value` (a T, a StatusOr<T>, or an error Status).
  template <typename V>
  static Future Ready(V&& value) {
    if constexpr (std::is_void_v<T>) {
      // Every ready OK Future<> shares one state: a ready state is immutable.
      if (internal::StatusOf(value).ok()) return Future(internal::ReadyOkState());
    }
    return Future(std::make_shared<internal::FutureState<T>>(
        typename internal::FutureState<T>::ReadyWith{}, Value(std::forward<V>(value))));
  }

  bool valid() const { return state_ != nullptr; }
  bool IsReady() const { return state_->IsReady(); }
  // Blocks until ready; returns the value (reference valid while any copy of this future lives).
  const Value& Await() const { return state_->Await(); }
  // Blocks until ready; returns the value, moved out when this future is the last holder of its
  // state (no copy of it lives, and its promise has finished setting it, callbacks run), else a
  // copy. For a large value only its caller reads (a fetched array). This future is invalid
  // after, and a reference an earlier Await() returned may see a moved-from value.
  Value Take() && {
    const std::shared_ptr<internal::FutureState<T>> state = std::move(state_);
    const Value& v = state->Await();
    if (state.use_count() != 1) return v;
    Value* settled = state->Settled();
    if (settled == nullptr) return v;
    // Other futures of the state, read on other threads, were released before the count fell to
    // one: acquire what they did (Settled() does so for the promise's callbacks, visibly to TSan).
    std::atomic_thread_fence(std::memory_order_acquire);
    return std::move(*settled);
  }
  // Blocks at most `timeout`; returns false if still not ready.
  bool AwaitFor(absl::Duration timeout) const { return state_->AwaitWithTimeout(timeout); }
  // Status part of the value; blocks.
  absl::Status status() const { return internal::StatusOf(Await()); }
  // See the file comment for which thread runs `cb`.
  void OnReady(absl::AnyInvocable<void(const Value&) &&> cb) const {
    state_->OnReady(std::move(cb));
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal::FutureState<T>> s) : state_(std::move(s)) {}
  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T>
class Promise {
 public:
  using Value = typename internal::FutureValue<T>::type;

  Promise() : state_(std::make_shared<internal::FutureState<T>>()) {}
  Promise(Promise&&) = default;
  Promise& operator=(Promise&& other) {
    Abandon();
    state_ = std::move(other.state_);
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { Abandon(); }

  Future<T> future() const { return Future<T>(state_); }
  // Fulfils the future; runs pending callbacks on this thread.
  template <typename V>
  void Set(V&& value) {
    PW_CHECK(state_ != nullptr, "promise used after move");
    auto state = std::move(state_);
    state->Set(Value(std::forward<V>(value)));
  }
  void Set() requires std::is_void_v<T> { Set(absl::OkStatus()); }
  bool valid() const { return state_ != nullptr; }

 private:
  void Abandon() {
    if (state_ != nullptr) {
      auto state = std::move(state_);
      state->Set(Value(absl::InternalError("promise abandoned before it was fulfilled")));
    }
  }
  std::shared_ptr<internal::FutureState<T>> state_;
};

// A future that is ready once every input is ready: OK if all are OK, else the first error in
// argument order. Callbacks of the result run on the thread that readied the last input.
Future<> JoinFutures(const std::vector<Future<>>& futures);

// A future that is ready once every input is ready: the sum of their values if all are OK, else
// the first error in argument order. Callbacks run as JoinFutures's.
Future<int64_t> SumFutures(const std::vector<Future<int64_t>>& futures);

// A future that is ready once every input is ready: the latest of their instants if all are OK,
// else the first error in argument order (now if there are none). Callbacks run as JoinFutures's.
Future<absl::Time> LatestOf(const std::vector<Future<absl::Time>>& futures);

// Future<> of any future's status.
template <typename T>
Future<> AsStatusFuture(const Future<T>& f) {
  if constexpr (std::is_void_v<T>) {
    return f;
  } else {
    if (f.IsReady()) return Future<>::Ready(f.status());
    Promise<> p;
    Future<> out = p.future();
    f.OnReady([p = std::move(p)](const absl::StatusOr<T>& v) mutable { p.Set(v.status()); });
    return out;
  }
}

}  // namespace pw
