#include "pw/base/future.h"

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
struct SumState {
  explicit SumState(size_t n) : remaining(n), values(n) {}
  std::atomic<size_t> remaining;
  std::vector<absl::StatusOr<int64_t>> values;  // slot i written only by input i's callback.
  Promise<int64_t> promise;
};
}  // namespace

Future<int64_t> SumFutures(const std::vector<Future<int64_t>>& futures) {
  if (futures.empty()) return Future<int64_t>::Ready(0);
  if (futures.size() == 1) return futures[0];
  auto state = std::make_shared<SumState>(futures.size());
  Future<int64_t> out = state->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnReady([state, i](const absl::StatusOr<int64_t>& v) {
      state->values[i] = v;
      if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      int64_t sum = 0;
      for (const auto& x : state->values) {
        if (!x.ok()) return state->promise.Set(x.status());
        sum += *x;
      }
      state->promise.Set(sum);
    });
  }
  return out;
}

}  // namespace pw
