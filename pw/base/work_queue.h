// WorkQueue: one named thread that runs posted closures in FIFO order.
//
// Thread-safe. Used for dispatch threads, scheduler threads and data-plane threads, so that an
// order established by whoever posts is kept by whoever runs. The destructor runs every closure
// already posted, then joins the thread.
#pragma once

#include <deque>
#include <string>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "pw/base/mutex.h"

namespace pw {

class WorkQueue {
 public:
  explicit WorkQueue(std::string name);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Post(absl::AnyInvocable<void() &&> fn);
  const std::string& name() const { return name_; }
  // Closures posted but not yet finished.
  size_t depth() const;

 private:
  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }
  const std::string name_;
  mutable pw::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pw
