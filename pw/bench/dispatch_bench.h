// The paper's §5.1 dispatch micro-benchmark on an embedded cluster.
//
// Each computation is a scalar all-reduce over the slice followed by a scalar add; each output
// feeds the next input. OpByOp: one client call per computation (the client waits for each
// call to be enqueued). Chained: one program, a chain of `chain` nodes. Fused: one node whose
// function holds `chain` computations. Each runs under parallel and sequential dispatch.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/transport/controller_interface.h"

namespace pw {

struct DispatchBenchOptions {
  int islands = 1;
  int hosts = 4;             // In all, spread evenly over the islands.
  int devices_per_host = 2;
  int chain = 128;
  double min_seconds = 0.5;  // Per workload and mode, over all rounds.
  int rounds = 3;            // Interleaved rounds; each workload and mode reports its best.
  int min_iterations = 3;
  std::string only;  // Run just this workload (opbyop | chained | fused); all when empty.
  std::string dispatch;  // Run just this mode (parallel | sequential); both when empty.
  std::string cluster;  // Address of the cluster it ran on (for the JSON); empty: embedded.
  double loopback_rtt_us = 0;  // Measured in the same run (0: not measured).
  // JAX's own dispatch of the same step in one process (pathways.jax_dispatch_bench), measured
  // in the same run (0: not measured).
  double jax_computations_per_second = 0;
  int jax_devices = 0;
};

struct DispatchBenchResult {
  std::string workload;  // opbyop | chained | fused
  std::string dispatch;  // parallel | sequential
  int hosts = 0;
  int devices_per_host = 0;
  int64_t computations = 0;
  double seconds = 0;
  double computations_per_second = 0;
  double overhead_us_per_node = 0;  // Time per computation beyond Fused's, same dispatch mode.
  std::vector<double> round_rates;  // computations_per_second of each round, in order.
};

// On an embedded cluster of o.islands x o.hosts x o.devices_per_host.
absl::StatusOr<std::vector<DispatchBenchResult>> RunDispatchBench(const DispatchBenchOptions& o);
// On a running cluster (e.g. a RemoteController), over a slice of all its live devices; the
// results' hosts and devices_per_host describe that cluster.
absl::StatusOr<std::vector<DispatchBenchResult>> RunDispatchBenchOn(ControllerInterface* controller,
                                                                    DispatchBenchOptions o);

// {"results": [...], "summary": {...ratios measured in this run...}}
std::string DispatchBenchJson(const DispatchBenchOptions& o,
                              const std::vector<DispatchBenchResult>& results);
std::string DispatchBenchTable(const std::vector<DispatchBenchResult>& results);

}  // namespace pw
