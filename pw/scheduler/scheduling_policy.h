// SchedulingPolicy: which queued request an island's gang scheduler dispatches next.
//
// Not thread-safe: the IslandScheduler calls it under its own lock. A policy may reorder requests
// of one island freely (every device of the island still sees one order, the dispatch order),
// with two exceptions that keep runs from waiting on each other in a cycle:
//   - one client's requests keep their order (a run reads what the client's earlier runs make);
//   - requests whose runs span several islands keep their submission order (`seq`) among
//     themselves, so every island they touch dispatches them in the same relative order.
// Runs that read another client's unfinished arrays reach the schedulers only once those are
// ready (the controller holds them), so no other order between clients matters.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/scheduler/tenant.h"
#include "pw/transport/messages.h"

namespace pw {

// One run's subgraph on one island: what the island's scheduler receives, as one message.
struct IslandWork {
  RunId run;
  ClientId client;
  std::shared_ptr<const Tenant> tenant;  // Whose share pays for it; null: the client's own.
  std::string program;
  DispatchMode mode = DispatchMode::kParallel;
  std::shared_ptr<const std::vector<BufferId>> buffers;  // The run's buffers by value index.
  std::vector<std::pair<HostId, std::shared_ptr<const HostProgram>>> hosts;
  int64_t seq = 0;              // Submission order, one count over every island.
  bool spans_islands = false;   // Its run has work on other islands too.
  int devices = 1;              // Devices of this island it computes on (for its estimate).
  // The membership epoch when the run was submitted (Membership::epoch): a host that has failed
  // since gets none of it, even if a new worker has joined for it.
  uint64_t membership = 0;
};

struct ScheduleRequest {
  IslandWork work;
  Promise<absl::Time> enqueued;
  Promise<int64_t> done;
  // Its device time (nanoseconds, summed over devices) as the scheduler estimated it, when it
  // is next, from the program's earlier runs: what the window and the policy count it as until
  // it finishes.
  int64_t estimated_ns = 0;
  // The share its tenant had when SharePolicy dispatched it: what its correction is divided by
  // when it finishes (0: not dispatched by SharePolicy).
  double charged_share = 0;
};

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual std::string name() const = 0;
  virtual void Add(std::unique_ptr<ScheduleRequest> request) = 0;
  // The request to dispatch next (it stays queued; the caller may set its estimate), or nullptr
  // when none may go now.
  virtual ScheduleRequest* Peek() = 0;
  // Removes and returns what Peek returned.
  virtual std::unique_ptr<ScheduleRequest> Pop() = 0;
  // A request this policy popped finished after taking `actual_ns` of device time, against the
  // `estimated_ns` it was counted as.
  virtual void Finished(const ScheduleRequest& request, int64_t actual_ns) {}
  virtual size_t size() const = 0;
  // Requests queued, by tenant id.
  virtual absl::flat_hash_map<int64_t, int64_t> QueuedByTenant() const = 0;
};

// First come, first served: keeps every order.
class FifoPolicy final : public SchedulingPolicy {
 public:
  std::string name() const override { return "fifo"; }
  void Add(std::unique_ptr<ScheduleRequest> r) override { queue_.push_back(std::move(r)); }
  ScheduleRequest* Peek() override { return queue_.empty() ? nullptr : queue_.front().get(); }
  std::unique_ptr<ScheduleRequest> Pop() override {
    auto r = std::move(queue_.front());
    queue_.pop_front();
    return r;
  }
  size_t size() const override { return queue_.size(); }
  absl::flat_hash_map<int64_t, int64_t> QueuedByTenant() const override {
    absl::flat_hash_map<int64_t, int64_t> n;
    for (const auto& r : queue_) ++n[r->work.tenant->id()];
    return n;
  }

 private:
  std::deque<std::unique_ptr<ScheduleRequest>> queue_;
};

// Proportional share: start-time fair queueing over device time. Each tenant has a queue (its
// requests in submission order, so each client's keep theirs) and a virtual finish time; a
// tenant's head request starts at its finish time (at max(the island's virtual time, its finish
// time) when it had nothing queued) and advances that by its estimated device time / the
// tenant's share. The head with the earliest start goes next (ties: the lower tenant id), and
// the island's virtual time becomes its start if that is later.
// So a tenant that was idle starts no earlier than the current virtual time (no credit for
// idleness), and tenants with work queued receive device time in proportion to their shares.
// When a request finishes, its tenant's finish time (and so its queued head's start) is
// corrected by (actual - estimated) / the share it was charged at, so the shares hold over time
// however rough the estimates: a correction may move a backlogged tenant's head before the
// virtual time (it gets back what its requests took under their estimates, at most their sum),
// but not before the virtual time at which its queue last started from empty (no credit for
// idleness, even from requests that were still running then, whether they finish before or
// after the queue refills). Deterministic: the same submissions give the same order.
class SharePolicy final : public SchedulingPolicy {
 public:
  std::string name() const override { return "share"; }
  void Add(std::unique_ptr<ScheduleRequest> r) override;
  ScheduleRequest* Peek() override;
  std::unique_ptr<ScheduleRequest> Pop() override;
  void Finished(const ScheduleRequest& request, int64_t actual_ns) override;
  size_t size() const override { return size_; }
  absl::flat_hash_map<int64_t, int64_t> QueuedByTenant() const override;
  // The island's virtual time (device nanoseconds per unit of share).
  double virtual_time() const { return virtual_time_; }

 private:
  struct Queue {
    std::shared_ptr<const Tenant> tenant;
    std::deque<std::unique_ptr<ScheduleRequest>> requests;
    double finish = 0;    // Virtual finish time of its last dispatched request.
    double floor = 0;     // The virtual time its queue last started from empty at.
    int64_t running = 0;  // Its requests popped and not finished.
    // Virtual start time of requests.front(): where the last one finished (corrections
    // included), never before the queue's floor.
    double head_start() const { return std::max(floor, finish); }
  };
  Queue& QueueOf(const std::shared_ptr<const Tenant>& tenant);
  // Whether `r` may go now: a request spanning islands only when it is the earliest such here.
  bool MayGo(const ScheduleRequest& r) const;

  absl::flat_hash_map<int64_t, Queue> queues_;  // By tenant id; an idle tenant's kept a while.
  std::deque<int64_t> spanning_;                // Seqs of queued requests that span islands.
  Queue* picked_ = nullptr;                     // What Peek chose.
  double virtual_time_ = 0;
  size_t size_ = 0;
};

}  // namespace pw
