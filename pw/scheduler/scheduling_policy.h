// SchedulingPolicy: which queued request an island's gang scheduler dispatches next.
//
// Not thread-safe: the IslandScheduler calls it under its own lock. A policy may reorder requests
// of one island freely (every device of the island still sees one order, the dispatch order), but
// must keep the relative order of requests that span several islands, which every involved
// island's scheduler must dispatch in the same order. FIFO keeps every order.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/transport/messages.h"

namespace pw {

// One run's subgraph on one island: what the island's scheduler receives, as one message.
struct IslandWork {
  RunId run;
  ClientId client;
  std::string program;
  DispatchMode mode = DispatchMode::kParallel;
  std::shared_ptr<const std::vector<BufferId>> buffers;  // The run's buffers by value index.
  std::vector<std::pair<HostId, std::shared_ptr<const HostProgram>>> hosts;
};

struct ScheduleRequest {
  IslandWork work;
  Promise<> enqueued;
  Promise<> done;
};

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual std::string name() const = 0;
  virtual void Add(std::unique_ptr<ScheduleRequest> request) = 0;
  // The next request to dispatch, or nullptr when empty.
  virtual std::unique_ptr<ScheduleRequest> Next() = 0;
  virtual size_t size() const = 0;
};

class FifoPolicy final : public SchedulingPolicy {
 public:
  std::string name() const override { return "fifo"; }
  void Add(std::unique_ptr<ScheduleRequest> r) override { queue_.push_back(std::move(r)); }
  std::unique_ptr<ScheduleRequest> Next() override {
    if (queue_.empty()) return nullptr;
    auto r = std::move(queue_.front());
    queue_.pop_front();
    return r;
  }
  size_t size() const override { return queue_.size(); }

 private:
  std::deque<std::unique_ptr<ScheduleRequest>> queue_;
};

}  // namespace pw
