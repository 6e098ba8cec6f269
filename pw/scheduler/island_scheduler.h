// IslandScheduler: the gang scheduler of one island.
//
// Thread-safe. Every computation on the island's devices, from every program and every client,
// passes through one scheduler thread, which dispatches requests one at a time in the order its
// policy picks. Since each worker enqueues the messages it receives in arrival order, every
// device of the island sees computations in one consistent order, so SPMD computations with
// collectives cannot deadlock however clients interleave.
//
// Parallel dispatch sends each host one message holding all its nodes of the request and moves
// on. Sequential dispatch sends node by node, waiting until each node is enqueued on all of its
// hosts before sending the next.
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "pw/base/mutex.h"
#include "pw/scheduler/scheduling_policy.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class IslandScheduler {
 public:
  using WorkerLookup = std::function<WorkerInterface*(HostId)>;

  IslandScheduler(IslandId island, std::unique_ptr<SchedulingPolicy> policy, WorkerLookup workers);
  // Dispatches every request already submitted, then stops.
  ~IslandScheduler();
  IslandScheduler(const IslandScheduler&) = delete;
  IslandScheduler& operator=(const IslandScheduler&) = delete;

  DispatchAck Submit(IslandWork work);

  IslandId island() const { return island_; }
  size_t queue_depth() const;
  int64_t dispatched() const;

 private:
  void Loop();
  void DispatchOne(ScheduleRequest& r);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || policy_->size() > 0;
  }

  const IslandId island_;
  const WorkerLookup workers_;
  mutable pw::Mutex mu_;
  std::unique_ptr<SchedulingPolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dispatched_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dispatched_seq_ = 0;  // The scheduler thread's own count (its trace spans' gang position).
  std::thread thread_;
};

}  // namespace pw
