#include "pw/embedded/in_process_collectives.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pw/worker/worker.h"

namespace pw {

InProcessCollectivePeers::InProcessCollectivePeers(HostId host, IslandId island,
                                                   const std::vector<DeviceId>& devices,
                                                   Locate locate, Directory directory,
                                                   absl::Duration timeout)
    : host_(host),
      island_(island),
      local_(devices.begin(), devices.end()),
      locate_(std::move(locate)),
      directory_(std::move(directory)) {
  collectives_.SetTimeout(timeout);
  collectives_.SetPeers(this);
}

void InProcessCollectivePeers::CountOn(Worker* worker) {
  pw::MutexLock lock(&count_mu_);
  counted_ = worker;
}

void InProcessCollectivePeers::Received(IslandId from, int64_t bytes) {
  pw::MutexLock lock(&count_mu_);
  if (counted_ != nullptr)
    counted_->CountReceived(from == island_ ? LinkClass::kIci : LinkClass::kDcn, bytes, 0);
}

std::vector<HostId> InProcessCollectivePeers::HostsOf(absl::Span<const DeviceId> devices) const {
  std::vector<HostId> of(devices.size());  // Invalid: not known yet.
  bool missing = false;
  {
    pw::MutexLock lock(&where_mu_);
    for (size_t i = 0; i < devices.size(); ++i) {
      if (IsLocal(devices[i])) {
        of[i] = host_;
      } else if (auto it = host_of_.find(devices[i]); it != host_of_.end()) {
        of[i] = it->second;
      } else {
        missing = true;
      }
    }
  }
  for (size_t i = 0; missing && i < devices.size(); ++i) {
    if (of[i].valid()) continue;
    absl::StatusOr<DeviceSpec> spec = locate_(devices[i]);  // Unlocked: it takes the cluster's.
    if (!spec.ok()) continue;
    of[i] = spec->host;
    pw::MutexLock lock(&where_mu_);
    host_of_.emplace(devices[i], spec->host);
  }
  std::vector<HostId> hosts;
  for (HostId h : of)
    if (h.valid() && std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  return hosts;
}

CollectivePeers::Processes InProcessCollectivePeers::ProcessesOf(
    absl::Span<const DeviceId> devices) const {
  const std::vector<HostId> hosts = HostsOf(devices);
  Processes p{static_cast<int>(hosts.size()), 0};
  for (size_t i = 0; i < hosts.size(); ++i)
    if (hosts[i] == host_) p.self = static_cast<int>(i);
  return p;
}

std::shared_ptr<InProcessCollectivePeers> InProcessCollectivePeers::Reach(
    HostId host, const CollectiveKey& key, absl::Span<const DeviceId> devices) {
  std::shared_ptr<InProcessCollectivePeers> peer = directory_(host);
  if (peer == nullptr) {
    // Fails the launch here and tells the other hosts, whose shards wait for ours.
    collectives_.FailLaunch(key.run, key.node,
                            absl::UnavailableError(absl::StrCat(
                                "collective: ", host.ToString(), " has no live worker")),
                            devices);
  }
  return peer;
}

void InProcessCollectivePeers::Send(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                                    std::vector<int> ranks, std::vector<std::string> inputs) {
  std::vector<HostId> peers = HostsOf(devices);
  peers.erase(std::remove(peers.begin(), peers.end(), host_), peers.end());
  int64_t bytes = 0;
  for (const std::string& in : inputs) bytes += static_cast<int64_t>(in.size());
  for (size_t p = 0; p < peers.size(); ++p) {
    std::shared_ptr<InProcessCollectivePeers> peer = Reach(peers[p], key, devices);
    if (peer == nullptr) return;
    // Counted before delivery, which may complete the collective: whoever sees its result sees
    // these bytes counted.
    peer->Received(island_, bytes);
    const bool last = p + 1 == peers.size();
    // The delivery that completes the peer's inputs runs its combine here, on this thread (as
    // its receiving thread would on a process cluster), before the next peer's delivery.
    for (size_t i = 0; i < ranks.size(); ++i)
      peer->collectives_.Deliver(key, ranks[i], last ? std::move(inputs[i]) : inputs[i]);
  }
}

void InProcessCollectivePeers::SendPiece(const CollectiveKey& key,
                                         absl::Span<const DeviceId> devices, int phase, int to,
                                         int from, size_t offset, std::string bytes) {
  const std::vector<HostId> hosts = HostsOf(devices);
  if (to < 0 || to >= static_cast<int>(hosts.size())) return;
  std::shared_ptr<InProcessCollectivePeers> peer = Reach(hosts[to], key, devices);
  if (peer == nullptr) return;
  peer->Received(island_, static_cast<int64_t>(bytes.size()));
  peer->collectives_.DeliverPiece(key, phase, from, offset, std::move(bytes));
}

void InProcessCollectivePeers::SendFailure(int64_t run, int32_t node,
                                           absl::Span<const DeviceId> devices,
                                           const absl::Status& reason) {
  for (HostId h : HostsOf(devices)) {
    if (h == host_) continue;
    // A host that is gone has nothing waiting for this launch.
    if (std::shared_ptr<InProcessCollectivePeers> peer = directory_(h))
      peer->collectives_.DeliverFailure(run, node, reason);
  }
}

}  // namespace pw
