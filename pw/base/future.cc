#include "pw/base/future.h"

#include <algorithm>
#include <cstddef>

namespace pw {

namespace internal {
const std::shared_ptr<FutureState<void>>& ReadyOkState() {
  static const auto* const state = [] {
    auto* s = new std::shared_ptr<FutureState<void>>(std::make_shared<FutureState<void>>());
    (*s)->Set(absl::OkStatus());
    return s;
  }();
  return *state;
}
}  // namespace internal

namespace {
struct JoinState {
  explicit JoinState(size_t n) : remaining(n), statuses(n) {}
  std::atomic<size_t> remaining;
  std::vector<absl::Status> statuses;  // slot i written only by input i's callback.
  Promise<> promise;
};
}  // namespace

Future<> JoinFutures(const std::vector<Future<>>& futures) {
  if (futures.empty()) return Future<>::Ready(absl::OkStatus());
  if (futures.size() == 1) return futures[0];
  auto state = std::make_shared<JoinState>(futures.size());
  Future<> out = state->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnReady([state, i](const absl::Status& s) {
      state->statuses[i] = s;
      if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        absl::Status result;
        for (const auto& st : state->statuses) {
          if (!st.ok()) {
            result = st;
            break;
          }
        }
        state->promise.Set(result);
      }
    });
  }
  return out;
}

namespace {
// Every input's value, then `fold` over them (or the first error in argument order).
template <typename T>
struct FoldState {
  explicit FoldState(size_t n) : remaining(n), values(n) {}
  std::atomic<size_t> remaining;
  std::vector<absl::StatusOr<T>> values;  // slot i written only by input i's callback.
  Promise<T> promise;
};

template <typename T, typename Fold>
Future<T> FoldFutures(const std::vector<Future<T>>& futures, T empty, Fold fold) {
  if (futures.empty()) return Future<T>::Ready(std::move(empty));
  if (futures.size() == 1) return futures[0];
  auto state = std::make_shared<FoldState<T>>(futures.size());
  Future<T> out = state->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnReady([state, i, fold](const absl::StatusOr<T>& v) {
      state->values[i] = v;
      if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      for (const auto& x : state->values) {
        if (!x.ok()) return state->promise.Set(x.status());
      }
      T acc = *state->values[0];
      for (size_t j = 1; j < state->values.size(); ++j) acc = fold(acc, *state->values[j]);
      state->promise.Set(acc);
    });
  }
  return out;
}
}  // namespace

Future<int64_t> SumFutures(const std::vector<Future<int64_t>>& futures) {
  return FoldFutures<int64_t>(futures, 0, [](int64_t a, int64_t b) { return a + b; });
}

Future<absl::Time> LatestOf(const std::vector<Future<absl::Time>>& futures) {
  if (futures.empty()) return Future<absl::Time>::Ready(absl::Now());  // The clock read once here.
  return FoldFutures<absl::Time>(futures, absl::InfinitePast(),
                                 [](absl::Time a, absl::Time b) { return std::max(a, b); });
}

}  // namespace pw
