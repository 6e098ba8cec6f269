// Device: one accelerator's executor queue and memory budget (here: a host-CPU device).
//
// Thread-safe. Work runs one item at a time, in the order it was enqueued, on the device's own
// thread, like non-preemptible kernels on an accelerator stream. An item waits for its own inputs
// (futures) when it runs, blocking the device as a stream waits on events. Each item receives the
// device's health: an error once the device is removed, so it fails its outputs instead of running.
//
// Remove() takes the device out of service: queued and later items receive `reason` instead of
// running (still in order, on the device's thread); the memory budget fails its waiters. Items
// enqueued once the device is being destroyed run at once, on the caller's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/types/span.h"
#include "pw/base/mutex.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/executor/device_memory.h"

namespace pw {

class Device {
 public:
  using Work = absl::AnyInvocable<void(const absl::Status& health) &&>;

  Device(DeviceId id, HostId host, IslandId island, int64_t memory_bytes);
  ~Device();  // Drains queued work (items see a Cancelled status if not yet run), joins.
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceId id() const { return id_; }
  HostId host() const { return host_; }
  IslandId island() const { return island_; }
  DeviceMemory& memory() { return memory_; }

  // Appends one item to the queue (or runs it at once, with the error, once the device is being
  // destroyed).
  void Enqueue(Work work);
  // Enqueue for each item in order, under one lock (the items are moved from).
  void EnqueueAll(absl::Span<Work> work);
  void Remove(const absl::Status& reason);
  // Non-OK once removed.
  absl::Status health() const;
  // health() without a lock while the device is in service: checked before each item, and
  // before each computation of an item that runs many (a segment).
  absl::Status removed() const {
    return removing_.load(std::memory_order_acquire) ? health() : absl::OkStatus();
  }
  // Counts computations that an item ran beyond itself (a segment of n counts n - 1 more).
  void CountExecuted(int64_t n) { executed_.fetch_add(n, std::memory_order_release); }

  // The run whose item is on the device now (set by the item when it starts; -1 between items),
  // for the worker's watchdog (Worker::Overrunning).
  void SetCurrentRun(int64_t run) { current_run_.store(run, std::memory_order_relaxed); }
  int64_t current_run() const { return current_run_.load(std::memory_order_relaxed); }

  size_t queue_depth() const;
  int64_t executed() const;
  // Nanoseconds the device thread has spent running queue items (waits inside them for inputs
  // or memory included): the device's busy time, for utilization.
  int64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }

 private:
  using Item = Work;
  void Loop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  const DeviceId id_;
  const HostId host_;
  const IslandId island_;
  DeviceMemory memory_;
  mutable pw::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  alignas(64) std::atomic<int64_t> pending_{0};  // queue_.size(), readable without mu_ for spinning.
  absl::Status removed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> removing_{false};  // !removed_.ok(), readable without mu_.
  // Items taken from the queue and not finished yet. Written by the device thread only; atomic
  // so that finishing an item takes no lock.
  alignas(64) std::atomic<size_t> running_{0};
  std::atomic<int64_t> executed_{0};
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<int64_t> current_run_{-1};
  std::thread thread_;
};

}  // namespace pw
