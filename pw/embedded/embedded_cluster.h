// EmbeddedCluster: a whole cluster in one process: the controller and one worker per host,
// joined by the in-process transport (direct calls through the same interfaces a wire transport
// implements). Devices are host-CPU devices with their own executor threads.
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
#include "pw/executor/collectives.h"
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
  explicit EmbeddedCluster(Options options) : options_(std::move(options)) {}
  absl::Status StartWorker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices,
                           std::shared_ptr<pjrt::PjrtBackend> pjrt);
  // Moves `host`'s worker (if it is `expected`, when given) to failed_ and fails it (Worker::Fail)
  // with "host:H failed: <reason>"; NotFound if there is none.
  absl::Status Retire(HostId host, Worker* expected, const std::string& reason);

  const Options options_;
  int64_t trace_since_ = -1;  // Options::trace_path's trace: its start.
  // Runs as they finish (unless the caller observes them: Options::controller.on_run_done).
  std::shared_ptr<metrics::RunMetrics> runs_ = std::make_shared<metrics::RunMetrics>();
  Collectives collectives_;
  std::shared_ptr<pjrt::PjrtBackend> pjrt_;  // The initial hosts' PJRT client (created on use).
  mutable pw::Mutex mu_;
  absl::flat_hash_map<HostId, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  pw::Mutex fail_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // One FailHost or RestartHost at a time.
  // Failed workers: kept, as peers and work in flight may still hold them.
  std::vector<std::unique_ptr<Worker>> failed_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Controller> controller_;  // Destroyed first.
};

}  // namespace pw
