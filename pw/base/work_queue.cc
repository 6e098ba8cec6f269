#include "pw/base/work_queue.h"

#include <pthread.h>

namespace pw {

WorkQueue::WorkQueue(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
    Loop();
  });
}

WorkQueue::~WorkQueue() {
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WorkQueue::Post(absl::AnyInvocable<void() &&> fn) {
  pw::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

size_t WorkQueue::depth() const {
  pw::MutexLock lock(&mu_);
  return queue_.size() + running_;
}

void WorkQueue::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      pw::MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWorkOrStopping(); });
      if (queue_.empty()) return;  // stopping_ and drained.
      fn = std::move(queue_.front());
      queue_.pop_front();
      running_ = 1;
    }
    std::move(fn)();
    pw::MutexLock lock(&mu_);
    running_ = 0;
  }
}

}  // namespace pw
