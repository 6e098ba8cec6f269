#include "pw/executor/device.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "pw/base/spin_wait.h"
#include "pw/trace/trace.h"

namespace pw {

Device::Device(DeviceId id, HostId host, IslandId island, int64_t memory_bytes)
    : id_(id), host_(host), island_(island), memory_(id, memory_bytes) {
  thread_ = std::thread([this] {
    std::string name = absl::StrCat("pw-dev", id_.value());
    pthread_setname_np(pthread_self(), name.c_str());
    Loop();
  });
}

Device::~Device() {
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
    if (removed_.ok()) removed_ = absl::CancelledError(absl::StrCat(id_.ToString(), " shut down"));
    removing_.store(true, std::memory_order_release);
  }
  thread_.join();
  memory_.Close(absl::CancelledError(absl::StrCat(id_.ToString(), " shut down")));
}

void Device::Enqueue(Work work) { EnqueueAll(absl::MakeSpan(&work, 1)); }

void Device::EnqueueAll(absl::Span<Work> work) {
  absl::Status removed;
  {
    pw::MutexLock lock(&mu_);
    if (!stopping_) {
      for (Work& w : work) queue_.push_back(std::move(w));
      pending_.fetch_add(static_cast<int64_t>(work.size()), std::memory_order_release);
      return;
    }
    removed = removed_;
  }
  for (Work& w : work) std::move(w)(removed);
}

void Device::Remove(const absl::Status& reason) {
  {
    pw::MutexLock lock(&mu_);
    if (!removed_.ok()) return;
    removed_ = reason;
    removing_.store(true, std::memory_order_release);
  }
  memory_.Close(reason);
}

absl::Status Device::health() const {
  pw::MutexLock lock(&mu_);
  return removed_;
}

size_t Device::queue_depth() const {
  pw::MutexLock lock(&mu_);
  return queue_.size() + running_.load(std::memory_order_relaxed);
}

int64_t Device::executed() const { return executed_.load(std::memory_order_acquire); }

void Device::Loop() {
  // Items are taken a batch at a time (everything queued), so the device thread takes the lock
  // once per batch rather than once per item; an item still sees a removal made while earlier
  // items of its batch ran.
  std::deque<Item> batch;
  while (true) {
    // Work usually arrives within microseconds of the last item; yield before sleeping.
    SpinYieldUntil([this] { return pending_.load(std::memory_order_acquire) > 0; });
    {
      pw::MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWork(); });
      if (queue_.empty()) return;
      batch.swap(queue_);
      running_.store(batch.size(), std::memory_order_relaxed);
      pending_.fetch_sub(batch.size(), std::memory_order_relaxed);
    }
    absl::Status removed;
    const int64_t started = trace::Now();  // Once per batch: two clock reads.
    while (!batch.empty()) {
      if (removed.ok()) removed = this->removed();
      Item item = std::move(batch.front());
      batch.pop_front();
      std::move(item)(removed);
      current_run_.store(-1, std::memory_order_relaxed);
      executed_.fetch_add(1, std::memory_order_release);
      running_.fetch_sub(1, std::memory_order_relaxed);
    }
    busy_ns_.fetch_add(trace::Now() - started, std::memory_order_relaxed);
  }
}

}  // namespace pw
