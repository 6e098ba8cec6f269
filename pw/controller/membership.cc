#include "pw/controller/membership.h"

#include <algorithm>
#include <utility>

namespace pw {

Membership::Membership(const ClusterSpec& spec, SchedulerFactory make_scheduler)
    : make_scheduler_(std::move(make_scheduler)) {
  pw::MutexLock lock(&mu_);
  for (const auto& h : spec.hosts()) host_island_[h.id] = h.island;
  for (const auto& i : spec.islands()) {
    int devices = 0;
    for (HostId h : i.hosts) devices += static_cast<int>(spec.host(h).devices.size());
    schedulers_.push_back(make_scheduler_(i.id, devices));
  }
}

void Membership::Attach(HostId host, IslandId island, WorkerInterface* worker) {
  pw::MutexLock lock(&mu_);
  host_island_[host] = island;
  workers_[host] = worker;
  failed_.erase(host);
  while (static_cast<int64_t>(schedulers_.size()) <= island.value())
    schedulers_.push_back(
        make_scheduler_(IslandId(static_cast<int64_t>(schedulers_.size())), /*devices=*/1));
}

void Membership::Detach(HostId host, std::string reason) {
  pw::MutexLock lock(&mu_);
  workers_.erase(host);
  failed_[host] = std::move(reason);
  detached_at_[host] = epoch_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

WorkerInterface* Membership::Worker(HostId host) const {
  pw::MutexLock lock(&mu_);
  auto it = workers_.find(host);
  return it == workers_.end() ? nullptr : it->second;
}

WorkerInterface* Membership::Worker(HostId host, uint64_t epoch) const {
  pw::MutexLock lock(&mu_);
  auto it = workers_.find(host);
  if (it == workers_.end()) return nullptr;
  auto d = detached_at_.find(host);
  return d != detached_at_.end() && d->second > epoch ? nullptr : it->second;
}

std::vector<WorkerInterface*> Membership::Workers() const {
  pw::MutexLock lock(&mu_);
  std::vector<WorkerInterface*> out;
  out.reserve(workers_.size());
  for (const auto& [host, w] : workers_) out.push_back(w);
  return out;
}

std::vector<Membership::Member> Membership::Members(Failed* failed) const {
  pw::MutexLock lock(&mu_);
  if (failed != nullptr) {
    failed->assign(failed_.begin(), failed_.end());
    std::sort(failed->begin(), failed->end());
  }
  std::vector<Member> out;
  out.reserve(workers_.size());
  for (const auto& [host, w] : workers_) out.push_back({host, host_island_.at(host), w});
  return out;
}

absl::flat_hash_map<HostId, IslandId> Membership::HostIslands() const {
  pw::MutexLock lock(&mu_);
  return host_island_;
}

IslandScheduler* Membership::Scheduler(IslandId island) const {
  pw::MutexLock lock(&mu_);
  if (!island.valid() || island.value() >= static_cast<int64_t>(schedulers_.size())) return nullptr;
  return schedulers_[island.value()].get();
}

std::vector<IslandScheduler*> Membership::Schedulers() const {
  pw::MutexLock lock(&mu_);
  std::vector<IslandScheduler*> out;
  for (const auto& s : schedulers_) out.push_back(s.get());
  return out;
}

}  // namespace pw
