#include "pw/base/timer.h"

#include <pthread.h>

namespace pw {

Timer::Timer(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
    Loop();
  });
}

Timer::~Timer() {
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

Timer::Id Timer::Schedule(absl::Time deadline, absl::AnyInvocable<void() &&> fn) {
  pw::MutexLock lock(&mu_);
  const Id id = next_id_++;
  due_.emplace(std::make_pair(deadline, id), std::move(fn));
  deadline_of_.emplace(id, deadline);
  return id;
}

bool Timer::Cancel(Id id) {
  pw::MutexLock lock(&mu_);
  auto it = deadline_of_.find(id);
  if (it == deadline_of_.end()) return false;
  due_.erase(std::make_pair(it->second, id));
  deadline_of_.erase(it);
  return true;
}

size_t Timer::size() const {
  pw::MutexLock lock(&mu_);
  return due_.size();
}

void Timer::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      pw::MutexLock lock(&mu_);
      while (true) {
        if (stopping_) return;
        const absl::Time now = absl::Now();
        if (!due_.empty() && due_.begin()->first.first <= now) break;
        const absl::Time wake = due_.empty() ? absl::InfiniteFuture() : due_.begin()->first.first;
        // Wakes for a stop, an earlier deadline (the first entry changes) or the first one due.
        const auto first = due_.empty() ? std::make_pair(absl::InfiniteFuture(), Id{0})
                                        : due_.begin()->first;
        mu_.AwaitWithTimeout(
            [this, first]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return stopping_ || (!due_.empty() && due_.begin()->first != first);
            },
            wake - now);
      }
      auto it = due_.begin();
      deadline_of_.erase(it->first.second);
      fn = std::move(it->second);
      due_.erase(it);
    }
    std::move(fn)();
  }
}

}  // namespace pw
