// EmbeddedCluster: a whole cluster in one process: the controller and one worker per host,
// joined by the in-process transport (direct calls through the same interfaces a wire transport
// implements). Devices are host-CPU devices with their own executor threads. Each host has its
// own Collectives (reaching the others' through InProcessCollectivePeers) and its own PJRT
// client, as each worker process has.
//
// Thread-safe. Destroying the cluster waits for runs in flight, then stops the controller and the
// workers. Clients (and their arrays) must be destroyed first.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/base/mutex.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/controller/controller.h"
#include "pw/embedded/in_process_collectives.h"
#include "pw/metrics/metrics.h"
#include "pw/worker/worker.h"

namespace pw {

class EmbeddedCluster {
 public:
  struct Options {
    // PJRT plugin for StableHLO functions, loaded on first use.
    std::string pjrt_plugin = pjrt::DefaultCpuPluginPath();
    Controller::Options controller;  // Limits and defaults (hosts share this process).
    // Non-empty: every span of the cluster's life is traced (pw/trace) and written there as
    // Chrome trace JSON when the cluster is destroyed. Default: $PW_TRACE.
    std::string trace_path = DefaultTracePath();
    // How long a shard waits for other hosts' part of a collective (pw worker
    // --collective-timeout-ms's default).
    absl::Duration collective_timeout = absl::Minutes(5);
  };
  static std::string DefaultTracePath();
  static absl::StatusOr<std::unique_ptr<EmbeddedCluster>> Create(const ClusterSpec& spec,
                                                                 Options options);
  static absl::StatusOr<std::unique_ptr<EmbeddedCluster>> Create(const ClusterSpec& spec) {
    return Create(spec, Options());
  }
  ~EmbeddedCluster();

  Controller& controller() { return *controller_; }
  // Adds a host with `num_devices` devices to `island` (or a new island: island == #islands).
  absl::StatusOr<HostRegistration> AddHost(
      IslandId island, int num_devices, int64_t memory_bytes = ClusterSpec::kDefaultDeviceMemory);
  Future<> RemoveDevice(DeviceId device, const std::string& reason) {
    return controller_->RemoveDevice(device, reason);
  }
  // Fails `host` as a killed worker process fails on a process cluster (drills, tests): its
  // outstanding work fails and its devices leave service, naming "host:H failed: <reason>"
  // (Worker::Fail, then Controller::FailHost, as pw/server's failure monitor does); its shards
  // are lost; peers' fetches from it fail. NotFound if the host has no live worker.
  absl::Status FailHost(HostId host, const std::string& reason);
  // A new worker for a failed host joins, as a restarted worker process rejoins: its devices are
  // back in service, with nothing in its store. FailedPrecondition if the host has a live worker.
  // (The failed worker's threads stay until the cluster is destroyed.)
  absl::Status RestartHost(HostId host);
  // The worker of `host`, or nullptr.
  Worker* worker(HostId host) const;
  // Serves the cluster's Prometheus metrics at http://listen/metrics (the controller's and every
  // host's, as pw/metrics names them), until the result is destroyed, which must happen before
  // the cluster's destruction.
  absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> ServeMetrics(const std::string& listen);

 private:
  // A host's worker and its end of the collective transport.
  struct Host {
    std::shared_ptr<InProcessCollectivePeers> collectives;
    std::unique_ptr<Worker> worker;
    ~Host();  // Stops counting on the worker before it goes (members: the worker goes first).
  };
  explicit EmbeddedCluster(Options options) : options_(std::move(options)) {}
  // What devices a host joining with `devices` can meet in collectives: all the cluster's.
  void AddDevices(const std::vector<DeviceSpec>& devices);
  absl::StatusOr<DeviceSpec> Locate(DeviceId device) const;
  std::shared_ptr<InProcessCollectivePeers> CollectivesOf(HostId host) const;
  // Starts a worker for `host`, with a communicator and a PJRT client of its own.
  absl::Status StartWorker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices);
  // Moves `host`'s worker (if it is `expected`, when given) to failed_ and fails it (Worker::Fail)
  // with "host:H failed: <reason>"; NotFound if there is none.
  absl::Status Retire(HostId host, Worker* expected, const std::string& reason);

  const Options options_;
  int64_t trace_since_ = -1;  // Options::trace_path's trace: its start.
  // Runs as they finish (unless the caller observes them: Options::controller.on_run_done).
  std::shared_ptr<metrics::RunMetrics> runs_ = std::make_shared<metrics::RunMetrics>();
  mutable pw::Mutex mu_;
  absl::flat_hash_map<HostId, std::unique_ptr<Host>> hosts_ ABSL_GUARDED_BY(mu_);
  // Every device the cluster has had (hosts added at run time too).
  absl::flat_hash_map<DeviceId, DeviceSpec> devices_ ABSL_GUARDED_BY(mu_);
  pw::Mutex fail_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // One FailHost or RestartHost at a time.
  // Failed hosts: kept, as peers and work in flight may still hold their workers.
  std::vector<std::unique_ptr<Host>> failed_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Controller> controller_;  // Destroyed first.
};

}  // namespace pw
