// `pw bench multitenant`: the paper's §5.2 workload (Fig. 8/9). K clients, each a process of its
// own and a tenant with a share, loop the same program on the same devices: every device of one
// island holds for `compute_ms` (hold_device: the device's thread sleeps, as an accelerator
// kernel would keep its device without the host's CPU), then an all-reduce over the island (so
// the island's gang order matters). Each client keeps `in_flight` calls in flight and records
// when each finishes. Reported per (clients, compute time): the aggregate calls/s beside one
// client alone (measured in the same run, just before and just after the K clients: their
// mean, so that a drift of the machine's speed over the runs hits both alike), the
// utilization this implies (calls/s x compute time: each call holds every device of the
// island), and each tenant's achieved share of the device time beside its configured share,
// over the run and in its worst window. Device time is the cluster's own account: the workers
// measure each device's part of each client's work as it ends (pw status's hosts'
// client_device_seconds), sampled five times a window; a window runs from one sample to the
// first at least a window later.
//
// Without a cluster address it starts `pw up --islands 1 --hosts-per-island 1
// --devices-per-host 8` (one 8-device island in one worker process, proportional-share
// scheduling) in a state directory of its own, and stops it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pw {

struct MultitenantBenchOptions {
  std::string cluster;                   // Empty: start a cluster (see above).
  std::vector<int> clients = {4};        // One result per count (and compute time).
  std::vector<double> shares = {1, 2, 4, 8};  // Client i's share: shares[i % size].
  std::vector<double> compute_ms = {0.33};
  double seconds = 10;    // Per measurement.
  double window_ms = 100;  // For each tenant's worst window.
  // Calls each client keeps in flight: enough that a tenant's queue at the scheduler does not
  // run dry while its process waits for a CPU (tens of ms on a loaded 2-core machine).
  int in_flight = 64;
  bool late_join = false;  // The last client starts halfway through.
  std::string pw_binary;   // This binary: clients are `pw bench multitenant-client` processes.
};

struct MultitenantBenchResult {
  int clients = 0;
  double compute_ms = 0;
  double aggregate_per_second = 0;
  double single_client_per_second = 0;  // The mean of one client alone before and after.
  double single_client_before = 0, single_client_after = 0;
  double utilization = 0;         // aggregate_per_second x compute_ms / 1000.
  double single_utilization = 0;  // The same for one client alone.
  // Measured: the clients' device time (the cluster's account) over the island's devices' time,
  // over the run. Beside `utilization` (nominal) it shows what each call costs the devices
  // beyond its compute (launch, collective, wake-ups): 1 is saturated.
  double device_busy = 0;
  double single_device_busy = 0;  // The same for one client alone (the mean of before and after).
  struct Share {
    std::string tenant;
    double configured = 0;  // Fractions of the whole.
    double achieved = 0;
    double worst_window = 0;  // Its share in the window (after the first) farthest from configured.
    int64_t calls = 0;        // Its calls that finished over the run.
  };
  std::vector<Share> shares;
  // With late_join: when the last client started, and its share in its first window then
  // beside the others' least share of theirs (as fractions of configured).
  double joined_at_seconds = 0;
  double joiner_first_window = 0;
  double others_least_in_joiners_first_window = 0;
};

absl::StatusOr<std::vector<MultitenantBenchResult>> RunMultitenantBench(
    const MultitenantBenchOptions& o);
std::string MultitenantBenchJson(const std::vector<MultitenantBenchResult>& results);

// One client of the benchmark (`pw bench multitenant-client`): connects to `cluster` as
// `tenant` with `share`, waits until `start_unix_ns`, calls until `end_unix_ns` with
// `in_flight` calls in flight, and writes the calls' finishing times (Unix ns, one per line) to
// `out`.
struct MultitenantClientOptions {
  std::string cluster;
  std::string tenant;
  double share = 1;
  double compute_ms = 0.33;
  int in_flight = 16;
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  std::string out;
};
absl::Status RunMultitenantClient(const MultitenantClientOptions& o);

}  // namespace pw
