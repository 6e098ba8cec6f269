// Membership: the controller's view of the cluster's members (issue 24's "controller as
// parts"): each host's island and, once it has joined, its worker; one IslandScheduler per
// island, made for the spec's islands at start and for an island when its first host joins.
// Workers come and go (Attach/Detach, from Controller::JoinHost/FailHost); schedulers live as
// long as the membership.
//
// Thread-safe: one lock of its own, never held while calling out (the scheduler factory runs
// under it, and only constructs).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/scheduler/island_scheduler.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class Membership {
 public:
  // Makes island `island`'s scheduler over `devices` devices.
  using SchedulerFactory =
      std::function<std::unique_ptr<IslandScheduler>(IslandId island, int devices)>;
  Membership(const ClusterSpec& spec, SchedulerFactory make_scheduler);

  // `host` of `island` serves through `worker` (replacing any earlier worker of the host).
  void Attach(HostId host, IslandId island, WorkerInterface* worker);
  // `host`'s worker is gone, for `reason` (its island stays known); the epoch advances.
  void Detach(HostId host, std::string reason);


  // Counts detaches: work records it when submitted (IslandWork::membership).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // The host's worker, or null if none is attached.
  WorkerInterface* Worker(HostId host) const;
  // The same for work submitted at `epoch`: also null if the host was detached since.
  WorkerInterface* Worker(HostId host, uint64_t epoch) const;
  std::vector<WorkerInterface*> Workers() const;
  struct Member {
    HostId host;
    IslandId island;
    WorkerInterface* worker;
  };
  // Hosts with a worker attached; with `failed`, also (in the same instant) the hosts detached
  // and not attached again, and why, by host.
  using Failed = std::vector<std::pair<HostId, std::string>>;
  std::vector<Member> Members(Failed* failed = nullptr) const;
  // Every known host's island (joined or in the spec).
  absl::flat_hash_map<HostId, IslandId> HostIslands() const;

  // The island's scheduler, or null for an island never seen.
  IslandScheduler* Scheduler(IslandId island) const;
  std::vector<IslandScheduler*> Schedulers() const;  // By island id.

 private:
  const SchedulerFactory make_scheduler_;
  mutable pw::Mutex mu_;
  absl::flat_hash_map<HostId, IslandId> host_island_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HostId, WorkerInterface*> workers_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_{0};  // Advanced under mu_; read without it.
  absl::flat_hash_map<HostId, uint64_t> detached_at_ ABSL_GUARDED_BY(mu_);  // Its last detach.
  absl::flat_hash_map<HostId, std::string> failed_ ABSL_GUARDED_BY(mu_);  // Until attached.
  std::vector<std::unique_ptr<IslandScheduler>> schedulers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw
