// Timer: one named thread that runs closures at deadlines (run timeouts, grace periods).
//
// Thread-safe. Closures run one at a time on the timer's thread, in deadline order; Cancel
// before a closure starts keeps it from running. The destructor drops closures not yet due and
// joins the thread (a closure running then finishes first).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"

namespace pw {

class Timer {
 public:
  using Id = uint64_t;
  explicit Timer(std::string name);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Runs `fn` at `deadline` (at once if it has passed). The id is for Cancel.
  Id Schedule(absl::Time deadline, absl::AnyInvocable<void() &&> fn);
  // Whether `id` was still waiting (and now never runs).
  bool Cancel(Id id);
  // Closures waiting.
  size_t size() const;

 private:
  void Loop();
  mutable pw::Mutex mu_;
  // By (deadline, id): due order, ties in scheduling order.
  std::map<std::pair<absl::Time, Id>, absl::AnyInvocable<void() &&>> due_ ABSL_GUARDED_BY(mu_);
  std::map<Id, absl::Time> deadline_of_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const std::string name_;
  std::thread thread_;
};

}  // namespace pw
