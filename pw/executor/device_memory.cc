#include "absl/strings/string_view.h"
#include "pw/executor/device_memory.h"

#include <algorithm>
#include <atomic>
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
  // Bytes granted. Grants add by compare-and-swap (never past capacity) and releases subtract,
  // without mu while no request waits (the common case: no lock per buffer).
  std::atomic<int64_t> in_use{0};
  std::atomic<int64_t> peak{0};
  // Requests wait or the pool is closed: TryReserve defers to Reserve, and a release takes mu to
  // grant waiters. Written under mu.
  std::atomic<bool> slow{false};
  pw::Mutex mu;
  absl::Status closed ABSL_GUARDED_BY(mu);
  std::deque<Waiter> waiters ABSL_GUARDED_BY(mu);

  // Adds `bytes` to in_use if they fit.
  bool TryAdd(int64_t bytes) {
    int64_t cur = in_use.load(std::memory_order_relaxed);
    do {
      if (cur + bytes > capacity) return false;
    } while (!in_use.compare_exchange_weak(cur, cur + bytes, std::memory_order_seq_cst,
                                           std::memory_order_relaxed));
    int64_t p = peak.load(std::memory_order_relaxed);
    while (p < cur + bytes &&
           !peak.compare_exchange_weak(p, cur + bytes, std::memory_order_relaxed)) {
    }
    return true;
  }

  // Grants waiters that now fit, in FIFO order. Returns the promises to fulfil outside mu.
  std::vector<std::pair<Promise<ReservationRef>, int64_t>> GrantLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::pair<Promise<ReservationRef>, int64_t>> granted;
    while (!waiters.empty() && TryAdd(waiters.front().bytes)) {
      granted.emplace_back(std::move(waiters.front().promise), waiters.front().bytes);
      waiters.pop_front();
    }
    slow.store(!waiters.empty() || !closed.ok(), std::memory_order_seq_cst);
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
  // seq_cst, as Reserve's (set `slow`, then look at in_use): either this sees `slow` and grants
  // the waiter, or Reserve sees these bytes free.
  pool_->in_use.fetch_sub(bytes_, std::memory_order_seq_cst);
  if (!pool_->slow.load(std::memory_order_seq_cst)) return;
  std::vector<std::pair<Promise<ReservationRef>, int64_t>> granted;
  {
    pw::MutexLock lock(&pool_->mu);
    granted = pool_->GrantLocked();
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
  Future<ReservationRef> f;
  std::vector<std::pair<Promise<ReservationRef>, int64_t>> granted;
  {
    pw::MutexLock lock(&pool_->mu);
    if (!pool_->closed.ok()) return Future<ReservationRef>::Ready(pool_->closed);
    if (pool_->waiters.empty() && pool_->TryAdd(bytes))
      return Future<ReservationRef>::Ready(MemoryReservation::Make(pool_, bytes));
    Promise<ReservationRef> p;
    f = p.future();
    pool_->waiters.push_back({bytes, std::move(p)});
    pool_->slow.store(true, std::memory_order_seq_cst);
    // A release since TryAdd may have missed `slow`: grant what fits now (this request too).
    granted = pool_->GrantLocked();
  }
  for (auto& [q, b] : granted) q.Set(MemoryReservation::Make(pool_, b));
  return f;
}

ReservationRef DeviceMemory::TryReserve(int64_t bytes) {
  if (bytes < 0 || pool_->slow.load(std::memory_order_seq_cst) || !pool_->TryAdd(bytes))
    return nullptr;
  return MemoryReservation::Make(pool_, bytes);
}

void DeviceMemory::Close(const absl::Status& reason) {
  std::deque<MemoryReservation::Pool::Waiter> waiters;
  {
    pw::MutexLock lock(&pool_->mu);
    if (pool_->closed.ok()) pool_->closed = reason;
    pool_->slow.store(true, std::memory_order_seq_cst);
    waiters.swap(pool_->waiters);
  }
  for (auto& w : waiters) w.promise.Set(reason);
}

int64_t DeviceMemory::capacity() const { return pool_->capacity; }
int64_t DeviceMemory::in_use() const { return pool_->in_use.load(std::memory_order_acquire); }
int64_t DeviceMemory::peak_in_use() const {
  return pool_->peak.load(std::memory_order_acquire);
}
size_t DeviceMemory::waiting() const {
  pw::MutexLock lock(&pool_->mu);
  return pool_->waiters.size();
}

}  // namespace pw
