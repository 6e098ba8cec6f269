#include "absl/strings/string_view.h"
#include "pw/executor/device_memory.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pw {

struct MemoryReservation::Pool {
  struct Waiter {
    int64_t bytes;
    Promise<ReservationRef> promise;
  };
  DeviceId device;
  int64_t capacity = 0;
  pw::Mutex mu;
  int64_t in_use ABSL_GUARDED_BY(mu) = 0;
  int64_t peak ABSL_GUARDED_BY(mu) = 0;
  absl::Status closed ABSL_GUARDED_BY(mu);
  std::deque<Waiter> waiters ABSL_GUARDED_BY(mu);

  // Grants waiters that now fit, in FIFO order. Returns the promises to fulfil outside mu.
  std::vector<std::pair<Promise<ReservationRef>, int64_t>> GrantLocked(
      const std::shared_ptr<Pool>& self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::pair<Promise<ReservationRef>, int64_t>> granted;
    while (!waiters.empty() && in_use + waiters.front().bytes <= capacity) {
      in_use += waiters.front().bytes;
      peak = std::max(peak, in_use);
      granted.emplace_back(std::move(waiters.front().promise), waiters.front().bytes);
      waiters.pop_front();
    }
    return granted;
  }
};

struct MemoryReservation::Enabler : MemoryReservation {
  Enabler(std::shared_ptr<Pool> pool, int64_t bytes) : MemoryReservation(std::move(pool), bytes) {}
};

std::shared_ptr<MemoryReservation> MemoryReservation::Make(std::shared_ptr<Pool> pool,
                                                           int64_t bytes) {
  return std::make_shared<Enabler>(std::move(pool), bytes);  // One allocation.
}

MemoryReservation::~MemoryReservation() {
  std::vector<std::pair<Promise<ReservationRef>, int64_t>> granted;
  {
    pw::MutexLock lock(&pool_->mu);
    pool_->in_use -= bytes_;
    granted = pool_->GrantLocked(pool_);
  }
  for (auto& [p, bytes] : granted)
    p.Set(MemoryReservation::Make(pool_, bytes));
}

DeviceMemory::DeviceMemory(DeviceId device, int64_t capacity_bytes)
    : pool_(std::make_shared<MemoryReservation::Pool>()) {
  pool_->device = device;
  pool_->capacity = capacity_bytes;
}

DeviceMemory::~DeviceMemory() { Close(absl::CancelledError("device memory destroyed")); }

Future<ReservationRef> DeviceMemory::Reserve(int64_t bytes) {
  if (bytes < 0) {
    return Future<ReservationRef>::Ready(absl::InvalidArgumentError(
        absl::StrCat("negative reservation of ", bytes, " bytes")));
  }
  if (bytes > pool_->capacity) {
    return Future<ReservationRef>::Ready(absl::ResourceExhaustedError(absl::StrCat(
        "needs ", bytes, " bytes but ", pool_->device.ToString(), " has only ",
        pool_->capacity, " bytes of memory in all; it can never fit")));
  }
  pw::MutexLock lock(&pool_->mu);
  if (!pool_->closed.ok()) return Future<ReservationRef>::Ready(pool_->closed);
  if (pool_->waiters.empty() && pool_->in_use + bytes <= pool_->capacity) {
    pool_->in_use += bytes;
    pool_->peak = std::max(pool_->peak, pool_->in_use);
    return Future<ReservationRef>::Ready(MemoryReservation::Make(pool_, bytes));
  }
  Promise<ReservationRef> p;
  Future<ReservationRef> f = p.future();
  pool_->waiters.push_back({bytes, std::move(p)});
  return f;
}

ReservationRef DeviceMemory::TryReserve(int64_t bytes) {
  if (bytes < 0) return nullptr;
  pw::MutexLock lock(&pool_->mu);
  if (!pool_->closed.ok() || !pool_->waiters.empty() || pool_->in_use + bytes > pool_->capacity)
    return nullptr;
  pool_->in_use += bytes;
  pool_->peak = std::max(pool_->peak, pool_->in_use);
  return MemoryReservation::Make(pool_, bytes);
}

void DeviceMemory::Close(const absl::Status& reason) {
  std::deque<MemoryReservation::Pool::Waiter> waiters;
  {
    pw::MutexLock lock(&pool_->mu);
    if (pool_->closed.ok()) pool_->closed = reason;
    waiters.swap(pool_->waiters);
  }
  for (auto& w : waiters) w.promise.Set(reason);
}

int64_t DeviceMemory::capacity() const { return pool_->capacity; }
int64_t DeviceMemory::in_use() const {
  pw::MutexLock lock(&pool_->mu);
  return pool_->in_use;
}
int64_t DeviceMemory::peak_in_use() const {
  pw::MutexLock lock(&pool_->mu);
  return pool_->peak;
}
size_t DeviceMemory::waiting() const {
  pw::MutexLock lock(&pool_->mu);
  return pool_->waiters.size();
}

}  // namespace pw
