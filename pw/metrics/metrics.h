// Prometheus metrics of the runtime's processes: a controller's and each worker's, served at
// http://ADDRESS/metrics (MetricsServer).
//
// What they show is read at each scrape from the status `pw status` shows, so the dispatch path
// pays nothing for them: a worker host's HostStatus (buffers, bytes received by link class,
// dispatch queue, per device memory in use and reserved, memory waiters, queue depth and
// computations), a controller's ClusterStatus (runs in flight and completed, clients, logical
// buffers, scheduler queue per island); plus what only the controller sees as runs finish
// (RunMetrics: runs by outcome, run latency). Names and labels follow Prometheus' conventions:
// `pw_` prefix, base units (`_bytes`, `_seconds`), `_total` for counters.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "pw/transport/controller_interface.h"
#include "pw/transport/messages.h"

namespace prometheus {
class Exposer;
}

namespace pw::metrics {

using Families = std::vector<prometheus::MetricFamily>;

// A worker host's metrics (labels: host, island; per device also device). A host whose status
// could not be had gives none.
Families HostFamilies(const HostStatus& status);
// The controller's metrics from its status and its count of connected clients.
Families ClusterFamilies(const ClusterStatus& status, size_t clients);

// Runs as the controller sees them finish: pw_runs_total{code} and pw_run_duration_seconds
// (submission to completion). Thread-safe.
class RunMetrics {
 public:
  RunMetrics();
  void Observe(absl::Duration latency, const absl::Status& outcome);
  // A run's dispatch overhead: from its submission until it is enqueued on every device.
  void ObserveDispatch(absl::Duration latency);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* runs_;
  prometheus::Counter* ok_;  // runs_{code="OK"}, looked up once: the common case costs no lookup.
  prometheus::Histogram* duration_;
  prometheus::Histogram* dispatch_;
};

// An HTTP endpoint serving metrics at /metrics: `collect` (called at each scrape, on the
// server's thread) and `registries`. Thread-safe; stops serving when destroyed.
class MetricsServer {
 public:
  // `listen`: "host:port"; port 0 picks a free one (address() says which).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::function<Families()> collect,
      std::vector<std::shared_ptr<prometheus::Registry>> registries = {});
  ~MetricsServer();
  // "host:port" it serves at.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::string address_;
};

}  // namespace pw::metrics
