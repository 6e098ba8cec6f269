// DeviceMemory: one device's memory budget, with back-pressure.
//
// Thread-safe. Reserve() hands out reservations in FIFO order: a request that does not fit waits
// (its future stays pending) until earlier reservations are released; a request larger than the
// whole budget fails at once with ResourceExhausted. Dropping the last reference to a
// MemoryReservation returns its bytes and readies waiters, on the releasing thread.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "pw/base/mutex.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"

namespace pw {

class DeviceMemory;

class MemoryReservation {
 public:
  ~MemoryReservation();
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  int64_t bytes() const { return bytes_; }

 private:
  friend class DeviceMemory;
  struct Pool;
  struct Enabler;
  static std::shared_ptr<MemoryReservation> Make(std::shared_ptr<Pool> pool, int64_t bytes);
  MemoryReservation(std::shared_ptr<Pool> pool, int64_t bytes) : pool_(std::move(pool)), bytes_(bytes) {}
  std::shared_ptr<Pool> pool_;
  int64_t bytes_;
};

using ReservationRef = std::shared_ptr<MemoryReservation>;

class DeviceMemory {
 public:
  DeviceMemory(DeviceId device, int64_t capacity_bytes);
  ~DeviceMemory();

  // Callers add who asked to any error.
  Future<ReservationRef> Reserve(int64_t bytes);
  // The reservation if it can be granted now (it fits, none waits before it, not closed); else
  // null, and the caller calls Reserve. Saves Reserve's future on the common path.
  ReservationRef TryReserve(int64_t bytes);
  // Fails every waiting and future request with `reason` (the device was removed).
  void Close(const absl::Status& reason);

  int64_t capacity() const;
  int64_t in_use() const;
  int64_t peak_in_use() const;
  size_t waiting() const;

 private:
  std::shared_ptr<MemoryReservation::Pool> pool_;
};

}  // namespace pw
