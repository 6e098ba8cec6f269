// InProcessCollectivePeers: the in-process collective transport. Each host of the embedded
// cluster has its own Collectives, as each worker process of a process cluster has; this is how
// one host's reaches the others': direct calls of Deliver / DeliverPiece / DeliverFailure on the
// peer host's Collectives, on the sending thread, where pw/server's WorkerServer sends a
// CollectiveContribution by shared-memory mail or RPC. So a collective across hosts runs the same
// cross-process algorithms (one round of inputs, or reduce-scatter then all-gather), failure
// propagation and timeouts in both modes.
//
// Thread-safe. Send and SendPiece copy the inputs for each peer host (the last takes them); a
// host the directory does not find (failed, or not joined) fails the launch here and tells the
// other hosts, as an unreachable worker process does.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/executor/collectives.h"

namespace pw {

class Worker;

class InProcessCollectivePeers final : public CollectivePeers {
 public:
  // The peer directory: host `host`'s end, or null (its worker failed or has not joined).
  using Directory = std::function<std::shared_ptr<InProcessCollectivePeers>(HostId host)>;
  // The device's spec (its host and island); NotFound for a device the cluster never had.
  using Locate = std::function<absl::StatusOr<DeviceSpec>(DeviceId device)>;

  // `devices`: this host's. `timeout`: how long a shard waits for other hosts' part of a
  // collective (Collectives::SetTimeout).
  InProcessCollectivePeers(HostId host, IslandId island, const std::vector<DeviceId>& devices,
                           Locate locate, Directory directory, absl::Duration timeout);

  HostId host() const { return host_; }
  // This host's communicator, for its Worker (it must outlive the worker).
  Collectives& collectives() { return collectives_; }
  // From now on, bytes received from other hosts' collectives count on `worker`'s ICI or DCN
  // link totals (logical bytes; none crossed a process); null: no longer (before it goes).
  void CountOn(Worker* worker);

  // --- CollectivePeers.
  bool IsLocal(DeviceId device) const override { return local_.contains(device); }
  void Send(const CollectiveKey& key, absl::Span<const DeviceId> devices, std::vector<int> ranks,
            std::vector<std::string> inputs) override;
  void SendFailure(int64_t run, int32_t node, absl::Span<const DeviceId> devices,
                   const absl::Status& reason) override;
  Processes ProcessesOf(absl::Span<const DeviceId> devices) const override;
  void SendPiece(const CollectiveKey& key, absl::Span<const DeviceId> devices, int phase, int to,
                 int from, size_t offset, std::string bytes) override;

 private:
  // The hosts holding `devices`, in the order of the first rank each holds (unknown devices
  // skipped).
  std::vector<HostId> HostsOf(absl::Span<const DeviceId> devices) const;
  // Host `host`'s end, or null after failing launch (run, node) here, naming the host, and
  // telling the other hosts of `devices`.
  std::shared_ptr<InProcessCollectivePeers> Reach(HostId host, const CollectiveKey& key,
                                                  absl::Span<const DeviceId> devices);
  // Counts `bytes` received from a host of `from`.
  void Received(IslandId from, int64_t bytes);

  const HostId host_;
  const IslandId island_;
  const absl::flat_hash_set<DeviceId> local_;
  const Locate locate_;
  const Directory directory_;
  // Other hosts' devices, as located (a device never changes host): Send and SendPiece find
  // their peers without the cluster's lock.
  mutable pw::Mutex where_mu_;
  mutable absl::flat_hash_map<DeviceId, HostId> host_of_ ABSL_GUARDED_BY(where_mu_);
  Collectives collectives_;
  pw::Mutex count_mu_;
  Worker* counted_ ABSL_GUARDED_BY(count_mu_) = nullptr;
};

}  // namespace pw
